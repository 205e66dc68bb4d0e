"""The command-line contract: run as a user would, in a subprocess."""

import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from t2t_jax import registry
from t2t_jax.config import ConfigError, ExperimentConfig, override, validate

REPO = Path(__file__).resolve().parents[1]


def run(*args, cwd=REPO, **kwargs):
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
  return subprocess.run([sys.executable, "-m", "t2t_jax.main", *args], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=120, **kwargs)


def test_params_mode_prints_count_and_breakdown_without_tensorflow():
  code = ("import sys, runpy; sys.argv=['t2t_jax.main','--mode=params','--experiment=base_ende'];"
          "\ntry:\n  runpy.run_module('t2t_jax.main', run_name='__main__')\nexcept SystemExit: pass"
          "\nassert 'tensorflow' not in sys.modules, 'params mode imported TensorFlow'")
  r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                     timeout=120)
  assert r.returncode == 0, r.stderr
  assert "params: 63045632" in r.stdout.splitlines()
  assert "encoder" in r.stdout and "decoder" in r.stdout and "embed" in r.stdout


def test_the_environment_gives_the_compilation_caches_default():
  """T2T_JAX_COMPILATION_CACHE sets --compilation_cache's default (one cache for a host's runs);
  without it each run keeps its own, in the workdir."""
  code = "from t2t_jax import main; print(main.FLAGS['compilation_cache'].default)"
  env = {k: v for k, v in os.environ.items() if k != "T2T_JAX_COMPILATION_CACHE"}
  runs = [subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                         timeout=120, check=True).stdout.strip()
          for e in (env, {**env, "T2T_JAX_COMPILATION_CACHE": "/some/folder"})]
  assert runs == ["auto", "/some/folder"]


def test_set_overrides_reach_the_model():
  r = run("--mode=params", "--experiment=base_ende", "--set", "model.num_layers=2",
          "--set", "model.vocab_size=1000")
  assert r.returncode == 0, r.stderr
  # 1000 * 512 + 2 * (3,150,336 + 4,199,936) from the closed form in test_model.
  assert "params: 15212544" in r.stdout.splitlines()


def test_config_mode_prints_the_whole_config_as_this_machine_resolves_it():
  """Every field, without training or a workdir; the settings the backend decides come
  resolved (on a CPU: float32, the cpu_tuned path, no fused projections, no loss chunks,
  2,048 decode tokens), the user's own values kept."""
  import json
  r = run("--mode=config", "--experiment=big_enfr", "--set", "decode.batch_tokens=999")
  assert r.returncode == 0, r.stderr
  out = json.loads(r.stdout)
  assert out["experiment"] == "big_enfr" and out["backend"] == "cpu"
  cfg = out["config"]
  assert cfg["model"]["d_model"] == 1024 and cfg["train"]["tokens_per_step"] == 25000
  assert (cfg["model"]["dtype"], cfg["model"]["implementation"],
          cfg["model"]["fused_projections"], cfg["data"]["packing"],
          cfg["train"]["loss_chunk_tokens"], cfg["decode"]["batch_tokens"]) == (
              "float32", "cpu_tuned", False, True, 0, 999)
  assert "auto" not in json.dumps({k: cfg["model"][k] for k in ("dtype", "implementation")})


BAD_INPUT = [
    (["--experiment=nope"], "unknown experiment 'nope'; valid names: base_ende"),
    (["--experiment=demo", "--mode=train", "--workdir=/tmp/t2t_jax_no_cluster", "--distributed"],
     "--distributed: no cluster found in this environment (SLURM, Open MPI, a Cloud TPU "
     "slice)"),
    (["--experiment=base_ende", "--set", "model.d_modle=3"],
     "unknown config key 'model.d_modle'; did you mean model.d_model"),
    (["--experiment=base_ende", "--set", "model.d_model=big"],
     "model.d_model: expected an integer, got 'big'"),
    (["--experiment=base_ende", "--set", "model.positional=rotary"],
     "model.positional: 'rotary' is not one of sinusoidal, learned"),
    (["--experiment=base_ende", "--set", "model.dropout"], "--set expects KEY=VALUE"),
    (["--experiment=base_ende", "--set", "train.cooldown_steps=200000"],
     "train.cooldown_steps: must be between 0 and train.steps (100000)"),
    (["--experiment=base_ende", "--set", "train.cooldown_minutes=5"],
     "train.cooldown_minutes: must be between 0 and the time budget, "
     "train.max_train_minutes (0), got 5"),
    (["--experiment=multi30k_ende", "--set", "train.cooldown_minutes=5", "--set",
      "train.cooldown_steps=100"], "train.cooldown_minutes and train.cooldown_steps: set one"),
    (["--experiment=base_ende", "--set", "model.attention_dropout=1"],
     "model.attention_dropout: must be in [0, 1)"),
    (["--experiment=base_ende", "--mode=fly"], "unknown --mode='fly'"),
    (["--experiment=base_ende", "--no_such_flag=1"], "no_such_flag"),
    (["--experiment=demo", "--mode=train", "--workdir=/nonexistent/w", "--process_id=1"],
     "give all of --coordinator_address, --num_processes and --process_id"),
    (["--experiment=demo", "--mode=train", "--workdir=/nonexistent/w", "--process_id=2",
      "--num_processes=2", "--coordinator_address=localhost:1"], "--process_id=2 is not in 0..1"),
    (["--experiment=demo", "--mode=average", "--workdir=/nonexistent/w", "--ensemble=/x"],
     "--ensemble is for --mode=eval, translate or score, not --mode=average"),
    # Issue 51: path arguments and --layer checked before any model loads (a directory as
    # --input was IsADirectoryError; --layer=7 a ValueError after loading and translating).
    (["--experiment=demo", "--mode=translate", "--workdir=/nonexistent/w", f"--input={REPO}"],
     f"--input: {REPO} is a directory; give a file"),
    (["--experiment=demo", "--mode=score", "--workdir=/nonexistent/w", f"--input={REPO}"],
     f"--input: {REPO} is a directory; give a file"),
    (["--experiment=demo", "--mode=translate", "--workdir=/nonexistent/w", "--input=/no/file"],
     "--input: no such file: /no/file"),
    (["--experiment=demo", "--mode=translate", "--workdir=/nonexistent/w", f"--output={REPO}"],
     f"--output: {REPO} is a directory; give a file name"),
    (["--experiment=demo", "--mode=score", "--workdir=/nonexistent/w", "--output=/no/dir/out"],
     "--output: no such folder: /no/dir"),
    (["--experiment=demo", "--mode=attention", "--workdir=/nonexistent/w", f"--output={REPO}"],
     f"--output: {REPO} is a directory; give a file name"),
    (["--experiment=demo", "--mode=export", "--workdir=/nonexistent/w",
      f"--output={REPO / 'setup.py'}"], "is a file; export writes a folder"),
    (["--experiment=demo", "--mode=attention", "--workdir=/nonexistent/w", "--layer=7"],
     "--layer=7: the model has layers 0..1"),
    (["--experiment=demo", "--mode=attention", "--workdir=/nonexistent/w", "--layer=-1"],
     "--layer=-1: the model has layers 0..1"),
    (["--experiment=demo", "--mode=translate", "--workdir=/nonexistent/w", "--ensemble=/no/run"],
     "--ensemble: no such directory: /no/run"),
    (["--experiment=demo", "--mode=eval", "--workdir=/nonexistent/w",
      f"--ensemble={REPO / 'setup.py'}"], "is a file, not a directory"),
    (["--experiment=demo", "--mode=train", f"--workdir={REPO / 'setup.py'}"],
     "setup.py is a file, not a directory"),
    (["--experiment=demo", "--mode=translate", f"--workdir={REPO / 'setup.py'}"],
     "setup.py is a file, not a directory"),
    (["--experiment=demo", "--mode=train", "--workdir=/nonexistent/w",
      f"--dataset=folder:{REPO / 'setup.py'}:en-de"], "dataset folder not found"),
    ([f"--experiment={REPO / 'tests'}/no_such.py:f"], "no_such.py:f: no such file"),
    (["--experiment=demo", "--mode=train", "--workdir=/nonexistent/w", "--set",
      f"data.data_dir={REPO / 'setup.py'}"], "data.data_dir: "),
    (["--experiment=demo", "--mode=train", "--workdir=/nonexistent/w", "--set",
      f"data.vocab_from={REPO / 'setup.py'}"], "setup.py is not a SentencePiece model"),
]


@pytest.fixture(scope="module")
def bad_input_results():
  """Every bad-input command, run concurrently: each is a short, mostly single-threaded
  start-up, so this halves the module's time on two cores."""
  from concurrent.futures import ThreadPoolExecutor

  def one(args):
    return run("--mode=params", *args) if not any(a.startswith("--mode") for a in args) \
        else run(*args)

  with ThreadPoolExecutor(max_workers=4) as pool:
    return list(pool.map(one, [args for args, _ in BAD_INPUT]))


@pytest.mark.parametrize("case", range(len(BAD_INPUT)), ids=lambda i: " ".join(BAD_INPUT[i][0]))
def test_bad_input_is_one_line_exit_2(bad_input_results, case):
  r, message = bad_input_results[case], BAD_INPUT[case][1]
  assert r.returncode == 2, (r.stdout, r.stderr)
  lines = [l for l in r.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
  assert message in lines[0]
  assert "Traceback" not in r.stderr


def test_an_experiment_file_that_is_a_folder_or_unreadable_is_one_line(tmp_path):
  folder = tmp_path / "configs.py"
  folder.mkdir()
  r = run(f"--experiment={folder}:base", "--mode=params")
  assert r.returncode == 2 and f"{folder} is a directory; give a file" in r.stderr, r.stderr
  assert "Traceback" not in r.stderr


def test_an_unreadable_input_is_one_line(tmp_path):
  """A file this process may not read (simulated: the tests may run as root, whom file
  modes do not stop) is a one-line error before the model loads, for --input and for
  --experiment FILE."""
  unreadable = tmp_path / "lines.py"  # a line to translate, or a config file
  unreadable.write_text("ta suda.\n")
  corpus = tmp_path / "corpus"
  corpus.mkdir()
  code = ("import builtins, os, sys\nopen_, listdir_ = builtins.open, os.listdir\n"
          f"DENIED = ({str(unreadable)!r}, {str(corpus)!r})\n"
          "def denied(real):\n"
          "  def call(path, *a, **k):\n"
          "    if str(path) in DENIED:\n"
          "      raise PermissionError(13, 'Permission denied', str(path))\n"
          "    return real(path, *a, **k)\n"
          "  return call\n"
          "builtins.open, os.listdir = denied(open_), denied(listdir_)\n"
          "from t2t_jax import main; sys.argv[0] = 'main'; main.run()")
  for args, path in (
      (["--mode=translate", "--experiment=demo", "--workdir=/nonexistent/w",
        f"--input={unreadable}"], unreadable),
      (["--mode=params", f"--experiment={unreadable}:f"], unreadable),
      (["--mode=train", "--experiment=demo", f"--workdir={tmp_path / 'run'}",
        f"--dataset=folder:{corpus}:en-de"], corpus)):
    r = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"cannot read {path} (Permission denied)" in r.stderr and \
        "Traceback" not in r.stderr


def test_only_a_permission_error_on_a_path_the_command_names_is_one_line(tmp_path, monkeypatch,
                                                                         capsys):
  """A folder or file of the user's (the workdir or inside it, a dataset folder) that this
  process may not touch is one `error:` line; a permission error anywhere else is a bug or
  an installation's, and keeps its traceback."""
  from t2t_jax import main
  workdir, corpus = tmp_path / "run", tmp_path / "corpus"
  argv = ["t2t_jax.main", "--experiment=demo", f"--workdir={workdir}",
          f"--dataset=folder:{corpus}:en-de"]

  def raising(path):
    def fake_main(argv):
      raise PermissionError(13, "Permission denied", str(path))
    return fake_main
  main.FLAGS.unparse_flags()
  try:
    for path in (workdir / "checkpoints" / "3", corpus / "train.en"):
      monkeypatch.setattr(main, "main", raising(path))
      with pytest.raises(SystemExit) as exit_:
        main._main_guarded(main._parse_flags(argv))
      assert exit_.value.code == 2
      assert f"error: permission denied: {path}" in capsys.readouterr().err
      main.FLAGS.unparse_flags()
    monkeypatch.setattr(main, "main", raising("/usr/lib/python3/site.py"))
    with pytest.raises(PermissionError):
      main._main_guarded(main._parse_flags(argv))
    monkeypatch.setattr(main, "main", raising(str(tmp_path / "runs")))  # a sibling, not inside
    main.FLAGS.unparse_flags()
    with pytest.raises(PermissionError):
      main._main_guarded(main._parse_flags(argv[:2] + [f"--workdir={tmp_path / 'run'}"]))
  finally:
    main.FLAGS.unparse_flags()


def test_override_parses_types_and_keeps_config_frozen():
  cfg = ExperimentConfig()
  new = override(cfg, {"train.steps": "1e3", "model.dropout": "0.2", "model.dtype": "bfloat16"})
  assert (new.train.steps, new.model.dropout, new.model.dtype) == (1000, 0.2, "bfloat16")
  assert cfg.train.steps == 100_000


def test_sentences_longer_than_the_learned_positions_are_refused_before_any_work():
  """Learned positions cover `model.max_len` places: a longer sentence (packed or not) would
  index past the table. One line at start-up, not a NaN loss in the loop."""
  cfg = override(registry.get("table3_e_learned_pos"), {"data.max_length": "300"})
  with pytest.raises(ConfigError, match="data.max_length=300.*model.max_len=256"):
    validate(cfg)
  validate(override(cfg, {"model.positional": "sinusoidal"}))  # sinusoids have no bound


def test_an_object_store_workdir_orbax_cannot_write_is_refused_not_made_a_local_folder(
    tmp_path):
  """Issue 45 (15): `--workdir=gs://...` became a local folder named `gs:` that vanished with
  the VM, checkpoints and all. gs:// is a bucket now (tests/test_object_store.py); s3://,
  which orbax cannot write checkpoints to, is one line naming what works."""
  r = subprocess.run([sys.executable, "-m", "t2t_jax.main", "--experiment=demo",
                      "--workdir=s3://bucket/run"], cwd=tmp_path, capture_output=True,
                     text=True, timeout=120)
  assert r.returncode == 2 and "s3:// is not supported" in r.stderr and "gs://" in r.stderr
  assert not (tmp_path / "s3:").exists()


def test_a_folder_with_its_own_experiments_package_does_not_shadow_ours(tmp_path):
  """Issue 46: the installed top-level `experiments` package lost to any `experiments/` in
  the working directory, and the command died with an AttributeError."""
  (tmp_path / "experiments").mkdir()
  (tmp_path / "experiments" / "__init__.py").write_text("LAB = 'my own experiments'\n")
  r = run("--mode=params", "--experiment=base_ende", cwd=tmp_path)
  assert r.returncode == 0, r.stderr[-2000:]
  assert "params: 63045632" in r.stdout.splitlines()


def test_an_experiment_can_be_a_function_in_any_file(tmp_path):
  (tmp_path / "my_configs.py").write_text(
      "from t2t_jax import registry\nfrom t2t_jax.config import override\n\n\n"
      "def two_layers():\n  \"\"\"base_ende with two layers a side.\"\"\"\n"
      "  return override(registry.get('base_ende'), {'model.num_layers': 2, "
      "'model.vocab_size': 1000})\n")
  r = run("--mode=params", f"--experiment={tmp_path / 'my_configs.py'}:two_layers")
  assert r.returncode == 0, r.stderr[-2000:]
  assert "params: 15212544" in r.stdout.splitlines()  # as test_set_overrides_reach_the_model
  r = run("--mode=params", f"--experiment={tmp_path / 'my_configs.py'}:three")
  assert r.returncode == 2
  assert "has no function 'three' (it has two_layers)" in r.stderr
  assert len(r.stderr.strip().splitlines()) == 1


def test_help_lists_every_experiment_with_its_description_and_exits_0():
  from t2t_jax import registry
  r = run("--help")
  assert r.returncode == 0, r.stderr
  for name, text in registry.descriptions().items():
    assert f"{name}  " in r.stdout and text in r.stdout
  assert "--workdir" in r.stdout and "--mode" in r.stdout
  # Every data source the README names (the hf: source was missing from --dataset's text).
  dataset_help = r.stdout[r.stdout.index("--dataset:"):r.stdout.index("--[no]distributed")]
  for source in ("tfds:", "hf:", "folder:", "demo"):
    assert source in dataset_help, dataset_help


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the ignored raise
def test_a_sigterm_whose_raise_a_gc_callback_swallowed_still_stops_the_final_evaluation():
  """A SIGTERM handled inside a garbage-collection callback (jax has one) raises there, and
  Python ignores that raise and goes on. The final average and decode still stop: the signal
  is sent again until its raise ends the block."""
  from t2t_jax import main
  fired, before = [], signal.getsignal(signal.SIGTERM)

  def callback(phase, info):
    if phase == "start" and not fired:
      fired.append(True)
      os.kill(os.getpid(), signal.SIGTERM)
      for _ in range(10_000):  # the handler runs here, and its raise is ignored
        pass
  gc.callbacks.append(callback)
  try:
    with pytest.raises(main._Stopped):
      with main._sigterm_stops():
        gc.collect()
        assert fired
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # work that would otherwise run to its end
          time.sleep(0.01)
  finally:
    gc.callbacks.remove(callback)
  assert signal.getsignal(signal.SIGTERM) is before  # the handler before the block is back


def test_prepare_mode_prepares_the_data_training_then_reads(tmp_path):
  """`--mode=prepare` does training's first stage alone, no workdir needed, into the data
  folder that training reads: a second command finds the cache and prepares nothing."""
  env = {**os.environ, "T2T_JAX_DATA_DIR": str(tmp_path / "data")}
  sets = ["--set", "model.vocab_size=64", "--set", "data.max_length=32"]
  r = subprocess.run([sys.executable, "-m", "t2t_jax.main", "--experiment=demo",
                      "--mode=prepare", *sets], cwd=REPO, env=env, capture_output=True,
                     text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  assert "data ready in" in r.stdout and "tokenising train" in r.stdout + r.stderr
  cached = [p for p in (tmp_path / "data").rglob("meta.json")]
  assert len(cached) == 1
  r = subprocess.run([sys.executable, "-m", "t2t_jax.main", "--experiment=demo",
                      "--mode=prepare", *sets], cwd=REPO, env=env, capture_output=True,
                     text=True, timeout=300)
  assert r.returncode == 0 and "tokenising" not in r.stdout + r.stderr
