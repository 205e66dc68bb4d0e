r"""The disk a run's kept checkpoints take, before and after older ones keep their parameters
alone: `python -m t2t_jax.tools.checkpoint_disk --experiment=big_ende --out=FILE.json`.

Saves the experiment's training state (its parameters and, standing in for a trained run's
Adam moments, random float32 values of their shapes) the way the end of its run does, through `checkpoints.Checkpointer`, and measures the bytes on
disk under two policies: every checkpoint whole, the newest `average.last` kept (the trainer
before), and the newest `train.keep_checkpoints` whole with the older averaged ones as
parameters alone (the trainer now). Each policy saves `average.last + 2` checkpoints, so
its pruning is in its steady state. Needs about 3 x average.last x the parameters' bytes of
free disk (big: ~55 GB) for a moment.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

from absl import app, flags

flags.DEFINE_string("experiment", "big_ende", "The experiment whose state is saved.")
flags.DEFINE_string("out", None, "The JSON record to write (default: print it).")
flags.DEFINE_string("dir", None, "Where to write the checkpoints (default: a temporary folder).")
FLAGS = flags.FLAGS


def measure(cfg, state, root: str, keep: int, keep_for_average: int) -> dict:
  """Saves `average.last + 2` checkpoints 600 steps apart under one policy; the bytes and
  steps kept, and the seconds per save."""
  from t2t_jax import checkpoints, storage
  workdir = tempfile.mkdtemp(dir=root)
  ckpt = checkpoints.Checkpointer(workdir, keep=keep, keep_for_average=keep_for_average)
  every, seconds = cfg.train.checkpoint_every_steps, []
  for i in range(cfg.average.last + 2):
    start = time.time()
    ckpt.save(cfg.train.steps - every * (cfg.average.last + 1 - i), state)
    seconds.append(time.time() - start)
  ckpt.close()
  folder = os.path.join(workdir, "checkpoints")
  steps = sorted(int(s) for s in os.listdir(folder) if s.isdigit())
  whole = [s for s in steps if os.path.isdir(os.path.join(folder, str(s), checkpoints.TRAINING))]
  out = {"keep_whole": keep, "keep_for_average": keep_for_average, "bytes": storage.walk_bytes(folder),
         "steps_kept": len(steps), "whole": len(whole),
         "median_save_seconds": sorted(seconds)[len(seconds) // 2]}
  shutil.rmtree(workdir)
  return out


def main(argv):
  del argv
  from t2t_jax import model, registry
  from t2t_jax.tools import state_with_dense_moments, write_record
  cfg = registry.get(FLAGS.experiment)
  state = state_with_dense_moments(FLAGS.experiment)
  params = model.count_params(state.params)
  root = FLAGS.dir or tempfile.mkdtemp()
  os.makedirs(root, exist_ok=True)
  before = measure(cfg, state, root, keep=cfg.average.last, keep_for_average=0)
  after = measure(cfg, state, root, keep=cfg.train.keep_checkpoints,
                  keep_for_average=cfg.average.last)
  write_record({"what": "checkpoint_disk", "experiment": FLAGS.experiment,
                "parameters": params, "parameter_bytes": 4 * params,
                "average_last": cfg.average.last, "before": before, "after": after,
                "after_over_before": after["bytes"] / before["bytes"],
                "command": f"python -m t2t_jax.tools.checkpoint_disk "
                           f"--experiment={FLAGS.experiment}"}, FLAGS.out)


if __name__ == "__main__":
  app.run(main)
