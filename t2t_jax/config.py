"""Experiment configuration: frozen dataclasses plus dotted-name overrides.

Configs are plain values: experiments build them, `--set KEY=VALUE` replaces
fields by dotted name (`model.d_model=256`), and nothing mutates them later.
This module imports nothing heavy so `--help` and `--mode=params` start fast.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, Literal, Mapping

from t2t_jax.errors import UserError


class ConfigError(UserError, ValueError):
  """A bad override or config value; `main` prints it as one line, exit 2."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The Transformer's shape (paper section 3, Table 3 columns)."""
  vocab_size: int = 37000
  num_layers: int = 6          # N: encoder and decoder layers each
  # Encoder layers when they differ from N (0: N). An encoder layer costs less than a decoder
  # layer, and deep-encoder/shallow-decoder models translate about as well (Kasai et al. 2021).
  encoder_layers: int = 0
  d_model: int = 512
  d_ff: int = 2048
  num_heads: int = 8           # h
  d_k: int = 64                # per-head query/key size; independent of d_model/h
  d_v: int = 64                # per-head value size
  dropout: float = 0.1         # P_drop: sub-layer outputs and embedding sums
  # Not in the paper (section 5.4 drops only sub-layer outputs and embedding sums): T2T's
  # attention_dropout (on the softmax weights) and relu_dropout (on the FFN's hidden layer).
  attention_dropout: float = 0.0
  relu_dropout: float = 0.0
  label_smoothing: float = 0.1  # eps_ls
  positional: Literal["sinusoidal", "learned"] = "sinusoidal"
  # The compute dtype; parameters, optimiser state, LayerNorm, softmax and loss stay float32.
  # "auto": bfloat16 on GPU and TPU, float32 on CPU (backend.compute_dtype). Training records
  # the resolved dtype in experiment.json, and a resumed run keeps it.
  dtype: Literal["auto", "float32", "bfloat16"] = "auto"
  # Which code the model runs (t2t_jax/backend.py): "plain" Flax, "cpu_tuned" for XLA:CPU, or
  # "auto": cpu_tuned on CPU, plain on GPU and TPU. The same parameters and the same maths.
  implementation: Literal["auto", "plain", "cpu_tuned"] = "auto"
  # Attention through jax.nn.dot_product_attention (cuDNN's fused kernel on GPU where it
  # applies, XLA's own elsewhere) instead of two einsums. It has no attention dropout and
  # returns no attention weights (for `--mode=attention`).
  fused_attention: bool = False
  # How the fused kernel keeps a packed row's sentences apart (data.packing): "bias", a
  # [rows, 1, L, L] mask over the whole row (every backend); "offsets", cuDNN's packed
  # layout, where each sentence is its own sequence and no work is spent between sentences
  # (Hopper or newer GPUs, bfloat16; not yet run on one); "auto": bias (backend.py).
  segment_attention: Literal["auto", "bias", "offsets"] = "auto"
  # Q, K and V (and cross-attention's K and V) as one product with the matrices side by side:
  # the same parameters (checkpoints and exports do not change) and the same maths. "auto":
  # on GPU and TPU, off on CPU (backend.fused_projections).
  fused_projections: bool | Literal["auto"] = "auto"
  # The dtype of the residual stream between sub-layers (LayerNorm outputs, embedding sums)
  # when model.dtype=bfloat16; LayerNorm statistics stay float32 either way. "float32" is
  # the paper-faithful mixed precision; "bfloat16" halves that traffic.
  residual_dtype: Literal["float32", "bfloat16"] = "float32"
  max_len: int = 256           # longest sequence the learned positions cover

  @property
  def num_encoder_layers(self) -> int:
    return self.encoder_layers or self.num_layers


# ModelConfig fields that change how the model computes but not its parameters or what it
# computes: a run may resume, decode or fine-tune with other values.
COMPUTE_FIELDS = ("dtype", "implementation", "fused_attention", "segment_attention",
                  "fused_projections", "residual_dtype")
# ModelConfig fields that only training uses: decoding may differ in them.
TRAINING_ONLY_FIELDS = ("dropout", "attention_dropout", "relu_dropout", "label_smoothing")


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Where the parallel text comes from and how it is tokenised and bucketed."""
  dataset: str = "tfds:wmt14_translate/de-en:en-de"  # source spec, see input_pipeline
  train_split: str = "train"
  dev_split: str = "validation"
  test_split: str = "test"
  vocab_type: Literal["bpe", "unigram", "word", "char"] = "bpe"
  # Sentences (of both sides of the training split) the vocabulary is trained on, drawn by
  # a seeded sampler so every preparation gives the same vocabulary; 3M is what
  # SentencePiece itself would sample.
  vocab_sample_sentences: int = 3_000_000
  max_length: int = 256        # longer examples are filtered (and counted)
  bucket_min_length: int = 8   # T2T's length buckets: start at 8 ...
  bucket_growth: float = 1.1   # ... and grow by ~10%
  # Training batches of packed rows (t2t_jax/packing.py: several pairs a row, each sentence
  # attending only to itself) instead of the paper's length buckets: a few step shapes
  # instead of one per bucket, and less padding. "auto" (backend.packing): on, on every
  # backend, as measured; false gives the paper's buckets. Evaluation batches are bucketed
  # either way.
  packing: bool | Literal["auto"] = "auto"
  # The shortest packed row's target length; rows double from it up to max_length.
  # "auto": the least power of two that holds 4 sentences of the corpus's mean length.
  pack_min_length: int | Literal["auto"] = "auto"
  data_dir: str = ""           # prepared-data cache; empty = ~/.cache/t2t_jax
  # An existing SentencePiece model (a spm.model file, or a workdir holding one) to tokenise
  # with instead of training a vocabulary on this data. `train.init_from` sets it to the
  # vocabulary of the run it starts from.
  vocab_from: str = ""
  shuffle_buffer: int = 0      # 0 = full shuffle of each epoch
  # A parser's (`ptb:` data) target symbols for the words: "xx", the paper's (Vinyals &
  # Kaiser et al. 2014: every POS tag as the one symbol XX); "words", each word itself, which
  # the constrained decoder may only copy from the input, next word first (the decoder then
  # sees where in the sentence it is instead of counting its XXs). "tags": the sentence given
  # as its gold POS tags, copied into the target in the words' places (parsing from gold
  # tags, as parsers before predicted tagging were scored; not the paper's setting).
  # "labels": not brackets but one label per word (Gomez-Rodriguez & Vilares 2018: the lowest
  # constituent the word shares with the next and how much deeper it is than the last one):
  # a target as long as the sentence, its i-th symbol about its i-th word. "word_labels": the
  # words with each pair's label after its second word (`The cat @+2:NP sat @-1:S @end/VP`),
  # the words copied from the input by the constrained decoder. "tagged_word_labels": each
  # word's POS tag after it (`The ^DT cat ^NN @+2:NP ...`): the trees' tags are predicted.
  tree_target: Literal["xx", "words", "tags", "labels", "word_labels",
                       "tagged_word_labels"] = "xx"


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Optimiser, schedule and bookkeeping (paper section 5)."""
  steps: int = 100_000
  tokens_per_step: int = 25_000  # per side, per optimiser update, whatever the device count
  # Tokens per device per micro-batch; a larger update is accumulated over micro-batches.
  # "auto" (t2t_jax/backend.py): 4096 on CPU; on a GPU or TPU the whole update when the
  # device's memory holds it, else the largest size that fits.
  max_tokens_per_batch: int | Literal["auto"] = "auto"
  # The output layer and loss over chunks of at most this many tokens (the fewest equal
  # chunks), each chunk's [tokens, vocab] logits built and dropped in turn; 0 builds them whole.
  # "auto": 0 on CPU, 4096 on GPU and TPU (backend.loss_chunk_tokens).
  loss_chunk_tokens: int | Literal["auto"] = "auto"
  # The chunked loss's gradient (softmax - q) formed in its forward pass and sent through two
  # products in the compute dtype (bf16 with float32 accumulation in bf16 runs), nothing
  # recomputed; false: autodiff of the chunks, with float32 gradient products.
  lean_loss: bool = True
  # Orbax writes checkpoints in a background thread while training goes on; every save is
  # complete before averaging, evaluation, exit, or the stop that a signal asks for.
  async_checkpoints: bool = True
  # "START:END": a jax.profiler trace of optimiser steps START..END (1-based, inclusive) of
  # this run, written to WORKDIR/profile (open it with TensorBoard's profile plugin, xprof or
  # Perfetto). Empty: no trace.
  profile_steps: str = ""
  # A workdir whose parameters (its average, else its newest checkpoint) this run starts from,
  # with a fresh optimiser and schedule: fine-tuning, on other data or with other dropout,
  # learning rate or steps. The shapes and the vocabulary must be that run's. A run that
  # has checkpoints of its own resumes from them instead.
  init_from: str = ""
  # Every this many steps and at the last (0: never), translate the first `bleu_sentences` dev
  # sentences with the current parameters (beam `bleu_beam_size`; 1 is greedy) and log their
  # sacreBLEU (a parser: EVALB F1, `dev_f1`) and 3
  # samples (metrics.jsonl, TensorBoard text), as the Flax WMT example and fairseq's
  # --eval-bleu do. Off by default: on the CPU recipes it would cost more than 5% of their time.
  bleu_every_steps: int = 0
  bleu_sentences: int = 100
  bleu_beam_size: int = 1
  warmup_steps: int = 4000
  adam_b1: float = 0.9
  adam_b2: float = 0.98
  adam_eps: float = 1e-9
  learning_rate_scale: float = 1.0  # multiplies the paper's schedule (1.0 = paper)
  # 0 = the paper's schedule. N > 0: the rate also falls linearly to 0 over the last N of
  # `steps` (for runs whose length is fixed in advance, e.g. by a time budget).
  cooldown_steps: int = 0
  # M > 0, with `max_train_minutes`: the rate also falls linearly to 0 over the last M minutes
  # of the time budget, for runs whose step count the machine's speed decides.
  cooldown_minutes: float = 0.0
  # Checkpoints every this many steps, counted back from `steps` (so the last one is the
  # final step): the ones averaging reads (`average.spacing=steps`). The paper averaged
  # checkpoints written every 10 minutes on 8 P100s, which ran base's 100k steps in 12 hours
  # and big's 300k in 3.5 days (section 5.2): 100,000 / 72 = 1,389 and 300,000 / 504 = 595
  # steps apart. In steps, the averaged window is the paper's on any device: base 1,400, big
  # 600 (configs/paper.py). 0: none by steps.
  checkpoint_every_steps: int = 1400
  # A checkpoint also once this many minutes have passed since the last one (0: never), so
  # that a crash loses little on slow hardware; averaged only with `average.spacing=minutes`.
  checkpoint_every_minutes: float = 10.0
  # Checkpoints kept whole (with Adam's moments, ~3x the parameters' bytes): the newest, to
  # resume from, and one before it in case the newest is damaged. The older checkpoints that
  # averaging reads (`average.last`) keep their parameters alone; the rest are deleted.
  keep_checkpoints: int = 2
  eval_every_steps: int = 5000
  log_every_steps: int = 100
  seed: int = 0
  final_eval: bool = True  # on reaching `steps`: average, then decode dev/test (section 6.1)
  # Training wall-time budget across resumes (0 = none): on reaching it training ends as if
  # at `steps` (checkpoint, dev evaluation, then the final evaluation).
  max_train_minutes: float = 0.0
  # False: the final evaluation decodes the dev split only (Table 3 reports dev figures).
  final_eval_test: bool = True
  # Multi-process jobs agree on stopping (signals, time budget, time-based checkpoints) every
  # this many steps, and at log and checkpoint steps: each agreement waits for the devices,
  # so doing it every step would keep the host from running ahead. One process decides
  # every step.
  sync_every_steps: int = 10
  # Batches assembled and placed on the devices ahead of the step that uses them.
  prefetch_batches: int = 2


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
  """Beam search (paper section 6.1)."""
  beam_size: int = 4
  alpha: float = 0.6
  max_extra_length: int = 50
  # Tokens a hypothesis must have before EOS may end it. 1, as fairseq's default, rules out the
  # empty translation, which beam search can otherwise rank first for long inputs (Stahlberg &
  # Byrne 2019); 0 allows it, as the paper's and T2T's search do.
  min_length: int = 1
  # Not in the paper: output the beam hypothesis with the highest expected sentence BLEU
  # against the beam's others (minimum Bayes risk, t2t_jax/mbr.py) instead of the top-scoring
  # one, each weighted by exp(beam score / mbr_temperature). Worth a wider beam (8).
  mbr: bool = False
  mbr_temperature: float = 1.0
  # Source tokens per device in one search batch (sentences sorted by length, so about this
  # many over sentences' padded lengths). "auto": 2,048 on CPU, where larger batches measured
  # no faster, and 32,768 on GPU and TPU (backend.decode_batch_tokens).
  batch_tokens: int | Literal["auto"] = "auto"
  # A parser's search extends only prefixes of well-formed trees with exactly the input's
  # word count (parsing.TreeConstraint); false decodes freely and repairs what is not a tree
  # by a fixed rule (parsing.repair). Translation has no constraint either way.
  constrained: bool = True
  # What a parser's translate/parse input lines are: raw text, tokenised as the Penn Treebank
  # is (parsing.tokenize: `can't` -> `ca n't`, `(` -> -LRB-), or with `pretokenized`, tokens
  # separated by spaces (each escaped). Translation reads raw text either way.
  pretokenized: bool = False


@dataclasses.dataclass(frozen=True)
class AverageConfig:
  """Checkpoint averaging for inference (section 6.1)."""
  last: int = 5  # checkpoints averaged: 5 (base), 20 (big)
  # Which checkpoints count: "steps", those of `train.checkpoint_every_steps` (the paper's
  # window in steps, whatever the device's speed); "minutes", those of
  # `train.checkpoint_every_minutes` (the paper's rule as written, whose window in steps
  # grows with the device's speed). The final step's checkpoint counts either way.
  spacing: Literal["steps", "minutes"] = "steps"


@dataclasses.dataclass(frozen=True)
class EnsembleConfig:
  """Independently trained models decoded together. Not in the paper, which averages the
  checkpoints of one model; an ensemble averages several models' predicted probabilities."""
  # N > 1: one training command trains N models at once (seeds seed, seed+1, ...), each on
  # its own share of the CPU cores, in WORKDIR/member<i>/, then decodes with all of them.
  members: int = 1


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
  name: str = ""
  description: str = ""
  model: ModelConfig = ModelConfig()
  data: DataConfig = DataConfig()
  train: TrainConfig = TrainConfig()
  decode: DecodeConfig = DecodeConfig()
  average: AverageConfig = AverageConfig()
  ensemble: EnsembleConfig = EnsembleConfig()


@dataclasses.dataclass(frozen=True)
class SweepRow:
  """One row of a sweep (Table 3): what it changes from the sweep's base, and the paper's
  dev figures for it (newstest2013; PPL per wordpiece, tokenized BLEU, params in millions)."""
  change: str                  # the row as the paper's table names it
  sets: Mapping[str, Any]      # the changed config fields, by dotted name
  paper_dev_ppl: float
  paper_dev_bleu: float
  paper_params_m: float | None = None


def evaluation_splits(cfg: ExperimentConfig) -> list[str]:
  """The splits `--mode=eval` decodes by default and the only ones `--splits` accepts."""
  return [cfg.data.dev_split, cfg.data.test_split]


def final_eval_splits(cfg: ExperimentConfig) -> list[str]:
  """The splits the end of training decodes: dev, then test unless `train.final_eval_test`
  is off."""
  return [cfg.data.dev_split] + ([cfg.data.test_split] if cfg.train.final_eval_test else [])


def _field_types(cls: type) -> dict[str, Any]:
  return typing.get_type_hints(cls)


def all_keys(cfg: Any, prefix: str = "") -> list[str]:
  """Every overridable dotted key of a config, e.g. 'model.d_model'."""
  keys = []
  for f in dataclasses.fields(cfg):
    value = getattr(cfg, f.name)
    if dataclasses.is_dataclass(value):
      keys.extend(all_keys(value, f"{prefix}{f.name}."))
    else:
      keys.append(f"{prefix}{f.name}")
  return keys


def _parse_value(key: str, raw: Any, typ: Any) -> Any:
  """Converts `raw` (a string from the command line, or a Python value) to `typ`."""
  origin = typing.get_origin(typ)
  if origin is Literal:
    choices = typing.get_args(typ)
    if raw not in choices:
      raise ConfigError(f"{key}: {raw!r} is not one of {', '.join(map(str, choices))}")
    return raw
  if origin in (typing.Union, types.UnionType):
    args = [a for a in typing.get_args(typ) if a is not type(None)]
    if raw in (None, "None", "none") and len(args) < len(typing.get_args(typ)):
      return None
    errors = []
    for arg in args:  # the first type that takes the value: `int | Literal["auto"]`
      try:
        return _parse_value(key, raw, arg)
      except ConfigError as e:
        errors.append(str(e).split(": ", 1)[-1])
    raise ConfigError(f"{key}: {' or '.join(errors)}")
  if typ is bool:
    if isinstance(raw, bool):
      return raw
    low = str(raw).lower()
    if low in ("true", "1", "yes"):
      return True
    if low in ("false", "0", "no"):
      return False
    raise ConfigError(f"{key}: expected a boolean (true/false), got {raw!r}")
  if typ is int:
    if isinstance(raw, bool):
      raise ConfigError(f"{key}: expected an integer, got {raw!r}")
    if isinstance(raw, int):
      return raw
    try:
      return int(str(raw).replace("_", ""))
    except ValueError:
      pass
    try:  # accept 1e5-style integers, refuse 0.5
      as_float = float(raw)
    except ValueError:
      as_float = None
    if as_float is not None and as_float.is_integer():
      return int(as_float)
    raise ConfigError(f"{key}: expected an integer, got {raw!r}")
  if typ is float:
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
      return float(raw)
    try:
      return float(raw)
    except ValueError:
      raise ConfigError(f"{key}: expected a number, got {raw!r}") from None
  if typ is str:
    return str(raw)
  raise ConfigError(f"{key}: cannot set a field of type {typ}")


def override(cfg: Any, changes: Mapping[str, Any]) -> Any:
  """Returns `cfg` with dotted keys replaced; values may be strings to parse."""
  for key, raw in changes.items():
    cfg = _override_one(cfg, key, raw, key)
  return cfg


def _override_one(cfg: Any, key: str, raw: Any, full_key: str) -> Any:
  head, _, rest = key.partition(".")
  names = {f.name for f in dataclasses.fields(cfg)}
  if head not in names:
    raise ConfigError(_unknown_key_message(full_key, cfg))
  current = getattr(cfg, head)
  if rest:
    if not dataclasses.is_dataclass(current):
      raise ConfigError(_unknown_key_message(full_key, cfg))
    return dataclasses.replace(cfg, **{head: _override_one(current, rest, raw, full_key)})
  if dataclasses.is_dataclass(current):
    raise ConfigError(f"{full_key}: is a group of settings; set one of its fields, "
                      f"e.g. {full_key}.{dataclasses.fields(current)[0].name}")
  value = _parse_value(full_key, raw, _field_types(type(cfg))[head])
  return dataclasses.replace(cfg, **{head: value})


def _unknown_key_message(key: str, cfg: Any) -> str:
  # Suggest from the root config's keys when we can reach them via the key's prefix.
  candidates = all_keys(ExperimentConfig())
  close = difflib.get_close_matches(key, candidates, n=3, cutoff=0.6)
  if not close:
    leaf = key.rsplit(".", 1)[-1]
    close = [k for k in candidates if k.rsplit(".", 1)[-1] == leaf][:3]
  hint = f"; did you mean {', '.join(close)}?" if close else ""
  return f"unknown config key {key!r}{hint}"


def parse_set_flags(items: list[str]) -> dict[str, str]:
  """Splits repeated `--set KEY=VALUE` flag values into a dict (later wins)."""
  changes = {}
  for item in items:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
      raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
    changes[key.strip()] = value.strip()
  return changes


def is_split_name(name: str) -> bool:
  """Letters, digits, '_', '-' and '.', not leading '.': a split names cache and output
  files, so it must not reach outside their folder."""
  return bool(name) and all(c.isalnum() or c in "_.-" for c in name) and not name.startswith(".")


def validate(cfg: ExperimentConfig) -> None:
  """Checks values that are well-typed but meaningless, before any work starts."""
  m, t, d = cfg.model, cfg.train, cfg.decode
  positive = {"model.vocab_size": m.vocab_size, "model.num_layers": m.num_layers,
              "model.d_model": m.d_model, "model.d_ff": m.d_ff,
              "model.num_heads": m.num_heads, "model.d_k": m.d_k, "model.d_v": m.d_v,
              "model.max_len": m.max_len, "train.steps": t.steps,
              "train.tokens_per_step": t.tokens_per_step,
              **({"train.max_tokens_per_batch": t.max_tokens_per_batch}
                 if t.max_tokens_per_batch != "auto" else {}),
              "train.warmup_steps": t.warmup_steps,
              "train.keep_checkpoints": t.keep_checkpoints,
              "train.sync_every_steps": t.sync_every_steps,
              "train.prefetch_batches": t.prefetch_batches,
              "train.bleu_sentences": t.bleu_sentences, "train.bleu_beam_size": t.bleu_beam_size,
              "decode.beam_size": d.beam_size, "average.last": cfg.average.last,
              "ensemble.members": cfg.ensemble.members,
              "data.max_length": cfg.data.max_length,
              "data.vocab_sample_sentences": cfg.data.vocab_sample_sentences}
  for key, value in positive.items():
    if value <= 0:
      raise ConfigError(f"{key}: must be positive, got {value}")
  if not d.mbr_temperature > 0:
    raise ConfigError(f"decode.mbr_temperature: must be positive, got {d.mbr_temperature}")
  if m.encoder_layers < 0:
    raise ConfigError(f"model.encoder_layers: must be >= 0 (0: model.num_layers), "
                      f"got {m.encoder_layers}")
  if not 0 <= t.cooldown_steps <= t.steps:
    raise ConfigError(f"train.cooldown_steps: must be between 0 and train.steps ({t.steps}), "
                      f"got {t.cooldown_steps}")
  if not 0 <= t.cooldown_minutes <= t.max_train_minutes:
    raise ConfigError(f"train.cooldown_minutes: must be between 0 and the time budget, "
                      f"train.max_train_minutes ({t.max_train_minutes:g}), "
                      f"got {t.cooldown_minutes:g}")
  if t.cooldown_minutes and t.cooldown_steps:
    raise ConfigError("train.cooldown_minutes and train.cooldown_steps: set one of them")
  for key, value in {"model.dropout": m.dropout, "model.attention_dropout": m.attention_dropout,
                     "model.relu_dropout": m.relu_dropout,
                     "model.label_smoothing": m.label_smoothing}.items():
    if not 0.0 <= value < 1.0:
      raise ConfigError(f"{key}: must be in [0, 1), got {value}")
  if m.positional == "learned" and cfg.data.max_length > m.max_len:
    raise ConfigError(f"data.max_length={cfg.data.max_length}: a sentence may be longer than "
                      f"the learned positions cover (model.max_len={m.max_len}); lower "
                      f"data.max_length or raise model.max_len")
  if m.d_model % 2:
    raise ConfigError(f"model.d_model: sinusoidal positions need an even size, got {m.d_model}")
  for key in ("train_split", "dev_split", "test_split"):
    name = getattr(cfg.data, key)
    if not is_split_name(name):
      raise ConfigError(f"data.{key}: a split name is letters, digits, '_', '-' and '.' "
                        f"(it names the cache's files), got {name!r}")
  if t.checkpoint_every_steps < 0 or t.checkpoint_every_minutes < 0:
    raise ConfigError("train.checkpoint_every_steps and train.checkpoint_every_minutes: must "
                      "be >= 0 (0: never)")
  spacing = {"steps": "train.checkpoint_every_steps", "minutes": "train.checkpoint_every_minutes"}
  if not getattr(t, spacing[cfg.average.spacing].split(".")[1]):
    raise ConfigError(f"average.spacing={cfg.average.spacing} averages the checkpoints of "
                      f"{spacing[cfg.average.spacing]}, which is 0 (none); set it, or the "
                      f"other spacing")
  if t.bleu_every_steps < 0:
    raise ConfigError(f"train.bleu_every_steps: must be >= 0 (0: never), "
                      f"got {t.bleu_every_steps}")
  if t.loss_chunk_tokens != "auto" and t.loss_chunk_tokens < 0:
    raise ConfigError(f"train.loss_chunk_tokens: must be >= 0 (0: no chunks) or auto, "
                      f"got {t.loss_chunk_tokens}")
  profile_range(t.profile_steps)
  if m.fused_attention and m.attention_dropout:
    raise ConfigError("model.fused_attention: the fused kernel has no attention dropout; "
                      f"set model.attention_dropout=0 (got {m.attention_dropout})")
  if m.segment_attention == "offsets" and not m.fused_attention:
    raise ConfigError("model.segment_attention=offsets is a layout of the fused kernel; "
                      "set model.fused_attention=true too")
  if m.residual_dtype == "bfloat16" and m.dtype == "float32":
    raise ConfigError("model.residual_dtype=bfloat16 is a bf16 run's residual stream; set "
                      "model.dtype=bfloat16 (or auto, on a GPU or TPU) too")
  if m.segment_attention == "offsets" and cfg.data.packing is False:
    raise ConfigError("model.segment_attention=offsets is a layout of packed rows; it needs "
                      "data.packing (true or auto)")
  if m.fused_attention and m.d_k != m.d_v:
    raise ConfigError(f"model.fused_attention: the fused kernel needs d_k == d_v "
                      f"(got {m.d_k} and {m.d_v})")


def profile_range(spec: str) -> tuple[int, int] | None:
  """`train.profile_steps` "START:END" as (START, END), or None when empty."""
  if not spec:
    return None
  start, sep, end = spec.partition(":")
  try:
    first, last = int(start), int(end)
  except ValueError:
    first = last = 0
  if not sep or not 1 <= first <= last:
    raise ConfigError(f"train.profile_steps: expected START:END with 1 <= START <= END "
                      f"(e.g. 100:105), got {spec!r}")
  return first, last
