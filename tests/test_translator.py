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
