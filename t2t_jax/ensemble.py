"""Training an ensemble: `ensemble.members` models at once, each on its own cores or GPUs.

On a CPU the step of a small model scales almost linearly with cores (2 cores: 1.9-2.1x one
core, multi30k_ende), so N models on 1/N of the cores each cost the same wall time as one
model on all of them, and decoding with their mean probability is worth more than one model
trained N times as long once a small model has converged. Each member is the ordinary training
command in WORKDIR/member<i>/ (seed `train.seed + i`), run as a subprocess on its share of
the cores or GPUs (`backend.member_shares`), so it resumes, checkpoints, averages and evaluates itself like any run; this
module starts them, relays their output, passes signals on, and decodes with all of them.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import Sequence

from t2t_jax import backend
from t2t_jax.config import ExperimentConfig
from t2t_jax.errors import UserError


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


def member_command(cfg: ExperimentConfig, member_dir: str, index: int, experiment: str,
                   dataset: str | None, sets: Sequence[str]) -> list[str]:
  """The member's own training command: the run's flags, one member, its own seed."""
  return train_command(experiment, member_dir, dataset, [
      *sets, "ensemble.members=1", f"train.seed={cfg.train.seed + index}"])


# Set by the ensemble command for each member: the command's pid.
PARENT_ENV = "T2T_JAX_MEMBER_PARENT"


def setup_member() -> None:
  """In a member, first thing: keep to its share of the host (`backend.member_shares`), and
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


def train_members(cfg: ExperimentConfig, dirs: Sequence[str], experiment: str,
                  dataset: str | None, sets: Sequence[str]) -> bool:
  """Trains every member at once (each resumes if it can); True when all of them finished.

  A SIGTERM or SIGINT (Ctrl-C) is passed on to every member once per signal: the first makes
  each checkpoint after its current step and exit, a second stops them at once, as for one run.
  """
  n = len(dirs)
  shares = backend.member_shares(n)
  if shares is None:
    print(f"warning: fewer cores or GPUs than the {n} members; they share them all", flush=True)
  procs, relays = [], []
  for i, member in enumerate(dirs):
    os.makedirs(member, exist_ok=True)
    cmd = member_command(cfg, member, i, experiment, dataset, sets)
    where, share_env = shares[i] if shares else ("shared devices", {})
    print(f"[member {i}] {where}: {' '.join(shlex.quote(c) for c in ['python'] + cmd[1:])}",
          flush=True)
    proc, relay = start_logged_run(cmd, os.path.join(member, "train.log"), f"[member {i}] ",
                                   share_env)
    procs.append(proc)
    relays.append(relay)

  signalled = []

  def forward(signum, frame):
    signalled.append(signal.Signals(signum).name)
    for proc in procs:
      if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)

  old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
  try:
    codes = [proc.wait() for proc in procs]
  finally:
    for s, handler in old.items():
      signal.signal(s, handler)
    for relay in relays:
      relay.join(timeout=10)
  failed = [(i, c) for i, c in enumerate(codes) if c != 0]
  if failed:
    raise UserError("; ".join(f"member {i} failed with exit code {c} (its log: "
                              f"{os.path.join(dirs[i], 'train.log')})" for i, c in failed))
  if signalled:
    print(f"stopped on {signalled[0]}; resume with: python -m t2t_jax.main "
          + " ".join(shlex.quote(a) for a in sys.argv[1:]), flush=True)
    return False
  return True
