r"""How long CI takes, stage by stage and test by test, read from the output of `.ci/run`:

  bash .ci/run 2>&1 | tee ci.log
  python -m t2t_jax.tools.ci_time --log=ci.log --out=results/ci_time/run.json

The record holds each stage's seconds (the stage clock's `ci stage:` lines), each pytest
command's summary (passed, failed, skipped, seconds) with the stage it ran in, and its slowest
tests (pytest's `--durations`, which .ci/run asks of every pytest command), so that the next
change to the suite or to CI can be compared stage by stage.
"""

from __future__ import annotations

import re
from typing import Any

from absl import app, flags

flags.DEFINE_string("log", None, "The output of `bash .ci/run` (stdout and stderr together).")
flags.DEFINE_string("out", "", "JSON record.")
flags.DEFINE_string("commit", "", "The commit CI ran (default: the log's `ci commit:` line).")
flags.DEFINE_string("note", "", "What a reader should know of this run (the machine's load).")

_STAGE = re.compile(r"^ci stage: (.+?)\s+(\d+) s$")
_COMMIT = re.compile(r"^ci commit: ([0-9a-f]{7,40})$")
_PART = re.compile(r"^---- (\w+)$")  # a log of stages run side by side, printed after them
_DURATION = re.compile(r"^([\d.]+)s (call|setup|teardown)\s+(\S.*)$")
_SUMMARY = re.compile(r"^=*\s*((?:\d+ \w+(?:, )?)+) in ([\d.]+)s")
_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected)")


def parse(text: str) -> dict[str, Any]:
  """{stages: [{name, seconds}], total_sec, commit, pytest: [{stage, part, seconds, passed,
  failed, skipped, slowest: [{seconds, phase, test}]}]} of one CI log. A pytest command's
  output comes before the `ci stage:` line that ends its stage (the clock prints a stage as
  it ends), side-by-side parts too, each named by the `---- NAME` line before its log."""
  stages: dict[str, int] = {}
  runs: list[dict[str, Any]] = []
  commit, part, current, in_durations = None, None, None, False
  for line in text.splitlines():
    line = line.rstrip()
    if m := _COMMIT.match(line):
      commit = m.group(1)
    elif m := _STAGE.match(line):
      stages.setdefault(m.group(1), int(m.group(2)))  # the table at the end repeats them
      for run in runs:
        run.setdefault("stage", m.group(1))
      part, current = None, None
    elif m := _PART.match(line):
      part, current = m.group(1), None
    elif "slowest" in line and "durations" in line:
      current = {"slowest": []}
      if part:
        current["part"] = part
      runs.append(current)
      in_durations = True
    elif in_durations and (m := _DURATION.match(line)):
      current["slowest"].append({"seconds": float(m.group(1)), "phase": m.group(2),
                                 "test": m.group(3)})
    elif (m := _SUMMARY.match(line)) and current is not None:
      counts = {word.rstrip("s") if word.startswith("error") else word: int(n)
                for n, word in _COUNT.findall(m.group(1))}
      current.update(seconds=float(m.group(2)), **counts)
      in_durations = False
    elif line.startswith("="):
      in_durations = False
  total = stages.pop("total", None)
  return {"stages": [{"name": k, "seconds": v} for k, v in stages.items()],
          "total_sec": total, "commit": commit, "pytest": runs}


def slowest(record: dict[str, Any], n: int = 20) -> list[dict[str, Any]]:
  """The n slowest test phases of the whole run, each with its stage."""
  rows = [{**t, "stage": run.get("stage"), **({"part": run["part"]} if "part" in run else {})}
          for run in record["pytest"] for t in run["slowest"]]
  return sorted(rows, key=lambda r: -r["seconds"])[:n]


def main(argv: list[str]) -> None:
  del argv
  import sys
  from t2t_jax.tools import write_record
  if not FLAGS.log:
    sys.exit("error: --log=FILE is required (the output of bash .ci/run)")
  try:
    with open(FLAGS.log, errors="replace") as f:
      record = parse(f.read())
  except OSError as e:
    sys.exit(f"error: cannot read --log={FLAGS.log}: {e.strerror}")
  if not record["stages"]:
    sys.exit(f"error: {FLAGS.log} has no `ci stage:` line: is it the output of .ci/run?")
  logged = record.pop("commit")
  commit = FLAGS.commit or logged
  record = {"command": "bash .ci/run", **record, "slowest20": slowest(record),
            **({"note": FLAGS.note} if FLAGS.note else {})}
  write_record(record, FLAGS.out or None, commit=commit)


FLAGS = flags.FLAGS

if __name__ == "__main__":
  app.run(main)
