"""The loss against the paper's formula (section 5.4), hand-computed values and autodiff of
the textbook form, and its chunked forms against the whole logits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t_jax import loss
from t2t_jax.config import override
from t2t_jax.special_tokens import PAD_ID

from helpers import tiny_cfg


def test_label_smoothed_loss_matches_hand_computation():
  logits = jnp.log(jnp.array([[[0.1, 0.7, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25]]]))
  targets = jnp.array([[1, 0]])  # token 1, then padding (PAD = 0)
  smoothed, nll, tokens = loss.loss_sums(logits, targets, 0.3)
  assert float(tokens) == 1.0
  assert float(nll) == pytest.approx(-np.log(0.7), abs=1e-6)
  # q = (0.1, 0.7, 0.1, 0.1) equals the smoothed target, so the KL form is 0.
  assert float(smoothed) == pytest.approx(0.0, abs=1e-6)
  assert float(loss.loss_sums(logits, targets, 0.0)[0]) == pytest.approx(-np.log(0.7), abs=1e-6)


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_loss_gradient_matches_autodiff_of_the_textbook_formula(eps):
  # The loss has a hand-written gradient (softmax - q); autodiff of the plain
  # log_softmax formula is the independent reference, for both outputs.
  rng = np.random.default_rng(0)
  vocab = 11
  logits = jnp.asarray(rng.normal(size=(2, 5, vocab)) * 3, jnp.float32)
  targets = jnp.asarray(rng.integers(1, vocab, size=(2, 5)), jnp.int32).at[1, 3:].set(PAD_ID)

  def reference(lg):
    logp = jax.nn.log_softmax(lg)
    q = jax.nn.one_hot(targets, vocab) * (1 - eps - eps / (vocab - 1)) + eps / (vocab - 1)
    w = (targets != PAD_ID).astype(jnp.float32)
    ce = -jnp.sum(q * logp, axis=-1)
    entropy = -jnp.sum(jnp.where(q > 0, q * jnp.log(q), 0.0), axis=-1)
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return jnp.sum((ce - entropy) * w), jnp.sum(nll * w)

  ours = lambda lg: loss.loss_sums(lg, targets, eps)[:2]
  for pick in (0, 1):  # smoothed loss, then NLL
    mix = lambda f: (lambda lg: f(lg)[pick] + 0.5 * f(lg)[1 - pick])
    np.testing.assert_allclose(jax.grad(mix(ours))(logits), jax.grad(mix(reference))(logits),
                               atol=1e-6)
  np.testing.assert_allclose(ours(logits), reference(logits), rtol=1e-5)
  assert float(jnp.abs(jax.grad(mix(ours))(logits)[1, 3:]).max()) == 0.0  # padding


def test_chunks_of_the_loss_are_the_fewest_within_the_setting_and_equal():
  """By hand: 2,777 rows of 9 tokens (a prime row count) in chunks of at most 4,096 tokens are
  7 chunks, not 2,777 of one row; a row longer than the setting is split, not a chunk grown
  past it; a multiple of 8 only where it fits."""
  assert loss.chunk_layout(2777 * 9, 4096) == (7, 3576)   # 24,993 / 7 = 3,570.4 -> 3,576
  assert loss.chunk_layout(25600, 4096) == (7, 3664)
  assert loss.chunk_layout(8192, 4096) == (2, 4096)
  assert loss.chunk_layout(80, 7) == (12, 7)              # 8 would exceed the setting
  assert loss.chunk_layout(80, 1000) == (1, 80)
  assert loss.chunk_layout(1, 4096) == (1, 8)


def _padded_batch(rng, vocab, batch=8, length=10):
  inputs = rng.integers(4, vocab, (batch, length + 2)).astype(np.int32)
  targets = rng.integers(4, vocab, (batch, length)).astype(np.int32)
  targets[1, 4:] = PAD_ID
  targets[2, 7:] = PAD_ID
  inputs[1, 5:] = PAD_ID
  inputs[-1], targets[-1] = PAD_ID, PAD_ID  # a filler row
  return jnp.asarray(inputs), jnp.asarray(targets)


@pytest.mark.parametrize("implementation, dtype, chunk, lean, rows, smoothing", [
    ("plain", "float32", 7, True, 8, 0.1), ("plain", "float32", 1000, True, 8, 0.1),
    ("cpu_tuned", "float32", 16, True, 8, 0.1), ("cpu_tuned", "bfloat16", 16, True, 8, 0.1),
    ("plain", "bfloat16", 16, True, 8, 0.1), ("plain", "float32", 16, False, 8, 0.1),
    ("plain", "bfloat16", 16, False, 8, 0.1),
    # 13 rows (a prime) in chunks of several rows, the last padded; no label smoothing.
    ("plain", "float32", 24, True, 13, 0.0), ("plain", "float32", 24, False, 13, 0.0),
    ("cpu_tuned", "float32", 24, True, 13, 0.1)])
def test_chunked_output_layer_and_loss_equal_the_whole_logits(implementation, dtype, chunk,
                                                              lean, rows, smoothing):
  """Chunks smaller than a row, one chunk larger than all the tokens, chunks of several rows
  over a prime row count, both model paths, the lean loss and autodiff's, label smoothing 0
  and 0.1: the same loss sums and the same gradient as building the [tokens, vocab] logits.
  In bf16 "the same" means as accurate: measured against the float32 model's gradient, the
  chunked gradient is as close as the whole logits' one."""
  import dataclasses
  from t2t_jax import model
  m = dataclasses.replace(tiny_cfg().model, vocab_size=300, d_model=32, dropout=0.1,
                          implementation=implementation, dtype=dtype,
                          label_smoothing=smoothing)
  params = model.init_params(m, jax.random.PRNGKey(0))
  inputs, targets = _padded_batch(np.random.default_rng(0), m.vocab_size, batch=rows)

  def sums(chunk_tokens, m=m, lean=lean):
    cfg = dataclasses.replace(override(tiny_cfg(), {"train.loss_chunk_tokens": chunk_tokens,
                                                     "train.lean_loss": lean}), model=m)
    def f(p):
      out = loss.model_loss_sums(model.Transformer(m), p, inputs, targets, cfg, train=True,
                                  rngs={"dropout": jax.random.PRNGKey(2)})
      return out[0], out
    return jax.jit(jax.value_and_grad(f, has_aux=True))(params)
  (_, whole), g_whole = sums(0)
  (_, chunked), g_chunked = sums(chunk)
  assert float(whole[2]) == float(chunked[2]) == float(jnp.sum(targets != PAD_ID))
  tol = 1e-5 if dtype == "float32" else 2e-2  # bf16: the whole path rounds logits differently
  np.testing.assert_allclose(np.array(chunked[:2]), np.array(whole[:2]), rtol=tol)
  if dtype == "float32":  # float32 sums in another order: within 1e-5 of each array's scale
    for a, b in zip(jax.tree_util.tree_leaves(g_chunked), jax.tree_util.tree_leaves(g_whole)):
      np.testing.assert_allclose(a, b, atol=1e-6 + 1e-5 * float(jnp.max(jnp.abs(b))),
                                 rtol=1e-4)
    return
  # bf16 rounds the two paths' logits (and the lean loss its softmax - q) differently. A fixed
  # bound on their difference held on jax 0.10.2 and not on 0.11.2, whose bf16 gradients sit
  # further from float32's, so the reference is float32: over all parameters the chunked
  # gradient's error is within 10% of the whole logits' (measured 0.97-0.99x), and no array
  # differs between the two paths by more than 1.5x that array's own bf16 error (measured at
  # most 1.0x on jax 0.10.2 and 0.11.2). A dropped or doubled chunk fails both by far.
  exact = dataclasses.replace(m, dtype="float32")
  _, g_exact = sums(0, exact, False)
  flat = lambda g: [np.ravel(np.float32(x)) for x in jax.tree_util.tree_leaves(g)]
  c, w, f = flat(g_chunked), flat(g_whole), flat(g_exact)
  error = lambda xs: np.linalg.norm(np.concatenate(xs) - np.concatenate(f))
  assert error(c) <= 1.1 * error(w)
  for a, b, ref in zip(c, w, f):
    assert np.linalg.norm(a - b) <= 1.5 * np.linalg.norm(b - ref) + 1e-6


def test_chunked_loss_never_builds_the_whole_logits():
  """No array of the chunked step's forward or backward pass holds [tokens, vocab]."""
  import dataclasses
  import re
  from t2t_jax import model
  m = dataclasses.replace(tiny_cfg().model, vocab_size=300, d_model=32, dropout=0.1,
                          implementation="plain")
  params = model.init_params(m, jax.random.PRNGKey(0))
  inputs, targets = _padded_batch(np.random.default_rng(0), m.vocab_size)  # 80 target tokens

  def largest_vocab_array(chunk_tokens) -> int:
    cfg = dataclasses.replace(override(tiny_cfg(), {"train.loss_chunk_tokens": chunk_tokens}),
                              model=m)
    f = lambda p: loss.model_loss_sums(model.Transformer(m), p, inputs, targets, cfg,
                                        train=True, rngs={"dropout": jax.random.PRNGKey(2)})[0]
    text = str(jax.make_jaxpr(jax.grad(f))(params))
    shapes = [tuple(int(d) for d in s.split(",")) for s in re.findall(r"\[([\d,]+)\]", text)]
    return max(int(np.prod(s)) for s in shapes if s[-1] == m.vocab_size)
  assert largest_vocab_array(0) == 80 * 300
  assert largest_vocab_array(16) <= 16 * 300  # whole rows, at most 16 tokens
