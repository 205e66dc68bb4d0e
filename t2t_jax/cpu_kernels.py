"""The products the model is made of (dense layers, attention einsums, the tied output
projection) in the compute dtype, with XLA:CPU's own paths behind the backend seam.

`model.implementation=auto` (t2t_jax/backend.py) runs the plain Flax code on GPU and TPU.
On CPU it takes the `cpu_tuned` path: bf16 matmul inputs with float32 outputs, which XLA:CPU
runs faster, and two hand-written gradients where XLA:CPU's autodiff is slow or unsupported.
Both paths compute the same function (tests/test_model.py checks them against each other).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import flax.linen as nn
import jax
import jax.numpy as jnp

from t2t_jax import backend
from t2t_jax.config import ModelConfig

Array = jax.Array


def bf16(cfg: ModelConfig) -> bool:
  """Whether the model computes in bfloat16 (`model.dtype`, "auto" resolved by backend)."""
  return backend.compute_dtype(cfg.dtype) == "bfloat16"


def compute_dtype(cfg: ModelConfig):
  """The dtype of matmul inputs (and, on the plain path, of sub-layer activations)."""
  return jnp.bfloat16 if bf16(cfg) else jnp.float32


def residual_dtype(cfg: ModelConfig):
  """The residual stream's dtype: bf16 only with model.dtype=bfloat16 and
  model.residual_dtype=bfloat16; float32 otherwise (the paper-faithful mixed precision)."""
  both = bf16(cfg) and cfg.residual_dtype == "bfloat16"
  return jnp.bfloat16 if both else jnp.float32


def dense_reads_bf16_as_is(cfg: ModelConfig) -> bool:
  """Whether a bf16 `dense` layer multiplies by a bf16 matrix as it is (the plain path);
  cpu_tuned's layers promote it to float32 and round it back."""
  return bf16(cfg) and not _cpu_tuned(cfg)


def _cpu_tuned(cfg: ModelConfig) -> bool:
  return backend.model_path(cfg.implementation) == "cpu_tuned"


def _bf16_dot_general_f32_out(lhs, rhs, dimension_numbers, precision=None,
                              preferred_element_type=None, **kwargs):
  """nn.Dense's dot on the cpu_tuned path: bf16 inputs, float32 accumulation and output."""
  del preferred_element_type
  return jax.lax.dot_general(lhs.astype(jnp.bfloat16), rhs.astype(jnp.bfloat16),
                             dimension_numbers, precision=precision,
                             preferred_element_type=jnp.float32, **kwargs)


def einsum(cfg: ModelConfig, spec: str, a: Array, b: Array) -> Array:
  """An einsum in the compute dtype (bf16 output on the plain path, float32 on cpu_tuned)."""
  dt = compute_dtype(cfg)
  if not _cpu_tuned(cfg):
    return jnp.einsum(spec, a.astype(dt), b.astype(dt))
  if dt == jnp.bfloat16:
    return _bf16_einsum_f32_grad(spec, a, b)
  return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _bf16_einsum_f32_grad(spec: str, a: Array, b: Array) -> Array:
  """A bf16 x bf16 -> f32 einsum whose gradient dots run in float32.

  XLA:CPU (jax 0.10) fails at run time on some of the bf16 x bf16 -> f32 dots that autodiff
  makes of the batched attention and logits einsums ("UNIMPLEMENTED: Unsupported element type
  for DotThunk::Execute: BF16 x BF16 = F32"); the forward dots, where bf16 pays, work.
  """
  return jnp.einsum(spec, a.astype(jnp.bfloat16), b.astype(jnp.bfloat16),
                    preferred_element_type=jnp.float32)


def _bf16_einsum_fwd(spec, a, b):
  return _bf16_einsum_f32_grad(spec, a, b), (a, b)


def _bf16_einsum_bwd(spec, residuals, g):
  a, b = residuals
  inputs, out = spec.split("->")
  sa, sb = inputs.split(",")
  # Each operand's gradient is the einsum of the output's cotangent with the other operand;
  # this needs every operand index in the output or the other operand (true of our specs).
  assert set(sa) <= set(out) | set(sb) and set(sb) <= set(out) | set(sa), spec
  da = jnp.einsum(f"{out},{sb}->{sa}", g, b.astype(jnp.float32))
  db = jnp.einsum(f"{sa},{out}->{sb}", a.astype(jnp.float32), g)
  return da.astype(a.dtype), db.astype(b.dtype)


_bf16_einsum_f32_grad.defvjp(_bf16_einsum_fwd, _bf16_einsum_bwd)


def tied_logits(y: Array, embedding: Array, cfg: ModelConfig) -> Array:
  """y [b, l, d] @ embedding[v, d]^T -> float32 logits [b, l, v]: the pre-softmax
  projection with the shared embedding matrix (section 3.4)."""
  if _cpu_tuned(cfg):
    return _tied_logits_cpu(y, embedding, cfg)
  return einsum(cfg, "bld,vd->blv", y, embedding).astype(jnp.float32)


def tied_logits_f32(y: Array, embedding: Array, cfg: ModelConfig) -> Array:
  """`tied_logits` whose product always returns float32 (bf16 inputs in bf16 mode): for the
  chunked loss, whose log-sum-exp must see float32 logits on every path."""
  if _cpu_tuned(cfg):
    return _tied_logits_cpu(y, embedding, cfg)
  dt = compute_dtype(cfg)
  return jnp.einsum("bld,vd->blv", y.astype(dt), embedding.astype(dt),
                    preferred_element_type=jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _tied_logits_cpu(y: Array, embedding: Array, cfg: ModelConfig) -> Array:
  """`tied_logits` with its gradient written by hand, only for its layout: autodiff asks
  XLA:CPU for d(embedding) as dlogits^T @ y, which it computes by first copying the
  [tokens, vocab] gradient into transposed order, and with the softmax backward that made
  this layer ~40% of a training step at vocab 8k. (y^T @ dlogits)^T is the same product
  with only the small [d, v] result transposed.
  """
  return einsum(cfg, "bld,vd->blv", y, embedding)


def _tied_logits_fwd(y, embedding, cfg):
  return _tied_logits_cpu(y, embedding, cfg), (y, embedding)


def _tied_logits_bwd(cfg, residuals, g):
  y, embedding = residuals
  cfg = dataclasses.replace(cfg, dtype="float32")  # see _bf16_einsum_f32_grad
  dy = einsum(cfg, "blv,vd->bld", g, embedding)
  d_embedding = einsum(cfg, "bld,blv->dv", y, g).T
  return dy.astype(y.dtype), d_embedding.astype(embedding.dtype)


_tied_logits_cpu.defvjp(_tied_logits_fwd, _tied_logits_bwd)


class Kernel(nn.Module):
  """A bias-free `dense` layer's parameter matrix alone (the same name, shape and initial
  values), for `project`, which multiplies by several such matrices side by side."""
  features: int

  @nn.compact
  def __call__(self, in_features: int) -> Array:
    return self.param("kernel", DENSE_INIT, (in_features, self.features))


def project(cfg: ModelConfig, x: Array, kernels: list[Array]) -> list[Array]:
  """x @ [W_1 | W_2 | ...] as one product, split into x @ W_i: what `dense` layers without
  bias compute one by one, in the same dtypes. One larger product fills a GPU better than
  several narrow ones (their weight gradients are [d, d] outputs with K = all the tokens)."""
  w = jnp.concatenate(kernels, axis=1) if len(kernels) > 1 else kernels[0]
  dims = (((x.ndim - 1,), (0,)), ((), ()))
  if not _cpu_tuned(cfg):
    dt = compute_dtype(cfg)
    y = jax.lax.dot_general(x.astype(dt), w.astype(dt), dims)
  elif bf16(cfg):
    y = _bf16_dot_general_f32_out(x, w, dims)
  else:
    y = jax.lax.dot_general(x.astype(jnp.float32), w, dims)
  splits = list(itertools.accumulate(k.shape[1] for k in kernels))[:-1]
  return jnp.split(y, splits, axis=-1)


DENSE_INIT = nn.initializers.xavier_uniform()


def dense(cfg: ModelConfig, features: int, use_bias: bool, name: str | None = None) -> nn.Dense:
  """A float32 parameter matrix whose product runs in the compute dtype (`einsum`)."""
  init = DENSE_INIT
  if not _cpu_tuned(cfg):
    return nn.Dense(features, use_bias=use_bias, name=name, dtype=compute_dtype(cfg),
                    kernel_init=init)
  if bf16(cfg):
    return nn.Dense(features, use_bias=use_bias, name=name, dtype=jnp.float32,
                    kernel_init=init, dot_general=_bf16_dot_general_f32_out)
  return nn.Dense(features, use_bias=use_bias, name=name, dtype=jnp.float32, kernel_init=init)
