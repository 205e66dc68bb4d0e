"""Cached beam search (paper section 6.1) and batched translation over all local devices.

The encoder runs once per batch; every step of the `lax.while_loop` runs one
decoder position against a key/value cache. Hypotheses are ranked by the GNMT
length penalty ((5 + len) / 6)^alpha; the search stops for a sentence once no
live hypothesis can beat its worst finished one (or it reaches input length +
`max_extra_length`). EOS may not end a hypothesis shorter than `min_length` tokens, because
without that guard beam search can rank the empty translation first for long inputs.
`BeamDecoder` runs the search a few steps at a time and drops the sentences that are done
from the batch, so a batch does not run at full width until its slowest sentence ends.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from t2t_jax import backend, mbr, model, parallel
from t2t_jax.config import DecodeConfig, ModelConfig
from t2t_jax.special_tokens import BOS_ID, EOS_ID, PAD_ID

NEG_INF = -1.0e7  # finite, so that -inf - -inf never makes a NaN


def length_penalty(length: Any, alpha: float) -> Any:
  """GNMT length penalty ((5 + |Y|) / 6)^alpha (Wu et al. 2016), as the paper uses."""
  return ((5.0 + length) / 6.0) ** alpha


def _gather_beams(x: jax.Array, beam_idx: jax.Array) -> jax.Array:
  """x [b, n, ...], beam_idx [b, m] -> [b, m, ...]."""
  idx = beam_idx.reshape(beam_idx.shape + (1,) * (x.ndim - 2))
  return jnp.take_along_axis(x, idx, axis=1)


def _members(params: Any, cfg: ModelConfig | Sequence[ModelConfig]) -> list:
  """One `apply` per ensemble member (a single model is an ensemble of one). Called outside
  the search's loop: its bf16 weights (`model.inference_variables`) are cast once per call,
  not once per step."""
  pairs = [(cfg, params)] if isinstance(cfg, ModelConfig) else list(zip(cfg, params,
                                                                       strict=True))
  return [functools.partial(model.Transformer(c).apply, model.inference_variables(p, c))
          for c, p in pairs]


def _ensemble_logp(member_logps: list[jax.Array]) -> jax.Array:
  """The log of the members' mean probability (one member: its own log-probabilities)."""
  if len(member_logps) == 1:
    return member_logps[0]
  return jax.nn.logsumexp(jnp.stack(member_logps), axis=0) - jnp.log(len(member_logps))


def _top_logp(logits: jax.Array, banned: jax.Array, m: int) -> tuple[jax.Array, jax.Array]:
  """The m best next tokens of each hypothesis [b, k, vocab] with their log-probabilities
  (NEG_INF where `banned`), as a log-softmax then top_k would give them, reading the
  [hypotheses, vocabulary] logits three times (max, sum of exps, top_k) and writing no
  [hypotheses, vocabulary] log-probabilities: log-softmax shifts each row by one number, so
  the row's top m logits are its top m log-probabilities."""
  top, tokens = jax.lax.top_k(jnp.where(banned, NEG_INF, logits), m)
  peak = jnp.max(logits, axis=-1, keepdims=True)
  log_sum = jnp.log(jnp.sum(jnp.exp(logits - peak), axis=-1, keepdims=True))
  # The same operations as jax.nn.log_softmax: (x - max) - log(sum(exp(x - max))).
  return jnp.where(top <= NEG_INF, NEG_INF, (top - peak) - log_sum), tokens


def best_candidates(live_logp: jax.Array, member_logits: list[jax.Array], banned: jax.Array,
                    m: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The m best one-token extensions of each sentence's k hypotheses: their log-probabilities
  (live_logp [b, k] plus the token's), beams and tokens, best first.

  What log_softmax, NEG_INF at the `banned` tokens and one top_k over all k * vocab
  candidates give. A single model takes each row's best m first (`_top_logp`: its logits are
  read three times and no [hypotheses, vocabulary] log-probabilities are written): a
  sentence's best m of all candidates are among its rows' best m. An ensemble's log of the
  mean probability needs every member's whole rows. Which of two equal candidates comes
  first is top_k's choice, as it was with one top_k over all of them.
  """
  b, k, vocab = member_logits[0].shape
  row_m = min(m, vocab)
  if len(member_logits) == 1:
    row_logp, row_tokens = _top_logp(member_logits[0], banned, row_m)
  else:
    logp = _ensemble_logp([jax.nn.log_softmax(x) for x in member_logits])
    row_logp, row_tokens = jax.lax.top_k(jnp.where(banned, NEG_INF, logp), row_m)
  cand = (live_logp[:, :, None] + row_logp).reshape(b, k * row_m)
  top_logp, top_idx = jax.lax.top_k(cand, m)
  return (top_logp, top_idx // row_m,
          jnp.take_along_axis(row_tokens.reshape(b, k * row_m), top_idx, axis=1))


def _best_allowed(live_logp: jax.Array, logp: jax.Array, ids: jax.Array, allowed: jax.Array,
                  m: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """`best_candidates` over a constraint's few columns per hypothesis (`candidates`: their
  log-probabilities, token ids [b, k, c] and which are allowed) instead of the vocabulary."""
  b, k, c = logp.shape
  row = jnp.where(allowed, logp, NEG_INF)
  cand = jnp.where(row <= NEG_INF, NEG_INF, live_logp[:, :, None] + row).reshape(b, k * c)
  top_logp, top_idx = jax.lax.top_k(cand, m)
  return top_logp, top_idx // c, jnp.take_along_axis(ids.reshape(b, k * c), top_idx, axis=1)


def search_start(params: Any, inputs: jax.Array, cfg: ModelConfig | Sequence[ModelConfig],
                 beam_size: int, max_extra_length: int, cached: bool = True,
                 min_length: int = 1, constraint: Any = None) -> dict[str, Any]:
  """The search state before its first step: the encoder has run, nothing is decoded.

  `constraint` (hashable; e.g. `parsing.TreeConstraint`): what a hypothesis may take next
  depends on its own tokens so far; its state per hypothesis is in "sent"["grammar"]
  (`start`, `banned`, `advance`, `keep`). None: any token but PAD and BOS.

  The state holds the step counter "i" and per-sentence arrays under "sent" ([b, ...]: the
  source, the hypotheses, the caches), so that `select_sentences` can keep any subset of
  sentences. A row whose first token is PAD is no
  sentence (batch padding): it starts done, so it never holds the search up.
  """
  applies = _members(params, cfg)
  b, src_width = inputs.shape
  k = beam_size
  # Output length limit: input length (without EOS) + max_extra_length, per sentence.
  src_len = jnp.maximum(jnp.sum(inputs != PAD_ID, axis=-1) - 1, 1)
  positions = src_width + max_extra_length                 # static upper bound
  for c in ([cfg] if isinstance(cfg, ModelConfig) else cfg):
    if c.positional == "learned":
      positions = min(positions, c.max_len - 1)
  max_len = jnp.minimum(src_len + max_extra_length, positions)  # tokens before EOS
  encoded = [apply(inputs, method=model.Transformer.encode) for apply in applies]
  # The self-attention caches start short and double when the search outgrows them
  # (`grow_caches`): each step reads the whole cache, so sizing it for the longest possible
  # output made short sentences pay for positions they never reach.
  first = cache_phases(positions + 1)[0]
  return {
      "i": jnp.array(0, jnp.int32),
      "sent": {
          "inputs": inputs,
          "max_len": max_len,
          "min_len": jnp.minimum(min_length, max_len),      # the length limit wins
          "live_seqs": jnp.zeros((b, k, positions + 1), jnp.int32),
          "live_logp": jnp.tile(jnp.array([0.0] + [NEG_INF] * (k - 1)), (b, 1)),
          "last": jnp.full((b, k), BOS_ID, jnp.int32),
          "fin_seqs": jnp.zeros((b, k, positions + 1), jnp.int32),
          "fin_scores": jnp.full((b, k), NEG_INF),
          "done": inputs[:, 0] == PAD_ID,
          **({"grammar": constraint.start(inputs, k)} if constraint is not None else {}),
          # Cached: one cache per sentence, a slot per beam, and for each live hypothesis
          # the slot that holds each of its positions (`model.DecoderLayer.step`).
          # Uncached: the encoder output, which the decoder re-reads at every step.
          **({"cache": [apply(enc, first, k, method=model.Transformer.init_cache)
                        for apply, enc in zip(applies, encoded)],
              "ancestry": jnp.zeros((b, k, first), jnp.int32)}
             if cached else {"encoded": encoded}),
      },
  }


def search_steps(params: Any, state: dict[str, Any], end: jax.Array,
                 cfg: ModelConfig | Sequence[ModelConfig], alpha: float,
                 constraint: Any = None, num_pieces: int | None = None) -> dict[str, Any]:
  """Runs the search until step `end` or until every sentence is done.

  `num_pieces`: the vocabulary's size when it is smaller than the model's output (a corpus
  whose vocabulary came out smaller than `model.vocab_size`): ids past it are never output.

  A cached search may not pass the length of its self-attention caches (`grow_caches`).
  A done sentence's finished hypotheses no longer change, so where a search stops past
  that point does not change its result.
  """
  applies = _members(params, cfg)
  b, k, width = state["sent"]["live_seqs"].shape
  positions = width - 1
  max_len, min_len = state["sent"]["max_len"], state["sent"]["min_len"]
  inputs = state["sent"]["inputs"]
  cached = "cache" in state["sent"]
  rep = lambda x: jnp.repeat(x, k, axis=0)

  def body(st):
    i, s = st["i"], st["sent"]
    member_logits, cache = [], []
    if cached:  # each live hypothesis holds position i in its own slot
      ancestry = jax.lax.dynamic_update_slice_in_dim(
          s["ancestry"], jnp.broadcast_to(jnp.arange(k)[:, None], (b, k, 1)), i, axis=2)
    for n, apply in enumerate(applies):
      if cached:
        logits, member_cache = apply(s["cache"][n], s["last"].reshape(b * k), i, inputs,
                                     ancestry, method=model.Transformer.decode_step)
        cache.append(member_cache)
      else:
        prefix = jnp.concatenate([jnp.full((b * k, 1), BOS_ID, jnp.int32),
                                  s["live_seqs"].reshape(b * k, -1)[:, :-1]], axis=1)
        prefix = jnp.where(jnp.arange(positions + 1) <= i, prefix, PAD_ID)
        all_logits = apply(rep(s["encoded"][n]), rep(inputs), prefix,
                           method=model.Transformer.decode)
        logits = jax.lax.dynamic_index_in_dim(all_logits, i, axis=1, keepdims=False)
      member_logits.append(logits.astype(jnp.float32))
    vocab = member_logits[0].shape[-1]
    member_logits = [x.reshape(b, k, vocab) for x in member_logits]
    # 2k candidates: at most k of them end in EOS, so k stay live. Beam 1 takes only the
    # best, so that it is greedy search: an EOS that is merely second would otherwise be kept
    # as a finished hypothesis, and win once the greedy path's log-prob fell below it.
    m = 2 * k if k > 1 else 1
    if constraint is not None and len(member_logits) == 1:
      # A grammar allows a few tokens at each step: the search ranks those alone.
      top_logp, beam_idx, tokens = _best_allowed(
          s["live_logp"], *constraint.candidates(member_logits[0], s["grammar"], i, max_len,
                                                 min_len), m)
    else:
      token_ids = jnp.arange(vocab)
      # Tokens a hypothesis may not take next: PAD and BOS; at the length limit all but EOS;
      # EOS before the shortest length.
      banned = ((token_ids == PAD_ID) | (token_ids == BOS_ID)
                | (token_ids >= (num_pieces or vocab))
                | ((i >= max_len)[:, None, None] & (token_ids != EOS_ID))
                | ((i < min_len)[:, None, None] & (token_ids == EOS_ID)))
      if constraint is not None:  # an ensemble's: its mean probability needs whole rows
        banned = banned | constraint.banned(s["grammar"], i, max_len, vocab)
        member_logits = [constraint.rescore(s["grammar"], x) for x in member_logits]
      top_logp, beam_idx, tokens = best_candidates(s["live_logp"], member_logits, banned, m)
    seqs = _gather_beams(s["live_seqs"], beam_idx)
    seqs = jnp.where(jnp.arange(positions + 1) == i, tokens[:, :, None], seqs)
    is_eos = tokens == EOS_ID

    # Finished: merge newly ended hypotheses into the k best so far; a done sentence's
    # stay as they are.
    new_scores = jnp.where(is_eos, top_logp / length_penalty(i + 1.0, alpha), NEG_INF)
    all_scores = jnp.concatenate([s["fin_scores"], new_scores], axis=1)
    all_seqs = jnp.concatenate([s["fin_seqs"], seqs], axis=1)
    fin_scores, fin_idx = jax.lax.top_k(all_scores, k)
    fin_seqs = _gather_beams(all_seqs, fin_idx)
    fin_scores = jnp.where(s["done"][:, None], s["fin_scores"], fin_scores)
    fin_seqs = jnp.where(s["done"][:, None, None], s["fin_seqs"], fin_seqs)

    # Live: the k best that did not end.
    live_logp, live_idx = jax.lax.top_k(jnp.where(is_eos, NEG_INF, top_logp), k)
    live_seqs = _gather_beams(seqs, live_idx)
    # A surviving hypothesis takes over its parent's history; the caches stay as they are.
    carried = {"cache": cache, "ancestry": _gather_beams(
        ancestry, _gather_beams(beam_idx, live_idx))} if cached else {}
    if constraint is not None:
      carried["grammar"] = constraint.keep(constraint.advance(s["grammar"], beam_idx, tokens),
                                           live_idx)

    # A live hypothesis scores at best its current log-prob under the largest penalty.
    best_live = live_logp[:, 0] / length_penalty(max_len + 1.0, alpha)
    done = s["done"] | (fin_scores[:, -1] >= best_live) | (i >= max_len)
    sent = {**s, "live_seqs": live_seqs, "live_logp": live_logp,
            "last": _gather_beams(tokens, live_idx), "fin_seqs": fin_seqs,
            "fin_scores": fin_scores, "done": done, **carried}
    return {"i": i + 1, "sent": sent}

  cond = lambda st: (st["i"] < end) & ~jnp.all(st["sent"]["done"])
  return jax.lax.while_loop(cond, body, state)


def grow_caches(state: dict[str, Any], size: int) -> dict[str, Any]:
  """The state with self-attention caches `size` positions long (the search goes on past
  them)."""
  pad = lambda x, axis: jnp.pad(x, [(0, size - x.shape[axis]) if a == axis else (0, 0)
                                    for a in range(x.ndim)])
  sent = state["sent"]
  cache = [[{**c, "self_k": pad(c["self_k"], 3), "self_v": pad(c["self_v"], 3)}
            for c in member] for member in sent["cache"]]
  return {**state, "sent": {**sent, "cache": cache, "ancestry": pad(sent["ancestry"], 2)}}


def select_sentences(state: dict[str, Any], rows: jax.Array) -> dict[str, Any]:
  """The state of sentences `rows` [b'] alone: a batch whose other sentences are done goes on
  at the width of the ones still searching."""
  return {"i": state["i"], "sent": jax.tree.map(lambda x: x[rows], state["sent"])}


def search_result(state: dict[str, Any]) -> tuple[jax.Array, jax.Array]:
  """Finished hypotheses [b, beam, T], PAD after their EOS, and their scores, best first."""
  seqs = state["sent"]["fin_seqs"]
  after_eos = jnp.cumsum(jnp.cumsum(seqs == EOS_ID, axis=-1), axis=-1) > 1
  return jnp.where(after_eos, PAD_ID, seqs), state["sent"]["fin_scores"]


def beam_search(params: Any, inputs: jax.Array, cfg: ModelConfig | Sequence[ModelConfig],
                beam_size: int, alpha: float, max_extra_length: int, cached: bool = True,
                min_length: int = 1, constraint: Any = None) -> tuple[jax.Array, jax.Array]:
  """Beam search for source token ids `inputs` [b, L] (EOS-terminated, PAD-padded).

  Returns finished hypotheses [b, beam, T] (EOS-terminated, PAD after) and their
  penalised scores [b, beam], best first. Beam size 1 is greedy decoding.
  `cached=False` re-runs the decoder over the whole prefix at every step: the
  same search without the key/value cache, kept only as a benchmark baseline.
  Hypotheses have at least `min(min_length, length limit)` tokens before EOS.

  An ensemble is a list of parameter trees with a list of their configs (one
  shared vocabulary): each step scores the next token by the log of the
  members' mean probability, as fairseq and T2T do.

  This is the whole search as one function; `BeamDecoder` runs the same pieces from the
  host, so that it can drop the sentences that are done from the batch.
  """
  state = search_start(params, inputs, cfg, beam_size, max_extra_length, cached, min_length,
                       constraint)
  total = state["sent"]["live_seqs"].shape[-1]
  phases = cache_phases(total) if cached else [total]
  for n, size in enumerate(phases):
    if n and cached:
      state = grow_caches(state, size)
    state = search_steps(params, state, jnp.int32(size), cfg, alpha, constraint)
  return search_result(state)


def sequence_logprobs(params: Any, inputs: jax.Array, targets: jax.Array,
                      cfg: ModelConfig | Sequence[ModelConfig]) -> tuple[jax.Array, jax.Array]:
  """log p(targets | inputs) summed over each row's target tokens (EOS included, PAD not),
  and the number of those tokens. An ensemble scores each token by the log of its members'
  mean probability, as its beam search does."""
  logps = [jax.nn.log_softmax(apply(inputs, targets).astype(jnp.float32))
           for apply in _members(params, cfg)]
  logp = _ensemble_logp(logps)
  token_logp = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
  real = targets != PAD_ID
  return jnp.sum(jnp.where(real, token_logp, 0.0), axis=-1), jnp.sum(real, axis=-1)


# The first self-attention cache length of cached beam search; each later one doubles it.
FIRST_CACHE_POSITIONS = 16
# Steps `BeamDecoder` runs between looks at which sentences are done: a host round trip
# each, against up to this many steps spent on rows that are no longer needed. 16 is where the
# first cache doubles: looking every 8 steps was no faster on the demo (445 against 438
# sentences/s) and compiled more batch shapes (first pass 12.0 s against 8.3 s).
COMPACT_EVERY = 16
# The fewest rows per device a batch shrinks to: every smaller batch size would be one more
# compiled search, for steps that cost little at any size.
MIN_ROWS = 8


def cache_phases(total: int) -> list[int]:
  """Cache lengths 16, 32, 64, ... ending at `total` (the positions a search may decode)."""
  sizes = [min(FIRST_CACHE_POSITIONS, total)]
  while sizes[-1] < total:
    sizes.append(min(2 * sizes[-1], total))
  return sizes


def strip(ids: Sequence[int]) -> list[int]:
  """Token ids up to (not including) the first EOS."""
  out = []
  for t in ids:
    if t == EOS_ID:
      break
    if t != PAD_ID:
      out.append(int(t))
  return out


class BeamDecoder:
  """Translates lists of sentences with beam search spread over all local devices.

  Sentences are sorted by length and batched so each compiled shape is reused;
  output order equals input order, and no sentence is dropped: an input longer
  than `max_input_length` tokens is truncated, with a warning.
  """

  def __init__(self, params: Any, model_cfg: ModelConfig | Sequence[ModelConfig],
               decode_cfg: DecodeConfig,
               vocab: Any, max_input_length: int, tokens_per_batch: int | None = None,
               num_devices: int | None = None, shrink: bool = True, constraint: Any = None):
    """`tokens_per_batch`: source tokens per device in one batch (default: the backend's,
    `decode_cfg.batch_tokens`). `shrink=False` keeps each batch at its rows until its
    slowest sentence ends: slower, but the programs it runs depend only on the sources, so
    `compile_ahead` can compile them all (the trainer's dev BLEU, run mid-training).
    `constraint`: the search's grammar (`search_start`), e.g. a parser's trees."""
    self.cfg, self.decode_cfg, self.vocab = model_cfg, decode_cfg, vocab
    self.shrink = shrink
    # Called as a search starts (0 done) and after each of its batches with (sentences done,
    # sentences in all, share of the source tokens done): a long decode's progress lines
    # (inference.DecodeProgress).
    self.progress: Callable[[int, int, float], None] | None = None
    self._ahead_tokens = 0  # source tokens per device of the largest batch compiled ahead
    self.max_input_length = max_input_length
    self.tokens_per_batch = tokens_per_batch or backend.decode_batch_tokens(
        decode_cfg.batch_tokens)
    # This process's devices (all by default): in a multi-process job one host may decode.
    self.devices = jax.local_devices()[:num_devices]
    # Shapes alone compile (`compile_ahead`); values must be set before translating.
    self.params = (parallel.replicated_shapes(params, len(self.devices), local_only=True)
                   if parallel.is_abstract(params) else
                   parallel.replicate(params, len(self.devices), local_only=True))
    cfgs = model_cfg if isinstance(model_cfg, ModelConfig) else tuple(model_cfg)
    pmap = functools.partial(jax.pmap, axis_name=parallel.AXIS, devices=self.devices)
    # The search's parts, each with its programs compiled ahead (`compile_ahead`) by the
    # shapes of its arguments other than the parameters.
    self._start = parallel.ShapeDispatch(pmap(functools.partial(
        search_start, cfg=cfgs, beam_size=decode_cfg.beam_size,
        max_extra_length=decode_cfg.max_extra_length, min_length=decode_cfg.min_length,
        constraint=constraint)), keyed=(1,), local=True)
    sizes = [c.vocab_size for c in ([cfgs] if isinstance(cfgs, ModelConfig) else cfgs)]
    pieces = getattr(vocab, "size", None)
    self._steps = parallel.ShapeDispatch(pmap(functools.partial(
        search_steps, cfg=cfgs, alpha=decode_cfg.alpha, constraint=constraint,
        num_pieces=pieces if pieces and pieces < min(sizes) else None)), keyed=(1, 2),
        local=True)
    self._grow = parallel.ShapeDispatch(pmap(grow_caches, static_broadcasted_argnums=1),
                                        keyed=(0,), static=(1,), local=True)
    self._select = pmap(select_sentences)
    self._score = pmap(functools.partial(sequence_logprobs, cfg=cfgs))

  def _search(self, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Beam search on `batch` [devices, rows, width]: finished hypotheses [devices, rows,
    beam, T] (EOS-terminated; read them with `strip`) and their scores.

    Runs `COMPACT_EVERY` steps at a time. Once the sentences still searching fit in half
    the rows or fewer (on every device), the batch shrinks to them: a batch no longer pays
    for its finished sentences until its slowest one ends. Steps cost in proportion to the
    rows on CPUs, and on GPUs once a batch fills the device.
    """
    n_dev, rows, _ = batch.shape
    state = self._start(self.params, batch)
    seqs = np.zeros(state["sent"]["fin_seqs"].shape, np.int32)
    scores = np.full(state["sent"]["fin_scores"].shape, NEG_INF, np.float32)
    held = np.tile(np.arange(rows), (n_dev, 1))  # the batch row each state row holds
    devs = np.arange(n_dev)[:, None]

    def keep() -> None:  # the finished hypotheses of the rows held now
      seqs[devs, held] = np.asarray(state["sent"]["fin_seqs"])
      scores[devs, held] = np.asarray(state["sent"]["fin_scores"])

    phases = cache_phases(seqs.shape[-1])
    cache_at, step = 0, 0
    while True:
      end = min(step + COMPACT_EVERY, phases[cache_at])
      state = self._steps(self.params, state, np.full(n_dev, end, np.int32))
      step = end
      done = np.asarray(state["sent"]["done"])
      if done.all() or step >= phases[-1]:
        break
      searching = int((~done).sum(axis=1).max())
      smaller = max(1 << (searching - 1).bit_length(), MIN_ROWS)
      if self.shrink and smaller <= done.shape[1] // 2:
        keep()
        # Searching rows first, then done ones as padding: a done row's result is final.
        order = np.argsort(done, axis=1, kind="stable")[:, :smaller]
        state = self._select(state, order.astype(np.int32))
        held = np.take_along_axis(held, order, axis=1)
      if step == phases[cache_at]:  # after shrinking: only the rows kept grow
        cache_at += 1
        size = phases[cache_at]
        state = self._grow(state, size)
    keep()
    return seqs, scores

  def compile_ahead(self, sentences: Sequence[str], workers: int = 1) -> int:
    """Compiles every search program that translating `sentences` will run, `workers` at a
    time; returns how many it compiled. Only for a decoder that does not shrink its batches:
    which smaller batches a shrinking search meets depends on when its sentences end."""
    if self.shrink:
      raise ValueError("compile_ahead needs a BeamDecoder(..., shrink=False)")
    sources = self.encode([s for s in sentences if s.strip()])
    shapes = sorted({batch.shape for _, batch in self._batches(sources)})  # [devices, rows, width]
    calls = []
    for shape in shapes:
      batch = jax.ShapeDtypeStruct(shape, jnp.int32)
      calls.append((self._start, (self.params, batch)))  # lowering reads only shapes
      state = jax.eval_shape(self._start.fn, self.params, batch)
      end = jax.ShapeDtypeStruct((shape[0],), jnp.int32)
      phases = cache_phases(state["sent"]["fin_seqs"].shape[-1])
      for grown in phases[1:] + [None]:  # the steps at each cache length, then its growth
        calls.append((self._steps, (self.params, state, end)))
        if grown is not None:
          calls.append((self._grow, (state, grown)))
          state = jax.eval_shape(lambda st, n=grown: self._grow.fn(st, n), state)
    self._ahead_tokens = max([self._ahead_tokens] + [rows * width for _, rows, width in shapes])
    return parallel.compile_ahead(calls, workers)

  def planned_bytes(self) -> tuple[int, int] | None:
    """The largest device plan (`parallel.planned_bytes`) of the programs compiled ahead, and
    the source tokens (rows x width) per device of the largest batch they search; None when
    nothing was compiled ahead or the backend gives no analysis."""
    plans = [p for part in (self._start, self._steps, self._grow)
             for p in part.plans().values() if p is not None]
    return (max(plans), self._ahead_tokens) if plans else None

  def encode(self, sentences: Sequence[str]) -> list[list[int]]:
    out, truncated = [], 0
    for s in sentences:
      ids = self.vocab.encode(s)
      if len(ids) + 1 > self.max_input_length:
        ids = ids[:self.max_input_length - 1]
        truncated += 1
      out.append(ids + [EOS_ID])
    if truncated:
      print(f"warning: {truncated} input sentence(s) longer than {self.max_input_length} "
            f"tokens were truncated (still translated)", file=sys.stderr, flush=True)
    return out

  def translate_ids(self, sources: Sequence[list[int]]) -> list[list[int]]:
    """EOS-terminated source ids -> best hypothesis ids (without EOS), in input order."""
    return [nbest[0][0] for nbest in self.nbest_ids(sources)]

  def nbest_ids(self, sources: Sequence[list[int]]) -> list[list[tuple[list[int], float]]]:
    """EOS-terminated source ids -> the beam's finished hypotheses (ids without EOS) with
    the scores the search ranked them by, log p(Y) / lp(|Y|) with |Y| counting the EOS, best
    first, in input order. Slots the search left empty score -inf."""
    results: list[list[tuple[list[int], float]]] = [[] for _ in sources]
    total, done, done_tokens = max(sum(map(len, sources)), 1), 0, 0
    if self.progress is not None:
      self.progress(0, len(sources), 0.0)
    for chunk, batch in self._batches(sources):
      seqs, scores = self._search(batch)
      seqs = seqs.reshape(-1, *seqs.shape[2:])
      scores = scores.reshape(seqs.shape[0], -1)
      for row, j in enumerate(chunk):
        results[j] = [(strip(hyp), -np.inf if score <= NEG_INF / 2 else float(score))
                      for hyp, score in zip(seqs[row], scores[row])]
      done, done_tokens = done + len(chunk), done_tokens + sum(len(sources[j]) for j in chunk)
      if self.progress is not None:
        self.progress(done, len(sources), done_tokens / total)
    return results

  def _batches(self, sources: Sequence[list[int]]):
    """The search's batches of `sources`, shortest first: (the sources' indices, their
    batch [devices, rows, width])."""
    n_dev = len(self.devices)
    order = sorted(range(len(sources)), key=lambda j: len(sources[j]))
    round8 = lambda n: -(-n // 8) * 8  # lengths in multiples of 8: few compiled shapes
    start = 0
    while start < len(order):
      rows = max(1, self.tokens_per_batch // round8(len(sources[order[start]])))
      chunk = order[start:start + rows * n_dev]
      width = round8(len(sources[chunk[-1]]))
      chunk = chunk[:max(1, self.tokens_per_batch // width) * n_dev]
      # Rows per device rounded up to a power of two (bounded shapes, little waste).
      per_dev = 1 << (-(-len(chunk) // n_dev) - 1).bit_length()
      batch = np.zeros((n_dev * per_dev, width), np.int32)
      for row, j in enumerate(chunk):
        batch[row, :len(sources[j])] = sources[j]
      yield chunk, batch.reshape(n_dev, per_dev, width)
      start += len(chunk)

  def score_ids(self, pairs: Sequence[tuple[list[int], list[int]]]) -> list[tuple[float, int]]:
    """EOS-terminated (source, target) ids -> (log p(target | source), target tokens), in
    input order, batched by length over the local devices."""
    n_dev = len(self.devices)
    round8 = lambda n: -(-n // 8) * 8
    order = sorted(range(len(pairs)), key=lambda j: max(map(len, pairs[j])))
    results: list[tuple[float, int]] = [(0.0, 0)] * len(pairs)
    start = 0
    while start < len(order):
      width = round8(max(map(len, pairs[order[start]])))
      chunk = order[start:start + max(1, self.tokens_per_batch // width) * n_dev]
      width = round8(max(max(map(len, pairs[j])) for j in chunk))
      per_dev = 1 << (-(-len(chunk) // n_dev) - 1).bit_length()
      src = np.zeros((n_dev * per_dev, width), np.int32)
      tgt = np.zeros((n_dev * per_dev, width), np.int32)
      for row, j in enumerate(chunk):
        src[row, :len(pairs[j][0])], tgt[row, :len(pairs[j][1])] = pairs[j]
      logp, tokens = self._score(self.params, src.reshape(n_dev, per_dev, width),
                                 tgt.reshape(n_dev, per_dev, width))
      logp, tokens = np.asarray(logp).reshape(-1), np.asarray(tokens).reshape(-1)
      for row, j in enumerate(chunk):
        results[j] = (float(logp[row]), int(tokens[row]))
      start += len(chunk)
    return results

  def translate(self, sentences: Sequence[str]) -> list[str]:
    """Empty sentences give empty translations, so outputs stay aligned."""
    nonempty = [j for j, s in enumerate(sentences) if s.strip()]
    sources = self.encode([sentences[j] for j in nonempty])
    out = [""] * len(sentences)
    if not self.decode_cfg.mbr:
      for j, hyp in zip(nonempty, self.translate_ids(sources)):
        out[j] = self.vocab.decode(hyp)
      return out
    for j, nbest in zip(nonempty, self.nbest_ids(sources)):
      texts = [self.vocab.decode(ids) for ids, _ in nbest]
      out[j] = texts[mbr.select(texts, [score for _, score in nbest],
                                self.decode_cfg.mbr_temperature)]
    return out
