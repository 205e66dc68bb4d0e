"""CPU translation side by side (`bench --what=deploy --experiment=E --workdir=W`): one trained
run, exported once (t2t_jax/export.py), translating the same sentences four ways in one
process: ours (cached beam search) in float32 and bf16, transformers' `generate` in float32
and bf16, CTranslate2 in float32 and in int8. Each prints sentences/s and sacreBLEU against
the references.

Every decoder gets beam 4, the same threads (`--threads`, default all cores) and the same
length limit (source tokens + 50). The length penalties differ by formula (ours is GNMT's,
the others divide by length^alpha, all with alpha = decode.alpha), so their BLEU may differ a
little. Each first translates the sentences once untimed (that compiles our search for each
batch shape and warms the others' caches), then `rounds` more times, timed; its figure is the
median. The decoders run one after the other, each library loaded only when its turn comes:
CTranslate2 brings its own OpenMP runtime, and with it loaded torch ran at half its speed.
"""

from __future__ import annotations

import functools
import os
import statistics
import tempfile
import time
from typing import Any, Callable

from t2t_jax.config import ExperimentConfig


def _bleu(hyps: list[str], refs: list[str]) -> float:
  import sacrebleu
  return round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)

# Idle time before each timed pass, so that no thread of the pass before still spins on a core
# (OpenMP threads spin-wait for a while after their last operation).
PAUSE_S = 1.0


def run(cfg: ExperimentConfig, workdir: str, split: str, limit: int, threads: int,
        batch: int = 32, rounds: int = 5) -> list[dict[str, Any]]:
  """One record per decoder: sentences/s, target tokens/s of its output and BLEU."""
  from t2t_jax import export, input_pipeline
  from t2t_jax.config import override
  from t2t_jax.translator import Translator
  sources, refs = input_pipeline.load(cfg, num_devices=1).raw(split)
  sources, refs = sources[:limit], refs[:limit]
  out_dir = os.path.join(tempfile.mkdtemp(prefix="t2t_jax_deploy_"), "marian")
  export.export_huggingface(cfg, workdir, out_dir)
  beam, alpha = cfg.decode.beam_size, cfg.decode.alpha
  records: list[dict[str, Any]] = []

  def timed(name: str, fn: Callable[[list[str]], list[str]], **extra: Any) -> None:
    hyps = fn(sources)  # compilation, caches
    seconds = []
    for _ in range(rounds):
      time.sleep(PAUSE_S)
      start = time.perf_counter()
      fn(sources)
      seconds.append(time.perf_counter() - start)
    t = statistics.median(seconds)
    records.append({
        "what": "deploy", "decoder": name, "sentences": len(sources), "seconds": round(t, 3),
        "sentences_per_sec": round(len(sources) / t, 2),
        "sentences_per_sec_rounds": [round(len(sources) / x, 1) for x in seconds],
        "output_words_per_sec": round(sum(len(h.split()) for h in hyps) / t, 1),
        "sacrebleu": _bleu(hyps, refs), "beam_size": beam, "threads": threads, **extra})

  for dtype in ("float32", "bfloat16"):  # bf16: `--set model.dtype=bfloat16` at decode
    ours = Translator.from_config(override(cfg, {"model.dtype": dtype}), workdir)
    timed(f"t2t_jax {dtype} (cached beam search, XLA:CPU)", ours.translate, label=ours.label)

  import sentencepiece as spm
  sp = spm.SentencePieceProcessor(model_file=os.path.join(out_dir, "source.spm"))
  tokens = [sp.encode(s, out_type=str) + ["</s>"] for s in sources]

  import torch
  from transformers import MarianMTModel, MarianTokenizer
  torch.set_num_threads(threads)
  tokenizer = MarianTokenizer.from_pretrained(out_dir)

  def hf_translate(hf: Any, sentences: list[str]) -> list[str]:
    order = sorted(range(len(sentences)), key=lambda i: len(tokens[i]))
    texts: dict[int, str] = {}
    for start in range(0, len(order), batch):
      rows = order[start:start + batch]
      enc = tokenizer([sentences[i] for i in rows], return_tensors="pt", padding=True)
      with torch.inference_mode():
        gen = hf.generate(**enc, num_beams=beam, length_penalty=alpha,
                          max_new_tokens=enc["input_ids"].shape[1] - 1 + 50 + 1)
      for i, text in zip(rows, tokenizer.batch_decode(gen, skip_special_tokens=True)):
        texts[i] = text
    return [texts[i] for i in range(len(sentences))]
  for dtype in (torch.float32, torch.bfloat16):
    hf = MarianMTModel.from_pretrained(out_dir, dtype=dtype).eval()
    timed(f"transformers {__import__('transformers').__version__} generate (torch "
          f"{torch.__version__}, {str(dtype).split('.')[-1]})", functools.partial(hf_translate, hf))

  import ctranslate2
  from ctranslate2.converters import TransformersConverter
  for quantization in ("float32", "int8"):
    ct2_dir = os.path.join(os.path.dirname(out_dir), f"ct2_{quantization}")
    TransformersConverter(out_dir).convert(ct2_dir, quantization=quantization)
    translator = ctranslate2.Translator(ct2_dir, device="cpu", inter_threads=1,
                                        intra_threads=threads)

    def ct2_translate(translator: Any, sentences: list[str]) -> list[str]:
      results = translator.translate_batch(
          tokens, beam_size=beam, length_penalty=alpha, max_batch_size=batch,
          max_decoding_length=max(map(len, tokens)) - 1 + 50)
      return [sp.decode(r.hypotheses[0]) for r in results]
    timed(f"CTranslate2 {ctranslate2.__version__} {quantization}",
          functools.partial(ct2_translate, translator))

  base = records[0]["sentences_per_sec"]
  for r in records:
    r["ours_over_this"] = round(base / r["sentences_per_sec"], 3)
  return records
