"""Training-step measurements shared by `t2t_jax.tools.bench` and the device check: the matmul
peak, the analytic FLOPs of a step, and the trainer's own step timed on random tokens."""

from __future__ import annotations

import dataclasses
import resource
import statistics
import time
from typing import Any

from t2t_jax.config import ModelConfig
from t2t_jax.errors import UserError


def median_time(fn, repeats: int) -> float:
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def matmul_peak(dtype: str, n: int = 2048, repeats: int = 5, calls: int = 1,
                warmup_sec: float = 0.0, out_dtype: str = "float32") -> float:
  """FLOP/s of a jitted n x n dot on one device (bf16 inputs accumulate in float32), on
  random data (a GPU runs zeros faster: less switching power). Its result is float32, or
  `out_dtype` (bf16 results are what the plain path's bf16 layers ask for).

  `calls` dots are queued back to back per timing, so that the wait for the result is paid
  once and not per dot (at 8192^3 one dot is ~1.4 ms on an H100: a per-call round trip of
  0.1-0.3 ms reads as a 10-20% lower peak); `warmup_sec` of dots first lets the GPU's clocks
  rise. The median of `repeats` timings.
  """
  import jax
  import jax.numpy as jnp
  in_dtype = jnp.bfloat16 if dtype == "bfloat16" else jnp.float32
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32).astype(in_dtype)
  b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32).astype(in_dtype)
  out = jnp.bfloat16 if out_dtype == "bfloat16" else jnp.float32
  dot = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=out))
  jax.block_until_ready(dot(a, b))
  end = time.perf_counter() + warmup_sec
  while time.perf_counter() < end:
    jax.block_until_ready([dot(a, b) for _ in range(calls)])

  def timed():
    jax.block_until_ready([dot(a, b) for _ in range(calls)])
  return 2 * n ** 3 * calls / median_time(timed, repeats)


def train_flops(m: ModelConfig, batch: int, src_len: Any, tgt_len: Any,
                src_keys: Any = None, tgt_keys: Any = None) -> Any:
  """Analytic FLOPs of one training step of model config `m`: matmuls only, training = 3 x
  forward. Each query meets `src_keys` / `tgt_keys` keys (default: the row's length, as in
  a step); numpy arrays give the FLOPs of each element."""
  src_keys = src_len if src_keys is None else src_keys
  tgt_keys = tgt_len if tgt_keys is None else tgt_keys
  d, d_ff, L = m.d_model, m.d_ff, m.num_layers
  enc = src_len * m.num_encoder_layers * (4 * d * d + 2 * d * d_ff + 2 * src_keys * d)
  dec = tgt_len * L * (6 * d * d + 2 * d * d_ff + 2 * tgt_keys * d + 2 * src_keys * d)
  cross_kv = src_len * L * 2 * d * d
  out = tgt_len * d * m.vocab_size
  return 3 * 2 * batch * (enc + dec + cross_kv + out)


def workload_config(sets: dict[str, Any], dtype: str):
  """base_ende's config with `sets`, in `dtype`, training with dropout and label smoothing 0.1."""
  from t2t_jax.registry import get
  from t2t_jax.config import override
  return override(get("base_ende"), {"model.dtype": dtype, "model.dropout": 0.1,
                                     "model.label_smoothing": 0.1, **sets})


# Spread of the sentence lengths in `packed_rows`: a log-normal of this sigma puts WMT-shaped
# targets' 10th-90th percentiles near 0.45x-1.9x their mean.
PACKED_LENGTH_SIGMA = 0.6


def packed_rows(rng: Any, rows: int, length: int, mean: float, vocab_size: int
                ) -> tuple[Any, Any]:
  """Source and target rows of EOS-terminated random sentences packed one after another,
  the same lengths on both sides: log-normal lengths of mean `mean` (EOS included, at least
  2); a row's last sentence takes the rest of the row, so rows have no padding."""
  import numpy as np
  from t2t_jax.special_tokens import EOS_ID
  mu = np.log(mean) - PACKED_LENGTH_SIGMA ** 2 / 2
  out = [rng.integers(4, vocab_size, size=(rows, length)).astype(np.int32) for _ in range(2)]
  for r in range(rows):
    at = 0
    while at < length:
      n = int(np.clip(round(rng.lognormal(mu, PACKED_LENGTH_SIGMA)), 2, length))
      n = length - at if length - at - n < 2 else n
      at += n
      for side in out:
        side[r, at - 1] = EOS_ID
  return out[0], out[1]


@dataclasses.dataclass
class TrainBench:
  """One train-step measurement made ready: the trainer's pmapped step and a batch on the
  devices. `compile()` builds its program ahead from the state's shapes alone, so that several
  cases can be compiled at once (as the trainer does before its first step) and then timed
  one at a time, each holding device memory only while it is timed. `p_train` dispatches
  to that program once it is compiled (`parallel.ShapeDispatch`, as the trainer's steps)."""
  cfg: Any
  workload: str
  num_devices: int
  batch: int
  length: int
  accum: int
  p_train: Any
  optimizer: Any
  arrays: Any
  rngs: Any
  sentences: int
  most_in_a_row: int

  def new_state(self) -> Any:
    from t2t_jax import parallel, train
    return parallel.replicate(train.init_state(self.cfg, self.optimizer), self.num_devices)

  def compile(self) -> int:
    """Compiles the step for the bench's batch from the state's shapes; how many programs."""
    import jax
    from t2t_jax import parallel, train
    shapes = jax.eval_shape(lambda: train.init_state(self.cfg, self.optimizer))
    state = parallel.replicated_shapes(shapes, self.num_devices)  # as `new_state` places it
    return parallel.compile_ahead([(self.p_train, (state, self.arrays, self.rngs))], 1)


def prepare_train(cfg, workload: str, num_devices: int, batch: int, length: int,
                  accum: int = 1, segment_mean: float | None = None) -> TrainBench:
  """The trainer's own train step on random, unpadded tokens: each row one sentence, or with
  `segment_mean` sentences of about that many tokens packed in each row (packed models only:
  `data.packing`)."""
  import jax
  import numpy as np
  from t2t_jax import optim, parallel, train
  from t2t_jax.config import override
  if batch % num_devices:
    raise UserError(f"batch {batch} is not divisible by {num_devices} devices")
  cfg = override(cfg, {"train.tokens_per_step": batch * length * accum,
                       "train.max_tokens_per_batch": batch * length // num_devices})
  optimizer = optim.make_optimizer(cfg)
  devices = jax.local_devices()[:num_devices]
  p_train = parallel.ShapeDispatch(train.make_steps(cfg, optimizer, devices=devices)[0],
                                   keyed=(1,))
  rng = np.random.default_rng(0)
  shape = (num_devices, accum, batch // num_devices, length)
  arrays = {k: rng.integers(4, cfg.model.vocab_size, size=shape).astype(np.int32)
            for k in ("inputs", "targets")}
  sentences, most_in_a_row = batch * accum, 1
  if segment_mean:
    from t2t_jax import backend
    from t2t_jax.special_tokens import EOS_ID
    if not backend.packing(cfg.data.packing):
      raise UserError("--segment_mean packs sentences in rows: it needs data.packing")
    src, tgt = packed_rows(rng, batch * accum, length, segment_mean, cfg.model.vocab_size)
    arrays = {"inputs": src.reshape(shape), "targets": tgt.reshape(shape)}
    per_row = (tgt == EOS_ID).sum(axis=1)
    # A batch with a row of more than model.max_segments sentences runs the bias layout
    # even where the packed layout is asked for: read this against that bound.
    sentences, most_in_a_row = int(per_row.sum()), int(per_row.max())
  return TrainBench(cfg, workload, num_devices, batch, length, accum, p_train, optimizer,
                    parallel.shard(arrays, num_devices),
                    parallel.replicate(jax.random.PRNGKey(0), num_devices),
                    sentences, most_in_a_row)


def bench_train(cfg, workload: str, num_devices: int, batch: int, length: int,
                repeats: int, min_steps: int = 1, peak_n: int = 2048, accum: int = 1,
                segment_mean: float | None = None) -> dict[str, Any]:
  """Steps/s and tokens/s of the trainer's own train step (`prepare_train`), compiled by its
  first call."""
  return time_train(prepare_train(cfg, workload, num_devices, batch, length, accum,
                                  segment_mean), repeats, min_steps, peak_n)


def time_train(bench: TrainBench, repeats: int, min_steps: int = 1, peak_n: int = 2048,
               compile_seconds: float | None = None) -> dict[str, Any]:
  """Times `bench`'s step: its program compiled ahead (`bench.compile()`, in
  `compile_seconds`), else the pmapped step, whose first call compiles it."""
  import jax
  step = bench.p_train
  ahead = bool(step.programs)
  state, arrays, rngs = bench.new_state(), bench.arrays, bench.rngs
  start = time.perf_counter()
  state, metrics = step(state, arrays, rngs)
  jax.block_until_ready(metrics)
  first_call_s = time.perf_counter() - start
  # One untimed step: the second call sees the trainer's own output state (its
  # first input came from `replicate`) and may specialise once more.
  start = time.perf_counter()
  state, metrics = step(state, arrays, rngs)
  jax.block_until_ready(metrics)
  steps_per_rep = max(min_steps, min(3, int(10.0 / (time.perf_counter() - start))))
  times, peaks = [], []
  for _ in range(repeats):
    # The peak is re-measured beside every repetition: on a shared machine both
    # drift together, so their ratio (matmul_peak_fraction) is steadier than either.
    peaks.append(matmul_peak(bench.cfg.model.dtype, n=peak_n, repeats=3))
    start = time.perf_counter()
    for _ in range(steps_per_rep):
      state, metrics = step(state, arrays, rngs)
    jax.block_until_ready(metrics)
    times.append((time.perf_counter() - start) / steps_per_rep)
  t = statistics.median(times)
  # What dispatching costs the calling thread: steps queued back to back, then one wait. On an
  # accelerator a call should return long before its step ends; CPU time near the step time
  # means the dispatch spins while it waits for the previous step.
  calls = max(3, steps_per_rep)
  cpu0, wall0 = time.thread_time(), time.perf_counter()
  for _ in range(calls):
    state, metrics = step(state, arrays, rngs)
  cpu1, wall1 = time.thread_time(), time.perf_counter()
  jax.block_until_ready(metrics)
  cpu2, wall2 = time.thread_time(), time.perf_counter()
  dispatch = {"dispatch_cpu_ms_per_call": round(1e3 * (cpu1 - cpu0) / calls, 3),
              "dispatch_wall_ms_per_call": round(1e3 * (wall1 - wall0) / calls, 3),
              "final_wait_cpu_ms": round(1e3 * (cpu2 - cpu1), 3),
              "final_wait_wall_ms": round(1e3 * (wall2 - wall1), 3)}
  peak = statistics.median(peaks)
  m = bench.cfg.model
  batch, accum, length = bench.batch, bench.accum, bench.length
  tokens = batch * length * accum
  flops = train_flops(m, batch * accum, length, length)
  ahead = {"compiled_ahead": True, "first_call_seconds": round(first_call_s, 2)} if ahead else {}
  return {"what": "train", "workload": bench.workload, "devices": bench.num_devices,
          "dtype": m.dtype, "batch": batch, "accum": accum, "length": length,
          "sentences": bench.sentences, "most_sentences_in_a_row": bench.most_in_a_row,
          "steps_per_sec": round(1 / t, 4), "target_tokens_per_sec": round(tokens / t, 1),
          "compile_seconds": round(first_call_s if compile_seconds is None
                                   else compile_seconds, 2), **ahead,
          "flops_per_step": flops,
          "achieved_flops_per_sec": int(flops / t), "peak_flops_per_sec": int(peak),
          "matmul_peak_fraction": round(statistics.median(flops / ti / pi for ti, pi in zip(times, peaks)), 4),
          "loss": round(float(metrics["loss"][0]), 4),
          "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
          **dispatch}
