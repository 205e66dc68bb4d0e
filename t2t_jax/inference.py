"""The command's inference modes: eval (BLEU on dev/test), translate (stdin -> stdout),
score (log-probabilities of given pairs), attention (PNG).

All of them decode with the models `translator` loads: the averaged checkpoint when one
exists (paper section 6.1), else the latest training checkpoint; eval and translate can also
decode with an ensemble of several workdirs' models (`--ensemble`).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import sys
import time
from typing import Any, Iterator, Sequence

from t2t_jax import data_sources, input_pipeline, storage, tasks, translator
from t2t_jax.config import ExperimentConfig, evaluation_splits
from t2t_jax.errors import UserError


def _target_lang(cfg: ExperimentConfig, ds: Any) -> str:
  lang = getattr(ds, "tgt_lang", None) or cfg.data.dataset.rsplit("-", 1)[-1]
  return lang if lang.isalpha() and len(lang) <= 3 else "en"


def run_eval(cfg: ExperimentConfig, workdir: str, splits: list[str] | None = None,
             samples: int = 0, ds: Any = None, ensemble: Sequence[str] = (),
             test_data: ExperimentConfig | None = None) -> dict[str, dict]:
  """Decodes each split, writes WORKDIR/eval/<split>.hyp and .json, prints its figures: both
  BLEUs for translation; for a parser EVALB's (COLLINS.prm), with the predicted trees in
  <split>.trees and the gold ones in <split>.gold, ready for a user's own EVALB run.

  A run of `ensemble.members` models decodes with all of them. With `ensemble` (other
  workdirs) the outputs go to WORKDIR/eval/ensemble/ instead, so this run's figures stay.
  `test_data` (the run's config with another `data.dataset`): `splits` are that source's,
  their outputs in WORKDIR/eval/<its name>/. Each record names its data source and split.
  """
  ds = ds or input_pipeline.load(cfg, num_devices=1)
  dirs = translator.model_dirs(cfg, workdir, ensemble)
  input_pipeline.check_vocab(dirs, ds.directory)
  decoder, label = translator.load_decoder(cfg, dirs, ds.vocab)
  out_dir = os.path.join(workdir, "eval", "ensemble" if ensemble else "",
                         input_pipeline.source_label(test_data) if test_data else "")
  data = input_pipeline.source_description(test_data or cfg)
  storage.makedirs(out_dir)
  lang = _target_lang(cfg, ds)
  task = tasks.for_config(cfg)
  results = {}
  for split in splits or evaluation_splits(cfg):
    sources, refs = (input_pipeline.held_out_text(test_data, split) if test_data
                     else ds.raw(split))
    start = time.time()
    mbr_note = f", MBR temperature {cfg.decode.mbr_temperature}" if cfg.decode.mbr else ""
    print(f"decoding {split} of {data}: {len(sources)} sentences (beam "
          f"{cfg.decode.beam_size}, alpha {cfg.decode.alpha}{mbr_note}) with {label}",
          flush=True)
    decoder.progress = DecodeProgress(f"decoding {split}")
    hyps = decoder.translate(sources)
    seconds = time.time() - start
    figures = task.score(sources, hyps, refs, lang)
    storage.write_atomic(os.path.join(out_dir, f"{split}.hyp"),
                         "".join(h + "\n" for h in hyps))
    for name in ("trees", "gold"):  # a parser's trees, one per line
      if f"_{name}" in figures:
        storage.write_atomic(os.path.join(out_dir, f"{split}.{name}"),
                             "".join(t + "\n" for t in figures.pop(f"_{name}")))
    result = {"split": split, "data": data, "task": task.name, **figures,
              "checkpoint": _portable(label, workdir), "dtype": cfg.model.dtype,
              "num_sentences": len(hyps),
              **({"test_set": note} if (note := data_sources.test_set_note(
                  (test_data or cfg).data.dataset, split, len(hyps))) else {}),
              "beam_size": cfg.decode.beam_size, "alpha": cfg.decode.alpha,
              "max_extra_length": cfg.decode.max_extra_length,
              **({"constrained": cfg.decode.constrained} if task.name == "parsing" else {}),
              "min_length": cfg.decode.min_length, **_mbr_fields(cfg),
              "decode_seconds": round(seconds, 1),
              "sentences_per_sec": round(len(hyps) / max(seconds, 1e-9), 2)}
    if len(dirs) > 1:
      result["ensemble"] = [_portable(d, workdir) for d in dirs]
    storage.write_atomic(os.path.join(out_dir, f"{split}.json"),
                         json.dumps(result, indent=2) + "\n")
    print(f"{split}: {task.summary(result)}  [{len(hyps)} sentences, {seconds:.0f}s, "
          f"{result['sentences_per_sec']} sentences/s]", flush=True)
    for src, hyp, ref in list(zip(sources, hyps, refs))[:samples]:
      print(f"  source:    {src}\n  output:    {task.output(src, hyp)}\n  reference: {ref}")
    results[split] = result
  return results


def _mbr_fields(cfg: ExperimentConfig) -> dict[str, Any]:
  if not cfg.decode.mbr:
    return {}
  return {"mbr": True, "mbr_temperature": cfg.decode.mbr_temperature}


def _portable(text: str, workdir: str) -> str:
  """`text` with the workdir's absolute path written as WORKDIR, so that a result file
  names no machine's folders."""
  return text.replace(storage.normalize(workdir), "WORKDIR")


# Lines decoded together from a file or a pipe: enough for full batches on every device,
# few enough that memory stays bounded whatever the input's length.
CHUNK_LINES = 1000
PROGRESS_EVERY_SEC = 10.0


def _lines(stream: Any, name: str) -> Iterator[str]:
  """The input's lines, decoded as UTF-8; a line that is not valid UTF-8 is translated with
  U+FFFD in place of its bad bytes, with a warning naming it (never an error mid-stream)."""
  for number, raw in enumerate(stream, start=1):
    try:
      yield raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as e:
      print(f"warning: {name} line {number}: invalid UTF-8 ({e.reason} at byte {e.start}); "
            f"bad bytes replaced by U+FFFD", file=sys.stderr, flush=True)
      yield raw.decode("utf-8", errors="replace").rstrip("\r\n")


def _chunks(lines: Iterator[str], size: int) -> Iterator[list[str]]:
  while True:
    chunk = list(itertools.islice(lines, size))
    if not chunk:
      return
    yield chunk


@contextlib.contextmanager
def _input(input_path: str | None):
  """(binary stream, its name, whether a person is typing into it)."""
  if input_path:
    if not storage.exists(input_path):
      raise UserError(f"--input file not found: {input_path}")
    with storage.open_file(input_path, "rb") as f:
      yield f, input_path, False
  else:
    yield sys.stdin.buffer, "stdin", sys.stdin.isatty()


@contextlib.contextmanager
def _output(output_path: str | None):
  """stdout, or a file written under a temporary name and renamed when complete (an
  interrupted command leaves no partial file). Its folder is checked before any work."""
  if not output_path:
    yield sys.stdout
    sys.stdout.flush()
    return
  storage.check_output_file(output_path, "--output")
  with storage.writing(output_path) as f:
    yield f


class DecodeProgress:
  """A decode's progress on stderr every PROGRESS_EVERY_SEC (`BeamDecoder.progress`):
  sentences done, sentences/s and the time left, projected from the source tokens done
  (batches go shortest first, so sentences alone would promise too little)."""

  def __init__(self, what: str, every_sec: float | None = None):
    self.what, self.start = what, time.time()
    self.every = PROGRESS_EVERY_SEC if every_sec is None else every_sec
    self.last = self.start

  def __call__(self, done: int, total: int, share: float) -> None:
    now = time.time()
    if done == 0:  # a search starts (translate decodes its input chunk by chunk)
      self.start = self.last = now
      return
    if now - self.last < self.every or done >= total:
      return
    self.last, spent = now, now - self.start
    left = spent * (1 - share) / max(share, 1e-9)
    print(f"{self.what}: {done:,d}/{total:,d} sentences, {done / spent:,.1f} sentences/s, "
          f"about {_minutes(left)} left", file=sys.stderr, flush=True)


def _minutes(seconds: float) -> str:
  return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


class _Progress:
  """A line on stderr every PROGRESS_EVERY_SEC of a long input: lines done, lines/s."""

  def __init__(self, what: str):
    self.what, self.start, self.last, self.done = what, time.time(), time.time(), 0

  def add(self, n: int) -> None:
    self.done += n
    if time.time() - self.last >= PROGRESS_EVERY_SEC:
      self.last = time.time()
      rate = self.done / max(self.last - self.start, 1e-9)
      print(f"{self.what} {self.done:,d} lines ({rate:,.1f} lines/s)", file=sys.stderr,
            flush=True)


def run_translate(cfg: ExperimentConfig, workdir: str, input_path: str | None,
                  output_path: str | None, ensemble: Sequence[str] = (), nbest: int = 0
                  ) -> None:
  """One translation per input line, streamed: the model loads first; typed lines are
  translated as each is entered, a file or a pipe in chunks of CHUNK_LINES (bounded memory,
  progress on stderr). Empty lines give empty translations, so outputs stay aligned.

  `nbest` > 0: NBEST_FORMAT lines instead (the beam widened to `nbest` if it is narrower).
  """
  settings = {"beam_size": max(cfg.decode.beam_size, nbest)} if nbest else {}
  with _input(input_path) as (stream, name, typing), _output(output_path) as out:
    tr = translator.Translator.from_config(cfg, workdir, ensemble, **settings)
    tr.decoder.progress = None if typing else DecodeProgress(f"translating {name}")
    print(f"translating {name} with {tr.label}" +
          (" (one line at a time: end with Ctrl-D)" if typing else ""), file=sys.stderr,
          flush=True)
    progress = _Progress("translated")  # its `done`: the lines before this chunk
    for chunk in _chunks(_lines(stream, name), 1 if typing else CHUNK_LINES):
      if nbest:
        for index, hyps in enumerate(tr.translate_nbest(chunk), start=progress.done):
          for text, score in [h for h in hyps if math.isfinite(h[1])][:nbest] or [("", 0.0)]:
            out.write(f"{index}\t{score:.6f}\t{text}\n")
      else:
        out.write("".join(h + "\n" for h in tr.translate(chunk, first_line=progress.done + 1)))
      out.flush()
      progress.add(len(chunk))


# `--nbest=K`: K lines per input line, best first: its 0-based index, the score the search
# ranked it by (log p / GNMT length penalty), the translation, separated by tabs.
NBEST_FORMAT = "INDEX\tSCORE\tTRANSLATION"


def run_score(cfg: ExperimentConfig, workdir: str, input_path: str | None,
              output_path: str | None, ensemble: Sequence[str] = ()) -> None:
  """`--mode=score`: reads `SOURCE<TAB>TARGET` lines and writes `SUM<TAB>PER_TOKEN` per line:
  log p(target | source) under the model (an ensemble: its mean probability), summed over
  the target's tokens with its EOS, and divided by their number. An empty line gives an empty
  line; a line without a tab is a one-line error naming it."""
  with _input(input_path) as (stream, name, typing), _output(output_path) as out:
    tr = translator.Translator.from_config(cfg, workdir, ensemble)
    print(f"scoring {name} with {tr.label}", file=sys.stderr, flush=True)
    progress, number = _Progress("scored"), 0
    for chunk in _chunks(_lines(stream, name), 1 if typing else CHUNK_LINES):
      pairs, rows = [], []
      for line in chunk:
        number += 1
        if not line.strip():
          rows.append(None)
          continue
        if "\t" not in line:
          raise UserError(f"{name} line {number}: expected SOURCE<TAB>TARGET, found no tab")
        src, tgt = line.split("\t", 1)
        rows.append(len(pairs))
        pairs.append((src, tgt))
      scores = tr.score(pairs) if pairs else []
      out.write("".join("\n" if r is None else f"{scores[r][0]:.6f}\t{scores[r][1]:.6f}\n"
                        for r in rows))
      out.flush()
      progress.add(len(chunk))


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
  title = f"{sentence}  ->  {vocab.decode(hyp)}   ({label})"
  storage.makedirs(storage.dirname(storage.normalize(path)))
  kind = os.path.splitext(path)[1].lstrip(".").lower() or "png"  # what the name asks for
  with storage.writing(path, binary=True) as image:
    attention_plot.plot(params, cfg.model, vocab, src, hyp + [EOS_ID], layer, image, title,
                        image_format=kind)
  print(f"translation: {vocab.decode(hyp)}")
  print(f"wrote {path}")
  return path
