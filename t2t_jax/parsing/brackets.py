"""A tree as a sequence of labelled brackets, and back (Vinyals & Kaiser et al. 2014,
"Grammar as a Foreign Language", the paper's form): `(S (NP XX XX )NP (VP XX )VP )S`, POS
tags as one symbol `XX`; the check that a sequence is one such tree over a sentence's words,
and the fixed rule that makes any sequence one."""

from __future__ import annotations

from typing import Sequence

from t2t_jax.parsing.trees import Tree

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
