"""Where parallel text comes from: tfds builders, local folders, and the synthetic demo pair.

Every source is read as a stream of (source, target) pairs: `tfds:NAME` through
tfds, `folder:PATH` from its `<split>.<lang>` files directly (line by line, so a
corpus of any size reads in constant memory), and `demo` as a generated folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import os
import random
import re
import sys
from typing import Any, Iterator

from t2t_jax.errors import UserError


class DataError(UserError):
  """Bad or missing data: one line, exit code 2."""


@dataclasses.dataclass(frozen=True)
class Source:
  kind: str          # "tfds" | "folder" | "demo"
  name: str          # tfds name, or folder path
  src_lang: str
  tgt_lang: str


# newstest2014 for English->German exists in two sizes: WMT's full set (what tfds and the
# Hugging Face hub build; sacreBLEU's `wmt14/full`) and its filtered set (sacreBLEU's plain
# `wmt14`). BLEU on one does not compare with BLEU on the other.
NEWSTEST2014_ENDE = {3003: "the full set (sacreBLEU -t wmt14/full)",
                     2737: "the filtered set (sacreBLEU -t wmt14)"}


def test_set_note(spec: str, split: str, num_lines: int) -> str | None:
  """Which newstest2014 an English->German eval decoded, for its record (None for any other
  test set). Read from the spec's text alone."""
  wmt14_test = "wmt14" in spec and split == "test"
  if spec_languages(spec) != ("en", "de") or not (wmt14_test or split == "newstest2014") \
      or num_lines not in NEWSTEST2014_ENDE:
    return None
  other = next(n for n in NEWSTEST2014_ENDE if n != num_lines)
  return (f"newstest2014, {NEWSTEST2014_ENDE[num_lines]}, {num_lines:,} lines: BLEU on it does "
          f"not compare with BLEU on {NEWSTEST2014_ENDE[other].split(' (')[0]} "
          f"({other:,} lines)")


def spec_languages(spec: str) -> tuple[str, str] | None:
  """The direction a spec names, read from its text alone (no folder is opened), or None."""
  if spec == "demo":
    return DEMO_SRC, DEMO_TGT
  if spec.startswith("ptb:"):
    return TREEBANK_SRC, TREEBANK_TGT
  tail = spec.rpartition(":")[2]
  if spec.count(":") >= 2 and "-" in tail and "/" not in tail:
    src, tgt = tail.split("-", 1)
    return src, tgt
  return None


# A treebank's sentences and trees (t2t_jax/parsing/): English words in, linearized trees out.
TREEBANK_SRC, TREEBANK_TGT = "en", "tree"


def parse_spec(spec: str) -> Source:
  """`tfds:NAME:SRC-TGT`, `hf:NAME[/CONFIG]:SRC-TGT`, `folder:PATH[:SRC-TGT]`,
  `ptb:PATH[+EXTRA...]` or `demo`."""
  if spec == "demo":
    return Source("demo", "demo", DEMO_SRC, DEMO_TGT)
  kind, _, rest = spec.partition(":")
  if kind not in ("tfds", "hf", "folder", "ptb") or not rest:
    raise DataError(f"unknown dataset spec {spec!r}; use tfds:NAME:SRC-TGT, "
                    f"hf:NAME[/CONFIG]:SRC-TGT, folder:PATH[:SRC-TGT], ptb:PATH or demo")
  if kind == "ptb":
    return _treebank_source(spec, rest)
  name, pair = rest, ""
  head, sep, tail = rest.rpartition(":")
  if sep and "-" in tail and "/" not in tail:
    name, pair = head, tail
  if kind in ("tfds", "hf"):
    if not pair:
      raise DataError(f"{spec}: name the direction explicitly, e.g. {kind}:{name}:en-de "
                      f"(WMT's keys are (xx, en); the paper translates from English)")
    src, tgt = pair.split("-", 1)
    if kind == "hf" and os.path.isdir(os.path.expanduser(name)):
      name = os.path.abspath(os.path.expanduser(name))  # a dataset saved with save_to_disk
    return Source(kind, name, src, tgt)
  from t2t_jax import storage
  path = storage.normalize(name)  # a local folder, or one in a bucket (gs://)
  if not storage.isdir(path):
    raise DataError(f"dataset folder not found: {path} (use --dataset=folder:PATH with "
                    f"files named <split>.<lang>)")
  storage.check_input_dir(path, f"--dataset={spec}")
  if pair:
    src, tgt = pair.split("-", 1)
  else:
    langs = sorted({f.rsplit(".", 1)[1] for f in storage.listdir(path)
                    if "." in f and not f.endswith((".md", ".txt", ".json")) and
                    f.rsplit(".", 1)[1].isalpha() and len(f.rsplit(".", 1)[1]) <= 3})
    if "en" in langs and len(langs) == 2:
      src, tgt = "en", [l for l in langs if l != "en"][0]
    else:
      raise DataError(f"{path}: cannot tell the direction from languages {langs}; "
                      f"add it to the spec, e.g. folder:{name}:en-de")
  return Source("folder", path, src, tgt)


def _treebank_source(spec: str, rest: str) -> Source:
  """`ptb:PATH[+EXTRA...]`: the WSJ treebank's `.mrg` files under PATH (LDC's layout or
  flat), then folders or files of extra training trees (a semi-supervised corpus)."""
  from t2t_jax import parsing, storage
  storage.require_local(rest.split("+"), f"{spec}: a treebank is read from a local folder; "
                        f"copy it to this machine (its WSJ trees are tens of MB)", DataError)
  paths = [os.path.abspath(os.path.expanduser(p)) for p in rest.split("+")]
  for path in paths:
    if not os.path.exists(path):
      raise DataError(f"{spec}: not found: {path} (ptb:PATH takes a folder of wsj_NNNN.mrg "
                      f"files, e.g. Treebank-3's parsed/mrg/wsj)")
  if not parsing.treebank_files(paths[0]):
    raise DataError(f"{spec}: no treebank files (wsj_NNNN.mrg) under {paths[0]}")
  return Source("ptb", "+".join(paths), TREEBANK_SRC, TREEBANK_TGT)


def treebank_pairs(source: Source, split: str, words: bool | str = False
                   ) -> Iterator[tuple[str, str, str]]:
  """A treebank split's (sentence, linearized tree (`words`: with its words; "tags": its
  tags as the sentence and in the words' places), gold tree),
  file by file; the training
  split also has every tree of the extra paths. A tree that does not parse is a one-line
  DataError naming its file and its number."""
  from t2t_jax import parsing
  main, *extra = source.name.split("+")
  try:
    groups = [(f"split {split} of {main}", parsing.split_files(main, split))]
  except parsing.TreeError as e:
    raise DataError(str(e)) from None
  if split == "train":
    groups += [(f"extra trees {path}", parsing.extra_tree_files(path)) for path in extra]
  # What was read, said: a group that gives no tree would make this run another run (WSJ
  # alone under a semi-supervised name) without a word.
  for name, files in groups:
    trees = 0
    for path in files:
      found = 0
      try:
        for example in parsing.iter_examples([path], words):
          found += 1
          yield example
      except parsing.TreeError as e:
        raise DataError(str(e)) from None
      if not found:
        print(f"warning: {path}: no tree (an empty file, or trees of empty elements alone)",
              file=sys.stderr, flush=True)
      trees += found
    if not trees:
      raise DataError(f"ptb:{source.name}: {name}: no tree in {len(files)} file(s)")
    print(f"treebank: {name}: {len(files):,} file(s), {trees:,} trees", file=sys.stderr,
          flush=True)


def treebank_fingerprint(source: Source, splits: list[str]) -> str:
  """The content of a treebank's files of `splits` (and its extra trees)."""
  from t2t_jax import parsing
  main, *extra = source.name.split("+")
  h = hashlib.sha256()
  for split in splits:
    files = parsing.split_files(main, split) + (
        [f for path in extra for f in parsing.extra_tree_files(path)] if split == "train"
        else [])
    for path in files:
      h.update(f"{split}|{os.path.basename(path)}|{file_sha256(path)}\n".encode())
  return h.hexdigest()[:16]


def folder_splits(source: Source) -> list[str]:
  """Splits having files for both languages."""
  from t2t_jax import storage
  files = set(storage.listdir(source.name))
  return sorted(f[:-len(source.src_lang) - 1] for f in files
                if f.endswith("." + source.src_lang) and
                f[:-len(source.src_lang)] + source.tgt_lang in files)


def file_sha256(path: str) -> str:
  from t2t_jax import storage
  h = hashlib.sha256()
  with storage.open_file(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def folder_fingerprint(source: Source, splits: list[str], memo_path: str | None = None) -> str:
  """Identifies the folder's split files by content: the same data remounted or copied (new
  mtimes, another parent folder) finds the cache it prepared, and an edited file does not.

  Each file's hash is remembered in `memo_path` (JSON) under its path, size and mtime, so a
  file is read once after each change, not on every start.
  """
  from t2t_jax import storage
  memo = {}
  if memo_path and os.path.exists(memo_path):
    try:
      with open(memo_path) as f:
        memo = json.load(f)
    except (OSError, ValueError):
      memo = {}  # unreadable: recompute, then rewrite
  h, changed = hashlib.sha256(), False
  for split in splits:
    for lang in (source.src_lang, source.tgt_lang):
      path = storage.normalize(storage.join(source.name, f"{split}.{lang}"))
      stamp = storage.stamp(path)
      if memo.get(path, [None])[0] != stamp:
        memo[path], changed = [stamp, file_sha256(path)], True
      h.update(f"{split}.{lang}|{memo[path][1]}\n".encode())
  if memo_path and changed and os.path.isdir(os.path.dirname(memo_path)):  # creates no cache
    tmp = temporary_name(memo_path)
    with open(tmp, "w") as f:
      json.dump(memo, f, indent=0)
    os.replace(tmp, memo_path)  # a racing writer's entries may be lost: they are recomputed
  return h.hexdigest()[:16]


def iter_pair_files(source: Source, split: str) -> Iterator[tuple[str, str] | None]:
  """Both sides of a folder split, streamed line by line and checked as they come: each
  pair whitespace-stripped (either side may be empty: training drops such pairs, held-out
  splits keep them).

  Invalid UTF-8 or a line count that differs between the two files raises a one-line
  DataError naming the file (and line), wherever in the file it is.
  """
  from t2t_jax import storage
  paths = [storage.join(source.name, f"{split}.{lang}")
           for lang in (source.src_lang, source.tgt_lang)]
  for path in paths:
    if not storage.exists(path):
      raise DataError(f"missing file: {path}")

  def decode(raw: bytes, path: str, number: int) -> str:
    try:
      return raw.decode("utf-8").rstrip("\n").rstrip("\r").strip()
    except UnicodeDecodeError as e:
      raise DataError(f"{path} line {number}: invalid UTF-8 ({e.reason})") from None

  with storage.open_file(paths[0], "rb") as f_src, storage.open_file(paths[1], "rb") as f_tgt:
    for number, (a, b) in enumerate(itertools.zip_longest(f_src, f_tgt), start=1):
      if a is None or b is None:
        counts = [number - 1 + (a is not None) + sum(1 for _ in f_src),
                  number - 1 + (b is not None) + sum(1 for _ in f_tgt)]
        raise DataError(f"line counts differ: {paths[0]} has {counts[0]} lines, "
                        f"{paths[1]} has {counts[1]}")
      src, tgt = decode(a, paths[0], number), decode(b, paths[1], number)
      yield src, tgt


def iter_tfds_pairs(name: str, split: str, src_lang: str, tgt_lang: str, data_dir: str | None,
                    download: bool = True) -> Iterator[tuple[str, str] | None]:
  """The pairs of a tfds split as text, streamed and keyed by language (so direction is
  explicit); a side may be empty (the reader decides what to keep)."""
  tfds = _optional("tensorflow_datasets", "tfds", "the tfds: source")
  try:
    builder = tfds.builder(name, data_dir=data_dir)
    if download:
      _check_tfds_room(name, builder)
      builder.download_and_prepare()
    ds = builder.as_dataset(split=split, shuffle_files=False)
  except DataError:
    raise
  except Exception as e:  # tfds raises many types; one line is what a user needs
    raise DataError(f"tfds:{name} split {split!r}: {type(e).__name__}: "
                    f"{_tfds_message(str(e))}{hub_fallback(name, src_lang, tgt_lang)}"
                    ) from None
  for ex in tfds.as_numpy(ds):
    if src_lang not in ex or tgt_lang not in ex:
      raise DataError(f"tfds:{name} has features {sorted(ex)}, not {src_lang}-{tgt_lang}")
    src, tgt = ex[src_lang].decode("utf-8").strip(), ex[tgt_lang].decode("utf-8").strip()
    yield src, tgt


def _check_tfds_room(name: str, builder: Any) -> None:
  """Before tfds downloads and builds `name`: a line with its catalog sizes (download and
  built dataset, tfds's own figures) and the free disk where they go, and a one-line error
  when the disk holds less than both together (archives are extracted beside the downloads,
  so the peak is higher still). Nothing for a dataset already built."""
  from t2t_jax import storage
  prepared = getattr(builder, "is_prepared", None)
  if callable(prepared) and prepared():
    return
  info = getattr(builder, "info", None)
  download = int(getattr(info, "download_size", 0) or 0)
  built = int(getattr(info, "dataset_size", 0) or 0)
  where = str(getattr(builder, "data_dir", "") or "")
  existing = where
  while existing and not storage.exists(existing) and os.path.dirname(existing) != existing:
    existing = os.path.dirname(existing)
  free = storage.free_bytes(existing) if existing else None
  sizes = (f"downloads {_gib(download)} and builds {_gib(built)} (tfds's catalog)"
           if download or built else "gives no sizes in its catalog")
  room = f"; {_gib(free)} free at {existing}" if free is not None else ""
  print(f"tfds:{name} {sizes}{room}", file=sys.stderr, flush=True)
  if free is not None and download + built > free:
    raise DataError(f"tfds:{name} needs at least {_gib(download + built)} (download "
                    f"{_gib(download)} + build {_gib(built)}) but {existing} has {_gib(free)} "
                    f"free: point T2T_JAX_DATA_DIR (or data.data_dir) at a larger disk")


def _gib(n: int) -> str:
  return f"{n / 2**30:.1f} GiB"


_TFDS_WMT = re.compile(r"^wmt(1[3-9])_translate/([a-z]{2}-[a-z]{2})$")


def hub_fallback(name: str, src_lang: str, tgt_lang: str) -> str:
  """For a tfds WMT corpus (whose downloads from statmt.org fail often), the same corpus
  from the Hugging Face hub as a spec to try instead; else nothing."""
  m = _TFDS_WMT.match(name)
  if not m:
    return ""
  return (f". The same corpus from the Hugging Face hub: --dataset=hf:wmt/wmt{m.group(1)}/"
          f"{m.group(2)}:{src_lang}-{tgt_lang} (pip install -e \".[hf]\")")


def _tfds_message(text: str, most: int = 20) -> str:
  """tfds's error as one line, unless it says what to download by hand (datasets with a
  manual download): then every line of those instructions, which a user cannot do without."""
  lines = [l.rstrip() for l in text.splitlines() if l.strip()]
  if not lines:
    return ""
  if len(lines) > 1 and re.search(r"manual|download", text, re.IGNORECASE):
    return "\n".join(lines[:most])
  return lines[0]


def _optional(module: str, extra: str, what: str) -> Any:
  """An optional dependency, or a one-line error naming the extra that installs it."""
  import importlib
  try:
    return importlib.import_module(module)
  except ImportError:
    raise DataError(f"{what} needs {module}, which is not installed: pip install -e "
                    f"\".[{extra}]\" (or give the corpus as --dataset=folder:PATH)") from None


def hf_name_and_config(name: str) -> tuple[str, str | None]:
  """`org/name/config` -> ("org/name", "config"); `org/name` or `name` has no config. A
  local folder (saved with `save_to_disk`) is its own name."""
  if os.path.isdir(name):
    return name, None
  parts = name.split("/")
  return ("/".join(parts[:2]), "/".join(parts[2:])) if len(parts) > 2 else (name, None)


def iter_hf_pairs(name: str, split: str, src_lang: str, tgt_lang: str
                  ) -> Iterator[tuple[str, str] | None]:
  """The pairs of a Hugging Face `datasets` split, streamed: a Hub dataset (downloaded and
  cached by `datasets`) or a folder written by `save_to_disk`. Rows are either translation
  dicts (`{"translation": {"en": ..., "de": ...}}`, the Hub's translation datasets) or one
  column per language. A side may be empty (the reader decides what to keep)."""
  datasets = _optional("datasets", "hf", "the hf: source")
  repo, config = hf_name_and_config(name)
  try:
    if os.path.isdir(repo):
      loaded = datasets.load_from_disk(repo)
      if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
          raise KeyError(f"no split {split!r}; it has {sorted(loaded)}")
        loaded = loaded[split]
      elif split != "train":
        raise KeyError(f"a single saved split holds only 'train', not {split!r}")
      rows = iter(loaded)
    else:
      rows = iter(datasets.load_dataset(repo, config, split=split, streaming=True))
    first = next(rows, None)
  except Exception as e:  # datasets raises many types; one line is what a user needs
    raise DataError(f"hf:{name} split {split!r}: {type(e).__name__}: "
                    f"{str(e).splitlines()[0] if str(e) else ''}") from None
  if first is None:
    return
  for row in itertools.chain([first], rows):
    pair = row.get("translation", row)
    if src_lang not in pair or tgt_lang not in pair:
      raise DataError(f"hf:{name} rows have {sorted(pair)}, not {src_lang} and {tgt_lang}")
    src, tgt = str(pair[src_lang]).strip(), str(pair[tgt_lang]).strip()
    yield src, tgt


# ---------------------------------------------------------------------------
# The demo language pair: a made-up source language (SVO, adjectives before
# nouns, prepositions) and a made-up target language (SOV, adjectives after
# nouns, postpositions, articles/adjectives agreeing with the noun's gender and
# number, verbs agreeing with the subject's number). A deterministic function
# of the seed: a tiny model can learn it in minutes, and BLEU means something.

DEMO_SRC, DEMO_TGT = "src", "tgt"
DEMO_SIZES = {"train": 30000, "valid": 500, "test": 500}
_CONSONANTS, _VOWELS = "bdfgklmnprstvz", "aeiou"


def _word(rng: random.Random, syllables: int) -> str:
  return "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(syllables))


def _lexicon(rng: random.Random, n: int, taken: set[str]) -> list[tuple[str, str]]:
  pairs = []
  while len(pairs) < n:
    s, t = _word(rng, rng.randint(1, 3)), _word(rng, rng.randint(1, 3))
    if s not in taken and t not in taken and s != t:
      taken.update((s, t))
      pairs.append((s, t))
  return pairs


def demo_corpus(seed: int = 0) -> dict[str, tuple[list[str], list[str]]]:
  """{split: (source lines, target lines)}; held-out splits share no pair with train."""
  rng = random.Random(seed)
  taken: set[str] = {"ta", "u", "lo", "la", "los", "las", "un", "una", "unos", "unas"}
  nouns = [(s, t, rng.choice("mf")) for s, t in _lexicon(rng, 150, taken)]
  adjectives = _lexicon(rng, 60, taken)
  verbs = _lexicon(rng, 60, taken)
  adverbs = _lexicon(rng, 20, taken)
  preps = _lexicon(rng, 10, taken)
  # Source: "the"/"a"/number words; target articles depend on gender and number.
  src_det = {"def": "ta", "indef": "u"}
  tgt_det = {("def", "m", "sg"): "lo", ("def", "f", "sg"): "la", ("def", "m", "pl"): "los",
             ("def", "f", "pl"): "las", ("indef", "m", "sg"): "un", ("indef", "f", "sg"): "una",
             ("indef", "m", "pl"): "unos", ("indef", "f", "pl"): "unas"}

  def noun_phrase():
    noun_s, noun_t, gender = rng.choice(nouns)
    number = rng.choice(["sg", "sg", "pl"])
    det = rng.choice(["def", "indef"])
    adjs = rng.sample(adjectives, rng.choice([0, 0, 1, 1, 2]))
    src = [src_det[det]] + [a for a, _ in adjs] + [noun_s + ("s" if number == "pl" else "")]
    # Target: article, noun (+ plural "-en"), adjectives agreeing: -o/-a (+ "s").
    tgt = [tgt_det[(det, gender, number)], noun_t + ("en" if number == "pl" else "")]
    tgt += [t + ("o" if gender == "m" else "a") + ("s" if number == "pl" else "")
            for _, t in reversed(adjs)]
    return src, tgt, number

  def sentence():
    subj_s, subj_t, number = noun_phrase()
    verb_s, verb_t = rng.choice(verbs)
    obj_s, obj_t, _ = noun_phrase()
    src = subj_s + [verb_s + ("" if number == "pl" else "s")] + obj_s
    tail_t = []
    if rng.random() < 0.4:
      prep_s, prep_t = rng.choice(preps)
      pp_s, pp_t, _ = noun_phrase()
      src += [prep_s] + pp_s
      tail_t += pp_t + [prep_t]
    adverb = rng.choice(adverbs) if rng.random() < 0.3 else None
    if adverb:
      src.append(adverb[0])
      tail_t.append(adverb[1])
    tgt = subj_t + obj_t + tail_t + [verb_t + ("n" if number == "pl" else "t")]
    return " ".join(src) + ".", " ".join(tgt) + "."

  out: dict[str, tuple[list[str], list[str]]] = {}
  seen: set[str] = set()
  for split in ("test", "valid", "train"):
    src_lines, tgt_lines = [], []
    while len(src_lines) < DEMO_SIZES[split]:
      s, t = sentence()
      if split != "train" and s in seen:
        continue
      if split == "train" and s in seen:
        continue  # keep held-out sentences out of training
      seen.add(s)
      src_lines.append(s)
      tgt_lines.append(t)
    out[split] = (src_lines, tgt_lines)
  return out


def temporary_name(path: str) -> str:
  """A sibling of `path` no other process (on this host or another sharing the disk) uses."""
  from t2t_jax import storage
  return storage.temporary_name(path)


def remove_dead_temporaries(path: str) -> list[str]:
  """Removes the `temporary_name(path)` folders of processes of this host that are gone (a
  killed preparation's leftovers); returns them. Other hosts' temporaries are left alone."""
  import shutil
  import socket
  parent, base = os.path.split(path)
  prefix = f"{base}.tmp-{socket.gethostname()}-"
  removed = []
  for name in os.listdir(parent) if os.path.isdir(parent) else []:
    if not name.startswith(prefix):
      continue
    pid = name[len(prefix):].split("-")[0]
    if not pid.isdigit() or int(pid) == os.getpid():
      continue
    try:
      os.kill(int(pid), 0)
      continue  # still running
    except ProcessLookupError:
      pass
    except PermissionError:
      continue  # someone else's live process
    shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
    removed.append(name)
  return removed


@contextlib.contextmanager
def host_lock(path: str) -> Iterator[None]:
  """An exclusive `flock` on `path` for the block: processes of one machine that share a
  folder take turns. Where the filesystem has no locks (some FUSE mounts), the block runs
  unlocked; `publish_dir` still keeps one complete result."""
  import fcntl
  try:
    f = open(path, "a")
  except OSError:
    yield
    return
  with f:
    try:
      fcntl.flock(f, fcntl.LOCK_EX)
    except OSError:
      pass
    yield


def publish_dir(tmp: str, path: str, marker: str | None = None) -> None:
  """Renames the finished directory `tmp` to `path`; if another process published `path`
  first, keeps theirs and removes `tmp`. With `marker` (a file every finished directory has),
  a `path` without it is an incomplete leftover (an interrupted copy, a non-atomic rename):
  it is replaced, not kept."""
  import errno
  import shutil
  import uuid
  try:
    os.replace(tmp, path)
  except OSError as e:
    if e.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not os.path.isdir(path):
      raise
    if marker and not os.path.exists(os.path.join(path, marker)):
      aside = f"{path}.incomplete-{uuid.uuid4().hex[:8]}"
      os.replace(path, aside)
      os.replace(tmp, path)
      shutil.rmtree(aside, ignore_errors=True)
      return
    shutil.rmtree(tmp, ignore_errors=True)


def write_demo_folder(path: str, seed: int = 0) -> None:
  """Writes the demo corpus as `<split>.src` / `<split>.tgt` files, atomically."""
  if os.path.isdir(path):
    return
  tmp = temporary_name(path)
  os.makedirs(tmp, exist_ok=True)
  for split, (src, tgt) in demo_corpus(seed).items():
    for lang, lines in ((DEMO_SRC, src), (DEMO_TGT, tgt)):
      with open(os.path.join(tmp, f"{split}.{lang}"), "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
  publish_dir(tmp, path)
