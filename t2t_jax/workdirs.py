"""A workdir and what it says about its run, local or in a bucket: the record of the
settings it was trained with (experiment.json), its committed checkpoints, its average and
its vocabulary. Every mode asks a `Workdir` these questions; the files' local-or-bucket
difference is the storage seam's (`t2t_jax.storage`).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
from typing import Any

from t2t_jax import storage
from t2t_jax.config import DataConfig, ExperimentConfig, ModelConfig

VOCABULARY = "spm.model"  # the run's SentencePiece model, copied in when training starts
# Present while the run's training was stopped by a signal before its end (a time limit, a
# preemption): what a batch script asks to requeue itself (launch/slurm_gpu.sbatch).
STOPPED = "stopped.json"


COMMIT_MARKER = "commit_success.txt"


def committed_steps(workdir: str) -> list[int]:
  """The steps of WORKDIR/checkpoints that orbax committed, from a listing alone. Locally a
  checkpoint is written under a temporary name and renamed when whole; in a bucket it is
  written in place, and only its commit marker, written last, says it is whole: a step folder
  without one is a write that was killed, not a checkpoint."""
  directory = storage.join(storage.normalize(workdir), "checkpoints")
  if not storage.isdir(directory):
    return []
  return sorted(int(d) for d in storage.listdir(directory)
                if d.isdigit() and storage.is_whole(storage.join(directory, d), COMMIT_MARKER))


def averaged_dir(workdir: str) -> str:
  return storage.join(storage.normalize(workdir), "averaged")


def first_line(error: Exception) -> str:
  text = str(error).strip()
  return text.splitlines()[0][:300] if text else type(error).__name__


RUN_INFO = "experiment.json"  # what a workdir was trained with, written when training starts


def _read_run_info(workdir: str) -> tuple[dict[str, Any] | None, str | None]:
  """(WORKDIR/experiment.json, None), or (None, why it cannot be used) when it is damaged
  (truncated, not JSON, or missing its fields), or (None, None) when there is none.

  Many parts of a command ask (the workdir check, the dtype, the vocabulary, the
  translator); the file is read once per version of it: in a bucket each read is a
  download. A rewrite (a new size or time) is read again."""
  path = storage.join(workdir, RUN_INFO)
  if not storage.exists(path):
    return None, None
  info, damaged = _parsed_run_info(path, storage.stamp(path))
  return copy.deepcopy(info), damaged


@functools.lru_cache(maxsize=16)
def _parsed_run_info(path: str, stamp: str) -> tuple[dict[str, Any] | None, str | None]:
  """`_read_run_info` of the file at `path` as it is at `stamp` (a pure function of both)."""
  del stamp  # the cache's key only
  try:
    info = json.loads(storage.read_text(path))
    if not isinstance(info, dict) or not isinstance(info.get("experiment"), str) or not all(
        isinstance(info.get("config", {}).get(k), dict) for k in ("model", "data")):
      raise ValueError("not the record of a training run")
  except (OSError, ValueError) as e:
    return None, f"{type(e).__name__}: {first_line(e)}"
  return info, None


def run_info(workdir: str) -> dict[str, Any] | None:
  """WORKDIR/experiment.json as written when training started, or None before that (or
  when it is damaged: `damaged_run_info` says why; the command's settings stand in)."""
  return _read_run_info(workdir)[0]


def damaged_run_info(workdir: str) -> str | None:
  """Why WORKDIR/experiment.json cannot be read, or None if it reads (or is absent)."""
  return _read_run_info(workdir)[1]


def recorded_settings(workdir: str) -> tuple[str, dict[str, dict[str, Any]]] | None:
  """The experiment name and the model and data settings a workdir was trained with (as
  dicts), or None before its first run.

  A field added to the configs since that run is absent from its record; its default is
  the old behaviour, so it is filled in.
  """
  info = run_info(workdir)
  if info is None:
    return None
  sections = {"model": ModelConfig, "data": DataConfig}
  return info["experiment"], {key: {**dataclasses.asdict(cls()), **info["config"][key]}
                              for key, cls in sections.items()}


def recorded_config(workdir: str) -> ExperimentConfig | None:
  """The whole config a workdir was trained with (fields added since filled with their
  defaults, fields since removed ignored), or None before its first run."""
  info = run_info(workdir)
  if info is None:
    return None
  sections = {}
  for field in dataclasses.fields(ExperimentConfig):
    value = info["config"].get(field.name)
    if isinstance(value, dict):
      cls = type(getattr(ExperimentConfig(), field.name))
      known = {f.name for f in dataclasses.fields(cls)}
      value = cls(**{k: v for k, v in value.items() if k in known})
    if value is not None:
      sections[field.name] = value
  return ExperimentConfig(**sections)


@dataclasses.dataclass(frozen=True)
class Workdir:
  """One run's folder, asked what the run is. Its record is read once per command (once per
  version of the file: `run_info`), however many parts of the command ask."""
  path: str

  @property
  def record(self) -> dict[str, Any] | None:
    return run_info(self.path)

  @property
  def damaged(self) -> str | None:
    """Why the record cannot be read, or None."""
    return damaged_run_info(self.path)

  @property
  def settings(self) -> tuple[str, dict[str, dict[str, Any]]] | None:
    return recorded_settings(self.path)

  @property
  def config(self) -> ExperimentConfig | None:
    return recorded_config(self.path)

  def committed_steps(self) -> list[int]:
    return committed_steps(self.path)

  @property
  def trained(self) -> bool:
    """It holds a committed checkpoint: a first run that died before one pins nothing."""
    return bool(self.committed_steps())

  @property
  def trained_dtype(self) -> str | None:
    """The dtype its run computed in, once that run has a committed checkpoint."""
    dtype = (self.settings[1]["model"].get("dtype")
             if self.trained and self.settings else None)
    return dtype if dtype in ("float32", "bfloat16") else None

  @property
  def vocabulary(self) -> str:
    return storage.join(self.path, VOCABULARY)

  @property
  def averaged(self) -> str:
    return averaged_dir(self.path)

  @property
  def stopped(self) -> str:
    return storage.join(self.path, STOPPED)

  def mark_stopped(self, signal_name: str, resume: str) -> None:
    """Training stopped on `signal_name` before its end; `resume` is the command that
    finishes it."""
    import time
    storage.write_atomic(self.stopped, json.dumps(
        {"signal": signal_name, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
         "resume": resume}) + "\n")

  def clear_stopped(self) -> None:
    if storage.exists(self.stopped):
      storage.remove(self.stopped)
