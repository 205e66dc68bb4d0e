"""The training run's bookkeeping, apart from its loop: the workdir's records (what it was
trained with, and the checks on resume), the metrics log, stop requests on signals, the
profiler window, dev BLEU while training, and the loop's own cost counters.

`train.py` keeps the state, the loss, the step and the loop; everything here is what the
loop writes down or checks around them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import signal
import sys
import threading
import time
from typing import Any

import jax

from t2t_jax import checkpoints, input_pipeline, jsonl, model, parallel, storage, workdirs
from t2t_jax.config import (COMPUTE_FIELDS, TRAINING_ONLY_FIELDS, ExperimentConfig,
                            profile_range)
from t2t_jax.errors import UserError


class MetricsLog:
  """WORKDIR/metrics.jsonl (one object per logged step) plus the same scalars for TensorBoard.
  In a bucket, where nothing can be appended, the lines are written at each checkpoint and at
  the end (`flush`, `storage.AppendLog`): a run killed in between resumes from that
  checkpoint and logs the steps after it again, so each step is still there once."""

  def __init__(self, workdir: str, resume_step: int, enabled: bool):
    self.path = os.path.join(workdir, "metrics.jsonl")
    self.enabled = enabled
    self.elapsed_before = 0.0  # training time of earlier (interrupted) runs of this workdir
    if not enabled:
      return
    if storage.exists(self.path):
      # Entries past the resumed step will be logged again; they move to
      # metrics.superseded.jsonl, so that no restart erases any history.
      data = storage.read_bytes(self.path)  # once: in a bucket, each read is a download
      rows = jsonl.parse(data, self.path)
      whole = sum(1 for line in data.splitlines() if line.strip())
      if whole > len(rows):  # torn lines: the file is rewritten below without them
        aside = checkpoints.unused_name(self.path + ".damaged")
        storage.copy(self.path, aside)
        print(f"warning: {self.path} has {whole - len(rows)} line(s) that are not whole JSON "
              f"objects; the file as it was is kept in {aside}", file=sys.stderr, flush=True)
      kept = [r for r in rows if r.get("step", 0) <= resume_step]
      dropped = [r for r in rows if r.get("step", 0) > resume_step]
      # The clock goes on from the last row that has one: a row of dev figures alone (an
      # eval step between log steps) has none, and reading it as 0 restarted the time
      # budget, its cool-down and minute-spaced averaging.
      timed = [r["elapsed_sec"] for r in kept if isinstance(r.get("elapsed_sec"), (int, float))]
      if timed:
        self.elapsed_before = float(timed[-1])
      if dropped:
        storage.append_lines(os.path.join(workdir, "metrics.superseded.jsonl"),
                             [json.dumps(r) + "\n" for r in dropped])
      text = "".join(json.dumps(r) + "\n" for r in kept)
      storage.write_atomic(self.path, text)
    else:
      text = ""
    self.lines = storage.AppendLog(self.path, text)
    self.writer = summary_writer_class()(os.path.join(workdir, "tensorboard"))

  def write(self, step: int, values: dict[str, Any]) -> None:
    """One metrics.jsonl line; numbers also as TensorBoard scalars, strings as text."""
    if not self.enabled:
      return
    self.lines.append([json.dumps({"step": step, **values}) + "\n"])
    for tag, value in values.items():
      if isinstance(value, str):
        self.writer.add_text(tag, value, step)
      elif isinstance(value, (int, float)):
        self.writer.add_scalar(tag, float(value), step)
    self.writer.flush()

  def flush(self) -> None:
    """Every line written so far is in metrics.jsonl (in a bucket, one upload)."""
    if self.enabled:
      self.lines.flush()

  def close(self) -> None:
    if self.enabled:
      self.lines.flush()
      self.writer.close()


def seconds_since_launch() -> float | None:
  """Seconds since this process started (Linux; None elsewhere), re-executions included: the
  real-run check on an H200 found 45 s between launch and the first compilation, which the
  trainer's own clock, started later, did not show."""
  try:
    with open("/proc/self/stat") as f:
      started = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: start, clock ticks
    with open("/proc/uptime") as f:
      uptime = float(f.read().split()[0])
    return max(0.0, uptime - started / os.sysconf("SC_CLK_TCK"))
  except (OSError, ValueError, IndexError):
    return None


class StartUp:
  """Seconds since the process's launch at the end of each stage of a run's start-up
  (Linux; nothing elsewhere), for the compile line and metrics.jsonl: on an H200 45 s went
  before the first compilation, and nothing said where."""

  def __init__(self):
    self.ends: dict[str, float] = {}

  def mark(self, stage: str) -> None:
    age = seconds_since_launch()
    if age is not None:
      self.ends[stage] = age

  def seconds(self) -> dict[str, float]:
    """Each stage's own seconds, in order."""
    out, before = {}, 0.0
    for stage, end in self.ends.items():
      out[stage], before = round(end - before, 1), end
    return out

  def text(self) -> str:
    return ", ".join(f"{stage} {sec:.1f}" for stage, sec in self.seconds().items())


def fmt_time(seconds: float) -> str:
  seconds = int(seconds)
  h, m, s = seconds // 3600, seconds // 60 % 60, seconds % 60
  return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def check_run_info(cfg: ExperimentConfig, workdir: str, training: bool = True,
                   reads_data: bool = True) -> None:
  """Refuses a workdir trained with another experiment, model shape, data or vocabulary.

  How the model computes (`COMPUTE_FIELDS`: dtype, implementation, fused attention) may
  differ in any mode; when not `training` (eval, translate, attention), so may what only
  training uses (`TRAINING_ONLY_FIELDS`: dropout, label smoothing); when the mode does not
  `reads_data` (translate, score, export, attention, average read only the workdir, its
  own vocabulary included), so may the data settings.
  """
  found = workdirs.recorded_settings(workdir)
  if found is None:
    return
  experiment, recorded = found
  if experiment != cfg.name:
    raise UserError(f"{workdir} was trained with experiment {experiment!r}, not "
                    f"{cfg.name!r}; use another --workdir")
  free = {"model": COMPUTE_FIELDS + (() if training else TRAINING_ONLY_FIELDS)}
  for key, old in recorded.items():
    if key == "data" and not reads_data:
      continue
    new = dataclasses.asdict(getattr(cfg, key))
    diff = sorted(k for k in new if old.get(k) != new[k] and k not in free.get(key, ()))
    if diff:
      raise UserError(f"{workdir} was trained with different {key} settings "
                      f"({', '.join(f'{key}.{k}' for k in diff)}) than asked for; "
                      f"use another --workdir")


def shape_differences(cfg: ExperimentConfig, workdir: str) -> list[str]:
  """The `model.*` keys whose values in `cfg` give other parameter shapes than `workdir`'s
  run had (empty when it has no record)."""
  found = workdirs.recorded_settings(workdir)
  if found is None:
    return []
  old, new = found[1]["model"], dataclasses.asdict(cfg.model)
  ignored = COMPUTE_FIELDS + TRAINING_ONLY_FIELDS
  return [f"model.{k}" for k in sorted(new) if k not in ignored and old.get(k) != new[k]]


def with_recorded_vocabulary(cfg: ExperimentConfig, workdir: str) -> ExperimentConfig:
  """`cfg` with the workdir's recorded `data.vocab_from` when the command gives none (a
  fine-tuned run's later commands need not repeat its `train.init_from`)."""
  found = workdirs.recorded_settings(workdir)
  recorded = found[1]["data"].get("vocab_from", "") if found else ""
  if recorded and not cfg.data.vocab_from:
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, vocab_from=recorded))
  return cfg


def with_compute_dtype(cfg: ExperimentConfig, workdir: str) -> ExperimentConfig:
  """`cfg` with `model.dtype=auto` resolved: the dtype the workdir's run trained in once it
  has a committed checkpoint (a resumed run keeps its arithmetic on whatever machine resumes
  it, and eval, translate and score compute as it trained and was finally evaluated), else
  the backend's (`backend.compute_dtype`): a first run that ended before its first
  checkpoint pins nothing."""
  from t2t_jax import backend
  if cfg.model.dtype != "auto":
    return cfg
  dtype = workdirs.Workdir(workdir).trained_dtype or backend.compute_dtype("auto")
  return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dtype=dtype))


def _with_recorded(cfg: ExperimentConfig, workdir: str, section: str,
                   leave: tuple[str, ...] = ()) -> ExperimentConfig:
  """`cfg` with `section`'s settings as the workdir was trained with them, `leave` aside."""
  found = workdirs.recorded_settings(workdir)
  if found is None:
    return cfg
  current = getattr(cfg, section)
  known = {f.name for f in dataclasses.fields(current)} - set(leave)
  recorded = {k: v for k, v in found[1][section].items() if k in known}
  return dataclasses.replace(cfg, **{section: dataclasses.replace(current, **recorded)})


def with_recorded_model(cfg: ExperimentConfig, workdir: str) -> ExperimentConfig:
  """`cfg` with the model the workdir was trained with, how it computes aside (for a command
  on a trained run that gives no `model.*` setting: a run trained with `--set model.*` is
  evaluated, averaged or translated without repeating them)."""
  return _with_recorded(cfg, workdir, "model", leave=COMPUTE_FIELDS)


def with_recorded_data(cfg: ExperimentConfig, workdir: str) -> ExperimentConfig:
  """`cfg` with the data settings the workdir was trained with (for a command that gives
  none: a fine-tuned run's later commands need not repeat its `--dataset`)."""
  return _with_recorded(cfg, workdir, "data")


def with_recorded_average(cfg: ExperimentConfig, workdir: str) -> ExperimentConfig:
  """`cfg` with the averaging settings the workdir was trained with (for a command that
  gives none: training kept `average.last` checkpoints for averaging, and a run trained with
  `--set average.last=N` is averaged and evaluated without repeating it)."""
  recorded = workdirs.recorded_config(workdir)
  return cfg if recorded is None else dataclasses.replace(cfg, average=recorded.average)


def check_init_from(cfg: ExperimentConfig) -> None:
  """`train.init_from` names a trained run of the same parameter shapes."""
  source = cfg.train.init_from
  if not storage.isdir(os.path.join(source, "checkpoints")) and not storage.isdir(
      workdirs.averaged_dir(source)):
    raise UserError(f"train.init_from: {source} holds no checkpoints")
  differ = shape_differences(cfg, source)
  if differ:
    raise UserError(f"train.init_from: {source} has other parameter shapes "
                    f"({', '.join(differ)}) than this run; fine-tuning keeps the shapes")


def check_init_vocabulary(source: str, cache_dir: str) -> None:
  """The run's token ids must mean the pieces `source` was trained on."""
  theirs = os.path.join(source, input_pipeline.WORKDIR_VOCAB)
  if not storage.exists(theirs):
    raise UserError(f"train.init_from: {source} has no {input_pipeline.WORKDIR_VOCAB}")
  ours = os.path.join(cache_dir, "spm.model")
  if input_pipeline.file_sha256(theirs) != input_pipeline.file_sha256(ours):
    raise UserError(f"train.init_from: {source} was trained with another vocabulary than "
                    f"this run's data uses ({ours}); fine-tuning needs the same one: leave "
                    f"data.vocab_from unset, or set it to {source}")


# TrainConfig fields that change the optimiser updates a resumed run takes: changing one on
# resume is allowed, but the run is then no longer the one an uninterrupted run would be.
# (`train.steps` is not one: without a cooldown, training longer takes the same updates.)
UPDATE_FIELDS = ("seed", "tokens_per_step", "learning_rate_scale", "warmup_steps", "adam_b1",
                 "adam_b2", "adam_eps", "cooldown_steps", "cooldown_minutes")


def config_fingerprint(cfg: ExperimentConfig) -> int:
  """A 31-bit hash of the whole config: the processes of one job must all run the same one."""
  import hashlib
  text = json.dumps(dataclasses.asdict(cfg), sort_keys=True, default=str)
  return int(hashlib.sha256(text.encode()).hexdigest()[:7], 16)


def has_checkpoints(workdir: str) -> bool:
  """The workdir holds a committed checkpoint (`workdirs.committed_steps`)."""
  return workdirs.Workdir(workdir).trained


def write_run_info(cfg: ExperimentConfig, workdir: str, restored: bool = False) -> bool:
  """Records what the workdir is trained with. A later run of another model or data is
  refused, unless the workdir has no checkpoint yet: a first run that failed before its
  first checkpoint (in data preparation, say) pins nothing. A resumed run that changes how
  the updates are made (`UPDATE_FIELDS`) is warned, and the record keeps each change in
  its `history`.

  A workdir with checkpoints but no readable record (deleted, or a copy made without it; a
  damaged one is first moved aside, never deleted) is recorded only once its checkpoints
  have `restored` into this command's model: False until then."""
  path = os.path.join(workdir, workdirs.RUN_INFO)
  history = []
  damaged = workdirs.damaged_run_info(workdir)
  if damaged:
    aside = checkpoints.unused_name(path + ".damaged")
    storage.move(path, aside)
    print(f"warning: {path} is damaged ({damaged}); moved to {aside}. The checkpoints "
          f"decide: this command's settings are recorded again if they restore into its "
          f"model", file=sys.stderr, flush=True)
  resumed = has_checkpoints(workdir)
  if resumed and not storage.exists(path):
    if not restored:
      return False
    print(f"note: {path} was missing; the checkpoints restored into this command's model, so "
          f"its settings are recorded there again", file=sys.stderr, flush=True)
  elif resumed:
    check_run_info(cfg, workdir)
    old = workdirs.run_info(workdir)  # read by `check_run_info` just before: no download
    history = old.get("history", [])
    before = old["config"].get("train", {})
    changed = {k: [before.get(k), getattr(cfg.train, k)] for k in UPDATE_FIELDS
               if k in before and before[k] != getattr(cfg.train, k)}
    if changed:
      print(f"warning: resuming with other training settings "
            f"({', '.join(f'train.{k}: {a} -> {b}' for k, (a, b) in changed.items())}); the "
            f"updates from here differ from an uninterrupted run's", file=sys.stderr,
            flush=True)
      step = max(int(d) for d in storage.listdir(os.path.join(workdir, "checkpoints"))
                 if d.isdigit())
      history.append({"from_step": step, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                      "changed": {f"train.{k}": v for k, v in changed.items()}})
  storage.write_atomic(path, json.dumps({"experiment": cfg.name,
                                         "config": dataclasses.asdict(cfg),
                                         **({"history": history} if history else {})},
                                        indent=2))
  return True


def checkpoint_bytes(cfg: ExperimentConfig) -> int:
  """Bytes of one training checkpoint: float32 parameters plus Adam's two moments."""
  return 3 * 4 * model.param_count(cfg.model)


def kept_checkpoint_bytes(cfg: ExperimentConfig) -> int:
  """Bytes of a run's checkpoints at their most: `train.keep_checkpoints` whole ones and one
  being written, plus the averaged ones' parameters (a third of a whole checkpoint each)."""
  one = checkpoint_bytes(cfg)
  return (cfg.train.keep_checkpoints + 1) * one + cfg.average.last * one // 3


def summary_writer_class() -> type:
  """tensorboardX's public SummaryWriter: scalars and text, no TensorFlow (clu's writer and
  TensorBoard's own Writer import TensorFlow when it is installed: 3-4 s of every start).
  Loaded without PyTorch too: where torch is installed (the [hf] extra) tensorboardX's writer
  imports it, only to accept torch tensors, which no run logs (1.3 s of every start on 2
  CPU cores). A process that has imported torch already keeps it."""
  if "torch" in sys.modules:
    from tensorboardX import SummaryWriter
    return SummaryWriter
  sys.modules["torch"] = None  # `import torch` raises ImportError while tensorboardX loads
  try:
    from tensorboardX import SummaryWriter
  finally:
    if sys.modules.get("torch", 0) is None:
      del sys.modules["torch"]
  return SummaryWriter


def check_workdir(cfg: ExperimentConfig, workdir: str) -> None:
  """Fails early, before any work, if the workdir cannot hold the run's checkpoints."""
  import shutil
  created = not storage.exists(workdir)
  try:
    storage.makedirs(workdir)
    # Unique across hosts too: containers often run as PID 1 on every host of a job.
    import uuid
    probe = os.path.join(workdir, f".write_test.{os.getpid()}.{uuid.uuid4().hex}")
    storage.write_atomic(probe, "ok")
    storage.remove(probe)
  except OSError as e:
    raise UserError(f"cannot write to workdir {workdir}: {e.strerror or e}") from None
  free = storage.free_bytes(workdir)
  if free is None:
    return  # a bucket has no free space to check
  one = checkpoint_bytes(cfg)
  if free < 2 * one:  # the checkpoint being written next to the newest complete one
    if created:
      shutil.rmtree(workdir, ignore_errors=True)
    raise UserError(f"not enough free disk space in {workdir}: {free / 1e6:,.1f} MB free, "
                    f"each checkpoint needs {one / 1e6:,.1f} MB and two must fit")
  wanted = kept_checkpoint_bytes(cfg)
  if free < wanted:
    print(f"warning: {free / 1e6:,.0f} MB free in {workdir}; the run's checkpoints need "
          f"about {wanted / 1e6:,.0f} MB", file=sys.stderr, flush=True)


@contextlib.contextmanager
def checkpoint_errors(ckpt: checkpoints.Checkpointer, step: int):
  """A checkpoint write that fails (now, or in the background) as a one-line error."""
  try:
    yield
  except (OSError, ValueError) as e:
    # orbax reports a full disk as a ValueError ("RESOURCE_EXHAUSTED ... Failed writing").
    full = (isinstance(e, OSError) and e.errno == errno.ENOSPC) or any(
        marker in str(e) for marker in ("RESOURCE_EXHAUSTED", "No space left on device"))
    if not (full or isinstance(e, OSError)):
      raise
    good = [s for s in ckpt.steps() if s != step]
    reason = "disk full" if full else (e.strerror or str(e))
    raise UserError(f"could not write checkpoint {step} in {ckpt.directory}: {reason}; the "
                    f"newest complete checkpoint is {good[-1] if good else 'none'}") from None


class Profiler:
  """`train.profile_steps=START:END`: a jax.profiler trace of those optimiser steps, in
  WORKDIR/profile. It starts before step START is dispatched and stops once step END has run
  on the devices, so the trace holds whole steps with the host work between them."""

  def __init__(self, spec: str, workdir: str, start_step: int):
    self.range = profile_range(spec)
    self.directory = os.path.join(workdir, "profile")
    self.active = False
    if self.range and self.range[1] <= start_step:
      print(f"note: train.profile_steps={spec} are before the resumed step {start_step}; "
            f"no trace", flush=True)
      self.range = None

  def before(self, step: int) -> None:
    if self.range and step == max(self.range[0], 1) and not self.active:
      jax.profiler.start_trace(self.directory)
      self.active = True

  def after(self, step: int, state: Any) -> None:
    if self.active and step >= self.range[1]:
      self.stop(state)

  def stop(self, state: Any) -> None:
    jax.block_until_ready(state)
    jax.profiler.stop_trace()
    self.active = False
    print(f"profile of steps {self.range[0]}..{self.range[1]} written to {self.directory}",
          flush=True)


class DevBleu:
  """`train.bleu_every_steps`: the first `train.bleu_sentences` dev sentences translated with
  the current parameters; their score (the task's: sacreBLEU, or a parser's EVALB F1 as
  `dev_f1`) and three samples, for the log.

  One decoder is built once; each call hands it a host copy of the parameters placed on this
  process's devices, so a multi-process job decodes on process 0 alone, with no collective.
  Its batches keep their rows until their slowest sentence ends, so that the
  trainer can compile all of its search before step 1 (`BeamDecoder.compile_ahead`):
  shrinking batches would meet shapes that depend on the parameters of the moment.
  """

  SAMPLES = 3

  def __init__(self, cfg: ExperimentConfig, ds: input_pipeline.Dataset, params: Any):
    from t2t_jax import decode, tasks
    t = cfg.train
    self.task = tasks.for_config(cfg)
    sources, refs = ds.raw(cfg.data.dev_split)
    self.sources, self.refs = sources[:t.bleu_sentences], refs[:t.bleu_sentences]
    decode_cfg = dataclasses.replace(cfg.decode, beam_size=t.bleu_beam_size, mbr=False)
    self.decoder = decode.BeamDecoder(params, cfg.model, decode_cfg, ds.vocab,
                                      max_input_length=min(cfg.data.max_length,
                                                           cfg.model.max_len), shrink=False,
                                      constraint=self.task.search_constraint(cfg, ds.vocab))
    self.search = "greedy" if t.bleu_beam_size == 1 else f"beam {t.bleu_beam_size}"

  def place(self, replicated_params: Any) -> None:
    """The trainer's parameters, copied onto this process's devices for the decoder."""
    self.decoder.params = parallel.replicate(parallel.unreplicate(replicated_params),
                                             len(self.decoder.devices), local_only=True)

  def __call__(self, replicated_params: Any) -> dict[str, Any]:
    self.place(replicated_params)
    start = time.time()
    hyps = self.decoder.translate(self.sources)
    score = self.task.dev_score(self.sources, hyps, self.refs)
    shown = [self.task.output(s, h) for s, h in zip(self.sources[:self.SAMPLES], hyps)]
    samples = "\n\n".join(f"source: {s}  \noutput: {h}  \nreference: {r}" for s, h, r in
                           zip(self.sources, shown, self.refs))
    return {f"dev_{self.task.metric}": round(score, 2),
            "dev_bleu_seconds": round(time.time() - start, 2), "dev_samples": samples}


class StopRequest:
  """SIGTERM/SIGINT become a request to stop after the current step (preemption notices).

  A second signal interrupts at once (KeyboardInterrupt); checkpoints stay
  consistent because orbax renames a checkpoint into place only when complete.
  """

  def __init__(self):
    self.signal_name: str | None = None
    self._previous = {}

  def _handle(self, signum, frame):
    del frame
    if self.signal_name is not None:
      raise KeyboardInterrupt
    self.signal_name = signal.Signals(signum).name
    print(f"\nreceived {self.signal_name}: finishing the current step and saving a checkpoint "
          f"(send it again to stop at once)", file=sys.stderr, flush=True)

  def __enter__(self) -> "StopRequest":
    for sig in (signal.SIGTERM, signal.SIGINT):
      self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


_UNCOUNTED = threading.local()


@contextlib.contextmanager
def uncounted_compilations():
  """Compilations in this thread while open are not the loop's: no CompileCounter counts
  them (a new run's parameters, initialised while its steps compile)."""
  _UNCOUNTED.on = True
  try:
    yield
  finally:
    _UNCOUNTED.on = False


class CompileCounter:
  """Counts XLA compilations in this process while open (a `with` block), but for those
  of threads in `uncounted_compilations`."""

  EVENT = "/jax/core/compile/backend_compile_duration"

  def __init__(self):
    self.count = 0
    self.seconds = 0.0  # summed over compilations (those run side by side add up)

  def _on_event(self, event: str, duration_secs: float, **kwargs) -> None:
    del kwargs
    if event == self.EVENT and not getattr(_UNCOUNTED, "on", False):
      self.count += 1
      self.seconds += duration_secs

  def __enter__(self) -> "CompileCounter":
    jax.monitoring.register_event_duration_secs_listener(self._on_event)
    return self

  def __exit__(self, *exc) -> None:
    jax.monitoring.unregister_event_duration_listener(self._on_event)


@dataclasses.dataclass
class LoopStats:
  """What the training loop itself costs, per log window (the `host_*` fields of
  metrics.jsonl) and over the run (`compiles_after_warmup`).

  Host time is CPU time: the loop's own thread outside evaluation and checkpointing, plus
  the input thread's batch assembly and placement. Waiting for the devices is not host
  work, so a GPU or TPU hides this cost only if it stays well under the device's step.
  """
  steps: int = 0
  loop_cpu_sec: float = 0.0
  compiles_after_warmup: int = 0
  compiled_ahead: int = 0  # programs compiled before the first step (train.StepPrograms)
  # Of a multi-process job's steps, compiled before step 1 for their memory plans alone (the
  # loop's calls compile them again, from the persistent compilation cache).
  planned_ahead: int = 0
  steps_ahead: bool = False  # the loop's train and eval steps run programs compiled ahead
  # Start-up, for the record: seconds from the process's launch to the compilation before
  # step 1, that compilation's wall time, and the largest device memory plan among its
  # programs (train.check_device_memory; GPU and TPU only).
  launch_to_compiling_sec: float | None = None
  startup_sec: dict[str, float] | None = None  # its stages (StartUp.seconds)
  compile_ahead_sec: float | None = None
  largest_plan_bytes: int | None = None
  _input_before: tuple[float, float] = (0.0, 0.0)  # the prefetcher's totals at the last window

  def window(self, wall_sec: float, batches: parallel.Prefetcher, compiles: "CompileCounter"
             ) -> dict[str, float]:
    """The log line's figures, then a new window (compilations are counted over the run)."""
    steps = max(self.steps, 1)
    input_cpu, input_wait = (now - before for now, before in
                             zip((batches.cpu_sec, batches.wait_sec), self._input_before))
    out = {"host_ms_per_step": round(1e3 * (self.loop_cpu_sec + input_cpu) / steps, 3),
           "host_input_ms_per_step": round(1e3 * input_cpu / steps, 3),
           "input_wait_fraction": round(input_wait / max(wall_sec, 1e-9), 4),
           "compiles": compiles.count, "compiled_ahead": self.compiled_ahead,
           **({"planned_ahead": self.planned_ahead} if self.planned_ahead else {}),
           "compile_seconds": round(compiles.seconds, 3),
           "compiles_after_warmup": self.compiles_after_warmup}
    out.update({k: v for k, v in (("launch_to_compiling_sec", self.launch_to_compiling_sec),
                                  ("startup_sec", self.startup_sec),
                                  ("compile_ahead_sec", self.compile_ahead_sec),
                                  ("largest_plan_bytes", self.largest_plan_bytes))
                if v is not None})
    self.steps, self.loop_cpu_sec = 0, 0.0
    self._input_before = (batches.cpu_sec, batches.wait_sec)
    return out
