"""Every file of a trained workdir deleted or truncated, one at a time, before every mode that
reads a workdir: each case works, or is one `error:` line with exit code 2, and never loses a
checkpoint or a line of history (issue 51's sweep: before it, 22 of the first 84 cases, all
but --mode=attention's, ended in a traceback or dropped a torn line of metrics.jsonl).

The command runs in this process (`main`'s own flag parsing and error handling), so that the
98 cases cost a fraction of 98 interpreter starts. Other commands on the same trained workdir
run here too: the record read once a command, another corpus's test sets decoded.
"""

import contextlib
import io
import json
import os
import shutil
from pathlib import Path

import pytest

from t2t_jax import checkpoints, main, workdirs

from helpers import FAST_DATA, TINY_MODEL, set_flags

SETS = {**TINY_MODEL, **FAST_DATA, "model.dropout": 0.0, "train.steps": 20,
        "train.checkpoint_every_steps": 10, "train.log_every_steps": 10,
        "train.eval_every_steps": 1000, "train.tokens_per_step": 512,
        "train.max_tokens_per_batch": 512, "train.final_eval_test": False,
        "average.last": 2, "decode.beam_size": 1, "decode.max_extra_length": 4}
FILES = ("experiment.json", "spm.model", "spm.model.sha256", "metrics.jsonl", "checkpoints",
         "averaged", "eval")
MODES = ("train", "eval", "translate", "score", "export", "average", "attention")
# The cases that cannot work, each with the part of its one-line error that says why. Every
# other case works (exit 0).
ERRORS = {
    **{("spm.model", "deleted", m): "has no spm.model"
       for m in ("translate", "score", "export", "attention")},
    **{("spm.model", "truncated", m): "spm.model is damaged"
       for m in ("eval", "translate", "score", "export", "attention")},
    ("checkpoints", "deleted", "average"): "no checkpoints in",
    ("checkpoints", "truncated", "average"): "cannot average: checkpoint",
    **{("averaged", "truncated", m): "run --mode=average to write it again"
       for m in ("eval", "translate", "score", "export", "attention")},
}


def run_main(argv, capsys):
  """(exit code, stdout, stderr) of `python -m t2t_jax.main ARGV`, run in this process."""
  main.FLAGS.unparse_flags()
  try:
    main._main_guarded(main._parse_flags(["t2t_jax.main"] + argv))
    code = 0
  except SystemExit as e:
    code = e.code
  finally:
    main.FLAGS.unparse_flags()
  out = capsys.readouterr()
  return code, out.out, out.err


# The demo's language pair, cut to a corpus whose held-out splits decode in a moment.
CORPUS_LINES = {"train": 3000, "valid": 40, "test": 40}


def _small_corpus(root: Path) -> str:
  from t2t_jax import data_sources
  full, small = root / "demo_corpus", root / "small_corpus"
  data_sources.write_demo_folder(str(full))
  small.mkdir()
  for split, lines in CORPUS_LINES.items():
    for lang in (data_sources.DEMO_SRC, data_sources.DEMO_TGT):
      text = (full / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()[:lines]
      (small / f"{split}.{lang}").write_text("".join(l + "\n" for l in text), encoding="utf-8")
  return f"folder:{small}:{data_sources.DEMO_SRC}-{data_sources.DEMO_TGT}"


def _args(workdir, mode, tmp, dataset):
  args = ["--experiment=demo", f"--workdir={workdir}", f"--mode={mode}",
          f"--dataset={dataset}"] + set_flags(SETS)
  if mode in ("translate", "score"):
    src = tmp / "input.txt"
    src.write_text("ta suda.\tla\n" if mode == "score" else "ta suda.\n")
    args += [f"--input={src}", f"--output={tmp / 'output.txt'}"]
  if mode == "export":
    args.append(f"--output={tmp / 'hf'}")
  if mode == "attention":
    args += ["--sentence=ta suda.", f"--output={tmp / 'attention.png'}"]
  return args


def train_in_process(workdir, dataset: str) -> None:
  """The tiny run trained by `main` in this process (a module fixture has no capsys)."""
  err = io.StringIO()
  with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
    main.FLAGS.unparse_flags()
    try:
      main._main_guarded(main._parse_flags(["t2t_jax.main"] +
                                           _args(workdir, "train", None, dataset)))
    except SystemExit as e:
      raise AssertionError(err.getvalue()[-3000:]) from e
    finally:
      main.FLAGS.unparse_flags()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A finished tiny run: checkpoints 10 and 20, their average, the dev split's BLEU."""
  root = tmp_path_factory.mktemp("damaged")
  workdir, dataset = root / "trained", _small_corpus(root)
  train_in_process(workdir, dataset)
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["10", "20"]
  assert (workdir / "averaged" / "averaged.json").exists() and (workdir / "eval").is_dir()
  return workdir, dataset


def _damage(workdir: Path, name: str, how: str) -> None:
  path = workdir / name
  if how == "deleted":
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    return
  # Truncated to half: a file, or every file of a folder (of checkpoints/, the newest).
  if name == "checkpoints":
    path = path / max((p.name for p in path.iterdir()), key=int)
  for f in [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]:
    os.truncate(f, f.stat().st_size // 2)


def _history(workdir: Path) -> tuple[set, list]:
  """(checkpoint steps, wherever they are kept; metrics lines, wherever they are kept)."""
  steps = {p.name for p in (workdir / "checkpoints").iterdir()} \
      if (workdir / "checkpoints").is_dir() else set()
  steps |= {p.name.split("_")[2].split(".")[0] for p in workdir.glob("corrupt_checkpoint_*")}
  lines = []
  for path in workdir.glob("metrics*"):  # live, superseded, or kept aside as damaged
    lines += [l for l in path.read_text(errors="replace").splitlines() if l.strip()]
  return steps, lines


def _snapshot(workdir: Path) -> dict:
  return {str(p.relative_to(workdir)): (p.stat().st_size, p.stat().st_mtime_ns)
          for p in workdir.rglob("*")}


def _assert_it_worked(mode: str, workdir: Path, tmp: Path, out: str) -> None:
  """What each mode makes when it works, beyond its exit code."""
  if mode == "train":  # finished (or resumed to the end), then evaluated as the end does
    assert (workdir / "checkpoints" / "20").is_dir() and "BLEU" in out, out[-2000:]
  elif mode == "eval":
    assert "BLEU" in out, out[-2000:]
  elif mode == "translate":
    assert len((tmp / "output.txt").read_text().splitlines()) == 1
  elif mode == "score":
    float((tmp / "output.txt").read_text().split()[0])
  elif mode == "export":
    assert (tmp / "hf" / "config.json").is_file()
  elif mode == "average":
    assert json.loads((workdir / "averaged" / "averaged.json").read_text())["steps"] == [10, 20]
  elif mode == "attention":
    assert (tmp / "attention.png").stat().st_size > 0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("how", ("deleted", "truncated"))
@pytest.mark.parametrize("name", FILES)
def test_a_damaged_workdir_file_works_or_is_one_line(trained, tmp_path, capsys, name, how, mode):
  trained, dataset = trained
  workdir = tmp_path / "run"
  shutil.copytree(trained, workdir)
  _damage(workdir, name, how)
  steps_before, lines_before = _history(workdir)
  record_before = (workdir / "experiment.json").read_bytes() \
      if (workdir / "experiment.json").exists() else None
  before = _snapshot(workdir)

  # In this process an uncaught exception would fail the test by itself; `run_main` returns
  # only for an exit, and an exit is either 0 or one `error:` line with code 2.
  code, out, err = run_main(_args(workdir, mode, tmp_path, dataset), capsys)

  expected = ERRORS.get((name, how, mode))
  if expected:
    errors = [l for l in err.splitlines() if l.startswith("error: ")]
    assert code == 2 and len(errors) == 1 and expected in errors[0], (code, err[-3000:])
    assert _snapshot(workdir) == before  # refused before any work: nothing moved
  else:
    assert code == 0, err[-3000:]
    _assert_it_worked(mode, workdir, tmp_path, out)
  # Nothing lost: every checkpoint (or its set-aside copy), every line of history, and a
  # damaged record itself, moved aside rather than overwritten.
  steps_after, lines_after = _history(workdir)
  assert steps_before <= steps_after
  assert all(l in lines_after for l in lines_before)
  if record_before is not None and mode == "train":
    kept = [p.read_bytes() for p in workdir.glob("experiment.json*")]
    assert record_before in kept


@pytest.mark.parametrize("mode", MODES)
def test_each_command_reads_the_workdirs_record_once(trained, tmp_path, capsys, monkeypatch,
                                                     mode):
  """experiment.json is asked for by the workdir check, the dtype, the vocabulary and the
  translator: it was parsed 5-7 times a command, each a download in a bucket."""
  from t2t_jax import storage
  trained, dataset = trained
  workdir = tmp_path / "run"
  shutil.copytree(trained, workdir)
  reads, read_text = [], storage.read_text

  def counted(path):
    if str(path).endswith(workdirs.RUN_INFO):
      reads.append(path)
    return read_text(path)

  monkeypatch.setattr(storage, "read_text", counted)
  workdirs._parsed_run_info.cache_clear()  # as a new command's process starts
  code, _, err = run_main(_args(workdir, mode, tmp_path, dataset), capsys)
  assert code == 0, err[-3000:]
  assert len(reads) == 1, reads


def test_eval_decodes_another_sources_test_set_beside_the_runs_own(trained, tmp_path,
                                                                    capsys):
  """`--test_data`: a run evaluated on another corpus's test set (newstest2015 for a run
  trained from tfds) without its data settings changing: the figures go to eval/<source>/,
  the run's own eval/ stays, and the record names the source, split and line count."""
  from t2t_jax import data_sources
  trained, dataset = trained
  workdir = tmp_path / "run"
  shutil.copytree(trained, workdir)
  own = {p.name: p.read_bytes() for p in (workdir / "eval").iterdir() if p.is_file()}
  other = tmp_path / "news"
  other.mkdir()
  src, tgt = data_sources.DEMO_SRC, data_sources.DEMO_TGT
  demo = Path(dataset.split(":")[1])
  for lang in (src, tgt):
    lines = (demo / f"test.{lang}").read_text(encoding="utf-8").splitlines()[:7]
    (other / f"newstest2015.{lang}").write_text("".join(l + "\n" for l in lines))
  args = [a for a in _args(workdir, "eval", tmp_path, dataset)]
  code, out, err = run_main(args + [f"--test_data=folder:{other}", "--splits=newstest2015"],
                            capsys)
  assert code == 0, err[-3000:]
  record = json.loads((workdir / "eval" / "folder_news" / "newstest2015.json").read_text())
  assert record["data"] == f"folder:.../news:{src}-{tgt}" and record["num_sentences"] == 7
  assert record["split"] == "newstest2015" and "BLEU" in out
  assert {p.name: p.read_bytes() for p in (workdir / "eval").iterdir() if p.is_file()} == own

  for extra, message in (([f"--test_data=folder:{other}"], "--test_data needs --splits"),
                         ([f"--test_data=folder:{other}:{tgt}-{src}", "--splits=newstest2015"],
                          f"the run translates {src}->{tgt}"),
                         ([f"--test_data=folder:{other}", "--splits=newstest2016"],
                          "newstest2016 is not a split of")):
    code, _, err = run_main(args + extra, capsys)
    errors = [l for l in err.splitlines() if l.startswith("error: ")]
    assert code == 2 and len(errors) == 1 and message in errors[0], (extra, err[-2000:])


def test_training_a_workdir_whose_record_is_gone_resumes_and_records_it_again(
    trained, tmp_path, capsys):
  """Issue 51: a workdir with checkpoints and no experiment.json (deleted, or copied
  without it) ended training in FileNotFoundError. Its checkpoints restore into the
  command's model, so it resumes and the record is written again, saying so; a command of
  another model is the one-line 'another model' error, with nothing moved."""
  trained, dataset = trained
  workdir = tmp_path / "run"
  shutil.copytree(trained, workdir)
  (workdir / "experiment.json").unlink()
  before = _snapshot(workdir)
  args = _args(workdir, "train", tmp_path, dataset) + ["--set", "model.d_ff=128"]
  code, _, err = run_main(args, capsys)
  assert code == 2
  assert "another" in [l for l in err.splitlines() if l.startswith("error: ")][0]
  assert _snapshot(workdir) == before

  code, out, err = run_main(_args(workdir, "train", tmp_path, dataset), capsys)
  assert code == 0, err[-3000:]
  assert "resuming from checkpoint 20" in out and "recorded there again" in err
  recorded = json.loads((workdir / "experiment.json").read_text())
  assert recorded["experiment"] == "demo" and recorded["config"]["model"]["d_ff"] == 64


def test_a_copied_workdir_still_decodes_with_its_average(trained, tmp_path, capsys):
  """The average's record named its checkpoints by inode, which a copy changes: a workdir
  copied elsewhere decoded with its newest checkpoint instead, under two warnings."""
  trained, dataset = trained
  workdir = tmp_path / "copy"
  shutil.copytree(trained, workdir)
  code, _, err = run_main(_args(workdir, "translate", tmp_path, dataset), capsys)
  assert code == 0, err[-3000:]
  assert "with average of checkpoints 10..20" in err and "warning" not in err
  _, label = checkpoints.load_params_for_inference(str(workdir), _cfg())
  assert label.startswith("average")


def _cfg():
  from t2t_jax import registry
  from t2t_jax.config import override
  return override(registry.get("demo"), SETS)


def test_a_run_trained_with_model_settings_is_decoded_without_repeating_them(
    trained, tmp_path, capsys):
  """The run was trained with `--set model.*` (the tiny model): evaluating, averaging and
  translating it take the recorded model when the command gives none (as they take the
  recorded data), and a command that gives another shape is refused in one line."""
  workdir = tmp_path / "run"
  shutil.copytree(trained[0], workdir)
  src = tmp_path / "input.txt"
  src.write_text("ta suda.\n")
  base = ["--experiment=demo", f"--workdir={workdir}", "--set=decode.beam_size=1",
          "--set=decode.max_extra_length=4"]
  for mode, extra in (("eval", ["--splits=valid"]), ("average", []),
                      ("translate", [f"--input={src}", f"--output={tmp_path / 'out.txt'}"])):
    code, out, err = run_main(base + [f"--mode={mode}"] + extra, capsys)
    assert code == 0, (mode, err[-3000:])
  assert len((tmp_path / "out.txt").read_text().splitlines()) == 1
  code, out, err = run_main(base + ["--mode=eval", "--set=model.d_ff=128"], capsys)
  assert code == 2 and "different model settings (model.d_ff" in err, err[-2000:]
  # how the model computes may still change: a bf16 decode of the float32 run
  code, out, err = run_main(base + ["--mode=eval", "--splits=valid",
                                    "--set=model.dtype=bfloat16"], capsys)
  assert code == 0 and "BLEU" in out, err[-3000:]
