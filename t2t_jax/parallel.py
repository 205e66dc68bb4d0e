"""Moving pytrees between the host and the local devices for pmap."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

# The pmap axis of every step. Arrays placed by `replicate`/`shard` carry it in
# their sharding, so a step's first call sees the same input shardings as the
# calls that consume its outputs (a different name costs a second compilation).
AXIS = "devices"


def replicate(tree: Any, n_devices: int | None = None) -> Any:
  """Copies a pytree onto each local device once (leading axis = device)."""
  n = n_devices or jax.local_device_count()
  stacked = jax.tree_util.tree_map(
      lambda x: np.broadcast_to(np.asarray(x), (n,) + np.shape(x)), tree)
  return jax.pmap(lambda x: x, axis_name=AXIS, devices=jax.local_devices()[:n])(stacked)


def unreplicate(tree: Any) -> Any:
  """The first device's copy, on the host."""
  return jax.tree_util.tree_map(lambda x: np.asarray(x[0]), tree)


def shard(tree: Any, n_devices: int | None = None) -> Any:
  """Places a host pytree whose leading axis is the device axis onto the local devices."""
  n = n_devices or jax.local_device_count()
  return jax.pmap(lambda x: x, axis_name=AXIS, devices=jax.local_devices()[:n])(tree)
