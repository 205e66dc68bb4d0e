"""Beam search against independent facts: full forward passes, the GNMT formula, greedy search."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t_jax import decode, model
from t2t_jax.config import ModelConfig
from t2t_jax.special_tokens import BOS_ID, EOS_ID, PAD_ID

from helpers import apply

TINY = ModelConfig(vocab_size=40, num_layers=2, d_model=16, d_ff=32, num_heads=2, d_k=8, d_v=8,
                   dropout=0.0, max_len=128)


@pytest.fixture(scope="module")
def params():
  return model.init_params(TINY, jax.random.PRNGKey(0))


def _sources(lengths, width, seed=0):
  rng = np.random.default_rng(seed)
  src = np.zeros((len(lengths), width), np.int32)
  for i, n in enumerate(lengths):
    src[i, :n] = rng.integers(4, TINY.vocab_size, size=n)
    src[i, n] = EOS_ID
  return src


def _full_logp(params, cfg, src, hyp):
  """log p(hyp | src) from one teacher-forced forward pass (no cache)."""
  tgt = np.array([hyp], np.int32)
  logits = apply(model.Transformer(cfg), {"params": params}, src[None], tgt)
  logp = np.asarray(jax.nn.log_softmax(logits[0]), np.float64)
  return float(sum(logp[t, tok] for t, tok in enumerate(hyp)))


@pytest.mark.parametrize("changes", [{"positional": "sinusoidal"}, {"positional": "learned"},
                                     {"encoder_layers": 3},
                                     {"dtype": "bfloat16", "residual_dtype": "bfloat16"}])
def test_cached_decoding_matches_full_forward(changes):
  """Each cached step's logits are the teacher-forced ones: the same arithmetic, rounded at
  the same places (a bf16 residual stream included), so to float32 rounding."""
  cfg = dataclasses.replace(TINY, **changes)
  params = model.init_params(cfg, jax.random.PRNGKey(1))
  src = _sources([5, 3], 7)
  tgt = np.random.default_rng(1).integers(4, cfg.vocab_size, size=(2, 6)).astype(np.int32)
  t = model.Transformer(cfg)
  full = apply(t, {"params": params}, src, tgt)
  encoded = apply(t, {"params": params}, src, method=model.Transformer.encode)
  cache = t.apply({"params": params}, encoded, 6, method=model.Transformer.init_cache)
  decoder_inputs = np.asarray(model.shift_right(jnp.asarray(tgt)))
  for pos in range(6):
    logits, cache = apply(t, {"params": params}, cache, decoder_inputs[:, pos], jnp.int32(pos),
                            src, method=model.Transformer.decode_step)
    np.testing.assert_allclose(logits, full[:, pos], atol=1e-4)


def test_length_penalty_matches_formula():
  # ((5 + 10) / 6) ** 0.6 = 2.5 ** 0.6, computed by hand: exp(0.6 * ln 2.5) = 1.732862
  assert decode.length_penalty(10, 0.6) == pytest.approx(1.732862, abs=1e-6)
  assert decode.length_penalty(1, 0.6) == pytest.approx(1.0)
  assert decode.length_penalty(7, 0.0) == 1.0


def _greedy(params, cfg, src, max_new):
  """Greedy decoding by re-running the full decoder on the prefix each step.

  The prefix is padded to one fixed length (one compilation); by causality (checked in
  test_model) the padding after position len(hyp) cannot change that position's logits.
  """
  forward = jax.jit(lambda p, s, t: model.Transformer(cfg).apply({"params": p}, s, t))
  hyp = []
  for _ in range(max_new + 1):
    tgt = np.full((1, max_new + 1), PAD_ID, np.int32)
    tgt[0, :len(hyp)] = hyp
    logits = forward(params, src[None], tgt)
    step = np.array(logits[0, len(hyp)])
    step[[PAD_ID, BOS_ID]] = -np.inf
    if not hyp:
      step[EOS_ID] = -np.inf  # min_length 1: no empty translation
    if len(hyp) == max_new:
      return hyp  # forced end
    tok = int(step.argmax())
    if tok == EOS_ID:
      return hyp
    hyp.append(tok)
  return hyp


def test_beam_size_one_is_greedy(params):
  src = _sources([4, 6, 2], 8)
  seqs, _ = jax.jit(lambda p, s: decode.beam_search(p, s, TINY, 1, 0.0, 6))(params, src)
  for i in range(3):
    n = int((src[i] != PAD_ID).sum()) - 1
    assert decode.strip(np.asarray(seqs[i, 0])) == _greedy(params, TINY, src[i], n + 6)


def test_hypotheses_are_ordered_by_penalised_score(params):
  src = _sources([5, 3], 7, seed=3)
  alpha = 0.6
  seqs, scores = jax.jit(lambda p, s: decode.beam_search(p, s, TINY, 4, alpha, 8))(params, src)
  seqs, scores = np.asarray(seqs), np.asarray(scores)
  for i in range(2):
    assert np.all(np.diff(scores[i]) <= 1e-6), scores[i]
    for j in range(4):
      hyp = decode.strip(seqs[i, j]) + [EOS_ID]
      expected = _full_logp(params, TINY, src[i], hyp) / decode.length_penalty(len(hyp), alpha)
      assert scores[i, j] == pytest.approx(expected, abs=1e-3)


def _always_prefer(params, token):
  """Params whose decoder prefers `token` at every step: the last decoder layer outputs a
  constant vector pointing at that token's (tied output) embedding."""
  last = dict(params[f"decoder_{TINY.num_layers - 1}"])
  ln = dict(last["ln_ffn"])
  ln["scale"] = jnp.zeros_like(ln["scale"])
  ln["bias"] = 10.0 * params["embed"]["embedding"][token]
  last["ln_ffn"] = ln
  return {**params, f"decoder_{TINY.num_layers - 1}": last}


def test_max_output_length_is_input_length_plus_extra(params):
  p = _always_prefer(params, 5)  # never wants EOS
  src = _sources([3, 9], 10)
  seqs, _ = decode.beam_search(p, src, TINY, 2, 0.6, 50)
  seqs = np.asarray(seqs)
  assert len(decode.strip(seqs[0, 0])) == 3 + 50
  assert len(decode.strip(seqs[1, 0])) == 9 + 50
  assert EOS_ID in list(seqs[0, 0])  # forced EOS at the limit


@pytest.mark.parametrize("min_length", [0, 1, 3])
def test_eos_cannot_end_a_hypothesis_shorter_than_min_length(params, min_length):
  p = _always_prefer(params, EOS_ID)  # wants to stop at once
  src = _sources([4, 7], 8)
  seqs, _ = decode.beam_search(p, src, TINY, 3, 0.6, 10, min_length=min_length)
  for row in np.asarray(seqs):
    assert len(decode.strip(row[0])) == min_length  # the best ends as soon as it may
    assert all(len(decode.strip(hyp)) >= min_length for hyp in row)


def test_length_limit_wins_over_min_length(params):
  p = _always_prefer(params, EOS_ID)
  src = _sources([2], 4)  # limit: 2 source tokens + 1 extra = 3 tokens before EOS
  seqs, _ = decode.beam_search(p, src, TINY, 2, 0.6, 1, min_length=10)
  assert len(decode.strip(np.asarray(seqs)[0, 0])) == 3


class _IdVocab:
  """Whitespace-separated integers <-> ids; enough to drive the Translator."""

  def encode(self, text):
    return [int(t) for t in text.split()]

  def decode(self, ids):
    return " ".join(map(str, ids))


def test_decoder_drops_finished_sentences_and_finds_what_the_whole_search_finds(params,
                                                                             monkeypatch):
  """`BeamDecoder` shrinks a batch as its sentences finish (here every 2 steps, down to one
  row); every sentence's hypotheses and scores equal those of the one-function search over
  the whole batch, which runs every row until the last sentence ends."""
  from t2t_jax.config import DecodeConfig
  monkeypatch.setattr(decode, "COMPACT_EVERY", 2)
  monkeypatch.setattr(decode, "MIN_ROWS", 1)
  lengths = [1, 7, 1, 2, 1, 1, 2, 1]  # length limits 1+4 ... 7+4: they end at different steps
  src = _sources(lengths, 8, seed=3)
  dec = decode.BeamDecoder(params, TINY, DecodeConfig(beam_size=3, alpha=0.6,
                                                      max_extra_length=4),
                           _IdVocab(), max_input_length=8, tokens_per_batch=64,
                           num_devices=1)
  rows, steps = [], dec._steps
  dec._steps = lambda p, state, end: (rows.append(state["sent"]["done"].shape[1]),
                                      steps(p, state, end))[1]
  nbest = dec.nbest_ids([list(row[:n + 1]) for row, n in zip(src, lengths)])
  assert rows[0] == 8 and min(rows) <= 2, rows
  seqs, scores = decode.beam_search(params, src, TINY, 3, 0.6, 4)
  for j in range(len(lengths)):
    assert [ids for ids, _ in nbest[j]] == [decode.strip(np.asarray(s)) for s in seqs[j]]
    np.testing.assert_allclose([score for _, score in nbest[j]], scores[j], atol=1e-5)


def test_translator_keeps_order_alignment_and_truncates(params, capsys):
  from t2t_jax.config import DecodeConfig
  tr = decode.BeamDecoder(params, TINY, DecodeConfig(beam_size=2, alpha=0.6, max_extra_length=5),
                         _IdVocab(), max_input_length=8, tokens_per_batch=16)
  sentences = ["5 6 7", "", "9 9 9 9 9 9 9 9 9 9 9 9", "4", "8 8 8 8 8"]
  out = tr.translate(sentences)
  assert len(out) == 5 and out[1] == ""
  assert all(o for j, o in enumerate(out) if j != 1)
  assert "truncated" in capsys.readouterr().err
  # Each output equals translating that sentence on its own.
  for j in (0, 3, 4):
    assert tr.translate([sentences[j]]) == [out[j]]


def test_uncached_search_finds_the_same_hypotheses(params):
  src = _sources([5, 3], 7, seed=5)
  run = lambda cached: decode.beam_search(params, src, TINY, 3, 0.6, 6, cached=cached)
  (s1, sc1), (s2, sc2) = run(True), run(False)
  np.testing.assert_array_equal(np.asarray(s1), np.asarray(s2))
  np.testing.assert_allclose(sc1, sc2, atol=1e-4)


def _token_logp(params, cfg, src, hyp):
  """log p(token_t | src, hyp_<t) for each position, from one teacher-forced forward pass."""
  logits = apply(model.Transformer(cfg), {"params": params}, src[None],
                 np.array([hyp], np.int32))
  logp = np.asarray(jax.nn.log_softmax(logits[0]), np.float64)
  return logp[np.arange(len(hyp)), hyp]


@pytest.mark.parametrize("cached", [True, False])
def test_ensemble_scores_hypotheses_by_the_members_mean_probability(cached):
  wide = dataclasses.replace(TINY, d_model=24, d_ff=48, d_k=12, d_v=12, num_layers=1)
  cfgs = [TINY, wide]  # members of different shapes sharing one vocabulary
  members = [model.init_params(c, jax.random.PRNGKey(2 + i)) for i, c in enumerate(cfgs)]
  src = _sources([5, 3], 7, seed=7)
  alpha = 0.6
  seqs, scores = decode.beam_search(members, src, cfgs, 3, alpha, 6, cached=cached)
  seqs, scores = np.asarray(seqs), np.asarray(scores)
  for i in range(2):
    for j in range(3):
      hyp = decode.strip(seqs[i, j]) + [EOS_ID]
      per_member = [_token_logp(p, c, src[i], hyp) for p, c in zip(members, cfgs)]
      mixture = np.log(np.mean(np.exp(per_member), axis=0)).sum()
      assert scores[i, j] == pytest.approx(mixture / decode.length_penalty(len(hyp), alpha),
                                           abs=1e-3)


def test_ensemble_of_a_model_with_itself_is_that_model(params):
  src = _sources([6, 2, 4], 8, seed=9)
  single = decode.beam_search(params, src, TINY, 3, 0.6, 6)
  twice = decode.beam_search([params, params], src, [TINY, TINY], 3, 0.6, 6)
  np.testing.assert_array_equal(np.asarray(single[0]), np.asarray(twice[0]))
  np.testing.assert_allclose(single[1], twice[1], atol=1e-5)


def test_nbest_scores_are_the_hypotheses_penalised_log_probabilities(params):
  from t2t_jax.config import DecodeConfig
  tr = decode.BeamDecoder(params, TINY, DecodeConfig(beam_size=3, alpha=0.6, max_extra_length=5),
                         _IdVocab(), max_input_length=8)
  sources = [[5, 6, 7, EOS_ID], [9, 4, EOS_ID]]
  for src, nbest in zip(sources, tr.nbest_ids(sources)):
    assert len(nbest) == 3
    assert tr.translate_ids([src])[0] == nbest[0][0]
    for ids, score in nbest:
      logp = _full_logp(params, TINY, np.array(src, np.int32), ids + [EOS_ID])
      assert score == pytest.approx(logp / decode.length_penalty(len(ids) + 1, 0.6), abs=1e-3)


def test_mbr_output_is_the_beam_hypothesis_mbr_selects(params):
  from t2t_jax import mbr
  from t2t_jax.config import DecodeConfig
  cfg = DecodeConfig(beam_size=4, alpha=0.6, max_extra_length=5, mbr=True, mbr_temperature=2.0)
  tr = decode.BeamDecoder(params, TINY, cfg, _IdVocab(), max_input_length=8)
  sentences = ["5 6 7", "9 4", "", "8 8 8 8"]
  out = tr.translate(sentences)
  assert out[2] == ""
  for sentence, got in zip([sentences[j] for j in (0, 1, 3)], [out[j] for j in (0, 1, 3)]):
    nbest = tr.nbest_ids([tr.encode([sentence])[0]])[0]
    texts = [" ".join(map(str, ids)) for ids, _ in nbest]
    assert got == texts[mbr.select(texts, [lp for _, lp in nbest], 2.0)]
  # One hypothesis leaves nothing to choose: MBR at beam 1 is the greedy translation.
  greedy = dict(beam_size=1, alpha=0.6, max_extra_length=5)
  plain = decode.BeamDecoder(params, TINY, DecodeConfig(**greedy), _IdVocab(), max_input_length=8)
  with_mbr = decode.BeamDecoder(params, TINY, DecodeConfig(**greedy, mbr=True), _IdVocab(),
                               max_input_length=8)
  assert with_mbr.translate(sentences) == plain.translate(sentences)


def test_beam_size_one_follows_the_argmax_even_past_a_likely_end(params):
  """A model whose every step puts token 5 first and EOS second: greedy search emits 5 up to
  the length limit. Keeping the second-best EOS as a finished hypothesis (a 2-candidate beam
  of 1) would end after one token instead, since every further 5 lowers the path's log-prob."""
  cfg = TINY
  u = np.zeros(cfg.d_model, np.float32)
  u[0] = 1.0
  table = np.array(params["embed"]["embedding"]) * 0.01
  table[5], table[EOS_ID] = 3.0 * u, 2.0 * u
  last = f"decoder_{cfg.num_layers - 1}"
  fixed = {**params, "embed": {"embedding": jnp.asarray(table)},
           last: {**params[last], "ln_ffn": {"scale": jnp.zeros(cfg.d_model),
                                             "bias": jnp.asarray(2.0 * u)}}}
  src = _sources([3], 5)
  seqs, _ = decode.beam_search(fixed, src, cfg, beam_size=1, alpha=0.0, max_extra_length=4)
  assert decode.strip(np.asarray(seqs[0, 0])) == [5] * (3 + 4)
  assert _greedy(fixed, cfg, src[0], 3 + 4) == [5] * (3 + 4)


def test_search_that_outgrows_the_first_caches_equals_the_uncached_search(params):
  """Hypotheses forced past 16 and 32 tokens (min_length 35) cross two cache doublings; the
  cached search still finds exactly what the uncached one, which re-runs the whole prefix,
  finds."""
  assert decode.cache_phases(47) == [16, 32, 47] and decode.cache_phases(9) == [9]
  src = _sources([5, 4], 6, seed=4)
  run = lambda cached: decode.beam_search(params, src, TINY, beam_size=3, alpha=0.6,
                                          max_extra_length=40, min_length=35, cached=cached)
  (seqs, scores), (seqs_u, scores_u) = run(True), run(False)
  assert min(len(decode.strip(np.asarray(s))) for s in seqs[:, 0]) >= 35
  np.testing.assert_array_equal(seqs, seqs_u)
  np.testing.assert_allclose(scores, scores_u, atol=1e-4)


def test_sequence_scores_are_log_probabilities_and_an_ensemble_averages_probabilities(params):
  """`sequence_logprobs`: the teacher-forced log p of each target (EOS in, PAD out), and for
  two models the log of their mean probability token by token (not the mean log-prob)."""
  other = model.init_params(TINY, jax.random.PRNGKey(7))
  src = _sources([5, 3], 7)
  tgt = np.zeros((2, 6), np.int32)
  tgt[0, :4], tgt[1, :2] = [9, 12, 7, EOS_ID], [5, EOS_ID]
  total, tokens = decode.sequence_logprobs(params, src, tgt, TINY)
  assert tokens.tolist() == [4, 2]
  assert float(total[0]) == pytest.approx(_full_logp(params, TINY, src[0], [9, 12, 7, EOS_ID]),
                                          abs=1e-4)
  both, _ = decode.sequence_logprobs([params, other], src, tgt, (TINY, TINY))
  la, lb = (jax.nn.log_softmax(apply(model.Transformer(TINY), {"params": p}, src, tgt))
            for p in (params, other))
  expected = sum(float(np.log((np.exp(la[1, t, tok]) + np.exp(lb[1, t, tok])) / 2))
                 for t, tok in enumerate([5, EOS_ID]))
  assert float(both[1]) == pytest.approx(expected, abs=1e-4)


def test_best_candidates_are_log_softmax_then_one_top_k_over_all_candidates():
  """The lean choice (each row's best first, no [hypotheses, vocabulary] log-probabilities
  written) picks what log_softmax, the bans and one top_k over all k * vocab candidates pick,
  with ties (logits on a coarse grid tie often), for one model and for an ensemble."""
  rng = np.random.default_rng(0)
  b, k, vocab, m = 5, 3, 12, 6
  for trial in range(20):
    logits = [np.round(rng.normal(size=(b, k, vocab)) * 2) / 2 for _ in range(1 + trial % 2)]
    live = np.round(rng.normal(size=(b, k)) * 2) / 2
    live[0, 1:] = decode.NEG_INF                       # a first step: one live hypothesis
    banned = rng.random((b, 1, vocab)) < 0.2
    banned[1, 0, 1:] = True                            # only token 0 allowed: few candidates
    probs = [np.exp(x - x.max(-1, keepdims=True)) for x in logits]
    logp = np.log(np.mean([p / p.sum(-1, keepdims=True) for p in probs], axis=0))
    # In float32, as the search adds them (a banned candidate's live + NEG_INF rounds).
    cand = (np.float32(live)[:, :, None] + np.where(banned, np.float32(decode.NEG_INF),
                                                   np.float32(logp))).reshape(b, k * vocab)
    best = -np.sort(-cand, axis=1)[:, :m]
    got_logp, got_beam, got_token = decode.best_candidates(
        jnp.asarray(live, jnp.float32), [jnp.asarray(x, jnp.float32) for x in logits],
        jnp.asarray(banned), m)
    got = np.asarray(got_beam) * vocab + np.asarray(got_token)
    # The m best values, best first, each at a candidate that has it, none twice (which of
    # two equal candidates comes first is top_k's choice, as it was for one top_k).
    np.testing.assert_allclose(got_logp, best, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.take_along_axis(cand, got, 1), best, rtol=1e-5, atol=1e-5)
    assert all(len(set(row)) == m for row in got)


def _converts_of(jaxpr, shapes) -> list:
  """convert_element_type eqns of `jaxpr` and its sub-jaxprs whose input has one of `shapes`."""
  from jax.extend import core as jcore
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "convert_element_type" and tuple(eqn.invars[0].aval.shape) in shapes:
      found.append(eqn)
    for value in eqn.params.values():
      for sub in value if isinstance(value, (tuple, list)) else [value]:
        if isinstance(sub, jcore.ClosedJaxpr):
          found += _converts_of(sub.jaxpr, shapes)
        elif isinstance(sub, jcore.Jaxpr):
          found += _converts_of(sub, shapes)
  return found


@pytest.mark.parametrize("implementation", ["plain", "cpu_tuned"])
def test_a_bf16_search_casts_its_weights_once_outside_its_loop_and_finds_the_same(
    params, implementation, monkeypatch):
  """In bf16 the weights are cast before the search's loop (model.inference_variables), not
  at each of its steps (on cpu_tuned, whose dense layers take float32 matrices, the output
  projection's), and the search finds what it found with float32 weights that every product
  cast itself."""
  cfg = dataclasses.replace(TINY, dtype="bfloat16", implementation=implementation)
  src = _sources([6, 2, 4], 8, seed=4)
  state = decode.search_start(params, src, cfg, 3, 6)
  jaxpr = jax.make_jaxpr(lambda p, st: decode.search_steps(p, st, jnp.int32(16), cfg, 0.6))(
      params, state).jaxpr
  loops = [e for e in jaxpr.eqns if e.primitive.name == "while"]
  shapes = ({tuple(x.shape) for x in jax.tree_util.tree_leaves(params) if x.ndim == 2}
            if implementation == "plain" else {tuple(params["embed"]["embedding"].shape)})
  assert len(loops) == 1
  assert _converts_of(loops[0].params["body_jaxpr"].jaxpr, shapes) == []
  assert len(_converts_of(jaxpr, shapes)) > 0       # the casts are there, before the loop
  lean = decode.beam_search(params, src, cfg, 3, 0.6, 6)
  # Before: float32 weights, which every product cast inside the loop.
  monkeypatch.setattr(model, "inference_variables", lambda p, c: {"params": p})
  jaxpr = jax.make_jaxpr(lambda p, st: decode.search_steps(p, st, jnp.int32(16), cfg, 0.6))(
      params, state).jaxpr
  loop = next(e for e in jaxpr.eqns if e.primitive.name == "while")
  assert len(_converts_of(loop.params["body_jaxpr"].jaxpr, shapes)) > 0
  before = decode.beam_search(params, src, cfg, 3, 0.6, 6)
  np.testing.assert_array_equal(np.asarray(lean[0]), np.asarray(before[0]))
  np.testing.assert_allclose(np.asarray(lean[1]), np.asarray(before[1]), atol=1e-5)


def test_the_decode_batch_is_the_backends_and_any_batch_finds_the_same(params, monkeypatch):
  """decode.batch_tokens=auto: today's 2,048 tokens on CPU, 32,768 on a GPU or TPU; a number
  sets it. Sentences batched 2 at a time or all at once get the same hypotheses and scores."""
  from t2t_jax import backend
  from t2t_jax.config import DecodeConfig
  assert backend.decode_batch_tokens("auto") == 2048
  assert backend.decode_batch_tokens(96) == 96
  lengths = [5, 1, 7, 3, 2, 6]
  src = _sources(lengths, 8, seed=11)
  sources = [list(row[:n + 1]) for row, n in zip(src, lengths)]
  found = {}
  for tokens in (16, "auto"):
    cfg = DecodeConfig(beam_size=3, alpha=0.6, max_extra_length=4, batch_tokens=tokens)
    dec = decode.BeamDecoder(params, TINY, cfg, _IdVocab(), max_input_length=8, num_devices=1)
    assert dec.tokens_per_batch == (16 if tokens == 16 else 2048)
    found[tokens] = dec.nbest_ids(sources)
  for a, b in zip(found[16], found["auto"]):
    assert [ids for ids, _ in a] == [ids for ids, _ in b]
    np.testing.assert_allclose([s for _, s in a], [s for _, s in b], atol=1e-5)
  monkeypatch.setattr(backend, "platform", lambda: "gpu")
  assert backend.decode_batch_tokens("auto") == backend.DEVICE_DECODE_BATCH_TOKENS == 32768


@pytest.mark.counts_compilations
def test_a_decoder_that_keeps_its_batches_compiles_every_program_ahead(params):
  """`BeamDecoder(shrink=False).compile_ahead(sentences)` compiles each batch's search (its
  start, its steps at each cache length, the cache growths) so that translating the same
  sentences compiles nothing more; and it finds what the shrinking decoder finds."""
  from t2t_jax import bookkeeping
  from t2t_jax.config import DecodeConfig
  cfg = DecodeConfig(beam_size=2, alpha=0.6, max_extra_length=20)  # outgrows the first cache
  sentences = ["5 6 7", "", "9 9 9 9 9 9 9 9 9 9 9", "4", "8 8 8 8 8", "7 5 7 5 7 5 7 5 7"]
  make = lambda shrink: decode.BeamDecoder(params, TINY, cfg, _IdVocab(), max_input_length=16,
                                           tokens_per_batch=16, num_devices=1, shrink=shrink)
  kept = make(False)
  compiled = kept.compile_ahead(sentences, workers=2)
  # Two batch shapes, 16 tokens each: 2 rows of width 8 (outputs up to 8 + 20 positions and
  # EOS: caches of 16, then 29) and 1 row of width 16 (16, 32, then 37). Each: its start, its
  # steps at each cache length and each growth: 1 + 2 + 1 and 1 + 3 + 2 programs.
  assert compiled == 4 + 6, compiled
  with bookkeeping.CompileCounter() as compiles:
    out = kept.translate(sentences)
  assert compiles.count == 0
  assert out == make(True).translate(sentences)
  with pytest.raises(ValueError, match="shrink=False"):
    make(True).compile_ahead(sentences)


class _SmallVocab(_IdVocab):
  """12 pieces beside the model's 40 output ids (a corpus whose SentencePiece vocabulary
  came out smaller than model.vocab_size); decoding an id past them fails as SentencePiece's
  does."""
  size = 12

  def decode(self, ids):
    if any(i >= self.size for i in ids):
      raise IndexError("piece id is out of range.")
    return super().decode(ids)


def test_a_vocabulary_smaller_than_the_model_never_gets_ids_past_it(params):
  from t2t_jax.config import DecodeConfig
  cfg = DecodeConfig(beam_size=3, alpha=0.6, max_extra_length=6)
  sentences = ["5 6 7", "9 4", "8 8 8 8", "3 10 11", "7"]
  unlimited = decode.BeamDecoder(params, TINY, cfg, _IdVocab(), max_input_length=8)
  ids = [i for row in unlimited.nbest_ids(unlimited.encode(sentences)) for h, _ in row for i in h]
  assert max(ids) >= _SmallVocab.size  # the untrained model does want those ids
  limited = decode.BeamDecoder(params, TINY, cfg, _SmallVocab(), max_input_length=8)
  assert len(limited.translate(sentences)) == len(sentences)
  ids = [i for row in limited.nbest_ids(limited.encode(sentences)) for h, _ in row for i in h]
  assert max(ids) < _SmallVocab.size
