"""Minimum Bayes risk selection from a beam's finished hypotheses.

Not in the paper, which outputs the beam's highest-scoring hypothesis. MBR
(Kumar & Byrne 2004) outputs instead the hypothesis with the highest expected
sentence BLEU against the others, each weighted by the exponential of its beam
score: the consensus of the beam, which is what the corpus BLEU that is reported
rewards. The beam scores are length-normalised log-probabilities, log p / lp(|Y|);
on Multi30k's valid split they weighted better than raw log-probabilities, which
favour short hypotheses (the multi30k_ende recipe's decoding was chosen this way).
The utility is sacreBLEU's own sentence BLEU (13a tokens, 'exp' smoothing,
effective order) computed from n-gram counts made once per hypothesis.
"""

from __future__ import annotations

import collections
import math
from typing import Sequence

from sacrebleu.metrics.bleu import BLEU
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

MAX_ORDER = 4  # BLEU's n-gram orders

_tokenize = Tokenizer13a()


def _ngrams(text: str) -> tuple[int, list[collections.Counter]]:
  tokens = _tokenize(text.rstrip()).split()
  return len(tokens), [collections.Counter(tuple(tokens[i:i + n])
                                           for i in range(len(tokens) - n + 1))
                       for n in range(1, MAX_ORDER + 1)]


def _sentence_bleu(hyp: tuple[int, list[collections.Counter]],
                   ref: tuple[int, list[collections.Counter]]) -> float:
  hyp_len, hyp_counts = hyp
  ref_len, ref_counts = ref
  if hyp_len == 0:
    return 0.0
  correct = [sum((h & r).values()) for h, r in zip(hyp_counts, ref_counts)]
  total = [max(hyp_len - n, 0) for n in range(MAX_ORDER)]
  return BLEU.compute_bleu(correct, total, hyp_len, ref_len, smooth_method="exp",
                           effective_order=True).score


def utility_matrix(hyps: Sequence[str]) -> list[list[float]]:
  """u[i][j]: sentence BLEU of hypothesis i with hypothesis j as its reference."""
  stats = [_ngrams(h) for h in hyps]
  return [[_sentence_bleu(h, r) for r in stats] for h in stats]


def select(hyps: Sequence[str], scores: Sequence[float], temperature: float = 1.0) -> int:
  """Index of the hypothesis with the highest expected BLEU against all of `hyps`.

  Each hypothesis is weighted by exp(score / temperature), normalised over the list (with
  log-probabilities as scores, p^(1/temperature)): the beam is the only sample of the
  model's distribution we have. Hypotheses with -inf (or the beam's finite "no hypothesis"
  sentinel) weigh nothing and are never chosen. Ties go to the earlier hypothesis, i.e. the
  beam's order.
  """
  if len(hyps) != len(scores):
    raise ValueError(f"{len(hyps)} hypotheses but {len(scores)} scores")
  best_score = max(scores)
  if best_score == -math.inf:
    return 0
  weights = [math.exp((s - best_score) / temperature) for s in scores]
  # Deduplicate: the same string reached through different subword segmentations pools its
  # probability, as it would in a sample.
  pooled: dict[str, float] = {}
  for h, w in zip(hyps, weights):
    pooled[h] = pooled.get(h, 0.0) + w
  unique = [h for h in pooled if pooled[h] > 0.0]
  if len(unique) <= 1:
    return max(range(len(hyps)), key=lambda i: (weights[i], -i))
  norm = sum(pooled[h] for h in unique)
  utility = utility_matrix(unique)
  expected = {h: sum(u * pooled[r] / norm for u, r in zip(row, unique))
              for h, row in zip(unique, utility)}
  best = max(expected.values())
  return next(i for i, h in enumerate(hyps) if h in expected and expected[h] == best)
