"""A stand-in for `gcloud compute tpus tpu-vm ssh|scp` on a machine without a TPU slice, for
tests/test_launchers.py: the slice's workers are home folders under $TPU_STANDIN_ROOT on this
machine. `scp` copies into each worker's home; `ssh --command=CMD` runs CMD itself with bash
in each worker's home at once, as gcloud does on each host, and exits with the worst status.

A TPU host's jax finds its slice from the TPU runtime; here each worker's environment gives
jax the same facts the way a SLURM job step does (its process id and count, and a
coordinator on this machine), and `--xla_force_host_platform_device_count` its devices.
"""

import os
import shutil
import socket
import subprocess
import sys


def _options(args):
  named = {k[2:]: v for k, _, v in (a.partition("=") for a in args if a.startswith("--"))}
  return named, [a for a in args if not a.startswith("--")]


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def main(argv):
  if argv[:3] != ["compute", "tpus", "tpu-vm"] or len(argv) < 4:
    sys.exit(f"gcloud stand-in: only `compute tpus tpu-vm ssh|scp`, got {argv}")
  verb, (named, positional) = argv[3], _options(argv[4:])
  root, count = os.environ["TPU_STANDIN_ROOT"], int(os.environ.get("TPU_STANDIN_WORKERS", "2"))
  worker = named.get("worker", "0")
  workers = range(count) if worker == "all" else [int(worker)]
  homes = [os.path.join(root, f"worker{i}") for i in range(count)]
  for home in homes:
    os.makedirs(home, exist_ok=True)
  if verb == "scp":
    source, target = positional
    for i in workers:
      shutil.copy(source, os.path.join(homes[i], target.split(":", 1)[1]))
    return 0
  if verb != "ssh":
    sys.exit(f"gcloud stand-in: unknown verb {verb}")
  port = _free_port()
  procs = []
  for i in workers:
    env = {**os.environ, "HOME": homes[i], "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
           "SLURM_JOB_ID": "1", "SLURM_STEP_NODELIST": "localhost",
           "SLURM_NTASKS": str(len(workers)), "SLURM_PROCID": str(i), "SLURM_LOCALID": "0",
           "SLURM_NODEID": str(i), "SLURM_STEP_TASKS_PER_NODE": f"1(x{len(workers)})",
           "TPU_WORKER_ID": str(i)}  # what a TPU VM's metadata says (agent-worker-number)
    procs.append(subprocess.Popen(["bash", "-c", named["command"]], cwd=homes[i], env=env))
  return max(p.wait() for p in procs)


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
