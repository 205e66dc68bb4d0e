"""Moving pytrees between the host and the devices for pmap, and multi-process set-up.

In a multi-process (multi-host) job every process runs the same program; a
pmap spans the devices of all processes, and each process passes and receives
the slices of its own local devices (the leading axis of every array here).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

# The pmap axis of every step. Arrays placed by `replicate`/`shard` carry it in
# their sharding, so a step's first call sees the same input shardings as the
# calls that consume its outputs (a different name costs a second compilation).
AXIS = "devices"


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> None:
  """Joins JAX's distributed runtime before any computation.

  With no arguments the cluster is detected from the environment (SLURM, Cloud
  TPU, Open MPI); otherwise all three arguments describe it explicitly.
  """
  if coordinator_address is None:
    jax.distributed.initialize()
  else:
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)


def _pmap_identity(n_devices: int | None, local_only: bool):
  n = n_devices or jax.local_device_count()
  if jax.process_count() > 1 and not local_only:
    if n != jax.local_device_count():
      raise ValueError("a multi-process step uses every local device")
    return jax.pmap(lambda x: x, axis_name=AXIS)  # this process's slice of the global devices
  return jax.pmap(lambda x: x, axis_name=AXIS, devices=jax.local_devices()[:n])


def replicate(tree: Any, n_devices: int | None = None, local_only: bool = False) -> Any:
  """Copies a pytree onto each local device once (leading axis = device).

  `local_only` places it for a pmap over this process's devices alone (decoding
  on one host of a multi-process job); otherwise for the global step.
  """
  n = n_devices or jax.local_device_count()
  stacked = jax.tree_util.tree_map(
      lambda x: np.broadcast_to(np.asarray(x), (n,) + np.shape(x)), tree)
  return _pmap_identity(n, local_only)(stacked)


def unreplicate(tree: Any) -> Any:
  """The first local device's copy, on the host."""
  return jax.tree_util.tree_map(first, tree)


def first(x: Any) -> np.ndarray:
  """A replicated array's value from this process's first device."""
  if isinstance(x, jax.Array):  # its shard keeps the device axis: [1, ...]
    return np.asarray(x.addressable_data(0)).reshape(x.shape[1:])
  return np.asarray(x[0])


def shard(tree: Any, n_devices: int | None = None, local_only: bool = False) -> Any:
  """Places a host pytree whose leading axis is the local device axis onto the devices."""
  return _pmap_identity(n_devices, local_only)(tree)


def all_processes_agree(flag: bool) -> bool:
  """True if `flag` is true on any process (a stop decision all processes must share)."""
  if jax.process_count() == 1:
    return flag
  from jax.experimental import multihost_utils
  return bool(np.any(multihost_utils.process_allgather(np.asarray(flag))))


def agreed_max(value: float) -> float:
  """The largest of the processes' values (a clock reading all processes must act on alike)."""
  if jax.process_count() == 1:
    return value
  from jax.experimental import multihost_utils
  return float(np.max(multihost_utils.process_allgather(np.asarray(value, np.float64))))
