"""The cluster launchers, run for real: `mpirun` (Open MPI) and SLURM (`srun`, and `sbatch` of
launch/slurm_gpu.sbatch) start `--distributed` training through jax's own
cluster detection. Each job trains, checkpoints, stops on a SIGTERM to one task, and resumes
to the parameters of a single-process run.

The launchers come from Debian's packages (`openmpi-bin`, `slurmd slurmctld slurm-client
munge`), which CI installs; where they are missing, each test is skipped and says why. The
SLURM tests start a two-node cluster on this machine (`slurmctld`, a `slurmd` per node,
`munged`; root only), with each node declaring 16 CPUs so that the batch script's request
is met as written; its GPUs are declined through sbatch's own environment variable.
"""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from helpers import REPO, cpu_devices, set_flags, tiny_cfg
from test_multihost import _free_port
from test_train import _final_params, _train_cmd, _train_sets

pytestmark = pytest.mark.cluster

# Two tasks of 4 devices each; sync and checkpoint often, so a stop lands within seconds.
EXTRA = {"train.final_eval": False, "train.checkpoint_every_steps": 100_000,
         "train.log_every_steps": 1000, "train.eval_every_steps": 100_000,
         "train.sync_every_steps": 2, "train.learning_rate_scale": 30.0, "model.dropout": 0.1}
TIMEOUT = 600


def _need(*programs):
  missing = [p for p in programs if shutil.which(p) is None]
  if missing:
    pytest.skip(f"{', '.join(missing)} not installed (Debian: apt-get install openmpi-bin "
                f"slurmd slurmctld slurm-client munge; CI installs them)")


def _task_pids(marker: str) -> list[int]:
  """The training processes (Python, not their launcher) whose command line has `marker`."""
  pids = []
  for entry in Path("/proc").iterdir():
    if not entry.name.isdigit():
      continue
    try:
      argv = (entry / "cmdline").read_bytes().split(b"\0")
    except OSError:
      continue
    if b"t2t_jax.main" in argv and any(marker.encode() in a for a in argv) and \
        os.path.basename(argv[0]).startswith(b"python"):
      pids.append(int(entry.name))
  return sorted(pids)


def _stop_one_task_once_training(proc, marker: str) -> str:
  """Reads the job's output until both tasks have announced the run (from then on a signal
  is a stop their loops agree on), then sends SIGTERM to one task alone (one host
  preempted); returns the output read."""
  out, ready = "", 0
  for line in proc.stdout:
    out += line
    # Counted, not tested per line: the two tasks print it at the same moment, and the
    # launcher may join both into one line (it did in CI, and the test then waited forever).
    ready += line.count("parameters, 4 device(s)")
    if ready >= 2:
      break
  pids = _task_pids(marker)
  assert len(pids) == 2, (pids, out[-2000:])
  os.kill(pids[-1], signal.SIGTERM)
  return out


def _stopped_step(out: str) -> int:
  steps = {int(part.split()[0]) for part in out.split("stopped at step ")[1:]}
  assert len(steps) == 1, out[-3000:]  # both tasks stopped after the same step
  return steps.pop()


def _assert_equals_single_process(tmp_path, workdir, steps):
  """The launcher's run equals one process of 8 devices trained to `steps` at once."""
  single = tmp_path / "single"
  r = subprocess.run(_train_cmd(single, steps, EXTRA), cwd=REPO, capture_output=True, text=True,
                     env={**os.environ, "XLA_FLAGS": cpu_devices(8)}, timeout=TIMEOUT)
  assert r.returncode == 0, r.stderr[-3000:]
  cfg = tiny_cfg()
  (a_params, a_step), (b_params, b_step) = _final_params(single, cfg), _final_params(workdir, cfg)
  assert a_step == b_step == steps
  for a, b in zip(jax.tree_util.tree_leaves(a_params), jax.tree_util.tree_leaves(b_params)):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5)


def _stop_resume_and_compare(launch, tmp_path, workdir, env):
  """A job of `launch(workdir, steps)` stopped by a SIGTERM to one of its tasks, then
  resumed for 3 steps: equal to a one-process run."""
  proc = subprocess.Popen(launch(workdir, 100_000), cwd=REPO, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  out = _stop_one_task_once_training(proc, str(workdir))
  out += proc.communicate(timeout=TIMEOUT)[0]
  assert proc.returncode == 0, out[-3000:]
  assert "process 1 of 2: 4 local of 8 devices" in out  # jax found the job from the launcher
  stopped = _stopped_step(out)
  assert stopped % 2 == 0 and "on SIGTERM" in out and "on a signal to another process" in out
  r = subprocess.run(launch(workdir, stopped + 3), cwd=REPO, env=env, capture_output=True,
                     text=True, timeout=TIMEOUT)
  assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
  assert r.stdout.count(f"resuming from checkpoint {stopped}") == 2
  _assert_equals_single_process(tmp_path, workdir, stopped + 3)


# ---------------------------------------------------------------------------------------
# Open MPI


def _mpirun(workdir, steps, extra=EXTRA):
  cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2",
         "-x", "XLA_FLAGS", "-x", "T2T_JAX_DATA_DIR", "-x", "PATH"]
  return cmd + _train_cmd(workdir, steps, extra) + ["--distributed"]


def test_mpirun_trains_stops_on_sigterm_to_one_task_and_resumes_exactly(tmp_path):
  _need("mpirun")
  _stop_resume_and_compare(_mpirun, tmp_path, tmp_path / "mpi_run",
                           {**os.environ, "XLA_FLAGS": cpu_devices(4)})


# ---------------------------------------------------------------------------------------
# SLURM: a two-node cluster on this machine

SLURM_CONF = """\
ClusterName=t2ttest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool-%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=t2tnode1 NodeAddr=127.0.0.1 Port={node_ports[0]} CPUs=16 State=UNKNOWN
NodeName=t2tnode2 NodeAddr=127.0.0.1 Port={node_ports[1]} CPUs=16 State=UNKNOWN
PartitionName=test Nodes=t2tnode1,t2tnode2 Default=YES MaxTime=INFINITE State=UP
"""
# jax takes the job's first node name as the coordinator's host. These two nodes share one
# machine, and their names resolve nowhere, so JAX_COORDINATOR_ADDRESS (which jax reads
# before its own detection) says 127.0.0.1; on a real cluster the node name serves.


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
  """A running two-node SLURM cluster; yields the environment its commands need."""
  _need("slurmctld", "slurmd", "srun", "sbatch", "munged")
  if os.geteuid() != 0:
    pytest.skip("the test cluster's slurmd runs jobs as root, so the tests must run as root")
  d = tmp_path_factory.mktemp("slurm")
  (d / "state").mkdir()
  conf = d / "slurm.conf"
  conf.write_text(SLURM_CONF.format(host=_hostname(), dir=d, ctld_port=_free_port(),
                                    slurmd_port=_free_port(),
                                    node_ports=[_free_port(), _free_port()]))
  env = {**os.environ, "SLURM_CONF": str(conf),
         "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{_free_port()}"}
  _start_munge()
  daemons = [subprocess.Popen(["slurmctld", "-D", "-i", "-f", str(conf)], env=env)]
  time.sleep(1)
  daemons += [subprocess.Popen(["slurmd", "-D", "-N", node, "-f", str(conf)], env=env)
              for node in ("t2tnode1", "t2tnode2")]
  try:
    deadline = time.time() + 60
    while time.time() < deadline:
      r = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True)
      if r.stdout.split() == ["idle"]:
        break
      time.sleep(1)
    else:
      raise AssertionError(f"the test cluster did not come up: {r.stdout} {r.stderr}\n" +
                           (d / "slurmctld.log").read_text()[-2000:])
    yield env
  finally:
    subprocess.run(["scancel", "--full", "-u", "root"], env=env, capture_output=True)
    for p in daemons:
      p.terminate()
    for p in daemons:
      try:
        p.wait(timeout=30)
      except subprocess.TimeoutExpired:
        p.kill()


def _hostname() -> str:
  import socket
  return socket.gethostname()


def _start_munge():
  """munged, SLURM's authentication, if it is not running already."""
  if subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode == 0:
    return
  if not Path("/etc/munge/munge.key").exists():
    subprocess.run(["mungekey", "--create"], check=True, capture_output=True)
  Path("/run/munge").mkdir(parents=True, exist_ok=True)
  subprocess.run(["chown", "-R", "munge:munge", "/run/munge", "/etc/munge"], capture_output=True)
  r = subprocess.run(["su", "-s", "/bin/sh", "munge", "-c", "munged"], capture_output=True,
                     text=True)
  if r.returncode != 0:
    subprocess.run(["munged", "--force"], check=True, capture_output=True)


def _srun(workdir, steps):
  return ["srun", "--nodes=1", "--ntasks=2", "--kill-on-bad-exit=1"] + \
      _train_cmd(workdir, steps, EXTRA) + ["--distributed"]


def test_srun_trains_stops_on_sigterm_to_one_task_and_resumes_exactly(slurm, tmp_path):
  _stop_resume_and_compare(_srun, tmp_path, tmp_path / "srun_run",
                           {**slurm, "XLA_FLAGS": cpu_devices(4)})


def test_the_sbatch_script_as_written_trains_through_its_own_requeue(slurm, tmp_path):
  """launch/slurm_gpu.sbatch unchanged, on two nodes of one task each: only
  environment variables adapt it (the experiment, workdir and data folder it reads, and
  SBATCH_GPUS_PER_NODE=0 for a cluster without GPUs); its arguments reach every task. A
  segment stopped by SIGTERM to its steps (what `--signal=TERM@180` sends before the time
  limit) checkpoints, neither averages nor evaluates, and requeues the job itself; the
  next segment resumes and, at the last step, averages and evaluates once. One sbatch
  --wait, one log: no resubmission by hand."""
  workdir = tmp_path / "sbatch_run"
  env = {**slurm, "XLA_FLAGS": cpu_devices(4), "EXPERIMENT": "demo",
         "WORKDIR": str(workdir), "SBATCH_GPUS_PER_NODE": "0",
         "SBATCH_OUTPUT": f"{tmp_path}/job-%j.out"}
  steps = 10  # the stop lands at the first agreed step (2), long before these
  extra = {**EXTRA, "train.checkpoint_every_steps": 2, "train.final_eval": True}
  proc = subprocess.Popen(["sbatch", "--wait", "--parsable",
                           str(REPO / "launch/slurm_gpu.sbatch"),
                           *set_flags(_train_sets(steps, extra))],
                          cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
  job = proc.stdout.readline().strip().split(";")[0]
  log = tmp_path / f"job-{job}.out"
  deadline = time.time() + TIMEOUT
  # Once both tasks announce the run, SIGTERM to the job's steps (not its shell).
  while not log.exists() or log.read_text().count("parameters, 4 device(s)") < 2:
    assert time.time() < deadline and proc.poll() is None, log.read_text()[-3000:]
    time.sleep(1)
  subprocess.run(["scancel", "--signal=TERM", job], env=env, check=True)
  _, err = proc.communicate(timeout=2 * TIMEOUT)
  out = log.read_text() if log.exists() else ""
  assert proc.returncode == 0, (err, out[-3000:])
  first, _, second = out.partition("requeueing job")
  assert "process 1 of 2: 4 local of 8 devices" in first, out[-3000:]
  assert "on SIGTERM" in first and "averaged" not in first and "sacreBLEU" not in first, \
      out[-3000:]
  stopped = _stopped_step(first)
  assert second.count(f"resuming from checkpoint {stopped}") == 2, out[-3000:]
  assert "averaged" in second and second.count("test: sacreBLEU") == 1, out[-3000:]
  assert "requeueing" not in second and not (workdir / "stopped.json").exists()
  assert (workdir / "eval" / "test.json").exists() and (workdir / "averaged").is_dir()
  _assert_equals_single_process(tmp_path, workdir, steps)


@pytest.mark.parametrize("tasks_per_node, visible", [("1(x2)", "all"), ("2", "0")])
def test_one_task_per_node_drives_every_gpu_of_its_node(tasks_per_node, visible):
  """jax's SLURM and Open MPI detection gives each task the one GPU of its local rank. The
  batch script runs one task per node for all 8 GPUs, so jax would have used GPU 0 alone;
  with one task on the node, every GPU stays visible. (Checked in jax's setting: no GPU
  here.)"""
  code = ("from t2t_jax import parallel; import jax; parallel.initialize(); "
          "print('visible', jax.config.values['jax_cuda_visible_devices'])")
  env = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "localhost",
         "SLURM_NTASKS": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
         "SLURM_STEP_TASKS_PER_NODE": tasks_per_node, "JAX_COORDINATOR_PORT": str(_free_port())}
  r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                     text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-2000:]
  assert f"visible {visible}" in r.stdout


# ---------------------------------------------------------------------------------------
# Cloud TPU: launch/tpu_vm.sh through a gcloud stand-in (tests/gcloud_standin.py) that runs
# each payload for real on this machine, once per worker of a two-host "slice"


def test_the_tpu_script_installs_trains_evaluates_and_resumes_on_every_host(tmp_path):
  """setup builds a wheel of this checkout and installs it on each host (EXTRAS without
  libtpu: no TPU here); the run and data lie in a folder both hosts share (the bucket of the
  script's default is tests/test_object_store.py's); train starts every host's trainer in
  the background with its arguments, a two-process job that averages and evaluates on
  process 0, each host's log copied beside the run; attach follows one; eval does it again;
  train again resumes on both hosts."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  gcloud = bin_dir / "gcloud"
  gcloud.write_text(f"#!/bin/sh\nexec {sys.executable} {REPO / 'tests/gcloud_standin.py'} "
                    f"\"$@\"\n")
  gcloud.chmod(0o755)
  workdir = tmp_path / "shared" / "run"
  env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "TPU_NAME": "test-slice",
         "ZONE": "here", "EXPERIMENT": "demo", "WORKDIR": str(workdir), "EXTRAS": "tfds",
         "DATA_DIR": str(tmp_path / "shared" / "t2t_data"),
         "PYTHON": sys.executable, "TPU_STANDIN_ROOT": str(tmp_path / "hosts"),
         "XLA_FLAGS": cpu_devices(4)}

  def script(*args):
    r = subprocess.run(["bash", str(REPO / "launch/tpu_vm.sh"), *args], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    return r.stdout + r.stderr

  script("setup")
  for host in ("worker0", "worker1"):
    installed = list((tmp_path / "hosts" / host / "t2t_jax_env").glob(
        "lib/python*/site-packages/t2t_jax/main.py"))
    assert installed, f"{host} has no t2t_jax installed"
  logs = [workdir / "logs" / f"host{i}.log" for i in (0, 1)]

  def train_detached(steps):
    """`train` returns at once; the job runs on, each host's log lands in the run's folder
    while it runs and, with its exit status last, when it ends."""
    for log in logs:
      log.unlink(missing_ok=True)
    out = script("train", *set_flags(_train_sets(steps, trains)))
    assert "training in the background on every host" in out, out[-3000:]
    deadline = time.time() + TIMEOUT
    while not all(l.exists() and "exit " in l.read_text() for l in logs):
      assert time.time() < deadline, [l.read_text()[-2000:] for l in logs if l.exists()]
      time.sleep(1)
    texts = [l.read_text() for l in logs]
    assert all(t.rstrip().endswith("exit 0") for t in texts), [t[-2000:] for t in texts]
    return texts

  trains = {**EXTRA, "train.checkpoint_every_steps": 2, "train.final_eval": True}
  env["LOG_EVERY_S"] = "1"
  host0, host1 = train_detached(4)
  assert "process 1 of 2: 4 local of 8 devices" in host1, host1[-3000:]
  assert host0.count("test: sacreBLEU") == 1 and "averaged" in host0, host0[-3000:]
  assert "sacreBLEU" not in host1  # process 0's work alone
  assert (workdir / "eval" / "test.json").exists()
  assert (tmp_path / "shared" / "t2t_data").is_dir()  # DATA_DIR, every host's
  # `attach` follows a host's log: here, the finished one from its first line.
  attach = subprocess.Popen(["bash", str(REPO / "launch/tpu_vm.sh"), "attach"], cwd=tmp_path,
                            env={**env, "WORKER": "1"}, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)  # its tail -F, killed with it
  try:
    followed = ""
    for line in attach.stdout:
      followed += line
      if line.startswith("exit 0"):
        break
    assert "process 1 of 2" in followed, followed[-2000:]
  finally:
    os.killpg(attach.pid, signal.SIGKILL)
    attach.wait()
  out = script("eval", *set_flags(_train_sets(4, EXTRA)))
  assert out.count("test: sacreBLEU") == 1 and "averaged" in out, out[-3000:]
  texts = train_detached(6)
  assert all(t.count("resuming from checkpoint 4") == 1 for t in texts), texts[0][-3000:]
  _assert_equals_single_process(tmp_path, workdir, 6)
