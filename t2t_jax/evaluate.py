"""Inference modes: eval (BLEU on dev/test), translate (stdin -> stdout), attention (PNG).

All of them use the averaged checkpoint when one exists (paper section 6.1),
else the latest training checkpoint. eval and translate can also decode with an
ensemble of several workdirs' models (`--ensemble`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Any, Sequence, TextIO

from t2t_jax import bleu, checkpoints, decode, input_pipeline
from t2t_jax.config import ExperimentConfig, ModelConfig, evaluation_splits
from t2t_jax.errors import UserError


def _target_lang(cfg: ExperimentConfig, ds: Any) -> str:
  lang = getattr(ds, "tgt_lang", None) or cfg.data.dataset.rsplit("-", 1)[-1]
  return lang if lang.isalpha() and len(lang) <= 3 else "en"


def load_inference_params(cfg: ExperimentConfig, workdir: str) -> tuple[Any, str]:
  """Averaged parameters when present, else the latest checkpoint's."""
  found = checkpoints.load_params_for_inference(workdir, cfg)
  if found is None:
    raise UserError(f"no checkpoint in {os.path.join(workdir, 'checkpoints')}: train first with "
                    f"python -m t2t_jax.main --experiment={cfg.name} --workdir={workdir}")
  return found


def member_dirs(cfg: ExperimentConfig, workdir: str) -> list[str]:
  """The workdirs whose models decode as this run: its `ensemble.members` trained side by
  side in WORKDIR/member<i>/, or the workdir itself."""
  if cfg.ensemble.members > 1:
    return [os.path.join(workdir, f"member{i}") for i in range(cfg.ensemble.members)]
  return [workdir]


def load_ensemble(cfg: ExperimentConfig, dirs: Sequence[str]
                  ) -> tuple[list[Any], list[ModelConfig], str]:
  """Parameters and model configs of the runs in `dirs`, for one ensemble.

  Members may differ in shape (each keeps the model it was trained with) but must share
  the data settings, and hence the vocabulary, that `cfg` asks for. Every member is
  checked before any parameters load.
  """
  members = []
  for member in dirs:
    found = checkpoints.recorded_settings(member)
    if found is None:
      raise UserError(f"ensemble member {member} holds no trained run "
                      f"(no {checkpoints.RUN_INFO})")
    data, model_cfg = found[1]["data"], ModelConfig(**found[1]["model"])
    differ = [f"data.{k}" for k, v in dataclasses.asdict(cfg.data).items() if data.get(k) != v]
    if model_cfg.vocab_size != cfg.model.vocab_size:
      differ.append("model.vocab_size")
    if differ:
      raise UserError(f"ensemble member {member} was trained with other data or vocabulary "
                      f"settings ({', '.join(differ)}) than asked for; ensemble members must "
                      f"share one vocabulary")
    members.append((member, dataclasses.replace(cfg, model=model_cfg)))
  params, labels = [], []
  for member, member_cfg in members:
    member_params, label = load_inference_params(member_cfg, member)
    params.append(member_params)
    labels.append(f"{member}: {label}")
  return params, [c.model for _, c in members], "ensemble of " + "; ".join(labels)


def _translator(cfg: ExperimentConfig, params: Any, vocab: Any,
                model_cfgs: Sequence[ModelConfig] | None = None) -> decode.Translator:
  """One model, or an ensemble when `model_cfgs` lists each member's config."""
  max_len = min(c.max_len for c in model_cfgs or [cfg.model])
  return decode.Translator(params, model_cfgs or cfg.model, cfg.decode, vocab,
                           max_input_length=min(cfg.data.max_length, max_len))


def _load(cfg: ExperimentConfig, dirs: Sequence[str], vocab: Any
          ) -> tuple[decode.Translator, str]:
  if len(dirs) > 1:
    params, cfgs, label = load_ensemble(cfg, dirs)
    return _translator(cfg, params, vocab, cfgs), label
  params, label = load_inference_params(cfg, dirs[0])
  return _translator(cfg, params, vocab), label


def _models(cfg: ExperimentConfig, workdir: str, ensemble: Sequence[str]) -> list[str]:
  """This run's model(s), then the `--ensemble` workdirs."""
  return member_dirs(cfg, workdir) + [os.path.abspath(os.path.expanduser(d)) for d in ensemble]


def run_eval(cfg: ExperimentConfig, workdir: str, splits: list[str] | None = None,
             samples: int = 0, ds: Any = None, ensemble: Sequence[str] = ()) -> dict[str, dict]:
  """Decodes each split, writes WORKDIR/eval/<split>.hyp and .json, prints both BLEUs.

  A run of `ensemble.members` models decodes with all of them. With `ensemble` (other
  workdirs) the outputs go to WORKDIR/eval/ensemble/ instead, so this run's figures stay.
  """
  ds = ds or input_pipeline.load(cfg, num_devices=1)
  dirs = _models(cfg, workdir, ensemble)
  input_pipeline.check_vocab(dirs, ds.directory)
  translator, label = _load(cfg, dirs, ds.vocab)
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
    hyps = translator.translate(sources)
    seconds = time.time() - start
    score, signature = bleu.sacrebleu_score(hyps, refs)
    tok_score = bleu.tokenized_bleu(hyps, refs, lang)
    _write_atomic(os.path.join(out_dir, f"{split}.hyp"), "".join(h + "\n" for h in hyps))
    result = {"split": split, "sacrebleu": round(score, 2), "tokenized_bleu": round(tok_score, 2),
              "signature": signature, "checkpoint": label, "num_sentences": len(hyps),
              "beam_size": cfg.decode.beam_size, "alpha": cfg.decode.alpha,
              "min_length": cfg.decode.min_length, **_mbr_fields(cfg),
              "decode_seconds": round(seconds, 1),
              "sentences_per_sec": round(len(hyps) / max(seconds, 1e-9), 2)}
    if len(dirs) > 1:
      result["ensemble"] = dirs
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
  dirs = _models(cfg, workdir, ensemble)
  translator, label = _load(cfg, dirs, input_pipeline.load_vocab(cfg, dirs))
  print(f"translating {len(lines)} line(s) with {label}", file=sys.stderr, flush=True)
  hyps = translator.translate(lines)
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
  params, label = load_inference_params(cfg, workdir)
  vocab = input_pipeline.load_vocab(cfg, [workdir])
  translator = _translator(cfg, params, vocab)
  src = translator.encode([sentence])[0]
  hyp = translator.translate_ids([src])[0]
  path = output or os.path.join(workdir, "attention", f"layer{layer}.png")
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  title = f"{sentence}  ->  {vocab.decode(hyp)}   ({label})"
  attention_plot.plot(params, cfg.model, vocab, src, hyp + [EOS_ID], layer, path, title)
  print(f"translation: {vocab.decode(hyp)}")
  print(f"wrote {path}")
  return path
