"""Bracket scoring as EVALB computes it with COLLINS.prm (Sekine & Collins 1997)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterable, Sequence

from t2t_jax.errors import UserError
from t2t_jax.parsing.trees import TREE_TOKEN, TreeError

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
  tokens = TREE_TOKEN.findall(line)
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
