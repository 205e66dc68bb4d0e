"""The Python API: a trained workdir translates from Python as `--mode=translate` does."""

import subprocess

import pytest

from helpers import FAST_DATA, REPO, TINY_MODEL, main_command, tiny_cfg
from t2t_jax import Translator, train
from t2t_jax.errors import UserError

SETS = {**FAST_DATA, "train.steps": 20, "train.checkpoint_every_steps": 20,
        "train.log_every_steps": 10, "train.eval_every_steps": 1000, "train.final_eval": False,
        "train.tokens_per_step": 512, "train.max_tokens_per_batch": 512}
SENTENCES = ["u pepe tedini popus gasave ta suda.", "", "ta suda."]


def test_translator_from_a_workdir_is_what_the_command_line_translates(tmp_path):
  train.train_and_evaluate(tiny_cfg(**SETS), str(tmp_path))
  tr = Translator.from_workdir(str(tmp_path))
  out = tr.translate(SENTENCES)
  assert len(out) == 3 and out[1] == "" and out[0]
  assert tr.translate(SENTENCES[0]) == out[0]  # one string in, one string out

  nbest = tr.translate_nbest(SENTENCES)
  beam = tr.cfg.decode.beam_size
  assert [len(n) for n in nbest] == [beam, 1, beam]
  scores = [score for _, score in nbest[0]]
  assert scores == sorted(scores, reverse=True)
  assert nbest[0][0][0] == out[0]  # without MBR, the best hypothesis is the translation
  assert tr.translate_nbest(SENTENCES[0]) == nbest[:1]  # one string is one sentence

  greedy = Translator.from_workdir(str(tmp_path), beam_size=1)
  assert [len(n) for n in greedy.translate_nbest(SENTENCES)] == [1, 1, 1]
  with pytest.raises(TypeError, match="beam_size"):
    Translator.from_workdir(str(tmp_path), beam=2)

  cmd = main_command(tmp_path, "translate", sets={**TINY_MODEL, "model.dropout": 0.0, **SETS})
  r = subprocess.run(cmd, cwd=REPO, input="\n".join(SENTENCES) + "\n", capture_output=True,
                     text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  assert r.stdout.splitlines() == out


def test_a_folder_without_a_trained_run_is_a_clear_error(tmp_path):
  with pytest.raises(UserError, match="no trained run"):
    Translator.from_workdir(str(tmp_path))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("trained")
  train.train_and_evaluate(tiny_cfg(**SETS), str(workdir))
  return workdir


def _cmd(workdir, mode, *flags):
  return main_command(workdir, mode, sets={**TINY_MODEL, "model.dropout": 0.0, **SETS}) + \
      list(flags)


def test_translate_on_a_terminal_answers_each_line_as_it_is_entered(trained):
  """A person typing: the translation of the first line arrives while the input is still
  open (before end-of-file), as fairseq-interactive does."""
  import os
  import pty
  import select
  controller, terminal = pty.openpty()
  proc = subprocess.Popen(_cmd(trained, "translate"), cwd=REPO, stdin=terminal,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
  os.close(terminal)
  try:
    os.write(controller, (SENTENCES[0] + "\n").encode())
    ready, _, _ = select.select([proc.stdout], [], [], 240)
    assert ready, "no translation before end of input"
    first = proc.stdout.readline().decode().rstrip("\n")
    assert first == Translator.from_workdir(str(trained)).translate(SENTENCES[0])
    os.write(controller, b"\x04")  # Ctrl-D: end of input
    assert proc.wait(timeout=60) == 0
  finally:
    proc.kill()
    os.close(controller)


@pytest.mark.long
def test_nbest_lines_and_pair_scores_agree_with_the_model(trained, tmp_path):
  """--nbest=K prints K `INDEX<TAB>SCORE<TAB>TRANSLATION` lines per input, best first, the
  first the plain translation. --mode=score gives log p(target | source) as one teacher-forced
  forward pass computes it (EOS included), and its mean per token."""
  import jax
  import numpy as np
  from t2t_jax import checkpoints, model
  from t2t_jax.vocab import Vocabulary
  text = "\n".join(SENTENCES) + "\n"
  r = subprocess.run(_cmd(trained, "translate", "--nbest=3"), cwd=REPO, input=text,
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  rows = [line.split("\t") for line in r.stdout.splitlines()]
  assert [int(i) for i, _, _ in rows] == [0, 0, 0, 1, 2, 2, 2]
  assert rows[3] == ["1", "0.000000", ""]  # an empty line: one empty hypothesis
  first = [float(s) for i, s, _ in rows if i == "0"]
  assert first == sorted(first, reverse=True)
  best = Translator.from_workdir(str(trained)).translate(SENTENCES)
  assert [rows[0][2], rows[4][2]] == [best[0], best[2]]

  good, bad = "un pupuzaa tedina.", "la la la la la la"
  pairs = tmp_path / "pairs.tsv"
  pairs.write_text(f"{SENTENCES[0]}\t{good}\n\n{SENTENCES[0]}\t{bad}\n", encoding="utf-8")
  r = subprocess.run(_cmd(trained, "score", f"--input={pairs}"), cwd=REPO,
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  lines = r.stdout.split("\n")
  assert lines[1] == ""  # an empty line stays an empty line
  cfg = tiny_cfg(**SETS)
  params, _ = checkpoints.load_params_for_inference(str(trained), cfg)
  vocab = Vocabulary(str(trained / "spm.model"))
  for line, target in ((lines[0], good), (lines[2], bad)):
    src = np.array([vocab.encode(SENTENCES[0]) + [1]], np.int32)
    tgt = np.array([vocab.encode(target) + [1]], np.int32)
    logp = jax.nn.log_softmax(model.Transformer(cfg.model).apply({"params": params}, src, tgt))
    expected = float(sum(logp[0, t, tok] for t, tok in enumerate(tgt[0])))
    total, per_token = map(float, line.split("\t"))
    assert total == pytest.approx(expected, abs=1e-3)
    assert per_token == pytest.approx(expected / tgt.shape[1], abs=1e-4)


def test_bad_input_lines_have_a_defined_outcome(trained, tmp_path):
  """Invalid UTF-8 is translated with U+FFFD and a warning naming the line; a line beyond the
  model's length is truncated with a warning; a score line without a tab is a one-line
  error; an --output whose folder is missing fails before the model loads."""
  source = tmp_path / "in.txt"
  source.write_bytes(b"ta suda.\n\xff\xfe ta\n" + ("ta " * 200).encode() + b"\n")
  out = tmp_path / "out.txt"
  r = subprocess.run(_cmd(trained, "translate", f"--input={source}", f"--output={out}"),
                     cwd=REPO, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  assert "line 2: invalid UTF-8" in r.stderr and "truncated" in r.stderr
  assert len(out.read_text(encoding="utf-8").splitlines()) == 3
  r = subprocess.run(_cmd(trained, "score", f"--input={source}"), cwd=REPO,
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 2 and "line 1: expected SOURCE<TAB>TARGET" in r.stderr
  r = subprocess.run(_cmd(trained, "translate", f"--input={source}",
                          f"--output={tmp_path / 'missing' / 'out.txt'}"), cwd=REPO,
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 2 and "no such folder" in r.stderr


def test_nbest_lists_each_translation_once_with_its_better_score():
  """Issue 51: two segmentations of one text ("ab" as one piece, and as "a" + "b") are two
  hypotheses of the search but one translation; --nbest listed it twice."""
  pieces = {5: "ab", 6: "a", 7: "b", 8: "c"}

  class Vocab:
    def decode(self, ids):
      return "".join(pieces[i] for i in ids)

  class Decoder:
    vocab = Vocab()

    def encode(self, sentences):
      return [[1] for _ in sentences]

    def nbest_ids(self, sources):
      return [[([5], -1.0), ([8], -1.2), ([6, 7], -1.5), ([], float("-inf"))]
              for _ in sources]

  tr = Translator(Decoder(), tiny_cfg(), "test")
  assert tr.translate_nbest(["x", ""]) == [[("ab", -1.0), ("c", -1.2), ("", float("-inf"))],
                                           [("", 0.0)]]


def test_a_long_decode_reports_sentences_per_second_and_the_time_left(trained, capsys):
  """`--mode=eval`, translate and the final evaluation decoded for minutes without a line."""
  from t2t_jax import inference
  tr = Translator.from_workdir(str(trained), batch_tokens=8)  # a batch of 8 tokens a device
  calls = []
  tr.decoder.progress = lambda *args: calls.append(args)
  sentences = [f"ta suda {'popus ' * (k % 6)}." for k in range(24)]
  tr.translate(sentences)
  assert calls[0] == (0, 24, 0.0) and calls[-1][:2] == (24, 24) and len(calls) > 2
  assert [c[0] for c in calls] == sorted(c[0] for c in calls)
  assert calls[-1][2] == pytest.approx(1.0)
  tr.decoder.progress = inference.DecodeProgress("decoding test", every_sec=0)
  tr.translate(sentences)
  lines = capsys.readouterr().err.splitlines()
  assert lines and all(l.startswith("decoding test: ") and " sentences/s, about " in l and
                       l.endswith(" left") for l in lines), lines
