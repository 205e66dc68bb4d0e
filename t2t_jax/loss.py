"""The paper's training loss (section 5.4): label-smoothed cross-entropy over the non-pad
target tokens, as sums, so that a step divides by its own token count however it is split
over devices and micro-batches.

The output layer and loss run whole (the [tokens, vocab] float32 logits, with a custom
gradient, softmax - q, in one pass), or in chunks of tokens (`train.loss_chunk_tokens`, the
GPU and TPU default), whose logits are built and dropped in turn; there each chunk's gradient
is formed in its forward pass (`train.lean_loss`).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from t2t_jax import backend, cpu_kernels, model
from t2t_jax.config import ExperimentConfig, ModelConfig
from t2t_jax.special_tokens import PAD_ID


def loss_sums(logits: jax.Array, targets: jax.Array, label_smoothing: float
              ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(label-smoothed cross-entropy, plain NLL, token count), summed over non-pad targets.

  Smoothing (section 5.4): the true token gets 1 - eps, the other V - 1 tokens
  eps / (V - 1) each. The constant entropy of that distribution is subtracted
  so a perfect model scores 0.
  """
  smoothed, target_logp = _token_losses(logits.astype(jnp.float32), targets, label_smoothing)
  return _summed(smoothed, target_logp, targets, label_smoothing, logits.shape[-1])


def _summed(smoothed: jax.Array, target_logp: jax.Array, targets: jax.Array,
            label_smoothing: float, vocab: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """`loss_sums` from the per-token losses: the smoothed target's entropy subtracted, pad
  tokens weighing nothing."""
  confidence, low = _smoothed_target(label_smoothing, vocab)
  entropy = -(confidence * math.log(confidence) + (vocab - 1) * low * math.log(low)) \
      if label_smoothing > 0 else 0.0
  weights = (targets != PAD_ID).astype(jnp.float32)
  return (jnp.sum((smoothed - entropy) * weights), -jnp.sum(target_logp * weights),
          jnp.sum(weights))


def chunked_loss_sums(features: jax.Array, embedding: jax.Array, targets: jax.Array,
                      cfg: ModelConfig, chunk: int, lean: bool = True
                      ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """`loss_sums` of the tied logits of `features` [b, l, d], about `chunk` tokens at a time.

  The [tokens, vocab] float32 logits (3.7 GB for a 25k-token micro-batch at 37k pieces) are
  never built whole: a scan over chunks builds each chunk's logits (bf16 product, float32
  result), reduces them to the chunk's loss sums, and drops them. Each token's loss is its
  own, so chunks are runs of tokens, not rows: the fewest chunks of at most `chunk` tokens,
  of equal size, the last padded with PAD targets (which weigh nothing) by fewer tokens than
  there are chunks (times 8, when the size is rounded to a multiple of 8).

  `lean` (the default, `_lean_loss_sums`): each chunk's gradient softmax - q is formed in the
  forward pass and sent through the two gradient products there, in the compute dtype with
  float32 accumulation; nothing is recomputed. Otherwise autodiff differentiates the chunks
  (`jax.checkpoint` recomputes each chunk's logits, and the gradient products run on the
  float32 cotangent): `train.lean_loss=false`, kept in case a quality run disagrees.
  """
  n, size = chunk_layout(targets.size, chunk)
  pad = n * size - targets.size
  y = jnp.pad(features.reshape(-1, features.shape[-1]), ((0, pad), (0, 0)))
  y = y.reshape(n, size, features.shape[-1])
  t = jnp.pad(targets.reshape(-1), (0, pad), constant_values=PAD_ID).reshape(n, size)
  if lean:
    smoothed, nll, tokens = _lean_loss_sums(y, embedding, t, cfg)
    # Only the smoothed loss is differentiated (`_lean_loss_sums_bwd`); the NLL and the
    # token count are metrics.
    return smoothed, jax.lax.stop_gradient(nll), jax.lax.stop_gradient(tokens)

  @jax.checkpoint
  def one(y_c, t_c):
    return loss_sums(cpu_kernels.tied_logits_f32(y_c[None], embedding, cfg), t_c[None],
                     cfg.label_smoothing)

  def body(carry, xs):
    return tuple(a + b for a, b in zip(carry, one(*xs))), None

  zero = jnp.float32(0)
  sums, _ = jax.lax.scan(body, (zero, zero, zero), (y, t))
  return sums


def chunk_layout(tokens: int, chunk: int) -> tuple[int, int]:
  """(chunks, tokens per chunk) for `tokens` in chunks of at most `chunk` (>= 1): the fewest
  chunks, of equal size, a multiple of 8 where that stays within `chunk`."""
  n = -(-tokens // chunk)
  size = -(-tokens // n)
  rounded = -(-size // 8) * 8
  return n, rounded if rounded <= chunk else size


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _lean_loss_sums(y: jax.Array, embedding: jax.Array, targets: jax.Array, cfg: ModelConfig
                    ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(smoothed loss, NLL, tokens) summed over chunks y [n, c, d], targets [n, c]: without a
  gradient (evaluation), one logits product per chunk and nothing else."""
  def body(carry, xs):
    y_c, t_c = xs
    logits = cpu_kernels.tied_logits_f32(y_c[None], embedding, cfg)[0]
    sums = loss_sums(logits, t_c, cfg.label_smoothing)
    return tuple(a + b for a, b in zip(carry, sums)), None

  zero = jnp.float32(0)
  sums, _ = jax.lax.scan(body, (zero, zero, zero), (y, targets))
  return sums


def _lean_loss_sums_fwd(y, embedding, targets, cfg):
  """The sums, and the smoothed loss's gradients with respect to y and the embedding, from
  each chunk's softmax - q (section 5.4's smoothed target q) in the same pass: three
  vocabulary-sized products per chunk in all (logits, and the two gradients)."""
  vocab = embedding.shape[0]
  confidence, low = _smoothed_target(cfg.label_smoothing, vocab)
  dt = cpu_kernels.compute_dtype(cfg)
  e = embedding.astype(dt)

  def body(carry, xs):
    sums, d_embedding = carry
    y_c, t_c = xs
    logits = cpu_kernels.tied_logits_f32(y_c[None], embedding, cfg)[0]
    # One log-normaliser for both the sums and the softmax (no second max and sum of exps).
    (smoothed, target_logp), (_, lse, _) = _token_losses_fwd(logits, t_c, cfg.label_smoothing)
    chunk_sums = _summed(smoothed, target_logp, t_c, cfg.label_smoothing, vocab)
    weight = (t_c != PAD_ID).astype(jnp.float32)[:, None]
    grad = (_softmax_minus_target(logits, lse, t_c, confidence, low) * weight).astype(dt)
    d_y = jnp.einsum("cv,vd->cd", grad, e, preferred_element_type=jnp.float32)
    d_embedding = d_embedding + jnp.einsum("cv,cd->vd", grad, y_c.astype(dt),
                                           preferred_element_type=jnp.float32)
    return (tuple(a + b for a, b in zip(sums, chunk_sums)), d_embedding), d_y

  zero = jnp.float32(0)
  init = ((zero, zero, zero), jnp.zeros(embedding.shape, jnp.float32))
  (sums, d_embedding), d_y = jax.lax.scan(body, init, (y, targets))
  dtypes = (jnp.zeros((), y.dtype), jnp.zeros((), embedding.dtype))  # of the gradients
  return sums, (d_y, d_embedding, dtypes)


def _lean_loss_sums_bwd(cfg, residuals, cotangents):
  del cfg
  d_y, d_embedding, (y_like, e_like) = residuals
  g = cotangents[0]  # the smoothed loss's; `chunked_loss_sums` stops the others' gradients
  return (g * d_y).astype(y_like.dtype), (g * d_embedding).astype(e_like.dtype), None


_lean_loss_sums.defvjp(_lean_loss_sums_fwd, _lean_loss_sums_bwd)


def model_loss_sums(transformer: model.Transformer, params: Any, inputs: jax.Array,
                    targets: jax.Array, cfg: ExperimentConfig, train: bool = False,
                    rngs: dict[str, jax.Array] | None = None
                    ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """`loss_sums` of the model on a batch, with the output layer whole or in chunks
  (`train.loss_chunk_tokens`, resolved per backend)."""
  chunk = backend.loss_chunk_tokens(cfg.train.loss_chunk_tokens)
  if not chunk:
    logits = transformer.apply({"params": params}, inputs, targets, train=train, rngs=rngs)
    with jax.named_scope(model.OUTPUT_SCOPE):  # for step profiles (tools/step_profile.py)
      return loss_sums(logits, targets, cfg.model.label_smoothing)
  features = transformer.apply({"params": params}, inputs, targets, train=train, rngs=rngs,
                               method=model.Transformer.features)
  with jax.named_scope(model.OUTPUT_SCOPE):
    return chunked_loss_sums(features, params["embed"]["embedding"], targets, cfg.model,
                             chunk, lean=cfg.train.lean_loss)


def _smoothed_target(label_smoothing: float, vocab: int) -> tuple[float, float]:
  """(probability of the true token, of each other token) in the smoothed target q."""
  return 1.0 - label_smoothing, label_smoothing / (vocab - 1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _token_losses(logits: jax.Array, targets: jax.Array, label_smoothing: float
                  ) -> tuple[jax.Array, jax.Array]:
  """Per token: (smoothed cross-entropy, log p(target)) from float32 logits [..., V].

  A custom gradient because the output layer is over a third of a small model's
  step and autodiff of log_softmax makes several passes over [tokens, V]; the
  gradient of the smoothed loss is just softmax - q (q the smoothed target), one
  fused pass. Forward keeps only the log-normaliser, not log-probabilities.
  """
  return _token_losses_fwd(logits, targets, label_smoothing)[0]


def _token_losses_fwd(logits, targets, label_smoothing):
  vocab = logits.shape[-1]
  confidence, low = _smoothed_target(label_smoothing, vocab)
  top = jnp.max(logits, axis=-1)
  lse = top + jnp.log(jnp.sum(jnp.exp(logits - top[..., None]), axis=-1))
  # One-hot form: faster than a gather on XLA:CPU.
  target_logp = jnp.sum(jax.nn.one_hot(targets, vocab, dtype=logits.dtype) * logits,
                        axis=-1) - lse
  sum_logp = jnp.sum(logits, axis=-1) - vocab * lse
  smoothed = -(confidence - low) * target_logp - low * sum_logp
  return (smoothed, target_logp), (logits, lse, targets)


def _softmax_minus_target(logits: jax.Array, lse: jax.Array, targets: jax.Array,
                          confidence: float, low: float) -> jax.Array:
  """p - q [..., V]: the softmax of float32 `logits` (log-normaliser `lse`) less the smoothed
  target q = (confidence - low) one_hot + low (it sums to 1), the smoothed loss's gradient
  with respect to the logits (section 5.4)."""
  probs = jnp.exp(logits - lse[..., None])
  one_hot = jax.nn.one_hot(targets, logits.shape[-1], dtype=logits.dtype)
  return probs - (confidence - low) * one_hot - low


def _token_losses_bwd(label_smoothing, residuals, cotangents):
  logits, lse, targets = residuals
  g_smoothed, g_target = (c[..., None] for c in cotangents)
  confidence, low = _smoothed_target(label_smoothing, logits.shape[-1])
  p_minus_q = _softmax_minus_target(logits, lse, targets, confidence, low)
  # d log p(target) = one_hot - p = (1 - confidence + low) one_hot - low - (p - q).
  one_hot = jax.nn.one_hot(targets, logits.shape[-1], dtype=logits.dtype)
  d_target = (1.0 - confidence + low) * one_hot - low - p_minus_q
  return g_smoothed * p_minus_q + g_target * d_target, None


_token_losses.defvjp(_token_losses_fwd, _token_losses_bwd)
