"""Training an ensemble: `ensemble.members` models at once, each on its own cores or GPUs.

On a CPU the step of a small model scales almost linearly with cores (2 cores: 1.9-2.1x one
core, multi30k_ende), so N models on 1/N of the cores each cost the same wall time as one
model on all of them, and decoding with their mean probability is worth more than one model
trained N times as long once a small model has converged. Each member is the ordinary training
command in WORKDIR/member<i>/ (seed `train.seed + i`), run as a subprocess on its share of
the cores or GPUs (`backend.member_shares`), so it resumes, checkpoints, averages and
evaluates itself like any run; this module starts them side by side (`side_by_side`), passes
signals on, and decodes with all of them.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from typing import Sequence

from t2t_jax import backend, side_by_side, storage
from t2t_jax.config import ExperimentConfig
from t2t_jax.errors import UserError


def member_command(cfg: ExperimentConfig, member_dir: str, index: int, experiment: str,
                   dataset: str | None, sets: Sequence[str]) -> list[str]:
  """The member's own training command: the run's flags, one member, its own seed."""
  return side_by_side.train_command(experiment, member_dir, dataset, [
      *sets, "ensemble.members=1", f"train.seed={cfg.train.seed + index}"])


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
  procs, relays, logs = [], [], []
  for i, member in enumerate(dirs):
    storage.makedirs(member)
    cmd = member_command(cfg, member, i, experiment, dataset, sets)
    where, share_env = shares[i] if shares else ("shared devices", {})
    print(f"[member {i}] {where}: {' '.join(shlex.quote(c) for c in ['python'] + cmd[1:])}",
          flush=True)
    logs.append(side_by_side.log_file(member))
    proc, relay = side_by_side.start_logged_run(cmd, logs[-1], f"[member {i}] ", share_env)
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
    for member, log in zip(dirs, logs):  # a bucket member's log, streamed locally, goes up
      side_by_side.keep_log(member, log)
  failed = [(i, c) for i, c in enumerate(codes) if c != 0]
  if failed:
    raise UserError("; ".join(f"member {i} failed with exit code {c} (its log: "
                              f"{os.path.join(dirs[i], 'train.log')})" for i, c in failed))
  if signalled:
    print(f"stopped on {signalled[0]}; resume with: python -m t2t_jax.main "
          + " ".join(shlex.quote(a) for a in sys.argv[1:]), flush=True)
    return False
  return True
