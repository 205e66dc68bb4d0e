"""Named experiments and sweeps: `--experiment=NAME`, or `--experiment=FILE.py:FUNCTION`.

The built-in experiments are the `EXPERIMENTS` tables of the modules in `t2t_jax.configs`.
Other packages add theirs under the entry point group `t2t_jax.experiments`: a module with
the same `EXPERIMENTS` table (and, optionally, `SWEEPS`). A file of one's own needs no
package at all: `--experiment=my_configs.py:small_ende` calls that function.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.metadata
import importlib.util
import os
from types import ModuleType
from typing import Callable

from t2t_jax.config import ExperimentConfig, SweepRow
from t2t_jax.storage import check_input_file

GROUP = "t2t_jax.experiments"
BUILTIN = ("paper", "table3", "cpu_recipes", "parsing", "demo")  # modules of t2t_jax.configs


@functools.lru_cache(maxsize=None)
def providers() -> tuple[ModuleType, ...]:
  """The modules that define experiments: the built-in ones, then installed packages'."""
  return tuple([importlib.import_module(f"t2t_jax.configs.{m}") for m in BUILTIN] +
               [ep.load() for ep in importlib.metadata.entry_points(group=GROUP)])


@functools.lru_cache(maxsize=None)
def _table() -> dict[str, tuple[Callable[[], ExperimentConfig], str]]:
  table = {}
  for p in providers():
    for name, entry in getattr(p, "EXPERIMENTS", {}).items():
      if name in table:
        raise ValueError(f"experiment {name!r} is defined twice (again in {p.__name__})")
      table[name] = entry
  return table


def names() -> list[str]:
  return sorted(_table())


def descriptions() -> dict[str, str]:
  """Name -> one line saying what the experiment is (what `--help` lists)."""
  return {name: _table()[name][1] for name in names()}


def get(name: str) -> ExperimentConfig:
  """The named config, or a file's (`PATH.py:FUNCTION`); KeyError listing the valid names
  when unknown."""
  if ".py:" in name:
    return _from_file(name)
  if name not in _table():
    raise KeyError(f"unknown experiment {name!r}; valid names: {', '.join(names())} "
                   f"(or FILE.py:FUNCTION)")
  build, description = _table()[name]
  return dataclasses.replace(build(), name=name, description=description)


def _from_file(spec: str) -> ExperimentConfig:
  """`PATH.py:FUNCTION`: the config that FUNCTION in that file returns, named for it."""
  path, _, function = spec.rpartition(":")
  check_input_file(path, f"--experiment={spec}")
  module_name = "t2t_jax_user_config_" + os.path.splitext(os.path.basename(path))[0]
  module_spec = importlib.util.spec_from_file_location(module_name, path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  build = getattr(module, function, None)
  if not callable(build):
    found = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                   and getattr(v, "__module__", None) == module_name)
    raise KeyError(f"--experiment={spec}: {path} has no function {function!r} "
                   f"(it has {', '.join(found) or 'none'})")
  cfg = build()
  if not isinstance(cfg, ExperimentConfig):
    raise KeyError(f"--experiment={spec}: {function}() returned {type(cfg).__name__}, not an "
                   f"ExperimentConfig")
  doc = (build.__doc__ or "").strip().splitlines()
  return dataclasses.replace(cfg, name=function, description=doc[0] if doc else "")


def sweep(name: str) -> dict[str, SweepRow]:
  """A sweep's rows (row name -> its change and the paper's figures); ValueError if unknown."""
  sweeps = {k: v for p in providers() for k, v in getattr(p, "SWEEPS", {}).items()}
  if name not in sweeps:
    raise ValueError(f"unknown sweep {name!r}; valid: {', '.join(sorted(sweeps))}")
  return sweeps[name]
