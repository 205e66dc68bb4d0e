"""Moving pytrees between the host and the devices for pmap, and multi-process set-up.

In a multi-process (multi-host) job every process runs the same program; a
pmap spans the devices of all processes, and each process passes and receives
the slices of its own local devices (the leading axis of every array here).
"""

from __future__ import annotations

import functools
import itertools
import os
import queue
import threading
import time
from typing import Any, Callable, Sequence, TypeVar

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from t2t_jax.errors import UserError

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
    try:
      jax.distributed.initialize()
    except ValueError as e:  # JAX found no cluster it knows in the environment
      raise UserError(f"--distributed: no cluster found in this environment (SLURM, Open "
                      f"MPI, a Cloud TPU slice) ({str(e).splitlines()[0]}); outside one, give "
                      f"--coordinator_address, --num_processes and --process_id") from None
    if launcher_tasks_on_this_node() == 1 and not os.environ.get("JAX_LOCAL_DEVICE_IDS"):
      # jax's detection gives each launcher task the one GPU of its local rank, which
      # suits one task per GPU; one task per node (slurm_gpu.sbatch) drives all of them.
      jax.config.update("jax_cuda_visible_devices", "all")
      jax.config.update("jax_rocm_visible_devices", "all")
  else:
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)


def launcher_tasks_on_this_node() -> int | None:
  """How many tasks of this job the launcher started on this node (SLURM, Open MPI), or
  None outside them."""
  if "OMPI_COMM_WORLD_LOCAL_SIZE" in os.environ:
    return int(os.environ["OMPI_COMM_WORLD_LOCAL_SIZE"])
  spec, node = os.environ.get("SLURM_STEP_TASKS_PER_NODE"), os.environ.get("SLURM_NODEID")
  if not spec or node is None:
    return None
  counts = []  # "2(x3),1": 2 tasks on each of 3 nodes, then 1
  for part in spec.split(","):
    count, _, repeat = part.partition("(x")
    counts += [int(count)] * (int(repeat.rstrip(")")) if repeat else 1)
  return counts[int(node)] if int(node) < len(counts) else None


@functools.lru_cache(maxsize=None)
def device_sharding(n_devices: int) -> NamedSharding:
  """How a pmapped step's inputs and outputs lie: axis 0 split over the first n local devices.

  `jax.pmap` is a jitted shard_map whose compiled form is cached per input
  sharding: placing every input with this one sharding (the one the step's
  outputs carry) is what keeps the step from compiling again. `jax.device_put`
  with it compiles nothing; in a multi-process job pmap itself turns these
  host-local arrays into its global ones.
  """
  return NamedSharding(Mesh(np.array(jax.local_devices()[:n_devices]), (AXIS,)), P(AXIS))


def _device_count(n_devices: int | None, local_only: bool) -> int:
  n = n_devices or jax.local_device_count()
  if jax.process_count() > 1 and not local_only and n != jax.local_device_count():
    raise ValueError("a multi-process step uses every local device")
  return n


def replicate(tree: Any, n_devices: int | None = None, local_only: bool = False) -> Any:
  """Copies a pytree onto each local device once (leading axis = device).

  `local_only` places it for a pmap over this process's devices alone (decoding
  on one host of a multi-process job); otherwise for the global step.
  """
  n = _device_count(n_devices, local_only)
  stacked = jax.tree_util.tree_map(
      lambda x: np.broadcast_to(np.asarray(x), (n,) + np.shape(x)), tree)
  return jax.device_put(stacked, device_sharding(n))


def replicated_shapes(tree: Any, n_devices: int | None = None, local_only: bool = False
                      ) -> Any:
  """What `replicate(tree)` places, as shapes alone (`jax.ShapeDtypeStruct`s with the
  placement's sharding), for compiling programs before the values exist. `tree`'s leaves
  may be arrays or shapes."""
  n = _device_count(n_devices, local_only)
  sharding = device_sharding(n)
  return jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct((n,) + tuple(x.shape), x.dtype, sharding=sharding), tree)


def is_abstract(tree: Any) -> bool:
  """Whether every leaf of `tree` is a shape (`jax.ShapeDtypeStruct`), not a value."""
  leaves = jax.tree_util.tree_leaves(tree)
  return bool(leaves) and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)


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
  return jax.device_put(tree, device_sharding(_device_count(n_devices, local_only)))


def any_process(flags: Sequence[bool], clock: float) -> tuple[list[bool], float]:
  """Each flag OR-ed over all processes, and the latest of their clock readings.

  Stop, budget and checkpoint decisions must be the same on every process, or
  one would wait for the others in a collective forever. One exchange carries
  them all; it blocks until this process's queued steps are done, so the
  training loop calls it at intervals, not every step.
  """
  if jax.process_count() == 1:
    return list(flags), clock
  from jax.experimental import multihost_utils
  mine = np.asarray([float(f) for f in flags] + [clock], np.float64)
  every = np.asarray(multihost_utils.process_allgather(mine)).reshape(-1, len(mine))
  return [bool(x) for x in every[:, :-1].max(axis=0)], float(every[:, -1].max())


def compile_all(jobs: dict[Any, Callable[[], Any]], workers: int) -> dict[Any, Any]:
  """Runs each job (a lowering and its `.compile()`), `workers` at a time: XLA compiles in
  threads of its own once a program is traced. The compiled programs, by the jobs' keys."""
  import concurrent.futures
  with concurrent.futures.ThreadPoolExecutor(max(1, workers)) as pool:
    return dict(zip(jobs, pool.map(lambda job: job(), jobs.values())))


class ShapeDispatch:
  """A jitted or pmapped `fn` and the programs compiled ahead for it (`compile_ahead`), by
  the shapes of the arguments at `keyed` (the others, such as the parameters, keep theirs
  through a run) and the values of those at `static`: a call runs the program of its
  shapes, or `fn` itself, which compiles at its first call as jit does, for shapes not
  compiled ahead. The trainer's steps, the beam search's parts and the benchmarks' cases all
  go through one, so that a run's programs compile before its first step, side by side."""

  def __init__(self, fn: Callable, keyed: tuple[int, ...], static: tuple[int, ...] = (),
               local: bool = False):
    """`local`: `fn` is pmapped over this process's devices alone (a decoder's), not over
    every process's (the trainer's steps)."""
    self.fn, self.keyed, self.static, self.local = fn, keyed, static, local
    self.programs: dict[tuple, Any] = {}
    # Plans of programs compiled for their memory alone (`compile_ahead(keep=False)`).
    self.planned: dict[tuple, int | None] = {}

  def key(self, args: tuple) -> tuple:
    """Which program fits `args`: the keyed arguments' shapes and dtypes, the static values."""
    return (tuple((tuple(x.shape), str(x.dtype)) for i in self.keyed
                  for x in jax.tree_util.tree_leaves(args[i]))
            + tuple(args[i] for i in self.static))

  def __call__(self, *args: Any) -> Any:
    program = self.programs.get(self.key(args)) if self.programs else None
    if program is None:
      return self.fn(*args)
    return program(*(a for i, a in enumerate(args) if i not in self.static))

  def plans(self) -> dict[tuple, int | None]:
    """`planned_bytes` of each program compiled ahead, by its key."""
    return {**self.planned,
            **{key: planned_bytes(program) for key, program in self.programs.items()}}


def compile_ahead(calls: list[tuple[ShapeDispatch, tuple]], workers: int,
                  keep: bool = True) -> int:
  """Compiles each call's program (arguments may be shapes, `jax.ShapeDtypeStruct`s) that its
  ShapeDispatch does not have yet, `workers` at a time; returns how many it compiled.
  `keep=False`: only their memory plans are kept (`ShapeDispatch.planned`), and calls
  compile as jit does: a multi-process job's steps take host-local batches, which a program
  compiled ahead for every process's devices does not (its first call on process 0 then
  finds the program in the persistent compilation cache this compilation filled)."""
  jobs, owners = {}, {}
  for dispatch, args in calls:
    key = (id(dispatch), dispatch.key(args))
    if (key[1] not in dispatch.programs and key[1] not in dispatch.planned
        and key not in jobs):
      jobs[key] = lambda d=dispatch, a=args: d.fn.lower(*_lowering_args(d, a)).compile()
      owners[key] = dispatch
  for job, program in compile_all(jobs, workers).items():
    if keep:
      owners[job].programs[job[1]] = program
    else:
      owners[job].planned[job[1]] = planned_bytes(program)
  return len(jobs)


def _lowering_args(dispatch: ShapeDispatch, args: tuple) -> tuple:
  """What `lower` takes for a call's `args` (this process's shapes or arrays). In a
  multi-process job pmap takes host-local arrays and makes them global itself, which it
  cannot do for shapes: the arguments become the global program's abstract values (the
  device axis of every process for the trainer's steps, of this process's for a local
  pmap), which pmap lowers as they are."""
  if jax.process_count() == 1:
    return args
  scale = 1 if dispatch.local else jax.process_count()
  aval = lambda x: (jax.core.ShapedArray((x.shape[0] * scale,) + tuple(x.shape[1:]), x.dtype)
                    if hasattr(x, "shape") and hasattr(x, "dtype") else x)
  return tuple(a if i in dispatch.static else jax.tree_util.tree_map(aval, a)
               for i, a in enumerate(args))


def planned_bytes(compiled: Any) -> int | None:
  """Device bytes a compiled program holds while it runs, by XLA's buffer assignment: its
  arguments, its outputs that reuse no donated argument, and its temporaries (one block on
  a GPU). Per device for a pmapped program. A program whose plan exceeds what XLA may
  allocate cannot run; None where the backend gives no analysis."""
  try:
    m = compiled.memory_analysis()
  except Exception:  # not every backend (or program kind) implements it
    return None
  if m is None:
    return None
  return int(m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
             + m.temp_size_in_bytes)


T = TypeVar("T")
# Each `process_zero_first` of a job announces under a key of its own.
_ANNOUNCEMENTS = itertools.count()
WAIT_REPORT_MS = 60_000  # how often a waiting process says it is still waiting


def process_zero_first(action: Callable[[], T], what: str) -> T:
  """`action()` on process 0 while the other processes wait, then on each of them.

  For work that writes shared files, such as data preparation: with a shared folder the
  others then find process 0's result and redo nothing, and no two processes write the
  same files at once (tfds does not support concurrent builds). Where process 0's folder
  is not theirs (a per-node data folder), they do the work themselves. A failure on process
  0 ends every process with the same one-line error, not a wait for ever.
  """
  if jax.process_count() == 1:
    return action()
  if jax.process_index() == 0:
    return process_zero_only(action, what)
  process_zero_only(action, what)
  return action()


def process_zero_only(action: Callable[[], T], what: str) -> T | None:
  """`action()` on process 0 alone, on its own devices, while the other processes wait for
  it (None there): decoding and averaging, one-host work, inside a multi-host job whose
  hosts cannot run a program alone (a TPU slice's). A failure on process 0 ends every
  process with the same one-line error."""
  if jax.process_count() == 1:
    return action()
  from jax._src import distributed  # the job's key-value store (orbax uses it the same way)
  client = distributed.global_state.client
  key = f"t2t_jax/{what.replace(' ', '_')}/{next(_ANNOUNCEMENTS)}"
  if jax.process_index() == 0:
    try:
      result = action()
    except BaseException as e:
      client.key_value_set(key, f"failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
      raise
    client.key_value_set(key, "done")
    return result
  start = time.time()
  print(f"process {jax.process_index()}: waiting for process 0 to {what}", flush=True)
  while True:
    try:
      outcome = client.blocking_key_value_get(key, WAIT_REPORT_MS)
      break
    except jax.errors.JaxRuntimeError as e:
      if "DEADLINE_EXCEEDED" not in str(e):
        raise
      print(f"process {jax.process_index()}: still waiting for process 0 to {what} "
            f"({(time.time() - start) / 60:.0f} min)", flush=True)
  if outcome != "done":
    raise UserError(f"process 0 could not {what}: {outcome.removeprefix('failed: ')}")
  return None


class WaitStopped(Exception):
  """A stop was requested while `Prefetcher.__next__` waited for a batch."""


class Prefetcher:
  """Yields `produce(start)`, `produce(start + 1)`, ... placed on the devices, each made
  ahead in a background thread while the devices run the step before it.

  `produce` must be a pure function of the step, so prefetching changes nothing in what
  training sees. An exception in the thread is raised by the `next()` that would have
  returned its batch, never a hang. `wait_sec` is the time `next()` spent waiting for a
  batch (the devices idle for want of input, as far as the host can tell) and `cpu_sec`
  the thread's own CPU time, both running totals.
  """

  def __init__(self, produce: Callable[[int], Any], start: int, size: int,
               place: Callable[[Any], Any], stop_requested: Callable[[], bool] = lambda: False):
    """`stop_requested`: polled while `next()` waits, so that a stop (a SIGTERM) is not held
    up by an input thread that hangs (a stalled network filesystem): `next()` then raises
    `WaitStopped`."""
    self._stop_requested = stop_requested
    self._queue: queue.Queue = queue.Queue(maxsize=max(1, size))
    self._stop = threading.Event()
    self.wait_sec = 0.0
    self.cpu_sec = 0.0
    self._thread = threading.Thread(target=self._run, args=(produce, start, place),
                                    name="prefetch", daemon=True)
    self._thread.start()

  def _run(self, produce, step, place) -> None:
    try:
      while not self._stop.is_set():
        cpu = time.thread_time()
        item = place(produce(step))
        self.cpu_sec += time.thread_time() - cpu
        self._put(item)
        step += 1
    except BaseException as e:  # handed to the consumer, which raises it
      self._put(_Failure(e))

  def _put(self, item) -> None:
    while not self._stop.is_set():
      try:
        self._queue.put(item, timeout=0.1)
        return
      except queue.Full:
        continue

  def __iter__(self) -> "Prefetcher":
    return self

  def __next__(self) -> Any:
    start = time.perf_counter()
    while True:
      try:
        item = self._queue.get(timeout=1.0)
        break
      except queue.Empty:
        if not self._thread.is_alive():
          raise RuntimeError("the input thread ended without a batch or an error") from None
        if self._stop_requested():
          raise WaitStopped from None
    self.wait_sec += time.perf_counter() - start
    if isinstance(item, _Failure):
      self.close()
      raise item.error
    return item

  def close(self) -> None:
    # A thread that hangs in `produce` (the reason to stop, maybe) is a daemon: it is left
    # behind after a short wait rather than holding up the exit.
    self._stop.set()
    self._thread.join(timeout=10)


class _Failure:
  def __init__(self, error: BaseException):
    self.error = error
