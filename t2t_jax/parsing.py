"""English constituency parsing as translation (paper section 6.3, Table 4).

Everything parsing needs, in the order a tree travels: treebank files in (LDC's
Treebank-3 layout or a flat folder such as NLTK's 10% sample), the preprocessing of
the parsing literature, a tree as a sequence of labelled brackets (Vinyals & Kaiser et
al. 2014, "Grammar as a Foreign Language": POS tags as one symbol `XX`) or as one label
per word (Gómez-Rodríguez & Vilares 2018), decoder constraints that only extend prefixes
of well-formed trees over the input's words, the sequence back to a tree, and bracket
scoring as EVALB computes it with COLLINS.prm.

The rest of the code knows parsing only as a `tasks.Task`; this module imports nothing
from t2t_jax but `errors`.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Iterable, Iterator, Sequence

from t2t_jax.errors import UserError
from t2t_jax.special_tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

# ---------------------------------------------------------------------------------------
# Trees


@dataclasses.dataclass
class Tree:
  """A constituent: its label and children; a preterminal has one child, its word (str)."""
  label: str
  children: list  # list[Tree] or [word]

  @property
  def is_preterminal(self) -> bool:
    return len(self.children) == 1 and isinstance(self.children[0], str)

  def leaves(self) -> list[tuple[str, str]]:
    """(word, POS tag) of every word, left to right."""
    if self.is_preterminal:
      return [(self.children[0], self.label)]
    return [leaf for child in self.children for leaf in child.leaves()]

  def words(self) -> list[str]:
    return [w for w, _ in self.leaves()]

  def to_string(self) -> str:
    """The treebank's bracketing on one line: `(S (NP (DT The) (NN cat)) ...)`."""
    if self.is_preterminal:
      return f"({self.label} {self.children[0]})"
    return f"({self.label} " + " ".join(c.to_string() for c in self.children) + ")"


class TreeError(UserError):
  """A tree that does not parse: one line naming where it is."""


_TOKEN = re.compile(r"\(|\)|[^\s()]+")


def read_trees(text: str, name: str) -> Iterator[Tree]:
  """The trees of a treebank file's text (`.mrg`: one or more, each `( (S ...) )`), in order.
  Unbalanced brackets or an empty tree raise a TreeError naming `name` and the tree."""
  tokens = _TOKEN.findall(text)
  i, number = 0, 0
  while i < len(tokens):
    number += 1
    if tokens[i] != "(":
      raise TreeError(f"{name}: tree {number}: expected '(' but found {tokens[i]!r}")
    tree, i = _parse(tokens, i, name, number)
    yield tree


def _parse(tokens: list[str], i: int, name: str, number: int) -> tuple[Tree, int]:
  """The tree opening at tokens[i] == '(' and the index after its ')' (iterative: WSJ trees
  nest deeper than is comfortable for recursion on small stacks)."""
  stack: list[Tree] = []
  while i < len(tokens):
    tok = tokens[i]
    if tok == "(":
      label = ""
      if i + 1 < len(tokens) and tokens[i + 1] not in "()":
        label, i = tokens[i + 1], i + 1
      stack.append(Tree(label, []))
    elif tok == ")":
      if not stack:
        raise TreeError(f"{name}: tree {number}: unbalanced brackets (a ')' closes nothing)")
      done = stack.pop()
      if not done.children:
        raise TreeError(f"{name}: tree {number}: empty constituent ({done.label or 'no label'})")
      if stack:
        stack[-1].children.append(done)
      else:
        return done, i + 1
    else:
      if not stack:
        raise TreeError(f"{name}: tree {number}: a word outside any bracket ({tok!r})")
      stack[-1].children.append(tok)
      if len(stack[-1].children) > 1 and any(isinstance(c, Tree) for c in stack[-1].children):
        raise TreeError(f"{name}: tree {number}: word {tok!r} beside constituents")
    i += 1
  raise TreeError(f"{name}: tree {number}: unbalanced brackets (unclosed at end of file)")


# Empty elements (traces, null complementisers) are preterminals with this tag.
EMPTY_TAG = "-NONE-"


def strip_label(label: str) -> str:
  """`NP-SBJ-1` -> `NP`, `NP=2` -> `NP`: function tags, co-indices and gap indices go. POS
  tags such as `-LRB-` and `-NONE-`, which begin with '-', are kept whole."""
  if label.startswith("-"):
    return label
  return re.split(r"[-=]", label, maxsplit=1)[0] or label


def preprocess(tree: Tree) -> Tree | None:
  """As the parsing literature prepares the WSJ treebank: empty elements (`-NONE-`) removed,
  with every constituent they leave empty; function tags and indices stripped; the
  treebank's unlabelled outer bracket `( (S ...) )` dropped (relabelled TOP if it holds
  more than one constituent). None when nothing but empty elements is left."""
  cleaned = _clean(tree)
  if cleaned is None:
    return None
  if cleaned.label == "":
    cleaned = cleaned.children[0] if len(cleaned.children) == 1 else Tree("TOP",
                                                                           cleaned.children)
  return cleaned


def _clean(tree: Tree) -> Tree | None:
  if tree.is_preterminal:
    return None if tree.label == EMPTY_TAG else Tree(tree.label, list(tree.children))
  kids = [c for c in (_clean(child) for child in tree.children) if c is not None]
  return Tree(strip_label(tree.label), kids) if kids else None


# ---------------------------------------------------------------------------------------
# A tree as a sequence of symbols, and back (Vinyals & Kaiser et al. 2014)

WORD = "XX"  # every word's POS tag as one symbol


def linearize(tree: Tree, words: bool | str = False) -> list[str]:
  """`(S (NP (DT The) (NN cat)) (VP (VBD sat)))` -> `(S (NP XX XX )NP (VP XX )VP )S`, or
  with `words`, `(S (NP The cat )NP (VP sat )VP )S`; with `words="tags"`, the tags in the
  words' places: `(S (NP DT NN )NP (VP VBD )VP )S`."""
  if tree.is_preterminal:
    return [tree.label if words == "tags" else tree.children[0] if words else WORD]
  return ["(" + tree.label] + [s for c in tree.children for s in linearize(c, words)] + \
      [")" + tree.label]


def is_bracket(symbol: str) -> bool:
  return symbol_kind(symbol)[0] in ("open", "close")


def symbol_kind(symbol: str) -> tuple[str, str]:
  """('open'|'close'|'word'|'other', label)."""
  if symbol == WORD:
    return "word", ""
  if len(symbol) > 1 and symbol[0] == "(":
    return "open", symbol[1:]
  if len(symbol) > 1 and symbol[0] == ")":
    return "close", symbol[1:]
  return "other", ""


def is_well_formed(symbols: Sequence[str], num_words: int) -> bool:
  """One rooted tree, brackets balanced and matching, every constituent holding a word,
  exactly `num_words` word slots, nothing else."""
  stack, words, roots, last = [], 0, 0, None
  for s in symbols:
    kind, label = symbol_kind(s)
    if kind == "open":
      if not stack:
        roots += 1
      stack.append(label)
    elif kind == "close":
      if not stack or stack[-1] != label or last == "open":
        return False
      stack.pop()
    elif kind == "word":
      if not stack:
        return False
      words += 1
    else:
      return False
    last = kind
  return not stack and roots == 1 and words == num_words


def copies_words(symbols: Sequence[str], words: Sequence[str]) -> bool:
  """Whether the words among a decoded sequence's symbols (neither bracket nor label) are
  the sentence's, in order; `XX` (a word the vocabulary cannot spell) matches any word."""
  written = [s for s in symbols if not is_bracket(s) and not is_label(s)]
  return len(written) == len(words) and all(w in (WORD, word) for w, word in zip(written, words))


def as_word_slots(symbols: Sequence[str]) -> list[str]:
  """A decoded sequence with every word (neither bracket nor label) as `XX`: the tree takes
  the sentence's own words."""
  return [s if is_bracket(s) or is_label(s) else WORD for s in symbols]


def repair(symbols: Sequence[str], num_words: int, root: str = "S") -> list[str]:
  """A fixed rule that makes any symbol sequence a well-formed tree over `num_words` words:
  other symbols are dropped; a ')' that matches an open bracket closes every bracket down
  to it, one that matches none is dropped; word slots past `num_words` are dropped, missing
  ones are added inside the innermost open bracket (the root at the end); brackets left
  open are closed; several roots, or words outside every bracket, are wrapped in one `root`
  bracket; constituents without a word are removed."""
  out, stack, words = [], [], 0
  for s in symbols:
    kind, label = symbol_kind(s)
    if kind == "open":
      out.append(s)
      stack.append(label)
    elif kind == "close" and label in stack:
      while stack:
        top = stack.pop()
        out.append(")" + top)
        if top == label:
          break
    elif kind == "word" and words < num_words:
      out.append(s)
      words += 1
  out.extend([WORD] * (num_words - words))
  out.extend(")" + label for label in reversed(stack))
  tree = _from_symbols(out)
  if tree is None or len(tree) != 1 or isinstance(tree[0], str):
    out = ["(" + root] + out + [")" + root]
  return _without_empty(out)


def _from_symbols(symbols: Sequence[str]) -> list | None:
  """Top-level items of a balanced sequence: nested lists for brackets, WORD for words."""
  stack: list[list] = [[]]
  for s in symbols:
    kind, _ = symbol_kind(s)
    if kind == "open":
      stack.append([s])
    elif kind == "close":
      if len(stack) == 1:
        return None
      done = stack.pop()
      stack[-1].append(done)
    else:
      stack[-1].append(WORD)
  return stack[0] if len(stack) == 1 else None


def _without_empty(symbols: Sequence[str]) -> list[str]:
  """The sequence with every bracket that holds no word removed (balanced input)."""
  out: list[str] = []
  opened: list[tuple[int, int]] = []  # (index in out, words in out when opened)
  words = 0
  for s in symbols:
    kind, _ = symbol_kind(s)
    if kind == "open":
      opened.append((len(out), words))
      out.append(s)
    elif kind == "close":
      start, words_then = opened.pop()
      if words == words_then:
        del out[start:]
      else:
        out.append(s)
    else:
      out.append(s)
      words += 1
  return out


def to_tree(symbols: Sequence[str], words: Sequence[str], tags: Sequence[str] | None = None
            ) -> Tree:
  """A well-formed symbol sequence as a tree over `words`, the i-th `XX` taking the i-th word
  and its tag (`tags`, e.g. the gold tags; else XX)."""
  tags = tags or [WORD] * len(words)
  stack: list[Tree] = [Tree("", [])]
  index = 0
  for s in symbols:
    kind, label = symbol_kind(s)
    if kind == "open":
      stack.append(Tree(label, []))
    elif kind == "close":
      done = stack.pop()
      stack[-1].children.append(done)
    elif kind == "word":
      stack[-1].children.append(Tree(tags[index], [words[index]]))
      index += 1
  return stack[0].children[0]


def with_top(tree: Tree) -> str:
  """The tree as one line under a TOP bracket, which EVALB's COLLINS.prm ignores: what
  `--mode=eval` writes for a user's own EVALB run."""
  return Tree("TOP", [tree]).to_string()


# ---------------------------------------------------------------------------------------
# A tree as one label per word, and back (Gómez-Rodríguez & Vilares 2018, "Constituent
# Parsing as Sequence Labeling", relative scale)
#
# Word i < n gets `@{r}:{C}`: C is the label of the lowest constituent holding both word i
# and word i+1, and r how many constituents above the words that pair shares beyond the
# pair before it (its depth minus the previous pair's; the first pair's counts from 0).
# A chain of single-child constituents is one node (`S+VP`); the chain above a word's POS
# tag rides on its own label (`/NP`). The last word gets `@end`. A sequence as long as the
# sentence, each symbol about one word: the i-th output lines up with the i-th input. With
# the words (`words=True`), each pair's label comes right after the pair's second word,
# `The cat @+2:NP sat @-1:S @end/VP`: the decoder has read both words it labels, and the
# constrained search copies the words from the input.

LAST_LABEL = "@end"
_PAIR_LABEL = re.compile(r"^@([+-]\d+):([^/\s]+)(?:/(\S+))?$")
_LAST = re.compile(r"^@end(?:/(\S+))?$")


def _collapsed(tree: Tree) -> tuple:
  """("leaf", word, tag, unary chain) or ("node", chain label, children), unary chains
  joined with '+'."""
  if tree.is_preterminal:
    return ("leaf", tree.children[0], tree.label, "")
  labels = [tree.label]
  while len(tree.children) == 1 and not tree.children[0].is_preterminal:
    tree = tree.children[0]
    labels.append(tree.label)
  if len(tree.children) == 1:  # a chain that ends above one word
    word = tree.children[0]
    return ("leaf", word.children[0], word.label, "+".join(labels))
  return ("node", "+".join(labels), [_collapsed(c) for c in tree.children])


def to_labels(tree: Tree, words: bool = False) -> list[str]:
  """`(S (NP (DT The) (NN cat)) (VP (VBD sat)))` -> `@+2:NP @-1:S @end/VP`, or with
  `words`, `The cat @+2:NP sat @-1:S @end/VP`."""
  leaves: list[tuple[str, list]] = []  # (unary chain, path of (node, label) from the root)

  def walk(node: tuple, path: list) -> None:
    if node[0] == "leaf":
      leaves.append((node[3], path))
      return
    for child in node[2]:
      walk(child, path + [(id(node), node[1])])

  walk(_collapsed(tree), [])
  out, previous = [], 0
  for (unary, a), (_, b) in zip(leaves, leaves[1:]):
    shared = 0
    while shared < min(len(a), len(b)) and a[shared][0] == b[shared][0]:
      shared += 1
    out.append(f"@{shared - previous:+d}:{a[shared - 1][1]}" + (f"/{unary}" if unary else ""))
    previous = shared
  out.append(LAST_LABEL + (f"/{leaves[-1][0]}" if leaves[-1][0] else ""))
  if not words:
    return out
  sentence = tree.words()
  return sentence[:1] + [s for pair in zip(sentence[1:], out) for s in pair] + out[-1:]


def label_kind(symbol: str) -> tuple[str, int, str, str]:
  """('pair'|'last'|'other', depth change, constituent label, unary chain)."""
  m = _PAIR_LABEL.match(symbol)
  if m:
    return "pair", int(m.group(1)), m.group(2), m.group(3) or ""
  m = _LAST.match(symbol)
  if m:
    return "last", 0, "", m.group(1) or ""
  return "other", 0, "", ""


def labels_well_formed(symbols: Sequence[str], num_words: int, words: bool = False) -> bool:
  """A label per word: `num_words - 1` pair labels whose depth never falls below the root,
  then one last-word label, nothing else; with `words`, each pair's label right after its
  second word (any other symbol is a word; `copies_words` checks which)."""
  want = ["pair"] * (num_words - 1) + ["last"]
  if words:
    want = ["other"] + [k for pair in zip(["other"] * (num_words - 1), want) for k in pair] + \
        ["last"]
  if len(symbols) != len(want) or num_words < 1:
    return False
  depth = 0
  for s, expected in zip(symbols, want):
    kind, change, _, _ = label_kind(s)
    if kind != expected:
      return False
    depth += change
    if depth < 1 and kind == "pair":
      return False
  return True


def repair_labels(symbols: Sequence[str], num_words: int, root: str = "S") -> list[str]:
  """A fixed rule that makes any symbol sequence a label per word: other symbols (words)
  dropped; the first `num_words - 1` pair labels kept, missing ones `@+0:root` (the word
  joins the current constituent); the first last-word label kept, else `@end`. (Depths
  below the root are read as the root by `from_labels`.)"""
  pairs = [s for s in symbols if label_kind(s)[0] == "pair"][:max(num_words - 1, 0)]
  pairs += [f"@+0:{root}"] * (num_words - 1 - len(pairs))
  lasts = [s for s in symbols if label_kind(s)[0] == "last"]
  return pairs + [lasts[0] if lasts else LAST_LABEL]


def from_labels(symbols: Sequence[str], words: Sequence[str],
                tags: Sequence[str] | None = None) -> Tree:
  """The tree of a label per word over `words` (tags: e.g. the gold POS tags; else XX);
  any depth below the root is read as the root."""
  tags = tags or [WORD] * len(words)

  def leaf(i: int, unary: str) -> Tree:
    node = Tree(tags[i], [words[i]])
    for label in reversed(unary.split("+") if unary else []):
      node = Tree(label, [node])
    return node

  path: list[Tree] = []  # open constituents, root first; a None label is not known yet
  depth = 0
  for i, symbol in enumerate(symbols):
    kind, change, label, unary = label_kind(symbol)
    if kind != "pair":
      if not path:  # a one-word sentence
        return leaf(i, unary)
      path[-1].children.append(leaf(i, unary))
      break
    depth = max(1, depth + change)
    while len(path) < depth:
      node = Tree(None, [])
      if path:
        path[-1].children.append(node)
      path.append(node)
    path[-1].children.append(leaf(i, unary))
    del path[depth:]
    path[-1].label = label
  return _expanded(path[0])


def _expanded(node: Tree) -> Tree:
  """Joined chains (`S+VP`) as constituents again; a constituent whose label no pair gave
  (it has one child then) gives way to its child."""
  if node.is_preterminal:
    return node
  children = [_expanded(c) for c in node.children]
  if node.label is None:
    return children[0]
  labels = node.label.split("+")
  out = Tree(labels[-1], children)
  for label in reversed(labels[:-1]):
    out = Tree(label, [out])
  return out


def is_label(symbol: str) -> bool:
  return label_kind(symbol)[0] != "other"


def label_symbols(targets: Iterable[str]) -> list[str]:
  """Every label of the `targets` (a label per word), sorted: the pieces a vocabulary holds
  whole."""
  return sorted({s for line in targets for s in line.split() if label_kind(s)[0] != "other"}
                | {LAST_LABEL})


# ---------------------------------------------------------------------------------------
# Treebank folders and their splits

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
  words between the labels."""
  for path in paths:
    for tree in iter_file_trees(path):
      sentence = [t for _, t in tree.leaves()] if words == "tags" else tree.words()
      target = (to_labels(tree, words == "word_labels") if words in ("labels", "word_labels")
                else linearize(tree, words))
      yield " ".join(sentence), " ".join(target), tree.to_string()


# ---------------------------------------------------------------------------------------
# Bracket scoring as EVALB computes it with COLLINS.prm (Sekine & Collins 1997)

# COLLINS.prm: preterminals with these tags are deleted with their words; brackets with these
# labels are not counted (TOP: the outer bracket).
DELETE_LABELS = frozenset({"TOP", "-NONE-", ",", ":", "``", "''", "."})
DELETE_FOR_LENGTH = frozenset({"-NONE-"})  # not counted in a sentence's length
EQUAL_LABELS = {"PRT": "ADVP"}              # EQ_LABEL ADVP PRT
CUTOFF_LEN = 40                             # the "len<=40" figures


@dataclasses.dataclass
class _Read:
  words: list[tuple[str, str]]               # (word, tag) kept after deletion
  brackets: list[tuple[int, int, str]]       # (start, end, label) as EVALB stores them
  length: int                                # words not in DELETE_FOR_LENGTH


def _evalb_read(line: str) -> _Read:
  """One tree line as EVALB's read_line reads it: terminals with delete labels vanish (the
  word positions close up), every other bracket spans [first word, last word + 1)."""
  tokens = _TOKEN.findall(line)
  words: list[tuple[str, str]] = []
  brackets: list[list] = []
  stack: list[int] = []
  length, i = 0, 0
  while i < len(tokens):
    tok = tokens[i]
    if tok == "(":
      label = tokens[i + 1] if i + 1 < len(tokens) and tokens[i + 1] not in "()" else ""
      j = i + 1 + (label != "")
      if label and j + 1 < len(tokens) and tokens[j] not in "()" and tokens[j + 1] == ")":
        word = tokens[j]  # a terminal: (TAG word)
        if label not in DELETE_FOR_LENGTH:
          length += 1
        if label not in DELETE_LABELS:
          words.append((word, label))
        i = j + 2
        continue
      brackets.append([len(words), -1, label])
      stack.append(len(brackets) - 1)
      i = j
      continue
    if tok == ")":
      if not stack:
        raise TreeError("unbalanced brackets (too many close brackets)")
      brackets[stack.pop()][1] = len(words)
    else:
      raise TreeError(f"a word outside a terminal bracket: {tok!r}")
    i += 1
  if stack:
    raise TreeError("unbalanced brackets (too many open brackets)")
  return _Read(words, [tuple(b) for b in brackets], length)


def _counted(brackets: Iterable[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
  """Brackets EVALB counts, their labels as it compares them: not zero-width, the label cut
  at its first '-' or '=' (modify_label) and not deleted, then EQ_LABEL's equal labels as
  one."""
  out = []
  for start, end, label in brackets:
    cut = re.split(r"[-=]", label, maxsplit=1)[0]
    if start != end and cut not in DELETE_LABELS:
      out.append((start, end, EQUAL_LABELS.get(cut, cut)))
  return out


@dataclasses.dataclass
class SentenceScore:
  status: int         # 0 counted, 1 error (length or words differ, unreadable), 2 skipped
  length: int         # gold words without empty elements, punctuation included
  gold: int = 0
  test: int = 0
  matched: int = 0
  crossing: int = 0
  words: int = 0
  correct_tags: int = 0
  error: str = ""


def score_sentence(gold_line: str, test_line: str) -> SentenceScore:
  """One sentence as EVALB scores it."""
  gold = _evalb_read(gold_line)
  try:
    test = _evalb_read(test_line) if test_line.strip() else _Read([], [], 0)
  except TreeError as e:
    return SentenceScore(1, gold.length, error=str(e))
  if not test.words:
    return SentenceScore(2, gold.length, error="empty test tree")
  if len(gold.words) != len(test.words):
    return SentenceScore(1, gold.length, error=f"length unmatch ({len(gold.words)}|"
                                               f"{len(test.words)})")
  for (gw, _), (tw, _) in zip(gold.words, test.words):
    if gw != tw:
      return SentenceScore(1, gold.length, error=f"words unmatch ({gw}|{tw})")
  g, t = _counted(gold.brackets), _counted(test.brackets)
  remaining = list(t)
  matched = 0
  for bracket in g:  # each gold bracket takes one equal test bracket, as a multiset
    if bracket in remaining:
      remaining.remove(bracket)
      matched += 1
  crossing = sum(1 for (ts, te, _) in t if any(
      (gs < ts < ge < te) or (ts < gs < te < ge) for gs, ge, _ in g))
  tags = sum(gt == tt for (_, gt), (_, tt) in zip(gold.words, test.words))
  return SentenceScore(0, gold.length, len(g), len(t), matched, crossing, len(gold.words),
                       tags)


def _summary(scores: Sequence[SentenceScore]) -> dict[str, Any]:
  valid = [s for s in scores if s.status == 0]
  gold, test = sum(s.gold for s in valid), sum(s.test for s in valid)
  matched = sum(s.matched for s in valid)
  recall = 100.0 * matched / gold if gold else 0.0
  precision = 100.0 * matched / test if test else 0.0
  f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
  words = sum(s.words for s in valid)
  n = len(valid)
  return {"sentences": len(scores), "error_sentences": sum(s.status == 1 for s in scores),
          "skipped_sentences": sum(s.status == 2 for s in scores), "valid_sentences": n,
          "recall": round(recall, 2), "precision": round(precision, 2), "f1": round(f1, 2),
          "f1_unrounded": f1,
          "complete_match": round(100.0 * sum(s.gold == s.test == s.matched for s in valid)
                                  / n, 2) if n else 0.0,
          "average_crossing": round(sum(s.crossing for s in valid) / n, 2) if n else 0.0,
          "tagging_accuracy": round(100.0 * sum(s.correct_tags for s in valid) / words, 2)
          if words else 0.0}


def evalb(gold_lines: Sequence[str], test_lines: Sequence[str]) -> dict[str, Any]:
  """EVALB's summary with COLLINS.prm: labelled bracket recall, precision, F1 (its
  FMeasure), complete match, crossing and tagging accuracy over the valid sentences, for
  all sentences and for those of at most CUTOFF_LEN words ("len<=40")."""
  if len(gold_lines) != len(test_lines):
    raise UserError(f"EVALB needs as many test trees as gold trees ({len(test_lines)} vs "
                    f"{len(gold_lines)})")
  scores = [score_sentence(g, t) for g, t in zip(gold_lines, test_lines)]
  out = _summary(scores)
  out["len<=40"] = _summary([s for s in scores if s.length <= CUTOFF_LEN])
  out["errors"] = [f"{n + 1}: {s.error}" for n, s in enumerate(scores) if s.status == 1][:10]
  return out


# ---------------------------------------------------------------------------------------
# The decoder's grammar: only prefixes of well-formed trees over the input's words


def _input_piece_at(src: Any, position: Any) -> Any:
  """[b, k] the input piece `src` [b, width] holds at `position` [b, k] (the last past it):
  what a copying constraint's hypothesis places next."""
  import jax.numpy as jnp
  return jnp.take_along_axis(src, jnp.minimum(position, src.shape[1] - 1), axis=1)


@dataclasses.dataclass(frozen=True)
class TreeConstraint:
  """Token tables for constrained beam search (`decode.search_steps`): each hypothesis keeps
  its stack of open labels, its depth and its words so far, and may take only

    an open bracket    while it has words to place (and only as the root at the start),
    `XX`               inside a bracket, while words remain,
    the close bracket  of its innermost open label, not right after opening it, and
                       the root's only once every word is placed,
    EOS                once the root is closed,

  each only if the tokens left before the length limit can still finish the tree. The
  input's word count is its tokens that begin a word (SentencePiece's '▁', and in a word
  vocabulary the unknown word too). With `copy` (a "words" target) a word slot is the
  input's next piece itself instead of `XX`, and brackets come only between words. Hashable,
  so that it can be a static argument of the compiled search."""
  kind: tuple[int, ...]         # per token id: 0 other, 1 open, 2 close, 3 word, 4 EOS
  label: tuple[int, ...]        # per token id: its bracket's label index (0 for others)
  word_start: tuple[int, ...]   # per token id: 1 when the piece begins a word
  max_depth: int = 64
  copy: bool = False

  OTHER, OPEN, CLOSE, WORD, END = 0, 1, 2, 3, 4

  def start(self, inputs: Any, k: int) -> dict[str, Any]:
    import jax.numpy as jnp
    b = inputs.shape[0]
    starts = jnp.asarray(self.word_start, jnp.int32)
    # Slots to fill: words, or with `copy` the input's pieces (EOS and padding are none).
    pieces = (inputs != EOS_ID) & (inputs != PAD_ID)
    n = jnp.sum(pieces, axis=-1) if self.copy else jnp.sum(starts[inputs], axis=-1)
    return {"n_words": n, "src": inputs,
            "stack": jnp.zeros((b, k, self.max_depth), jnp.int32),
            "depth": jnp.zeros((b, k), jnp.int32), "words": jnp.zeros((b, k), jnp.int32),
            "prev": jnp.zeros((b, k), jnp.int32)}

  def _kinds(self, width: int) -> Any:
    """[width] the kind of each id of the model's output (ids past the vocabulary: other)."""
    import jax.numpy as jnp
    return jnp.asarray(self.kind + (self.OTHER,) * max(0, width - len(self.kind)), jnp.int32)

  @staticmethod
  def _next_piece(g: dict[str, Any]) -> Any:
    """[b, k] the input piece each hypothesis places next under `copy`."""
    return _input_piece_at(g["src"], g["words"])

  def _moves(self, g: dict[str, Any], i: Any, max_len: Any) -> dict[str, Any]:
    """[b, k, 1] each: whether an open bracket, a word slot, a close bracket (of the
    innermost label, "top") and EOS may come at step `i` (max_len [b]: tokens before EOS);
    under `copy`, "next": the input piece a word slot places."""
    import jax.numpy as jnp
    depth, words, prev = g["depth"][..., None], g["words"][..., None], g["prev"][..., None]
    n = g["n_words"][:, None, None]
    left = (max_len[:, None, None] - i - 1)  # tokens after this one before EOS must come
    top = jnp.take_along_axis(g["stack"], jnp.maximum(g["depth"] - 1, 0)[..., None],
                              axis=-1)
    # Tokens still needed after a move to (depth d, words w): a slot per word, a close per
    # open bracket.
    need = lambda d, w: (n - w) + d
    out = {"top": top}
    # With `copy`: the input's next piece, and whether a word ends before it (brackets go
    # only between words).
    if self.copy:
      out["next"] = self._next_piece(g)[..., None]
      starts = jnp.asarray(self.word_start, jnp.int32)
      between = (words >= n) | (starts[out["next"]] == 1)
    else:
      between = True
    out["open"] = ((words < n) & between & (depth < self.max_depth) & ((depth > 0) | (i == 0))
                   & (need(depth + 1, words) <= left))
    out["word"] = (depth > 0) & (words < n) & (need(depth, words + 1) <= left)
    out["close"] = ((depth > 0) & between & (prev != self.OPEN)
                    & ((depth > 1) | (words == n)) & (need(depth - 1, words) <= left))
    out["end"] = (depth == 0) & (words == n) & (i > 0)
    return out

  def banned(self, g: dict[str, Any], i: Any, max_len: Any, width: int | None = None) -> Any:
    """[b, k, width]: tokens no hypothesis may take at step `i` (max_len [b]: tokens before
    EOS). `width`: the model's output size, which may exceed the vocabulary's (ids past it
    are banned)."""
    import jax.numpy as jnp
    pad = max(0, (width or len(self.kind)) - len(self.kind))
    kind = self._kinds(len(self.kind) + pad)[None, None, :]
    label = jnp.asarray(self.label + (0,) * pad, jnp.int32)[None, None, :]
    ok = self._moves(g, i, max_len)
    slot = (jnp.arange(kind.shape[-1])[None, None, :] == ok["next"]) if self.copy else \
        (kind == self.WORD)
    allowed = ((kind == self.OPEN) & ok["open"]) | (slot & ok["word"]) | \
        ((kind == self.CLOSE) & ok["close"] & (label == ok["top"])) | \
        ((kind == self.END) & ok["end"])
    return ~allowed

  def candidates(self, logits: Any, g: dict[str, Any], i: Any, max_len: Any,
                 min_len: Any) -> tuple[Any, Any, Any]:
    """The only tokens a hypothesis can take, as a few columns instead of the whole
    vocabulary: every open bracket, every close bracket, the word slot (`XX`, or under
    `copy` the input's next piece) and EOS: their log-probabilities [b, k, columns], token
    ids, and whether each is allowed (not a close of another label than the innermost, not
    past `max_len` unless EOS, not EOS before `min_len`). The same scores at the same ids as `rescore`,
    a log-softmax and `banned` over the whole vocabulary give (every other id is banned
    there), for a top-k over k x columns instead of k x vocabulary."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    x = logits.astype(jnp.float32)
    b, k, width = x.shape
    kind = np.asarray(self.kind)
    opens, closes = np.flatnonzero(kind == self.OPEN), np.flatnonzero(kind == self.CLOSE)
    eos = int(np.flatnonzero(kind == self.END)[0])
    norm = jax.nn.logsumexp(x, axis=-1, keepdims=True)
    ok = self._moves(g, i, max_len)
    if self.copy:  # P(a word now): every word piece's probability together (`rescore`)
      slot_id = ok["next"]
      slot = jax.nn.logsumexp(jnp.where(jnp.asarray(self._word_pieces(width)), x, -jnp.inf),
                              axis=-1, keepdims=True)
    else:
      word = int(np.flatnonzero(kind == self.WORD)[0])
      slot_id, slot = jnp.full((b, k, 1), word, jnp.int32), x[..., word:word + 1]
    close_label = jnp.asarray(np.asarray(self.label)[closes], jnp.int32)
    allowed = jnp.concatenate([
        jnp.broadcast_to(ok["open"], (b, k, len(opens))),
        ok["close"] & (close_label == ok["top"]), ok["word"], ok["end"]], axis=-1)
    limit = (i >= max_len)[:, None, None]    # only EOS at the length limit
    early = (i < min_len)[:, None, None]     # no EOS before the shortest length
    allowed = allowed & jnp.concatenate([jnp.broadcast_to(~limit, (b, k, allowed.shape[-1] - 1)),
                                         jnp.broadcast_to(~early, (b, k, 1))], axis=-1)
    scores = jnp.concatenate([x[..., opens], x[..., closes], slot, x[..., eos:eos + 1]],
                             axis=-1) - norm
    ids = jnp.concatenate([jnp.broadcast_to(jnp.asarray(opens, jnp.int32), (b, k, len(opens))),
                           jnp.broadcast_to(jnp.asarray(closes, jnp.int32),
                                            (b, k, len(closes))),
                           slot_id.astype(jnp.int32), jnp.full((b, k, 1), eos, jnp.int32)],
                          axis=-1)
    return scores, ids, allowed

  def _word_pieces(self, width: int) -> Any:
    """[width] bool: the ids that are pieces of words (not brackets, `XX`, EOS, PAD, BOS, or
    past the vocabulary)."""
    import numpy as np
    kind = np.asarray(self.kind + (self.OTHER,) * max(0, width - len(self.kind)))
    ids = np.arange(width)
    return (kind == self.OTHER) & (ids != PAD_ID) & (ids != BOS_ID) & (ids < len(self.kind))

  def rescore(self, g: dict[str, Any], logits: Any) -> Any:
    """[b, k, width] log-probabilities to search with. Under `copy` the input decides which
    word comes next and the model only whether one does: the next piece takes the
    probability of all the word pieces together (the model's P(a word now), what `XX` is in
    the paper's form), the other word pieces none. Otherwise the logits as they are."""
    import jax
    import jax.numpy as jnp
    if not self.copy:
      return logits
    width = logits.shape[-1]
    ids = jnp.arange(width)
    word = jnp.asarray(self._word_pieces(width))
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    slot = jax.nn.logsumexp(jnp.where(word, logp, -jnp.inf), axis=-1, keepdims=True)
    # Once every word is placed there is no next word: the "next piece" is the input's EOS,
    # which keeps its own probability, and the row stays the model's (its words banned).
    placing = (g["words"] < g["n_words"][:, None])[..., None]
    out = jnp.where(word & placing, -jnp.inf, logp)
    return jnp.where((ids == self._next_piece(g)[..., None]) & placing, slot, out)

  def advance(self, g: dict[str, Any], beams: Any, tokens: Any) -> dict[str, Any]:
    """The grammar state after hypotheses `beams` [b, m] took `tokens` [b, m]."""
    import jax.numpy as jnp
    take = lambda x: jnp.take_along_axis(x, beams.reshape(beams.shape + (1,) * (x.ndim - 2)),
                                         axis=1)
    stack, depth, words = take(g["stack"]), take(g["depth"]), take(g["words"])
    kind = jnp.take(jnp.asarray(self.kind, jnp.int32), tokens, mode="fill", fill_value=0)
    label = jnp.take(jnp.asarray(self.label, jnp.int32), tokens, mode="fill", fill_value=0)
    slot = jnp.clip(depth, 0, self.max_depth - 1)
    pushed = jnp.where(jnp.arange(self.max_depth) == slot[..., None], label[..., None], stack)
    stack = jnp.where((kind == self.OPEN)[..., None], pushed, stack)
    depth = jnp.clip(depth + (kind == self.OPEN) - (kind == self.CLOSE), 0, self.max_depth)
    # Under `copy` a piece that is no bracket or EOS can only have been the next input piece.
    words = words + ((kind == self.OTHER) if self.copy else (kind == self.WORD))
    return {**g, "stack": stack, "depth": depth, "words": words, "prev": kind}

  def keep(self, g: dict[str, Any], idx: Any) -> dict[str, Any]:
    """The hypotheses `idx` [b, k] of [b, m] (the live ones after a step)."""
    import jax.numpy as jnp
    take = lambda x: jnp.take_along_axis(x, idx.reshape(idx.shape + (1,) * (x.ndim - 2)),
                                         axis=1)
    return {**g, **{key: take(g[key]) for key in ("stack", "depth", "words", "prev")}}


def constraint_for(pieces: Sequence[str], eos_id: int, unknown_is_word: bool = False,
                   copy: bool = False) -> TreeConstraint:
  """The constraint's tables for a vocabulary given as its pieces (by id); `unknown_is_word`:
  the vocabulary's unknown piece stands for a whole word (SentencePiece's word model);
  `copy`: word slots copy the input's pieces ("words" targets)."""
  labels: dict[str, int] = {}
  kind, label, start = [], [], []
  for i, piece in enumerate(pieces):
    k, lab = symbol_kind(piece)
    code = {"open": 1, "close": 2, "word": 3}.get(k, 0)
    if i == eos_id:
      code = 4
    kind.append(code)
    label.append(labels.setdefault(lab, len(labels) + 1) if code in (1, 2) else 0)
    start.append(int(piece.startswith("\u2581") or (unknown_is_word and i == UNK_ID)))
  return TreeConstraint(tuple(kind), tuple(label), tuple(start), copy=copy)


@dataclasses.dataclass(frozen=True)
class LabelConstraint:
  """Token tables for constrained beam search over a label per word (`to_labels`): a
  hypothesis may take a pair label while it has labelled fewer than all but the last word
  and the label keeps it at or below the root, the last-word label for the last word, EOS
  after it, nothing else. With `copy` (the words between the labels), the input's pieces
  come in order and each pair's label right after its second word: those steps have one
  allowed token, which the search scores as certain (log-probability 0). Every output is
  then a tree over the input's words. Hashable, so that it can be a static argument of the
  compiled search."""
  kind: tuple[int, ...]        # per token id: 0 other, 1 pair label, 2 last-word label, 4 EOS
  change: tuple[int, ...]      # per token id: a pair label's depth change (0 for others)
  word_start: tuple[int, ...]  # per token id: 1 when the piece begins a word
  copy: bool = False

  OTHER, PAIR, LAST, END = 0, 1, 2, 4

  def start(self, inputs: Any, k: int) -> dict[str, Any]:
    import jax.numpy as jnp
    b = inputs.shape[0]
    n = jnp.sum(jnp.asarray(self.word_start, jnp.int32)[inputs], axis=-1)
    zeros = jnp.zeros((b, k), jnp.int32)
    return {"n_words": n, "n_pieces": jnp.sum((inputs != EOS_ID) & (inputs != PAD_ID), axis=-1),
            "src": inputs, "labels": zeros, "depth": zeros, "pieces": zeros, "words": zeros}

  def _moves(self, g: dict[str, Any]) -> dict[str, Any]:
    """[b, k, 1] each: whether a pair label, the last-word label, EOS and (under `copy`) the
    input's next piece ("next", its id) may come next."""
    import jax.numpy as jnp
    labels, words, pieces = (g[key][..., None] for key in ("labels", "words", "pieces"))
    n, n_pieces = g["n_words"][:, None, None], g["n_pieces"][:, None, None]
    out = {"depth": g["depth"][..., None], "end": (labels == n) & (n > 0)}
    if not self.copy:
      out["pair"], out["last"] = labels < n - 1, labels == n - 1
      return out
    out["next"] = _input_piece_at(g["src"], g["pieces"])[..., None]
    starts = jnp.asarray(self.word_start, jnp.int32)
    left = pieces < n_pieces
    boundary = ~left | (starts[out["next"]] == 1)  # the word before is whole
    caught_up = labels == jnp.maximum(words - 1, 0)  # each word after the first labelled
    out["copy"] = left & (~boundary | caught_up)
    out["pair"] = boundary & (labels < n - 1) & (labels < words - 1)
    out["last"] = ~left & (words == n) & (labels == n - 1)
    return out

  def _allowed(self, ok: dict[str, Any], kind: Any, change: Any, at_limit: Any) -> Any:
    """[b, k, columns] whether each label or EOS column (`kind`, `change`) may come next;
    `at_limit` [b, 1, 1]: the length limit is reached, where EOS may end an unfinished
    sequence (a limit too short for it: the repair rule then starts from its labels)."""
    return (((kind == self.PAIR) & ok["pair"] & (ok["depth"] + change >= 1))
            | ((kind == self.LAST) & ok["last"])
            | ((kind == self.END) & (ok["end"] | at_limit)))

  def _tables(self, width: int) -> tuple[Any, Any]:
    import jax.numpy as jnp
    pad = max(0, width - len(self.kind))
    return (jnp.asarray(self.kind + (self.OTHER,) * pad, jnp.int32),
            jnp.asarray(self.change + (0,) * pad, jnp.int32))

  def banned(self, g: dict[str, Any], i: Any, max_len: Any, width: int | None = None) -> Any:
    """[b, k, width]: tokens no hypothesis may take (ids past the vocabulary included)."""
    import jax.numpy as jnp
    width = width or len(self.kind)
    kind, change = self._tables(width)
    ok = self._moves(g)
    allowed = self._allowed(ok, kind[None, None, :], change[None, None, :],
                            (i >= max_len)[:, None, None])
    if self.copy:
      allowed = allowed | ((jnp.arange(width)[None, None, :] == ok["next"]) & ok["copy"])
    return ~allowed

  def candidates(self, logits: Any, g: dict[str, Any], i: Any, max_len: Any,
                 min_len: Any) -> tuple[Any, Any, Any]:
    """The label columns and EOS (and under `copy` the input's next piece, scored 0) alone:
    their log-probabilities [b, k, columns], ids, and whether each is allowed (`banned`'s
    rule; at the length limit only EOS, no EOS before `min_len`)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    x = logits.astype(jnp.float32)
    b, k, _ = x.shape
    cols = np.flatnonzero(np.asarray(self.kind) != self.OTHER)
    kind = jnp.asarray(np.asarray(self.kind)[cols], jnp.int32)
    change = jnp.asarray(np.asarray(self.change)[cols], jnp.int32)
    ok = self._moves(g)
    allowed = self._allowed(ok, kind, change, (i >= max_len)[:, None, None])
    scores = x[..., cols] - jax.nn.logsumexp(x, axis=-1, keepdims=True)
    ids = jnp.broadcast_to(jnp.asarray(cols, jnp.int32), (b, k, len(cols)))
    if self.copy:
      allowed = jnp.concatenate([allowed, ok["copy"]], axis=-1)
      scores = jnp.concatenate([scores, jnp.zeros((b, k, 1), jnp.float32)], axis=-1)
      ids = jnp.concatenate([ids, ok["next"].astype(jnp.int32)], axis=-1)
      kind = jnp.concatenate([kind, jnp.zeros((1,), jnp.int32)])
    is_end = kind == self.END
    allowed = allowed & jnp.where(is_end, i >= min_len[:, None, None],
                                  i < max_len[:, None, None])
    return scores, ids, allowed

  def rescore(self, g: dict[str, Any], logits: Any) -> Any:
    """Under `copy`, a step that copies the input's next piece has no choice: that piece
    scores log-probability 0 (every other token none). Otherwise the logits as they are."""
    import jax.numpy as jnp
    if not self.copy:
      return logits
    ok = self._moves(g)
    forced = jnp.where(jnp.arange(logits.shape[-1]) == ok["next"], 0.0, -jnp.inf)
    return jnp.where(ok["copy"], forced, logits.astype(jnp.float32))

  def advance(self, g: dict[str, Any], beams: Any, tokens: Any) -> dict[str, Any]:
    """The state after hypotheses `beams` [b, m] took `tokens` [b, m]."""
    import jax.numpy as jnp
    take = lambda key: jnp.take_along_axis(g[key], beams, axis=1)
    kind = jnp.take(jnp.asarray(self.kind, jnp.int32), tokens, mode="fill", fill_value=0)
    change = jnp.take(jnp.asarray(self.change, jnp.int32), tokens, mode="fill", fill_value=0)
    out = {**g, "labels": take("labels") + ((kind == self.PAIR) | (kind == self.LAST)),
           "depth": take("depth") + change}
    if self.copy:  # any other token can only have been the input's next piece
      starts = jnp.take(jnp.asarray(self.word_start, jnp.int32), tokens, mode="fill",
                        fill_value=0)
      copied = kind == self.OTHER
      out["pieces"] = take("pieces") + copied
      out["words"] = take("words") + (copied & (starts == 1))
    return out

  def keep(self, g: dict[str, Any], idx: Any) -> dict[str, Any]:
    import jax.numpy as jnp
    return {**g, **{key: jnp.take_along_axis(g[key], idx, axis=1)
                    for key in ("labels", "depth", "pieces", "words")}}


def label_constraint_for(pieces: Sequence[str], eos_id: int, unknown_is_word: bool = False,
                         copy: bool = False) -> LabelConstraint:
  """The label constraint's tables for a vocabulary given as its pieces (by id); `copy`:
  the words come between the labels (`to_labels(..., words=True)`)."""
  kind, change, start = [], [], []
  for i, piece in enumerate(pieces):
    k, delta, _, _ = label_kind(piece)
    code = {"pair": LabelConstraint.PAIR, "last": LabelConstraint.LAST}.get(k, 0)
    if i == eos_id:
      code = LabelConstraint.END
    kind.append(code)
    change.append(delta if code == LabelConstraint.PAIR else 0)
    start.append(int((piece.startswith("\u2581") and k == "other")
                     or (unknown_is_word and i == UNK_ID)))
  return LabelConstraint(tuple(kind), tuple(change), tuple(start), copy)


# ---------------------------------------------------------------------------------------
# The vocabulary as parsing uses it: words through SentencePiece, tree symbols whole


def tree_symbols(targets: Iterable[str]) -> list[str]:
  """Every bracket symbol of the linearized `targets`, with XX, in a fixed order: the pieces
  a parsing vocabulary holds whole (SentencePiece's user-defined symbols)."""
  seen: dict[str, None] = {WORD: None}
  for line in targets:
    for s in line.split():
      if is_bracket(s):  # a "words" target's words are the sentence's pieces
        seen.setdefault(s, None)
  opens = sorted(s for s in seen if s.startswith("("))
  return [WORD] + [x for label in opens for x in (label, ")" + label[1:])]


def _is_symbol(piece: str) -> bool:
  """A tree's own symbol (a bracket or a label), never a word's piece."""
  return is_bracket(piece) or is_label(piece)


class TreeVocabulary:
  """A SentencePiece vocabulary whose targets are tree symbols: a target line is encoded
  symbol by symbol (each a whole piece; `words`: its words as the sentence's pieces) and
  decoded as symbols separated by spaces, each word as its pieces spell it; the sentence side is
  SentencePiece's as in translation."""

  def __init__(self, base: Any, words: bool = False):
    self._base = base
    self.path = base.path
    self.words = words
    self._ids = {base.id_to_piece(i): i for i in range(base.size)}

  def __getattr__(self, name: str) -> Any:
    return getattr(self._base, name)

  @property
  def size(self) -> int:
    return self._base.size

  def encode(self, text: str) -> list[int]:
    """A sentence's ids, word by word: SentencePiece merges neighbouring unknown pieces, and
    a word model's unknown words must stay one piece each for the constraint to count the
    words (each word begins with a '▁' piece, or is a word model's one unknown piece)."""
    return self.encode_many([text])[0]

  def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
    split = [t.split() for t in texts]
    pieces = iter(self._base.encode_many([w for words in split for w in words]))
    return [[i for _ in words for i in next(pieces)] for words in split]

  def encode_target(self, text: str) -> list[int]:
    return self.encode_targets_many([text])[0]

  def encode_targets_many(self, texts: Sequence[str]) -> list[list[int]]:
    split = [t.split() for t in texts]
    if not self.words:
      return [[self._ids.get(s, UNK_ID) for s in symbols] for symbols in split]
    # A word as the sentence side encodes it, so that the decoder can copy it.
    pieces = iter(self._base.encode_many([s for symbols in split for s in symbols
                                          if not _is_symbol(s)]))
    return [[i for s in symbols
             for i in ([self._ids.get(s, UNK_ID)] if _is_symbol(s) else next(pieces))]
            for symbols in split]

  def decode(self, ids: Iterable[int]) -> str:
    """The symbols of the ids up to the first EOS, separated by spaces; a word's pieces as
    the word they spell (scoring checks that they copy the sentence's: an unconstrained
    search may write others), or `XX` where one is the unknown piece (no word to check)."""
    symbols: list[str] = []
    unknown_is_word = self.model_type == "word"
    in_word = False
    for t in self._base.content_ids(ids):
      piece = self._base.id_to_piece(t)
      if not self.words or _is_symbol(piece) or piece == WORD:
        symbols.append(piece)
        in_word = False
        continue
      text = WORD if t == UNK_ID else piece.replace("\u2581", "")
      if piece.startswith("\u2581") or (unknown_is_word and t == UNK_ID) or not in_word:
        symbols.append(text)
        in_word = True
      elif symbols[-1] != WORD:
        symbols[-1] = WORD if text == WORD else symbols[-1] + text
    return " ".join(symbols)

  def pieces(self) -> list[str]:
    return [self._base.id_to_piece(i) for i in range(self._base.size)]
