"""Inference modes: eval (BLEU on dev/test), translate (stdin -> stdout), attention (PNG).

All of them decode with the models `translator` loads: the averaged checkpoint when one
exists (paper section 6.1), else the latest training checkpoint; eval and translate can also
decode with an ensemble of several workdirs' models (`--ensemble`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Sequence, TextIO

from t2t_jax import bleu, input_pipeline, translator
from t2t_jax.config import ExperimentConfig, evaluation_splits
from t2t_jax.errors import UserError


def _target_lang(cfg: ExperimentConfig, ds: Any) -> str:
  lang = getattr(ds, "tgt_lang", None) or cfg.data.dataset.rsplit("-", 1)[-1]
  return lang if lang.isalpha() and len(lang) <= 3 else "en"


def run_eval(cfg: ExperimentConfig, workdir: str, splits: list[str] | None = None,
             samples: int = 0, ds: Any = None, ensemble: Sequence[str] = ()) -> dict[str, dict]:
  """Decodes each split, writes WORKDIR/eval/<split>.hyp and .json, prints both BLEUs.

  A run of `ensemble.members` models decodes with all of them. With `ensemble` (other
  workdirs) the outputs go to WORKDIR/eval/ensemble/ instead, so this run's figures stay.
  """
  ds = ds or input_pipeline.load(cfg, num_devices=1)
  dirs = translator.model_dirs(cfg, workdir, ensemble)
  input_pipeline.check_vocab(dirs, ds.directory)
  decoder, label = translator.load_decoder(cfg, dirs, ds.vocab)
  out_dir = os.path.join(workdir, "eval", "ensemble" if ensemble else "")
  os.makedirs(out_dir, exist_ok=True)
  lang = _target_lang(cfg, ds)
  results = {}
  for split in splits or evaluation_splits(cfg):
    sources, refs = ds.raw(split)
    start = time.time()
    mbr_note = f", MBR temperature {cfg.decode.mbr_temperature}" if cfg.decode.mbr else ""
    print(f"decoding {split}: {len(sources)} sentences (beam {cfg.decode.beam_size}, "
          f"alpha {cfg.decode.alpha}{mbr_note}) with {label}", flush=True)
    hyps = decoder.translate(sources)
    seconds = time.time() - start
    score, signature = bleu.sacrebleu_score(hyps, refs)
    tok_score = bleu.tokenized_bleu(hyps, refs, lang)
    _write_atomic(os.path.join(out_dir, f"{split}.hyp"), "".join(h + "\n" for h in hyps))
    result = {"split": split, "sacrebleu": round(score, 2), "tokenized_bleu": round(tok_score, 2),
              "signature": signature, "checkpoint": _portable(label, workdir),
              "num_sentences": len(hyps),
              "beam_size": cfg.decode.beam_size, "alpha": cfg.decode.alpha,
              "min_length": cfg.decode.min_length, **_mbr_fields(cfg),
              "decode_seconds": round(seconds, 1),
              "sentences_per_sec": round(len(hyps) / max(seconds, 1e-9), 2)}
    if len(dirs) > 1:
      result["ensemble"] = [_portable(d, workdir) for d in dirs]
    _write_atomic(os.path.join(out_dir, f"{split}.json"), json.dumps(result, indent=2) + "\n")
    print(f"{split}: sacreBLEU {score:.2f} ({signature})  tokenized BLEU {tok_score:.2f}  "
          f"[{len(hyps)} sentences, {seconds:.0f}s]", flush=True)
    for src, hyp, ref in list(zip(sources, hyps, refs))[:samples]:
      print(f"  source:    {src}\n  output:    {hyp}\n  reference: {ref}")
    results[split] = result
  return results


def _mbr_fields(cfg: ExperimentConfig) -> dict[str, Any]:
  if not cfg.decode.mbr:
    return {}
  return {"mbr": True, "mbr_temperature": cfg.decode.mbr_temperature}


def _portable(text: str, workdir: str) -> str:
  """`text` with the workdir's absolute path written as WORKDIR, so that a result file
  names no machine's folders."""
  return text.replace(os.path.abspath(workdir), "WORKDIR")


def _write_atomic(path: str, text: str) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    f.write(text)
  os.replace(tmp, path)


def read_lines(stream: Any, name: str) -> list[str]:
  """UTF-8 lines without their newlines; invalid UTF-8 is an error naming the line."""
  lines = []
  for number, raw in enumerate(stream, start=1):
    try:
      lines.append(raw.decode("utf-8").rstrip("\r\n"))
    except UnicodeDecodeError as e:
      raise UserError(f"{name} line {number}: invalid UTF-8 ({e.reason} at byte {e.start})") \
          from None
  return lines


def run_translate(cfg: ExperimentConfig, workdir: str, input_path: str | None,
                  output_path: str | None, ensemble: Sequence[str] = ()) -> None:
  """One translation per input line; empty lines stay empty so outputs stay aligned."""
  if input_path:
    if not os.path.exists(input_path):
      raise UserError(f"--input file not found: {input_path}")
    with open(input_path, "rb") as f:
      lines = read_lines(f, input_path)
  else:
    lines = read_lines(sys.stdin.buffer, "stdin")
  tr = translator.Translator.from_config(cfg, workdir, ensemble)
  print(f"translating {len(lines)} line(s) with {tr.label}", file=sys.stderr, flush=True)
  hyps = tr.translate(lines)
  text = "".join(h + "\n" for h in hyps)
  if output_path:
    _write_atomic(output_path, text)
  else:
    out: TextIO = sys.stdout
    out.write(text)
    out.flush()


def run_attention(cfg: ExperimentConfig, workdir: str, sentence: str | None, layer: int,
                  output: str | None) -> str:
  """Translates `sentence` and draws every head's attention for that pair."""
  if cfg.ensemble.members > 1:
    raise UserError(f"--mode=attention draws one model; this run has {cfg.ensemble.members} "
                     f"members: give --workdir={os.path.join(workdir, 'member0')} and "
                     f"--set ensemble.members=1")
  from t2t_jax import attention_plot
  from t2t_jax.special_tokens import EOS_ID
  if not sentence or not sentence.strip():
    raise UserError("--mode=attention needs --sentence=\"...\"")
  params, label = translator.load_inference_params(cfg, workdir)
  vocab = input_pipeline.load_vocab(cfg, [workdir])
  decoder = translator.beam_decoder(cfg, params, vocab)
  src = decoder.encode([sentence])[0]
  hyp = decoder.translate_ids([src])[0]
  path = output or os.path.join(workdir, "attention", f"layer{layer}.png")
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  title = f"{sentence}  ->  {vocab.decode(hyp)}   ({label})"
  attention_plot.plot(params, cfg.model, vocab, src, hyp + [EOS_ID], layer, path, title)
  print(f"translation: {vocab.decode(hyp)}")
  print(f"wrote {path}")
  return path
