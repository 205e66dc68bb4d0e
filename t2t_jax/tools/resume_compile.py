r"""A resume's compiling with and without the persistent compilation cache, from the trainer's
own lines: each way, the demo trains N steps, then the same command resumes it to 2N; the
record holds each command's "compilations: ... s in all" seconds, its launch-to-first-step
seconds (until the trainer's "step 1 ran in" line, or its first step line on a resume), and
whether the resumed losses equal an uninterrupted 2N-step run's.

  python -m t2t_jax.tools.resume_compile --out=results/compilation_cache/demo_cpu.json

One CPU device by default; a GPU's programs are larger and take longer to compile (a base
step 35-41 s on an H200), so the saving there is larger in seconds: measure it there.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any

from absl import app, flags

flags.DEFINE_string("experiment", "demo", "The run to time.")
flags.DEFINE_integer("steps", 40, "Steps of the first command; the resume trains as many again.")
flags.DEFINE_string("out", "", "JSON record.")
FLAGS = flags.FLAGS

QUIET = {"train.final_eval": "false", "train.bleu_every_steps": "0",
         "train.log_every_steps": "10"}
_STEP_LINE = re.compile(r"^step \d+")


def timed_command(workdir: str, steps: int, cache: str) -> dict[str, Any]:
  """One training command: its wall seconds, launch to its first step line, compile seconds."""
  cmd = [sys.executable, "-m", "t2t_jax.main", f"--experiment={FLAGS.experiment}",
         f"--workdir={workdir}", f"--compilation_cache={cache}",
         "--set", f"train.steps={steps}"]
  for key, value in QUIET.items():
    cmd += ["--set", f"{key}={value}"]
  start, first, lines = time.time(), None, []
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  for line in proc.stdout:
    lines.append(line)
    if first is None and _STEP_LINE.match(line):
      first = time.time() - start
  if proc.wait() != 0:
    sys.exit("error: the command failed:\n" + "".join(lines[-20:]))
  compiled = next(l for l in lines if l.startswith("compilations:"))
  return {"wall_sec": round(time.time() - start, 1),
          "launch_to_first_step_sec": None if first is None else round(first, 1),
          "compile_sec": float(re.search(r"([\d.]+)s in all", compiled).group(1)),
          "line": compiled.strip()}


def losses(workdir: str) -> dict[int, float]:
  from t2t_jax.tools import plot
  return {r["step"]: r["loss"] for r in plot.read_metrics(workdir) if "loss" in r}


def main(argv: list[str]) -> None:
  del argv
  from t2t_jax.tools import write_record
  base = tempfile.mkdtemp(prefix="t2t_jax_resume_compile_")
  whole = os.path.join(base, "whole")
  timed_command(whole, 2 * FLAGS.steps, "none")
  record: dict[str, Any] = {"command": "python -m t2t_jax.tools.resume_compile "
                            f"--experiment={FLAGS.experiment} --steps={FLAGS.steps}",
                            "devices": os.environ.get("XLA_FLAGS", "") or "default"}
  for cache in ("none", "auto"):
    workdir = os.path.join(base, cache)
    first = timed_command(workdir, FLAGS.steps, cache)
    resume = timed_command(workdir, 2 * FLAGS.steps, cache)
    record[f"cache_{cache}"] = {"first": first, "resume": resume,
                                "losses_equal_uninterrupted": losses(workdir) == losses(whole)}
  record["resume_compile_none_over_auto"] = round(
      record["cache_none"]["resume"]["compile_sec"] / record["cache_auto"]["resume"]["compile_sec"],
      2)
  write_record(record, FLAGS.out or None)


if __name__ == "__main__":
  app.run(main)
