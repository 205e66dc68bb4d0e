"""What many tests share: the tiny model, fast data settings, the training command, and a
stand-in for cuDNN's packed-layout kernel on CPU."""

import functools
import os
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

from t2t_jax import registry
from t2t_jax.config import override

REPO = Path(__file__).resolve().parents[1]
# One layer of width 32 on the demo pair's data: each run takes seconds. Its search stops 8
# tokens past the input (the demo's 50 otherwise): an undertrained model writes to the limit,
# and the decoding of a run's final evaluation, eval and translate was most of a test's time.
TINY_MODEL = {"model.num_layers": 1, "model.d_model": 32, "model.d_ff": 64, "model.num_heads": 2,
              "model.d_k": 16, "model.d_v": 16, "model.vocab_size": 64,
              "decode.max_extra_length": 8}
# Three length buckets: few shapes to compile.
FAST_DATA = {"data.max_length": 32, "data.bucket_growth": 2.0}


def cpu_devices(n: int) -> str:
  """XLA_FLAGS for a command with `n` CPU devices, compiling as the test process does
  (conftest.FAST_COMPILE_ENV; the persistent compilation cache keys on the flags)."""
  return f"--xla_force_host_platform_device_count={n} {os.environ['T2T_JAX_TEST_XLA_FLAGS']}"


def tiny_cfg(**changes):
  """The demo experiment with the tiny model, no dropout unless `changes` set it."""
  return override(registry.get("demo"), {**TINY_MODEL, "model.dropout": 0.0, **changes})


def set_flags(sets: dict) -> list[str]:
  """{"train.steps": 10} -> ["--set", "train.steps=10"]."""
  return [arg for k, v in sets.items() for arg in ("--set", f"{k}={v}")]


def main_command(workdir, mode="train", experiment="demo", sets=None) -> list[str]:
  """`python -m t2t_jax.main` for `workdir` with `--set` flags."""
  return [sys.executable, "-m", "t2t_jax.main", f"--experiment={experiment}",
          f"--workdir={workdir}", f"--mode={mode}"] + set_flags(sets or {})


def packed_layout_reference(q, k, v, q_seqlen, kv_seqlen, q_offsets, kv_offsets, causal):
  """cuDNN's packed layout as `jax._src.cudnn.fused_attention_stablehlo.dot_product_attention`
  documents it, for CPU tests: segment i of row b is queries q_offsets[b, i] + [0,
  q_seqlen[b, i]) over keys kv_offsets[b, i] + [0, kv_seqlen[b, i]) (causal: a query's index
  in its segment bounds its keys'); -1 marks no segment. Positions in no segment come out
  NaN, in the output and, through q, in q's gradient: what the real kernel leaves there is
  undefined."""
  t, s = jnp.arange(q.shape[1]), jnp.arange(k.shape[1])
  used = q_seqlen >= 0                                                    # [b, m]
  in_q = used[..., None] & (t >= q_offsets[:, :-1, None]) & (t < (q_offsets + 1)[:, :-1, None]
                                                                 + q_seqlen[..., None] - 1)
  in_k = used[..., None] & (s >= kv_offsets[:, :-1, None]) & (s < kv_offsets[:, :-1, None]
                                                              + kv_seqlen[..., None])
  allowed = in_q[..., :, None] & in_k[..., None, :]                       # [b, m, t, s]
  if causal:
    allowed &= ((s[None, None, None, :] - kv_offsets[:, :-1, None, None])
                <= (t[None, None, :, None] - q_offsets[:, :-1, None, None]))
  allowed = jnp.any(allowed, axis=1)[:, None]                            # [b, 1, t, s]
  logits = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32)
  weights = jax.nn.softmax(jnp.where(allowed, logits, -1e30), axis=-1)
  weights = jnp.where(jnp.any(allowed, axis=-1, keepdims=True), weights, 0.0)
  out = jnp.einsum("bhqk,bkhd->bqhd", weights, v.astype(jnp.float32))
  covered = jnp.any(in_q, axis=1)[..., None, None]
  undefined = jnp.where(covered, 0.0, q[..., :v.shape[-1]]) * jnp.nan  # NaN there only
  return jnp.where(covered, out, undefined).astype(q.dtype)


def offsets_layout_on_cpu(monkeypatch, kernel=packed_layout_reference):
  """The packed-layout path (model.segment_attention=offsets) on this CPU: cuDNN's kernel
  replaced by `kernel`."""
  from t2t_jax import backend, model
  resolve = backend.segment_attention
  monkeypatch.setattr(backend, "segment_attention",
                      lambda setting, dtype: "offsets" if setting == "offsets"
                      else resolve(setting, dtype))
  monkeypatch.setattr(model, "cudnn_packed_attention", kernel)


# Keyword arguments of `Module.apply` that choose what is computed, not values to compute on.
_STATIC_APPLY_ARGS = ("method", "train", "deterministic", "mutable", "decode")


@functools.lru_cache(maxsize=None)
def _compiled_apply(module, static: tuple):
  kwargs = dict(static)  # lists already made tuples by `apply`, to be hashable here
  return jax.jit(lambda variables, args, dynamic: module.apply(variables, *args, **dynamic,
                                                                 **kwargs))


def apply(module, variables, *args, **kwargs):
  """`module.apply(variables, *args, **kwargs)` compiled whole: outside jit, Flax runs a
  model op by op and XLA compiles every op for every shape on its own (a tiny Transformer's
  forward pass is hundreds of compilations, most of a model test's time). Computes the same
  function; `rngs` and arrays are traced, the choices in `_STATIC_APPLY_ARGS` are not."""
  static = tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                        for k, v in kwargs.items() if k in _STATIC_APPLY_ARGS))
  dynamic = {k: v for k, v in kwargs.items() if k not in _STATIC_APPLY_ARGS}
  return _compiled_apply(module, static)(variables, args, dynamic)
