"""The vocabulary as parsing uses it: words through SentencePiece, tree symbols whole."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from t2t_jax.parsing.brackets import WORD, is_bracket
from t2t_jax.parsing.labels import is_label
from t2t_jax.special_tokens import UNK_ID

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
