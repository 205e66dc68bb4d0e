"""Trained models for decoding, and the Python API: `Translator.from_workdir(DIR).translate(...)`.

What `--mode=eval`, `translate` and `attention` decode with is loaded here: the averaged
checkpoint when it covers the newest one, else the newest checkpoint; every member of an
`ensemble.members` run; the workdir's own vocabulary (no data cache needed). `Translator` is
the object `--mode=translate` uses.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import os

from t2t_jax import checkpoints, decode, input_pipeline, tasks, workdirs
from t2t_jax.config import DecodeConfig, ExperimentConfig, ModelConfig
from t2t_jax.errors import UserError


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

  Members may differ in shape (each keeps the model it was trained with) and in the data
  they were trained on (a run and its fine-tuned copy), but must share one vocabulary: the
  same `spm.model` (by its sha256) and `model.vocab_size`. Every member is checked before
  any parameters load.
  """
  members, first_vocab = [], None
  for member in dirs:
    found = workdirs.recorded_settings(member)
    if found is None:
      raise UserError(f"ensemble member {member} holds no trained run "
                      f"(no {workdirs.RUN_INFO})")
    model_cfg = ModelConfig(**found[1]["model"])
    vocab = input_pipeline.workdir_vocab([member])
    if vocab is None:
      raise UserError(f"ensemble member {member} has no {input_pipeline.WORKDIR_VOCAB}")
    vocab_sha = input_pipeline.file_sha256(vocab)
    first_vocab = first_vocab or (member, vocab_sha)
    differ = []
    if vocab_sha != first_vocab[1]:
      differ.append(f"its {input_pipeline.WORKDIR_VOCAB} is not {first_vocab[0]}'s")
    if model_cfg.vocab_size != cfg.model.vocab_size:
      differ.append(f"model.vocab_size {model_cfg.vocab_size}, not {cfg.model.vocab_size}")
    if differ:
      raise UserError(f"ensemble member {member} was trained with another vocabulary "
                      f"({'; '.join(differ)}); ensemble members must share one vocabulary")
    members.append((member, dataclasses.replace(cfg, model=model_cfg)))
  params, labels = [], []
  for member, member_cfg in members:
    member_params, label = load_inference_params(member_cfg, member)
    params.append(member_params)
    labels.append(f"{member}: {label}")
  return params, [c.model for _, c in members], "ensemble of " + "; ".join(labels)


def beam_decoder(cfg: ExperimentConfig, params: Any, vocab: Any,
                 model_cfgs: Sequence[ModelConfig] | None = None) -> decode.BeamDecoder:
  """One model, or an ensemble when `model_cfgs` lists each member's config."""
  max_len = min(c.max_len for c in model_cfgs or [cfg.model])
  return decode.BeamDecoder(params, model_cfgs or cfg.model, cfg.decode, vocab,
                            max_input_length=min(cfg.data.max_length, max_len),
                            constraint=tasks.for_config(cfg).search_constraint(cfg, vocab))


def load_decoder(cfg: ExperimentConfig, dirs: Sequence[str], vocab: Any
                 ) -> tuple[decode.BeamDecoder, str]:
  """The beam decoder of the model(s) in `dirs`, and a label saying which checkpoints."""
  if len(dirs) > 1:
    params, cfgs, label = load_ensemble(cfg, dirs)
    return beam_decoder(cfg, params, vocab, cfgs), label
  params, label = load_inference_params(cfg, dirs[0])
  return beam_decoder(cfg, params, vocab), label


def model_dirs(cfg: ExperimentConfig, workdir: str, ensemble: Sequence[str] = ()) -> list[str]:
  """This run's model(s), then the `--ensemble` workdirs."""
  from t2t_jax import storage
  return member_dirs(cfg, workdir) + [storage.normalize(d) for d in ensemble]


class Translator:
  """Beam search (or MBR among the beam) over all local devices, sentences in, text out."""

  def __init__(self, decoder: Any, cfg: ExperimentConfig, label: str):
    self._decoder, self.cfg, self.label = decoder, cfg, label
    self.task = tasks.for_config(cfg)

  @property
  def decoder(self) -> Any:
    """The beam decoder (`decode.BeamDecoder`; its `progress` hook reports a long decode)."""
    return self._decoder

  @classmethod
  def from_workdir(cls, workdir: str, *, ensemble: Sequence[str] = (),
                   **decode_settings: Any) -> "Translator":
    """The model(s) of a trained workdir; `ensemble` adds other workdirs of the same
    vocabulary. Keyword arguments replace `decode.*` settings: beam_size, alpha,
    max_extra_length, min_length, mbr, mbr_temperature."""
    cfg = workdirs.recorded_config(workdir)
    if cfg is None:
      damaged = workdirs.damaged_run_info(workdir)
      raise UserError(f"{workdir} holds no trained run (no {workdirs.RUN_INFO})" if not damaged
                      else f"{os.path.join(workdir, workdirs.RUN_INFO)} is damaged "
                           f"({damaged}); restore it from a copy, or use the command line "
                           f"with the run's --experiment and --set flags")
    return cls.from_config(cfg, workdir, ensemble, **decode_settings)

  @classmethod
  def from_config(cls, cfg: ExperimentConfig, workdir: str, ensemble: Sequence[str] = (),
                  **decode_settings: Any) -> "Translator":
    """As `from_workdir`, with the experiment's config given (the command line's)."""
    known = {f.name for f in dataclasses.fields(DecodeConfig)}
    unknown = sorted(set(decode_settings) - known)
    if unknown:
      raise TypeError(f"unknown decode settings {unknown}; valid: {', '.join(sorted(known))}")
    cfg = dataclasses.replace(cfg, decode=dataclasses.replace(cfg.decode, **decode_settings))
    dirs = model_dirs(cfg, workdir, ensemble)
    decoder, label = load_decoder(cfg, dirs, input_pipeline.load_vocab(cfg, dirs))
    return cls(decoder, cfg, label)

  def translate(self, sentences: Sequence[str] | str, first_line: int = 1
                ) -> list[str] | str:
    """One translation per sentence, in order; empty sentences give empty translations. A
    parser's are trees over each sentence's Penn Treebank tokens (raw text is tokenised
    unless `decode.pretokenized`); a sentence longer than the model reads is not parsed (an
    empty line, and a warning naming its line: `first_line` is the first sentence's)."""
    if isinstance(sentences, str):
      return self.translate([sentences], first_line)[0]
    inputs = self._inputs(sentences)
    kept = self._fitting(inputs, first_line)
    out = [""] * len(inputs)
    for j, hyp in zip(kept, self._decoder.translate([inputs[j] for j in kept])):
      out[j] = self.task.output(inputs[j], hyp) if inputs[j].strip() else hyp
    return out

  def _inputs(self, sentences: Sequence[str]) -> list[str]:
    pretokenized = self.cfg.decode.pretokenized
    return [self.task.prepare_input(s, pretokenized) if s.strip() else s for s in sentences]

  def _fitting(self, inputs: Sequence[str], first_line: int) -> list[int]:
    """The inputs a parser parses whole: cut at the model's input limit, the rest of a
    sentence's words would be attached by the repair rule, which is no parse of them.
    (Translation keeps its cut, with the decoder's warning.)"""
    if self.task.name != "parsing":
      return list(range(len(inputs)))
    import sys
    limit, kept = self._decoder.max_input_length, []
    for j, text in enumerate(inputs):
      pieces = len(self._decoder.vocab.encode(text)) + 1 if text.strip() else 0
      if pieces <= limit:
        kept.append(j)
        continue
      print(f"warning: line {first_line + j}: not parsed (an empty line): its "
            f"{len(text.split())} words are {pieces} input tokens with EOS, more than the "
            f"{limit} this model reads", file=sys.stderr, flush=True)
    return kept

  def translate_nbest(self, sentences: Sequence[str] | str) -> list[list[tuple[str, float]]]:
    """Per sentence, the beam's distinct translations with the scores the search ranked them
    by (log p / length penalty), best first; at most beam_size of them (slots left empty
    score -inf; a text two hypotheses share is listed once, with its better score). A single
    string is one sentence."""
    if isinstance(sentences, str):
      sentences = [sentences]
    sentences = self._inputs(sentences)
    nonempty = [j for j in self._fitting(sentences, 1) if sentences[j].strip()]
    out: list[list[tuple[str, float]]] = [[("", 0.0)] for _ in sentences]
    nbest = self._decoder.nbest_ids(self._decoder.encode([sentences[j] for j in nonempty]))
    for j, hyps in zip(nonempty, nbest):
      # Two segmentations of one text (say "ab" and "a"+"b") are two hypotheses of the
      # search but one translation: each text is listed once, with its better score.
      kept: dict[str, float] = {}
      for ids, score in hyps:  # best first, so the first score of a text is its better one
        kept.setdefault(self.task.output(sentences[j], self._decoder.vocab.decode(ids)), score)
      out[j] = list(kept.items())
    return out

  def score(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[float, float]]:
    """Per (source, target) pair: log p(target | source) summed over the target's tokens
    (its EOS included) and per token. An empty target scores its EOS alone."""
    vocab = self._decoder.vocab
    encoded = [(self._decoder.encode([src])[0] if src.strip() else [decode.EOS_ID],
                vocab.encode_target(tgt) + [decode.EOS_ID]) for src, tgt in pairs]
    limit = self._decoder.max_input_length
    long = sum(len(t) > limit for _, t in encoded)
    if long:
      import sys
      print(f"warning: {long} target(s) longer than {limit} tokens were truncated (scored "
            f"up to there)", file=sys.stderr, flush=True)
    encoded = [(s, t if len(t) <= limit else t[:limit - 1] + [decode.EOS_ID])
               for s, t in encoded]
    return [(total, total / max(tokens, 1)) for total, tokens in
            self._decoder.score_ids(encoded)]
