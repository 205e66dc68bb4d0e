r"""A training checkpoint's save to a bucket beside the same save to local disk:
`python -m t2t_jax.tools.bucket_save --remote=gs://BUCKET/PATH --out=FILE.json`.

Saves the experiment's training state (base_ende's: its parameters and, standing in for a
trained run's Adam moments, random float32 values of their shapes) through the trainer's
`checkpoints.Checkpointer`, `--repeats` times to a local temporary folder and to `--remote`,
alternating, and reports the median seconds of
- a whole save (written and committed, `wait` included): what a bucket costs in bytes/s;
- the save's blocking part with `async_save` (what the training loop waits for before its
  next step; orbax then writes in a background thread).
The bucket is whatever `--remote` reaches: Cloud Storage, or a local server such as
fake-gcs-server (with TENSORSTORE_GCS_HTTP_URL and STORAGE_EMULATOR_HOST pointing at it).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import numpy as np
from absl import app, flags

flags.DEFINE_string("experiment", "base_ende", "The experiment whose state is saved.")
flags.DEFINE_string("remote", None, "A gs:// folder to save into (emptied first).")
flags.DEFINE_integer("repeats", 3, "Saves per place and kind (the median is reported).")
flags.DEFINE_string("out", None, "The JSON record to write (default: print it).")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  import jax
  from t2t_jax import checkpoints, model, optim, registry, storage, train
  from t2t_jax.tools import write_record
  if not FLAGS.remote or not storage.is_remote(FLAGS.remote):
    raise SystemExit("--remote=gs://BUCKET/PATH is required")
  cfg = registry.get(FLAGS.experiment)
  state = jax.device_get(train.init_state(cfg, optim.make_optimizer(cfg)))
  rng = np.random.default_rng(0)
  state = state.replace(opt_state=jax.tree_util.tree_map(
      lambda x: rng.standard_normal(x.shape).astype(x.dtype)
      if np.issubdtype(x.dtype, np.floating) and x.ndim else x, state.opt_state))
  local_root = tempfile.mkdtemp()
  places = {"local": os.path.join(local_root, "run"), "bucket": FLAGS.remote.rstrip("/")}
  times = {f"{place}_{kind}": [] for place in places for kind in ("whole", "blocking")}
  for repeat in range(FLAGS.repeats):
    for place, workdir in places.items():
      for kind in ("whole", "blocking"):
        storage.rmtree(storage.join(workdir, "checkpoints"))
        ckpt = checkpoints.Checkpointer(workdir, keep=2, async_save=kind == "blocking")
        start = time.time()
        ckpt.save(1, state)
        blocking = time.time() - start
        ckpt.wait()
        whole = time.time() - start
        ckpt.close()
        times[f"{place}_{kind}"].append(whole if kind == "whole" else blocking)
  for workdir in places.values():
    storage.rmtree(storage.join(workdir, "checkpoints"))
  shutil.rmtree(local_root, ignore_errors=True)
  median = {k: float(np.median(v)) for k, v in times.items()}
  write_record({"what": "bucket_save", "experiment": FLAGS.experiment,
                "parameters": model.count_params(state.params),
                "median_seconds": median, "all_seconds": times,
                "bucket_over_local_whole": median["bucket_whole"] / median["local_whole"],
                "bucket_blocking_seconds": median["bucket_blocking"],
                "server": os.environ.get("TENSORSTORE_GCS_HTTP_URL", "Cloud Storage"),
                "command": f"python -m t2t_jax.tools.bucket_save --experiment="
                           f"{FLAGS.experiment} --remote=gs://BUCKET/PATH"}, FLAGS.out)


if __name__ == "__main__":
  app.run(main)
