"""Huge pages for host buffers: the entry points' re-execution and its effect on the kernel."""

import os
import subprocess
import sys
import textwrap

import pytest

from t2t_jax import hostmem

# Starts, re-executes (once), then mallocs 64 MiB the way XLA:CPU does (one large block),
# touches it and reports what the kernel backed it with.
_PROBE = textwrap.dedent("""
    import ctypes, os, sys
    print("start", flush=True)
    from t2t_jax import hostmem
    hostmem.reexec_with_huge_pages()
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    n = 64 << 20
    p = libc.malloc(ctypes.c_size_t(n))
    ctypes.memset(p, 1, n)
    with open("/proc/self/smaps_rollup") as f:
      huge_kb = next(int(l.split()[1]) for l in f if l.startswith("AnonHugePages:"))
    print("tunables", os.environ.get("GLIBC_TUNABLES", ""))
    print("huge_kb", huge_kb)
    print("argv", sys.argv[1:])
""")


def _probe(env_extra: dict[str, str]) -> tuple[int, str, int, str]:
  env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", hostmem.OPT_OUT)}
  env.update(env_extra)
  out = subprocess.run([sys.executable, "-c", _PROBE, "--flag=1"], env=env, check=True,
                       capture_output=True, text=True, timeout=120).stdout.splitlines()
  starts = out.count("start")
  fields = dict(line.split(" ", 1) for line in out if " " in line)
  return starts, fields["tunables"], int(fields["huge_kb"]), fields["argv"]


def _needs_huge_pages():
  if hostmem.huge_page_env({}) is None:
    pytest.skip("no glibc >= 2.35 with transparent huge pages here "
                f"(THP mode: {hostmem.thp_mode()})")


def test_reexec_once_keeps_arguments_and_gets_huge_pages():
  _needs_huge_pages()
  starts, tunables, huge_kb, argv = _probe({})
  assert starts == 2  # the original process, then one re-execution: no loop
  assert tunables == "glibc.malloc.hugetlb=1"
  assert argv == "['--flag=1']"
  assert huge_kb >= 2048  # at least one 2 MiB page behind the 64 MiB block


def test_opt_out_and_user_tunables():
  _needs_huge_pages()
  starts, tunables, huge_kb, _ = _probe({hostmem.OPT_OUT: "0"})
  assert (starts, tunables) == (1, "")
  if hostmem.thp_mode() == "madvise":  # without the tunable glibc never asks for huge pages
    assert huge_kb == 0
  # The user's own tunables are kept, ours appended; their own hugetlb setting wins.
  starts, tunables, _, _ = _probe({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
  assert (starts, tunables) == (2, "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1")
  starts, tunables, _, _ = _probe({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"})
  assert (starts, tunables) == (1, "glibc.malloc.hugetlb=0")


def test_no_change_without_glibc_support(monkeypatch):
  monkeypatch.setattr(hostmem, "_glibc_version", lambda: (2, 31))
  assert hostmem.huge_page_env({}) is None
  monkeypatch.setattr(hostmem, "_glibc_version", lambda: None)  # macOS, musl
  assert hostmem.huge_page_env({}) is None
