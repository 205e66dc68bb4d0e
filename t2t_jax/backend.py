"""Decisions that depend on the accelerator the step runs on, in one place.

The plain JAX code is the default; a branch here exists only where a measurement
showed a backend needs something else.
"""

from __future__ import annotations

import jax


def allreduce_as_one_buffer() -> bool:
  """Whether the step's gradient all-reduce should be one flat buffer, not one per tensor.

  XLA combines the step's all-reduces into one tuple all-reduce, but across processes
  on CPU (gloo) each tuple element is its own exchange: ~4 ms each, 130 ms per step for
  the 34 tensors of a one-layer model. GPUs and TPUs reduce the tuple in one launch, so
  the extra concatenate and split would only cost memory traffic there.
  """
  return jax.default_backend() == "cpu"
