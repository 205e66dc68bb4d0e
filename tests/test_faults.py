"""Fault injection: the real command in a subprocess, a fault injected, the outcome checked.

Each interrupted run is resumed and its final parameters and logged losses
compared, bit for bit, with one uninterrupted reference run. Signal times are
random; set T2T_JAX_FAULT_SEED to replay a failing trial (the seed is printed).
"""

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from t2t_jax import checkpoints, optim, registry, train
from t2t_jax.config import override

from helpers import FAST_DATA, REPO, TINY_MODEL, cpu_devices, main_command

ENV = {**os.environ, "XLA_FLAGS": cpu_devices(2)}
STEPS = 30
SETS = {**TINY_MODEL, **FAST_DATA, "model.dropout": 0.1,
        "train.steps": STEPS, "train.checkpoint_every_steps": 10, "train.log_every_steps": 5,
        "train.eval_every_steps": 1000, "train.tokens_per_step": 512,
        "train.max_tokens_per_batch": 512, "train.keep_checkpoints": 10,
        "train.final_eval": False}
SEED = int(os.environ.get("T2T_JAX_FAULT_SEED", time.time_ns() % 100000))


def _cmd(workdir, mode="train", experiment="demo", **changes):
  return main_command(workdir, mode, experiment, {**SETS, **changes})


def _run(workdir, mode="train", **changes):
  return subprocess.run(_cmd(workdir, mode, **changes), cwd=REPO, env=ENV, capture_output=True,
                        text=True, timeout=600)


def _cfg():
  return override(registry.get("demo"), SETS)


def _final(workdir):
  """(params, step) of the newest checkpoint, and the logged losses."""
  cfg = _cfg()
  ckpt = checkpoints.Checkpointer(str(workdir), keep=100, create=False)
  state, step = ckpt.restore_latest(train.init_state(cfg, optim.make_optimizer(cfg)))
  ckpt.close()
  with open(Path(workdir) / "metrics.jsonl") as f:
    losses = {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r}
  return state.params, step, losses


def _assert_same_run(workdir, reference):
  params, step, losses = _final(workdir)
  ref_params, ref_step, ref_losses = reference
  assert step == ref_step == STEPS
  for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(ref_params)):
    np.testing.assert_array_equal(a, b)
  assert losses == ref_losses


def _ckpt_steps(workdir):
  d = Path(workdir) / "checkpoints"
  return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.is_dir() else []


def _snapshot(path):
  path = Path(path)
  if not path.exists():
    return None
  return {str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns)
          for p in path.rglob("*")}


def _one_line_error(r, message):
  assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
  assert "Traceback" not in r.stderr
  errors = [l for l in r.stderr.splitlines() if l.startswith("error: ")]
  assert len(errors) == 1, r.stderr[-2000:]
  assert message in errors[0], errors[0]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """One uninterrupted run: its final parameters and logged losses."""
  workdir = tmp_path_factory.mktemp("faults") / "reference"
  r = _run(workdir)
  assert r.returncode == 0, r.stderr[-3000:]
  return _final(workdir) + (workdir,)


def _interrupt_at(workdir, sig, after_step, delay):
  """Starts training, sends `sig` `delay` s after step `after_step` is logged; (rc, output)."""
  proc = subprocess.Popen(_cmd(workdir), cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  lines = []
  for line in proc.stdout:
    lines.append(line)
    m = re.match(r"step\s+(\d+)/", line)
    if m and int(m.group(1)) >= after_step:
      time.sleep(delay)
      proc.send_signal(sig)
      break
  rest, _ = proc.communicate(timeout=300)
  return proc.returncode, "".join(lines) + rest


@pytest.mark.long
def test_sigterm_then_sigint_checkpoint_exit_0_and_resume_identically(reference, tmp_path):
  """Preempted by SIGTERM, resumed, interrupted by SIGINT, resumed: equals the reference."""
  rng = random.Random(SEED)
  workdir = tmp_path / "run"
  after = 0
  for sig in (signal.SIGTERM, signal.SIGINT):
    choices = [s for s in (5, 10, 15, 20, 25) if s > after][:2]
    if not choices:  # the first stop came late (fast steps, a checkpoint written in the
      break          # background): no log step is left to interrupt after
    after = rng.choice(choices)
    delay = rng.uniform(0.0, 0.1)
    print(f"T2T_JAX_FAULT_SEED={SEED}: {sig.name} {delay:.2f}s after step {after}")
    rc, out = _interrupt_at(workdir, sig, after, delay)
    assert rc == 0, out[-3000:]
    m = re.search(rf"stopped at step (\d+) on {sig.name}", out)
    assert m, out[-3000:]
    after = int(m.group(1))
    assert after <= STEPS  # a signal during the final step's bookkeeping stops at STEPS
    assert _ckpt_steps(workdir)[-1] == after  # the current step was checkpointed
    assert "resume with: python -m t2t_jax.main" in out
    if sig == signal.SIGINT:
      assert "resuming from checkpoint" in out
  r = _run(workdir)
  assert r.returncode == 0, r.stderr[-3000:]
  assert f"resuming from checkpoint {after}" in r.stdout
  _assert_same_run(workdir, reference[:3])


@pytest.mark.long
def test_sigkill_at_random_moments_then_resume_is_identical(reference, tmp_path):
  """Killed twice at random moments (checkpoint writes included), then run to the end."""
  rng = random.Random(SEED)
  workdir = tmp_path / "run"
  ckpt_dir = workdir / "checkpoints"
  for trial in range(2):
    delay = rng.uniform(0.0, 2.0)
    print(f"T2T_JAX_FAULT_SEED={SEED}: trial {trial}, SIGKILL {delay:.2f}s into training")
    proc = subprocess.Popen(_cmd(workdir), cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:  # wait until training has started
      if re.match(r"step\s+\d+/", line):
        break
    deadline = time.time() + delay
    while time.time() < deadline:  # kill mid-write if a write is seen in progress
      if ckpt_dir.is_dir() and any("tmp" in p.name for p in ckpt_dir.iterdir()):
        break
      time.sleep(0.001)
    proc.kill()
    proc.communicate(timeout=60)
    assert all(s < STEPS for s in _ckpt_steps(workdir)), "the run finished before the kill"
  # What a death mid-write leaves behind: a partial checkpoint in orbax's temporary name.
  partial = ckpt_dir / f"{STEPS}.orbax-checkpoint-tmp-1234567890"
  partial.mkdir(parents=True, exist_ok=True)
  (partial / "garbage").write_bytes(b"\0" * 100)
  before = _ckpt_steps(workdir)
  r = _run(workdir)
  assert r.returncode == 0, r.stderr[-3000:]
  if before:
    assert f"resuming from checkpoint {before[-1]}" in r.stdout
  _assert_same_run(workdir, reference[:3])


def test_corrupt_newest_checkpoint_is_moved_aside_and_previous_used(reference, tmp_path):
  workdir = tmp_path / "run"
  r = _run(workdir, **{"train.steps": 20})
  assert r.returncode == 0, r.stderr[-3000:]
  assert _ckpt_steps(workdir) == [10, 20]
  for f in (workdir / "checkpoints" / "20").rglob("*"):
    if f.is_file() and f.stat().st_size > 0:
      with open(f, "r+b") as fh:
        fh.truncate(f.stat().st_size // 2)
  r = _run(workdir)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "checkpoint" in r.stderr and "could not be restored" in r.stderr
  assert (workdir / "corrupt_checkpoint_20").is_dir()
  assert "resuming from checkpoint 10" in r.stdout
  _assert_same_run(workdir, reference[:3])


@pytest.mark.long
def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
  workdir = tmp_path / "run"
  assert _run(workdir, **{"train.steps": 10}).returncode == 0
  # Resumed with a learning rate 1e30 x the paper's: step 11's update, computed from a finite
  # loss and finite gradients, is applied, and the parameters it makes overflow step 12's
  # loss. (The check reads the step's loss and gradients, not the updated parameters: issue
  # 52; it stopped at step 11 when it also read their norm.)
  r = _run(workdir, **{"train.learning_rate_scale": 1e30, "train.checkpoint_every_steps": 2,
                       "train.log_every_steps": 1})
  _one_line_error(r, "non-finite loss at step 12")
  assert "last good checkpoint is checkpoint 10" in r.stderr
  assert _ckpt_steps(workdir) == [10]
  params, _, _ = _final(workdir)
  assert all(np.isfinite(x).all() for x in jax.tree_util.tree_leaves(params))


def test_unwritable_workdir_is_a_one_line_error_before_any_work(tmp_path):
  blocker = tmp_path / "a_file"
  blocker.write_text("not a directory")
  _one_line_error(_run(blocker / "run"), "cannot write to workdir")
  if os.geteuid() != 0:
    readonly = tmp_path / "readonly"
    readonly.mkdir()
    readonly.chmod(0o555)
    _one_line_error(_run(readonly / "run"), "cannot write to workdir")
  elif Path("/sys").is_dir():  # root ignores permissions; /sys is not writable even by root
    _one_line_error(_run("/sys/t2t_jax_workdir"), "cannot write to workdir")


def test_full_disk_is_a_one_line_error_before_any_work(tmp_path):
  # The real command, with the operating system reporting 1 MB free.
  code = ("import shutil, sys; "
          "shutil.disk_usage = lambda p: shutil._ntuple_diskusage(10**12, 10**12 - 10**6, 10**6); "
          "from t2t_jax import main; sys.argv[0] = 'main'; main.run()")
  workdir = tmp_path / "run"
  args = [sys.executable, "-c", code] + _cmd(workdir, **{"model.d_model": 512,
                                                         "model.num_heads": 8,
                                                         "model.d_k": 64, "model.d_v": 64})[3:]
  r = subprocess.run(args, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
  _one_line_error(r, "not enough free disk space")
  assert not workdir.exists()


@pytest.mark.parametrize("case, args, message", [
    ("unknown experiment", dict(experiment="bsae_ende"), "unknown experiment"),
    ("unknown key", {"model.num_layer": 2}, "model.num_layer"),
    ("wrong type", {"model.num_layers": "two"}, "model.num_layers"),
    ("other experiment", dict(experiment="table3_base"), "was trained with experiment 'demo'"),
    ("other vocabulary", {"model.vocab_size": 128}, "model.vocab_size"),
])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_bad_flags_on_a_trained_workdir_change_nothing(case, args, message, mode, reference):
  workdir = reference[3]
  args = dict(args)
  experiment = args.pop("experiment", "demo")
  before = _snapshot(workdir)
  r = subprocess.run(_cmd(workdir, mode, experiment, **args), cwd=REPO, env=ENV,
                     capture_output=True, text=True, timeout=300)
  _one_line_error(r, message)
  assert _snapshot(workdir) == before


def test_eval_without_a_checkpoint_is_a_one_line_error(tmp_path):
  empty = tmp_path / "empty"
  empty.mkdir()
  _one_line_error(_run(empty, "eval"), "no checkpoint")
  assert list(empty.iterdir()) == []
  _one_line_error(_run(tmp_path / "missing", "eval"), "no such workdir")
  assert not (tmp_path / "missing").exists()


@pytest.mark.long
def test_a_stale_average_is_not_evaluated_silently(tmp_path):
  """Trained, averaged, then resumed and trained on: translate uses the newest checkpoint and
  says which steps the old average covers, instead of decoding with the stale average."""
  workdir = tmp_path / "run"
  r = _run(workdir, **{"train.steps": 10, "train.final_eval": True, "train.final_eval_test": False})
  assert r.returncode == 0, r.stderr[-3000:]
  assert json.loads((workdir / "averaged" / "averaged.json").read_text())["steps"][-1] == 10
  r = _run(workdir, **{"train.steps": 20})  # resumed: checkpoints 20 is newer than the average
  assert r.returncode == 0, r.stderr[-3000:]
  r = subprocess.run(_cmd(workdir, "translate", **{"train.steps": 20}), cwd=REPO, env=ENV,
                     input="a\n", capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "but checkpoint 20 is newer; using checkpoint 20" in r.stderr
  assert "translating stdin with checkpoint 20" in r.stderr


@pytest.mark.long
def test_sigterm_during_the_final_decode_stops_cleanly_and_the_same_command_decodes(tmp_path):
  """A preemption notice while a finished run decodes its dev set: exit 0 with the command
  that finishes the job (not a death by signal, which a sweep counts as a failed row), no
  partial result, and that command decodes without training again."""
  workdir = tmp_path / "run"
  slow_decode = {"train.steps": 10, "train.final_eval": True, "train.final_eval_test": False,
                 "decode.beam_size": 8, "decode.max_extra_length": 200}
  proc = subprocess.Popen(_cmd(workdir, **slow_decode), cwd=REPO, env=ENV, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  lines = []
  for line in proc.stdout:
    lines.append(line)
    if line.startswith("decoding valid"):
      proc.send_signal(signal.SIGTERM)
      break
  out = "".join(lines) + proc.stdout.read()
  assert proc.wait(timeout=300) == 0, out[-3000:]
  assert "stopped on SIGTERM during the final evaluation" in out, out[-3000:]
  assert not (workdir / "eval" / "valid.json").exists()

  r = _run(workdir, **{**slow_decode, "decode.beam_size": 1, "decode.max_extra_length": 5})
  assert r.returncode == 0, r.stderr[-3000:]
  assert "resuming from checkpoint 10" in r.stdout
  assert json.loads((workdir / "eval" / "valid.json").read_text())["num_sentences"] > 0


def test_sigterm_during_data_preparation_exits_0_and_leaves_no_temporary(tmp_path):
  """Issue 45 (8): a SIGTERM while the corpus was being prepared exited 143 and left the
  cache's .tmp-* folder behind forever; a killed preparation's leftovers are cleared by the
  next one on the host."""
  import socket
  env = {**ENV, "T2T_JAX_DATA_DIR": str(tmp_path / "cache")}
  proc = subprocess.Popen(_cmd(tmp_path / "run", "train"), cwd=REPO, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  while True:  # the first line preparation prints: the cache's temporary folder exists
    line = proc.stderr.readline()
    assert line, "the command ended before preparing data"
    if line.startswith("reading "):
      break
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 0, err[-2000:]
  assert "stopped on SIGTERM outside the training loop" in out and "Resume with:" in out
  assert not list((tmp_path / "cache").rglob("*.tmp-*"))

  dead = tmp_path / "cache" / "x" / f"v1.tmp-{socket.gethostname()}-999999-abc"
  dead.mkdir(parents=True)
  from t2t_jax import data_sources
  assert data_sources.remove_dead_temporaries(str(dead.parent / "v1")) == [dead.name]
  assert not dead.exists()


@pytest.mark.long
def test_a_workdir_copied_alone_translates_scores_and_exports_without_its_corpus(tmp_path):
  """Issue 45 (11): inference needed the training corpus folder (its recorded `folder:` path)
  and prepared data when the cache was gone. Now a workdir copied to another place, its
  corpus and cache deleted, translates, scores and exports, and writes nothing outside."""
  import shutil
  from t2t_jax import data_sources
  corpus = tmp_path / "corpus"
  source = data_sources.parse_spec("demo")
  demo = tmp_path / "demo_corpus"
  data_sources.write_demo_folder(str(demo))
  shutil.copytree(demo, corpus)
  env = {**ENV, "T2T_JAX_DATA_DIR": str(tmp_path / "cache")}
  spec = f"--dataset=folder:{corpus}:{source.src_lang}-{source.tgt_lang}"
  r = subprocess.run(_cmd(tmp_path / "run", "train", **{"train.steps": 10}) + [spec], cwd=REPO,
                     env=env, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  shutil.copytree(tmp_path / "run", tmp_path / "elsewhere")
  for gone in ("run", "corpus", "cache"):
    shutil.rmtree(tmp_path / gone)
  env["T2T_JAX_DATA_DIR"] = str(tmp_path / "new_cache")
  outside_before = sorted(p.name for p in tmp_path.iterdir())
  for mode, extra, text in (("translate", [], "ta suda.\n"),
                            ("score", [], "ta suda.\tla\n"),
                            ("export", [f"--output={tmp_path / 'elsewhere' / 'hf'}"], "")):
    r = subprocess.run(_cmd(tmp_path / "elsewhere", mode, **{"train.steps": 10}) + [spec] +
                       extra, cwd=REPO, env=env, input=text, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, (mode, r.stderr[-3000:])
  assert sorted(p.name for p in tmp_path.iterdir()) == outside_before  # nothing new outside
  assert (tmp_path / "elsewhere" / "hf" / "vocab.json").exists()
