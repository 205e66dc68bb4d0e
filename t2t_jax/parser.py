"""A trained parser from Python: `Parser.from_workdir(DIR).parse(sentences)`.

Sentences in (raw text, tokenised as the Penn Treebank is, or tokens), trees out, batched
over all local devices as `--mode=translate` decodes them: each a `Parse` with the one-line
tree, its words and tags, and its labelled spans (the brackets EVALB counts).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from t2t_jax import parsing
from t2t_jax.errors import UserError
from t2t_jax.translator import Translator


@dataclasses.dataclass(frozen=True)
class Parse:
  """One sentence's tree: `tree` the bracketed line under TOP (`nltk.Tree.fromstring` and
  EVALB read it), `words` its leaves (treebank tokens), `tags` their POS tags (`XX` where the
  model predicts none), `spans` each constituent as (label, first word, one past its last
  word), outermost first, TOP and the tags left out."""
  tree: str
  words: list[str]
  tags: list[str]
  spans: list[tuple[str, int, int]]

  @classmethod
  def of(cls, line: str) -> "Parse":
    top = next(parsing.read_trees(line, "parse"))
    words, tags = (list(side) for side in zip(*top.leaves()))
    spans: list[tuple[str, int, int]] = []

    def walk(node: Any, start: int) -> int:
      if node.is_preterminal:
        return start + 1
      end = start
      at = len(spans)
      for child in node.children:
        end = walk(child, end)
      if node.label != "TOP":
        spans.insert(at, (node.label, start, end))
      return end
    walk(top, 0)
    return cls(line, words, tags, spans)


class Parser:
  """A parser's workdir, loaded once; `parse` any number of times."""

  def __init__(self, translator: Translator):
    if translator.task.name != "parsing":
      raise UserError(f"{translator.label} is a translation model: use t2t_jax.Translator")
    self._translator = translator

  @classmethod
  def from_workdir(cls, workdir: str, *, pretokenized: bool = False,
                   **decode_settings: Any) -> "Parser":
    """The parser trained in `workdir` (its averaged checkpoint, else the newest).
    `pretokenized`: sentences are treebank tokens separated by spaces, not raw text. Other
    keyword arguments replace `decode.*` settings (beam_size=1: greedy)."""
    return cls(Translator.from_workdir(workdir, pretokenized=pretokenized, **decode_settings))

  def parse(self, sentences: Sequence[str] | str) -> list[Parse | None] | Parse | None:
    """A `Parse` per sentence, in order; None for an empty one and for one longer than the
    model reads (a warning names it). A single string gives a single result."""
    if isinstance(sentences, str):
      return self.parse([sentences])[0]
    return [Parse.of(line) if line else None for line in self._translator.translate(sentences)]
