"""Export to Hugging Face MarianMT and CTranslate2 against the exported model itself: the
same token ids, float32 logits within 1e-4, identical greedy translations."""

import json
import math
import subprocess
import sys

import jax
import numpy as np
import pytest

from t2t_jax import export, model, registry
from t2t_jax.config import override
from t2t_jax.errors import UserError

from helpers import FAST_DATA, REPO, main_command, set_flags, tiny_cfg

# A small demo model trained long enough to end its sentences (greedy outputs that all ran
# to the length limit would test the limit, not the model).
SETS = {**FAST_DATA, "model.num_layers": 1, "model.dropout": 0.0, "train.steps": 200,
        "train.final_eval": False, "train.checkpoint_every_steps": 1000,
        "train.log_every_steps": 100}


def test_the_axis_order_puts_our_sinusoid_in_marians_layout():
  """Marian's table (transformers' MarianSinusoidalPositionalEmbedding, written out here from
  its definition): sin of every frequency in the first half, cos in the second."""
  length, d = 7, 8
  pos = np.arange(length)[:, None]
  freq = 1.0 / 10000 ** (2 * np.arange(d // 2) / d)
  marian = np.concatenate([np.sin(pos * freq), np.cos(pos * freq)], axis=1)
  ours = np.asarray(model.sinusoidal_positions(length, d))
  np.testing.assert_allclose(ours[:, export.model_axis_order(d)], marian, atol=1e-6)


def test_models_marian_cannot_hold_are_refused():
  with pytest.raises(UserError, match="learned positions"):
    export.check_exportable(tiny_cfg(**{"model.positional": "learned"}))
  with pytest.raises(UserError, match="d_k=8"):
    export.check_exportable(tiny_cfg(**{"model.d_k": 8, "model.d_v": 8}))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  """(workdir, export folder, config) of a trained small demo run, exported by the command."""
  root = tmp_path_factory.mktemp("export")
  workdir, out = root / "run", root / "marian"
  subprocess.run(main_command(workdir, sets=SETS), check=True, capture_output=True, cwd=REPO)
  r = subprocess.run(main_command(workdir, mode="export", sets=SETS) + [f"--output={out}"],
                     capture_output=True, text=True, cwd=REPO)
  assert r.returncode == 0 and "exported checkpoint 200" in r.stdout, r.stderr[-2000:]
  again = subprocess.run(main_command(workdir, mode="export", sets=SETS) + [f"--output={out}"],
                         capture_output=True, text=True, cwd=REPO)
  assert again.returncode == 2 and "is not empty" in again.stderr  # never overwritten
  return workdir, out, override(registry.get("demo"), SETS)


def _test_split(cfg):
  from t2t_jax import input_pipeline
  src, _ = input_pipeline.load(cfg, num_devices=1).raw(cfg.data.test_split)
  return src


def _same_or_a_near_tie(workdir, cfg, sentence, theirs, mine, tol=1e-3):
  """Whether two greedy translations are the same or part first where our model scores the
  two tokens within `tol` nats: implementations whose logits agree to ~1e-4 may break such a
  tie either way (a tie that a differently trained demo model meets on 1 of 500 sentences)."""
  if theirs == mine:
    return True
  from t2t_jax import checkpoints
  from t2t_jax.special_tokens import EOS_ID
  from t2t_jax.vocab import Vocabulary
  vocab = Vocabulary(str(workdir / "spm.model"))
  a, b = vocab.encode(theirs) + [EOS_ID], vocab.encode(mine) + [EOS_ID]
  k = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
  params, _ = checkpoints.load_params_for_inference(str(workdir), cfg)
  src = np.array([vocab.encode(sentence) + [EOS_ID]], np.int32)
  logits = model.Transformer(cfg.model).apply({"params": params}, src,
                                              np.array([a[:k + 1]], np.int32))[0, k]
  logp = np.asarray(jax.nn.log_softmax(logits))
  return abs(float(logp[a[k]] - logp[b[k]])) < tol


def _ours_greedy(workdir, sentences):
  from t2t_jax.translator import Translator
  return Translator.from_workdir(str(workdir), beam_size=1, alpha=0.0).translate(sentences)


@pytest.mark.extra("hf", "torch", "transformers")
def test_transformers_loads_the_export_and_computes_our_logits_and_translations(exported):
  import torch
  from transformers import MarianMTModel, MarianTokenizer
  from t2t_jax import checkpoints
  from t2t_jax.vocab import Vocabulary
  workdir, out, cfg = exported
  sentences = _test_split(cfg)
  tokenizer = MarianTokenizer.from_pretrained(str(out))
  hf = MarianMTModel.from_pretrained(str(out)).eval()
  vocab = Vocabulary(str(workdir / "spm.model"))
  ids = [vocab.encode(s) + [1] for s in sentences]
  assert [tokenizer(s)["input_ids"] for s in sentences] == ids

  # Float32 logits, teacher-forced on the references, at every real target position.
  params, _ = checkpoints.load_params_for_inference(str(workdir), cfg)
  _, refs = __import__("t2t_jax.input_pipeline", fromlist=["x"]).load(
      cfg, num_devices=1).raw(cfg.data.test_split)
  tgt_ids = [vocab.encode(r)[:30] + [1] for r in refs]
  width, tw = max(map(len, ids)), max(map(len, tgt_ids))
  src = np.zeros((len(ids), width), np.int64)
  tgt = np.zeros((len(ids), tw), np.int64)
  for i, (a, b) in enumerate(zip(ids, tgt_ids)):
    src[i, :len(a)], tgt[i, :len(b)] = a, b
  ours = np.asarray(model.Transformer(cfg.model).apply({"params": params}, src.astype(np.int32),
                                                       tgt.astype(np.int32)))
  start = hf.config.decoder_start_token_id
  assert start == cfg.model.vocab_size  # the appended zero row (see t2t_jax/export.py)
  decoder_inputs = np.concatenate([np.full((len(ids), 1), start), tgt[:, :-1]], axis=1)
  with torch.no_grad():
    theirs = hf(input_ids=torch.tensor(src), attention_mask=torch.tensor(src != 0),
                decoder_input_ids=torch.tensor(decoder_inputs)).logits.numpy()
  theirs = theirs[..., :cfg.model.vocab_size]
  real = tgt != 0
  assert np.abs(theirs - ours)[real].max() < 1e-4

  # Greedy search, each sentence with our length limit (its tokens + 50, then EOS).
  mine = _ours_greedy(workdir, sentences)
  ended = differ = 0
  for n in sorted({len(x) for x in ids}):
    rows = [i for i, x in enumerate(ids) if len(x) == n]
    with torch.no_grad():
      gen = hf.generate(input_ids=torch.tensor([ids[i] for i in rows]), num_beams=1,
                        do_sample=False, max_new_tokens=n - 1 + 50 + 1, min_new_tokens=1)
    for i, text in zip(rows, tokenizer.batch_decode(gen, skip_special_tokens=True)):
      assert _same_or_a_near_tie(workdir, cfg, sentences[i], text, mine[i]), (
          sentences[i], text, mine[i])
      differ += text != mine[i]
      ended += len(text.split()) < n + 40
  assert differ <= 0.01 * len(sentences)
  assert ended > 0.9 * len(sentences)  # the model ends its sentences


@pytest.mark.extra("hf", "ctranslate2", "transformers", "torch")
def test_ctranslate2_converts_the_export_and_translates_in_float32_and_int8(exported,
                                                                            tmp_path):
  """float32: greedy search gives our translations, and teacher-forced log-probabilities are
  ours. int8: its log-probabilities of our translations stay within 0.1 nats per token of
  float32's (measured: 0.004 on a Xeon, under every CT2_FORCE_CPU_ISA). Its greedy BLEU
  against ours is not checked: how far a greedy search drifts after one flipped token
  depends on the trained model and the CPU (94 on a Xeon, 70.8 on an AMD EPYC)."""
  import ctranslate2
  import sentencepiece as spm
  from t2t_jax.translator import Translator
  workdir, out, cfg = exported
  sentences = _test_split(cfg)
  mine = _ours_greedy(workdir, sentences)
  sp = spm.SentencePieceProcessor(model_file=str(out / "source.spm"))
  tokens = [sp.encode(s, out_type=str) + ["</s>"] for s in sentences]
  targets = [sp.encode(t, out_type=str) for t in mine]
  # Sentences within our input limit, which ours truncates and CTranslate2 does not.
  fits = np.array([len(s) <= cfg.data.max_length and len(t) < cfg.data.max_length
                   for s, t in zip(tokens, targets)])
  ours = np.array([per_token for _, per_token in
                   Translator.from_workdir(str(workdir)).score(list(zip(sentences, mine)))])
  logp = {}
  for quantization in ("float32", "int8"):
    ct2_dir = tmp_path / quantization
    r = subprocess.run(["ct2-transformers-converter", "--model", str(out), "--output_dir",
                        str(ct2_dir), "--quantization", quantization],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    translator = ctranslate2.Translator(str(ct2_dir), device="cpu")
    logp[quantization] = np.array([np.mean(s.log_probs)
                                   for s in translator.score_batch(tokens, targets)])
    if quantization == "float32":
      texts = [""] * len(tokens)
      for n in sorted({len(t) for t in tokens}):  # our length limit: the source's tokens + 50
        rows = [i for i, t in enumerate(tokens) if len(t) == n]
        results = translator.translate_batch([tokens[i] for i in rows], beam_size=1,
                                             max_decoding_length=n - 1 + 50)
        for i, r in zip(rows, results):
          texts[i] = sp.decode(r.hypotheses[0])
      parted = [(s, a, b) for s, a, b in zip(sentences, texts, mine) if a != b]
      assert len(parted) <= 0.01 * len(sentences), parted[:3]
      assert all(_same_or_a_near_tie(workdir, cfg, *p) for p in parted), parted
  assert fits.mean() > 0.8
  assert np.abs(logp["float32"] - ours)[fits].max() < 1e-3
  assert np.abs(logp["int8"] - logp["float32"])[fits].mean() < 0.1
