"""Orbax checkpoints: WORKDIR/checkpoints/<step> for training, WORKDIR/averaged for inference.

Orbax writes each checkpoint into a temporary directory and renames it when
complete, so a process killed mid-write leaves the previous checkpoint as the
newest complete one. Training never resumes from the averaged directory. Each
checkpoint holds the parameters and the rest of the training state apart, so
that the older ones, kept for averaging, keep their parameters alone.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from t2t_jax import retention, storage
from t2t_jax.config import ExperimentConfig
from t2t_jax.workdirs import averaged_dir, first_line, run_info
from t2t_jax.errors import UserError


def _abstract(tree: Any) -> Any:
  return jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, tree)


# A checkpoint's two items: the parameters, which averaging and inference read, and the rest
# of the training state (Adam's moments, the step), which only resuming needs. Older
# checkpoints keep their parameters alone, a third of the bytes.
PARAMS, TRAINING = "params", "training"
DISCARD = ".discard"  # WORKDIR/.discard: items being deleted, out of orbax's sight


def processes(alone: bool) -> ocp.options.MultiprocessingOptions:
  """Orbax's processes: this one alone (it then waits for no other), or every one."""
  if not alone:
    return ocp.options.MultiprocessingOptions()
  me = jax.process_index()
  return ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me})


def _items(state: Any) -> dict[str, Any]:
  """A training state (anything with a `params` field) as the checkpoint's two items."""
  return {PARAMS: state.params, TRAINING: state.replace(params=None)}


class Checkpointer:
  """A workdir's training checkpoints: the newest `keep` whole (parameters and optimiser
  state: what resuming, or falling back past a damaged newest one, needs), and the averaging
  window of `keep_for_average` (`retention.kept`) with their parameters alone; every other
  checkpoint is deleted once a newer one is committed.

  `async_save`: `save` returns once the state is handed over, and orbax writes the files in a
  background thread while training goes on (a big model's checkpoint is 2.6 GB: seconds of
  writing, during which the devices would otherwise wait). The next save, `wait` and `close`
  wait for it (and only then prune: while one is written the older ones stay whole); a
  failed background write is raised there.
  """

  def __init__(self, workdir: str, keep: int, create: bool = True, async_save: bool = False,
               keep_for_average: int = 0, alone: bool = False,
               spacing: retention.Spacing = retention.Spacing()):
    """`alone`: only this process uses it (averaging and decoding on process 0 of a
    multi-host job); otherwise every process of the job calls each method together.
    `spacing`: how far apart averaged checkpoints are (`retention.window`)."""
    self.directory = storage.join(storage.normalize(workdir), "checkpoints")
    # Each step holds two StandardSave items; naming their handlers lets orbax read an item's
    # metadata (stored shapes) without restoring it. Retention is `_prune`'s, not orbax's.
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=None, create=create,
                                             enable_async_checkpointing=async_save,
                                             multiprocessing_options=processes(alone)),
        item_handlers={PARAMS: ocp.StandardCheckpointHandler(),
                       TRAINING: ocp.StandardCheckpointHandler()})
    self.async_save = async_save
    self.keep, self.keep_for_average, self.spacing = keep, keep_for_average, spacing
    self._written: dict[int, retention.Written] = {}
    self._metadata: dict[int, Any] = {}  # orbax's metadata of a step, once read
    self._unpruned = False  # a save whose commit has not been followed by pruning

  def steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def resumable_steps(self) -> list[int]:
    """The steps whose whole training state is stored (the others kept parameters alone)."""
    return [s for s in self.steps() if storage.isdir(self._item_dir(s, TRAINING))]

  def averaging_steps(self) -> list[int]:
    """The steps written for averaging (`save(for_average=True)`): on the schedule that
    `average.spacing` names, and the last step, not one written on a signal or between."""
    return [s for s in self.steps() if self.for_average(s)]

  def average_window(self, n: int) -> list[int]:
    """The `n` checkpoints averaging reads (`retention.window`), oldest first."""
    return retention.window(self.written(), n, self.spacing)

  def written(self) -> list[retention.Written]:
    return [self._record(s) for s in self.steps()]

  def for_average(self, step: int) -> bool:
    return self._record(step).for_average

  def _record(self, step: int) -> retention.Written:
    """What the policy needs of checkpoint `step`, from its metadata."""
    if step not in self._written:
      try:
        custom = self._step_metadata(step).custom_metadata or {}
      except Exception:  # damaged metadata: restoring says what is wrong
        custom = {}
      elapsed = custom.get("elapsed_sec")
      self._written[step] = retention.Written(
          step, bool(custom.get("for_average", True)),
          float(elapsed) if isinstance(elapsed, (int, float)) else None)
    return self._written[step]

  def _step_metadata(self, step: int) -> Any:
    """orbax's metadata of checkpoint `step`, read once while this step is not saved again:
    the averaging policy and the checkpoint's identity both need it (~0.1 s a read on a
    local disk, a download in a bucket). A read that fails is not kept."""
    if step not in self._metadata:
      self._metadata[step] = self._manager.metadata(step)
    return self._metadata[step]

  def _item_dir(self, step: int, item: str) -> str:
    return storage.join(self.directory, str(step), item)

  def save(self, step: int, state: Any, for_average: bool = True,
           on_signal: bool = False, elapsed_sec: float | None = None) -> str:
    """Saves a host copy of `state` as checkpoint `step`; returns its path. Once it is
    committed, checkpoints no longer kept are deleted, or stripped to their parameters
    (`_prune`): with `async_save` at the next save, `wait` or `close`.

    `on_signal`: written off schedule (a preemption), so averaging leaves it out.
    `elapsed_sec`: the run's training time, which `average.spacing=minutes` spaces by.
    """
    for_average = for_average and not on_signal
    self._metadata.pop(step, None)  # a new checkpoint under this step: new metadata
    self.wait()  # the previous save is committed (and pruned after) before this one begins
    custom = {"for_average": for_average}
    if elapsed_sec is not None:
      custom["elapsed_sec"] = round(float(elapsed_sec), 3)
    self._manager.save(step, args=ocp.args.Composite(
        **{k: ocp.args.StandardSave(v) for k, v in _items(state).items()}),
        custom_metadata=custom, force=True)
    self._written[step] = retention.Written(step, for_average, custom.get("elapsed_sec"))
    self._unpruned = True
    if on_signal or not self.async_save:
      self.wait()  # a signal's checkpoint is complete before the process exits
    return storage.join(self.directory, str(step))

  def _prune(self) -> None:
    """Deletes the committed checkpoints that are kept neither whole nor for averaging
    (`retention.kept`), and strips to their parameters the averaging ones no longer kept
    whole. Called with every save committed, so that the newest `keep` whole ones are whole
    on disk. Every process calls it (deleting is collective) and decides from the same
    listing, so all of them delete the same steps together."""
    steps = self.steps()
    keep = retention.kept(self.written(), self.keep, self.keep_for_average, self.spacing)
    for step in steps:
      if step in keep.whole:
        continue
      if step in keep.params_only:
        if jax.process_index() == 0 and storage.isdir(self._item_dir(step, TRAINING)):
          self._discard(self._item_dir(step, TRAINING))
      else:
        self._manager.delete(step)

  def _discard(self, path: str) -> None:
    """Removes a folder by moving it out of the checkpoint first: one killed mid-way leaves
    a checkpoint whole or stripped, never half of an item. (A bucket has no atomic move: its
    objects are deleted in place, and a checkpoint stripped half-way is not among the newest,
    which resuming reads.)"""
    storage.discard_tree(path, os.path.join(os.path.dirname(self.directory), DISCARD),
                         os.path.basename(os.path.dirname(path)))

  def restore(self, step: int, like: Any) -> Any:
    """Checkpoint `step` in the shapes of `like` (a training state). The stored shapes are
    compared first: an array of another shape (another model's checkpoint) is a
    `_StructureMismatch` before any array is read, where orbax's own refusal leaves its
    reads failing in the background with a traceback each."""
    mismatch = _stored_mismatch(self._manager, step, like)
    if mismatch:
      raise _StructureMismatch(mismatch)
    restored = self._manager.restore(step, args=ocp.args.Composite(
        **{k: ocp.args.StandardRestore(_abstract(v)) for k, v in _items(like).items()}))
    return restored[TRAINING].replace(params=restored[PARAMS])

  def check_layout(self) -> None:
    """Checkpoints of one item ("default"), written before the parameters and the training
    state were stored apart, are a one-line error here rather than a failed restore."""
    old = [s for s in self.steps() if storage.isdir(self._item_dir(s, "default"))]
    if old:
      raise UserError(f"checkpoints {old} in {self.directory} were written by an earlier "
                      f"t2t_jax, as one item; this version stores parameters and training "
                      f"state apart. Use that version with this workdir, or another --workdir")

  def params(self, step: int, like: Any = None) -> Any:
    """Checkpoint `step`'s parameters alone, in the shapes of `like` (None: as stored, host
    arrays): what averaging and inference read, whatever optimiser wrote them."""
    if storage.isdir(self._item_dir(step, "default")):
      self.check_layout()
    wanted = None if like is None else _abstract(like)
    return self._manager.restore(step, args=ocp.args.Composite(
        **{PARAMS: ocp.args.StandardRestore(wanted)}))[PARAMS]

  def identity(self, step: int) -> str | None:
    """Which checkpoint this is, not just its step (a retrained workdir writes new
    checkpoints under the same step numbers): the nanosecond orbax began writing it, from
    its metadata, which a copy of the workdir keeps. None when that cannot be read."""
    try:
      stamp = self._step_metadata(step).init_timestamp_nsecs
    except Exception:  # a damaged checkpoint's metadata: no identity to compare
      return None
    return None if stamp is None else str(stamp)

  def restore_latest(self, like: Any, retries: int = 3) -> tuple[Any, int] | None:
    """The newest checkpoint that restores, and its step (`Resumer.latest`)."""
    return Resumer(self).latest(like, retries)

  def agree(self, restored: tuple[Any, int] | None, error: str | None, fingerprint: int
            ) -> tuple[Any, int] | None:
    """Every process restored the same (`Resumer.agree`)."""
    return Resumer(self).agree(restored, error, fingerprint)

  def wait(self) -> None:
    """Returns when every save is committed (raising the error of one that failed), the
    checkpoints no longer kept pruned."""
    self._manager.wait_until_finished()
    if self._unpruned:
      self._unpruned = False
      self._prune()

  def close(self) -> None:
    """Waits for the saves in flight, then releases the manager."""
    try:
      self.wait()
    finally:
      self._manager.close()


class Resumer:
  """Resuming from a workdir's checkpoints: the newest that restores; the one before it when
  the newest's own files are broken (which is then set aside); a one-line error for
  everything else. Another model's checkpoint is refused in one way: by the stored shapes and
  names (`Checkpointer.restore`), before any array is read."""

  def __init__(self, ckpt: Checkpointer):
    self.ckpt = ckpt

  def latest(self, like: Any, retries: int = 3) -> tuple[Any, int] | None:
    """The newest checkpoint that restores; None when the workdir has none.

    An error that is not the checkpoint's own (a shape or structure of another model, memory,
    permissions, an orbax version) would fail every checkpoint alike, so nothing may be moved
    on its account: only when the newest checkpoint fails and the one before it restores is
    the newest set aside (by process 0; the others skip it), and never more than that one. If
    neither restores, or a checkpoint holds another model's state, it is a one-line error with
    nothing moved; an I/O error is retried, then is one.
    """
    self.ckpt.check_layout()
    steps = self.ckpt.resumable_steps()
    if not steps and self.ckpt.steps():
      raise UserError(f"no checkpoint in {self.ckpt.directory} holds a whole training state (the "
                      f"older ones keep their parameters alone, for averaging); it cannot be "
                      f"resumed: average or decode it, or train in another --workdir")
    failed: tuple[int, str, Exception] | None = None
    for step in reversed(steps):
      path = storage.join(self.ckpt.directory, str(step))
      try:
        restored = self._restore_retrying(step, like, retries)
      except _StructureMismatch as e:
        raise UserError(f"checkpoint {path} does not hold this run's training state (first "
                        f"difference: {e}); nothing was moved. It was written by another "
                        f"model, optimiser or version: use another --workdir") from None
      except Exception as e:
        if not storage.isdir(path):  # process 0 set it aside while this process read it
          print(f"warning: checkpoint {path} was set aside by process 0; trying the previous "
                f"one", file=sys.stderr, flush=True)
          self.ckpt._manager.reload()
          continue
        if _transient(e):
          raise UserError(f"could not read checkpoint {path} ({e.strerror or e}) after "
                          f"{retries} tries; nothing was moved: run the command again") from None
        if failed is not None:  # two in a row: not one broken checkpoint's fault
          raise UserError(
              f"checkpoints {failed[0]} and {step} in {self.ckpt.directory} both fail to restore "
              f"({type(failed[2]).__name__}: {first_line(failed[2])}); nothing was moved. "
              f"Fix the cause (memory, permissions, versions) and run the command again") \
              from None
        failed = (step, path, e)
        continue
      if failed is not None:
        self._set_aside(failed[0], failed[1], failed[2])
      return restored, step
    if failed is not None:
      raise UserError(f"checkpoint {failed[1]}, the only one, fails to restore "
                      f"({type(failed[2]).__name__}: {first_line(failed[2])}); nothing was "
                      f"moved. Fix the cause, or move it away to start again from step 0") \
          from None
    return None

  def agree(self, restored: tuple[Any, int] | None, error: str | None, fingerprint: int
            ) -> tuple[Any, int] | None:
    """After each process's `restore_latest`: in a multi-process job, every process checks
    that all of them restored, the same step, with the same config (`fingerprint`), and a
    failure on any process is the same one-line error on all of them (none is left waiting
    for the others). Then every process lists the same steps (process 0 may have set one
    aside; saving is collective, and a process still listing a moved step would skip it)."""
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils
      mine = np.array([0 if error else 1, restored[1] if restored else -1, fingerprint],
                      np.int32)
      every = np.asarray(multihost_utils.process_allgather(mine)).reshape(-1, 3)
      self.ckpt._manager.reload()
      if error:
        print(f"error: {error}", file=sys.stderr, flush=True)
      failed = [i for i, row in enumerate(every) if row[0] == 0]
      if failed:
        raise UserError(f"process(es) {failed} of {len(every)} could not restore a checkpoint "
                        f"in {self.ckpt.directory} (see their error lines); every process stops")
      if len(set(every[:, 1].tolist())) > 1:
        raise UserError(f"the processes restored different checkpoints "
                        f"({every[:, 1].tolist()}, -1: none) from {self.ckpt.directory}; the "
                        f"workdir must be one folder that every host shares")
      if len(set(every[:, 2].tolist())) > 1:
        raise UserError("the processes run different configurations: every process of a "
                        "job must run the same command (the same --experiment and --set)")
    self.ckpt._manager.reload()
    if error:
      raise UserError(error)
    return restored

  def _set_aside(self, step: int, path: str, error: Exception) -> None:
    """A checkpoint whose own files are broken: process 0 moves it out of the way, to a new
    name (what an earlier start set aside is never replaced)."""
    aside = unused_name(storage.join(storage.dirname(self.ckpt.directory),
                                     f"corrupt_checkpoint_{step}"))
    if jax.process_index() == 0:
      print(f"warning: checkpoint {path} could not be restored ({type(error).__name__}); "
            f"moved to {aside}; resuming from the previous one", file=sys.stderr, flush=True)
      storage.move(path, aside)
      self.ckpt._manager.reload()
    else:
      print(f"warning: checkpoint {path} could not be restored ({type(error).__name__}); "
            f"process 0 sets it aside, trying the previous one", file=sys.stderr, flush=True)

  def _restore_retrying(self, step: int, like: Any, retries: int) -> Any:
    for attempt in range(retries):
      try:
        return self.ckpt.restore(step, like)
      except OSError as e:
        if not _transient(e) or attempt == retries - 1:
          raise
        time.sleep(2.0 ** attempt)


def _stored_mismatch(manager: Any, step: int, like: Any) -> str | None:
  """The first array whose stored shape or presence differs from `like`'s, or None (also
  when the metadata cannot be read: restoring then says what is wrong)."""
  try:
    metadata = manager.item_metadata(step)
    stored = {f"{item}.{name}": shape for item in (PARAMS, TRAINING)
              for name, shape in _shapes_by_name(metadata[item]).items()}
  except Exception:
    return None
  wanted = {f"{item}.{name}": shape for item, tree in _items(like).items()
            for name, shape in _shapes_by_name(tree).items()}
  for name in sorted(wanted.keys() | stored.keys()):
    if name not in stored:
      return f"{name} is not in the checkpoint"
    if name not in wanted:
      return f"the checkpoint holds {name}, which this run does not have"
    if tuple(stored[name]) != tuple(wanted[name]):
      return (f"{name} is stored with shape {tuple(stored[name])}, this run's is "
              f"{tuple(wanted[name])}")
  return None


# What orbax writes last into a checkpoint it commits in place (a bucket has no rename).
def unused_name(path: str) -> str:
  """`path`, or `path`.1, .2, ...: the first that does not exist (nothing set aside is
  ever replaced)."""
  candidate, n = path, 0
  while storage.exists(candidate):
    n += 1
    candidate = f"{path}.{n}"
  return candidate


def _shapes_by_name(tree: Any) -> dict[str, tuple[int, ...]]:
  """{"opt_state.0.mu.decoder_0.ffn.kernel": shape, ...}: a tree's leaves by their dotted
  path, the naming a checkpoint's metadata uses, from arrays, shapes or that metadata."""
  def name(path) -> str:
    return ".".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k))))
                    for k in path)
  return {name(path): tuple(leaf.shape)
          for path, leaf in jax.tree_util.tree_leaves_with_path(tree) if leaf is not None}


def _transient(error: Exception) -> bool:
  """An I/O error worth retrying (a network filesystem's hiccup), not a broken file."""
  import errno
  return isinstance(error, OSError) and error.errno in (
      errno.EIO, errno.EAGAIN, errno.ETIMEDOUT, errno.ESTALE, errno.EBUSY, errno.EINTR,
      errno.ECONNRESET)


class _StructureMismatch(Exception):
  """A checkpoint that reads fine but holds another state structure than asked for."""


def average_params(workdir: str, last: int, like_params: Any,
                   spacing: retention.Spacing = retention.Spacing()) -> tuple[Any, list[int]]:
  """The element-wise mean of the last `last` checkpoints' parameters, and their steps, in
  memory (a window chosen after training, e.g. on dev, without replacing the run's average).

  Only the checkpoints written for averaging count (`Checkpointer.averaging_steps`: on the
  schedule `average.spacing` names, and the last step); one written on a signal, at whatever
  moment the job was preempted, or by time between scheduled ones, is left out, and so is a
  scheduled one too close before the last step's (`retention.window`). Asking for more than
  training kept (its `average.last`; the older ones were deleted) is an error.
  """
  mean, steps, ckpt = _average(workdir, last, like_params, spacing)
  ckpt.close()
  return mean, steps


def _average(workdir: str, last: int, like_params: Any, spacing: retention.Spacing
             ) -> tuple[Any, list[int], "Checkpointer"]:
  if not storage.isdir(storage.join(workdir, "checkpoints")):
    raise FileNotFoundError(f"no checkpoints in {storage.join(workdir, 'checkpoints')}")
  ckpt = Checkpointer(workdir, keep=10**6, create=False, alone=True, spacing=spacing)
  steps = ckpt.average_window(last)
  if not steps:
    raise FileNotFoundError(f"no checkpoints in {ckpt.directory}")
  kept_by_training = (run_info(workdir) or {}).get("config", {}).get("average", {}).get("last")
  if len(steps) < last and isinstance(kept_by_training, int) and kept_by_training < last:
    ckpt.close()
    raise UserError(f"average.last={last}, but training kept {kept_by_training} checkpoints "
                    f"for averaging (its average.last; the older ones were deleted): "
                    f"{steps}. Use average.last<={len(steps)}, or set average.last before "
                    f"training")
  total = None
  for step in steps:
    try:
      params = ckpt.params(step, like_params)
    except Exception as e:  # a damaged or foreign checkpoint: name it, average nothing
      ckpt.close()
      raise UserError(f"cannot average: checkpoint {storage.join(ckpt.directory, str(step))} "
                      f"does not restore ({type(e).__name__}: {first_line(e)}); move it "
                      f"away or lower average.last, then run --mode=average again") from None
    params = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float64), params)
    total = params if total is None else jax.tree_util.tree_map(np.add, total, params)
  mean = jax.tree_util.tree_map(lambda x: (x / len(steps)).astype(np.float32), total)
  return mean, steps, ckpt


def average(workdir: str, last: int, like_state: Any,
            spacing: retention.Spacing = retention.Spacing()) -> tuple[str, list[int]]:
  """Writes the element-wise mean of the last `last` checkpoints' parameters (section 6.1:
  "the last 5 checkpoints, which were written at 10-minute intervals") to WORKDIR/averaged,
  the steps used to averaged.json (`average_params` says which checkpoints count)."""
  mean, steps, ckpt = _average(workdir, last, like_state.params, spacing)
  out = averaged_dir(workdir)
  # Written beside the old average and renamed into place; in a bucket (no rename) in place,
  # averaged.json last: an average without it is damaged (inference says so and asks for
  # --mode=average), never half-used.
  with storage.replacing_folder(out) as tmp:
    with ocp.StandardCheckpointer(multiprocessing_options=processes(alone=True)) as writer:
      writer.save(storage.join(tmp, "params"), mean)
    storage.write_atomic(storage.join(tmp, "averaged.json"), json.dumps(
        {"steps": steps, "identity": {str(s): ckpt.identity(s) for s in steps}}))
  ckpt.close()
  return out, steps


def _why_average_is_stale(record: dict[str, Any], ckpt: Checkpointer) -> str | None:
  """None when the average's checkpoints are the ones listed now, else why not."""
  identity = record.get("identity")
  if identity is None:
    return None  # an average written before identities were recorded: steps alone
  steps = ckpt.steps()
  for step, ident in identity.items():
    if int(step) not in steps:  # deleted, or pruned by newer checkpoints
      return f"checkpoint {step} is gone"
    if isinstance(ident, list):  # recorded before 2026-11-27: [inode, mtime]; a copy keeps
      now = storage.mtime_ns(storage.join(ckpt.directory, str(step)))  # the mtime
      if now != ident[1]:
        return f"checkpoint {step} was rewritten since (a new training run)"
      continue
    now = ckpt.identity(int(step))
    if ident is not None and now is None:  # damaged, not rewritten as far as anyone can tell
      print(f"warning: checkpoint {step}'s metadata does not read, so whether it is the one "
            f"averaged cannot be checked; the average is used", file=sys.stderr, flush=True)
    elif ident is not None and now != ident:
      return f"checkpoint {step} was rewritten since (a new training run)"
  return None


def load_params_for_inference(workdir: str, cfg: ExperimentConfig) -> tuple[Any, str] | None:
  """Averaged parameters when they cover the newest checkpoint, else the newest checkpoint's
  (saying so when an older average is passed over); None if neither exists."""
  from t2t_jax import model
  like = model.abstract_params(cfg.model)
  avg = averaged_dir(workdir)
  storage.settle_replacement(avg)  # an average being replaced when a kill came: the new one
  ckpt = Checkpointer(workdir, keep=10**6, create=False, alone=True) \
      if storage.isdir(storage.join(workdir, "checkpoints")) else None
  newest = ckpt.steps()[-1] if ckpt and ckpt.steps() else None
  # The average is current when it covers the newest checkpoint that averaging would take: a
  # checkpoint written on a signal (a preemption) never is, as `average` leaves it out.
  scheduled = ckpt.averaging_steps() if ckpt else []
  redo = "run --mode=average to write it again"
  try:
    if storage.exists(avg):
      try:
        record = json.loads(storage.read_text(storage.join(avg, "averaged.json")))
        steps = [int(s) for s in record["steps"]]
      except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{avg} is damaged ({os.path.basename(avg)}/averaged.json: "
                        f"{type(e).__name__}); {redo}") from None
      stale = _why_average_is_stale(record, ckpt) if ckpt else None
      if stale:
        print(f"warning: {avg} averages checkpoints {steps[0]}..{steps[-1]}, but {stale}; "
              f"using checkpoint {newest} (run --mode=average to average the new "
              f"checkpoints)", file=sys.stderr, flush=True)
      elif not scheduled or scheduled[-1] <= steps[-1]:
        try:
          with ocp.StandardCheckpointer(multiprocessing_options=processes(alone=True)
                                        ) as reader:
            params = reader.restore(storage.join(avg, "params"), like)
        except Exception as e:  # truncated or foreign files: name them, load nothing
          raise UserError(f"{avg} does not restore ({type(e).__name__}: {first_line(e)}); "
                          f"{redo}") from None
        return params, f"average of checkpoints {steps[0]}..{steps[-1]} ({len(steps)})"
      else:  # a run resumed after averaging: its average would be silently out of date
        print(f"warning: {avg} averages checkpoints {steps[0]}..{steps[-1]}, but checkpoint "
              f"{scheduled[-1]} is newer; using checkpoint {newest} (run --mode=average to "
              f"average the newest checkpoints)", file=sys.stderr, flush=True)
    if newest is None:
      return None
    step = newest
    try:
      params = jax.tree_util.tree_map(np.asarray, ckpt.params(step))
    except Exception as e:  # a damaged newest checkpoint: decode with no other one unasked
      raise UserError(f"checkpoint {storage.join(ckpt.directory, str(step))} does not restore "
                      f"({type(e).__name__}: {first_line(e)}); move it away to use the one "
                      f"before, or train again, which sets it aside") from None
    return params, f"checkpoint {step}"
  finally:
    if ckpt:
      ckpt.close()
