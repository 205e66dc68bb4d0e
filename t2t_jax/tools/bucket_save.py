r"""A training checkpoint's save to a bucket beside the same save to local disk:
`python -m t2t_jax.tools.bucket_save --remote=gs://BUCKET/PATH --out=FILE.json`.

Saves the experiment's training state (base_ende's: its parameters and, standing in for a
trained run's Adam moments, random float32 values of their shapes) through the trainer's
`checkpoints.Checkpointer`, `--repeats` times to a local temporary folder and to `--remote`,
alternating, and reports the median seconds of
- a whole save (written and committed, `wait` included): what a bucket costs in bytes/s;
- the save's blocking part with `async_save` (what the training loop waits for before its
  next step; orbax then writes in a background thread);
- the CPU seconds this process spent on a whole save (all its threads): what the bucket costs
  the training host, apart from waiting on the server.
With `--trainer_runs=N`, it also trains N times into a local workdir and N times into one in
`--remote`, alternating (`python -m t2t_jax.main`, the trainer's own loop, `--experiment`
`--set ...` from `--trainer_set`, a checkpoint every `--trainer_checkpoint_every` steps,
asynchronous as always), and compares the median tokens/s of the trainer's logged windows
after the first (which holds compilation): the steps' pace while orbax writes to a bucket.
On a machine that also runs a local server, give the server and this tool cores of their own
(`taskset`), as Cloud Storage's servers are not on the training host; the record names the
cores this process ran on.
The bucket is whatever `--remote` reaches: Cloud Storage, or a local server such as
fake-gcs-server (with TENSORSTORE_GCS_HTTP_URL and STORAGE_EMULATOR_HOST pointing at it).
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
from absl import app, flags

flags.DEFINE_string("experiment", "base_ende", "The experiment whose state is saved.")
flags.DEFINE_string("remote", None, "A gs:// folder to save into (emptied first).")
flags.DEFINE_integer("repeats", 3, "Saves per place and kind (the median is reported).")
flags.DEFINE_integer("trainer_runs", 0, "Training runs per place (0: none).")
flags.DEFINE_string("trainer_experiment", "demo", "The experiment the trainer runs.")
flags.DEFINE_list("trainer_set", [], "--set overrides for the training runs (KEY=VALUE,...).")
flags.DEFINE_integer("trainer_steps", 80, "Steps per training run.")
flags.DEFINE_integer("trainer_checkpoint_every", 10, "Steps between checkpoints (and logs).")
flags.DEFINE_string("out", None, "The JSON record to write (default: print it).")
FLAGS = flags.FLAGS


def _cpu_seconds() -> float:
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime


def _trainer_tokens_per_sec(workdir: str) -> float:
  """A training run's median logged tokens/s after its first window."""
  from t2t_jax.tools import plot
  subprocess.run(_trainer_cmd(workdir), check=True, stdout=subprocess.DEVNULL)
  rows = [r for r in plot.read_metrics(workdir) if "tokens_per_sec" in r]
  return float(np.median([r["tokens_per_sec"] for r in rows[1:]]))


def _trainer_cmd(workdir: str) -> list[str]:
  every = FLAGS.trainer_checkpoint_every
  return [sys.executable, "-m", "t2t_jax.main", f"--experiment={FLAGS.trainer_experiment}",
         f"--workdir={workdir}", f"--set=train.steps={FLAGS.trainer_steps}",
         f"--set=train.checkpoint_every_steps={every}", f"--set=train.log_every_steps={every}",
         "--set=train.eval_every_steps=1000000000", "--set=train.final_eval=False",
         *[f"--set={kv}" for kv in FLAGS.trainer_set]]


def main(argv):
  del argv
  from t2t_jax import checkpoints, model, storage
  from t2t_jax.tools import state_with_dense_moments, write_record
  if not FLAGS.remote or not FLAGS.remote.startswith(storage.SUPPORTED):
    raise SystemExit("--remote=gs://BUCKET/PATH is required")
  state = state_with_dense_moments(FLAGS.experiment)
  local_root = tempfile.mkdtemp()
  places = {"local": os.path.join(local_root, "run"), "bucket": FLAGS.remote.rstrip("/")}
  times = {f"{place}_{kind}": [] for place in places for kind in ("whole", "blocking", "cpu")}
  for repeat in range(FLAGS.repeats):
    for place, workdir in places.items():
      for kind in ("whole", "blocking"):
        storage.rmtree(storage.join(workdir, "checkpoints"))
        ckpt = checkpoints.Checkpointer(workdir, keep=2, async_save=kind == "blocking")
        cpu, start = _cpu_seconds(), time.time()
        ckpt.save(1, state)
        blocking = time.time() - start
        ckpt.wait()
        whole = time.time() - start
        ckpt.close()
        times[f"{place}_{kind}"].append(whole if kind == "whole" else blocking)
        if kind == "whole":
          times[f"{place}_cpu"].append(_cpu_seconds() - cpu)
  for workdir in places.values():
    storage.rmtree(storage.join(workdir, "checkpoints"))
  trainer = {place: [] for place in places}
  for repeat in range(FLAGS.trainer_runs):
    for place, workdir in places.items():
      run_dir = storage.join(workdir, f"trainer{repeat}")
      trainer[place].append(_trainer_tokens_per_sec(run_dir))
      storage.rmtree(run_dir)
  shutil.rmtree(local_root, ignore_errors=True)
  median = {k: float(np.median(v)) for k, v in times.items()}
  write_record({"what": "bucket_save", "experiment": FLAGS.experiment,
                "parameters": model.count_params(state.params),
                "median_seconds": median, "all_seconds": times,
                "bucket_over_local_whole": median["bucket_whole"] / median["local_whole"],
                "bucket_blocking_seconds": median["bucket_blocking"],
                "bucket_over_local_cpu": median["bucket_cpu"] / median["local_cpu"],
                "client_cpus": sorted(os.sched_getaffinity(0)),
                **({"trainer_tokens_per_sec": trainer,
                    "trainer_bucket_over_local": float(np.median(trainer["bucket"])
                                                       / np.median(trainer["local"])),
                    "trainer_command": " ".join(_trainer_cmd("WORKDIR")[1:])}
                   if FLAGS.trainer_runs else {}),
                "server": os.environ.get("TENSORSTORE_GCS_HTTP_URL", "Cloud Storage"),
                "command": f"python -m t2t_jax.tools.bucket_save --experiment="
                           f"{FLAGS.experiment} --remote=gs://BUCKET/PATH"}, FLAGS.out)


if __name__ == "__main__":
  app.run(main)
