"""Training: a pmapped pure train step with gradient accumulation, and one readable loop.

Every optimiser update averages the label-smoothed cross-entropy over all
non-pad target tokens of the step, whatever the number of devices or
accumulation steps: per-micro-batch *sums* are accumulated with `lax.scan`,
averaged over devices with `lax.pmean`, and divided by the (equally averaged)
token count, and each example's dropout masks follow its row in the step's
global batch. So the 8-GPU recipe and its 1-device, 8-accumulation replay give
the same update, dropout included.

Resuming is exact: the input pipeline and the dropout RNG are pure functions
of (seed, step), so a checkpoint only needs the train state and its step.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import sys
import time
from typing import Any

import flax
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax

from t2t_jax import (backend, bookkeeping, checkpoints, input_pipeline, model, optim,
                     parallel, retention, workdirs)
from t2t_jax.config import ExperimentConfig, TrainConfig
from t2t_jax.data_sources import DataError
from t2t_jax.errors import UserError
from t2t_jax.loss import model_loss_sums


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  bad_step: jax.Array  # first step whose loss was not finite, else -1


def init_state(cfg: ExperimentConfig, optimizer: optax.GradientTransformation) -> TrainState:
  params = model.init_params(cfg.model, jax.random.PRNGKey(cfg.train.seed))
  return TrainState(step=jnp.array(0, jnp.int32), params=params,
                    opt_state=optimizer.init(params), bad_step=jnp.array(-1, jnp.int32))


OPTIMIZER_SCOPE = "optimizer"  # the named scope of the update, for step profiles


def train_step(state: TrainState, batch: dict[str, jax.Array], rng: jax.Array,
               lr_factor: jax.Array | float = 1.0, *, cfg: ExperimentConfig,
               optimizer: optax.GradientTransformation,
               axis_name: str = parallel.AXIS) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimiser update from a device's [accum, batch, length] share of the step.

  `rng` is the run's key; the update's dropout key is derived from it and the
  step counter on the devices (`step_rng`), so the host places nothing per step.
  `lr_factor` multiplies the scheduled learning rate (the time-budget cooldown): Adam's update
  is proportional to its rate, so scaling the update is exactly scaling the rate.
  """
  rng = step_rng(rng, state.step + 1)
  accum = batch["inputs"].shape[0]
  device = jax.lax.axis_index(axis_name)  # global: process-major, as the input pipeline lays out

  def micro(carry, xs):
    mb, index = xs
    # One key for the whole step; each example's masks follow its row in the step's global
    # batch (which the input pipeline fills micro-batch by micro-batch, device by device),
    # so 1 device with accumulation, 8 devices and 2 x 4 draw the same masks.
    rows = mb["inputs"].shape[0]
    transformer = model.Transformer(cfg.model, first_row=(device * accum + index) * rows,
                                    packed=backend.packing(cfg.data.packing))

    def loss_of(params):
      smoothed, nll, tokens = model_loss_sums(transformer, params, mb["inputs"], mb["targets"],
                                              cfg, train=True, rngs={"dropout": rng})
      return smoothed, (nll, tokens)

    (smoothed, (nll, tokens)), grads = jax.value_and_grad(loss_of, has_aux=True)(state.params)
    acc_grads, acc_loss, acc_nll, acc_tokens = carry
    return (jax.tree_util.tree_map(jnp.add, acc_grads, grads), acc_loss + smoothed,
            acc_nll + nll, acc_tokens + tokens), None

  zeros = jax.tree_util.tree_map(jnp.zeros_like, state.params)
  init = (zeros, jnp.float32(0), jnp.float32(0), jnp.float32(0))
  (grads, loss, nll, tokens), _ = jax.lax.scan(micro, init, (batch, jnp.arange(accum)))
  summed = (grads, loss, nll, tokens)
  if backend.allreduce_as_one_buffer():
    flat, unflatten = jax.flatten_util.ravel_pytree(summed)
    grads, loss, nll, tokens = unflatten(jax.lax.pmean(flat, axis_name))
  else:
    grads, loss, nll, tokens = jax.lax.pmean(summed, axis_name)
  tokens = jnp.maximum(tokens, 1e-9)
  grads = jax.tree_util.tree_map(lambda g: g / tokens, grads)
  # A step whose loss or gradients are not finite leaves the state as it was and records the
  # step. The check reads only what exists before the update (not the new parameters, whose
  # norm cost a second pass over the state), so XLA can compute Adam's moments, the update
  # and the choice of new or old state in one elementwise pass per parameter.
  with jax.named_scope(OPTIMIZER_SCOPE):  # for step profiles (tools/step_profile.py)
    finite = update_is_finite(loss, grads)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    keep = lambda new, old: jax.tree_util.tree_map(lambda a, b: jnp.where(finite, a, b), new,
                                                   old)
    params = jax.tree_util.tree_map(lambda p, u: jnp.where(finite, p + u * lr_factor, p),
                                    state.params, updates)
    opt_state = keep(opt_state, state.opt_state)
  new_state = TrainState(
      step=state.step + 1, params=params, opt_state=opt_state,
      bad_step=jnp.where((state.bad_step < 0) & ~finite, state.step + 1, state.bad_step))
  metrics = {"loss": loss / tokens, "nll": nll / tokens,
             "tokens": tokens * jax.lax.psum(1, axis_name),
             "learning_rate": optim.schedule(cfg)(state.step) * lr_factor}
  return new_state, metrics


def update_is_finite(loss: jax.Array, grads: Any) -> jax.Array:
  """Whether an update may be applied: its loss is finite and so is every gradient entry's
  square, which Adam's second moment takes (a gradient of 3e38 is finite, its square is
  not: the moment would be +inf and the entry's updates 0 for the rest of the run). A NaN
  fails the comparison too. (A finite update that overflows a parameter shows in the next
  step's loss.)"""
  finite = jnp.isfinite(loss)
  for g in jax.tree_util.tree_leaves(grads):
    finite &= jnp.all(jnp.abs(g) <= math.sqrt(float(jnp.finfo(g.dtype).max)))
  return finite


def eval_step(params: Any, batch: dict[str, jax.Array], *, cfg: ExperimentConfig,
              axis_name: str = parallel.AXIS) -> dict[str, jax.Array]:
  """Summed smoothed loss, NLL and token count over a [batch, length] share."""
  smoothed, nll, tokens = model_loss_sums(model.Transformer(cfg.model), params,
                                          batch["inputs"], batch["targets"], cfg)
  return jax.lax.psum({"loss": smoothed, "nll": nll, "tokens": tokens}, axis_name)


def make_steps(cfg: ExperimentConfig, optimizer: optax.GradientTransformation, devices=None):
  """The pmapped train and eval steps (state donated)."""
  p_train = jax.pmap(functools.partial(train_step, cfg=cfg, optimizer=optimizer),
                     axis_name=parallel.AXIS, donate_argnums=(0,), devices=devices)
  p_eval = jax.pmap(functools.partial(eval_step, cfg=cfg), axis_name=parallel.AXIS,
                    devices=devices)
  return p_train, p_eval


class TrainPrograms:
  """The pmapped train and eval steps, each dispatched by batch shape to its program compiled
  before the first step (`parallel.ShapeDispatch`), so that no step waits for a compilation:
  a run that met each of its 27 length buckets for the first time mid-epoch compiled each
  then (41 s a shape for base on an H200). A shape not compiled ahead runs the pmapped
  function, as every shape does in a multi-process job (its lowering needs global batch
  shapes)."""

  def __init__(self, cfg: ExperimentConfig, optimizer: optax.GradientTransformation):
    p_train, p_eval = make_steps(cfg, optimizer)
    self.train_step = parallel.ShapeDispatch(p_train, keyed=(1,))  # by the batch's shapes
    self.eval_step = parallel.ShapeDispatch(p_eval, keyed=(1,))

  def calls(self, state: TrainState, run_key: jax.Array, factor: jax.Array,
            train_shapes: list[tuple[tuple[int, ...], ...]],
            eval_shapes: list[tuple[tuple[int, ...], ...]]) -> list[tuple[Any, tuple]]:
    """What `parallel.compile_ahead` compiles for these (inputs, targets) shape pairs."""
    batch = lambda shapes: {k: jax.ShapeDtypeStruct(shape, jnp.int32)
                            for k, shape in zip(("inputs", "targets"), shapes)}
    return ([(self.train_step, (state, batch(s), run_key, factor)) for s in train_shapes] +
            [(self.eval_step, (state.params, batch(s))) for s in eval_shapes])

  def memory_plans(self, state: TrainState, setting: int | str, held: int = 0
                   ) -> list[MemoryPlan]:
    """The device memory of each step compiled ahead (`check_device_memory`). The train
    step takes the whole state; the eval step its parameters, while the optimiser state
    stays on the device; `held` bytes more stay there throughout (the dev BLEU's copy of
    the parameters). Their batches are sized by `train.max_tokens_per_batch`."""
    state_bytes, params_bytes = replica_bytes(state), replica_bytes(state.params)
    plans = []
    for kind, dispatch, besides in (("train", self.train_step, held),
                                    ("eval", self.eval_step, held + state_bytes - params_bytes)):
      for ((inputs, _), (targets, _)), planned in dispatch.plans().items():
        if planned is not None:  # targets [devices, (accumulation,) rows, length]
          plans.append(MemoryPlan(
              f"the {kind} step of inputs {'x'.join(map(str, inputs))} and targets "
              f"{'x'.join(map(str, targets))}", planned + besides, state_bytes + held,
              targets[-2] * targets[-1], "train.max_tokens_per_batch", setting))
    return plans


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
  """A program compiled ahead and the device memory it needs while it runs: XLA's plan of
  its own buffers plus the trainer's state it does not take as an argument."""
  what: str      # e.g. "the train step of inputs 1x1x192x136 and targets 1x1x192x128"
  bytes: int     # per device
  fixed: int     # of which the part its batches do not size (parameters, optimiser state)
  tokens: int    # tokens per device of its batch
  setting: str   # the setting that bounds them
  now: int | str  # that setting's value


def replica_bytes(tree: Any) -> int:
  """Bytes of one device's copy of a tree replicated over the local devices (leading axis);
  its leaves may be arrays or shapes."""
  return sum(math.prod(x.shape[1:]) * np.dtype(x.dtype).itemsize
             for x in jax.tree_util.tree_leaves(tree))


def size_text(n: float) -> str:
  return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def check_device_memory(plans: list[MemoryPlan], limit: int) -> str | None:
  """The line naming the program that plans the most device memory, of the `limit` bytes XLA
  may allocate on each device (None with no plans). A program planned above `limit` cannot
  run: a UserError before step 1 names the setting to lower, where a GPU would otherwise
  stop with out of memory at the program's first call, for the dev loss or BLEU perhaps
  hours into the run. The value it suggests scales the batch-sized part of the plan
  linearly, to the share of memory the automatic micro-batch fills."""
  if not plans:
    return None
  over = [p for p in plans if p.bytes > limit]
  if over:
    p = max(over, key=lambda p: p.bytes)
    head = (f"{p.what} needs {size_text(p.bytes)} of device memory by XLA's plan, more than "
            f"the {size_text(limit)} XLA may allocate on each device")
    room = backend.MICRO_BATCH_MEMORY_FRACTION * limit - p.fixed
    fit = (int(p.tokens * room / max(p.bytes - p.fixed, 1))
           // backend.MICRO_BATCH_MULTIPLE * backend.MICRO_BATCH_MULTIPLE)
    if fit < backend.MICRO_BATCH_MULTIPLE:
      raise UserError(f"{head}; the parameters and optimiser state take {size_text(p.fixed)} "
                      f"of it, so smaller batches would not fit either: this model needs a "
                      f"device with more memory")
    raise UserError(f"{head}; set --set {p.setting}={fit} (now {p.now}) or lower")
  top = max(plans, key=lambda p: p.bytes)
  return (f"device memory: {top.what} plans the most, {size_text(top.bytes)} of the "
          f"{size_text(limit)} XLA may allocate on each device")


def batch_shapes(batch: dict[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """A batch's (inputs, targets) shapes: the key of its compiled step (packed rows' sources
  and targets differ in length)."""
  return tuple(batch["inputs"].shape), tuple(batch["targets"].shape)


def evaluate_loss(p_eval, params, ds: input_pipeline.Dataset, split: str) -> dict[str, float]:
  """Dev loss and per-wordpiece perplexity (Table 3's PPL column), summed over the global
  devices (each process feeds its share of every batch)."""
  outs = [p_eval(params, parallel.shard(batch, ds.num_devices)) for batch in ds.eval_batches(split)]
  totals = {k: sum(float(parallel.first(o[k])) for o in outs) for k in ("loss", "nll", "tokens")}
  tokens = max(totals["tokens"], 1.0)
  return {"dev_loss": totals["loss"] / tokens, "dev_nll": totals["nll"] / tokens,
          "dev_ppl": math.exp(min(totals["nll"] / tokens, 50.0))}


def step_rng(run_key: jax.Array, step: jax.Array | int) -> jax.Array:
  """The dropout key of optimiser update number `step` (1-based): a pure function of the
  run's key (`PRNGKey(train.seed)`) and the step, so resume is exact."""
  return jax.random.fold_in(run_key, step)


def initial_state(cfg: ExperimentConfig, optimizer: optax.GradientTransformation
                  ) -> TrainState:
  """A new run's state: fresh parameters, or `train.init_from`'s with a fresh optimiser and
  step 0 (fine-tuning)."""
  source = cfg.train.init_from  # checked by `bookkeeping.check_init_from` before any data preparation
  if not source:
    return init_state(cfg, optimizer)
  loaded = checkpoints.load_params_for_inference(source, cfg)
  if loaded is None:
    raise UserError(f"train.init_from: {source} has no checkpoint to start from")
  params, label = loaded
  params = jax.tree_util.tree_map(jnp.asarray, params)
  print(f"starting from {source} ({label}) with a fresh optimiser and schedule", flush=True)
  return TrainState(step=jnp.array(0, jnp.int32), params=params,
                    opt_state=optimizer.init(params), bad_step=jnp.array(-1, jnp.int32))


def train_and_evaluate(cfg: ExperimentConfig, workdir: str
                       ) -> tuple[TrainState, str | None, bool]:
  """Trains to `train.steps` (or `train.max_train_minutes`), checkpointing and evaluating as
  configured; resumes if possible.

  Returns the final state, the name of the signal that stopped training early (if any),
  and whether training is finished (all steps done, or the time budget spent).
  """
  cfg = bookkeeping.with_compute_dtype(cfg, workdir)
  t = cfg.train
  startup = bookkeeping.StartUp()
  startup.mark("set-up")  # imports, flags, the backend
  check_paths(cfg)
  fresh, recorded = check_workdir(cfg, workdir)
  ds = load_data(cfg, workdir, fresh)
  startup.mark("data")
  optimizer = optim.make_optimizer(cfg)
  ckpt = checkpoints.Checkpointer(workdir, keep=t.keep_checkpoints,
                                  async_save=t.async_checkpoints,
                                  keep_for_average=cfg.average.last,
                                  spacing=retention.Spacing.of(cfg))
  start = start_state(cfg, optimizer, ckpt, workdir, ds, fresh, recorded)
  startup.mark("state")  # parameters and optimiser state, made or restored
  # From here on every process of a job goes on to the training loop, where the processes
  # agree on a stop: a signal to one of them alone is a request that the loop carries out
  # for all (before here, it ends this process's command at once, see `main`).
  with bookkeeping.StopRequest() as stop:
    print(f"experiment {cfg.name}: {model.count_params(start.shapes.params):,d} parameters, "
          f"{ds.num_devices} device(s) ({jax.devices()[0].device_kind}, "
          f"{jax.default_backend()}), {cfg.model.dtype} compute, {t.tokens_per_step:,d} "
          f"tokens per step per side, "
          f"{ds.accum_steps} accumulation step(s) of up to {ds.micro_batch_tokens:,d} tokens "
          f"per device{' (auto)' if t.max_tokens_per_batch == 'auto' else ''}, {t.steps:,d} "
          f"steps, workdir {workdir}", flush=True)
    print(f"resolved on {jax.default_backend()}: " + ", ".join(
        f"{k}={v}" for k, v in backend.resolved_levers(cfg).items()), flush=True)
    run = Run.make(cfg, ds, ckpt, optimizer, workdir, start)
    run.stop = stop
    try:
      # Shapes first: the batches' thread below then has the data set to itself.
      train_shapes, eval_shapes = run.shapes_to_compile()
      batches = parallel.Prefetcher(ds.batch, start.step, t.prefetch_batches,
                                    place=functools.partial(parallel.shard,
                                                            n_devices=ds.num_devices),
                                    stop_requested=run.stop_requested)
      try:
        with bookkeeping.CompileCounter() as compiles:
          state = compile_ahead(run, train_shapes, eval_shapes, startup)
          if train_shapes:
            check_memory(run, state)
          state = train_loop(run, state, batches, compiles)
          finish(run, state, compiles)
      finally:
        batches.close()
    finally:
      ckpt.close()
      run.metrics_log.close()
  host = parallel.unreplicate(state)
  return host, run.stop.signal_name, int(host.step) >= t.steps or run.clock.budget_spent


# ---------------------------------------------------------------------------------------
# The stages of a run, in the order `train_and_evaluate` takes them


def check_paths(cfg: ExperimentConfig) -> None:
  """The code paths the settings pick on this backend, refused at start-up where they are not
  supported here (the table in WORKSPACE.md), rather than failing, or doing nothing, later."""
  m, t = cfg.model, cfg.train
  if m.implementation == "cpu_tuned" and backend.platform() != "cpu":
    raise UserError(f"model.implementation=cpu_tuned is XLA:CPU's path; on "
                    f"{backend.platform()} use plain or auto")
  if m.fused_attention and backend.packing(cfg.data.packing):
    backend.segment_attention(m.segment_attention, m.dtype)  # offsets: Hopper, bf16, cuDNN
  if not t.lean_loss and not backend.loss_chunk_tokens(t.loss_chunk_tokens):
    raise UserError("train.lean_loss=false picks how the chunked loss is differentiated, but "
                    "this run builds the whole logits (train.loss_chunk_tokens resolves to 0 "
                    "here); set train.loss_chunk_tokens too")


def check_workdir(cfg: ExperimentConfig, workdir: str) -> tuple[bool, bool]:
  """(fresh: nothing trained in `workdir` yet, recorded: its experiment.json was there or is
  new). A wrong `train.init_from` or another model's workdir is a one-line error now,
  before any data preparation."""
  if cfg.train.init_from:
    bookkeeping.check_init_from(cfg)
  bookkeeping.check_workdir(cfg, workdir)
  fresh = not bookkeeping.has_checkpoints(workdir)  # nothing to be refused
  recorded = True
  if jax.process_index() == 0:
    recorded = bookkeeping.write_run_info(cfg, workdir)
  elif not fresh:
    bookkeeping.check_run_info(cfg, workdir)
  return fresh, recorded


def load_data(cfg: ExperimentConfig, workdir: str, fresh: bool) -> input_pipeline.Dataset:
  """The prepared corpus: process 0 prepares it alone, the others then find its cache (or,
  on a folder of their own, prepare theirs); the workdir keeps its vocabulary."""
  directory = parallel.process_zero_first(lambda: input_pipeline.prepared_dir(cfg),
                                          "prepare the data")
  ds = input_pipeline.load(cfg, num_devices=jax.local_device_count(),
                           process_index=jax.process_index(),
                           process_count=jax.process_count(), directory=directory)
  if jax.process_index() == 0:
    input_pipeline.record_vocab(workdir, ds.directory, replace=fresh)
  else:
    input_pipeline.check_vocab([workdir], ds.directory)
  return ds


@dataclasses.dataclass(frozen=True)
class Start:
  """Where a run starts: its state on the host (or its shapes alone, while `initialising`
  makes the values beside the compilations), the step it has done, the state's shapes."""
  state: TrainState
  step: int
  shapes: TrainState
  initialising: Any = None  # a Future of the replicated new state


def start_state(cfg: ExperimentConfig, optimizer: optax.GradientTransformation,
                ckpt: checkpoints.Checkpointer, workdir: str, ds: input_pipeline.Dataset,
                fresh: bool, recorded: bool) -> Start:
  """The newest checkpoint's state, read into the state's shapes; else `train.init_from`'s
  parameters (fine-tuning); else new ones. A new run in one process makes them in a thread
  while its steps compile, which needs their shapes alone: initialising is a program of its
  own to compile and run (base: 16 s on a 2-core Xeon)."""
  t = cfg.train
  shapes = jax.eval_shape(functools.partial(init_state, cfg, optimizer))
  beside = fresh and not t.init_from and jax.process_count() == 1
  initialising = initialise_beside(cfg, optimizer, ds.num_devices) if beside else None
  restored = restore(cfg, ckpt, shapes)
  if not recorded:  # the record was missing: the checkpoints restored, so they are this model
    bookkeeping.write_run_info(cfg, workdir, restored=True)
  if restored is not None:
    print(f"resuming from checkpoint {restored[1]} in {ckpt.directory}", flush=True)
    return Start(restored[0], restored[1], shapes)
  if t.init_from:
    bookkeeping.check_init_vocabulary(t.init_from, ds.directory)
    return Start(initial_state(cfg, optimizer), 0, shapes)
  if beside:
    return Start(shapes, 0, shapes, initialising)
  return Start(init_state(cfg, optimizer), 0, shapes)


def initialise_beside(cfg: ExperimentConfig, optimizer: optax.GradientTransformation,
                      n_dev: int) -> Any:
  """A Future of the new run's state on the devices, made in a thread whose compilations
  are not counted as the run's."""
  import concurrent.futures

  def initialise() -> TrainState:
    with bookkeeping.uncounted_compilations():
      return parallel.replicate(init_state(cfg, optimizer), n_dev)
  pool = concurrent.futures.ThreadPoolExecutor(1)
  future = pool.submit(initialise)
  pool.shutdown(wait=False)  # its thread ends with the job, not idle for the whole run
  return future


def restore(cfg: ExperimentConfig, ckpt: checkpoints.Checkpointer, shapes: TrainState
            ) -> tuple[TrainState, int] | None:
  """The newest checkpoint that restores, placed where `init_state` puts a state, and its
  step; every process of a job agrees on it (or on the error, raised on all at once)."""
  on_first_device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  try:
    restored, error = ckpt.restore_latest(jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=on_first_device),
        shapes)), None
  except UserError as e:
    restored, error = None, str(e)
  return ckpt.agree(restored, error, bookkeeping.config_fingerprint(cfg))


class Clock:
  """The run's training time across resumes, its time budget (`train.max_train_minutes`) and
  the learning-rate factor of the budget's cooldown, as every process of a job agrees."""

  def __init__(self, t: TrainConfig, elapsed_before: float, n_dev: int):
    self.t, self.n_dev = t, n_dev
    self.start, self.before = time.time(), elapsed_before
    self.budget = 60 * t.max_train_minutes
    self.budget_spent, self.lr_factor = False, 1.0
    self._factor = (None, None)  # (value, on the devices)

  def elapsed(self) -> float:
    """Wall-clock training time, across resumes."""
    return time.time() - self.start + self.before

  def agree(self, stop_requested: bool, checkpoint_due: bool) -> tuple[bool, bool]:
    """(stop, checkpoint due) of any process; the budget by the latest clock."""
    (stop_requested, checkpoint_due), trained_sec = parallel.any_process(
        [stop_requested, checkpoint_due], self.elapsed())
    self.budget_spent = self.budget > 0 and trained_sec >= self.budget
    self.lr_factor = optim.budget_ramp(trained_sec, self.budget, 60 * self.t.cooldown_minutes)
    return stop_requested, checkpoint_due

  def factor_on_devices(self) -> jax.Array:
    """`lr_factor` replicated, placed again only when it changes (a time-budget cooldown)."""
    if self._factor[0] != self.lr_factor:
      self._factor = (self.lr_factor,
                      parallel.replicate(np.float32(self.lr_factor), self.n_dev))
    return self._factor[1]


class Saver:
  """Checkpoints on the schedule and on a signal; the step of the newest, and the time from
  which `train.checkpoint_every_minutes` counts: the first step (not the launch, which
  compiles first), then the last checkpoint by time (with `average.spacing=minutes`, whose
  schedule it is) or of any kind (with `steps`, where time only bounds what a crash loses)."""

  def __init__(self, ckpt: checkpoints.Checkpointer, step: int, clock: "Clock",
               minutes_schedule: bool = False):
    self.ckpt, self.step, self.clock = ckpt, step, clock
    self.minutes_schedule = minutes_schedule
    self.time: float | None = None  # set by `started`

  def started(self) -> None:
    if self.time is None:
      self.time = time.time()

  def minutes_since(self) -> float:
    return 0.0 if self.time is None else (time.time() - self.time) / 60

  def save(self, state: TrainState, step: int, for_average: bool = False,
           on_signal: bool = False, by_time: bool = False) -> None:
    host = parallel.unreplicate(state)
    if int(host.bad_step) >= 0:
      return  # never write a checkpoint after a non-finite step
    with bookkeeping.checkpoint_errors(self.ckpt, step):
      path = self.ckpt.save(step, host, for_average=for_average, on_signal=on_signal,
                            elapsed_sec=self.clock.elapsed())
    self.step = step
    if by_time or not self.minutes_schedule:
      self.time = time.time()
    print(f"{'saving' if self.ckpt.async_save and not on_signal else 'saved'} checkpoint "
          f"{path}", flush=True)


class Progress:
  """The metrics of the steps dispatched since the last action, and the log window's sums:
  the token-weighted mean loss of its steps, and the tokens/s of the steps it timed."""

  def __init__(self):
    self.pending: list[dict[str, jax.Array]] = []
    self.tokens, self.steps, self.since = 0.0, 0, time.time()  # timed
    self.loss, self.loss_tokens = 0.0, 0.0                     # every step's
    self._untimed = 0

  def started(self) -> None:
    """The first step has run: the first window's clock starts here, after compiling (which
    would otherwise count as training time in the first line's tok/s and ETA); the first
    step's loss still counts in its mean, its time and tokens not in its rate."""
    self.since, self._untimed = time.time(), len(self.pending)

  def pace(self) -> None:
    """Before a step is dispatched: at most two steps in flight, so the devices always have
    the next step queued, and XLA:CPU's simulated devices, which can deadlock in their
    collectives with many more, do not."""
    if len(self.pending) >= 2:
      jax.block_until_ready(self.pending[-2]["loss"])

  def collect(self, state: TrainState, ckpt: checkpoints.Checkpointer
              ) -> list[dict[str, Any]]:
    """The pending metrics, fetched from the devices; a non-finite loss among them stops
    training with the last good checkpoint named."""
    fetched = [{k: parallel.first(v) for k, v in m.items()} for m in self.pending]
    self.pending = []
    timed, self._untimed = fetched[self._untimed:], 0
    bad = int(parallel.first(state.bad_step))
    if bad >= 0:
      good = ckpt.steps()[-1] if ckpt.steps() else None
      where = f"checkpoint {good} in {ckpt.directory}" if good is not None else "no checkpoint"
      raise UserError(f"non-finite loss at step {bad}; stopped. The last good checkpoint "
                      f"is {where} (try a lower learning rate or float32)")
    self.tokens += sum(float(m["tokens"]) for m in timed)
    self.steps += len(timed)
    self.loss += sum(float(m["loss"]) * float(m["tokens"]) for m in fetched)
    self.loss_tokens += sum(float(m["tokens"]) for m in fetched)
    return fetched

  def window(self) -> tuple[float, float, float, int]:
    """(seconds, tokens/s, mean loss, steps) of the window since the last line; a new one
    starts. The mean is token-weighted: a single step's loss jumps with its row length."""
    now = time.time()
    seconds = now - self.since
    out = (seconds, self.tokens / max(seconds, 1e-9),
           self.loss / max(self.loss_tokens, 1e-9), self.steps)
    self.tokens, self.steps, self.since = 0.0, 0, now
    self.loss, self.loss_tokens = 0.0, 0.0
    return out


@dataclasses.dataclass
class Due:
  """The periodic actions after one step."""
  log: bool
  evaluate: bool
  bleu: bool
  checkpoint: bool
  for_average: bool  # the checkpoint is one that averaging reads
  stop: bool
  by_time: bool = False  # due by `train.checkpoint_every_minutes`

  @property
  def any(self) -> bool:
    return self.log or self.evaluate or self.bleu or self.checkpoint


@dataclasses.dataclass
class Run:
  """What the loop and its periodic actions share, set up once before the first step."""
  cfg: ExperimentConfig
  ds: input_pipeline.Dataset
  programs: TrainPrograms
  run_key: jax.Array
  start: Start
  metrics_log: bookkeeping.MetricsLog
  clock: Clock
  saver: Saver
  progress: Progress
  stats: bookkeeping.LoopStats
  profiler: bookkeeping.Profiler
  dev_bleu: bookkeeping.DevBleu | None
  stop: bookkeeping.StopRequest | None = None
  evaluations: int = 0

  @classmethod
  def make(cls, cfg: ExperimentConfig, ds: input_pipeline.Dataset,
           ckpt: checkpoints.Checkpointer, optimizer: optax.GradientTransformation,
           workdir: str, start: Start) -> "Run":
    t, n_dev = cfg.train, ds.num_devices
    metrics_log = bookkeeping.MetricsLog(workdir, start.step,
                                         enabled=jax.process_index() == 0)
    clock = Clock(t, metrics_log.elapsed_before, n_dev)
    clock.agree(False, False)
    if clock.budget_spent:
      print(f"the time budget of {t.max_train_minutes:g} min was spent by earlier runs",
            flush=True)
    # The dev BLEU's decoder, when a BLEU step remains, on process 0's own devices. Its
    # programs are compiled before step 1, so its batches keep their rows (`shrink=False`).
    # It scores every `train.bleu_every_steps` and the last step, so that a short run (or
    # one a time budget ends) has its figure too.
    dev_bleu = (bookkeeping.DevBleu(cfg, ds, start.state.params)  # the host's (or shapes)
                if t.bleu_every_steps and t.steps > start.step and jax.process_index() == 0
                else None)
    return cls(cfg, ds, TrainPrograms(cfg, optimizer),
               parallel.replicate(jax.random.PRNGKey(t.seed), n_dev), start, metrics_log, clock,
               Saver(ckpt, start.step, clock, cfg.average.spacing == "minutes"), Progress(), bookkeeping.LoopStats(),
               bookkeeping.Profiler(t.profile_steps, workdir, start.step), dev_bleu)

  def shapes_to_compile(self) -> tuple[list, list]:
    """The batch shapes of the steps this run will take (every shape of the epoch, or of a
    shorter run's steps alone), and of the dev loss, which runs at least at the last step;
    none where no step remains."""
    t = self.cfg.train
    if self.start.step >= t.steps or self.clock.budget_spent:
      return [], []
    train_shapes = self.ds.train_shapes(range(self.start.step, t.steps))
    try:
      eval_shapes = sorted({batch_shapes(b) for b in self.ds.eval_batches(
          self.cfg.data.dev_split)})
    except DataError:
      eval_shapes = []  # no dev split: the evaluation says so when it comes
    return train_shapes, eval_shapes

  def stop_requested(self) -> bool:
    """A signal to this process (one process alone may stop while its input hangs; the
    processes of a job stop together, at an agreed step)."""
    return (jax.process_count() == 1 and self.stop is not None
            and self.stop.signal_name is not None)


def compile_ahead(run: Run, train_shapes: list, eval_shapes: list,
                  startup: bookkeeping.StartUp) -> TrainState:
  """Compiles the train step of every batch shape the run will meet, the eval step of every
  dev batch shape and, when a dev BLEU step remains, the dev BLEU's search, side by side
  before step 1; returns the state's values on the devices. A new run compiles from the
  state's shapes while its values are made; should compiling from shapes fail (a JAX
  version), it warns and compiles from the values."""
  start, n_dev = run.start, run.ds.num_devices
  initialising = start.initialising
  state = (parallel.replicated_shapes(start.shapes, n_dev) if initialising else
           parallel.replicate(start.state, n_dev))
  if train_shapes:
    began = time.time()
    try:
      run.stats.compiled_ahead = _compile(run, state, train_shapes, eval_shapes, startup)
    except UserError:
      raise  # the user's to fix (a setting this backend lacks), not the shapes'
    except Exception as e:
      if initialising is None:
        raise
      print(f"warning: compiling from the state's shapes failed "
            f"({str(e).splitlines()[0] if str(e) else type(e).__name__}); compiling "
            f"from its values", file=sys.stderr, flush=True)
      state, initialising = initialising.result(), None
      if run.dev_bleu:
        run.dev_bleu.place(state.params)
      run.stats.compiled_ahead = _compile(run, state, train_shapes, eval_shapes, startup)
    run.stats.compile_ahead_sec = round(time.time() - began, 3)
    planned = run.stats.planned_ahead
    if run.stats.compiled_ahead + planned:
      print(f"compiled {run.stats.compiled_ahead + planned} program(s) before the first step "
            f"in {run.stats.compile_ahead_sec:.1f}s"
            + (f" ({planned} of them the steps', for their memory plans: a multi-process "
               f"job's steps take host-local batches, so their first calls compile them "
               f"again, from the persistent compilation cache on this process)"
               if planned else ""), flush=True)
  return state if initialising is None else initialising.result()


def _compile(run: Run, state: TrainState, train_shapes: list, eval_shapes: list,
             startup: bookkeeping.StartUp) -> int:
  """`compile_ahead`'s compilations, with the start-up's line; how many programs."""
  workers = min(os.cpu_count() or 1, len(train_shapes) + len(eval_shapes))
  startup.mark("the rest")  # placing the state, the dev BLEU's decoder, the shapes
  age = bookkeeping.seconds_since_launch()
  run.stats.launch_to_compiling_sec = None if age is None else round(age, 1)
  run.stats.startup_sec = startup.seconds() or None
  if jax.process_index() == 0:  # in a multi-process job the others compile at step 1
    print((f"{age:.1f}s after launch ({startup.text()}): " if age is not None else "") +
          f"compiling the train step for {len(train_shapes)} batch shape(s) and the eval "
          f"step for {len(eval_shapes)}, {workers} at a time"
          + (", and beside them the dev BLEU search" if run.dev_bleu else ""), flush=True)
  import concurrent.futures
  # The search compiles beside the steps, not after them: on a GPU the train step's
  # compilation (35-41 s for base on an H200) is the long pole.
  with concurrent.futures.ThreadPoolExecutor(1) as beside:
    searches = (beside.submit(run.dev_bleu.decoder.compile_ahead, run.dev_bleu.sources,
                              os.cpu_count() or 1) if run.dev_bleu else None)
    calls = run.programs.calls(state, run.run_key, run.clock.factor_on_devices(),
                               train_shapes, eval_shapes)
    # A multi-process job's steps are compiled on process 0 for their memory plans alone
    # (`check_memory`, which process 0 makes for every process; the others compile at their
    # first calls as before); the dev BLEU's search runs on process 0's devices alone, so
    # its programs compiled ahead serve it.
    keep = jax.process_count() == 1
    compiled = parallel.compile_ahead(calls if keep or jax.process_index() == 0 else [],
                                      workers, keep=keep)
    run.stats.steps_ahead, run.stats.planned_ahead = keep, 0 if keep else compiled
    return (compiled if keep else 0) + (searches.result() if searches else 0)


def check_memory(run: Run, state: TrainState) -> None:
  """On GPU and TPU, every program compiled ahead against the memory XLA may allocate
  (`check_device_memory`), the dev BLEU's search among them: its decoder keeps a copy of the
  parameters on the devices throughout, and decodes beside the trainer's state in batches of
  `decode.batch_tokens`. XLA:CPU reports no device memory: nothing to check."""
  limit = backend.device_memory_bytes()
  if limit is None:
    return
  t, dev_bleu = run.cfg.train, run.dev_bleu
  copy = replica_bytes(dev_bleu.decoder.params) if dev_bleu else 0
  plans = run.programs.memory_plans(state, t.max_tokens_per_batch, held=copy)
  searched = dev_bleu.decoder.planned_bytes() if dev_bleu else None
  if searched is not None:  # its plan takes the copy as an argument
    (planned, tokens), state_bytes = searched, replica_bytes(state)
    plans.append(MemoryPlan("the dev BLEU's search", planned + state_bytes,
                            state_bytes + copy, tokens, "decode.batch_tokens",
                            run.cfg.decode.batch_tokens))
  # In a multi-process job process 0 checks (it alone has the search's plan; the steps'
  # are every process's), and a plan too large ends every process with its line.
  line = parallel.process_zero_only(lambda: check_device_memory(plans, limit),
                                    "fit its programs in device memory")
  if line:
    run.stats.largest_plan_bytes = max(p.bytes for p in plans)
    print(line, flush=True)


def train_loop(run: Run, state: TrainState, batches: parallel.Prefetcher,
               compiles: bookkeeping.CompileCounter) -> TrainState:
  """The paper's training: one optimiser update a step, then whatever periodic actions are
  due (log, evaluate, dev BLEU, checkpoint, stop). Host time and compilations in the loop
  are counted (`LoopStats`); with its programs compiled ahead, the loop should compile
  nothing."""
  t = run.cfg.train
  shapes_seen = set()
  for step in range(run.start.step + 1, t.steps + 1):
    if run.clock.budget_spent:
      break
    cpu, compiled = time.thread_time(), compiles.count
    try:
      batch = next(batches)
    except parallel.WaitStopped:  # the input hangs and a signal asks to stop: stop now
      break
    run.progress.pace()
    run.profiler.before(step)
    dispatched = time.time()
    state, metrics = run.programs.train_step(state, batch, run.run_key,
                                             run.clock.factor_on_devices())
    run.profiler.after(step, state)
    run.progress.pending.append(metrics)
    run.saver.started()  # checkpoints by time count from the first step, compiled
    if step == run.start.step + 1:
      jax.block_until_ready(metrics["loss"])
      print(f"step {step} ran in {time.time() - dispatched:.1f}s; progress lines time the "
            f"steps after it", flush=True)
      run.progress.started()
    due = due_actions(run, step)
    shape = batch_shapes(batch)  # without compiling ahead, each shape's first step compiles
    if run.stats.steps_ahead or shape in shapes_seen:
      run.stats.compiles_after_warmup += compiles.count - compiled
    shapes_seen.add(shape)
    fetched = run.progress.collect(state, run.saver.ckpt) if due.any else None  # loop work
    run.stats.steps += 1
    run.stats.loop_cpu_sec += time.thread_time() - cpu
    if due.any:
      act(run, state, step, due, fetched, batches, compiles)
    if due.stop:
      break
  return state


def due_actions(run: Run, step: int) -> Due:
  """Which periodic actions follow `step`. Every process of a job must take the same steps
  and checkpoints: stop requests, checkpoints by time and the budget are agreed at the
  steps when any action may be due (`train.sync_every_steps` at least)."""
  t, stop = run.cfg.train, run.stop
  stop_now = time_to_save = False
  by_steps = on_step_schedule(t, step)
  if (jax.process_count() == 1 or step % t.sync_every_steps == 0 or
      step % t.log_every_steps == 0 or by_steps or
      step % t.eval_every_steps == 0 or step == t.steps):
    stop_now, time_to_save = run.clock.agree(
        stop.signal_name is not None,
        minutes_due(t, run.saver.minutes_since()))
    if stop_now:
      stop.signal_name = stop.signal_name or "a signal to another process"
  last = step == t.steps or run.clock.budget_spent
  bleu = bool(run.dev_bleu and (step % t.bleu_every_steps == 0 or last))
  checkpoint, for_average = checkpoint_due(run.cfg, step, time_to_save, last)
  return Due(log=step % t.log_every_steps == 0 or last or bleu,
             evaluate=step % t.eval_every_steps == 0 or last, bleu=bleu,
             checkpoint=checkpoint, for_average=for_average, stop=stop_now,
             by_time=time_to_save)


def on_step_schedule(t: TrainConfig, step: int) -> bool:
  """`step` is one of `train.checkpoint_every_steps`'s, counted back from `train.steps`."""
  return bool(t.checkpoint_every_steps) and (t.steps - step) % t.checkpoint_every_steps == 0


def minutes_due(t: TrainConfig, minutes_since_save: float) -> bool:
  return bool(t.checkpoint_every_minutes) and minutes_since_save >= t.checkpoint_every_minutes


def checkpoint_due(cfg: ExperimentConfig, step: int, time_to_save: bool, last: bool
                   ) -> tuple[bool, bool]:
  """(a checkpoint follows `step`, averaging reads it): on the step schedule, by time, or at
  the last step; averaged when on the schedule `average.spacing` names, or the last."""
  by_steps = on_step_schedule(cfg.train, step)
  averaged = by_steps if cfg.average.spacing == "steps" else time_to_save
  return by_steps or time_to_save or last, averaged or last


def act(run: Run, state: TrainState, step: int, due: Due, fetched: list[dict[str, Any]],
        batches: parallel.Prefetcher, compiles: bookkeeping.CompileCounter) -> None:
  """The periodic actions due after `step`: the progress line, the dev loss, the dev BLEU
  (written to metrics.jsonl together), the checkpoint."""
  values = log_line(run, step, fetched, batches, compiles) if due.log else {}
  if due.evaluate:
    values.update(dev_loss(run, state, step, compiles))
  if due.bleu:
    values.update(dev_bleu(run, state, step, compiles))
  if values:
    run.metrics_log.write(step, values)
  if due.checkpoint:
    run.metrics_log.flush()  # a resume from this checkpoint finds every line up to it
    run.saver.save(state, step, for_average=due.for_average, by_time=due.by_time)


def log_line(run: Run, step: int, fetched: list[dict[str, Any]],
             batches: parallel.Prefetcher, compiles: bookkeeping.CompileCounter
             ) -> dict[str, Any]:
  """The progress line and its metrics.jsonl values; a new log window starts."""
  t, clock = run.cfg.train, run.clock
  seconds, tok_s, loss_mean, steps = run.progress.window()
  host = run.stats.window(seconds, batches, compiles)
  eta = seconds / max(steps, 1) * (t.steps - step)  # at this window's pace
  elapsed = clock.elapsed()  # wall-clock training time across resumes
  if clock.budget:
    eta = max(0.0, min(eta, clock.budget - elapsed))
  last = fetched[-1]
  values = {"loss": float(last["loss"]), "nll": float(last["nll"]),
            "loss_mean": round(loss_mean, 5), "learning_rate": float(last["learning_rate"]),
            "tokens_per_sec": round(tok_s, 1), "elapsed_sec": round(elapsed, 3),
            "eta_sec": round(eta, 1),
            "time": round(time.time(), 3), **host}
  if clock.budget_spent:
    print(f"time budget of {t.max_train_minutes:g} min reached at step {step}", flush=True)
    if t.cooldown_steps and step < t.steps:
      print(f"warning: the learning-rate cooldown to 0 at step {t.steps} did not "
            f"finish (lr {values['learning_rate']:.2e}); lower train.steps so the run "
            f"fits the budget on this machine", flush=True)
  print(f"step {step:>7d}/{t.steps} | loss {loss_mean:.4f} | "
        f"lr {values['learning_rate']:.2e} | {tok_s:,.0f} tok/s | "
        f"host {host['host_ms_per_step']:.1f} ms/step | "
        f"elapsed {bookkeeping.fmt_time(elapsed)} | ETA {bookkeeping.fmt_time(eta)}",
        flush=True)
  return values


def dev_loss(run: Run, state: TrainState, step: int, compiles: bookkeeping.CompileCounter
             ) -> dict[str, float]:
  """The dev split's loss and perplexity. Without compiling ahead, the first evaluation
  compiles each dev batch shape once; anything else compiled here is counted."""
  compiled = compiles.count
  dev = evaluate_loss(run.programs.eval_step, state.params, run.ds, run.cfg.data.dev_split)
  if run.stats.steps_ahead or run.evaluations:
    run.stats.compiles_after_warmup += compiles.count - compiled
  run.evaluations += 1
  print(f"step {step:>7d} | dev loss {dev['dev_loss']:.4f} | dev ppl {dev['dev_ppl']:.3f}",
        flush=True)
  return dev


def dev_bleu(run: Run, state: TrainState, step: int, compiles: bookkeeping.CompileCounter
             ) -> dict[str, Any]:
  """The dev BLEU of the first `train.bleu_sentences` dev sentences; its search was compiled
  before step 1, so anything compiled here is counted as the loop's."""
  compiled = compiles.count
  found = run.dev_bleu(state.params)
  run.stats.compiles_after_warmup += compiles.count - compiled
  task = run.dev_bleu.task
  print(f"step {step:>7d} | dev {task.metric_label} {found['dev_' + task.metric]:.2f} (first "
        f"{len(run.dev_bleu.sources)} sentences, {run.dev_bleu.search}, "
        f"{found['dev_bleu_seconds']:.1f}s)", flush=True)
  return found


def finish(run: Run, state: TrainState, compiles: bookkeeping.CompileCounter) -> None:
  """After the loop: a stopped run's checkpoint and the command that resumes it, the run's
  compilations, the profile, and every checkpoint complete before evaluation or exit."""
  saver, stop = run.saver, run.stop
  if stop.signal_name:
    done = int(parallel.first(state.step))
    if done > saver.step:
      run.metrics_log.flush()
      saver.save(state, done, on_signal=True)
    print(f"stopped at step {done} on {stop.signal_name}; the newest checkpoint is "
          f"{os.path.join(saver.ckpt.directory, str(saver.step))}", flush=True)
  print(f"compilations: {compiles.count} "
        f"({run.stats.compiled_ahead + run.stats.planned_ahead} before the first step), "
        f"{compiles.seconds:.1f}s in all; {run.stats.compiles_after_warmup} in the loop "
        f"beyond what compiling ahead covered", flush=True)
  record_cost(run, int(parallel.first(state.step)))
  if run.profiler.active:
    run.profiler.stop(state)
  with bookkeeping.checkpoint_errors(saver.ckpt, saver.step):
    saver.ckpt.wait()  # the last checkpoint is complete before evaluation, averaging or exit


COST_FILE = "cost.json"


def record_cost(run: Run, step: int) -> None:
  """Table 2's cost column for this run so far: its training time x devices x the device's
  sustained rate, beside the count from the model's shapes (t2t_jax/cost.py), printed and
  kept in WORKDIR/cost.json for the sweep's report."""
  from t2t_jax import cost, storage
  t = run.cfg.train
  # `train.tokens_per_step` counts target tokens; the encoder sees the source tokens that come
  # with them (section 5.1: about as many for translation, far fewer for a parser).
  source_tokens = round(t.tokens_per_step * run.ds.source_per_target_token())
  found = cost.summary(run.cfg.model, step, source_tokens, t.tokens_per_step,
                       run.clock.elapsed(), jax.device_count(), jax.devices()[0].device_kind)
  print(cost.describe(found), flush=True)
  if jax.process_index() == 0:
    workdir = os.path.dirname(run.saver.ckpt.directory.rstrip("/"))
    storage.write_atomic(storage.join(workdir, COST_FILE),
                         json.dumps({"step": step, **found}, indent=2) + "\n")


def run_average(cfg: ExperimentConfig, workdir: str) -> str:
  """`--mode=average`: mean of the last `average.last` checkpoints into WORKDIR/averaged."""
  optimizer = optim.make_optimizer(cfg)
  like = jax.eval_shape(lambda: init_state(cfg, optimizer))
  # The checkpoints were written (and marked for averaging) on the schedule training ran: the
  # record's, which this command need not repeat.
  spacing = retention.Spacing.of(workdirs.recorded_config(workdir) or cfg)
  try:
    out, steps = checkpoints.average(workdir, cfg.average.last, like, spacing)
  except FileNotFoundError as e:
    raise UserError(str(e)) from None
  fewer = (f" (fewer than average.last={cfg.average.last}: all the run has)"
           if len(steps) < cfg.average.last else "")
  print(f"averaged {len(steps)} checkpoint(s) {steps} into {out}{fewer}", flush=True)
  return out

