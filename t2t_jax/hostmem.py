"""Transparent huge pages for host buffers: XLA:CPU's step temporaries are tens of MB each.

glibc serves allocations that large with fresh `mmap`s and unmaps them on free, so every
train step faults in its temporaries again, 4 KiB at a time: ~100k page faults per second
and ~20% of the CPU time in the kernel for `multi30k_ende` on a 2-core machine. glibc's
`glibc.malloc.hugetlb=1` tunable (glibc >= 2.35) backs those mappings with 2 MiB pages
instead. That tunable is read only when a process starts, so entry points re-execute
themselves once with it set (`reexec_with_huge_pages`). `T2T_JAX_HUGEPAGES=0` opts out.
Only on a CPU backend (`backend.cpu_host_tricks`): with a GPU or TPU the step's temporaries
live on the device, and the host's malloc is not in the step's path.
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Mapping

from t2t_jax import backend

TUNABLE = "glibc.malloc.hugetlb"
OPT_OUT = "T2T_JAX_HUGEPAGES"
_THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"
_MIN_GLIBC = (2, 35)  # first glibc with the hugetlb tunable


def _glibc_version() -> tuple[int, ...] | None:
  if not sys.platform.startswith("linux"):
    return None
  lib, version = platform.libc_ver()
  if lib != "glibc" or not version:
    return None
  try:
    return tuple(int(p) for p in version.split(".")[:2])
  except ValueError:
    return None


def thp_mode() -> str | None:
  """The kernel's transparent-huge-page mode (`always`, `madvise`, `never`), None if unknown."""
  try:
    with open(_THP_MODE) as f:
      return f.read().split("[")[1].split("]")[0]
  except (OSError, IndexError):
    return None


def _thp_available() -> bool:
  """The THP mode must be `always` or `madvise` (glibc asks with madvise)."""
  return thp_mode() in ("always", "madvise")


def huge_page_env(environ: Mapping[str, str]) -> dict[str, str] | None:
  """The environment to re-execute with, or None when there is nothing to change."""
  if environ.get(OPT_OUT, "1") == "0":
    return None
  tunables = environ.get("GLIBC_TUNABLES", "")
  if TUNABLE + "=" in tunables:  # set already: by us (no loop) or by the user (theirs wins)
    return None
  version = _glibc_version()
  if version is None or version < _MIN_GLIBC or not _thp_available():
    return None
  if not backend.cpu_host_tricks(environ):  # last: it scans the installed JAX plugins
    return None
  env = dict(environ)
  env["GLIBC_TUNABLES"] = f"{tunables}:{TUNABLE}=1" if tunables else f"{TUNABLE}=1"
  return env


def reexec_with_huge_pages() -> None:
  """Replaces this process with itself, same command line, huge pages on; returns if not needed.

  Call it first thing in an entry point, before threads or work exist: `execve` keeps the
  process id (so launchers and multi-process jobs see one process) and the original
  interpreter options (`sys.orig_argv`).
  """
  env = huge_page_env(os.environ)
  argv = getattr(sys, "orig_argv", None)  # Python >= 3.10
  if env is None or not argv or not sys.executable:
    return
  sys.stdout.flush()
  sys.stderr.flush()
  try:
    os.execve(sys.executable, argv, env)
  except OSError:
    return  # unusual interpreters or sandboxes: run on without huge pages
