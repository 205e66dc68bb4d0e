r"""Benchmarks: `python -m t2t_jax.tools.bench --what=train|decode|input|profile|host|device_check`.

Every measurement is one JSON line on stdout (progress goes to stderr). Speeds
are medians of `--repeats` timed runs after compilation. Utilisation is
reported against the matmul peak *measured in the same process* (a jitted
2048x2048 `jnp.dot`; bf16 x bf16 -> float32 for the bf16 path), so the ratio
holds on a noisy shared machine.

The train benchmark runs the trainer's own pmapped `train.train_step`
(forward, backward, Adam, dropout 0.1, label smoothing 0.1) on random tokens
with no padding; there is no benchmark-only code path.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import time
from typing import Any

from absl import app, flags

from t2t_jax import backend, hostmem
from t2t_jax.tools.bench_step import bench_train, matmul_peak, median_time, train_flops

FLAGS = flags.FLAGS
flags.DEFINE_enum("what", "train", ["train", "decode", "input", "profile", "host",
                                    "device_check", "speed_check", "deploy"],
                  "What to measure (`profile`: where a train step's time goes; `host`: "
                  "what the training loop costs beyond its step; `device_check`: the whole "
                  "machine, into one JSON file, see t2t_jax/tools/device_check.py; `speed_check`: "
                  "training and decoding speed beside the PyTorch peers, see "
                  "t2t_jax/tools/speed_check.py; `deploy`: a trained run translating on CPU beside "
                  "transformers and CTranslate2, see t2t_jax/tools/bench_deploy.py).")
flags.DEFINE_enum("workload", None, ["small", "base", "big"],
                  "A standard workload (fixed shapes, random tokens). Default: small for "
                  "train, base for decode.")
flags.DEFINE_string("experiment", None, "Use this experiment's model instead of a workload.")
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Compute dtype of the dots.")
flags.DEFINE_string("devices", None, "Comma-separated device counts to run on (default: all "
                    "local devices; `--what=decode`: 1 and all).")
flags.DEFINE_string("lengths", None, "Train: comma-separated sequence lengths at a constant "
                    "token count per step (how cost grows with length).")
flags.DEFINE_integer("batch", None, "Train/decode: sentences per step (default: workload's).")
flags.DEFINE_integer("length", None, "Train: tokens per side per sentence (default: workload's).")
flags.DEFINE_float("segment_mean", None, "Train: pack sentences of about this many tokens "
                   "(EOS included) in every row, as packed training does, instead of one "
                   "sentence a row (e.g. 25: WMT-shaped targets).")
flags.DEFINE_integer("repeats", 3, "Timed repetitions (the median is reported).")
flags.DEFINE_string("dataset", None, "Input: the data source (default: the experiment's).")
flags.DEFINE_integer("input_steps", 500, "Input: batches to draw per repetition.")
flags.DEFINE_bool("parts", True, "Profile: also time each part of the step on its own (one "
                  "compilation each) after the traced step's breakdown.")
flags.DEFINE_multi_string("set", [], "Train/profile/decode/host/input, and the speed "
                          "check's --real_run training: override a config field of the "
                          "experiment or workload, KEY=VALUE (as in t2t_jax.main).")
flags.DEFINE_integer("host_steps", 400, "Host: training steps of the loop (the first "
                     "log window, 100 steps, is warm-up).")
flags.DEFINE_bool("quick", False, "Device check: tiny models and runs (minutes on a CPU).")
flags.DEFINE_string("out", "device_check.json", "Device check: the JSON file to write.")
flags.DEFINE_bool("levers", False, "Speed check: what each step lever is worth instead.")
flags.DEFINE_bool("packed_attention", False, "Speed check: the base step on packed rows of "
                  "128 tokens (~5 sentences each) on each attention path, against the "
                  "synthetic step, instead.")
flags.DEFINE_bool("xla_levers", False, "Speed check: what each candidate XLA GPU option "
                  "(speed_check.XLA_LEVERS) is worth instead.")
flags.DEFINE_bool("real_run", False, "Speed check: base_ende's training on WMT-shaped data, "
                  "packed, beside the synthetic base step, then bucketed when time allows "
                  "instead (at most 9 minutes on one GPU).")
flags.DEFINE_enum("real_run_batching", "both", ["both", "packed", "bucketed"], "Speed check "
                  "--real_run: which batchings to run (`both`: bucketed after packed when the "
                  "check's time allows; on a GPU it does not, so `bucketed` runs it alone).")
flags.DEFINE_string("real_run_data", None, "Speed check --real_run: the folder holding "
                    "tatoeba_ende/ and wmt_newstest_ende/ (default: ../shared/data).")
flags.DEFINE_float("budget_s", None, "Speed check: seconds the whole check may take; the parts "
                   "that would start after it are skipped and say so (default: 540 on a GPU, "
                   "900 with --quick).")
flags.DEFINE_string("peers", None, "Speed check: the peers' folder (default: .peers/ in the "
                    "repository, else ../shared/peers).")
flags.DEFINE_string("workdir", None, "Deploy: the trained run to export and compare.")
flags.DEFINE_integer("sentences", 500, "Deploy: sentences of the test split to translate.")
flags.DEFINE_integer("threads", 0, "Deploy: threads for each decoder (0: every core).")
flags.DEFINE_bool("uncached", True, "Decode: also time the search without the key/value cache.")

# The standard workloads of the performance issue: model overrides and batch shape.
_MODEL = {"num_layers", "d_model", "d_ff", "num_heads", "vocab_size"}
WORKLOADS: dict[str, dict[str, int]] = {
    "small": dict(num_layers=3, d_model=256, d_ff=1024, num_heads=4, vocab_size=8000,
                  batch=64, length=32),
    "base": dict(num_layers=6, d_model=512, d_ff=2048, num_heads=8, vocab_size=37000,
                 batch=64, length=64),
    "big": dict(num_layers=6, d_model=1024, d_ff=4096, num_heads=16, vocab_size=37000,
                batch=16, length=64),
}


def _log(msg: str) -> None:
  print(msg, file=sys.stderr, flush=True)


def _emit(record: dict[str, Any]) -> None:
  print(json.dumps(record), flush=True)


def _experiment(name: str | None, workload: str | None, dtype: str):
  from t2t_jax.registry import get
  from t2t_jax.config import override, parse_set_flags
  cfg = get(name or "base_ende")
  sets: dict[str, Any] = {"model.dtype": dtype}
  if not name:
    sets.update({f"model.{k}": v for k, v in WORKLOADS[workload].items() if k in _MODEL})
    sets.update({"model.dropout": 0.1, "model.label_smoothing": 0.1})
  sets.update(parse_set_flags(FLAGS.set))
  return override(cfg, sets)


def run_deploy() -> None:
  """A trained run translating on CPU beside transformers and CTranslate2 (bench_deploy)."""
  from t2t_jax import input_pipeline, registry
  from t2t_jax.tools import bench_deploy
  from t2t_jax.errors import UserError
  from t2t_jax.config import override, parse_set_flags
  if not FLAGS.workdir or not FLAGS.experiment:
    raise UserError("--what=deploy needs --experiment and --workdir of a trained run")
  cfg = override(registry.get(FLAGS.experiment), parse_set_flags(FLAGS.set))
  if FLAGS.dataset:
    cfg = override(cfg, {"data.dataset": FLAGS.dataset})
  cfg = input_pipeline.resolve_splits(cfg)
  threads = FLAGS.threads or len(os.sched_getaffinity(0))
  for record in bench_deploy.run(cfg, os.path.abspath(FLAGS.workdir), cfg.data.test_split,
                                 FLAGS.sentences, threads):
    _emit(record)


def _device_counts(default_both: bool) -> list[int]:
  import jax
  n = jax.local_device_count()
  if FLAGS.devices:
    counts = [int(x) for x in FLAGS.devices.split(",")]
    if max(counts) > n:
      raise app.UsageError(f"--devices={FLAGS.devices}: only {n} local devices (set "
                           f"XLA_FLAGS=--xla_force_host_platform_device_count=N)")
    return counts
  return sorted({1, n}) if default_both else [n]


def run_train(argv_workload: str | None) -> None:
  workload = argv_workload or ("small" if not FLAGS.experiment else FLAGS.experiment)
  cfg = _experiment(FLAGS.experiment, argv_workload or "small", FLAGS.dtype)
  shape = WORKLOADS.get(argv_workload or "small", WORKLOADS["small"])
  batch = FLAGS.batch or shape["batch"]
  length = FLAGS.length or shape["length"]
  lengths = [int(x) for x in FLAGS.lengths.split(",")] if FLAGS.lengths else [length]
  for n in _device_counts(default_both=False):
    for L in lengths:
      b = batch if len(lengths) == 1 else max(n, (batch * length // L) // n * n)
      _log(f"train: {workload} on {n} device(s), {b} x {L} tokens per side")
      _emit(bench_train(cfg, workload, n, b, L, FLAGS.repeats,
                        segment_mean=FLAGS.segment_mean))


def _dense_dots(m, src_tokens: int, tgt_tokens: int) -> list[tuple[str, int, int, int, int]]:
  """Every projection of one forward pass as (name, rows, contraction, columns, count)."""
  d, hk, hv, L = m.d_model, m.num_heads * m.d_k, m.num_heads * m.d_v, m.num_layers
  E = m.num_encoder_layers
  return [
      ("encoder q/k", src_tokens, d, hk, 2 * E), ("encoder v", src_tokens, d, hv, E),
      ("encoder attention out", src_tokens, hv, d, E),
      ("encoder ffn in", src_tokens, d, m.d_ff, E), ("encoder ffn out", src_tokens, m.d_ff, d, E),
      ("decoder self q/k + cross q", tgt_tokens, d, hk, 3 * L),
      ("decoder self v", tgt_tokens, d, hv, L),
      ("decoder cross k", src_tokens, d, hk, L), ("decoder cross v", src_tokens, d, hv, L),
      ("decoder attention outs", tgt_tokens, hv, d, 2 * L),
      ("decoder ffn in", tgt_tokens, d, m.d_ff, L), ("decoder ffn out", tgt_tokens, m.d_ff, d, L),
      ("output projection (shared embedding)", tgt_tokens, d, m.vocab_size, 1),
  ]


def run_profile(workload: str | None) -> None:
  """Where one train step's time goes.

  First the trainer's step (its pmapped step, one device, one micro-batch of the workload's
  shape) is traced with `jax.profiler` and its device time broken down by kind of kernel and
  by region of the model, with the device's busy time against the wall time and the
  costliest instructions (`tools/step_profile.py`; one JSON line, `"part": "trace"`), beside
  the matmul peak with float32 and with bf16 results. Then, unless `--noparts` (on a GPU each
  part is one more compilation), each part is timed on its own at the step's shapes: the
  step without dropout, forward only, forward + backward, the optimiser update, the loss,
  every projection matmul (forward, input gradient, weight gradient) and the attention cores,
  with its share of the full step.
  """
  import jax
  import jax.numpy as jnp
  import numpy as np
  from t2t_jax import loss as losses, model, optim, parallel, train
  from t2t_jax.config import override
  from t2t_jax.tools import step_profile
  workload = workload or "small"
  cfg = _experiment(FLAGS.experiment, workload, FLAGS.dtype)
  shape = WORKLOADS.get(workload, WORKLOADS["small"])
  batch, length = FLAGS.batch or shape["batch"], FLAGS.length or shape["length"]
  cfg = override(cfg, {"train.tokens_per_step": batch * length,
                       "train.max_tokens_per_batch": batch * length})
  m = cfg.model
  rng = np.random.default_rng(0)
  tokens = {k: jnp.asarray(rng.integers(4, m.vocab_size, size=(batch, length)), jnp.int32)
            for k in ("inputs", "targets")}
  optimizer = optim.make_optimizer(cfg)
  state = train.init_state(cfg, optimizer)
  key = jax.random.PRNGKey(1)
  traced = []  # (run one step, its optimised HLO on demand) of each full step timed

  def timed(fn, *args) -> float:
    jax.block_until_ready(fn(*args))
    return median_time(lambda: jax.block_until_ready(fn(*args)), FLAGS.repeats)

  def full_step(c) -> float:
    p_train, _ = train.make_steps(c, optimizer, devices=jax.local_devices()[:1])
    st = parallel.replicate(state, 1)
    b = parallel.shard({k: np.asarray(v)[None, None] for k, v in tokens.items()}, 1)
    r = parallel.replicate(jax.random.PRNGKey(0), 1)
    box = [st]

    def one():
      box[0], metrics = p_train(box[0], b, r)
      return metrics
    jax.block_until_ready(one())
    # Compiling the HLO text costs a second compilation: only the traced step's is asked for.
    traced.append((one, lambda: p_train.lower(box[0], b, r).compile().as_text()))
    return timed(one)

  def loss_fn(c):
    transformer = model.Transformer(c.model)

    def loss(params):
      logits = transformer.apply({"params": params}, tokens["inputs"], tokens["targets"],
                                 train=True, rngs={"dropout": key})
      return losses.loss_sums(logits, tokens["targets"], c.model.label_smoothing)[0]
    return loss

  _log(f"profile: {workload}, 1 device, {batch} x {length} tokens per side")
  on_cpu = jax.default_backend() == "cpu"
  peak_n, calls = (2048, 1) if on_cpu else (8192, 10)
  peak = matmul_peak(FLAGS.dtype, n=peak_n, calls=calls)
  step = full_step(cfg)
  run_step, hlo = traced[0]
  trace = step_profile.profile(run_step, hlo(), steps=max(3, FLAGS.repeats))
  peaks = {"matmul_peak_f32_out": peak}
  if FLAGS.dtype == "bfloat16":
    peaks["matmul_peak_bf16_out"] = matmul_peak(FLAGS.dtype, n=peak_n, calls=calls,
                                                out_dtype="bfloat16")
  _emit({"what": "profile", "workload": workload, "dtype": m.dtype, "part": "trace",
         "device": jax.devices()[0].device_kind, "jax": jax.__version__,
         "batch": batch, "length": length, "step_ms": round(step * 1e3, 3),
         **{k: int(v) for k, v in peaks.items()}, **trace})
  _log(step_profile.summary(trace))
  if not FLAGS.parts:
    return
  flops = train_flops(m, batch, length, length)
  parts: list[tuple[str, float]] = [("train step (trainer's pmapped step, 1 device)", step)]
  no_dropout = {"model.dropout": 0.0, "model.attention_dropout": 0.0, "model.relu_dropout": 0.0}
  parts.append(("train step without dropout", full_step(override(cfg, no_dropout))))
  loss = loss_fn(cfg)
  parts.append(("forward + loss", timed(jax.jit(loss), state.params)))
  parts.append(("forward + backward", timed(jax.jit(jax.grad(loss)), state.params)))
  grads = jax.tree_util.tree_map(jnp.ones_like, state.params)
  parts.append(("Adam update", timed(jax.jit(optimizer.update), grads, state.opt_state,
                                     state.params)))
  logits = jnp.zeros((batch, length, m.vocab_size), jnp.float32)
  smoothed = lambda lg: losses.loss_sums(lg, tokens["targets"], m.label_smoothing)[0]
  parts.append(("label-smoothed loss, forward + backward", timed(jax.jit(jax.grad(smoothed)),
                                                                 logits)))
  dt = jnp.bfloat16 if m.dtype == "bfloat16" else jnp.float32
  dot = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32))
  matmul_total = 0.0
  for name, rows, k, cols, count in _dense_dots(m, batch * length, batch * length):
    x, w, g = (jnp.ones(s, dt) for s in ((rows, k), (k, cols), (rows, cols)))
    # forward x.w, input gradient g.w^T, weight gradient x^T.g
    t = timed(dot, x, w) + timed(dot, g, w.T) + timed(dot, x.T, g)
    matmul_total += t * count
    parts.append((f"matmuls: {name} x{count}, fwd + 2 bwd", t * count))
  parts.append(("matmuls: all projections (sum of the rows above)", matmul_total))
  h, dk, dv = m.num_heads, m.d_k, m.d_v
  q = jnp.ones((batch, length, h, dk), jnp.float32)
  v = jnp.ones((batch, length, h, dv), jnp.float32)

  def core(q, k, v):
    w = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k), axis=-1)
    return jnp.sum(jnp.einsum("bhqk,bkhd->bqhd", w, v))
  cores = m.num_encoder_layers + 2 * m.num_layers  # encoder self; decoder self and cross
  attn = timed(jax.jit(jax.grad(core, argnums=(0, 1, 2))), q, q, v) * cores
  parts.append((f"attention cores (QK^T, softmax, AV) x{cores}, fwd + bwd", attn))
  parts.append(("analytic FLOPs at the measured matmul peak", flops / peak))
  for name, seconds in parts:
    _emit({"what": "profile", "workload": workload, "dtype": m.dtype, "part": name,
           "ms": round(seconds * 1e3, 1), "share_of_step": round(seconds / step, 3)})


# The micro model of `--what=host`: a step so cheap that the loop's own work shows, on the
# paper's 25,000 tokens per step.
HOST_MICRO = {"model.vocab_size": 256, "model.num_layers": 1, "model.d_model": 8,
              "model.d_ff": 8, "model.num_heads": 1, "model.d_k": 8, "model.d_v": 8,
              "model.max_len": 64, "train.tokens_per_step": 25000,
              "train.max_tokens_per_batch": 4096, "train.warmup_steps": 100,
              "train.log_every_steps": 100, "train.eval_every_steps": 100000,
              "train.checkpoint_every_steps": 100000, "train.checkpoint_every_minutes": 1000,
              "train.final_eval": False}


def run_host() -> None:
  """The trainer's own loop (`train.train_and_evaluate`, what `--mode=train` runs) on the
  micro model, then the bare jitted step of the same model on as many token slots.

  Reported from the loop's own metrics.jsonl, after the first log window (compilation):
  time per step, the host's CPU ms per step (loop thread + input thread), the fraction of
  wall time the loop waited for input, and compilations after warm-up. `loop_over_step`
  is the loop's time per step over the bare step's, both measured in this process.
  """
  import contextlib
  import tempfile
  import jax
  from t2t_jax import train
  from t2t_jax.config import override, parse_set_flags
  from t2t_jax.registry import get
  sets = {**HOST_MICRO, "train.steps": FLAGS.host_steps, **parse_set_flags(FLAGS.set)}
  cfg = override(get(FLAGS.experiment or "demo"), sets)
  n = jax.local_device_count()
  _log(f"host: the training loop on {n} device(s), {FLAGS.host_steps} steps of "
       f"{cfg.train.tokens_per_step:,d} tokens")
  with tempfile.TemporaryDirectory() as workdir:
    with contextlib.redirect_stdout(sys.stderr):  # the trainer's progress; stdout is JSON
      train.train_and_evaluate(cfg, workdir)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      rows = [json.loads(line) for line in f]
  if len(rows) < 2:
    raise app.UsageError("--host_steps: give at least two log windows (200 steps)")
  warm = rows[1:]
  steps = warm[-1]["step"] - rows[0]["step"]
  loop_ms = 1e3 * (warm[-1]["elapsed_sec"] - rows[0]["elapsed_sec"]) / steps
  # The bare step: 800 sentences of 32 tokens by default, about the loop's token slots per step.
  length = FLAGS.length or 32
  batch = FLAGS.batch or -(-cfg.train.tokens_per_step // length // n) * n
  if batch % n:
    raise app.UsageError(f"--batch={batch} is not divisible by {n} devices")
  # Timed over as many steps as the loop's window, so that both medians are as steady.
  bare = bench_train(cfg, "host", n, batch, length, max(FLAGS.repeats, 5), min_steps=50)
  bare_ms = 1e3 / bare["steps_per_sec"]
  _emit({"what": "host", "experiment": cfg.name, "devices": n, "steps_timed": steps,
         "tokens_per_step": cfg.train.tokens_per_step,
         "loop_ms_per_step": round(loop_ms, 2), "bare_step_ms": round(bare_ms, 2),
         "loop_over_step": round(loop_ms / bare_ms, 3),
         "host_ms_per_step": statistics.median(r["host_ms_per_step"] for r in warm),
         "host_input_ms_per_step": statistics.median(r["host_input_ms_per_step"] for r in warm),
         "input_wait_fraction": statistics.median(r["input_wait_fraction"] for r in warm),
         "compiles": rows[-1]["compiles"],
         "compiles_after_warmup": rows[-1]["compiles_after_warmup"]})


def run_decode(workload: str | None) -> None:
  from t2t_jax.tools import bench_decode
  name = workload or ("base" if not FLAGS.experiment else FLAGS.experiment)
  cfg = _experiment(FLAGS.experiment, workload or "base", FLAGS.dtype).model
  for n in _device_counts(default_both=True):
    for cached in ([True, False] if FLAGS.uncached else [True]):
      _log(f"decode: {name} on {n} device(s), beam 4, {'cached' if cached else 'uncached'}")
      record = bench_decode.run(cfg, n, batch_per_device=max(1, (FLAGS.batch or 4 * n) // n),
                                repeats=FLAGS.repeats, cached=cached)
      _emit({"workload": name, "dtype": FLAGS.dtype, **record})


def run_input() -> None:
  """The input pipeline's figures for the paper's bucketing and for packing, side by side
  on the same data: batches and target tokens per second, distinct step shapes per epoch,
  the padding of each side, and the attention work the masks throw away as a share of the
  step's FLOPs, predicted from the lengths before any batch is drawn and then measured on
  the drawn batches."""
  from t2t_jax.registry import get
  from t2t_jax import input_pipeline
  from t2t_jax.config import override, parse_set_flags
  import jax
  cfg = override(get(FLAGS.experiment or "base_ende"), parse_set_flags(FLAGS.set))
  if FLAGS.dataset:
    cfg = override(cfg, {"data.dataset": FLAGS.dataset})
  cfg = input_pipeline.resolve_splits(cfg)
  n = _device_counts(default_both=False)[0]
  built_now = input_pipeline.existing_cache(cfg) is None
  for packing in (False, True):
    c = override(cfg, {"data.packing": packing})
    start = time.time()
    ds = input_pipeline.load(c, num_devices=n, process_index=jax.process_index(),
                             process_count=jax.process_count())
    load_seconds = time.time() - start
    if built_now:  # the preparation's own figures, as one JSON line of their own
      built_now = False
      _emit({"what": "prepare", "dataset": cfg.data.dataset, "train_pairs": ds.meta["splits"][
          cfg.data.train_split], "vocab_sample_sentences": ds.meta["vocab_sample_sentences"],
          "prepare_seconds": round(load_seconds, 1),
          "peak_rss_mb": ds.meta["prepare_peak_rss_mb"]})
    steps = FLAGS.input_steps
    counted = {}

    def draw():
      it = ds.train_batches(0)
      real = slots = 0
      for _ in range(steps):
        b = next(it)
        real += int((b["targets"] != 0).sum())
        slots += b["targets"].size
      counted.update(real=real, slots=slots)

    epoch_start = time.time()
    ds.batch(0)  # the epoch's order (packed: its pairs dealt to the rows), and the page cache
    epoch_seconds = time.time() - epoch_start
    draw()
    t = median_time(draw, FLAGS.repeats)
    masked = step_flops = 0.0
    for step in range(min(steps, ds.steps_per_epoch)):
      m, f = masked_attention_flops(ds.batch(step), c.model)
      masked, step_flops = masked + m, step_flops + f
    info = ds.info()
    _emit({"what": "input", "batching": "packed" if packing else "bucketed",
           "dataset": cfg.data.dataset, "experiment": FLAGS.experiment or "base_ende",
           "devices": n, "steps": steps, "batches_per_sec": round(steps / t, 1),
           "target_tokens_per_sec": round(counted["real"] / t, 1),
           "target_slots_per_sec": round(counted["slots"] / t, 1),
           "tokens_per_step": cfg.train.tokens_per_step, "accum_steps": info["accum_steps"],
           "num_shapes": info["num_shapes"], "shapes": [list(map(list, s)) for s in
                                                        ds.train_shapes()],
           "padding_fraction": info["padding_fraction"],
           "target_padding_fraction": info["target_padding_fraction"],
           "source_padding_fraction": info["source_padding_fraction"],
           "masked_attention_share_predicted": round(predicted_masked_attention_share(ds), 4),
           "masked_attention_share_measured": round(masked / step_flops, 4),
           "steps_per_epoch": info["steps_per_epoch"], "load_seconds": round(load_seconds, 1),
           "epoch_order_seconds": round(epoch_seconds, 2),
           "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
           **_rss_parts()})


def _sentence_lengths(rows: Any) -> Any:
  """[rows, length] token ids -> [rows, length + 1]: the length of each row's k-th
  EOS-terminated sentence at column k (column 0: the padding)."""
  import numpy as np
  from t2t_jax import model
  r, length = rows.shape
  ids = np.asarray(model.segments(rows).ids)  # the sentences as the model finds them
  flat = (np.arange(r)[:, None] * (length + 1) + ids).reshape(-1)
  counts = np.bincount(flat, minlength=r * (length + 1)).reshape(r, length + 1)
  counts[:, 0] = 0
  return counts


def masked_attention_flops(batch: dict[str, Any], m: Any) -> tuple[float, float]:
  """(FLOPs of attention scores and weighted values the masks throw away, all FLOPs of the
  step per `train_flops`) for one global training batch: every (query, key) product is
  computed, and only those within a sentence (and, decoding, not after the query) count.
  Training is 3 x forward; a (query, key) pair costs 2 d multiply-adds (QK and AV)."""
  import numpy as np
  src, tgt = (batch[k].reshape(-1, batch[k].shape[-1]) for k in ("inputs", "targets"))
  rows, ls, lt = src.shape[0], src.shape[1], tgt.shape[1]
  s, t = _sentence_lengths(src).astype(np.float64), _sentence_lengths(tgt).astype(np.float64)
  k = min(s.shape[1], t.shape[1])
  useful_enc = (s ** 2).sum()
  useful_dec = (t * (t + 1) / 2).sum() + (s[:, :k] * t[:, :k]).sum()
  masked = (m.num_encoder_layers * (rows * ls * ls - useful_enc)
            + m.num_layers * (rows * lt * lt + rows * lt * ls - useful_dec))
  return 3 * 2 * 2 * m.d_model * masked, train_flops(m, rows, ls, lt)


def predicted_masked_attention_share(ds: Any) -> float:
  """The masked share predicted from the corpus's lengths alone: every pair in a full row of
  the length it is bucketed or packed to (padding left out), every query against the
  row's keys."""
  m = ds.cfg.model
  s, t, ls, lt = (x.astype(float) for x in ds.pair_lengths())
  masked = (m.num_encoder_layers * (s * (ls - s)).sum()
            + m.num_layers * ((t * lt - t * (t + 1) / 2).sum() + (t * (ls - s)).sum()))
  total = train_flops(m, 1, s, t, src_keys=ls, tgt_keys=lt).sum()
  return float(3 * 2 * 2 * m.d_model * masked / total)


def _rss_parts() -> dict[str, int]:
  """Resident memory now, split into anonymous (this process's own arrays) and file-backed
  (pages of the memory-mapped token ids it read: page cache the kernel can drop)."""
  parts = {}
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith(("RssAnon:", "RssFile:")):
          key = "rss_anon_mb" if line.startswith("RssAnon") else "rss_file_mb"
          parts[key] = round(int(line.split()[1]) / 1024)
  except OSError:  # not Linux
    pass
  return parts


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if FLAGS.workload and FLAGS.experiment:
    raise app.UsageError("give --workload or --experiment, not both")
  if FLAGS.what == "device_check":  # before this process starts JAX: see device_check.py
    from t2t_jax.tools import device_check
    sys.exit(device_check.run(FLAGS.quick, FLAGS.out))
  if FLAGS.what == "speed_check":  # this process never starts JAX: see speed_check.py
    from t2t_jax.tools import speed_check
    out = FLAGS.out if FLAGS["out"].present else "speed_check.json"
    if FLAGS.set and not FLAGS.real_run:
      raise app.UsageError("--what=speed_check takes --set for --real_run's training only")
    sys.exit(speed_check.run(FLAGS.quick, out, levers=FLAGS.levers, peers=FLAGS.peers,
                                 xla_levers=FLAGS.xla_levers, real_run=FLAGS.real_run,
                                 real_run_data=FLAGS.real_run_data,
                                 budget_s=FLAGS.budget_s,
                                 real_run_batching=FLAGS.real_run_batching,
                                 packed_attention=FLAGS.packed_attention,
                                 real_run_sets=FLAGS.set))
  import jax
  _log(f"jax {jax.__version__}, {jax.local_device_count()} {jax.default_backend()} device(s)")
  from t2t_jax.errors import UserError
  try:
    if FLAGS.what == "train":
      run_train(FLAGS.workload)
    elif FLAGS.what == "decode":
      run_decode(FLAGS.workload)
    elif FLAGS.what == "profile":
      run_profile(FLAGS.workload)
    elif FLAGS.what == "host":
      run_host()
    elif FLAGS.what == "deploy":
      run_deploy()
    else:
      run_input()
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  hostmem.reexec_with_huge_pages()  # the speed `main` trains at
  backend.apply_xla_flags()  # the XLA options `main` trains with
  app.run(main)
