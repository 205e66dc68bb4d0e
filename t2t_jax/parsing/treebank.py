"""Treebank folders and their splits (LDC's Treebank-3 layout by WSJ section, NLTK's 10%
sample by file, extra trees beside them), read as examples: a sentence, its target in one
of the forms, and the gold tree."""

from __future__ import annotations

import os
import re
from typing import Iterator, Sequence

from t2t_jax.parsing.brackets import linearize
from t2t_jax.parsing.labels import to_labels
from t2t_jax.parsing.trees import Tree, TreeError, preprocess, read_trees

# LDC's WSJ split (sections), as the paper and the parsing literature use it.
SECTION_SPLITS = {"train": range(2, 22), "dev": range(22, 23), "test": range(23, 24)}
# The split of NLTK's 10% sample (wsj_0001-0199, sections 00-01) by file, keeping articles
# whole: ../shared/data/ptb_wsj_sample/README.md (train 3,396 trees, dev 273, test 245).
SAMPLE_SPLITS = {"train": range(1, 160), "dev": range(160, 180), "test": range(180, 200)}
_WSJ_FILE = re.compile(r"wsj_(\d{4})\.mrg$")


def treebank_files(path: str) -> list[tuple[int, str]]:
  """(file number, path) of every `wsj_NNNN.mrg` under `path` (LDC's `parsed/mrg/wsj/SS/`
  folders, or flat), sorted by number."""
  found = []
  for root, dirs, files in os.walk(path):
    dirs.sort()
    for name in files:
      m = _WSJ_FILE.search(name)
      if m:
        found.append((int(m.group(1)), os.path.join(root, name)))
  return sorted(found)


def split_ranges(files: Sequence[tuple[int, str]]) -> tuple[str, dict[str, range]]:
  """LDC's sections 02-21 / 22 / 23 when the files reach past section 01, else the sample's
  file ranges; (which, {split: file numbers or sections})."""
  if any(number // 100 >= 2 for number, _ in files):
    return "sections", SECTION_SPLITS
  return "sample", SAMPLE_SPLITS


def split_files(path: str, split: str) -> list[str]:
  files = treebank_files(path)
  if not files:
    raise TreeError(f"no treebank files (wsj_NNNN.mrg) under {path}")
  which, ranges = split_ranges(files)
  if split not in ranges:
    raise TreeError(f"a treebank has the splits {', '.join(ranges)}, not {split!r}")
  key = (lambda n: n // 100) if which == "sections" else (lambda n: n)
  return [p for n, p in files if key(n) in ranges[split]]


def extra_tree_files(path: str) -> list[str]:
  """Every file of trees under `path` (extra training trees, e.g. a semi-supervised corpus):
  `.mrg` files, or any file with one bracketed tree per line."""
  if os.path.isfile(path):
    return [path]
  out = []
  for root, dirs, files in os.walk(path):
    dirs.sort()
    out += [os.path.join(root, f) for f in sorted(files) if not f.startswith(".")
            and not f.lower().endswith((".md", ".txt.md", ".json"))]
  return out


def iter_file_trees(path: str) -> Iterator[Tree]:
  """The preprocessed trees of one file, streamed file by file (memory: one file)."""
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
  except UnicodeDecodeError as e:
    raise TreeError(f"{path}: invalid UTF-8 ({e.reason})") from None
  for tree in read_trees(text, path):
    cleaned = preprocess(tree)
    if cleaned is not None:
      yield cleaned


def iter_examples(paths: Sequence[str], words: bool | str = False
                  ) -> Iterator[tuple[str, str, str]]:
  """(sentence, target symbols, gold tree) for every tree of `paths`: the sentence is the
  tree's words, the target its linearization (`words`: with the words, not XX), the gold
  tree its one-line bracketing. `words="tags"`: the sentence is the tree's gold POS tags
  and the target carries them in the words' places (the gold tree keeps its words).
  `words="labels"`: the target is a label per word (`to_labels`); "word_labels": with the
  words between the labels; "tagged_word_labels": each word's POS tag after it."""
  for path in paths:
    for tree in iter_file_trees(path):
      sentence = [t for _, t in tree.leaves()] if words == "tags" else tree.words()
      target = (to_labels(tree, words != "labels", words == "tagged_word_labels")
                if words in ("labels", "word_labels", "tagged_word_labels")
                else linearize(tree, words))
      yield " ".join(sentence), " ".join(target), tree.to_string()
