"""A tree as one label per word, and back (Gómez-Rodríguez & Vilares 2018, "Constituent
Parsing as Sequence Labeling", relative scale); the check that a decoded sequence copies
the sentence's words."""

from __future__ import annotations

import re
from typing import Iterable, Sequence

from t2t_jax.parsing.brackets import WORD, is_bracket
from t2t_jax.parsing.trees import Tree

# Word i < n gets `@{r}:{C}`: C is the label of the lowest constituent holding both word i
# and word i+1, and r how many constituents above the words that pair shares beyond the
# pair before it (its depth minus the previous pair's; the first pair's counts from 0).
# A chain of single-child constituents is one node (`S+VP`); the chain above a word's POS
# tag rides on its own label (`/NP`). The last word gets `@end`. A sequence as long as the
# sentence, each symbol about one word: the i-th output lines up with the i-th input. With
# the words (`words=True`), each pair's label comes right after the pair's second word,
# `The cat @+2:NP sat @-1:S @end/VP`: the decoder has read both words it labels, and the
# constrained search copies the words from the input. With the tags too (`tags=True`), each
# word's POS tag follows it, `The ^DT cat ^NN @+2:NP sat ^VBD @-1:S @end/VP`: the tree's tags
# are the model's, as in T2T's wsj_parsing targets, not copied from the gold tree.

LAST_LABEL = "@end"
TAG_PREFIX = "^"  # a POS tag as a symbol, `^DT`: no treebank word begins with it
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


def to_labels(tree: Tree, words: bool = False, tags: bool = False) -> list[str]:
  """`(S (NP (DT The) (NN cat)) (VP (VBD sat)))` -> `@+2:NP @-1:S @end/VP`, or with
  `words`, `The cat @+2:NP sat @-1:S @end/VP`, and `tags` too, `The ^DT cat ^NN @+2:NP sat
  ^VBD @-1:S @end/VP`."""
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
  units = [[word] + ([TAG_PREFIX + tag] if tags else []) for word, tag in tree.leaves()]
  return units[0] + [s for unit, label in zip(units[1:], out) for s in unit + [label]] + \
      out[-1:]


def label_kind(symbol: str) -> tuple[str, int, str, str]:
  """('pair'|'last'|'tag'|'other', depth change, constituent label or POS tag, unary chain)."""
  if len(symbol) > 1 and symbol[0] == TAG_PREFIX:
    return "tag", 0, symbol[1:], ""
  m = _PAIR_LABEL.match(symbol)
  if m:
    return "pair", int(m.group(1)), m.group(2), m.group(3) or ""
  m = _LAST.match(symbol)
  if m:
    return "last", 0, "", m.group(1) or ""
  return "other", 0, "", ""


def labels_well_formed(symbols: Sequence[str], num_words: int, words: bool = False,
                       tags: bool = False) -> bool:
  """A label per word: `num_words - 1` pair labels whose depth never falls below the root,
  then one last-word label, nothing else; with `words`, each pair's label right after its
  second word (any other symbol is a word; `copies_words` checks which), and with `tags`
  each word's tag right after it."""
  want = ["pair"] * (num_words - 1) + ["last"]
  if words:
    unit = ["other"] + (["tag"] if tags else [])
    want = unit + [k for label in want[:-1] for k in unit + [label]] + want[-1:]
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


def copies_words(symbols: Sequence[str], words: Sequence[str]) -> bool:
  """Whether the words among a decoded sequence's symbols (neither bracket nor label) are
  the sentence's, in order; `XX` (a word the vocabulary cannot spell) matches any word."""
  written = [s for s in symbols if not is_bracket(s) and not is_label(s)]
  return len(written) == len(words) and all(w in (WORD, word) for w, word in zip(written, words))


def as_word_slots(symbols: Sequence[str]) -> list[str]:
  """A decoded sequence with every word (neither bracket nor label) as `XX`: the tree takes
  the sentence's own words."""
  return [s if is_bracket(s) or is_label(s) else WORD for s in symbols]
