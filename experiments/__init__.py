"""Named experiments: `--experiment=NAME` looks a config up here.

Each module defines complete configs with plain Python and registers them by
name. Experiments import nothing of `t2t_jax` but its config types; t2t_jax
finds this package through the `t2t_jax.experiments` entry point (setup.py),
never by importing it.
"""

from __future__ import annotations

from typing import Callable

from t2t_jax.config import ExperimentConfig

_REGISTRY: dict[str, Callable[[], ExperimentConfig]] = {}


def register(name: str, description: str):
  """Decorator: registers a zero-argument function returning a config."""
  def wrap(fn: Callable[[], ExperimentConfig]) -> Callable[[], ExperimentConfig]:
    if name in _REGISTRY:
      raise ValueError(f"experiment {name!r} registered twice")
    def build() -> ExperimentConfig:
      import dataclasses
      return dataclasses.replace(fn(), name=name, description=description)
    _REGISTRY[name] = build
    return fn
  return wrap


def names() -> list[str]:
  return sorted(_REGISTRY)


def get(name: str) -> ExperimentConfig:
  """The named config; KeyError listing the valid names when unknown."""
  if name not in _REGISTRY:
    raise KeyError(f"unknown experiment {name!r}; valid names: {', '.join(names())}")
  return _REGISTRY[name]()


# Importing the definition modules fills the registry.
from experiments import paper, table3, demo, multi30k  # noqa: E402,F401

# Sweeps by name: row name -> SweepRow (what `python -m t2t_jax.sweep --sweep=NAME` runs).
SWEEPS = {"table3": table3.ROWS}
