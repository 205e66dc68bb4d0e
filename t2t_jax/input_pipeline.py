"""Packed or length-bucketed batches of ~`train.tokens_per_step` tokens, ready for pmap.

Preparation (once, cached under the data directory, streamed so memory does not
grow with the corpus): each split's text is read pair by pair into the cache, a
shared SentencePiece vocabulary is trained on a seeded sample of both sides of
the training split (the same vocabulary on every host and every rerun), and
every split is tokenised chunk by chunk into flat int32 arrays. Training then
never touches text or SentencePiece again.

Batching is a pure function of (seed, step), computed in numpy from example
lengths alone:
  * buckets start at 8 tokens and grow by ~10% (T2T's scheme) up to
    `data.max_length`; an example's length is max(source, target) + EOS;
  * every optimiser step takes one bucket of length L and floor(tokens_per_step
    / L) examples, the same examples whatever the device count (results do not
    change with the number of GPUs); they are split into devices x
    accumulation micro-batches, filler rows all PAD;
  * each epoch is a fresh permutation from (seed, epoch) and the number of
    batches per epoch is fixed, so step k maps to (epoch, index) directly and a
    restarted run yields exactly the batches an uninterrupted run yields.
Packed (`data.packing`, the default): the same, with rows of several pairs from
the plan of t2t_jax/packing.py in place of one example a row, each step of one
row class and a multiple of 8 rows, and sources and targets in rows of their
own lengths. Evaluation batches are bucketed by powers of two either way.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import math
import os
import resource
import shutil
import sys
import time
from typing import Any, Iterator

import numpy as np

from t2t_jax import data_sources, packing, storage, tasks, workdirs
from t2t_jax.config import ExperimentConfig
from t2t_jax.data_sources import DataError, Source
from t2t_jax.special_tokens import EOS_ID, PAD_ID
from t2t_jax.vocab import Vocabulary

CACHE_VERSION = 4  # 4: held-out pairs with an empty side are kept (aligned lines)


LOCAL_CACHE = "~/.cache/t2t_jax"  # this machine's: the default data folder, and mirrors


def default_data_dir() -> str:
  return os.environ.get("T2T_JAX_DATA_DIR") or os.path.expanduser(LOCAL_CACHE)


def local_data_dir(cfg: ExperimentConfig) -> str:
  """The local folder prepared data is read from: the data folder itself, or, for one in a
  bucket (gs://), this machine's mirror of it (token ids are memory-mapped, which needs a
  local file)."""
  return storage.local_mirror(cfg.data.data_dir or default_data_dir(),
                              os.path.expanduser(LOCAL_CACHE))


def tfds_data_dir(cfg: ExperimentConfig) -> str | None:
  """Where tfds downloads and builds: the data folder the user named (data.data_dir, else
  T2T_JAX_DATA_DIR), so a cluster's shared or scratch disk holds it; with neither, tfds's own
  default (TFDS_DATA_DIR, else ~/tensorflow_datasets), where earlier downloads already lie.
  For a folder in a bucket, this machine's mirror of it: tfds writes gs:// through
  TensorFlow's own client, and only the prepared data, which is uploaded, is read again."""
  named = cfg.data.data_dir or os.environ.get("T2T_JAX_DATA_DIR") or None
  return local_data_dir(cfg) if named else None  # the folder named, or its mirror


def _splits_key(cfg: ExperimentConfig) -> str:
  """The prepared splits in a cache folder's name: a tfds or hf cache holds only these, and
  other splits are other data (split names are checked to be safe in a file name)."""
  return "+".join(dict.fromkeys([cfg.data.train_split, cfg.data.dev_split,
                                 cfg.data.test_split]))


def bucket_boundaries(max_length: int, min_length: int = 8, growth: float = 1.1) -> list[int]:
  """8, 9, 10, ..., growing by ~10% (T2T), ending exactly at `max_length`."""
  bounds, x = [], min_length
  while x < max_length:
    bounds.append(x)
    x = max(x + 1, int(x * growth))
  bounds.append(max_length)
  return bounds


def micro_batch_tokens(cfg: ExperimentConfig, num_devices: int) -> int:
  """`train.max_tokens_per_batch` for this backend: "auto" is resolved by
  `backend.micro_batch_tokens` from the model's estimated memory per token."""
  setting = cfg.train.max_tokens_per_batch
  if setting != "auto":
    return int(setting)
  from t2t_jax import backend, model

  def memory_estimate() -> tuple[float, float]:
    full_logits = backend.loss_chunk_tokens(cfg.train.loss_chunk_tokens) == 0
    per_token = model.train_bytes_per_token(cfg.model, cfg.data.max_length, full_logits)
    # Parameters, their gradient, the accumulated gradient and Adam's two moments, float32.
    return per_token, 5 * 4 * model.param_count(cfg.model)
  return backend.micro_batch_tokens(setting, math.ceil(cfg.train.tokens_per_step / num_devices),
                                    memory_estimate)


def accumulation_steps(cfg: ExperimentConfig, num_devices: int,
                       max_tokens: int | None = None) -> int:
  """Micro-batches per device per update so each holds <= max_tokens_per_batch tokens."""
  max_tokens = max_tokens or micro_batch_tokens(cfg, num_devices)
  return max(1, math.ceil(cfg.train.tokens_per_step / (num_devices * max_tokens)))


def _log(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


# Seconds between progress lines inside one preparation stage: reading or tokenising a WMT
# split takes minutes (36M pairs: 15 minutes on 2 cores, results/prepare_36m).
PROGRESS_EVERY_S = 30.0
TOKENISE_CHUNK = 50_000  # lines tokenised at a time: memory stays one chunk's


class _Progress:
  """A line every PROGRESS_EVERY_S through a long stage: how far it is, and with a known
  total its share and the time left at its rate so far."""

  def __init__(self, what: str, total: int | None = None, unit: str = "pairs"):
    self.what, self.total, self.unit = what, total, unit
    self.start = self.last = time.monotonic()

  def update(self, done: int) -> None:
    now = time.monotonic()
    if now - self.last < PROGRESS_EVERY_S:
      return
    self.last, elapsed = now, now - self.start
    if self.total:
      left = elapsed * (self.total - done) / max(done, 1)
      _log(f"{self.what}: {done:,d} of {self.total:,d} {self.unit} "
           f"({100 * done / self.total:.0f}%, {elapsed:.0f}s, about {left:.0f}s left)")
    else:
      _log(f"{self.what}: {done:,d} {self.unit} ({elapsed:.0f}s)")


# ---------------------------------------------------------------------------
# Preparation and caching


# Content hashes of folder sources' files, by path, size and mtime (data_sources.folder_fingerprint).
FOLDER_HASHES = "folder_hashes.json"


def _prepared_dir(cfg: ExperimentConfig, source: Source) -> str:
  """The cache directory for this source, its splits and the vocabulary settings (local:
  a bucket's is mirrored, `prepared_dir`)."""
  root = local_data_dir(cfg)
  if source.kind == "tfds":
    key = (f"tfds-{source.name.replace('/', '_')}-{source.src_lang}-{source.tgt_lang}"
           f"-{_splits_key(cfg)}")
  elif source.kind == "hf":
    where = source.name
    if os.path.isdir(where):  # a saved dataset: its content's identity, not its path
      where = os.path.basename(where.rstrip("/")) + "-" + _saved_dataset_fingerprint(where)
    key = f"hf-{where.replace('/', '_')}-{source.src_lang}-{source.tgt_lang}-{_splits_key(cfg)}"
  elif source.kind == "ptb":
    splits = list(dict.fromkeys(_splits_key(cfg).split("+")))
    base = os.path.basename(source.name.split("+")[0].rstrip("/")) or "treebank"
    key = f"ptb-{base}-{data_sources.treebank_fingerprint(source, splits)}"
    if cfg.data.tree_target != "xx":
      key += f"-{cfg.data.tree_target}"
  else:
    splits = data_sources.folder_splits(source)
    base = os.path.basename(source.name.rstrip("/")) or "folder"
    # Only the splits the cache holds: a test set added to the folder later (to evaluate on)
    # must not orphan a prepared corpus.
    held = [s for s in _splits_key(cfg).split("+") if s in splits]
    content = data_sources.folder_fingerprint(source, held, os.path.join(root, FOLDER_HASHES))
    key = f"{source.kind}-{base}-{source.src_lang}-{source.tgt_lang}-{content}"
  if cfg.data.vocab_from:
    vocab_key = f"v{CACHE_VERSION}-from{file_sha256(vocab_file(cfg))[:16]}"
  else:
    vocab_key = (f"v{CACHE_VERSION}-{cfg.data.vocab_type}{cfg.model.vocab_size}"
                 f"-sample{cfg.data.vocab_sample_sentences}")
  return os.path.join(root, key, vocab_key)


def vocab_file(cfg: ExperimentConfig) -> str:
  """`data.vocab_from` as a SentencePiece model file (a workdir stands for its spm.model)."""
  path = cfg.data.vocab_from
  if storage.isdir(path):
    path = storage.join(path, WORKDIR_VOCAB)
  if not storage.isfile(path):
    raise DataError(f"data.vocab_from: no SentencePiece model at {path}")
  Vocabulary(local_vocab(path))  # parses, with the reserved ids: else a one-line error naming it
  return path


def local_vocab(path: str) -> str:
  """A local copy of a vocabulary in a bucket, which SentencePiece can only read from a
  local file; the path itself when it is local."""
  return storage.local_copy(path, os.path.join(os.path.expanduser(LOCAL_CACHE), "remote_vocabularies"))


def _saved_dataset_fingerprint(folder: str) -> str:
  """A `save_to_disk` folder by content: the hashes of its files (Arrow data and JSON)."""
  import hashlib
  h = hashlib.sha256()
  for root, _, files in sorted(os.walk(folder)):
    for name in sorted(files):
      path = os.path.join(root, name)
      h.update(os.path.relpath(path, folder).encode())
      h.update(file_sha256(path).encode())
  return h.hexdigest()[:16]


def resolve_source(cfg: ExperimentConfig) -> Source:
  """The parsed data source; the demo folder is generated on first use."""
  source = data_sources.parse_spec(cfg.data.dataset)
  if source.kind == "demo":
    root = local_data_dir(cfg)
    path = os.path.join(root, f"demo_corpus_v{CACHE_VERSION}_seed0")
    if not os.path.isdir(path):
      _log(f"generating the synthetic demo corpus in {path}")
      os.makedirs(root, exist_ok=True)
      data_sources.write_demo_folder(path, seed=0)
    source = Source("folder", path, source.src_lang, source.tgt_lang)
  return source


def source_label(cfg: ExperimentConfig) -> str:
  """The data source's name without a machine's folders (a folder's last part; a tfds or
  hf name, '/' as '_'): the folder of `--test_data`'s eval outputs."""
  spec = cfg.data.dataset
  if spec == "demo":
    return "demo"
  source = data_sources.parse_spec(spec)
  name = storage.basename(storage.normalize(source.name)) if source.kind in (
      "folder", "ptb") else source.name.replace("/", "_")
  return f"{source.kind}_{name}"


def source_description(cfg: ExperimentConfig) -> str:
  """What an eval record names as its data: the spec, a folder by its last part."""
  spec = cfg.data.dataset
  if spec == "demo":
    return spec
  source = data_sources.parse_spec(spec)
  if source.kind == "ptb":
    return f"ptb:.../{storage.basename(storage.normalize(source.name))}"
  if source.kind == "folder":
    return (f"folder:.../{storage.basename(storage.normalize(source.name))}"
            f":{source.src_lang}-{source.tgt_lang}")
  return spec


# Common names of the dev and test splits in local folders (tfds uses validation/test).
SPLIT_ALIASES = {"dev_split": ("validation", "valid", "dev", "newstest2013", "dev2010"),
                 "test_split": ("test", "newstest2014", "test2016", "tst2010")}


def resolve_splits(cfg: ExperimentConfig) -> ExperimentConfig:
  """For a folder lacking the configured dev/test split, the first common alias it has.

  So `--dataset=folder:../shared/data/tatoeba_ende` works with a paper experiment
  (whose splits carry tfds names) without also spelling out every split.
  """
  source = resolve_source(cfg)  # the demo becomes its generated folder
  if source.kind != "folder":
    return cfg
  present = set(data_sources.folder_splits(source))
  changes = {}
  for field, aliases in SPLIT_ALIASES.items():
    wanted = getattr(cfg.data, field)
    if wanted not in present:
      found = [a for a in aliases if a in present]
      if found:
        changes[field] = found[0]
        _log(f"data.{field}: {source.name} has no {wanted!r} split; using {found[0]!r}")
  return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, **changes)) \
      if changes else cfg


def _write_text(pairs, tmp: str, split: str, keep_empty: bool) -> tuple[int, int]:
  """Streams a split's pairs to `<split>.src.txt` / `.tgt.txt`; (kept, dropped). Pairs with
  an empty side are dropped from training data, and kept in held-out splits (`keep_empty`),
  whose lines must stay aligned with their files: an empty source translates to an empty
  line there. A source whose pairs carry a third item, the reference a decoded output is
  scored against when it is not the target itself (a treebank's gold tree), writes it to
  `<split>.ref.txt` for held-out splits."""
  kept = dropped = 0
  refs = None
  progress = _Progress(f"reading {split}")
  with open(os.path.join(tmp, f"{split}.src.txt"), "w", encoding="utf-8", newline="\n") as fs, \
       open(os.path.join(tmp, f"{split}.tgt.txt"), "w", encoding="utf-8", newline="\n") as ft:
    try:
      for pair in pairs:
        progress.update(kept + dropped)
        if not keep_empty and not (pair[0] and pair[1]):
          dropped += 1
          continue
        fs.write(_one_line(pair[0]))
        ft.write(_one_line(pair[1]))
        if len(pair) > 2 and keep_empty:
          if refs is None:
            refs = open(os.path.join(tmp, f"{split}.ref.txt"), "w", encoding="utf-8",
                        newline="\n")
          refs.write(_one_line(pair[2]))
        kept += 1
    finally:
      if refs is not None:
        refs.close()
  return kept, dropped


def _one_line(text: str) -> str:
  return text.replace("\n", " ").replace("\r", " ") + "\n"


def _read_lines(path: str) -> Iterator[str]:
  """The lines of one of our text files (split on newlines alone, as they were written)."""
  with open(path, encoding="utf-8", newline="\n") as f:
    for line in f:
      yield line[:-1]


class _IdsFile:
  """A 1-D int32 .npy file appended to chunk by chunk; its header is written on close.

  Memory stays that of one chunk whatever the corpus size, and training memory-maps the
  result as before.
  """

  HEADER_BYTES = 128  # a .npy 1.0 header of a 1-D int32 array of up to 10^17 elements

  def __init__(self, path: str):
    self.path, self.size = path, 0
    self._file = open(path, "wb")
    self._file.write(b"\0" * self.HEADER_BYTES)

  def append(self, values: np.ndarray) -> None:
    self._file.write(np.ascontiguousarray(values, np.int32).tobytes())
    self.size += len(values)

  def close(self) -> None:
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": np.dtype(np.int32).str,
                                                  "fortran_order": False,
                                                  "shape": (self.size,)})
    assert len(header.getvalue()) == self.HEADER_BYTES, header.getvalue()
    self._file.seek(0)
    self._file.write(header.getvalue())
    self._file.close()


def _tokenise(vocab: Vocabulary, text_path: str, out_prefix: str, target: bool = False,
              progress: _Progress | None = None, done: int = 0) -> None:
  """Token ids of every line of `text_path`, chunk by chunk, to `<prefix>.ids.npy` (flat)
  and `<prefix>.len.npy`; `target`: as the task tokenises targets (a tree's symbols whole).
  `progress`, `done`: the stage's progress line and the lines before this file's."""
  ids_file, len_file = _IdsFile(out_prefix + ".ids.npy"), _IdsFile(out_prefix + ".len.npy")
  lines = _read_lines(text_path)
  try:
    while True:
      block = list(itertools.islice(lines, TOKENISE_CHUNK))
      if not block:
        break
      if progress is not None:
        progress.update(done)
      done += len(block)
      ids = vocab.encode_targets_many(block) if target else vocab.encode_many(block)
      lengths = np.fromiter(map(len, ids), np.int32, count=len(ids))
      ids_file.append(np.fromiter(itertools.chain.from_iterable(ids), np.int32,
                                  count=int(lengths.sum())))
      len_file.append(lengths)
  finally:
    ids_file.close()
    len_file.close()


def _train_vocabulary(cfg: ExperimentConfig, meta: dict[str, Any], tmp: str, start: float
                      ) -> tuple[Vocabulary, int]:
  """A SentencePiece model trained on a seeded sample of the training sentences, in `tmp`."""
  from t2t_jax import vocab as vocab_lib
  n_train = meta["splits"][cfg.data.train_split]
  train_text = [os.path.join(tmp, f"{cfg.data.train_split}.{side}.txt")
                for side in ("src", "tgt")]
  sample_path = os.path.join(tmp, "vocab_sample.txt")
  sampled = vocab_lib.write_sample(train_text, [n_train, n_train],
                                   cfg.data.vocab_sample_sentences, seed=0,
                                   out_path=sample_path)
  _log(f"training a {cfg.data.vocab_type} SentencePiece vocabulary of <= "
       f"{cfg.model.vocab_size} pieces on {sampled:,d} of the {2 * n_train:,d} training "
       f"sentences ({time.time() - start:.0f}s so far)")
  symbols = tasks.for_config(cfg).vocabulary_symbols(_read_lines(train_text[1]))
  vocab = vocab_lib.train(sample_path, os.path.join(tmp, "spm.model"), cfg.model.vocab_size,
                          cfg.data.vocab_type, user_symbols=symbols)
  os.remove(sample_path)
  return vocab, sampled


def _source_pairs(cfg: ExperimentConfig, source: Source, split: str
                  ) -> Iterator[tuple[str, str]]:
  """A split's text pairs, streamed from wherever the source keeps them."""
  if source.kind == "folder":
    splits = data_sources.folder_splits(source)
    if split not in splits:
      lang_files = [os.path.join(source.name, f"{split}.{lang}")
                    for lang in (source.src_lang, source.tgt_lang)]
      missing = [p for p in lang_files if not storage.exists(p)]
      raise DataError(f"missing file: {missing[0]} (split {split!r} of {source.name}; it has "
                      f"{', '.join(splits)})")
    return data_sources.iter_pair_files(source, split)
  if source.kind == "hf":
    return data_sources.iter_hf_pairs(source.name, split, source.src_lang, source.tgt_lang)
  if source.kind == "ptb":
    return data_sources.treebank_pairs(source, split, {"xx": False, "words": True}.get(
        cfg.data.tree_target, cfg.data.tree_target))
  return data_sources.iter_tfds_pairs(source.name, split, source.src_lang, source.tgt_lang,
                                      tfds_data_dir(cfg))


def source_splits(cfg: ExperimentConfig) -> list[str] | None:
  """The split names a folder source has; None for tfds and hf (known once read)."""
  source = resolve_source(cfg)
  return data_sources.folder_splits(source) if source.kind == "folder" else None


def held_out_text(cfg: ExperimentConfig, split: str) -> tuple[list[str], list[str]]:
  """Source and reference lines of a split the cache was not prepared with, read from the
  data source: another test set of a trained run (newstest2015 beside newstest2014) needs
  only its text, since decoding tokenises the sources itself. Every line is kept, empty
  ones too, so the outputs stay aligned with the split's files."""
  source = resolve_source(cfg)
  src, tgt = [], []
  for pair in _source_pairs(cfg, source, split):
    src.append(pair[0])
    tgt.append(pair[-1])  # the reference: a third item where the source has one
  if not src:
    raise DataError(f"split {split!r} of {source.name} is empty")
  return src, tgt


def _prepare(cfg: ExperimentConfig, source: Source, out_dir: str) -> None:
  """Builds the cache in a temporary directory and renames it into place when complete.

  Streamed throughout, so memory does not grow with the corpus: the text of each split is
  read pair by pair (checked) into the cache, the vocabulary is trained on a seeded
  sample of the training sentences, and token ids are appended chunk by chunk.
  """
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
  from t2t_jax import vocab as vocab_lib
  tmp = data_sources.temporary_name(out_dir)
  os.makedirs(tmp)
  try:
    start = time.time()
    wanted = [cfg.data.train_split, cfg.data.dev_split, cfg.data.test_split]
    meta = {"source": dataclasses.asdict(source), "dropped_empty": {}, "splits": {}}
    for split in dict.fromkeys(wanted):
      pairs = _source_pairs(cfg, source, split)
      _log(f"reading {split} of {source.name}")
      meta["splits"][split], meta["dropped_empty"][split] = _write_text(
          pairs, tmp, split, keep_empty=split != cfg.data.train_split)
    if not meta["splits"][cfg.data.train_split]:
      raise DataError(f"the training split {cfg.data.train_split!r} of {source.name} has no "
                      f"pairs with text on both sides")
    if cfg.data.vocab_from:
      _log(f"tokenising with the vocabulary of {cfg.data.vocab_from}")
      storage.copy(vocab_file(cfg), os.path.join(tmp, "spm.model"))
      vocab, sampled = vocab_lib.Vocabulary(os.path.join(tmp, "spm.model")), 0
    else:
      vocab, sampled = _train_vocabulary(cfg, meta, tmp, start)
    vocab = tasks.for_config(cfg).vocabulary(vocab)
    if vocab.size > cfg.model.vocab_size:
      raise DataError(f"vocabulary has {vocab.size} pieces, more than model.vocab_size="
                      f"{cfg.model.vocab_size}")
    meta.update(vocab_size=vocab.size, vocab_sha256=file_sha256(vocab.path),
                vocab_sample_sentences=sampled)
    for split in meta["splits"]:
      n = meta["splits"][split]
      _log(f"tokenising {split}: {n:,d} pairs ({time.time() - start:.0f}s so far)")
      # One count over both sides (the sources, then the targets): the share and the time
      # left are the whole split's.
      progress = _Progress(f"tokenising {split}", total=2 * n, unit="sentences")
      for i, side in enumerate(("src", "tgt")):
        text = os.path.join(tmp, f"{split}.{side}.txt")
        _tokenise(vocab, text, os.path.join(tmp, f"{split}.{side}"), target=side == "tgt",
                  progress=progress, done=i * n)
        if split not in (cfg.data.dev_split, cfg.data.test_split):
          # Training reads only the ids; the text was half the cache (7.4 of 15 GB at 36M
          # pairs). Held-out text stays: BLEU needs its raw references.
          os.remove(text)
    meta["prepare_seconds"] = round(time.time() - start, 1)
    meta["prepare_peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    with open(os.path.join(tmp, "meta.json"), "w") as f:
      json.dump(meta, f, indent=2)
    data_sources.publish_dir(tmp, out_dir, marker="meta.json")
    _log(f"prepared data in {out_dir} ({time.time() - start:.0f}s)")
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise


file_sha256 = data_sources.file_sha256


def existing_cache(cfg: ExperimentConfig) -> str | None:
  """The experiment's prepared cache directory if it exists; prepares nothing."""
  out_dir = _prepared_dir(cfg, resolve_source(cfg))
  return out_dir if os.path.exists(os.path.join(out_dir, "meta.json")) else None


def prepared_dir(cfg: ExperimentConfig) -> str:
  """Prepares the data if needed and returns its (local) cache directory. With the data
  folder in a bucket, a machine that finds the prepared data there downloads it; one that
  does not prepares it and uploads it, meta.json last (what marks it complete), so that
  the other hosts of a job, and later jobs, download instead of preparing."""
  source = resolve_source(cfg)
  out_dir = _prepared_dir(cfg, source)
  root = cfg.data.data_dir or default_data_dir()
  remote = storage.mirrored(root, os.path.relpath(out_dir, local_data_dir(cfg)))
  if remote and not os.path.exists(os.path.join(out_dir, "meta.json")) and storage.exists(
      storage.join(remote, "meta.json")):
    _download(remote, out_dir)
  _prepare_once(cfg, source, out_dir)
  if remote and not storage.exists(storage.join(remote, "meta.json")):
    _log(f"uploading the prepared data to {remote}")
    names = sorted(os.listdir(out_dir), key=lambda n: n == "meta.json")
    for name in names:
      storage.copy(os.path.join(out_dir, name), storage.join(remote, name))
  return out_dir


def _download(remote: str, out_dir: str) -> None:
  """The prepared data in a bucket, copied to this machine (into a temporary name, renamed
  when whole)."""
  _log(f"downloading the prepared data from {remote}")
  os.makedirs(os.path.dirname(out_dir), exist_ok=True)
  tmp = data_sources.temporary_name(out_dir)
  os.makedirs(tmp)
  for name in storage.listdir(remote):
    storage.copy(storage.join(remote, name), os.path.join(tmp, name))
  try:
    os.replace(tmp, out_dir)
  except OSError:  # another process of this machine got there first
    shutil.rmtree(tmp, ignore_errors=True)


def _prepare_once(cfg: ExperimentConfig, source: Source, out_dir: str) -> None:
  if not os.path.exists(os.path.join(out_dir, "meta.json")):
    os.makedirs(os.path.dirname(out_dir), exist_ok=True)
    with data_sources.host_lock(out_dir + ".lock"):  # one preparation per machine at once
      if not os.path.exists(os.path.join(out_dir, "meta.json")):
        for name in data_sources.remove_dead_temporaries(out_dir):
          _log(f"removed {name}, left by a preparation that was killed")
        _prepare(cfg, source, out_dir)


# A trained workdir keeps the vocabulary its token ids mean, so decoding never depends on
# the data cache still being there (or being rebuilt the same way).
WORKDIR_VOCAB = workdirs.VOCABULARY


def record_vocab(workdir: str, cache_dir: str, replace: bool = False) -> None:
  """Copies the cache's vocabulary into a workdir on its first run (with its sha256 in
  `spm.model.sha256`); on later runs checks that the cache still has that vocabulary.
  `replace`: the workdir has no checkpoint yet, so its recorded vocabulary binds nothing.

  A resumed workdir whose copy is gone or damaged gets the cache's again when the cache's
  is the one recorded (its sha256; or, with that record gone too, the one the same data
  settings built, said in a warning); a lost record of the sha256 is written again."""
  ours = storage.join(workdir, WORKDIR_VOCAB)
  cached = os.path.join(cache_dir, "spm.model")
  if not replace:
    expected = recorded_vocab_sha256(workdir)
    present = storage.exists(ours)
    if present and expected in (None, file_sha256(ours)):
      check_vocab([workdir], cache_dir)  # the cache still holds the run's vocabulary
      if expected:
        return  # else the lost sha256 is written again below (the cache's file is ours)
    else:
      what = "damaged" if present else "missing"
      if expected and file_sha256(cached) != expected:
        raise DataError(f"{ours} is {what} and the data cache {cache_dir} holds another "
                        f"vocabulary than the run recorded; restore {WORKDIR_VOCAB} from a "
                        f"copy of the workdir")
      print(f"warning: {ours} was {what}; copied again from the data cache {cache_dir}, "
            + ("whose vocabulary has the recorded sha256" if expected else
               "which this run's data settings built (no sha256 was recorded to check)"),
            file=sys.stderr, flush=True)
  storage.write_atomic(ours + ".sha256", file_sha256(cached) + "\n")
  storage.copy_atomic(cached, ours)


def recorded_vocab_sha256(workdir: str) -> str | None:
  """The sha256 WORKDIR/spm.model.sha256 records, or None when it is absent or damaged (a
  warning says which)."""
  recorded = storage.join(workdir, WORKDIR_VOCAB + ".sha256")
  if not storage.exists(recorded):
    return None
  text = storage.read_bytes(recorded).decode("ascii", errors="replace").strip()
  if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
    print(f"warning: {recorded} is damaged (not a sha256); {WORKDIR_VOCAB} is used "
          f"unchecked", file=sys.stderr, flush=True)
    return None
  return text


def workdir_vocab(workdirs: list[str]) -> str | None:
  """The vocabulary file the first of `workdirs` that has one was trained with, checked
  against the sha256 recorded beside it (a damaged copy is a one-line error, not
  SentencePiece's `unk is not defined`)."""
  for workdir in workdirs:
    path = storage.join(workdir, WORKDIR_VOCAB)
    if storage.exists(path):
      expected = recorded_vocab_sha256(workdir)
      if expected and file_sha256(path) != expected:
        raise DataError(f"{path} is damaged: its sha256 is not the one recorded in "
                        f"{path}.sha256 when the run trained; restore it from a copy of "
                        f"the workdir")
      return path
  return None


def check_vocab(workdirs: list[str], cache_dir: str) -> None:
  """A one-line error if the data cache's vocabulary is not the one the workdirs trained
  with: their token ids would mean other pieces."""
  cached = file_sha256(os.path.join(cache_dir, "spm.model"))
  for workdir in workdirs:
    path = storage.join(workdir, WORKDIR_VOCAB)
    ours = file_sha256(path) if storage.exists(path) else cached
    if ours != cached:
      workdir_vocab([workdir])  # a damaged copy is named as such, not as another vocabulary
      raise DataError(f"the data cache {cache_dir} holds another vocabulary (sha256 "
                      f"{cached[:12]}) than {workdir} was trained with ({ours[:12]}); "
                      f"the cache was built from other data or settings. Move it away to "
                      f"rebuild it, or point data.data_dir at the cache the run used")


def load_vocab(cfg: ExperimentConfig, workdirs: list[str] = ()) -> Vocabulary:
  """The vocabulary the workdirs were trained with: their own copy, checked against its
  recorded sha256. Inference reads only the workdir: no corpus, no data cache, nothing
  prepared or written elsewhere, so a workdir copied alone to another machine translates."""
  path = workdir_vocab(list(workdirs))
  if path is None:
    raise DataError(f"{', '.join(workdirs)} has no {WORKDIR_VOCAB}: train there first (the "
                    f"first training run records the vocabulary in the workdir)")
  return tasks.for_config(cfg).vocabulary(Vocabulary(local_vocab(path)))


# ---------------------------------------------------------------------------
# Batches


@dataclasses.dataclass
class _Split:
  src_flat: np.ndarray
  src_start: np.ndarray
  src_len: np.ndarray
  tgt_flat: np.ndarray
  tgt_start: np.ndarray
  tgt_len: np.ndarray

  def rows(self, ids: np.ndarray, length: int, total_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) [total_rows, length]: example `ids[r]` in row r, each side cut to
    length - 1 tokens, then EOS, then PAD; rows past len(ids) are all PAD. Packed rows of
    one sentence each (`packing.gather_rows`)."""
    ids = np.asarray(ids)
    one_each = (np.arange(len(ids)), np.arange(len(ids)))
    return tuple(packing.gather_rows(flat, start[ids], np.minimum(size[ids], length - 1),
                                     one_each, length, total_rows)
                 for flat, start, size in ((self.src_flat, self.src_start, self.src_len),
                                           (self.tgt_flat, self.tgt_start, self.tgt_len)))


def _load_split(directory: str, split: str) -> _Split:
  arrays = {}
  for side in ("src", "tgt"):
    flat = np.load(os.path.join(directory, f"{split}.{side}.ids.npy"), mmap_mode="r")
    lengths = np.load(os.path.join(directory, f"{split}.{side}.len.npy"))
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    arrays[side] = (flat, starts, lengths)
  return _Split(*arrays["src"], *arrays["tgt"])


class Dataset:
  """Prepared data of one experiment: vocabulary, training batches, eval batches, raw text."""

  def __init__(self, cfg: ExperimentConfig, directory: str, num_devices: int,
               process_index: int = 0, process_count: int = 1):
    self.cfg, self.directory = cfg, directory
    self.num_devices, self.process_index, self.process_count = \
        num_devices, process_index, process_count
    self.micro_batch_tokens = micro_batch_tokens(cfg, num_devices * process_count)
    self.accum_steps = accumulation_steps(cfg, num_devices * process_count,
                                          self.micro_batch_tokens)
    self.vocab = tasks.for_config(cfg).vocabulary(Vocabulary(os.path.join(directory,
                                                                            "spm.model")))
    with open(os.path.join(directory, "meta.json")) as f:
      self.meta = json.load(f)
    self.src_lang = self.meta["source"]["src_lang"]
    self.tgt_lang = self.meta["source"]["tgt_lang"]
    self.boundaries = np.array(bucket_boundaries(cfg.data.max_length, cfg.data.bucket_min_length,
                                                 cfg.data.bucket_growth), np.int64)
    self.train = _load_split(directory, cfg.data.train_split)
    lengths = np.maximum(self.train.src_len, self.train.tgt_len) + 1  # + EOS
    keep = lengths <= cfg.data.max_length
    self.num_filtered = int((~keep).sum())
    self._train_ids = np.nonzero(keep)[0]
    self._bucket_of = np.searchsorted(self.boundaries, lengths[self._train_ids])
    # Rows per step for each bucket: the step's token budget over the bucket length.
    self._rows = np.maximum(1, cfg.train.tokens_per_step // self.boundaries)
    counts = np.bincount(self._bucket_of, minlength=len(self.boundaries))
    self._batches_per_bucket = -(-counts // self._rows)
    self.steps_per_epoch = int(self._batches_per_bucket.sum())
    if self.steps_per_epoch == 0:
      raise DataError(f"no training pairs of at most {cfg.data.max_length} tokens")
    self._epoch_cache: tuple[int, list[np.ndarray]] | None = None
    from t2t_jax import backend
    self.packed = backend.packing(cfg.data.packing)
    if self.packed:
      self._plan_packing()

  def _plan_packing(self) -> None:
    """The packed rows of every epoch (packing.make_plan), the rows of a step of each row
    class, and an accumulation count that splits every class's step evenly where one
    near the memory-derived count does."""
    cfg, start = self.cfg, time.time()
    src, tgt = self._train_lengths()
    shortest = cfg.data.pack_min_length
    shortest = (packing.shortest_row(tgt, cfg.data.max_length) if shortest == "auto"
                else int(shortest))
    classes = packing.row_classes(cfg.data.max_length, shortest,
                                  float(src.sum() / tgt.sum()), int(src.max()))
    self.plan = packing.make_plan(src, tgt, classes)
    self._pair_type = self.plan.pair_types(src, tgt)
    self._class_rows = np.array([packing.rows_per_step(cfg.train.tokens_per_step, lt)
                                 for lt, _ in classes])
    counts = np.bincount(self.plan.row_class, minlength=len(classes))
    self._batches_per_class = -(-counts // self._class_rows)
    self.steps_per_epoch = int(self._batches_per_class.sum())
    devices = self.num_devices * self.process_count
    used = self._class_rows[counts > 0]
    for a in range(self.accum_steps, 2 * self.accum_steps + 1):
      if all(rows % (devices * a) == 0 for rows in used):
        self.accum_steps = a
        break
    filled = tgt.sum() / (np.array([lt for lt, _ in classes])[self.plan.row_class].sum())
    _log(f"packed {len(src):,d} training pairs into {self.plan.num_rows:,d} rows of "
         f"{' and '.join(f'{lt}/{ls}' for lt, ls in classes)} target/source tokens "
         f"({100 * filled:.1f}% of the target slots used) in {time.time() - start:.1f}s")

  # -- training ------------------------------------------------------------

  def _epoch(self, epoch: int) -> list[np.ndarray]:
    """The epoch's global batches (arrays of example ids; packed: of row ids), in training
    order."""
    if self._epoch_cache and self._epoch_cache[0] == epoch:
      return self._epoch_cache[1]
    rng = np.random.default_rng([self.cfg.train.seed, epoch])
    if self.packed:
      return self._packed_epoch(epoch, rng)
    order = rng.permutation(len(self._train_ids))
    ids, buckets = self._train_ids[order], self._bucket_of[order]
    batches = []
    for b in np.nonzero(self._batches_per_bucket)[0]:
      members = ids[buckets == b]
      rows = int(self._rows[b])
      batches.extend(members[i:i + rows] for i in range(0, len(members), rows))
    batches = [batches[i] for i in rng.permutation(len(batches))]
    self._epoch_cache = (epoch, batches)
    return batches

  def _packed_epoch(self, epoch: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Packed: the epoch's pairs dealt to the plan's rows, each class's rows shuffled and cut
    into steps, the steps shuffled."""
    slot_pair = self._train_ids[self.plan.deal(self._pair_type, rng)]
    batches = []
    for c in np.nonzero(self._batches_per_class)[0]:
      rows = np.nonzero(self.plan.row_class == c)[0]
      rows = rows[rng.permutation(len(rows))]
      step = int(self._class_rows[c])
      batches.extend(rows[i:i + step] for i in range(0, len(rows), step))
    batches = [batches[i] for i in rng.permutation(len(batches))]
    self._slot_pair = slot_pair
    self._epoch_cache = (epoch, batches)
    return batches

  def _row_pairs(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Packed: (index in `rows`, example id) of every sentence of those rows, in order."""
    first, counts = self.plan.row_start[rows], np.diff(self.plan.row_start)[rows]
    local = np.repeat(np.arange(len(rows)), counts)
    slots = np.repeat(first - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
    return local, self._slot_pair[slots]

  def step_examples(self, step: int) -> np.ndarray:
    """Example ids of optimiser step `step` (the same for every device layout)."""
    epoch, index = divmod(step, self.steps_per_epoch)
    batch = self._epoch(epoch)[index]
    return self._row_pairs(batch)[1] if self.packed else batch

  def _micro_rows(self, bucket_rows: int) -> int:
    """Rows per micro-batch: the bucket's full step, split over devices x accumulation.

    A bucket's last, partial batch of an epoch keeps the full shape (filler rows),
    so each bucket compiles once.
    """
    return -(-bucket_rows // (self.num_devices * self.process_count * self.accum_steps))

  def _assemble(self, ids: np.ndarray, length: int, bucket_rows: int) -> dict[str, np.ndarray]:
    """[process_count * num_devices * accum, m, L] global layout -> this process's share."""
    rows = self._micro_rows(bucket_rows)
    per_process = self.num_devices * self.accum_steps * rows
    mine = ids[self.process_index * per_process:(self.process_index + 1) * per_process]
    inputs, targets = self.train.rows(mine, length, per_process)
    local = (self.num_devices, self.accum_steps, rows, length)
    return {"inputs": inputs.reshape(local), "targets": targets.reshape(local)}

  def _assemble_packed(self, rows: np.ndarray) -> dict[str, np.ndarray]:
    """Packed rows in the global layout -> this process's share, as `_assemble`."""
    c = int(self.plan.row_class[rows[0]])
    target_length, source_length = self.plan.classes[c]
    micro = self._micro_rows(int(self._class_rows[c]))
    per_process = self.num_devices * self.accum_steps * micro
    mine = rows[self.process_index * per_process:(self.process_index + 1) * per_process]
    local, pairs = self._row_pairs(mine)
    t = self.train
    inputs = packing.gather_rows(t.src_flat, t.src_start, t.src_len, (local, pairs),
                                 source_length, per_process)
    targets = packing.gather_rows(t.tgt_flat, t.tgt_start, t.tgt_len, (local, pairs),
                                  target_length, per_process)
    shape = (self.num_devices, self.accum_steps, micro)
    return {"inputs": inputs.reshape(*shape, source_length),
            "targets": targets.reshape(*shape, target_length)}

  def batch(self, step: int) -> dict[str, np.ndarray]:
    """int32 {"inputs", "targets"} [devices, accum, batch, length] for optimiser step `step`
    (packed: the inputs' length is the row class's source length)."""
    if self.packed:
      epoch, index = divmod(step, self.steps_per_epoch)
      return self._assemble_packed(self._epoch(epoch)[index])
    ids = self.step_examples(step)
    bucket = int(self._bucket_of_example(ids[:1])[0])
    return self._assemble(ids, int(self.boundaries[bucket]), int(self._rows[bucket]))

  def _bucket_of_example(self, ids: np.ndarray) -> np.ndarray:
    lengths = np.maximum(self.train.src_len[ids], self.train.tgt_len[ids]) + 1
    return np.searchsorted(self.boundaries, lengths)

  def train_shapes(self, steps: range | None = None
                   ) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Every (inputs, targets) [devices, accum, batch, length] shape pair `batch` gives for
    `steps` (counted as `batch` counts them; default: every step): one per length bucket,
    or packed per row class, that holds training pairs (the same in every epoch). Fewer
    steps than an epoch, e.g. a short fine-tune or a resume near the end, may meet fewer."""
    if steps is not None and len(steps) < self.steps_per_epoch:
      return sorted({self._step_shape(step) for step in steps})
    if self.packed:
      return [self._class_shape(c) for c in np.nonzero(self._batches_per_class)[0]]
    return [self._bucket_shape(b) for b in np.nonzero(self._batches_per_bucket)[0]]

  def _step_shape(self, step: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shapes of `batch(step)`, from the epoch's order alone (nothing assembled)."""
    epoch, index = divmod(step, self.steps_per_epoch)
    first = self._epoch(epoch)[index][:1]
    if self.packed:
      return self._class_shape(int(self.plan.row_class[first[0]]))
    return self._bucket_shape(int(self._bucket_of_example(first)[0]))

  def _class_shape(self, c: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    lead = (self.num_devices, self.accum_steps, self._micro_rows(int(self._class_rows[c])))
    target_length, source_length = self.plan.classes[c]
    return (*lead, source_length), (*lead, target_length)

  def _bucket_shape(self, b: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    shape = (self.num_devices, self.accum_steps, self._micro_rows(int(self._rows[b])),
             int(self.boundaries[b]))
    return shape, shape

  def _train_lengths(self) -> tuple[np.ndarray, np.ndarray]:
    """(source, target) lengths of every training pair, EOS included."""
    ids = self._train_ids
    return (self.train.src_len[ids].astype(np.int64) + 1,
            self.train.tgt_len[ids].astype(np.int64) + 1)

  def source_per_target_token(self) -> float:
    """Source tokens per target token of the training pairs (EOS included): what an update's
    target-token budget brings of source tokens, the encoder's share of its cost (a parser's
    sentence is under half its linearised tree; a translation pair's sides are near equal)."""
    src, tgt = self._train_lengths()
    return float(src.sum()) / max(float(tgt.sum()), 1.0)

  def pair_lengths(self) -> tuple[np.ndarray, ...]:
    """(source, target, source row, target row) lengths of every training pair, EOS
    included: the rows of its length bucket, or packed, of the shortest row class it fits."""
    src, tgt = self._train_lengths()
    if not self.packed:
      rows = self.boundaries[self._bucket_of]
      return src, tgt, rows, rows
    lt, ls = (np.array(side) for side in zip(*self.plan.classes))
    cls = packing.pair_classes(src, tgt, self.plan.classes)
    return src, tgt, ls[cls], lt[cls]

  def train_batches(self, start_step: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """Batches for steps start_step, start_step + 1, ... forever."""
    step = start_step
    while True:
      yield self.batch(step)
      step += 1

  # -- evaluation ------------------------------------------------------------

  def split(self, name: str) -> _Split:
    if not os.path.exists(os.path.join(self.directory, f"{name}.src.ids.npy")):
      raise DataError(f"split {name!r} is not prepared in {self.directory}")
    return self.train if name == self.cfg.data.train_split else _load_split(self.directory, name)

  def eval_batches(self, split: str, batch_tokens: int | None = None
                   ) -> Iterator[dict[str, np.ndarray]]:
    """Every example of `split` once (longer ones truncated), [devices, batch, length].

    In a multi-process job each process yields its own share of every global
    batch (all processes yield the same number of batches), so a loss summed
    over the global devices counts each example once.
    """
    data = self.split(split)
    max_len = self.cfg.data.max_length
    lengths = np.minimum(np.maximum(data.src_len, data.tgt_len) + 1, max_len)
    order = np.argsort(lengths, kind="stable")
    budget = batch_tokens or self.micro_batch_tokens
    devices = self.num_devices * self.process_count
    # Lengths by powers of two, and every batch of a length its full number of rows (filler
    # rows all PAD, which the loss does not count): a few eval shapes to compile, not one per
    # length bucket and a last batch of each (33 for newstest2013 before).
    bounds = np.array(bucket_boundaries(max_len, growth=2.0))
    i = 0
    while i < len(order):
      length = int(bounds[np.searchsorted(bounds, lengths[order[i]])])
      rows = max(1, budget // length)
      chunk = order[i:i + rows * devices]
      chunk = chunk[lengths[chunk] <= length]  # the rest starts the next, longer batch
      per_dev = rows
      per_process = self.num_devices * per_dev
      mine = chunk[self.process_index * per_process:(self.process_index + 1) * per_process]
      inputs, targets = data.rows(mine, length, per_process)
      yield {"inputs": inputs.reshape(self.num_devices, per_dev, length),
             "targets": targets.reshape(self.num_devices, per_dev, length)}
      i += len(chunk)

  def raw(self, split: str) -> tuple[list[str], list[str]]:
    """Source and reference text of a split, every pair (for BLEU against raw references);
    a split the cache lacks is read from the data source."""
    if not os.path.exists(os.path.join(self.directory, f"{split}.src.txt")):
      return held_out_text(self.cfg, split)
    out = []
    refs = "ref" if os.path.exists(os.path.join(self.directory, f"{split}.ref.txt")) else "tgt"
    for side in ("src", refs):
      with open(os.path.join(self.directory, f"{split}.{side}.txt"), encoding="utf-8",
                newline="\n") as f:
        out.append(f.read().split("\n")[:-1])
    return out[0], out[1]

  def info(self) -> dict[str, Any]:
    """Summary figures; the padding fractions are measured over one epoch (both sides
    together, and each side)."""
    slots = np.zeros(2)  # source, target
    shapes = set()
    micro_batches = self.num_devices * self.process_count * self.accum_steps
    if self.packed:
      for c in np.nonzero(self._batches_per_class)[0]:
        rows = micro_batches * self._micro_rows(int(self._class_rows[c]))
        target_length, source_length = self.plan.classes[c]
        shapes.add((rows, source_length, target_length))
        slots += int(self._batches_per_class[c]) * rows * np.array([source_length,
                                                                     target_length])
    else:
      for step in range(self.steps_per_epoch):
        ids = self.step_examples(step)
        bucket = int(self._bucket_of_example(ids[:1])[0])
        length = int(self.boundaries[bucket])
        rows = self._micro_rows(int(self._rows[bucket]))
        shapes.add((rows, length))
        slots += micro_batches * rows * length
    # Every training pair is in one step of the epoch, bucketed or packed.
    src, tgt = self._train_lengths()
    real = np.array([src.sum(), tgt.sum()], np.float64)
    return {"train_pairs": len(self._train_ids), "filtered_too_long": self.num_filtered,
            "dropped_empty": self.meta["dropped_empty"], "splits": self.meta["splits"],
            "vocab_size": self.vocab.size, "steps_per_epoch": self.steps_per_epoch,
            "accum_steps": self.accum_steps, "packed": self.packed, "num_shapes": len(shapes),
            "padding_fraction": round(1 - real.sum() / max(slots.sum(), 1), 4),
            "source_padding_fraction": round(1 - real[0] / max(slots[0], 1), 4),
            "target_padding_fraction": round(1 - real[1] / max(slots[1], 1), 4)}

  def summary(self) -> str:
    m = self.meta
    batching = (f"{len(self.plan.classes)} packed row classes" if self.packed else
                f"{len(self.boundaries)} length buckets")
    return (f"data: {self.cfg.data.dataset} ({self.src_lang}->{self.tgt_lang}), "
            f"{len(self._train_ids)} training pairs, {self.num_filtered} longer than "
            f"{self.cfg.data.max_length} tokens filtered, "
            f"{sum(m['dropped_empty'].values())} empty pairs dropped, vocabulary {self.vocab.size}, "
            f"{self.steps_per_epoch} steps per epoch, {batching}" + self._size_note())

  def _size_note(self) -> str:
    """A vocabulary that came out smaller than `model.vocab_size` (SentencePiece stops where
    the corpus runs out of pieces): the model's other output ids are never decoded, but they
    cost parameters, and label smoothing spreads probability over them."""
    spare = self.cfg.model.vocab_size - self.vocab.size
    if spare <= 0:
      return ""
    return (f"\nwarning: the vocabulary has {self.vocab.size:,d} pieces, fewer than "
            f"model.vocab_size={self.cfg.model.vocab_size}: the model's other {spare:,d} "
            f"output ids are never decoded, but they are parameters and label smoothing "
            f"spreads probability over them; --set model.vocab_size={self.vocab.size} sizes "
            f"the model to the vocabulary")


def load(cfg: ExperimentConfig, num_devices: int, process_index: int = 0,
         process_count: int = 1, directory: str | None = None) -> Dataset:
  """Prepares (or reuses) the experiment's data and returns its batches (`directory`: the
  cache, when already prepared)."""
  ds = Dataset(cfg, directory or prepared_dir(cfg), num_devices, process_index, process_count)
  _log(ds.summary())
  return ds

