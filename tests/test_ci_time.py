"""t2t_jax/tools/ci_time.py: a CI log as .ci/run prints it, read into stages and tests."""

import json
import subprocess
import sys

from t2t_jax.tools import ci_time

from helpers import REPO

# What .ci/run prints, cut short: its clock's lines as each stage ends and again at the end,
# pytest's slowest tests and summary, and the logs of stages run side by side.
LOG = """\
ci commit: 0123456789abcdef0123456789abcdef01234567
Successfully installed t2t_jax-0.1.0
ci stage: install [test]                        14 s
........s.. [100%]
============================= slowest 20 durations =============================
18.80s call     tests/test_train.py::test_dev_bleu[a b]
2.50s setup    tests/test_faults.py::test_corrupt
=========================== short test summary info ============================
620 passed, 72 skipped in 357.28s (0:05:57)
ci stage: README suite                         364 s
---- object_store
============================= slowest 20 durations =============================
40.00s call     tests/test_object_store.py::test_bucket
1 failed, 12 passed, 1 skipped in 300.10s (0:05:00)
---- second_leg
second leg: Python 3.13.1 jax 0.10.9 flax 0.12.8
============================= slowest 20 durations =============================
9.00s call     tests/test_model.py::test_x
266 passed, 30 deselected in 200.00s (0:03:20)
ci stage: object-store, cluster, second leg    500 s

ci stage: install [test]                        14 s
ci stage: README suite                         364 s
ci stage: object-store, cluster, second leg    500 s
ci stage: total                                878 s
"""


def test_a_ci_log_gives_each_stage_its_seconds_and_each_pytest_command_its_stage():
  record = ci_time.parse(LOG)
  assert record["stages"] == [{"name": "install [test]", "seconds": 14},
                              {"name": "README suite", "seconds": 364},
                              {"name": "object-store, cluster, second leg", "seconds": 500}]
  assert record["total_sec"] == 878 and record["commit"] == "0123456789abcdef" * 2 + "01234567"
  suite, bucket, leg = record["pytest"]
  assert suite["stage"] == "README suite" and "part" not in suite
  assert (suite["passed"], suite["skipped"], suite["seconds"]) == (620, 72, 357.28)
  assert suite["slowest"] == [
      {"seconds": 18.8, "phase": "call", "test": "tests/test_train.py::test_dev_bleu[a b]"},
      {"seconds": 2.5, "phase": "setup", "test": "tests/test_faults.py::test_corrupt"}]
  # The side-by-side logs are printed before the clock line that ends their stage.
  assert bucket["part"] == "object_store" and leg["part"] == "second_leg"
  assert bucket["stage"] == leg["stage"] == "object-store, cluster, second leg"
  assert (bucket["failed"], bucket["passed"], bucket["skipped"]) == (1, 12, 1)
  assert leg["deselected"] == 30 and leg["seconds"] == 200.0
  assert [t["seconds"] for t in ci_time.slowest(record, 3)] == [40.0, 18.8, 9.0]


def test_the_command_writes_a_record_with_the_logs_commit_or_says_what_is_wrong(tmp_path):
  log, out = tmp_path / "ci.log", tmp_path / "ci.json"
  log.write_text(LOG)
  cmd = [sys.executable, "-m", "t2t_jax.tools.ci_time", f"--log={log}", f"--out={out}"]
  r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-2000:]
  record = json.loads(out.read_text())
  assert record["commit"] == "0123456789abcdef" * 2 + "01234567"
  assert record["command"] == "bash .ci/run" and record["machine"] and record["date"]
  assert record["slowest20"][0]["test"] == "tests/test_object_store.py::test_bucket"
  (tmp_path / "other.log").write_text("no clock here\n")
  for bad, message in [(tmp_path / "other.log", "has no `ci stage:` line"),
                       (tmp_path / "missing.log", "cannot read")]:
    r = subprocess.run(cmd[:3] + [f"--log={bad}"], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
