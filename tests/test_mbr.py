"""MBR selection against independent facts: sacreBLEU's sentence BLEU and hand-computed choices."""

import math

import pytest
import sacrebleu

from t2t_jax import mbr


@pytest.mark.parametrize("hyp,ref", [
    ("Ein Mann fährt Fahrrad.", "Ein Mann fährt ein Fahrrad."),
    ("Zwei Hunde spielen im Schnee.", "Zwei Hunde spielen im Schnee."),
    ("Hund", "Ein Hund läuft."),                    # shorter than BLEU's orders: effective order
    ("Eine Frau singt.", "Kinder spielen draußen."),  # no match at all
    ("a a a a b", "a a b"),                            # clipped counts
])
def test_utility_is_sacrebleus_sentence_bleu(hyp, ref):
  assert mbr.utility_matrix([hyp, ref])[0][1] == pytest.approx(
      sacrebleu.sentence_bleu(hyp, [ref]).score, abs=1e-9)


def test_empty_hypothesis_scores_zero():
  assert mbr.utility_matrix(["", "ein Hund"])[0][1] == 0.0


def test_consensus_beats_a_more_probable_outlier():
  hyps = ["a b c d e", "x y z w v", "x y z w u"]
  logp = [-1.0, -1.2, -1.2]
  # By hand: weights e^0, e^-0.2, e^-0.2 normalised = 0.379, 0.310, 0.310. BLEU(xyzwv | xyzwu)
  # = (4/5 * 3/4 * 2/3 * 1/2)^(1/4) = 0.2^0.25 = 66.87. Expected BLEU: outlier 37.9;
  # each of the pair 0.310 * 100 + 0.310 * 66.87 = 51.8. Ties go to the beam's order.
  assert mbr.select(hyps, logp) == 1
  # A low temperature sharpens the weights towards the most probable hypothesis.
  assert mbr.select(hyps, logp, temperature=0.05) == 0


def test_identical_strings_pool_their_probability():
  # Two segmentations of one string outweigh a single, slightly more probable other string.
  hyps = ["ein Hund", "eine Katze", "ein Hund"]
  assert mbr.select(hyps, [-1.3, -1.0, -1.3]) == 0


def test_empty_beam_slots_are_never_chosen():
  assert mbr.select(["p q r s", "p q r s t"], [-math.inf, -2.0]) == 1
  assert mbr.select(["only"], [-0.5]) == 0
