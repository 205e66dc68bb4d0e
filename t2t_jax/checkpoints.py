"""Orbax checkpoints: WORKDIR/checkpoints/<step> for training, WORKDIR/averaged for inference.

Orbax writes each checkpoint into a temporary directory and renames it when
complete, so a process killed mid-write leaves the previous checkpoint as the
newest complete one. Training never resumes from the averaged directory.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from t2t_jax.config import DataConfig, ExperimentConfig, ModelConfig


def _abstract(tree: Any) -> Any:
  return jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, tree)


class Checkpointer:
  """Keeps the last `keep` training checkpoints of a workdir."""

  def __init__(self, workdir: str, keep: int, create: bool = True):
    self.directory = os.path.join(os.path.abspath(workdir), "checkpoints")
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=create,
                                             enable_async_checkpointing=False))

  def steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def save(self, step: int, state: Any) -> str:
    """Saves a host copy of `state` as checkpoint `step`; returns its path."""
    self._manager.save(step, args=ocp.args.StandardSave(state), force=True)
    self._manager.wait_until_finished()
    return os.path.join(self.directory, str(step))

  def restore(self, step: int, like: Any) -> Any:
    return self._manager.restore(step, args=ocp.args.StandardRestore(_abstract(like)))

  def restore_latest(self, like: Any) -> tuple[Any, int] | None:
    """The newest checkpoint that restores; a corrupt one is moved aside with a message."""
    for step in reversed(self.steps()):
      try:
        return self.restore(step, like), step
      except Exception as e:  # corrupt or truncated files: fall back to the previous one
        bad = os.path.join(self.directory, str(step))
        aside = os.path.join(os.path.dirname(self.directory), f"corrupt_checkpoint_{step}")
        print(f"warning: checkpoint {bad} could not be restored ({type(e).__name__}); "
              f"moved to {aside}, trying the previous one", file=sys.stderr, flush=True)
        shutil.rmtree(aside, ignore_errors=True)
        shutil.move(bad, aside)
        self._manager.reload()
    return None

  def close(self) -> None:
    self._manager.close()


RUN_INFO = "experiment.json"  # what a workdir was trained with, written when training starts


def recorded_settings(workdir: str) -> tuple[str, dict[str, dict[str, Any]]] | None:
  """The experiment name and the model and data settings a workdir was trained with (as
  dicts), or None before its first run.

  A field added to the configs since that run is absent from its record; its default is
  the old behaviour, so it is filled in.
  """
  path = os.path.join(workdir, RUN_INFO)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    info = json.load(f)
  sections = {"model": ModelConfig, "data": DataConfig}
  return info["experiment"], {key: {**dataclasses.asdict(cls()), **info["config"][key]}
                              for key, cls in sections.items()}


def averaged_dir(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), "averaged")


def average(workdir: str, last: int, like_state: Any) -> tuple[str, list[int]]:
  """Writes the element-wise mean of the last `last` checkpoints' parameters (section 6.1)."""
  if not os.path.isdir(os.path.join(workdir, "checkpoints")):
    raise FileNotFoundError(f"no checkpoints in {os.path.join(workdir, 'checkpoints')}")
  ckpt = Checkpointer(workdir, keep=10**6, create=False)
  steps = ckpt.steps()[-last:]
  if not steps:
    raise FileNotFoundError(f"no checkpoints in {ckpt.directory}")
  total = None
  for step in steps:
    params = ckpt.restore(step, like_state).params
    params = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float64), params)
    total = params if total is None else jax.tree_util.tree_map(np.add, total, params)
  mean = jax.tree_util.tree_map(lambda x: (x / len(steps)).astype(np.float32), total)
  out = averaged_dir(workdir)
  tmp = out + ".tmp"
  shutil.rmtree(tmp, ignore_errors=True)
  with ocp.StandardCheckpointer() as writer:
    writer.save(os.path.join(tmp, "params"), mean)
  with open(os.path.join(tmp, "averaged.json"), "w") as f:
    json.dump({"steps": steps}, f)
  shutil.rmtree(out, ignore_errors=True)
  os.replace(tmp, out)
  ckpt.close()
  return out, steps


def load_params_for_inference(workdir: str, cfg: ExperimentConfig) -> tuple[Any, str] | None:
  """Averaged parameters when they cover the newest checkpoint, else the newest checkpoint's
  (saying so when an older average is passed over); None if neither exists."""
  from t2t_jax import model
  like = model.abstract_params(cfg.model)
  avg = averaged_dir(workdir)
  ckpt = Checkpointer(workdir, keep=10**6, create=False) \
      if os.path.isdir(os.path.join(workdir, "checkpoints")) else None
  newest = ckpt.steps()[-1] if ckpt and ckpt.steps() else None
  try:
    if os.path.exists(os.path.join(avg, "averaged.json")):
      with open(os.path.join(avg, "averaged.json")) as f:
        steps = json.load(f)["steps"]
      if newest is None or newest <= steps[-1]:
        with ocp.StandardCheckpointer() as reader:
          params = reader.restore(os.path.join(avg, "params"), like)
        return params, f"average of checkpoints {steps[0]}..{steps[-1]} ({len(steps)})"
      # A run resumed after averaging: its average would be silently out of date.
      print(f"warning: {avg} averages checkpoints {steps[0]}..{steps[-1]}, but checkpoint "
            f"{newest} is newer; using checkpoint {newest} (run --mode=average to average the "
            f"newest checkpoints)", file=sys.stderr, flush=True)
    if newest is None:
      return None
    step = newest
    restored = ckpt._manager.restore(step, args=ocp.args.StandardRestore())
    params = jax.tree_util.tree_map(np.asarray, restored["params"])
    return params, f"checkpoint {step}"
  finally:
    if ckpt:
      ckpt.close()
