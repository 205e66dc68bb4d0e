"""Command line: `python -m t2t_jax.main --experiment=NAME --workdir=DIR [--mode=MODE]`.

Every mode starts from a named experiment config, applies `--set KEY=VALUE`
overrides, and dispatches. Heavy modules (TensorFlow, the training loop) are
imported only by the modes that need them, so `--help` and `params` are fast.
Bad input is a one-line `error: ...` on stderr with exit code 2.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import signal
import sys
import threading
import time

from absl import app, flags, logging

from t2t_jax import hostmem
from t2t_jax.errors import UserError
from t2t_jax.config import (COMPUTE_FIELDS, ExperimentConfig, evaluation_splits,
                            final_eval_splits, is_split_name, override, parse_set_flags,
                            validate)

MODES = ("train", "eval", "translate", "score", "average", "attention", "params", "config",
         "export", "prepare")

FLAGS = flags.FLAGS
flags.DEFINE_string("experiment", None, "A named experiment (listed above), e.g. base_ende, or "
                    "FILE.py:FUNCTION.")
flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and outputs.")
flags.DEFINE_string("mode", "train", f"One of: {', '.join(MODES)}.")
flags.DEFINE_string("dataset", None, "Data source spec overriding the experiment's "
                    "(tfds:NAME[:SRC-TGT], hf:NAME[/CONFIG]:SRC-TGT, folder:PATH[:SRC-TGT], "
                    "ptb:PATH (a treebank, parsed) or demo).")
flags.DEFINE_multi_string("set", [], "Override a config field: --set model.d_model=256 "
                          "(repeatable).")
flags.DEFINE_string("input", None, "translate, score: read lines from this file (default "
                    "stdin).")
flags.DEFINE_integer("nbest", 0, "translate: print this many hypotheses per line, as "
                     "INDEX<TAB>SCORE<TAB>TRANSLATION lines (0: the best translation only).",
                     lower_bound=0)
flags.DEFINE_string("output", None, "translate, score: write here (default stdout); "
                    "attention: the PNG to write; export: the folder to write (required).")
flags.DEFINE_enum("format", "huggingface", ["huggingface"], "export: the format to write "
                  "(huggingface: a MarianMT folder for transformers and CTranslate2).")
flags.DEFINE_string("splits", None, "eval: comma-separated splits to decode (default: the dev "
                    "and test splits); e.g. the dev split alone while tuning decoding.")
flags.DEFINE_string("test_data", None, "eval: another data source (folder:DIR[:SRC-TGT], "
                    "tfds:..., hf:...) whose --splits are decoded with this run, e.g. "
                    "newstest2015 or FLORES for a run trained from tfds; its figures go to "
                    "WORKDIR/eval/<the source's name>/.")
flags.DEFINE_list("ensemble", [], "eval, translate, score: other workdirs (comma-separated) whose "
                  "models decode together with --workdir's, averaging their probabilities.")
# A host's runs may share one cache (a sweep's rows compile the same programs; the test suite
# points every run it starts at one folder): the environment sets the flag's default.
COMPILATION_CACHE_ENV = "T2T_JAX_COMPILATION_CACHE"
flags.DEFINE_string("compilation_cache", os.environ.get(COMPILATION_CACHE_ENV, "auto"),
                    "Where compiled programs are kept across runs (JAX's persistent "
                    "compilation cache), so that a resume, eval or translate does not compile "
                    "again: auto = WORKDIR/compilation_cache (in the bucket when the workdir "
                    f"is one), a folder, or none. Default: ${COMPILATION_CACHE_ENV} if set, "
                    "else auto.")
flags.DEFINE_string("sentence", None, "attention: the source sentence to visualise.")
flags.DEFINE_integer("layer", 0, "attention: which encoder/decoder layer to draw.")
flags.DEFINE_bool("distributed", False, "train: join a multi-process job, detected from the "
                  "cluster environment (SLURM, Cloud TPU, Open MPI).")
flags.DEFINE_string("coordinator_address", None, "train: HOST:PORT of process 0 of a "
                    "multi-process job (with --num_processes and --process_id).")
flags.DEFINE_integer("num_processes", None, "train: processes in the multi-process job.")
flags.DEFINE_integer("process_id", None, "train: this process's index, 0..num_processes-1.")


class UsageError(UserError):
  """Bad command-line input: printed as one line, exit code 2."""


def fail(message: str) -> None:
  """Prints a one-line error and exits 2 (bad input, nothing done)."""
  print(f"error: {message}", file=sys.stderr)
  sys.exit(2)


def resolve_init_from(cfg: ExperimentConfig) -> ExperimentConfig:
  """`train.init_from` as an absolute path, and the vocabulary it implies: a fine-tuned run
  tokenises with the vocabulary of the run it starts from unless `data.vocab_from` says
  otherwise."""
  from t2t_jax import storage
  t, d = cfg.train, cfg.data
  if not t.init_from:
    return cfg
  source = storage.normalize(t.init_from)
  return dataclasses.replace(cfg, train=dataclasses.replace(t, init_from=source),
                             data=dataclasses.replace(d, vocab_from=d.vocab_from or source))


def load_config(experiment: str | None, sets: list[str], dataset: str | None) -> ExperimentConfig:
  """The experiment's config with the command line's overrides applied and checked."""
  from t2t_jax import registry
  if not experiment:
    raise UsageError(f"--experiment is required; valid names: {', '.join(registry.names())}")
  try:
    cfg = registry.get(experiment)
  except KeyError as e:
    raise UsageError(e.args[0]) from None
  cfg = override(cfg, parse_set_flags(sets))
  if dataset:
    cfg = override(cfg, {"data.dataset": dataset})
  validate(cfg)
  return resolve_init_from(cfg)


def eval_splits(cfg: ExperimentConfig, raw: str | None) -> list[str]:
  """`--splits` (default: the dev and test splits). Any other split of the data source may
  be named too, another test set of the same corpus; a folder's are checked here, before
  any decoding, and tfds or hf splits when read."""
  known = evaluation_splits(cfg)
  if not raw:
    return known
  splits = _split_names(raw)
  if cfg.data.train_split in splits:
    raise UsageError(f"--splits={raw}: {cfg.data.train_split} is the training split; "
                     f"evaluation decodes held-out splits")
  _check_present(cfg, raw, [s for s in splits if s not in known])
  return splits


def _split_names(raw: str) -> list[str]:
  splits = [s.strip() for s in raw.split(",") if s.strip()]
  if not splits:
    raise UsageError(f"--splits={raw!r} names no split")
  for s in splits:
    if not is_split_name(s):
      raise UsageError(f"--splits: {s!r} is not a split name (letters, digits, '.', '_', '-')")
  return splits


def _check_present(cfg: ExperimentConfig, raw: str, splits: list[str]) -> None:
  """A folder source has `splits` (tfds and hf say so when read)."""
  from t2t_jax import input_pipeline
  present = input_pipeline.source_splits(cfg) if splits else None
  missing = [s for s in splits if present is not None and s not in present]
  if missing:
    raise UsageError(f"--splits={raw}: {', '.join(missing)} is not a split of "
                     f"{cfg.data.dataset} (it has {', '.join(present)})")


def check_paths(cfg: ExperimentConfig) -> None:
  """The paths and numbers the mode will use, checked before any model is loaded: a wrong
  one is a one-line error, not a traceback after seconds of work."""
  mode = FLAGS.mode
  from t2t_jax import storage
  storage.check_supported(FLAGS.workdir, "--workdir")  # s3:// and the like: what works
  if storage.isfile(FLAGS.workdir):
    raise UsageError(f"--workdir={FLAGS.workdir} is a file, not a directory")
  if FLAGS.input and mode in ("translate", "score"):
    storage.check_input_file(FLAGS.input, "--input")
  if FLAGS.output and mode in ("translate", "score", "attention"):
    storage.check_output_file(FLAGS.output, "--output")
  if FLAGS.output and mode == "export" and storage.isfile(FLAGS.output):
    raise UsageError(f"--output={FLAGS.output} is a file; export writes a folder")
  for other in FLAGS.ensemble:
    storage.check_input_dir(other, "--ensemble")
  from t2t_jax import input_pipeline
  if mode in ("train", "eval"):  # the modes that prepare data into the data folder
    folder = cfg.data.data_dir or input_pipeline.default_data_dir()
    if os.path.exists(folder) and not os.path.isdir(folder):
      named = "data.data_dir" if cfg.data.data_dir else (
          "T2T_JAX_DATA_DIR" if os.environ.get("T2T_JAX_DATA_DIR") else "the data folder")
      raise UsageError(f"{named}: {folder} is a file, not a directory")
  if cfg.data.vocab_from and not cfg.train.init_from and mode == "train":  # before data prep
    input_pipeline.vocab_file(cfg)
  if mode == "attention":
    layers = min(cfg.model.num_encoder_layers, cfg.model.num_layers)
    if not 0 <= FLAGS.layer < layers:
      raise UsageError(f"--layer={FLAGS.layer}: the model has layers 0..{layers - 1}")


def run_params(cfg: ExperimentConfig) -> None:
  """Prints `params: N` and a per-module breakdown from shapes alone (no data, no TF)."""
  from t2t_jax import model
  params = model.abstract_params(cfg.model)
  total = model.count_params(params)
  print(f"experiment: {cfg.name}" + (f" ({cfg.description})" if cfg.description else ""))
  print(f"params: {total}")
  for name, count in sorted(model.param_breakdown(params).items()):
    print(f"  {name:<20s} {count:>12,d}  ({100.0 * count / total:5.1f}%)")


def run_config(cfg: ExperimentConfig) -> None:
  """Prints the whole config as JSON, each setting the backend decides as this machine
  resolves it (`backend.resolved_levers`): what a run started here would train with."""
  from t2t_jax import backend
  out = dataclasses.asdict(cfg)
  for key, value in backend.resolved_levers(cfg).items():
    section, field = key.split(".")
    out[section][field] = value
  print(json.dumps({"experiment": cfg.name, "backend": backend.platform(), "config": out},
                   indent=2))


def run_prepare(cfg: ExperimentConfig) -> None:
  """Downloads (tfds, hf) and prepares the experiment's data into the data folder, as
  training's first stage would, and says where, how big and how long: a long preparation
  (WMT14) done ahead, on one machine, before the accelerators are reserved."""
  import time
  from t2t_jax import input_pipeline
  folder = cfg.data.data_dir or input_pipeline.default_data_dir()
  if os.path.exists(folder) and not os.path.isdir(folder):
    raise UsageError(f"the data folder {folder} is a file, not a directory")
  start = time.time()
  directory = input_pipeline.prepared_dir(input_pipeline.resolve_splits(cfg))
  from t2t_jax import storage
  size = storage.walk_bytes(directory)
  shown = f"{size / 1e9:,.2f} GB" if size >= 1e9 else f"{size / 1e6:,.1f} MB"
  print(f"data ready in {directory} ({shown}, {time.time() - start:,.0f} s); training reads it "
        f"from there", flush=True)


# Programs that compile faster than this are not worth a file in the cache (JAX's default,
# 1 s, leaves out most of a small model's programs on a CPU).
CACHE_MIN_COMPILE_SECONDS = 0.2


def use_compilation_cache(workdir: str) -> None:
  """JAX's persistent compilation cache where `--compilation_cache` says (before anything
  compiles): every program a run compiles is kept there, and a later command that needs the
  same program (a resume after a preemption, eval, translate) reads it instead of compiling."""
  from t2t_jax import storage
  where = FLAGS.compilation_cache.strip()
  if where.lower() in ("", "none", "off"):
    return
  path = storage.join(workdir, "compilation_cache") if where == "auto" else \
      storage.normalize(where)
  import jax
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", CACHE_MIN_COMPILE_SECONDS)


def start_distributed() -> None:
  """Joins a multi-process job if asked to (before any JAX computation)."""
  explicit = [FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id]
  if not FLAGS.distributed and all(x is None for x in explicit):
    return
  if any(x is None for x in explicit) and not all(x is None for x in explicit):
    raise UsageError("give all of --coordinator_address, --num_processes and --process_id, "
                     "or --distributed to read them from the cluster environment")
  if FLAGS.num_processes is not None and not 0 <= FLAGS.process_id < FLAGS.num_processes:
    raise UsageError(f"--process_id={FLAGS.process_id} is not in 0..{FLAGS.num_processes - 1}")
  from t2t_jax import parallel
  parallel.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
  import jax
  print(f"process {jax.process_index()} of {jax.process_count()}: "
        f"{jax.local_device_count()} local of {jax.device_count()} devices", flush=True)


def main(argv: list[str]) -> None:
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # keep JAX's backend-probing INFO lines quiet
  if len(argv) > 1:
    raise UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if FLAGS.mode not in MODES:
    raise UsageError(f"unknown --mode={FLAGS.mode!r}; valid modes: {', '.join(MODES)}")
  cfg = load_config(FLAGS.experiment, FLAGS.set, FLAGS.dataset)
  if FLAGS.mode == "params":
    run_params(cfg)
    return
  if FLAGS.mode == "config":
    run_config(cfg)
    return
  if FLAGS.mode == "prepare":
    run_prepare(cfg)
    return
  if FLAGS.ensemble and FLAGS.mode not in ("eval", "translate", "score"):
    raise UsageError(f"--ensemble is for --mode=eval, translate or score, not "
                     f"--mode={FLAGS.mode}")
  if FLAGS.nbest and FLAGS.mode != "translate":
    raise UsageError(f"--nbest is for --mode=translate, not --mode={FLAGS.mode}")
  if cfg.ensemble.members > 1 and (FLAGS.distributed or FLAGS.coordinator_address):
    raise UsageError("ensemble.members > 1 trains its members as processes of one host; "
                     "train multi-host members one by one and decode them with --ensemble")
  if not FLAGS.workdir:
    raise UsageError(f"--workdir is required for --mode={FLAGS.mode}")
  check_paths(cfg)
  from t2t_jax import storage
  workdir = storage.normalize(FLAGS.workdir)  # gs:// kept as it is, never a folder named gs:
  start_distributed()
  from t2t_jax import bookkeeping, input_pipeline, workdirs
  run = workdirs.Workdir(workdir)  # what the workdir's run is, asked by every step below
  if FLAGS.mode == "train" or run.trained:
    use_compilation_cache(workdir)  # not into a workdir that holds no run
  if run.damaged and FLAGS.mode != "train":  # training moves it aside and records anew
    print(f"warning: {storage.join(workdir, workdirs.RUN_INFO)} is damaged ({run.damaged}); "
          f"this command's settings stand in for it", file=sys.stderr, flush=True)
  cfg = bookkeeping.with_recorded_vocabulary(cfg, workdir)
  gives_data = bool(FLAGS.dataset) or any(s.strip().startswith("data.") for s in FLAGS.set)
  if FLAGS.mode != "train" and not gives_data:
    cfg = bookkeeping.with_recorded_data(cfg, workdir)
  set_keys = [item.partition("=")[0].strip() for item in FLAGS.set]
  gives_model = any(k.startswith("model.") and k[len("model."):] not in COMPUTE_FIELDS
                    for k in set_keys)  # how it computes may change in any mode
  if FLAGS.mode != "train" and not gives_model:
    cfg = bookkeeping.with_recorded_model(cfg, workdir)
  if FLAGS.mode != "train" and not any(k.startswith("average.") for k in set_keys):
    cfg = bookkeeping.with_recorded_average(cfg, workdir)
  cfg = bookkeeping.with_compute_dtype(cfg, workdir)
  validate(cfg)  # what depends on the resolved dtype
  if FLAGS.mode in ("train", "eval"):  # the modes that read the corpus; the others read
    cfg = input_pipeline.resolve_splits(cfg)  # only the workdir
  if FLAGS.splits and FLAGS.mode != "eval":
    raise UsageError(f"--splits is for --mode=eval, not --mode={FLAGS.mode}")
  if FLAGS.test_data:
    test_data, splits = test_data_config(cfg, FLAGS.test_data, FLAGS.splits)
  else:
    test_data, splits = None, eval_splits(cfg, FLAGS.splits)
  if FLAGS.mode != "train":
    if not storage.isdir(workdir):
      raise UserError(f"no such workdir: {workdir} (train first with python -m t2t_jax.main "
                      f"--experiment={cfg.name} --workdir={FLAGS.workdir})")
    bookkeeping.check_run_info(cfg, workdir, training=False, reads_data=FLAGS.mode == "eval")
  if FLAGS.mode == "train" and cfg.ensemble.members > 1:
    run_train_ensemble(cfg, workdir)
  elif FLAGS.mode == "train":
    run_train(cfg, workdir)
  else:  # one-host work: in a multi-host job, process 0's while the others wait
    from t2t_jax import parallel
    parallel.process_zero_only(lambda: run_mode(cfg, workdir, splits, test_data),
                               f"run --mode={FLAGS.mode}")


def test_data_config(cfg: ExperimentConfig, spec: str, raw_splits: str | None
                     ) -> tuple[ExperimentConfig, list[str]]:
  """`--test_data`: the run's config reading its held-out text from `spec` instead (the run's
  own data settings, which its checkpoints are checked against, stay), and the `--splits` to
  decode. The source is in the run's direction (a folder without one is read in it), and
  has those splits."""
  from t2t_jax import data_sources, input_pipeline
  if FLAGS.mode != "eval":
    raise UsageError(f"--test_data is for --mode=eval, not --mode={FLAGS.mode}")
  if not raw_splits:
    raise UsageError("--test_data needs --splits: which of its splits to decode")
  run = input_pipeline.resolve_source(cfg)
  given = data_sources.spec_languages(spec)
  if given is None and spec.startswith("folder:"):
    spec, given = f"{spec}:{run.src_lang}-{run.tgt_lang}", (run.src_lang, run.tgt_lang)
  if given is not None and given != (run.src_lang, run.tgt_lang):
    raise UsageError(f"--test_data={spec} is {given[0]}->{given[1]}; the run translates "
                     f"{run.src_lang}->{run.tgt_lang}")
  test_cfg, splits = override(cfg, {"data.dataset": spec}), _split_names(raw_splits)
  _check_present(test_cfg, raw_splits, splits)
  return test_cfg, splits


def run_mode(cfg: ExperimentConfig, workdir: str, splits: list[str],
             test_data: ExperimentConfig | None = None) -> None:
  """Every mode but training, on this process's devices."""
  if FLAGS.mode == "average":
    from t2t_jax import train, translator
    for member in translator.member_dirs(cfg, workdir):
      train.run_average(cfg, member)
  elif FLAGS.mode == "eval":
    from t2t_jax import inference
    inference.run_eval(cfg, workdir, samples=3, splits=splits, ensemble=FLAGS.ensemble,
                       test_data=test_data)
  elif FLAGS.mode == "translate":
    from t2t_jax import inference
    inference.run_translate(cfg, workdir, FLAGS.input, FLAGS.output, ensemble=FLAGS.ensemble,
                           nbest=FLAGS.nbest)
  elif FLAGS.mode == "score":
    from t2t_jax import inference
    inference.run_score(cfg, workdir, FLAGS.input, FLAGS.output, ensemble=FLAGS.ensemble)
  elif FLAGS.mode == "export":
    if not FLAGS.output:
      raise UsageError("--mode=export needs --output=DIR, the folder to write")
    from t2t_jax import export
    print(export.export_huggingface(cfg, workdir, FLAGS.output), flush=True)
  elif FLAGS.mode == "attention":
    from t2t_jax import inference
    inference.run_attention(cfg, workdir, FLAGS.sentence, FLAGS.layer, FLAGS.output)


def run_train(cfg: ExperimentConfig, workdir: str) -> None:
  """Trains (resuming if possible), then finishes as the paper did: average, then evaluate."""
  from t2t_jax import inference, parallel, train, workdirs
  again = _this_command()
  run = workdirs.Workdir(workdir)
  # While training is stopped before its end the workdir says so (`workdirs.STOPPED`): what a
  # batch script asks to requeue itself. Process 0 writes it, and clears it once training
  # has ended. (Asked after training began: the process index starts the backend.)
  primary = lambda: jax_process_index() == 0
  try:
    # Before and after its loop (data preparation, restore, compilation) a SIGTERM stops the
    # command at once: preparation removes its temporary folder, nothing else is half-written.
    with _sigterm_stops():
      _, stopped_by, finished = train.train_and_evaluate(cfg, workdir)
  except _Stopped:
    print(f"stopped on SIGTERM outside the training loop; nothing was lost. Resume with: "
          f"{again}", flush=True)
    if primary():
      run.mark_stopped("SIGTERM", again)
    return
  if stopped_by:
    print(f"resume with: {again}", flush=True)
    if primary():
      run.mark_stopped(stopped_by, again)
    return
  if finished and primary():
    run.clear_stopped()
  if not finished or not cfg.train.final_eval:
    return

  def average_and_evaluate() -> None:
    """One-host work: in a multi-host job, process 0's on its own devices."""
    if print_stored_eval(cfg, workdir, [workdir]):
      return
    train.run_average(cfg, workdir)
    inference.run_eval(cfg, workdir, samples=3, splits=final_eval_splits(cfg))
  try:
    with _sigterm_stops():
      parallel.process_zero_only(average_and_evaluate, "average and evaluate")
  except _Stopped:
    print(f"stopped on SIGTERM during the final evaluation; training is complete and "
          f"checkpointed. Decode with the same command:\n  {again}", flush=True)
    if primary():
      run.mark_stopped("SIGTERM", again)


def jax_process_index() -> int:
  import jax
  return jax.process_index()


def _this_command() -> str:
  return "python -m t2t_jax.main " + " ".join(shlex.quote(a) for a in sys.argv[1:])


# How often a stop requested by SIGTERM is sent again until it ends the block (`_sigterm_stops`).
RESEND_SIGTERM_S = 0.5


class _Stopped(Exception):
  """A SIGTERM arrived outside the training loop (which handles its own): while preparing
  data, or while a finished run was averaging or decoding."""


@contextlib.contextmanager
def _sigterm_stops():
  """The final average and decode take minutes; a SIGTERM then (a preemption notice, a sweep
  stopping) ends them at once and cleanly: both write their outputs atomically, and the
  same command redoes only what is missing."""
  lock, state = threading.Lock(), {"active": True, "requested": False}

  def handle(signum, frame):
    if not state["active"]:  # a resent signal met while the block was being left
      return
    if not state["requested"]:
      state["requested"] = True
      threading.Thread(target=resend, daemon=True).start()
    raise _Stopped

  def resend():
    # A raise from a signal handler is lost when the signal lands in a garbage-collection
    # callback (jax has one; Python prints "Exception ignored" and goes on), which a decode
    # loop of many small calls runs often. So the signal comes again until one raise lands
    # and this block is left.
    while True:
      time.sleep(RESEND_SIGTERM_S)
      with lock:
        if not state["active"]:
          return
        os.kill(os.getpid(), signal.SIGTERM)

  old = signal.signal(signal.SIGTERM, handle)
  try:
    yield
  finally:
    while True:  # a resent signal may raise here too: retry until the handler is restored
      try:
        with lock:  # no signal is resent between these two lines
          state["active"] = False
          signal.signal(signal.SIGTERM, old)
        break
      except _Stopped:
        continue


def run_train_ensemble(cfg: ExperimentConfig, workdir: str) -> None:
  """Trains `ensemble.members` models at once, each averaging and evaluating itself; then
  decodes the dev and test splits with all of them."""
  from t2t_jax import bookkeeping, ensemble, inference, input_pipeline, translator
  bookkeeping.check_workdir(cfg, workdir)
  bookkeeping.write_run_info(cfg, workdir)
  input_pipeline.prepared_dir(cfg)  # once, before the members start
  dirs = translator.member_dirs(cfg, workdir)
  if not ensemble.train_members(cfg, dirs, FLAGS.experiment, FLAGS.dataset, FLAGS.set):
    return
  if cfg.train.final_eval and not print_stored_eval(cfg, workdir, dirs):
    try:
      with _sigterm_stops():
        inference.run_eval(cfg, workdir, samples=3, splits=final_eval_splits(cfg))
    except _Stopped:
      print(f"stopped on SIGTERM during the ensemble's evaluation; decode with the same "
            f"command:\n  {_this_command()}", flush=True)


def print_stored_eval(cfg: ExperimentConfig, workdir: str, models: list[str]) -> bool:
  """Prints the final evaluation stored in WORKDIR/eval if it is newer than every model's
  averaged checkpoint (a finished run started again); False when it must be (re)computed."""
  stored = [os.path.join(workdir, "eval", f"{s}.json") for s in final_eval_splits(cfg)]
  averaged = [os.path.join(m, "averaged", "averaged.json") for m in models]
  from t2t_jax import storage
  if not all(storage.exists(p) for p in stored + averaged):
    return False
  if min(storage.mtime(p) for p in stored) < max(storage.mtime(p) for p in averaged):
    return False
  lines = []
  for path in stored:
    try:
      r = json.loads(storage.read_text(path))
      lines.append(f"{r['split']}: sacreBLEU {r['sacrebleu']:.2f} ({r['signature']})  "
                   f"tokenized BLEU {r['tokenized_bleu']:.2f}  [{r['num_sentences']} "
                   f"sentences, {r['checkpoint']}]")
    except (OSError, ValueError, KeyError, TypeError) as e:  # damaged: decode again
      print(f"warning: {path} is damaged ({type(e).__name__}); evaluating again",
            file=sys.stderr, flush=True)
      return False
  print("training already finished; final evaluation (from WORKDIR/eval):")
  print("\n".join(lines))
  return True


def _parse_flags(argv: list[str]) -> list[str]:
  try:
    return FLAGS(argv)
  except flags.Error as e:
    fail(str(e).splitlines()[0])


def _named_paths() -> list[str]:
  """The paths this command names (the workdir, input, output, ensemble members, the
  dataset's folder, the experiment's file, every --set value) and the data and cache folders
  of its environment, absolute. "folder:PATH:en-de" and "FILE.py:FUNCTION" give their parts."""
  values = [FLAGS.workdir, FLAGS.input, FLAGS.output, FLAGS.experiment, FLAGS.dataset,
            *FLAGS.ensemble, *(item.partition("=")[2] for item in FLAGS.set),
            *(os.environ.get(k) for k in ("T2T_JAX_DATA_DIR", "TFDS_DATA_DIR",
                                          "JAX_COMPILATION_CACHE_DIR"))]
  return [os.path.abspath(os.path.expanduser(part)) for value in values if value
          for part in value.split(":") if part]


def is_named_path(filename: str) -> bool:
  """Whether `filename` is one of `_named_paths` or lies inside one."""
  path = os.path.abspath(os.path.expanduser(str(filename)))
  return any(path == p or path.startswith(p.rstrip(os.sep) + os.sep) for p in _named_paths())


def _main_guarded(argv: list[str]) -> None:
  try:
    main(argv)
  except UserError as e:
    fail(str(e))
  except PermissionError as e:
    # A file or folder of the user's this process may not touch is one line; a permission
    # error elsewhere (a bug of ours, an installation's files) keeps its traceback.
    if e.filename is None or not is_named_path(e.filename):
      raise
    fail(f"permission denied: {e.filename}")
  except KeyboardInterrupt:
    print("interrupted", file=sys.stderr)
    sys.exit(130)


def usage() -> str:
  """What `--help` prints: how to call, the experiments with what each is, the flags."""
  from t2t_jax import registry
  width = max(len(n) for n in registry.names())
  listed = "\n".join(f"  {name:<{width}}  {text}"
                     for name, text in registry.descriptions().items())
  return (f"{__doc__.strip()}\n\nExperiments (--experiment=NAME, or FILE.py:FUNCTION for a "
          f"function of your own that returns an ExperimentConfig):\n{listed}\n\nFlags:\n"
          f"{FLAGS.module_help(sys.modules[__name__])}\n")


def run() -> None:
  if any(a in ("-h", "-?", "--help", "--helpshort", "--helpfull") for a in sys.argv[1:]):
    sys.stdout.write(usage())
    sys.exit(0)
  from t2t_jax import side_by_side
  side_by_side.setup_member()  # a member of an ensemble or sweep: its cores, stop if we die
  hostmem.reexec_with_huge_pages()
  from t2t_jax import backend
  backend.apply_xla_flags()  # before JAX starts: XLA reads its flags once
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
  app.run(_main_guarded, flags_parser=_parse_flags)


if __name__ == "__main__":
  run()
