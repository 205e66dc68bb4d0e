"""Multi-process data parallelism: 2 processes x 4 CPU devices on localhost train exactly
like 1 process x 8 devices, and a multi-process run resumes from its own checkpoints."""

import os
import socket
import subprocess

import jax
import pytest
import numpy as np

from t2t_jax import optim, train
from helpers import cpu_devices
from test_train import REPO, _final_params, _train_cmd, tiny_cfg

pytestmark = pytest.mark.cluster



def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _run_two_processes(workdir, steps, extra, devices=4, launcher=None, returncode=0):
  """`launcher`: a script run in place of `-m t2t_jax.main` (with main's flags)."""
  port = _free_port()
  env = {**os.environ, "XLA_FLAGS": cpu_devices(devices)}
  cmd = _train_cmd(workdir, steps, extra)
  if launcher:
    cmd = [cmd[0], str(launcher)] + cmd[3:]
  procs = [subprocess.Popen(
      cmd + [f"--coordinator_address=localhost:{port}", "--num_processes=2",
             f"--process_id={i}"],
      cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
      for i in range(2)]
  outs = [p.communicate(timeout=600)[0] for p in procs]
  for p, out in zip(procs, outs):
    assert p.returncode == returncode, out[-3000:]
  return outs


def test_two_processes_of_four_devices_equal_one_process_of_eight(tmp_path):
  extra = {"train.final_eval": False, "train.checkpoint_every_steps": 3,
           "train.learning_rate_scale": 30.0, "model.dropout": 0.1}
  one = tmp_path / "one"
  r = subprocess.run(_train_cmd(one, 6, extra), cwd=REPO, capture_output=True, text=True,
                     env={**os.environ, "XLA_FLAGS": cpu_devices(8)}, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]

  multi = tmp_path / "multi"
  outs = _run_two_processes(multi, 3, extra)
  assert "process 1 of 2: 4 local of 8 devices" in outs[1]
  outs = _run_two_processes(multi, 6, extra)  # a new job resumes the checkpoint of step 3
  assert all("resuming from checkpoint 3" in out for out in outs)

  cfg = tiny_cfg()
  (p_one, s_one), (p_multi, s_multi) = _final_params(one, cfg), _final_params(multi, cfg)
  assert s_one == s_multi == 6
  init = train.init_state(cfg, optim.make_optimizer(cfg)).params
  moved = max(float(np.abs(a - b).max()) for a, b in
              zip(jax.tree_util.tree_leaves(p_one), jax.tree_util.tree_leaves(init)))
  assert moved > 1e-3  # the six steps really changed the parameters
  for a, b in zip(jax.tree_util.tree_leaves(p_one), jax.tree_util.tree_leaves(p_multi)):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5)
  # Metrics are written once, by process 0.
  with open(multi / "metrics.jsonl") as f:
    steps = [l for l in f if '"loss"' in l]
  assert len(steps) == len({l.split(",")[0] for l in steps})


def test_sigterm_to_one_process_stops_both_after_the_same_step_with_one_checkpoint(tmp_path):
  """Preemption of one host: the processes agree at their next sync step (every
  `train.sync_every_steps`, not every step), stop there together, and write one checkpoint."""
  import signal
  port = _free_port()
  env = {**os.environ, "XLA_FLAGS": cpu_devices(4)}
  extra = {"train.final_eval": False, "train.checkpoint_every_steps": 100_000,
           "train.log_every_steps": 1000, "train.eval_every_steps": 100_000,
           "train.sync_every_steps": 7}
  procs = [subprocess.Popen(
      _train_cmd(tmp_path, 100_000, extra) + [f"--coordinator_address=localhost:{port}",
                                               "--num_processes=2", f"--process_id={i}"],
      cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
      for i in range(2)]
  out1 = ""
  for line in procs[1].stdout:  # from the run's announcement, a signal is a stop request
    out1 += line
    if "parameters, 4 device(s)" in line:
      break
  procs[1].send_signal(signal.SIGTERM)
  outs = [procs[0].communicate(timeout=600)[0], out1 + procs[1].communicate(timeout=600)[0]]
  for p, out in zip(procs, outs):
    assert p.returncode == 0, out[-3000:]
  stopped = [int(out.split("stopped at step ")[1].split()[0]) for out in outs]
  assert stopped[0] == stopped[1] and stopped[0] % 7 == 0, outs[0][-2000:]
  assert "on a signal to another process" in outs[0] and "on SIGTERM" in outs[1]
  assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()
                if p.name.isdigit()) == [stopped[0]]


def test_a_truncated_checkpoint_is_set_aside_once_and_both_processes_resume_together(tmp_path):
  extra = {"train.final_eval": False, "train.checkpoint_every_steps": 3}
  _run_two_processes(tmp_path, 6, extra)
  for f in (tmp_path / "checkpoints" / "6").rglob("*"):
    if f.is_file() and f.stat().st_size > 0:
      with open(f, "r+b") as fh:
        fh.truncate(f.stat().st_size // 2)
  outs = _run_two_processes(tmp_path, 6, extra)
  assert all("resuming from checkpoint 3" in out for out in outs), outs[1][-2000:]
  assert "moved to" in outs[0] and "moved to" not in outs[1]
  assert (tmp_path / "corrupt_checkpoint_6").is_dir()
  assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()
                if p.name.isdigit()) == [3, 6]


def test_processes_that_disagree_all_stop_with_one_error_instead_of_training_apart(tmp_path):
  """Issue 45 (4): restore checked only that every process arrived. Processes running
  different configurations (here another seed) trained diverged; now every process stops
  with the same one-line error, none left waiting."""
  port = _free_port()
  env = {**os.environ, "XLA_FLAGS": cpu_devices(4)}
  procs = [subprocess.Popen(
      _train_cmd(tmp_path / "run", 3, {"train.final_eval": False, "train.seed": i}) +
      [f"--coordinator_address=localhost:{port}", "--num_processes=2", f"--process_id={i}"],
      cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
      for i in range(2)]
  outs = [p.communicate(timeout=300)[0] for p in procs]
  for p, out in zip(procs, outs):
    assert p.returncode == 2, out[-3000:]
    assert "error: the processes run different configurations" in out, out[-3000:]


def test_a_run_preempted_on_8_devices_resumes_on_4_or_on_2_processes_of_2(tmp_path):
  """Issue 45 (17): the step does not depend on the device layout (each example's dropout
  follows its place in the global batch), so a resumed run may have another device count
  and still take the same updates."""
  extra = {"train.final_eval": False, "train.checkpoint_every_steps": 3,
           "train.learning_rate_scale": 30.0, "model.dropout": 0.1}

  def single(workdir, steps, devices):
    r = subprocess.run(_train_cmd(workdir, steps, extra), cwd=REPO, capture_output=True,
                       text=True, env={**os.environ, "XLA_FLAGS": cpu_devices(devices)},
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout

  single(tmp_path / "full", 6, 8)
  single(tmp_path / "four", 3, 8)
  assert "resuming from checkpoint 3" in single(tmp_path / "four", 6, 4)
  single(tmp_path / "two_by_two", 3, 8)
  outs = _run_two_processes(tmp_path / "two_by_two", 6, extra, devices=2)
  assert all("resuming from checkpoint 3" in out for out in outs)
  cfg = tiny_cfg()
  full, _ = _final_params(tmp_path / "full", cfg)
  for other in ("four", "two_by_two"):
    params, step = _final_params(tmp_path / other, cfg)
    assert step == 6
    for a, b in zip(jax.tree_util.tree_leaves(full), jax.tree_util.tree_leaves(params)):
      np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5)


def test_process_zero_prepares_the_data_while_the_others_wait(tmp_path):
  """Issue 45 (16): every process built its own temporary copy of the cache in the shared
  folder at once (and tfds does not support concurrent builds). Now process 0 prepares; the
  others wait, then find its cache. A failure there ends both with one line."""
  data = tmp_path / "data"
  env = {**os.environ, "XLA_FLAGS": cpu_devices(4), "T2T_JAX_DATA_DIR": str(data)}

  def two(workdir, extra):
    port = _free_port()
    procs = [subprocess.Popen(
        _train_cmd(workdir, 2, {"train.final_eval": False, **extra}) +
        [f"--coordinator_address=localhost:{port}", "--num_processes=2", f"--process_id={i}"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(2)]
    return procs, [p.communicate(timeout=600)[0] for p in procs]

  procs, outs = two(tmp_path / "run", {})
  assert [p.returncode for p in procs] == [0, 0], outs[1][-3000:]
  assert "reading train" in outs[0] and "reading train" not in outs[1], outs[1][-3000:]
  assert "process 1: waiting for process 0 to prepare the data" in outs[1]
  assert len([d for d in data.iterdir() if d.name.startswith("folder-")]) == 1

  bad = tmp_path / "bad"  # no test split: process 0's preparation fails
  bad.mkdir()
  for lang in ("src", "tgt"):
    for split in ("train", "valid"):
      (bad / f"{split}.{lang}").write_text("a b c\nd e f\n")
  procs, outs = two(tmp_path / "bad_run", {"data.dataset": f"folder:{bad}:src-tgt"})
  assert [p.returncode for p in procs] == [2, 2], outs
  assert "error: missing file" in outs[0]
  assert "error: process 0 could not prepare the data: missing file" in outs[1], outs[1]


def test_a_two_process_job_logs_dev_bleu_from_process_zero(tmp_path):
  """The dev BLEU in a multi-process job: process 0 decodes alone, on its own devices, with
  its search compiled before step 1, and the job goes on together."""
  outs = _run_two_processes(tmp_path, 2, {"train.final_eval": False,
                                          "train.bleu_every_steps": 2,
                                          "train.bleu_sentences": 4})
  assert "dev sacreBLEU" in outs[0] and "dev sacreBLEU" not in outs[1]
  with open(tmp_path / "metrics.jsonl") as f:
    assert '"dev_bleu"' in f.read()


def test_a_finished_two_process_job_averages_and_evaluates_on_process_zero(tmp_path):
  """A multi-host job's hosts cannot each run a program alone (a TPU slice's), so the end of
  training, and `--mode=eval` in a job, decode on process 0's devices while the others wait:
  one evaluation, every process exits 0."""
  outs = _run_two_processes(tmp_path, 2, {"train.final_eval_test": False})
  assert "averaged" in outs[0] and "valid: sacreBLEU" in outs[0], outs[0][-3000:]
  assert "sacreBLEU" not in outs[1] and "waiting for process 0 to average" in outs[1]
  assert (tmp_path / "eval" / "valid.json").exists()
  port = _free_port()
  env = {**os.environ, "XLA_FLAGS": cpu_devices(4)}
  procs = [subprocess.Popen(
      _train_cmd(tmp_path, 2, {"train.final_eval_test": False})  # its last --mode wins
      + ["--mode=eval", "--splits=valid", f"--coordinator_address=localhost:{port}",
         "--num_processes=2", f"--process_id={i}"],
      cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
      for i in range(2)]
  outs = [p.communicate(timeout=600)[0] for p in procs]
  assert [p.returncode for p in procs] == [0, 0], outs[0][-2000:] + outs[1][-2000:]
  assert "valid: sacreBLEU" in outs[0] and "sacreBLEU" not in outs[1]


def _with_device_memory(tmp_path, limit):
  """A launcher of main whose devices report `limit` bytes XLA may allocate (XLA:CPU
  reports none, so the memory check is otherwise a GPU's and TPU's)."""
  script = tmp_path / f"main_with_{limit}_bytes.py"
  script.write_text(f"from t2t_jax import backend, main\n"
                    f"backend.device_memory_bytes = lambda: {limit}\n"
                    f"main.run()\n")
  return script


def test_a_two_process_job_checks_device_memory_before_its_first_step(tmp_path):
  """Multi-process jobs (two SLURM nodes, every TPU slice) compiled nothing ahead, so a
  model too large for the devices was a raw RESOURCE_EXHAUSTED at step 1 or at the first
  dev BLEU. Now every process stops before step 1 with the one line naming the setting,
  and a job with room trains, its steps compiled for their plans and then run."""
  from t2t_jax import model
  cfg = tiny_cfg()
  state_bytes = 3 * 4 * model.count_params(model.abstract_params(cfg.model))
  extra = {"train.final_eval": False, "train.bleu_every_steps": 2, "train.bleu_sentences": 4}
  outs = _run_two_processes(tmp_path / "small", 2, extra,
                            launcher=_with_device_memory(tmp_path, state_bytes), returncode=2)
  assert "so smaller batches would not fit either" in outs[0], outs[0][-3000:]
  assert "error: process 0 could not fit its programs in device memory: " in outs[1]
  assert all("| loss" not in out for out in outs)
  outs = _run_two_processes(tmp_path / "roomy", 2, extra,
                            launcher=_with_device_memory(tmp_path, 100 * state_bytes))
  assert "plans the most" in outs[0] and "for their memory plans" in outs[0], outs[0][-3000:]
  assert "waiting for process 0 to fit its programs in device memory" in outs[1]
  assert "dev sacreBLEU" in outs[0]
  assert (tmp_path / "roomy" / "checkpoints" / "2").exists()
