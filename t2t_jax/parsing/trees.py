"""Constituency trees: `.mrg` text read into trees, and the parsing literature's
preprocessing (empty elements, the constituents they empty and function tags removed)."""

from __future__ import annotations

import dataclasses
import re
from typing import Iterator

from t2t_jax.errors import UserError

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


TREE_TOKEN = re.compile(r"\(|\)|[^\s()]+")


def read_trees(text: str, name: str) -> Iterator[Tree]:
  """The trees of a treebank file's text (`.mrg`: one or more, each `( (S ...) )`), in order.
  Unbalanced brackets or an empty tree raise a TreeError naming `name` and the tree."""
  tokens = TREE_TOKEN.findall(text)
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
