"""Decoding benchmark: cached vs uncached beam search on random weights (`bench --what=decode`).

Outputs are forced to a fixed length (input + max_extra_length) by making the
random model prefer one ordinary token, so cached and uncached searches do
exactly the same number of steps and the ratio measures the cache alone.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from t2t_jax import decode, model, parallel
from t2t_jax.config import ModelConfig
from t2t_jax.special_tokens import EOS_ID


def _never_ending(params: Any, cfg: ModelConfig) -> Any:
  """Random weights whose last decoder layer always points at token 5 (no early EOS)."""
  last = f"decoder_{cfg.num_layers - 1}"
  ln = {"scale": jnp.zeros_like(params[last]["ln_ffn"]["scale"]),
        "bias": 10.0 * params["embed"]["embedding"][5]}
  return {**params, last: {**params[last], "ln_ffn": ln}}


def run(cfg: ModelConfig, num_devices: int, batch_per_device: int = 4, src_len: int = 10,
        out_len: int = 50, beam_size: int = 4, repeats: int = 3, cached: bool = True
        ) -> dict[str, Any]:
  """Sentences/s and target tokens/s of beam search, median of `repeats` after compiling."""
  cfg = dataclasses.replace(cfg, dropout=0.0)
  devices = jax.local_devices()[:num_devices]
  params = _never_ending(model.init_params(cfg, jax.random.PRNGKey(0)), cfg)
  params = parallel.replicate(params, num_devices)
  rng = np.random.default_rng(0)
  src = rng.integers(4, cfg.vocab_size, size=(num_devices, batch_per_device, src_len + 1))
  src[..., -1] = EOS_ID
  search = jax.pmap(functools.partial(
      decode.beam_search, cfg=cfg, beam_size=beam_size, alpha=0.6,
      max_extra_length=out_len - src_len, cached=cached), axis_name=parallel.AXIS,
      devices=devices)
  src = src.astype(np.int32)
  start = time.perf_counter()
  seqs, _ = search(params, src)
  jax.block_until_ready(seqs)
  compile_s = time.perf_counter() - start
  lengths = [len(decode.strip(s)) for s in np.asarray(seqs)[:, :, 0].reshape(-1, seqs.shape[-1])]
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(search(params, src))
    times.append(time.perf_counter() - start)
  t = statistics.median(times)
  sentences = num_devices * batch_per_device
  return {"what": "decode", "devices": num_devices, "cached": cached, "beam_size": beam_size,
          "sentences": sentences, "output_tokens": int(np.mean(lengths)),
          "sentences_per_sec": round(sentences / t, 3),
          "target_tokens_per_sec": round(sum(lengths) / t, 1),
          "seconds": round(t, 3), "compile_seconds": round(compile_s, 2)}
