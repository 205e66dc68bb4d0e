"""Training runs side by side on one host: each the ordinary training command in its own
workdir, on its share of the cores or GPUs, logging to its own file, its lines relayed to our
console with a prefix. Ensemble members (`ensemble`) and the rows of a sweep
(`tools/sweep.py`) run this way.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Sequence

from t2t_jax import backend


def train_command(experiment: str, workdir: str, dataset: str | None = None,
                  sets: Sequence[str] = ()) -> list[str]:
  """`python -m t2t_jax.main` training `experiment` in `workdir`; `sets` are "key=value"."""
  cmd = [sys.executable, "-m", "t2t_jax.main", f"--experiment={experiment}",
         f"--workdir={workdir}"]
  if dataset:
    cmd.append(f"--dataset={dataset}")
  for item in sets:
    cmd += ["--set", item]
  return cmd


# Set by the ensemble command for each member: the command's pid.
PARENT_ENV = "T2T_JAX_MEMBER_PARENT"


def setup_member() -> None:
  """In a member (of an ensemble, or a sweep row), first thing: keep to its share of the host (`backend.member_shares`), and
  watch the ensemble command: if it dies (SIGKILL, a crash), the member gets one SIGTERM, as
  if passed on, so no orphan trains on: it checkpoints and exits. (The kernel's parent-death signal can arrive once per thread of a
  dying parent, and a second signal stops a run at once, before its checkpoint.)"""
  backend.pin_member()
  parent = os.environ.get(PARENT_ENV)
  if not parent:
    return

  def watch():
    while os.getppid() == int(parent):
      time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)

  threading.Thread(target=watch, name="ensemble-parent-watch", daemon=True).start()


def _relay(proc: subprocess.Popen, log_path: str, offset: int, prefix: str) -> None:
  """Follows a member's log from `offset` and copies its lines, prefixed, to our stdout until
  the member exits. Members write to their log, not to a pipe of ours, so a member outlives
  our death without a broken pipe interrupting its last checkpoint."""
  with open(log_path, "rb") as log:  # bytes: a read may end inside a UTF-8 character
    log.seek(offset)
    partial = b""
    while True:
      done = proc.poll() is not None
      lines = (partial + log.read()).split(b"\n")
      partial = lines.pop()
      for line in (raw.decode("utf-8", errors="replace") for raw in lines):
        # absl/XLA warnings stay in the member's log; the console gets the trainer's lines.
        if not (line[:1] in ("W", "I") and line[1:5].isdigit()):
          sys.stdout.write(prefix + line + "\n")
      sys.stdout.flush()
      if done:
        if partial:
          sys.stdout.write(prefix + partial.decode("utf-8", errors="replace") + "\n")
        return
      time.sleep(0.2)


def start_logged_run(cmd: Sequence[str], log_path: str, prefix: str,
                     share_env: dict[str, str]) -> tuple[subprocess.Popen, threading.Thread]:
  """Starts one of several runs side by side (ensemble members, sweep rows): on its share of
  the host, appending to its own log, whose lines are relayed to our stdout with `prefix`.
  It watches us (PARENT_ENV): if we die, it checkpoints and exits."""
  with open(log_path, "a", encoding="utf-8") as log:
    offset = log.tell()
    env = {**os.environ, PARENT_ENV: str(os.getpid()), **share_env}
    proc = subprocess.Popen(
        list(cmd), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
        # Our own session: a Ctrl-C reaches the runs once, through us, not twice.
        start_new_session=True)
  relay = threading.Thread(target=_relay, args=(proc, log_path, offset, prefix), daemon=True)
  relay.start()
  return proc, relay


def log_file(folder: str) -> str:
  """Where a run's output is streamed: FOLDER/train.log, or, for a folder in a bucket (which
  cannot be appended to), a local file that `keep_log` uploads there when the run ends."""
  from t2t_jax import storage
  return storage.local_log(folder, "train.log")


def keep_log(folder: str, log: str) -> None:
  """A bucket folder's log, streamed locally, added to FOLDER/train.log."""
  from t2t_jax import storage
  if log != os.path.join(folder, "train.log") and os.path.exists(log):
    with open(log, encoding="utf-8", errors="replace") as f:
      storage.append_lines(storage.join(folder, "train.log"), [f.read()])
    os.remove(log)
