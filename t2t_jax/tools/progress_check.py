r"""How far the first progress line's speed and ETA are from what the run then did:
`python -m t2t_jax.tools.progress_check --experiment=demo --out=FILE.json`.

Trains the experiment from an empty workdir with the command a user runs, then reads its
metrics.jsonl: the first line's tokens/s against the median of the later lines' (the steady
rate), and the first line's ETA against the time that actually passed from that line to the
last step's. A user judges a new machine by the first line; it is only useful if it already
gives the pace that follows (the compilation before step 1 is not training time).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Sequence

from absl import app, flags

FLAGS = flags.FLAGS


def _define_flags() -> None:
  """Defined when run, not on import: the names are main's too, and the tests import both."""
  flags.DEFINE_string("experiment", "demo", "The experiment to train from an empty workdir.")
  flags.DEFINE_string("workdir", None, "Its workdir (default: a new temporary folder; it "
                      "must hold no run).")
  flags.DEFINE_multi_string("set", [], "KEY=VALUE settings passed to the run.")
  flags.DEFINE_string("out", None, "The JSON record to write (default: print it).")


def first_line_against_the_run(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
  """The progress lines of one uninterrupted run (metrics.jsonl's rows with a tok/s): the
  first line's rate over the median of the later ones', and its ETA over the seconds from
  the first line to the last (the time that was actually left, checkpoints and dev
  evaluations in between included)."""
  lines = [r for r in rows if "tokens_per_sec" in r]
  if len(lines) < 3:
    raise ValueError(f"{len(lines)} progress lines: the run needs at least 3 (its first and "
                     f"two to take a steady rate from)")
  first, later = lines[0], lines[1:]
  steady = statistics.median(r["tokens_per_sec"] for r in later)
  left = lines[-1]["time"] - first["time"]
  return {"first_step": first["step"], "last_step": lines[-1]["step"], "lines": len(lines),
          "first_tokens_per_sec": first["tokens_per_sec"],
          "steady_tokens_per_sec": steady,
          "first_over_steady": first["tokens_per_sec"] / steady,
          "first_eta_sec": first["eta_sec"], "seconds_actually_left": round(left, 1),
          "eta_over_actual": first["eta_sec"] / left if left > 0 else None}


def main(argv):
  del argv
  from t2t_jax.tools import plot, write_record
  workdir = FLAGS.workdir or tempfile.mkdtemp(prefix="t2t_jax_progress_")
  if os.path.exists(os.path.join(workdir, "metrics.jsonl")):
    sys.exit(f"error: {workdir} already holds a run; give an empty --workdir")
  command = [sys.executable, "-m", "t2t_jax.main", f"--experiment={FLAGS.experiment}",
             f"--workdir={workdir}"] + [f"--set={s}" for s in FLAGS.set]
  print("running:", " ".join(command[1:]), flush=True)
  start = time.time()
  r = subprocess.run(command)
  if r.returncode != 0:
    sys.exit(f"error: the run exited with {r.returncode}")
  rows = plot.read_metrics(workdir)
  shown = " ".join(["python -m t2t_jax.main", f"--experiment={FLAGS.experiment}",
                    "--workdir=DIR"] + [f"--set {s}" for s in FLAGS.set])
  write_record({"what": "progress_check", "experiment": FLAGS.experiment,
                "wall_seconds": round(time.time() - start, 1),
                **first_line_against_the_run(rows), "command": shown,
                "tool": "python -m t2t_jax.tools.progress_check"
                        f" --experiment={FLAGS.experiment}"}, FLAGS.out)


if __name__ == "__main__":
  _define_flags()
  app.run(main)
