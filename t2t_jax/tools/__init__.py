"""Tools that stand above the library: benchmarks, the device and speed checks, plots (of training curves), the
parameter table, the WMT-shaped corpus generator and the Table 3 sweep. Each is a
`python -m t2t_jax.tools.NAME` command; the library (`t2t_jax/`) never imports them."""


def cpu_model() -> str:
  """lscpu's model name and the core count: what a CPU figure is measured on."""
  import os
  import platform
  try:
    with open("/proc/cpuinfo") as f:
      lines = f.read().splitlines()
    name = next(l.split(":", 1)[1].strip() for l in lines if l.startswith("model name"))
    flags = set(next(l.split(":", 1)[1] for l in lines if l.startswith("flags")).split())
  except (OSError, StopIteration):
    return f"{platform.machine()}, {os.cpu_count()} cores"
  # The instruction sets XLA:CPU's speed depends on most (bf16 differs 2x between them).
  units = ("with AVX-512" if "avx512f" in flags else "without AVX-512") + \
      (" and AMX" if "amx_tile" in flags else "")
  return f"{name} {units}, {os.cpu_count()} cores"


def write_record(record: dict, out: str | None, commit: str | None = None) -> None:
  """A measurement's JSON record with what it was measured on (the machine, the date, jax's
  version, the code's commit: `commit`, where the measured code is not this checkout's
  HEAD), printed, and written to `out` when given."""
  import datetime
  import json
  import os
  import subprocess
  import jax
  commit = commit or subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                                    text=True, cwd=os.path.dirname(__file__)).stdout.strip()
  record = {**record, "machine": cpu_model(), "date": datetime.date.today().isoformat(),
            "jax": jax.__version__, "commit": commit}
  text = json.dumps(record, indent=1)
  print(text)
  if out:
    with open(out, "w") as f:
      f.write(text + "\n")


def state_with_dense_moments(experiment: str):
  """The experiment's initial training state on the host, with Adam's moments filled with
  random values of their shapes: a trained run's moments are dense floats, while a new
  state's are zeros, which a checkpoint's compression stores in almost nothing."""
  import jax
  import numpy as np
  from t2t_jax import optim, registry, train
  cfg = registry.get(experiment)
  state = jax.device_get(train.init_state(cfg, optim.make_optimizer(cfg)))
  rng = np.random.default_rng(0)
  return state.replace(opt_state=jax.tree_util.tree_map(
      lambda x: rng.standard_normal(x.shape).astype(x.dtype)
      if np.issubdtype(x.dtype, np.floating) and x.ndim else x, state.opt_state))
