"""`python -m t2t_jax.tools.bench --what=device_check [--quick] [--out=FILE]`: measures the machine
it runs on and writes one JSON file.

In order: a base-shaped training run on the demo data that is stopped with SIGTERM, resumed
and compared with an uninterrupted run (its own metrics give the trainer's host ms per step);
then the device, the matmul peaks in bf16 and float32, base and big training in both dtypes
on all local devices, and cached beam search with the base model. The training runs go first
and in subprocesses: this process claims the accelerator's memory once it starts JAX.

Every section is written to the file as soon as it is done, and an error in one is recorded
there and does not stop the others; the command exits 1 if any section failed. `--quick`
shrinks every model and run so the whole check takes minutes on a CPU (CI runs it).
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Callable

from t2t_jax import backend

# The paper's base and big models (Table 3) at the paper's vocabulary. The device check's
# training cases run 4096-token micro-batches (the CPU's auto size); the speed check
# (t2t_jax/tools/speed_check.py) runs the micro-batch the trainer picks on the device.
BASE = {"model.num_layers": 6, "model.d_model": 512, "model.d_ff": 2048, "model.num_heads": 8,
        "model.d_k": 64, "model.d_v": 64, "model.vocab_size": 37000}
BIG = {**BASE, "model.d_model": 1024, "model.d_ff": 4096, "model.num_heads": 16}
# --quick: one layer, narrow, so that the whole check takes a few minutes on a CPU.
QUICK = {"model.num_layers": 1, "model.vocab_size": 2000, "model.d_model": 128,
         "model.d_ff": 256, "model.num_heads": 4, "model.d_k": 32, "model.d_v": 32}
QUICK_BIG = {**QUICK, "model.d_model": 256, "model.d_ff": 512}


def _now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _log(msg: str) -> None:
  print(f"device_check: {msg}", file=sys.stderr, flush=True)


class Report:
  """The JSON file, rewritten whole (via a temporary name) after every section."""

  def __init__(self, path: str, quick: bool):
    self.path = path
    self.data: dict[str, Any] = {"what": "device_check", "started": _now(), "quick": quick,
                                 "errors": {}}
    self.start = time.time()

  def section(self, name: str, fn: Callable[[], Any]) -> Any:
    _log(f"{name} ...")
    t0 = time.time()
    try:
      self.data[name] = fn()
    except Exception as e:  # recorded, and the other sections still run
      self.data["errors"][name] = "".join(traceback.format_exception_only(type(e), e)).strip()
      _log(f"{name} failed: {self.data['errors'][name]}")
      traceback.print_exc()
    _log(f"{name} done in {time.time() - t0:.0f}s")
    self.data["elapsed_sec"] = round(time.time() - self.start, 1)
    self.write()
    return self.data.get(name)

  def write(self) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
    tmp = self.path + ".tmp"
    with open(tmp, "w") as f:
      json.dump(self.data, f, indent=1)
    os.replace(tmp, self.path)


# --- the interrupted and resumed run --------------------------------------------------------

def _run_sets(quick: bool, steps: int) -> dict[str, Any]:
  """The base model on the demo corpus (its 1,000-piece vocabulary), the paper's 25k tokens
  per step in micro-batches of 4096 per device, one length bucket, not packed (one step shape,
  so that the bare step of that shape is the loop's yardstick)."""
  model = {**(QUICK if quick else BASE), "model.vocab_size": 1000}
  return {**model, "train.steps": steps, "train.tokens_per_step": 2048 if quick else 25000,
          "train.max_tokens_per_batch": 512 if quick else 4096, "train.warmup_steps": 4000,
          "train.log_every_steps": 5 if quick else 20, "train.checkpoint_every_steps": 100000,
          "train.checkpoint_every_minutes": 1000.0, "train.eval_every_steps": 100000,
          "train.final_eval": False, "data.bucket_min_length": 64, "data.packing": False}


def _train_command(workdir: str, sets: dict[str, Any]) -> list[str]:
  from t2t_jax import side_by_side
  return side_by_side.train_command("demo", workdir, sets=[f"{k}={v}" for k, v in sets.items()])


def _metrics(workdir: str) -> list[dict[str, Any]]:
  from t2t_jax.tools import plot
  return plot.read_metrics(workdir, missing_ok=True)


def _child_env(platform: str) -> dict[str, str]:
  env = dict(os.environ)
  if platform == "gpu":
    # Deterministic reductions, so that a difference can only come from the resume itself.
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_gpu_deterministic_ops=true").strip()
  return env


def _run(cmd: list[str], env: dict[str, str], log: str, timeout: float) -> None:
  with open(log, "a") as f:
    f.write(f"\n$ {' '.join(cmd)}\n")
    f.flush()
    r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=timeout)
  if r.returncode != 0:
    raise RuntimeError(f"training exited with {r.returncode}; see {log}")


def resume_check(quick: bool, log_dir: str) -> dict[str, Any]:
  """Trains uninterrupted; trains again, SIGTERMs it halfway and resumes it; compares."""
  import numpy as np
  steps = 40 if quick else 200
  sets = _run_sets(quick, steps)
  platform = backend.host_platform()
  env = _child_env(platform)
  log = os.path.join(log_dir, "device_check_runs.log")
  work = tempfile.mkdtemp(prefix="t2t_jax_device_check_")
  full, resumed = os.path.join(work, "full"), os.path.join(work, "resumed")
  t0 = time.time()
  _run(_train_command(full, sets), env, log, timeout=600)
  full_sec = time.time() - t0

  with open(log, "a") as f:
    cmd = _train_command(resumed, sets)
    f.write(f"\n$ {' '.join(cmd)}  (SIGTERM at step >= {steps // 2})\n")
    f.flush()
    proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    deadline = time.time() + 600
    while proc.poll() is None and time.time() < deadline:
      rows = _metrics(resumed)
      if rows and rows[-1].get("step", 0) >= steps // 2:
        proc.send_signal(signal.SIGTERM)
        break
      time.sleep(0.2)
    code = proc.wait(timeout=300)
  stopped = [int(d) for d in os.listdir(os.path.join(resumed, "checkpoints")) if d.isdigit()]
  if code != 0 or not stopped or max(stopped) >= steps:
    raise RuntimeError(f"the run was not stopped mid-training (exit {code}, checkpoints "
                       f"{sorted(stopped)}); see {log}")
  _run(_train_command(resumed, sets), env, log, timeout=600)

  a, b = _metrics(full), _metrics(resumed)
  loss_a = {r["step"]: r["loss"] for r in a if "loss" in r}
  loss_b = {r["step"]: r["loss"] for r in b if "loss" in r}
  after = sorted(s for s in loss_a if s > max(stopped) and s in loss_b)
  diffs = [abs(loss_a[s] - loss_b[s]) / max(abs(loss_a[s]), 1e-9) for s in after]

  # The final parameters of both runs, restored as the trainer restores them.
  from t2t_jax import checkpoints, optim, train
  from t2t_jax.config import override
  from t2t_jax import registry
  cfg = override(registry.get("demo"), sets)
  state = train.init_state(cfg, optim.make_optimizer(cfg))
  finals = []
  for workdir in (full, resumed):
    ckpt = checkpoints.Checkpointer(workdir, keep=100)
    restored, step = ckpt.restore_latest(state)
    ckpt.close()
    finals.append((restored.params, step))
  import jax
  leaves = zip(jax.tree_util.tree_leaves(finals[0][0]), jax.tree_util.tree_leaves(finals[1][0]))
  param_diff = max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in leaves)

  # The trainer's own cost, from the uninterrupted run's log windows that compiled nothing,
  # against the bare step of the same shape timed in this process.
  windows = []
  for prev, row in zip(a, a[1:]):
    if "host_ms_per_step" in row and row["compiles"] == prev.get("compiles"):
      ms = 1e3 * (row["elapsed_sec"] - prev["elapsed_sec"]) / (row["step"] - prev["step"])
      windows.append((ms, row["host_ms_per_step"], row["host_input_ms_per_step"],
                      row["input_wait_fraction"]))
  if not windows:
    raise RuntimeError(f"no log window without compilation in {full}/metrics.jsonl")
  step_ms, host_ms, input_ms, wait = (statistics.median(w[i] for w in windows) for i in range(4))
  from t2t_jax import input_pipeline
  from t2t_jax.tools import bench_step
  n = jax.local_device_count()
  devices, accum, rows, length = input_pipeline.load(cfg, num_devices=n).batch(1)["inputs"].shape
  bare = bench_step.bench_train(cfg, "trainer", n, rows * n, length, repeats=3, min_steps=10,
                                accum=accum, peak_n=1024 if quick else 8192)
  bare_ms = 1e3 / bare["steps_per_sec"]
  return {
      "model": {k.split(".")[1]: v for k, v in sets.items() if k.startswith("model.")},
      "steps": steps, "tokens_per_step": sets["train.tokens_per_step"],
      "micro_batch_tokens": sets["train.max_tokens_per_batch"],
      "deterministic_gpu_ops": platform == "gpu",
      "stopped_at_step": max(stopped), "final_steps": [finals[0][1], finals[1][1]],
      "losses_compared": len(after),
      "max_relative_loss_difference": max(diffs) if diffs else None,
      "max_parameter_difference": param_diff,
      "resume_matches": bool(after) and max(diffs) == 0.0 and param_diff == 0.0,
      "uninterrupted_run_sec": round(full_sec, 1),
      "trainer": {"windows": len(windows), "step_shape": [devices, accum, rows, length],
                  "loop_ms_per_step": round(step_ms, 2), "bare_step_ms": round(bare_ms, 2),
                  "loop_over_step": round(step_ms / bare_ms, 3),
                  "host_ms_per_step": host_ms, "host_input_ms_per_step": input_ms,
                  "host_fraction_of_step": round(host_ms / step_ms, 4),
                  "input_wait_fraction": wait},
  }


# --- in-process measurements ----------------------------------------------------------------

def device_info() -> dict[str, Any]:
  import jax
  import flax
  devices = jax.local_devices()
  return {"backend": backend.platform(), "kind": devices[0].device_kind,
          "count": len(devices), "process_count": jax.process_count(),
          "jax": jax.__version__, "flax": flax.__version__,
          "host_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
          else os.cpu_count()}


def run(quick: bool, out: str) -> int:
  """Runs every section; returns the exit code (1 when a section failed)."""
  from absl import logging
  logging.set_verbosity(logging.WARNING)  # orbax logs every restore at INFO
  log_dir = os.path.dirname(os.path.abspath(out))
  os.makedirs(log_dir, exist_ok=True)
  report = Report(out, quick)
  report.section("resume", lambda: resume_check(quick, log_dir))

  import jax
  from t2t_jax.tools import bench_decode, bench_step
  report.section("device", device_info)
  n = jax.local_device_count()
  matmul_n = 1024 if quick else 8192  # big enough to reach a GPU's peak, small on a CPU
  peaks = report.section("matmul_peak_flops_per_sec", lambda: {
      dtype: int(bench_step.matmul_peak(dtype, n=matmul_n, repeats=3 if quick else 10))
      for dtype in ("bfloat16", "float32")}) or {}
  if peaks:
    report.data["matmul_peak_note"] = (
        f"{matmul_n}^3 dot on one device, median; float32 runs at JAX's default matmul "
        "precision (TF32 on recent NVIDIA GPUs)")

  batch, length = (8, 16) if quick else (64, 64)  # 4096 tokens: the trainer's micro-batch

  def train(cases) -> list[dict[str, Any]]:
    records = report.data.setdefault("train", [])
    for name, dtype, extra in cases:
      sets = {**(BASE if name == "base" else BIG),
              **((QUICK if name == "base" else QUICK_BIG) if quick else {}),
              **{k: v for k, v in extra.items() if k != "batch"}}
      per_device = extra.get("batch", batch)
      cfg = bench_step.workload_config(sets, dtype)
      _log(f"train {name} {dtype} {extra or ''}: {per_device} x {length} per device")
      try:
        r = bench_step.bench_train(cfg, name, n, per_device * n, length, repeats=3,
                                   peak_n=matmul_n)
        r.update(variant=extra)
      except Exception as e:
        r = {"workload": name, "dtype": dtype, "variant": extra,
             "error": "".join(traceback.format_exception_only(type(e), e)).strip()}
      records.append(r)
      report.write()
    return records

  report.section("train", lambda: train([(name, dtype, {}) for name in ("base", "big")
                                          for dtype in ("bfloat16", "float32")]))

  def beam_search() -> dict[str, Any]:
    sets = {**BASE, **(QUICK if quick else {})}
    cfg = bench_step.workload_config(sets, "float32").model
    return bench_decode.run(cfg, n, batch_per_device=4 if quick else 64, repeats=3,
                            cached=True)
  report.section("beam_search", beam_search)

  if not quick:  # last, as it matters least: a 4x larger micro-batch
    report.section("train", lambda: train([("base", "bfloat16", {"batch": 4 * batch})]))

  base_bf16 = [r for r in report.data.get("train") or [] if r.get("workload") == "base"
               and r.get("dtype") == "bfloat16" and not r.get("variant") and "error" not in r]
  trainer = (report.data.get("resume") or {}).get("trainer") or {}
  report.data["summary"] = {
      "base_bf16_matmul_peak_fraction": base_bf16[0]["matmul_peak_fraction"] if base_bf16
      else None,
      "trainer_host_fraction_of_step": trainer.get("host_fraction_of_step"),
      "trainer_loop_over_step": trainer.get("loop_over_step"),
      "resume_matches": (report.data.get("resume") or {}).get("resume_matches"),
      "errors": sorted(report.data["errors"]),
  }
  report.data["finished"] = _now()
  report.write()
  _log(f"wrote {out}")
  print(json.dumps(report.data["summary"]), flush=True)
  return 1 if report.data["errors"] else 0
