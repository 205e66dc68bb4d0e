"""Packing plans against what a packing must be: every pair once an epoch, rows that hold
their sentences, little padding, and rows that hand-made examples pin down."""

import collections

import numpy as np
import pytest

from t2t_jax import packing
from t2t_jax.special_tokens import EOS_ID, PAD_ID


def _lengths(n, seed=0):
  """WMT-like lengths with EOS: log-normal around 25 tokens, source ~3% longer."""
  rng = np.random.default_rng(seed)
  tgt = np.clip(np.round(rng.lognormal(np.log(24), 0.35, n)), 2, 256).astype(np.int64)
  src = np.clip(np.round(tgt * rng.normal(1.03, 0.12, n)), 2, 256).astype(np.int64)
  return src, tgt


def _row_sums(plan, pairs, lengths):
  rows = np.repeat(np.arange(plan.num_rows), np.diff(plan.row_start))
  return np.bincount(rows, weights=lengths[pairs], minlength=plan.num_rows)


def test_row_classes_double_to_max_length_with_source_room_for_the_ratio():
  # 128 x 1.028 x 1.03 = 135.5 -> 136; 256 x ... = 271 -> 272.
  assert packing.row_classes(256, 128, 1.028) == [(128, 136), (256, 272)]
  # A shorter source side; the longest class still holds a 256-token source.
  assert packing.row_classes(256, 64, 0.9) == [(64, 64), (128, 120), (256, 256)]
  assert packing.row_classes(32, 100, 1.0) == [(32, 40)]
  # Given the corpus's longest source, the longest class holds that, not max_length: a
  # parser's 2n + 1 target symbols for n words (ratio ~0.5, sources of at most 127 + EOS)
  # fill rows of 256 / 136, not 256 / 256 (half the source side empty). 256 x 0.5 x 1.03
  # = 131.8 -> 136 is more room than the longest source (128).
  assert packing.row_classes(256, 256, 0.5, longest_source=128) == [(256, 136)]
  assert packing.row_classes(256, 64, 0.9, longest_source=250) == [(64, 64), (128, 120),
                                                                   (256, 256)]
  assert packing.row_classes(256, 128, 0.4, longest_source=201) == [(128, 56), (256, 208)]
  # "auto": 4 sentences of the mean length, to a power of two: 4 x 25 -> 128; 4 x 15 -> 64.
  assert packing.shortest_row(np.full(10, 25), 256) == 128
  assert packing.shortest_row(np.array([10, 20]), 256) == 64
  assert packing.shortest_row(np.full(3, 40), 64) == 64


def test_rows_per_step_keep_the_token_budget_in_multiples_of_eight():
  assert packing.rows_per_step(25_000, 128) == 192  # 195 -> 192: 24,576 target slots
  assert packing.rows_per_step(25_000, 256) == 96
  assert packing.rows_per_step(100, 32) == 3  # fewer than 8 rows: as many as fit


@pytest.mark.parametrize("counts, room, expected", [
    ({5: 2, 3: 3}, 11, {5: 1, 3: 2}),  # 11 exactly
    ({5: 1, 3: 1}, 4, {3: 1}),          # the best that fits
    ({4: 5, 6: 1}, 12, {4: 3}),         # 12 both ways: the more plentiful length
    ({7: 2}, 6, {}),                    # nothing fits
])
def test_fill_takes_the_fullest_fit_with_the_most_plentiful_lengths(counts, room, expected):
  array = np.zeros(16, np.int64)
  for length, n in counts.items():
    array[length] = n
  assert packing._fill(array, room) == expected


@pytest.mark.parametrize("n, ratio_shift", [(20_000, 1.0), (3_000, 0.85), (200, 1.2)])
def test_a_plan_holds_every_pair_once_within_its_rows(n, ratio_shift):
  src, tgt = _lengths(n)
  src = np.clip(np.round(src * ratio_shift), 1, 256).astype(np.int64)
  classes = packing.row_classes(256, 128, src.sum() / tgt.sum())
  plan = packing.make_plan(src, tgt, classes)
  pairs = plan.deal(tgt * plan.type_base + src, np.random.default_rng(0))
  assert sorted(pairs.tolist()) == list(range(n))
  lt = np.array([c[0] for c in classes])[plan.row_class]
  ls = np.array([c[1] for c in classes])[plan.row_class]
  assert (_row_sums(plan, pairs, tgt) <= lt).all()
  assert (_row_sums(plan, pairs, src) <= ls).all()
  assert (np.diff(plan.row_start) > 0).all()  # no empty rows
  if n >= 3_000:  # a realistic corpus fills its target slots nearly full
    assert tgt.sum() / lt.sum() > 0.97


def test_long_pairs_get_long_rows_and_short_rows_never_hold_them():
  src, tgt = _lengths(5_000, seed=1)
  tgt[:40] = 200  # longer than the short class
  src[40:60] = 180  # a short target with a source too long for the short class's source
  classes = packing.row_classes(256, 128, src.sum() / tgt.sum())
  plan = packing.make_plan(src, tgt, classes)
  pairs = plan.deal(tgt * plan.type_base + src, np.random.default_rng(0))
  rows = np.repeat(np.arange(plan.num_rows), np.diff(plan.row_start))
  long_rows = rows[np.isin(pairs, np.arange(60))]
  assert (plan.row_class[long_rows] == 1).all()
  # The long rows are few (opened by those 60 pairs, and by pairs their sources pushed out)
  # and the rows stay nearly full.
  assert (plan.row_class == 1).sum() <= 100
  lt = np.array([c[0] for c in classes])[plan.row_class]
  assert tgt.sum() / lt.sum() > 0.95


def test_each_epoch_deals_the_pairs_of_a_type_afresh_and_keeps_the_rows():
  src, tgt = _lengths(5_000, seed=2)
  plan = packing.make_plan(src, tgt, packing.row_classes(256, 128, src.sum() / tgt.sum()))
  types = tgt * plan.type_base + src
  a = plan.deal(types, np.random.default_rng([0, 0]))
  b = plan.deal(types, np.random.default_rng([0, 1]))
  np.testing.assert_array_equal(types[a], plan.slot_type)
  np.testing.assert_array_equal(types[b], plan.slot_type)
  assert (a != b).mean() > 0.5  # other pairs share rows in the next epoch
  np.testing.assert_array_equal(a, plan.deal(types, np.random.default_rng([0, 0])))


def test_gather_rows_lays_sentences_end_to_end_with_eos_then_pad():
  flat = np.array([11, 12, 13, 21, 31, 32], np.int32)  # three sentences: 3, 1, 2 tokens
  starts, lengths = np.array([0, 3, 4]), np.array([3, 1, 2])
  rows = packing.gather_rows(flat, starts, lengths, (np.array([0, 0, 1]), np.array([2, 1, 0])),
                             length=6, total_rows=3)
  e, p = EOS_ID, PAD_ID
  np.testing.assert_array_equal(rows, [[31, 32, e, 21, e, p],
                                       [11, 12, 13, e, p, p],
                                       [p, p, p, p, p, p]])
  with pytest.raises(ValueError, match="overflow"):
    packing.gather_rows(flat, starts, lengths, (np.array([0, 0]), np.array([0, 2])), 6, 1)


def test_the_plan_of_a_corpus_is_the_same_every_time():
  src, tgt = _lengths(3_000, seed=3)
  classes = packing.row_classes(256, 128, src.sum() / tgt.sum())
  a, b = packing.make_plan(src, tgt, classes), packing.make_plan(src, tgt, classes)
  np.testing.assert_array_equal(a.slot_type, b.slot_type)
  np.testing.assert_array_equal(a.row_start, b.row_start)
  assert collections.Counter(a.slot_type.tolist()) == collections.Counter(
      (tgt * a.type_base + src).tolist())
