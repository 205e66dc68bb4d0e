"""BLEU two ways, both against the raw reference text.

* `sacrebleu`: detokenized, cased sacreBLEU with its 13a tokenizer, reported with
  its signature: the comparable figure.
* `tokenized_bleu`: what the paper reported: Moses-tokenized hypotheses and
  references, hyphenated compounds split as `##AT##-##AT##` (German only), then
  multi-bleu style BLEU on those tokens (T2T's get_ende_bleu.sh recipe). About 0.7 higher.
* `t2t_reference_bleu` (German): the same with the reference's typographic double quotes
  (`„` `“` `”` ...) written as `"` first, as in the newstest2014.tok.de that T2T scored
  its published checkpoints against (tensorflow/tensor2tensor#317: up to ~1.5 above
  sacreBLEU there). Stated beside the others, never instead of them: it rewards a model for
  the training data's ASCII quotes where the reference has German ones.
"""

from __future__ import annotations

import re
from typing import Sequence

import sacrebleu

_COMPOUND = re.compile(r"(\S)-(\S)")
# The target languages whose hyphenated compounds are split: the recipe behind the paper's
# figures, T2T's get_ende_bleu.sh, is English->German's. French hyphens join words that are
# one unit (peut-être, c'est-à-dire): split, they would earn n-gram credit for half a word.
COMPOUND_SPLIT_LANGS = ("de",)
# T2T's reference tweak is documented for newstest2014's German side only.
T2T_QUOTE_LANGS = ("de",)
# The typographic double quotes the tweak rewrites: German low-9 and high quotes, the curly
# ones, their reversed and prime forms. Guillemets stay: the tweak did not name them.
_DOUBLE_QUOTES = re.compile("[\u201e\u201c\u201d\u201f\u2033]")


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
                   lang: str, t2t_reference: bool = False) -> float:
  """The paper's figure: Moses tokenization (+ compound splitting for German) + BLEU on
  tokens. `t2t_reference`: the references' double quotes as `"` first (T2T's tweak)."""
  split = split_compounds if lang in COMPOUND_SPLIT_LANGS else (lambda t: t)
  prep = lambda lines: [split(t) for t in moses_tokenize(lines, lang)]
  streams = _streams(refs)
  if t2t_reference:
    streams = [[t2t_quotes(line) for line in r] for r in streams]
  metric = sacrebleu.metrics.BLEU(tokenize="none", force=True)
  return metric.corpus_score(prep(hyps), [prep(r) for r in streams]).score


def t2t_quotes(line: str) -> str:
  """'„Ja“, sagte er.' -> '"Ja", sagte er.': T2T's reference tweak (ASCII quotes, the
  comma left after the quote, unlike Moses' normalize-punctuation.perl)."""
  return _DOUBLE_QUOTES.sub('"', line)
