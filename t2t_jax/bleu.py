"""BLEU two ways, both against the raw reference text.

* `sacrebleu`: detokenized, cased sacreBLEU with its 13a tokenizer, reported with
  its signature: the comparable figure.
* `tokenized_bleu`: what the paper reported: Moses-tokenized hypotheses and
  references, hyphenated compounds split as `##AT##-##AT##`, then multi-bleu
  style BLEU on those tokens (T2T's get_ende_bleu.sh recipe). About 0.7 higher.
"""

from __future__ import annotations

import re
from typing import Sequence

import sacrebleu

_COMPOUND = re.compile(r"(\S)-(\S)")


def _streams(refs: Sequence[str] | Sequence[Sequence[str]]) -> list[list[str]]:
  """Accepts one reference per sentence, or several reference streams."""
  if refs and isinstance(refs[0], str):
    return [list(refs)]
  return [list(r) for r in refs]


def sacrebleu_score(hyps: Sequence[str], refs: Sequence[str] | Sequence[Sequence[str]]
                    ) -> tuple[float, str]:
  """Detokenized, cased corpus BLEU (13a) and sacreBLEU's signature."""
  metric = sacrebleu.metrics.BLEU()
  score = metric.corpus_score(list(hyps), _streams(refs))
  return score.score, str(metric.get_signature())


def split_compounds(tokenized: str) -> str:
  r"""'Schritt-für-Schritt' -> 'Schritt ##AT##-##AT## für ##AT##-##AT## Schritt'.

  One non-overlapping pass, exactly like the paper's `s{(\S)-(\S)}{...}g`.
  """
  return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", tokenized)


def moses_tokenize(lines: Sequence[str], lang: str) -> list[str]:
  from sacremoses import MosesTokenizer
  tok = MosesTokenizer(lang=lang)
  return [tok.tokenize(line, return_str=True, escape=False) for line in lines]


def tokenized_bleu(hyps: Sequence[str], refs: Sequence[str] | Sequence[Sequence[str]],
                   lang: str) -> float:
  """The paper's figure: Moses tokenization + compound splitting + BLEU on tokens."""
  prep = lambda lines: [split_compounds(t) for t in moses_tokenize(lines, lang)]
  metric = sacrebleu.metrics.BLEU(tokenize="none", force=True)
  return metric.corpus_score(prep(hyps), [prep(r) for r in _streams(refs)]).score
