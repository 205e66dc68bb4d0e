"""`python -m t2t_jax.tools.bench --what=speed_check [--levers] [--quick] [--peers=DIR] [--out=FILE]`:
our training and decoding speed on this machine's accelerator, side by side with the PyTorch
peers of `../shared/peers` run in the same command on the same shapes.

What it measures, in this order (about 7 minutes on one H100 or H200):
  1. the trainer itself (`python -m t2t_jax.main`, base, the paper's 25k tokens per update,
     the micro-batch it picks) in its own process: its ms per step from its own log;
  2. in one JAX process: the bf16 matmul peak (8192^3, random data, warmed up, median),
     the bare train step of the trainer's shape (so loop_over_step = trainer / bare), base
     and big training at 25,600 target tokens per update (800 sentences x 32 tokens) in the
     micro-batches the trainer would choose (both steps compiled at once before either is
     timed, as the trainer compiles its steps before step 1), and beam-4 decoding of base
     (256 sentences of 32 tokens, outputs forced to input + 50);
  3. the peers (Hugging Face MarianMTModel, PyTorch), each in its own process: training of
     base and big on the same shapes, eager then `--compile`, and `generate(num_beams=4)`.

`--levers` measures instead what each step lever of t2t_jax/backend.py is worth: base and
big at the same shapes with the trainer's defaults and with one lever changed at a time.
`--xla_levers` measures base with each candidate XLA GPU option of `XLA_LEVERS` beside the
trainer's own options, each in a process of its own (about 6 minutes on one GPU).

The JAX process starts after the trainer's has ended and the peers after the JAX process
has ended: a process that has started JAX holds most of the GPU's memory until it exits.
Each part is written to the JSON file as soon as it is done; a part that fails is recorded
and the others still run; the command exits 1 if any part failed. `--quick` runs tiny models
on any machine (a smoke test: CI runs it on its CPU; the peers need torch and transformers).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Sequence

from t2t_jax.tools import device_check
from t2t_jax.tools.device_check import BASE, BIG, QUICK, QUICK_BIG, Report

# The paper's update: ~25,000 target tokens (section 5.1), as 800 sentences of 32 tokens
# (WMT14 en-de sentences average ~30 wordpieces), the same shape for ours and the peers'.
ROWS, LENGTH = 800, 32
QUICK_ROWS, QUICK_LENGTH = 16, 16
# Decoding (issue 43): 256 sentences of 32 source tokens, beam 4, outputs input + 50 tokens.
DECODE_SENTENCES, DECODE_LENGTH, DECODE_EXTRA = 256, 32, 50

# Dense bf16 datasheet rates (FLOP/s), and what an 8192^3 bf16 product measured on machines
# like ours (769-798 TFLOP/s on H100 and H200 SXM). A peak read well below the
# measured reference is reported as suspect instead of being divided by.
DATASHEET_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12,
                  "A10": 125e12, "L4": 121e12}
MEASURED_BF16 = {"H200": 769e12, "H100": 769e12}
SUSPECT_BELOW = 0.9  # of the measured reference

# Issue 43's targets on one H100 or H200, bf16, the paper's 25k-token update.
TARGETS = {"big_target_tokens_per_sec": 320e3, "base_target_tokens_per_sec": 800e3,
           "base_over_peer": 1.3, "big_over_peer": 1.3, "loop_over_step": 1.05,
           "decode_sentences_per_sec": 4000.0, "decode_over_peer": 1.5}


def _log(msg: str) -> None:
  print(f"speed_check: {msg}", file=sys.stderr, flush=True)


def device_family(kind: str) -> str | None:
  """'NVIDIA H100 80GB HBM3' -> 'H100' (the longest name of the tables that it contains)."""
  names = sorted(DATASHEET_BF16, key=len, reverse=True)
  return next((n for n in names if n.lower() in kind.lower()), None)


def peak_reading(measured: float, kind: str) -> dict[str, Any]:
  """The measured bf16 peak beside the datasheet's, and whether it can be divided by."""
  family = device_family(kind)
  sheet, reference = DATASHEET_BF16.get(family or ""), MEASURED_BF16.get(family or "")
  out: dict[str, Any] = {"measured": int(measured), "datasheet": sheet, "device_family": family,
                         "measured_reference": reference}
  if sheet:
    out["measured_over_datasheet"] = round(measured / sheet, 3)
  out["suspect"] = bool(reference and measured < SUSPECT_BELOW * reference)
  if out["suspect"]:
    out["note"] = (f"the matmul peak read {measured / 1e12:.0f} TFLOP/s, below the "
                   f"{reference / 1e12:.0f}+ measured on {family} machines like this one: "
                   "fractions are given of the datasheet, not of this reading")
  return out


# --- the JAX process -------------------------------------------------------------------------

def _workload(name: str, quick: bool) -> dict[str, Any]:
  return {**(BASE if name == "base" else BIG),
          **((QUICK if name == "base" else QUICK_BIG) if quick else {})}


def _train_bench(name: str, quick: bool, sets: dict[str, Any], n: int):
  """Our train step at the paper's update in the micro-batches the trainer would choose
  (`sets["share_of"] = k`: one GPU's share of the update on k GPUs), made ready to time."""
  from t2t_jax import input_pipeline
  from t2t_jax.tools import bench_step
  from t2t_jax.config import override
  rows, length = (QUICK_ROWS, QUICK_LENGTH) if quick else (ROWS, LENGTH)
  config_sets = {k: v for k, v in sets.items() if k not in ("share_of", "packed_rows_of")}
  segment_mean = None
  if "packed_rows_of" in sets:  # the same tokens in rows of that length, sentences packed
    rows, length = rows * length // sets["packed_rows_of"], sets["packed_rows_of"]
    segment_mean = QUICK_SEGMENT_MEAN if quick else SEGMENT_MEAN
  rows = -(-rows // sets.get("share_of", 1))
  cfg = bench_step.workload_config({**_workload(name, quick), **config_sets}, "bfloat16")
  cfg = override(cfg, {"train.tokens_per_step": rows * length, "data.max_length": length})
  micro = input_pipeline.micro_batch_tokens(cfg, n)
  accum = input_pipeline.accumulation_steps(cfg, n, micro)
  per_micro = -(-rows // (accum * n)) * n  # rows of one micro-batch over all devices
  return bench_step.prepare_train(cfg, name, n, per_micro, length, accum=accum,
                                  segment_mean=segment_mean), micro


def _train_case(name: str, quick: bool, sets: dict[str, Any], n: int,
                ahead: tuple[Any, ...] | BaseException | None = None) -> dict[str, Any]:
  """One train case timed: `ahead` is what `_compile_cases` made of it (its bench, compiled,
  its micro-batch and compile seconds, or the error it met), else it is made and compiled
  here."""
  from t2t_jax import model
  from t2t_jax.tools import bench_step
  if isinstance(ahead, BaseException):
    # Compiled ahead from the state's shapes: should that fail where compiling at the first
    # call does not (a JAX version, say), the case is timed that way; else its error stands.
    try:
      r = _train_case(name, quick, sets, n)
    except Exception:
      raise ahead from None
    first = str(ahead).splitlines()[0] if str(ahead) else ""
    return {**r, "compile_ahead_error": f"{type(ahead).__name__}: {first}"[:500]}
  bench, micro, seconds = ahead or (*_train_bench(name, quick, sets, n), None)
  r = bench_step.time_train(bench, repeats=3, min_steps=10, peak_n=1024 if quick else 8192,
                            compile_seconds=seconds)
  r.update(micro_batch_tokens_auto=micro, sets=sets,
           params=model.count_params(model.abstract_params(bench.cfg.model)))
  memory = _peak_memory()
  if memory:
    r["device_peak_bytes_in_use"] = memory
  return r


def _compile_cases(cases: list[tuple[str, dict[str, Any]]], quick: bool, n: int,
                   made: dict[str, tuple[Any, ...] | BaseException]) -> dict[str, Any]:
  """Every train case's step compiled before any is timed, all at once (XLA compiles each in
  threads of its own, as the trainer's steps before step 1): ~40 s a base step on an H200,
  one after the other, was most of a case's time. Fills `made` by case key; a case that fails
  here keeps its error, to be reported under its own key."""
  from t2t_jax import parallel

  def timed(bench):
    t0 = time.time()
    try:
      bench.compile()
      return None, round(time.time() - t0, 2)
    except Exception as e:  # this case's failure, not the others'
      return e, None
  benches = {}
  for name, sets in cases:
    key = _case_key(name, sets)
    try:
      benches[key] = _train_bench(name, quick, sets, n)
    except Exception as e:
      made[key] = e
  t0 = time.time()
  workers = min(os.cpu_count() or 1, len(benches))
  compiled = parallel.compile_all({k: (lambda b=b: timed(b[0])) for k, b in benches.items()},
                                  workers)
  for key, (error, seconds) in compiled.items():
    made[key] = error if seconds is None else (*benches[key], seconds)
  return {"programs": sum(seconds is not None for _, seconds in compiled.values()),
          "workers": workers, "seconds": round(time.time() - t0, 1),
          "failed": sorted(k for k, v in made.items() if isinstance(v, BaseException))}


def _case_key(name: str, sets: dict[str, Any]) -> str:
  return f"train {name} {json.dumps(sets, sort_keys=True)}"


def _peak_memory() -> int | None:
  """The device's peak allocation so far in this process (GPU and TPU report it)."""
  import jax
  try:
    return int(jax.local_devices()[0].memory_stats()["peak_bytes_in_use"])
  except Exception:
    return None


def jax_part(spec: dict[str, Any]) -> None:
  """The JAX process: one JSON line per measurement on stdout, as each is done."""
  import jax
  from t2t_jax.tools import bench_decode, bench_step
  quick, n = spec["quick"], jax.local_device_count()

  def emit(name: str, fn) -> None:
    t0 = time.time()
    try:
      value = fn()
    except Exception as e:  # recorded; the next measurement still runs
      value = {"error": f"{type(e).__name__}: {e}"[:2000]}
    print(json.dumps({"part": name, "seconds": round(time.time() - t0, 1), "value": value}),
          flush=True)

  emit("device", device_check.device_info)
  emit("matmul_peak", lambda: bench_step.matmul_peak(
      "bfloat16", n=1024 if quick else 8192, repeats=5, calls=3 if quick else 20,
      warmup_sec=0.2 if quick else 2.0))
  # The same product with bf16 results, as the plain path's bf16 layers ask for it (torch's
  # peak is read this way): the two readings differ where cuBLAS picks other kernels.
  emit("matmul_peak_bf16_out", lambda: bench_step.matmul_peak(
      "bfloat16", n=1024 if quick else 8192, repeats=5, calls=3 if quick else 20,
      out_dtype="bfloat16"))
  if spec.get("packed_agreement"):  # before the timings: a wrong kernel is found first
    emit("packed_layout_agreement", lambda: packed_layout_agreement(quick))
  made: dict[str, tuple[Any, ...] | BaseException] = {}
  if spec.get("compile_ahead"):
    emit("compile_ahead", lambda: _compile_cases(spec["train"], quick, n, made))
  for name, sets in spec["train"]:
    key = _case_key(name, sets)
    emit(key, lambda: _train_case(name, quick, sets, n, made.pop(key, None)))
  if spec.get("bare_step"):
    emit("bare_step", lambda: _bare_step(spec["bare_step"], quick, n))
  if spec.get("decode"):
    def decode():
      cfg = bench_step.workload_config(_workload("base", quick), "bfloat16").model
      sentences, length = (8, 8) if quick else (DECODE_SENTENCES, DECODE_LENGTH)
      return bench_decode.run(cfg, n, batch_per_device=sentences // n, src_len=length,
                              out_len=length + DECODE_EXTRA, beam_size=4, repeats=3)
    emit("decode", decode)


def _bare_step(sets: dict[str, Any], quick: bool, n: int) -> dict[str, Any]:
  """The trainer run's step of its exact shape (read from its prepared data), timed bare."""
  from t2t_jax import input_pipeline, registry
  from t2t_jax.tools import bench_step
  from t2t_jax.config import override
  cfg = override(registry.get("demo"), sets)
  devices, accum, rows, length = input_pipeline.load(cfg, num_devices=n).batch(1)["inputs"].shape
  r = bench_step.bench_train(cfg, "trainer", n, rows * n, length, repeats=3, min_steps=10,
                             accum=accum, peak_n=1024 if quick else 8192)
  r["step_shape"] = [devices, accum, rows, length]
  return r


# bf16 logits and gradients of the two layouts agree within this share of their scale (the
# layouts sum the same products in other orders and tiles).
LAYOUT_TOLERANCE = 0.05


def packed_layout_agreement(quick: bool) -> dict[str, Any]:
  """The fused kernel's two layouts of packed rows on the same batch: base's width in one
  layer, rows of the packed cases' length and sentences. The largest logit difference at
  real positions, and the largest of each gradient's largest difference over its largest
  value (`summarise` reads them against LAYOUT_TOLERANCE)."""
  import dataclasses
  import jax
  import jax.numpy as jnp
  import numpy as np
  from t2t_jax import model
  from t2t_jax.special_tokens import EOS_ID, PAD_ID
  from t2t_jax.tools import bench_step
  cfg = dataclasses.replace(
      bench_step.workload_config(_workload("base", quick), "bfloat16").model,
      num_layers=1, dropout=0.0, fused_attention=True)
  row = QUICK_PACKED_ROW if quick else PACKED_ROW
  src, tgt = bench_step.packed_rows(np.random.default_rng(0), 16, row,
                                    QUICK_SEGMENT_MEAN if quick else SEGMENT_MEAN,
                                    cfg.vocab_size)
  tgt[-1, row // 2:] = src[-1, row // 2:] = PAD_ID  # padding in one row, as packing leaves
  params = model.init_params(cfg, jax.random.PRNGKey(0))

  def run(layout: str):
    c = dataclasses.replace(cfg, segment_attention=layout)

    def loss(p):
      logits = model.Transformer(c, packed=True).apply({"params": p}, src, tgt)
      logp = jax.nn.log_softmax(logits.astype(jnp.float32))
      return jnp.sum(jnp.where(tgt != PAD_ID, jnp.take_along_axis(
          logp, tgt[..., None], -1)[..., 0], 0.0)), logits
    (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return np.asarray(logits, np.float32), jax.tree_util.tree_leaves(grads)

  (logits_b, grads_b), (logits_o, grads_o) = run("bias"), run("offsets")
  real = tgt != PAD_ID
  grad_diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                  / max(float(np.max(np.abs(np.asarray(a)))), 1e-12)
                  for a, b in zip(grads_b, grads_o))
  # The packed layout runs only while every row holds at most its bound of sentences.
  sentences = int(np.max(np.sum(tgt == EOS_ID, axis=1)))
  return {"rows": int(src.shape[0]), "length": row, "most_sentences_in_a_row": sentences,
          "packed_layout_ran": sentences <= model.max_segments(row, row),
          "max_logit_difference": float(np.max(np.abs(logits_b[real] - logits_o[real]))),
          "max_logit": float(np.max(np.abs(logits_b[real]))),
          "max_relative_gradient_difference": grad_diff,
          "finite": bool(all(np.isfinite(np.asarray(g)).all() for g in grads_o))}


# --- the parent: processes in turn, nothing of JAX here ---------------------------------------

def _run_lines(cmd: list[str], env: dict[str, str], timeout: float, log: str
               ) -> tuple[list[dict[str, Any]], str | None]:
  """Runs `cmd`, collecting the JSON lines of its stdout; (lines, error or None)."""
  lines, error = [], None
  with open(log, "a") as f:
    f.write(f"\n$ {' '.join(cmd)}\n")
    f.flush()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=f, env=env, text=True)
    deadline = time.time() + timeout
    try:
      for line in proc.stdout:  # type: ignore[union-attr]
        f.write(line)
        if line.startswith("{"):
          try:
            lines.append(json.loads(line))
          except json.JSONDecodeError:
            pass
        if time.time() > deadline:
          raise subprocess.TimeoutExpired(cmd, timeout)
      code = proc.wait(timeout=max(1.0, deadline - time.time()))
      if code != 0:
        error = f"exited with {code}; see {log}"
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
      error = f"stopped after {timeout:.0f} s; see {log}"
  return lines, error


def _peer_commands(peers: str, quick: bool) -> list[tuple[str, list[str]]]:
  rows, length = (4, 8) if quick else (ROWS, LENGTH)
  steps = ["--steps=2", "--repeats=1", "--warmup=1"] if quick else []
  out = []
  for name in ("base", "big"):
    model = "tiny" if quick else name
    train = [sys.executable, os.path.join(peers, "gpu_train_peer.py"), f"--model={model}",
             f"--batch={rows}", f"--length={length}", *steps]
    out.append((f"peer train {name}", train))
  sentences, src = (4, 8) if quick else (DECODE_SENTENCES, DECODE_LENGTH)
  out.append(("peer decode base", [
      sys.executable, os.path.join(peers, "gpu_decode_peer.py"),
      f"--model={'tiny' if quick else 'base'}", f"--batch={sentences}", f"--length={src}",
      f"--extra={DECODE_EXTRA}", "--beam=4"]))
  # torch.compile last: its compilation takes the longest, and the eager figures above
  # already give a ratio if the time limit cuts it.
  out += [(f"{name} compile", cmd + ["--compile"]) for name, cmd in out[:2]]
  return out


def default_peers() -> str | None:
  """The peers' folder: `.peers/` in the repository (how they travel to a GPU machine, git
  ignores it), else `../shared/peers` beside the repository."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  for path in (os.path.join(root, ".peers"), os.path.join(os.path.dirname(root), "shared",
                                                          "peers")):
    if os.path.isfile(os.path.join(path, "gpu_train_peer.py")):
      return path
  return None


# The levers run: (workload, lever, sets) in the order they run, most telling first, so that a
# run cut short by its time limit loses the least. The trainer's defaults come first.
LEVERS = [
    ("base", "defaults", {}),
    ("base", "autodiff loss (train.lean_loss=false)", {"train.lean_loss": False}),
    ("big", "autodiff loss (train.lean_loss=false)", {"train.lean_loss": False}),
    ("base", "bf16 residual stream", {"model.residual_dtype": "bfloat16"}),
    ("base", "three Q, K, V products", {"model.fused_projections": False}),
    ("big", "bf16 residual stream", {"model.residual_dtype": "bfloat16"}),
    ("base", "fused attention", {"model.fused_attention": True}),
    ("base", "whole logits", {"train.loss_chunk_tokens": 0}),
    ("base", "one GPU's share of 8 (3,200 tokens)", {"share_of": 8}),
    ("big", "one GPU's share of 8 (3,200 tokens)", {"share_of": 8}),
    ("base", "no dropout (what the masks cost)", {"model.dropout": 0.0}),
    ("base", "4096-token micro-batches", {"train.max_tokens_per_batch": 4096}),
    ("big", "defaults", {}),
    ("big", "fused attention", {"model.fused_attention": True}),
]


# `--packed_attention`: the synthetic step against packed rows of the real run's length
# (base_ende's rows on WMT-shaped data are 128 target tokens holding ~5 sentences of ~25
# tokens), the same 25,600 tokens a step, on each attention path that packed rows can take.
SEGMENT_MEAN, QUICK_SEGMENT_MEAN = 25, 12
PACKED_ROW, QUICK_PACKED_ROW = 128, 32


def packed_attention_cases(quick: bool) -> list[tuple[str, dict[str, Any]]]:
  row = QUICK_PACKED_ROW if quick else PACKED_ROW
  fused = {"packed_rows_of": row, "model.fused_attention": True}
  return [("base", {}), ("base", {"packed_rows_of": row}),
          ("base", fused), ("base", {**fused, "model.segment_attention": "offsets"})]


# XLA GPU options that may make the step faster, each measured by `--xla_levers` against the
# trainer's own options (backend.GPU_XLA_FLAGS) in a process of its own (XLA reads its flags
# once): a candidate joins GPU_XLA_FLAGS only when it measures faster.
XLA_LEVERS = [
    ("cuBLAS products only (no Triton GEMM)", "--xla_gpu_enable_triton_gemm=false"),
    ("command buffers with while loops and conditionals",
     "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,CONDITIONALS,WHILE"),
    ("cuBLASLt products", "--xla_gpu_enable_cublaslt=true"),
]
XLA_LEVER_SEC = 110.0  # one process: start, compile (~41 s for base on an H200), measure


# 8 GPUs on paper: NCCL's ring all-reduce moves 2 (k - 1) / k of the gradient's bytes through
# each GPU's link. The bus bandwidth is an assumption, not a measurement here: H100 and H200
# have 900 GB/s of NVLink 4 per GPU (both directions), and NCCL's all-reduce reaches about
# 400 GB/s of bus bandwidth on 8 of them for messages of hundreds of MB.
NVLINK_BUS_BYTES_PER_SEC = 400e9
GPUS = 8


def eight_gpu_projection(share: dict[str, Any]) -> dict[str, Any]:
  """An 8-GPU step projected from one GPU's measured step on its 1/8 share of the update,
  plus the float32 gradient all-reduce, which does not overlap the backward pass (the step
  reduces the gradients once, after its micro-batch scan)."""
  step_ms = 1e3 / share["steps_per_sec"]
  allreduce_ms = 1e3 * 2 * (GPUS - 1) / GPUS * 4 * share["params"] / NVLINK_BUS_BYTES_PER_SEC
  total = step_ms + allreduce_ms
  tokens = share["batch"] * share["length"] * share["accum"] * GPUS
  return {"projection": True, "measured_share_step_ms": round(step_ms, 2),
          "allreduce_ms": round(allreduce_ms, 2), "step_ms": round(total, 2),
          "target_tokens_per_sec": round(tokens / total * 1e3),
          "per_gpu_target_tokens_per_sec": round(tokens / total * 1e3 / GPUS),
          "assumptions": f"{NVLINK_BUS_BYTES_PER_SEC / 1e9:.0f} GB/s all-reduce bus bandwidth, "
                         "no overlap with the backward pass, the share's step time as "
                         "measured on one GPU, input and host work hidden"}



# --real_run (issue 53): base_ende's settings on WMT-shaped data (t2t_jax/tools/wmt_shaped.py,
# Tatoeba pairs joined three to a line), packed and (time allowing) bucketed, each for a few
# minutes, beside the synthetic base step of the same call.
REAL_RUN = {"pairs": 300_000, "minutes": 2.5, "log_every": 25}
QUICK_REAL_RUN = {"pairs": 20_000, "minutes": 0.75, "log_every": 2}
STEADY = 0.9  # a log window is steady once its rate is within 10% of the run's steady rate
# Issue 53's targets on one H100 or H200: real tok/s >= 90% of the synthetic step's, and
# steady within 2 minutes of the launch.
REAL_RUN_TARGETS = {"over_synthetic": 0.9, "seconds_to_steady_state": 120.0}


def _real_run_corpus(quick: bool, root: str, data: str | None) -> dict[str, Any]:
  """The WMT-shaped corpus and its prepared cache (vocabulary and ids), made before any
  trainer starts so that the runs time training alone. No JAX in this process."""
  from t2t_jax import input_pipeline, registry
  from t2t_jax.config import override
  shape = QUICK_REAL_RUN if quick else REAL_RUN
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  data = data or os.path.join(os.path.dirname(repo), "shared", "data")
  folders = [os.path.join(data, name) for name in ("tatoeba_ende", "wmt_newstest_ende")]
  missing = [f for f in folders if not os.path.isdir(f)]
  if missing:
    raise FileNotFoundError(f"{missing[0]} not found: give --real_run_data=FOLDER holding "
                            f"tatoeba_ende/ and wmt_newstest_ende/ (../shared/data)")
  corpus = os.path.join(root, "wmt_shaped")
  t0 = time.time()
  subprocess.run([sys.executable, "-m", "t2t_jax.tools.wmt_shaped", f"--out={corpus}",
                  f"--pairs={shape['pairs']}", f"--tatoeba={folders[0]}",
                  f"--newstest={folders[1]}"], check=True, capture_output=True, text=True)
  written = time.time() - t0
  cfg = override(registry.get("base_ende"), _real_run_sets(quick, corpus, root, True))
  cfg = input_pipeline.resolve_splits(cfg)
  input_pipeline.prepared_dir(cfg)
  return {"corpus": corpus, "pairs": shape["pairs"], "write_seconds": round(written, 1),
          "prepare_seconds": round(time.time() - t0 - written, 1)}


def _real_run_sets(quick: bool, corpus: str, root: str, packing: bool) -> dict[str, Any]:
  shape = QUICK_REAL_RUN if quick else REAL_RUN
  return {**(QUICK if quick else {}), "model.dtype": "bfloat16",
          "data.dataset": f"folder:{corpus}:en-de", "data.data_dir": os.path.join(root, "cache"),
          "data.packing": packing, "train.steps": 1_000_000,
          "train.max_train_minutes": shape["minutes"],
          "train.log_every_steps": shape["log_every"],
          "train.checkpoint_every_steps": 1_000_000, "train.checkpoint_every_minutes": 1000.0,
          "train.eval_every_steps": 1_000_000, "train.final_eval": False}


def _real_run(quick: bool, corpus: str, root: str, log: str, packing: bool,
              extra: Sequence[str] = ()) -> dict[str, Any]:
  """`python -m t2t_jax.main --experiment=base_ende` on the WMT-shaped corpus for a few
  minutes (its time budget): real (non-padding) target tok/s at steady state from its own
  metrics.jsonl, seconds from launch to its first log line and to steady state, and the
  seconds and programs it compiled. `extra`: the user's `--set`s, after the check's own."""
  import statistics
  from t2t_jax import side_by_side
  sets = _real_run_sets(quick, corpus, root, packing)
  work = tempfile.mkdtemp(prefix="t2t_jax_real_run_")
  launched = time.time()
  device_check._run(side_by_side.train_command("base_ende", work, sets=[
      f"{k}={v}" for k, v in sets.items()] + list(extra)), dict(os.environ), log,
      timeout=60 * sets["train.max_train_minutes"] + 300)
  ended = time.time()
  rows = [r for r in device_check._metrics(work) if "tokens_per_sec" in r and "time" in r]
  shutil.rmtree(work, ignore_errors=True)
  last = rows[-1] if rows else {}
  found = {"packing": packing, "sets": sets, "user_sets": list(extra),
           "steps": last.get("step", 0),
           "compiles": last.get("compiles"), "compiled_ahead": last.get("compiled_ahead"),
           "compile_seconds": last.get("compile_seconds"), "seconds": round(ended - launched, 1),
           # Where the start-up goes: launch to compiling, the compilation's wall time, and
           # the largest device memory plan (train.check_device_memory).
           **{k: last[k] for k in ("launch_to_compiling_sec", "startup_sec",
                                   "compile_ahead_sec", "largest_plan_bytes") if k in last}}
  if len(rows) < 3:  # a finding, not a failure: the budget ended before a steady rate
    return {**found, "steady_target_tokens_per_sec": None, "note": f"{len(rows)} log line(s) "
            f"in {sets['train.max_train_minutes']} min: no steady rate"}
  quiet = [r for p, r in zip(rows, rows[1:]) if r["compiles"] == p["compiles"]]
  late = quiet[len(quiet) // 2:] or rows[-1:]
  steady = statistics.median(r["tokens_per_sec"] for r in late)
  reached = next((r for r in rows[1:] if r["tokens_per_sec"] >= STEADY * steady), rows[-1])
  return {**found, "steady_target_tokens_per_sec": round(steady),
          "seconds_to_first_log_line": round(rows[0]["time"] - launched, 1),
          "first_log_line_step": rows[0]["step"],
          "seconds_to_steady_state": round(reached["time"] - launched, 1),
          "compiles_after_warmup": last.get("compiles_after_warmup")}


def _bucketed_seconds(quick: bool) -> float:
  """What a bucketed real run may take: its minutes of training, plus start-up and compiling
  every bucket's step before step 1 (25 train and 6 eval programs took over 200 s on an H200,
  2026-11-28, where packed's 7 took 67 s)."""
  return 60 * (QUICK_REAL_RUN if quick else REAL_RUN)["minutes"] + 300


# The whole check's time on a GPU, within one 10-minute device call: the peers that would
# start after it are skipped, and say so.
BUDGET_SEC = 540.0


def run(quick: bool, out: str, levers: bool = False, peers: str | None = None,
        xla_levers: bool = False, real_run: bool = False,
        real_run_data: str | None = None, budget_s: float | None = None,
        real_run_batching: str = "both", packed_attention: bool = False,
        real_run_sets: Sequence[str] = ()) -> int:
  """Runs every part; returns the exit code (1 when a part failed). `budget_s` shortens the
  check to fit what is left of a device lease; `real_run_sets` ("key=value") change the
  real runs' training (the synthetic step it is read against keeps the defaults)."""
  log_dir = os.path.dirname(os.path.abspath(out))
  os.makedirs(log_dir, exist_ok=True)
  log = os.path.join(log_dir, "speed_check_runs.log")
  report = Report(out, quick)
  report.data["what"] = ("speed_check_packed_attention" if packed_attention else
                         "speed_check_xla_levers" if xla_levers else
                         "speed_check_levers" if levers else
                         "speed_check_real_run" if real_run else "speed_check")
  peers = peers or default_peers()
  env = dict(os.environ)
  # The trainer's compilation cache (as `main` sets it): the bare step of the trainer's shape
  # may then load the trainer's compiled step instead of compiling it again.
  env.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(
      os.path.expanduser("~/.cache/t2t_jax"), "jax_cache"))
  budget = budget_s or (900.0 if quick else BUDGET_SEC)
  deadline = time.time() + budget
  child = [sys.executable, "-m", "t2t_jax.tools.speed_check"]

  if real_run:
    root = tempfile.mkdtemp(prefix="t2t_jax_real_run_data_")
    corpus = report.section("real_run_corpus", lambda: _real_run_corpus(quick, root,
                                                                         real_run_data))
    # The packed run (the default) and the synthetic step it is read against come first;
    # the bucketed run follows when the check's time allows, and says so when it does not.
    if corpus and real_run_batching in ("packed", "both"):
      report.section("real_run_packed",
                     lambda: _real_run(quick, corpus["corpus"], root, log, True,
                                       real_run_sets))
    spec = {"quick": quick, "train": [("base", {})]}
    lines, error = _run_lines(child + ["--spec", json.dumps(spec)], env, 240.0, log)
    report.section("jax", lambda: _collect(lines, error))
    left, needed = deadline - time.time(), _bucketed_seconds(quick)
    if corpus and real_run_batching != "packed":
      if left < needed:
        report.data["real_run_bucketed"] = {
            "skipped": f"{left:.0f} s left of the check's {budget:.0f} s, against the "
                       f"{needed:.0f} s a bucketed run may take; "
                       "`--real_run_batching=bucketed` runs it alone"}
      else:
        report.section("real_run_bucketed",
                       lambda: _real_run(quick, corpus["corpus"], root, log, False,
                                         real_run_sets))
    shutil.rmtree(root, ignore_errors=True)
  elif packed_attention:
    spec = {"quick": quick, "train": packed_attention_cases(quick), "packed_agreement": True,
            "compile_ahead": True}
    lines, error = _run_lines(child + ["--spec", json.dumps(spec)], env,
                              min(420.0, max(60.0, deadline - time.time())), log)
    report.section("jax", lambda: _collect(lines, error))
  elif xla_levers:
    spec = {"quick": quick, "train": [("base", {})]}
    for title, flag in [("defaults", "")] + XLA_LEVERS:
      flags = " ".join(f for f in (env.get("XLA_FLAGS", ""), flag) if f)
      lines, error = _run_lines(child + ["--spec", json.dumps(spec)],
                                {**env, "XLA_FLAGS": flags}, XLA_LEVER_SEC, log)
      report.section(f"xla {title}", lambda: {"xla_flag": flag, **_collect(lines, error)})
  elif levers:
    spec = {"quick": quick, "train": [(name, sets) for name, _, sets in LEVERS]}
    lines, error = _run_lines(child + ["--spec", json.dumps(spec)], env, 420.0, log)
    report.section("jax", lambda: _collect(lines, error))
    off_env = {**env, "T2T_JAX_NO_XLA_FLAGS": "1"}
    spec = {"quick": quick, "train": [("base", {})]}
    lines, error = _run_lines(child + ["--spec", json.dumps(spec)], off_env, 120.0, log)
    report.section("jax_without_gpu_xla_flags", lambda: _collect(lines, error))
  else:
    trainer = report.section("trainer", lambda: _trainer_run(quick, log_dir, log))
    spec = {"quick": quick, "train": [("base", {}), ("big", {})], "decode": True,
            "compile_ahead": True,
            "bare_step": trainer and trainer["sets"]}
    lines, error = _run_lines(child + ["--spec", json.dumps(spec)], env,
                              min(330.0, max(60.0, deadline - time.time())), log)
    report.section("jax", lambda: _collect(lines, error))
  import importlib.util
  missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
  if levers or xla_levers or real_run or packed_attention:
    pass  # the peers ran beside the defaults in the speed check itself
  elif peers is None or missing:
    report.data["peers"] = {"skipped": "no peers folder (.peers/ or ../shared/peers)"
                            if peers is None else f"not installed: {', '.join(missing)}"}
  else:
    def run_peers() -> dict[str, Any]:
      found = {}
      for name, cmd in _peer_commands(peers, quick):
        left = deadline - time.time()
        if left < 30:
          found[name] = {"skipped": f"the check's {budget:.0f} s were spent"}
          continue
        _log(f"{name} ...")
        lines, error = _run_lines(cmd, env, min(left, 60.0 if quick else 150.0), log)
        found[name] = lines[-1] if lines else {"error": error or "no output"}
        report.data["peers"] = found
        report.write()
      return found
    report.section("peers", run_peers)
  report.data["summary"] = summarise(report.data)
  report.data["finished"] = device_check._now()
  errors = [k for k, v in report.data["summary"].get("failed", {}).items() if v]
  report.data["errors"].update(report.data["summary"].get("failed", {}))
  report.write()
  _log(f"wrote {out}")
  print(json.dumps(report.data["summary"]), flush=True)
  return 1 if report.data["errors"] or errors else 0


def _collect(lines: list[dict[str, Any]], error: str | None) -> dict[str, Any]:
  parts = {l["part"]: l["value"] for l in lines if "part" in l}
  if error:
    parts["error"] = error
  return parts


def _trainer_run(quick: bool, log_dir: str, log: str) -> dict[str, Any]:
  """`python -m t2t_jax.main` on the demo data, base at the paper's update with its auto
  micro-batch, one length bucket; its ms per step over the log windows that compiled nothing."""
  import statistics
  steps = 30 if quick else 120
  sets = device_check._run_sets(quick, steps)
  sets["train.max_tokens_per_batch"] = "auto"
  work = tempfile.mkdtemp(prefix="t2t_jax_speed_check_")
  t0 = time.time()
  device_check._run(device_check._train_command(work, sets), dict(os.environ), log,
                    timeout=400)
  rows = device_check._metrics(work)
  shutil.rmtree(work, ignore_errors=True)
  windows = [(1e3 * (r["elapsed_sec"] - p["elapsed_sec"]) / (r["step"] - p["step"]),
              r["host_ms_per_step"]) for p, r in zip(rows, rows[1:])
             if "host_ms_per_step" in r and r["compiles"] == p.get("compiles")]
  if not windows:
    raise RuntimeError(f"no log window without compilation in {work}/metrics.jsonl")
  return {"steps": steps, "seconds": round(time.time() - t0, 1), "windows": len(windows),
          "loop_ms_per_step": round(statistics.median(w[0] for w in windows), 3),
          "host_ms_per_step": round(statistics.median(w[1] for w in windows), 3),
          "sets": sets}


def _ratio(a: float | None, b: float | None) -> float | None:
  return round(a / b, 3) if a and b else None


def summarise(data: dict[str, Any]) -> dict[str, Any]:
  """The figures against the targets: each with its value, the target and whether it is met
  (None where it was not measured)."""
  jax_parts = data.get("jax") or {}
  peers = data.get("peers") or {}
  train = {k.split()[1]: v for k, v in jax_parts.items()
           if k.startswith("train ") and k.endswith(" {}") and "error" not in v}
  def rate(d: dict[str, Any] | None) -> float | None:
    return (d or {}).get("target_tokens_per_sec")
  def best_peer(name: str) -> float | None:
    rates = [rate(peers.get(k)) for k in (f"peer train {name}", f"peer train {name} compile")]
    rates = [r for r in rates if r]
    return max(rates) if rates else None
  decode = jax_parts.get("decode") or {}
  peer_decode = (peers.get("peer decode base") or {}).get("sentences_per_sec")
  trainer = data.get("trainer") or {}
  bare = jax_parts.get("bare_step") or {}
  bare_ms = 1e3 / bare["steps_per_sec"] if bare.get("steps_per_sec") else None
  figures = {
      "base_target_tokens_per_sec": rate(train.get("base")),
      "big_target_tokens_per_sec": rate(train.get("big")),
      "base_over_peer": _ratio(rate(train.get("base")), best_peer("base")),
      "big_over_peer": _ratio(rate(train.get("big")), best_peer("big")),
      "loop_over_step": _ratio(trainer.get("loop_ms_per_step"), bare_ms),
      "decode_sentences_per_sec": decode.get("sentences_per_sec"),
      "decode_over_peer": _ratio(decode.get("sentences_per_sec"), peer_decode),
  }
  out: dict[str, Any] = {}
  for key, value in figures.items():
    target = TARGETS[key]
    # --quick runs tiny models (ours and the peers' differ): no figure of it meets a target.
    met = None if value is None or data.get("quick") else (
        value <= target if key == "loop_over_step" else value >= target)
    out[key] = {"value": value, "target": target, "met": met}
  shares = {k.split()[1]: v for k, v in jax_parts.items() if k.startswith("train ")
            and '"share_of": 8' in k and "error" not in v}
  for name, share in shares.items():
    out[f"{name}_8_gpus"] = eight_gpu_projection(share)
  device = jax_parts.get("device") or {}
  peak = jax_parts.get("matmul_peak")
  if isinstance(peak, (int, float)):
    reading = peak_reading(peak, device.get("kind", ""))
    out["matmul_peak"] = reading
    for name in ("base", "big"):
      r = train.get(name)
      if r and reading.get("datasheet"):
        out[f"{name}_datasheet_fraction"] = round(r["achieved_flops_per_sec"] /
                                                  reading["datasheet"], 4)
      if r and not reading["suspect"]:
        out[f"{name}_measured_peak_fraction"] = round(r["achieved_flops_per_sec"] / peak, 4)
  if isinstance(jax_parts.get("matmul_peak_bf16_out"), (int, float)):
    out["matmul_peak_bf16_out"] = int(jax_parts["matmul_peak_bf16_out"])
    out["matmul_peak_bf16_out_over_f32_out"] = _ratio(jax_parts["matmul_peak_bf16_out"], peak)
  defaults = {k.split()[1]: rate(v) for k, v in jax_parts.items() if k.endswith(" {}")}
  levers, packed = {}, {}
  for key, value in jax_parts.items():
    if key.startswith("train ") and not key.endswith(" {}") and "share_of" not in key:
      name = key.split()[1]
      into = packed if "packed_rows_of" in key else levers
      into[key] = _ratio(rate(value), defaults.get(name)) if "error" not in value else None
  if packed:  # packed rows' tok/s over the synthetic step's, path by path
    out["packed_over_synthetic"] = packed
  without = (data.get("jax_without_gpu_xla_flags") or {}).get("train base {}") or {}
  if without and "error" not in without:
    levers["train base without GPU_XLA_FLAGS"] = _ratio(rate(without), defaults.get("base"))
  xla = {k[4:]: v.get("train base {}") for k, v in data.items() if k.startswith("xla ")
         and isinstance(v, dict)}
  base_rate = rate(xla.get("defaults") or {}) if xla.get("defaults") else None
  for title, value in xla.items():
    if title != "defaults":
      levers[f"xla: {title}"] = (_ratio(rate(value), base_rate)
                                 if value and "error" not in value else None)
  if levers:
    out["levers_over_defaults"] = levers
  for name in ("real_run_packed", "real_run_bucketed"):
    run_ = data.get(name) or {}
    if not run_.get("steady_target_tokens_per_sec"):
      continue
    quick = data.get("quick")
    over = _ratio(run_["steady_target_tokens_per_sec"], rate(train.get("base")))
    to_steady = run_["seconds_to_steady_state"]
    out[f"{name}_over_synthetic"] = {
        "value": over, "target": REAL_RUN_TARGETS["over_synthetic"],
        "met": None if over is None or quick else over >= REAL_RUN_TARGETS["over_synthetic"]}
    out[f"{name}_seconds_to_steady_state"] = {
        "value": to_steady, "target": REAL_RUN_TARGETS["seconds_to_steady_state"],
        "met": None if quick else to_steady <= REAL_RUN_TARGETS["seconds_to_steady_state"]}
  out["device"] = device.get("kind")
  out["jax"] = device.get("jax")
  agreement = jax_parts.get("packed_layout_agreement")
  if isinstance(agreement, dict) and "error" not in agreement:
    logit_scale = max(1.0, agreement["max_logit"])
    out["packed_layout_agreement"] = {**agreement, "agrees": bool(
        agreement["finite"] and agreement["packed_layout_ran"]
        and agreement["max_logit_difference"] <= LAYOUT_TOLERANCE * logit_scale
        and agreement["max_relative_gradient_difference"] <= LAYOUT_TOLERANCE)}
  out["failed"] = {k: v["error"] for k, v in {**jax_parts, **peers}.items()
                   if isinstance(v, dict) and "error" in v}
  if "error" in jax_parts and isinstance(jax_parts["error"], str):
    out["failed"]["jax"] = jax_parts["error"]
  return out


if __name__ == "__main__":  # the JAX process: python -m t2t_jax.tools.speed_check --spec JSON
  if len(sys.argv) != 3 or sys.argv[1] != "--spec":
    sys.exit("usage: python -m t2t_jax.tools.bench --what=speed_check (this module's own command "
             "line is the check's JAX process)")
  from absl import logging
  from t2t_jax import backend
  backend.apply_xla_flags()  # the trainer's XLA options (none with T2T_JAX_NO_XLA_FLAGS=1)
  logging.set_verbosity(logging.WARNING)
  jax_part(json.loads(sys.argv[2]))
