"""Named experiments and sweeps, found where they are installed: `--experiment=NAME`.

The package imports no experiment module by name. Providers are declared under the entry
point group `t2t_jax.experiments` (setup.py declares this repository's `experiments`
package); each provider is a module with `names()`, `get(name)` and `SWEEPS`. A source
checkout run without installing falls back to an importable top-level `experiments`.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
from types import ModuleType

from t2t_jax.config import ExperimentConfig, SweepRow

GROUP = "t2t_jax.experiments"


@functools.lru_cache(maxsize=None)
def providers() -> tuple[ModuleType, ...]:
  """The modules that define experiments, each loaded once."""
  found = [ep.load() for ep in importlib.metadata.entry_points(group=GROUP)]
  if not found:
    try:
      found = [importlib.import_module("experiments")]
    except ModuleNotFoundError:
      pass
  return tuple(found)


def names() -> list[str]:
  return sorted(n for p in providers() for n in p.names())


def get(name: str) -> ExperimentConfig:
  """The named config; KeyError listing the valid names when unknown."""
  for p in providers():
    if name in p.names():
      return p.get(name)
  raise KeyError(f"unknown experiment {name!r}; valid names: {', '.join(names())}")


def sweep(name: str) -> dict[str, SweepRow]:
  """A sweep's rows (row name -> its change and the paper's figures); ValueError if unknown."""
  sweeps = {k: v for p in providers() for k, v in getattr(p, "SWEEPS", {}).items()}
  if name not in sweeps:
    raise ValueError(f"unknown sweep {name!r}; valid: {', '.join(sorted(sweeps))}")
  return sweeps[name]
