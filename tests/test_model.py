"""The model against the paper's definitions, hand-computed values and invariances."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t_jax import cpu_kernels, model, registry
from t2t_jax.config import ModelConfig
from t2t_jax.special_tokens import EOS_ID, PAD_ID

from helpers import apply, offsets_layout_on_cpu, packed_layout_reference

TINY = ModelConfig(vocab_size=50, num_layers=2, d_model=16, d_ff=32, num_heads=2, d_k=8, d_v=8,
                   dropout=0.0, max_len=32)


def _params(cfg, seed=0):
  return model.init_params(cfg, jax.random.PRNGKey(seed))


def _tokens(rng, batch, length, vocab, lengths=None):
  """Random non-special tokens, PAD after each row's length, EOS at its end."""
  toks = rng.integers(4, vocab, size=(batch, length)).astype(np.int32)
  lengths = lengths if lengths is not None else [length] * batch
  for i, n in enumerate(lengths):
    toks[i, n - 1] = EOS_ID
    toks[i, n:] = PAD_ID
  return toks


def test_sinusoidal_positions_match_hand_computed_values():
  pe = model.sinusoidal_positions(3, 4)
  # PE(pos, 2i) = sin(pos / 10000^(2i/d)); d=4 -> frequencies 1 and 1/100.
  expected = np.array([
      [0.0, 1.0, 0.0, 1.0],
      [0.8414709848, 0.5403023059, 0.0099998333, 0.9999500004],
      [0.9092974268, -0.4161468365, 0.0199986667, 0.9998000067],
  ])
  np.testing.assert_allclose(pe, expected, atol=1e-6)
  # d=6, pos=2, 2i=2: 2 / 10000^(1/3) = 0.0928317767.
  np.testing.assert_allclose(model.sinusoidal_positions(3, 6)[2, 2:4],
                             [0.0926985007, 0.9956942480], atol=1e-6)


def test_decoder_is_causal():
  """Changing target tokens after position t leaves the logits at positions <= t unchanged."""
  params = _params(TINY)
  rng = np.random.default_rng(0)
  src = _tokens(rng, 2, 7, TINY.vocab_size)
  tgt = _tokens(rng, 2, 9, TINY.vocab_size)
  logits = apply(model.Transformer(TINY), {"params": params}, src, tgt)
  for t in (0, 3, 6):
    changed = tgt.copy()
    changed[:, t + 1:] = rng.integers(4, TINY.vocab_size, size=changed[:, t + 1:].shape)
    new = apply(model.Transformer(TINY), {"params": params}, src, changed)
    # Target t+1 is first seen at decoder position t+1 (inputs are shifted right).
    np.testing.assert_allclose(new[:, :t + 2], logits[:, :t + 2], atol=1e-5)
    assert not np.allclose(new[:, t + 2:], logits[:, t + 2:], atol=1e-3)


def test_extra_padding_does_not_change_outputs():
  params = _params(TINY)
  rng = np.random.default_rng(1)
  src = _tokens(rng, 3, 6, TINY.vocab_size, lengths=[6, 4, 2])
  tgt = _tokens(rng, 3, 5, TINY.vocab_size, lengths=[5, 3, 2])
  logits = apply(model.Transformer(TINY), {"params": params}, src, tgt)
  src_padded = np.pad(src, ((0, 0), (0, 7)))
  tgt_padded = np.pad(tgt, ((0, 0), (0, 4)))
  padded = apply(model.Transformer(TINY), {"params": params}, src_padded, tgt_padded)
  for i, n in enumerate([5, 3, 2]):  # compare the real (non-pad) target positions
    np.testing.assert_allclose(padded[i, :n], logits[i, :n], atol=1e-5)
  # Padding inside the original width too: row 2 has length 2 and its pads are masked.
  enc = apply(model.Transformer(TINY), {"params": params}, src, method=model.Transformer.encode)
  enc_padded = apply(model.Transformer(TINY), {"params": params}, src_padded,
                                             method=model.Transformer.encode)
  np.testing.assert_allclose(enc_padded[2, :2], enc[2, :2], atol=1e-5)


def test_source_target_and_softmax_share_one_embedding():
  params = _params(TINY)
  vocab_sized = [p for p in jax.tree_util.tree_leaves(params) if TINY.vocab_size in p.shape]
  assert len(vocab_sized) == 1 and vocab_sized[0].shape == (TINY.vocab_size, TINY.d_model)
  # The gradient of the loss reaches the matrix through all three uses: an encoder-only
  # token, a decoder-input-only token and an output-only token each get a gradient row.
  src = np.array([[10, 11, EOS_ID]], np.int32)
  tgt = np.array([[20, 21, EOS_ID]], np.int32)   # decoder inputs: BOS, 20, 21

  def loss(p):
    logits = apply(model.Transformer(TINY), {"params": p}, src, tgt)
    return logits[0, :, 30].sum()                  # token 30 appears only as an output
  grad = jax.grad(loss)(params)["embed"]["embedding"]
  for token in (10, 20, 30):
    assert float(jnp.abs(grad[token]).sum()) > 0, token
  assert float(jnp.abs(grad[40]).sum()) == 0  # an unused token gets none


def closed_form_params(vocab, n, d, d_ff, h, d_k, d_v, n_enc=None):
  """Parameters of the paper's architecture, counted from section 3 by hand
  (`n_enc` encoder layers if given, else `n`)."""
  attention = d * h * d_k * 2 + d * h * d_v + h * d_v * d   # W^Q, W^K, W^V, W^O (no biases)
  ffn = d * d_ff + d_ff + d_ff * d + d                        # W1, b1, W2, b2
  layer_norm = 2 * d                                          # gain and bias
  encoder_layer = attention + ffn + 2 * layer_norm
  decoder_layer = 2 * attention + ffn + 3 * layer_norm
  n_enc = n if n_enc is None else n_enc
  return vocab * d + n_enc * encoder_layer + n * decoder_layer  # one shared embedding matrix


@pytest.mark.parametrize("name", ["base_ende", "big_ende", "table3_b_dk16", "table3_c_d256"])
def test_param_count_equals_closed_form(name):
  m = registry.get(name).model
  expected = closed_form_params(m.vocab_size, m.num_layers, m.d_model, m.d_ff, m.num_heads,
                                m.d_k, m.d_v)
  assert model.count_params(model.abstract_params(m)) == expected


def test_deeper_encoder_than_decoder_has_the_closed_form_count():
  m = dataclasses.replace(registry.get("multi30k_ende").model, encoder_layers=6)
  expected = closed_form_params(m.vocab_size, 3, m.d_model, m.d_ff, m.num_heads, m.d_k, m.d_v,
                                n_enc=6)
  assert model.count_params(model.abstract_params(m)) == expected
  names = set(model.abstract_params(m))
  assert {f"encoder_{i}" for i in range(6)} <= names and "encoder_6" not in names
  assert "decoder_2" in names and "decoder_3" not in names


def test_parameter_shapes_are_the_initialised_models_and_traced_once_a_config(tmp_path,
                                                                              monkeypatch):
  """Every command checks its workdir's free disk (checkpoint_bytes, twice), may size its
  micro-batch from the parameter count, and reads checkpoints into the shapes: each asked
  for a trace of the whole model (~0.2 s on a CPU; 300 workdir checks took 53 s). A caller
  that changes the tree it gets changes no other caller's."""
  from t2t_jax import bookkeeping
  from helpers import tiny_cfg
  cfg = tiny_cfg()
  initialised = model.init_params(cfg.model, jax.random.PRNGKey(0))
  traced, init = [], model._init
  monkeypatch.setattr(model, "_init", lambda c, rng: traced.append(c) or init(c, rng))
  model._traced_shapes.cache_clear()
  for _ in range(3):
    bookkeeping.check_workdir(cfg, str(tmp_path))
    assert model.param_count(cfg.model) == sum(x.size for x in jax.tree_util.tree_leaves(
        initialised))
    shapes = model.abstract_params(cfg.model)
    assert jax.tree_util.tree_map(lambda x: (x.shape, x.dtype), shapes) == \
        jax.tree_util.tree_map(lambda x: (x.shape, x.dtype), initialised)
    shapes.pop("encoder_0")  # the caller's own tree
  assert traced == [cfg.model]


def test_paper_param_counts_within_8_percent():
  from t2t_jax.tools import param_table
  for row in param_table.rows():
    if row["paper_m"] is not None:
      assert abs(row["ours_m"] / row["paper_m"] - 1) < 0.08, row


@pytest.mark.parametrize("changes", [
    {"num_heads": 2, "d_k": 4, "d_v": 12},  # d_k != d_v != d_model / h (Table 3 rows A/B)
    {"positional": "learned"},               # Table 3 row E
    {"dropout": 0.3},
    {"encoder_layers": 3},                   # deeper encoder than decoder (2)
])
def test_variants_run(changes):
  cfg = dataclasses.replace(TINY, **changes)
  params = _params(cfg)
  rng = np.random.default_rng(2)
  src, tgt = _tokens(rng, 2, 5, cfg.vocab_size), _tokens(rng, 2, 6, cfg.vocab_size)
  logits = apply(model.Transformer(cfg), {"params": params}, src, tgt, train=True,
                                        rngs={"dropout": jax.random.PRNGKey(1)})
  assert logits.shape == (2, 6, cfg.vocab_size)
  assert np.isfinite(np.asarray(logits)).all()


def test_learned_positions_are_parameters_and_sinusoids_are_not():
  learned = _params(dataclasses.replace(TINY, positional="learned"))
  assert learned["encoder_positions"]["embedding"].shape == (TINY.max_len, TINY.d_model)
  assert "encoder_positions" not in _params(TINY)


def test_dropout_is_inverted_and_uses_the_rate():
  x = jnp.ones((200_000,))
  y = model.Dropout(0.1).apply({}, x, deterministic=False, rngs={"dropout": jax.random.PRNGKey(0)})
  dropped = float((y == 0).mean())
  assert abs(dropped - 0.1) < 0.005
  assert abs(float(y.mean()) - 1.0) < 0.01  # expectation preserved


DROPOUT_KEYS = 4000


def _sample_mean(fn):
  """Mean and spread of fn(key) over DROPOUT_KEYS dropout keys."""
  samples = jax.vmap(fn)(jax.random.split(jax.random.PRNGKey(7), DROPOUT_KEYS))
  return np.asarray(samples.mean(0)), np.asarray(samples.std(0))


def test_attention_dropout_keeps_the_expected_attention_output():
  """The attention output is linear in its softmax weights, so inverted dropout on the
  weights leaves its expectation at the eval-mode output (T2T's attention_dropout)."""
  cfg = dataclasses.replace(TINY, attention_dropout=0.3)
  mha = model.MultiHeadAttention(cfg)
  rng = np.random.default_rng(4)
  x_q = jnp.asarray(rng.normal(size=(1, 3, cfg.d_model)), jnp.float32)
  x_kv = jnp.asarray(rng.normal(size=(1, 5, cfg.d_model)), jnp.float32)
  bias = jnp.zeros((1, 1, 1, 5))
  variables = mha.init(jax.random.PRNGKey(0), x_q, x_kv, bias)
  exact = apply(mha, variables, x_q, x_kv, bias, train=False)
  mean, spread = _sample_mean(lambda k: apply(mha, variables, x_q, x_kv, bias, train=True,
                                                  rngs={"dropout": k}))
  assert spread.min() > 1e-3  # the weights really are dropped in training
  np.testing.assert_allclose(mean, exact, atol=4 * spread.max() / np.sqrt(DROPOUT_KEYS))


def test_relu_dropout_keeps_the_expected_feed_forward_output():
  """FFN(x) is linear in its hidden ReLU layer, so the same holds for relu_dropout."""
  cfg = dataclasses.replace(TINY, relu_dropout=0.3)
  ffn = model.FeedForward(cfg)
  x = jnp.asarray(np.random.default_rng(5).normal(size=(2, 3, cfg.d_model)), jnp.float32)
  variables = ffn.init(jax.random.PRNGKey(0), x)
  exact = apply(ffn, variables, x, train=False)
  mean, spread = _sample_mean(lambda k: apply(ffn, variables, x, train=True, rngs={"dropout": k}))
  assert spread.min() > 1e-3
  np.testing.assert_allclose(mean, exact, atol=4 * spread.max() / np.sqrt(DROPOUT_KEYS))


def test_attention_and_relu_dropout_are_off_in_eval_and_keep_the_decoder_causal():
  cfg = dataclasses.replace(TINY, attention_dropout=0.5, relu_dropout=0.5)
  params = _params(TINY)  # the options add no parameters
  rng = np.random.default_rng(6)
  src, tgt = _tokens(rng, 2, 7, TINY.vocab_size), _tokens(rng, 2, 9, TINY.vocab_size)
  plain = apply(model.Transformer(TINY), {"params": params}, src, tgt)  # no dropout at all
  np.testing.assert_array_equal(apply(model.Transformer(cfg), {"params": params}, src, tgt), plain)
  train = lambda c, t: apply(model.Transformer(c), {"params": params}, src, t, train=True,
                                                  rngs={"dropout": jax.random.PRNGKey(3)})
  for option in ("attention_dropout", "relu_dropout"):  # each is wired into the layers
    one = dataclasses.replace(TINY, **{option: 0.5})
    assert not np.allclose(train(one, tgt), plain, atol=1e-3), option
  logits, t = train(cfg, tgt), 4
  changed = tgt.copy()
  changed[:, t + 1:] = rng.integers(4, TINY.vocab_size, size=changed[:, t + 1:].shape)
  np.testing.assert_allclose(train(cfg, changed)[:, :t + 2], logits[:, :t + 2], atol=1e-5)


def test_dropout_masks_are_independent_across_keys_and_neighbours():
  a = np.asarray(model.dropout_keep_mask(jax.random.PRNGKey(0), (400, 500), 0.5), np.float64)
  b = np.asarray(model.dropout_keep_mask(jax.random.PRNGKey(1), (400, 500), 0.5), np.float64)
  again = np.asarray(model.dropout_keep_mask(jax.random.PRNGKey(0), (400, 500), 0.5))
  assert (again == a).all()  # a pure function of the key: resumed runs replay it
  # For independent fair coins the correlation is ~N(0, 1/n): |r| < 5/sqrt(n) is a 5-sigma bound.
  bound = 5 / np.sqrt(a.size)
  assert abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]) < bound
  assert abs(np.corrcoef(a[:, :-1].ravel(), a[:, 1:].ravel())[0, 1]) < bound  # along a row
  assert abs(np.corrcoef(a[:-1].ravel(), a[1:].ravel())[0, 1]) < bound        # across rows
  assert abs(a.mean() - 0.5) < bound / 2


def test_tied_logits_gradient_matches_the_plain_product():
  rng = np.random.default_rng(5)
  y = jnp.asarray(rng.normal(size=(2, 3, 8)), jnp.float32)
  emb = jnp.asarray(rng.normal(size=(11, 8)), jnp.float32)
  g = jnp.asarray(rng.normal(size=(2, 3, 11)), jnp.float32)
  plain = lambda y, e: jnp.sum(jnp.einsum("bld,vd->blv", y, e) * g)
  tied = lambda y, e: jnp.sum(cpu_kernels.tied_logits(y, e, TINY) * g)
  np.testing.assert_allclose(tied(y, emb), plain(y, emb), rtol=1e-5)
  # d/dy = g @ E and d/dE = g^T y, written out with numpy.
  dy, de = jax.grad(tied, argnums=(0, 1))(y, emb)
  np.testing.assert_allclose(dy, np.einsum("blv,vd->bld", g, emb), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(de, np.einsum("blv,bld->vd", g, y), rtol=1e-4, atol=1e-5)


def test_bfloat16_compute_stays_close_to_float32():
  params = _params(TINY)
  rng = np.random.default_rng(3)
  src, tgt = _tokens(rng, 2, 8, TINY.vocab_size), _tokens(rng, 2, 8, TINY.vocab_size)
  f32 = apply(model.Transformer(TINY), {"params": params}, src, tgt)
  bf16 = apply(model.Transformer(dataclasses.replace(TINY, dtype="bfloat16")), 
      {"params": params}, src, tgt)
  assert bf16.dtype == jnp.float32  # float32 accumulation, float32 outputs
  p32, p16 = jax.nn.softmax(f32), jax.nn.softmax(bf16)
  assert float(jnp.abs(p32 - p16).max()) < 0.02
  assert float(jnp.abs(f32 - bf16).max()) < 0.1 * float(jnp.abs(f32).max())
  assert float(jnp.abs(f32 - bf16).max()) > 0  # it really computed in bf16


def test_bfloat16_gradients_run_and_stay_close_to_float32():
  # Under jit on XLA:CPU some bf16 x bf16 -> f32 gradient dots used to fail at run time
  # ("UNIMPLEMENTED ... DotThunk"); gradients must exist and point where float32's do.
  params = _params(TINY)
  rng = np.random.default_rng(5)
  src, tgt = _tokens(rng, 3, 8, TINY.vocab_size), _tokens(rng, 3, 8, TINY.vocab_size)

  def grads(cfg):
    def loss(p):
      logp = jax.nn.log_softmax(apply(model.Transformer(cfg), {"params": p}, src, tgt))
      return -jnp.take_along_axis(logp, tgt[..., None], axis=-1).mean()
    return jax.jit(jax.grad(loss))(params)

  g32, g16 = grads(TINY), grads(dataclasses.replace(TINY, dtype="bfloat16"))
  for path, a, b in zip(jax.tree_util.tree_leaves_with_path(g32), jax.tree_util.tree_leaves(g32),
                        jax.tree_util.tree_leaves(g16)):
    assert b.dtype == jnp.float32
    a, b = np.ravel(a), np.ravel(b)
    cosine = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))
    assert cosine > 0.98, (jax.tree_util.keystr(path[0]), cosine)


def test_attention_weights_are_recorded_per_head():
  params = _params(TINY)
  rng = np.random.default_rng(4)
  src, tgt = _tokens(rng, 1, 5, TINY.vocab_size), _tokens(rng, 1, 4, TINY.vocab_size)
  _, state = apply(model.Transformer(TINY), {"params": params}, src, tgt,
                                           mutable=["intermediates"])
  w = state["intermediates"]["decoder_1"]["cross_attention"]["attention_weights"][0]
  assert w.shape == (1, TINY.num_heads, 4, 5)
  np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)


def _assert_same_beam_search(params, inputs, cfg_a, cfg_b):
  """Beam search (beam 2) finds the same hypotheses with the same scores under both configs."""
  from t2t_jax import decode
  beams = [jax.jit(lambda p, x: decode.beam_search(p, x, cfg=c, beam_size=2, alpha=0.6,
                                                   max_extra_length=4))(params, inputs)
           for c in (cfg_a, cfg_b)]
  np.testing.assert_array_equal(beams[0][0], beams[1][0])
  np.testing.assert_allclose(beams[0][1], beams[1][1], atol=1e-4)


def test_fused_attention_with_key_lengths_equals_the_bias_path_on_padded_batches():
  """The fused kernel takes padding as key lengths and causality as a flag (no bias tensor):
  on right-padded batches it computes what the additive bias does, and so does cached
  decoding, whose self-attention keys are the positions decoded so far."""
  cfg = dataclasses.replace(TINY, implementation="plain")
  fused = dataclasses.replace(cfg, fused_attention=True)
  params = _params(cfg)
  rng = np.random.default_rng(3)
  inputs = jnp.asarray(_tokens(rng, 3, 9, cfg.vocab_size, lengths=[9, 4, 6]))
  targets = jnp.asarray(_tokens(rng, 3, 7, cfg.vocab_size, lengths=[3, 7, 5]))
  weights = (targets != PAD_ID).astype(jnp.float32)

  def loss_and_logits(c, p):
    logits = apply(model.Transformer(c), {"params": p}, inputs, targets)
    return jnp.sum(jax.nn.log_softmax(logits)[..., 7] * weights), logits
  grad = jax.jit(jax.value_and_grad(loss_and_logits, argnums=1, has_aux=True),
                 static_argnums=0)
  (la, logits_a), ga = grad(cfg, params)
  (lb, logits_b), gb = grad(fused, params)
  np.testing.assert_allclose(logits_b, logits_a, atol=1e-5)
  np.testing.assert_allclose(lb, la, rtol=1e-5)
  for x, y in zip(jax.tree_util.tree_leaves(ga), jax.tree_util.tree_leaves(gb)):
    np.testing.assert_allclose(y, x, atol=1e-5)
  # The fused path is given no bias at all: its lengths alone hide the padding.
  jaxpr = str(jax.make_jaxpr(lambda p: model.Transformer(fused).apply(
      {"params": p}, inputs, targets))(params))
  assert "-1000000000.0" not in jaxpr and "-1e+09" not in jaxpr

  _assert_same_beam_search(params, inputs, cfg, fused)


def test_a_row_of_padding_only_stays_finite_with_fused_attention():
  """A batch's filler rows are all PAD: a kernel given zero keys would divide by nothing."""
  cfg = dataclasses.replace(TINY, implementation="plain", fused_attention=True)
  inputs = jnp.zeros((2, 5), jnp.int32).at[0, :3].set(jnp.array([5, 6, EOS_ID]))
  targets = jnp.zeros((2, 4), jnp.int32).at[0, :2].set(jnp.array([7, EOS_ID]))
  logits = apply(model.Transformer(cfg), {"params": _params(cfg)}, inputs, targets)
  assert np.isfinite(np.asarray(logits)).all()


@pytest.mark.parametrize("full_logits", [True, False])
def test_memory_estimate_per_token_covers_what_xla_allocates(full_logits):
  """The auto micro-batch trusts `train_bytes_per_token`: it must not fall below what XLA
  itself plans for a training step's temporaries (here XLA:CPU's plan for a float32 step),
  nor be so loose that it wastes most of a device."""
  from t2t_jax import registry as exps
  from t2t_jax import loss as losses
  from t2t_jax.config import override
  cfg = dataclasses.replace(TINY, vocab_size=300, d_model=64, d_ff=128, num_heads=4,
                            d_k=16, d_v=16, dropout=0.1, implementation="plain")
  ecfg = override(exps.get("demo"), {"train.loss_chunk_tokens": 0 if full_logits else 64})
  ecfg = dataclasses.replace(ecfg, model=cfg)
  batch, length = 16, 32
  tokens = jnp.full((batch, length), 5, jnp.int32)

  def loss(p):
    return losses.model_loss_sums(model.Transformer(cfg), p, tokens, tokens, ecfg, train=True,
                                   rngs={"dropout": jax.random.PRNGKey(1)})[0]
  params = _params(cfg)
  planned = jax.jit(jax.grad(loss)).lower(params).compile().memory_analysis().temp_size_in_bytes
  estimate = model.train_bytes_per_token(cfg, length, full_logits) * batch * length
  assert planned <= estimate <= 3 * planned


@pytest.mark.parametrize("implementation", ["plain", "cpu_tuned"])
def test_fused_projections_are_the_same_parameters_and_the_same_function(implementation):
  """Q, K and V as one product over the matrices side by side: the parameter tree and its
  initial values are those of three dense layers (checkpoints and exports do not change),
  and the logits, gradients and beam search are theirs; d_k != d_v (Table 3 row B) splits."""
  cfg = dataclasses.replace(TINY, d_v=4, implementation=implementation,
                            fused_projections=False)
  fused = dataclasses.replace(cfg, fused_projections=True)
  params = _params(cfg)
  fused_params = _params(fused)
  assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(fused_params)
  for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(fused_params)):
    np.testing.assert_array_equal(a, b)
  rng = np.random.default_rng(8)
  inputs = jnp.asarray(_tokens(rng, 3, 9, cfg.vocab_size, lengths=[9, 4, 6]))
  targets = jnp.asarray(_tokens(rng, 3, 7, cfg.vocab_size, lengths=[3, 7, 5]))

  def loss_and_logits(c, p):
    logits = apply(model.Transformer(c), {"params": p}, inputs, targets)
    return jnp.sum(jax.nn.log_softmax(logits)[..., 7]), logits
  grad = jax.jit(jax.value_and_grad(loss_and_logits, argnums=1, has_aux=True),
                 static_argnums=0)
  (la, logits_a), ga = grad(cfg, params)
  (lb, logits_b), gb = grad(fused, params)
  np.testing.assert_allclose(logits_b, logits_a, atol=1e-5)
  for x, y in zip(jax.tree_util.tree_leaves(ga), jax.tree_util.tree_leaves(gb)):
    np.testing.assert_allclose(y, x, atol=1e-5)

  _assert_same_beam_search(params, inputs, cfg, fused)


def test_fused_projections_are_one_product_per_attention_block_on_the_gpu_path():
  """The lowered plain bf16 forward pass (what a GPU runs) has one [d, 3 h d_k] product per
  self-attention block and one [d, 2 h d_k] product per cross-attention block, and no
  separate query, key or value product of the encoder's input width beside them."""
  cfg = dataclasses.replace(TINY, num_heads=3, d_k=5, d_v=5, implementation="plain",
                            dtype="bfloat16", fused_projections=True)
  params = _params(cfg)
  inputs = jnp.ones((2, 6), jnp.int32) * 7
  hlo = jax.jit(lambda p: model.Transformer(cfg).apply({"params": p}, inputs, inputs)).lower(
      params).as_text()
  widths = [int(m) for m in __import__("re").findall(
      r"stablehlo\.dot_general[^\n]*-> tensor<\d+x\d+x(\d+)xbf16>", hlo)]
  layers = cfg.num_layers
  assert widths.count(3 * 15) == 2 * layers           # encoder and decoder self-attention
  assert widths.count(2 * 15) == layers               # cross-attention's keys and values
  assert widths.count(15) == layers                   # cross-attention's queries only


def test_segments_of_packed_rows_are_found_from_their_eos():
  row = jnp.array([[5, 6, EOS_ID, 7, EOS_ID, 8, 9, 9, EOS_ID, PAD_ID, PAD_ID]])
  segs = model.segments(row)
  np.testing.assert_array_equal(segs.ids[0], [1, 1, 1, 2, 2, 3, 3, 3, 3, 0, 0])
  np.testing.assert_array_equal(segs.positions[0], [0, 1, 2, 0, 1, 0, 1, 2, 3, 0, 0])


def test_a_packed_row_longer_than_the_learned_table_gets_its_sentences_own_logits():
  """A packed source row of the longest class may be longer than `model.max_len` (its length
  is the target's times the corpus's ratio), mostly padding. Learned positions index the
  table by each token's place in its sentence, padding included: the row's logits are finite
  and its sentence's are what the sentence gets alone."""
  cfg = dataclasses.replace(TINY, implementation="plain", positional="learned", max_len=16)
  params = _params(cfg)
  rng = np.random.default_rng(3)
  src = list(rng.integers(4, cfg.vocab_size, 4)) + [EOS_ID]
  tgt = list(rng.integers(4, cfg.vocab_size, 6)) + [EOS_ID]
  apply = jax.jit(lambda s, t: model.Transformer(cfg, packed=True).apply({"params": params},
                                                                         s, t))
  long_row = apply(_pack([[src]], 40), _pack([[tgt]], 16))    # source row 40 > max_len 16
  alone = apply(_pack([[src]], 8), _pack([[tgt]], 16))
  assert np.isfinite(np.asarray(long_row)).all()
  np.testing.assert_allclose(long_row[0, :len(tgt)], alone[0, :len(tgt)], atol=1e-5)


def _pack(rows_of_ids, width):
  out = np.zeros((len(rows_of_ids), width), np.int32)
  for r, sentences in enumerate(rows_of_ids):
    flat = [t for s in sentences for t in s]
    out[r, :len(flat)] = flat
  return jnp.asarray(out)


def test_segment_offsets_by_hand():
  """Row 0: sentences of 3 and 2 tokens, then padding; row 1: one sentence of 6 tokens;
  the keys' row 0 holds its second sentence at 4..6. Limit 3: a third slot, unused."""
  q_ids = jnp.array([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 1]])
  k_ids = jnp.array([[1, 1, 1, 1, 2, 2, 2, 0], [1, 1, 0, 0, 0, 0, 0, 0]])
  q_len, k_len, q_off, k_off = model.segment_offsets(q_ids, k_ids, 3)
  np.testing.assert_array_equal(q_len, [[3, 2, -1], [6, -1, -1]])
  np.testing.assert_array_equal(k_len, [[4, 3, -1], [2, -1, -1]])
  np.testing.assert_array_equal(q_off, [[0, 3, -1, -1], [0, -1, -1, -1]])
  np.testing.assert_array_equal(k_off, [[0, 4, -1, -1], [0, -1, -1, -1]])


def _offsets_layout(monkeypatch, kernel=packed_layout_reference):
  offsets_layout_on_cpu(monkeypatch, kernel)


@pytest.mark.parametrize("changes", [{}, {"fused_attention": True},
                                     {"fused_attention": True, "segment_attention": "offsets"},
                                     {"positional": "learned"}])
def test_packed_sentences_get_the_log_probabilities_and_gradients_they_get_alone(
    changes, monkeypatch):
  """Three sentence pairs, each alone in its row, then packed two in a row (positions
  restart, attention stays within each sentence): every target token's log-probability is
  the same, and so is the gradient of their sum (dropout off), on the einsum and the fused
  attention paths (its bias layout, and its packed layout with cuDNN's documented behaviour
  standing in for the kernel, NaN where it is undefined), and with learned positions."""
  _offsets_layout(monkeypatch)
  cfg = dataclasses.replace(TINY, implementation="plain", **changes)
  params = _params(cfg)
  rng = np.random.default_rng(12)
  sent = lambda n: list(rng.integers(4, cfg.vocab_size, n - 1)) + [EOS_ID]
  pairs = [(sent(5), sent(4)), (sent(3), sent(6)), (sent(7), sent(5))]
  alone_src = _pack([[s] for s, _ in pairs], 8)
  alone_tgt = _pack([[t] for _, t in pairs], 8)
  packed_src = _pack([[pairs[0][0], pairs[1][0]], [pairs[2][0]]], 12)
  packed_tgt = _pack([[pairs[0][1], pairs[1][1]], [pairs[2][1]]], 12)

  @functools.partial(jax.jit, static_argnums=3)  # one compilation, not one per operation
  def token_logp(p, src, tgt, packed):
    logits = apply(model.Transformer(cfg, packed=packed), {"params": p}, src, tgt)
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits), tgt[..., None], -1)[..., 0]
    return jnp.where(tgt != PAD_ID, logp, 0.0)

  alone = np.asarray(token_logp(params, alone_src, alone_tgt, False))
  packed = np.asarray(token_logp(params, packed_src, packed_tgt, True))
  lengths = [len(t) for _, t in pairs]
  np.testing.assert_allclose(packed[0, :lengths[0]], alone[0, :lengths[0]], atol=1e-5)
  np.testing.assert_allclose(packed[0, lengths[0]:lengths[0] + lengths[1]],
                             alone[1, :lengths[1]], atol=1e-5)
  np.testing.assert_allclose(packed[1, :lengths[2]], alone[2, :lengths[2]], atol=1e-5)
  grad = lambda src, tgt, packed: jax.jit(jax.grad(
      lambda p: jnp.sum(token_logp(p, src, tgt, packed))))(params)
  for a, b in zip(jax.tree_util.tree_leaves(grad(alone_src, alone_tgt, False)),
                  jax.tree_util.tree_leaves(grad(packed_src, packed_tgt, True))):
    np.testing.assert_allclose(b, a, atol=1e-5)
  # Unpacked rows read as packed rows of one sentence each: the same model.
  one_each = np.asarray(token_logp(params, alone_src, alone_tgt, True))
  np.testing.assert_allclose(one_each, alone, atol=1e-5)


def test_packed_layout_is_used_while_rows_fit_its_bound_and_the_bias_layout_after():
  """A kernel that returns zeros shows which layout ran: rows of 16 tokens take at most 2
  sentences on the packed layout (`max_segments`), so a batch whose rows hold 2 runs it (the
  logits differ from the bias layout's) and a batch with a row of 3 runs the bias layout
  (the same logits)."""
  cfg = dataclasses.replace(TINY, implementation="plain", fused_attention=True)
  params = _params(cfg)
  rng = np.random.default_rng(3)
  sent = lambda n: list(rng.integers(4, cfg.vocab_size, n - 1)) + [EOS_ID]
  assert model.max_segments(16, 16) == 2
  two = (_pack([[sent(5), sent(6)]], 16), _pack([[sent(4), sent(7)]], 16))
  three = (_pack([[sent(5), sent(4), sent(3)]], 16), _pack([[sent(4), sent(3), sent(5)]], 16))
  logits = lambda c, batch: np.asarray(jax.jit(
      model.Transformer(c, packed=True).apply)({"params": params}, *batch))
  with pytest.MonkeyPatch.context() as mp:
    _offsets_layout(mp, lambda q, k, v, *_: jnp.zeros_like(q))
    zeros = dataclasses.replace(cfg, segment_attention="offsets")
    assert not np.allclose(logits(zeros, two), logits(cfg, two), atol=1e-3)
    np.testing.assert_allclose(logits(zeros, three), logits(cfg, three), atol=1e-5)


def test_packed_layout_needs_cudnn_on_a_hopper_gpu():
  """On this CPU asking for the packed layout says what it needs instead of failing inside
  JAX; auto is the bias layout."""
  from t2t_jax.errors import UserError
  with pytest.raises(UserError, match="Hopper"):
    model.backend.segment_attention("offsets", "bfloat16")
  assert model.backend.segment_attention("auto", "bfloat16") == "bias"


def test_the_packed_layout_lowers_to_cudnns_packed_kernels_for_a_gpu(monkeypatch):
  """Lowered for CUDA on this CPU (JAX's cuDNN version and capability checks told it is a
  Hopper GPU with cuDNN 9.10): the gradient of a packed model runs each attention through
  cuDNN's kernel with `max_seg_per_batch` = L / 8 sentences (encoder and cross-attention
  unmasked, decoder self-attention causal), and its backward kernel; the bias layout's
  kernels are there too, as the other branch. JAX's own checks of the arguments' ranks,
  dtypes and batch pass on the way."""
  import re
  from jax._src.cudnn import fused_attention_stablehlo as cudnn
  monkeypatch.setattr(cudnn, "check_cudnn_version", lambda: 91000)
  monkeypatch.setattr(cudnn, "check_compute_capability", lambda capability: True)
  monkeypatch.setattr(cudnn, "is_cuda_compute_capability_equal", lambda capability: False)
  monkeypatch.setattr(model.backend, "attention_implementation", lambda dtype: "cudnn")
  _offsets_layout(monkeypatch, model.cudnn_packed_attention)
  cfg = dataclasses.replace(TINY, num_layers=1, d_k=16, d_v=16, max_len=64,
                            implementation="plain", fused_attention=True,
                            segment_attention="offsets", dtype="bfloat16")
  params = _params(dataclasses.replace(TINY, num_layers=1, d_k=16, d_v=16, max_len=64))
  rows = jnp.ones((4, 64), jnp.int32)
  loss = lambda p: jnp.sum(apply(model.Transformer(cfg, packed=True), 
      {"params": p}, rows, rows).astype(jnp.float32))
  text = jax.jit(jax.grad(loss)).trace(params).lower(lowering_platforms=("cuda",)).as_text()
  calls = [line for line in text.splitlines() if "__cudnn$fmha" in line]
  packed = [line for line in calls if re.search(r"max_seg_per_batch\\22: 8\b", line)]
  forward = [re.findall(r"mask_type\\22: \\22(\w+)", line)[0] for line in packed
             if "Backward" not in line]
  assert sorted(forward) == ["CAUSAL", "NO_MASK", "NO_MASK"]
  assert sum("Backward" in line for line in packed) == 3
  assert sum("fmhaScaleBiasSoftmax" in line for line in calls) == 6  # the other branch


def _hopper_gpu() -> bool:
  try:
    return model.backend.segment_attention("offsets", "bfloat16") == "offsets"
  except Exception:
    return False


@pytest.mark.skipif(not _hopper_gpu(), reason="needs cuDNN on a Hopper or newer GPU")
def test_cudnn_packed_layout_equals_the_bias_layout_on_a_gpu():
  """On a Hopper GPU, the real kernel: packed rows' logits and gradients in the packed
  layout are those of the bias layout, to bf16 tolerance, padding included (rows of 64
  tokens with up to 8 sentences, one row of padding only)."""
  cfg = dataclasses.replace(TINY, implementation="plain", fused_attention=True,
                            dtype="bfloat16", d_k=16, d_v=16, max_len=64)
  params = _params(cfg)
  rng = np.random.default_rng(5)
  rows = []
  for _ in range(7):
    row, room = [], 60
    while room > 2:
      n = int(rng.integers(2, min(room, 20) + 1))
      row.append(list(rng.integers(4, cfg.vocab_size, n - 1)) + [EOS_ID])
      room -= n
    rows.append(row)
  assert max(map(len, rows)) <= model.max_segments(64, 64)  # the packed layout runs
  src = _pack([[s[::-1] for s in r] for r in rows] + [[]], 64)
  tgt = _pack(rows + [[]], 64)

  def loss(p, c):
    logits = apply(model.Transformer(c, packed=True), {"params": p}, src, tgt)
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits), tgt[..., None], -1)[..., 0]
    return jnp.sum(jnp.where(tgt != PAD_ID, logp, 0.0)), logits

  offsets = dataclasses.replace(cfg, segment_attention="offsets")
  (l_b, logits_b), g_b = jax.value_and_grad(loss, has_aux=True)(params, cfg)
  (l_o, logits_o), g_o = jax.value_and_grad(loss, has_aux=True)(params, offsets)
  real = np.asarray(tgt != PAD_ID)
  np.testing.assert_allclose(np.asarray(logits_o)[real], np.asarray(logits_b)[real],
                             atol=5e-2, rtol=5e-2)
  np.testing.assert_allclose(float(l_o), float(l_b), rtol=1e-2)
  for a, b in zip(jax.tree_util.tree_leaves(g_b), jax.tree_util.tree_leaves(g_o)):
    assert np.all(np.isfinite(b))
    np.testing.assert_allclose(b, a, atol=5e-2 * max(1.0, float(np.abs(a).max())))
