"""Sentence pairs packed into rows of a few fixed lengths: few step shapes, little padding.

Bucketing by length (section 5.1) gives a run one batch shape per length bucket (27 for
base_ende on WMT-shaped data) and pads every sentence to its bucket's length. Packing puts
several pairs one after another in a row instead: sources in the row's source half, targets
in its target half, each sentence ending in EOS, so the model finds them again from the
tokens alone (`model.segments`) and keeps each sentence's attention and positions to itself;
every pair's loss and gradient are what they are alone.

Rows come in a few classes of target length (by default max_length / 2 and max_length),
with a source length scaled by the corpus's source/target ratio. A pair opens a row of the
shortest class it fits; shorter pairs fill the rows' gaps. The plan is made once per
dataset, in two stages:
  1. rows as multisets of target lengths: each row's opener, then a fill chosen by a
     bounded subset sum over the remaining lengths (the most plentiful lengths first, which
     keeps a mix of lengths for the rows still to come), repeated while the counts allow;
  2. the pairs of each length dealt to those slots so that each row's source total stays
     near the ratio times its target total (longest sources to the rows with the most room);
     a row whose sources still overflow gives pairs back, and those are packed again.
The plan fixes every row's slots as (target length, source length) types. Each epoch deals
the pairs of each type to that type's slots in a fresh random order (seed, epoch), so which
pairs share a row changes from epoch to epoch while the rows, their number and the step
shapes stay fixed: step k maps to (epoch, index) directly, and a resumed run sees the
batches an uninterrupted one sees.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from t2t_jax.special_tokens import EOS_ID, PAD_ID

# A row's source length over ratio x its target length: after dealing (stage 2) the source
# totals of base_ende's 128-token rows on WMT-shaped data spread about +-3% around the ratio
# (2026-11-27), so 3% more room leaves few rows to give pairs back.
SOURCE_SLACK = 1.03
# Row lengths are multiples of 8, and so are the rows of a step: 1, 2, 4 or 8 devices then
# split every step evenly (no filler rows), and accelerators tile the lengths evenly.
ROW_MULTIPLE = 8
MAX_REPACKS = 6  # rounds of packing the pairs that overflowing rows gave back
# The shortest rows hold about this many sentences of the corpus's mean target length: rows
# of ~5 WMT-shaped sentences filled 99.4% of their target slots, rows of ~2 Multi30k
# sentences 82% (2026-11-27).
SENTENCES_PER_ROW = 4


def shortest_row(target_lengths: np.ndarray, max_length: int) -> int:
  """The "auto" shortest row class: the least power of two holding SENTENCES_PER_ROW
  sentences of the mean target length (EOS included), at most `max_length`."""
  want = SENTENCES_PER_ROW * float(np.mean(target_lengths)) if len(target_lengths) else 1.0
  return min(max_length, 1 << max(0, math.ceil(math.log2(max(want, 1.0)))))


def round_up(x: float, multiple: int) -> int:
  return int(math.ceil(x / multiple) * multiple)


def row_classes(max_length: int, shortest: int, ratio: float,
                longest_source: int | None = None) -> list[tuple[int, int]]:
  """[(target length, source length)] of the row classes, shortest first: target lengths
  double from `shortest` up to `max_length`; each source length is the target length times
  the corpus's source/target `ratio` with SOURCE_SLACK, rounded up to ROW_MULTIPLE, and the
  longest class holds any pair of the corpus: sources of up to `longest_source` tokens (of
  up to `max_length` when not given). Not `max_length` regardless: where every source is
  much shorter than its target (a parser's label-per-word trees are 2n + 1 symbols for n
  words) that would leave about half of each row's source side empty."""
  lengths, length = [], max(1, min(shortest, max_length))
  while length < max_length:
    lengths.append(length)
    length *= 2
  lengths.append(max_length)
  classes = []
  for lt in lengths:
    ls = round_up(lt * ratio * SOURCE_SLACK, ROW_MULTIPLE if lt >= ROW_MULTIPLE else 1)
    if lt == max_length:
      ls = max(ls, max_length if longest_source is None
               else round_up(min(longest_source, max_length), ROW_MULTIPLE))
    classes.append((lt, ls))
  return classes


def rows_per_step(tokens_per_step: int, target_length: int) -> int:
  """Rows of one optimiser step of a class: the step's target-token budget over the row
  length, rounded down to a multiple of ROW_MULTIPLE when there are that many."""
  rows = max(1, tokens_per_step // target_length)
  return rows - rows % ROW_MULTIPLE if rows >= ROW_MULTIPLE else rows


@dataclasses.dataclass(frozen=True)
class Plan:
  """The rows of every epoch: row r is of class `row_class[r]` and holds the slots
  `row_start[r]:row_start[r + 1]`, in order; slot i takes a pair of type `slot_type[i]`."""
  classes: list[tuple[int, int]]
  row_class: np.ndarray  # int32 [rows]
  row_start: np.ndarray  # int64 [rows + 1]
  slot_type: np.ndarray  # int64 [slots]: target length * TYPE_BASE + source length
  type_base: int

  @property
  def num_rows(self) -> int:
    return len(self.row_class)

  def pair_types(self, src: np.ndarray, tgt: np.ndarray) -> np.ndarray:
    """The type of each pair of source and target lengths `src`, `tgt` (EOS included)."""
    return _pair_types(src, tgt, self.type_base)

  def deal(self, pair_type: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Pair index of every slot: the pairs of each type dealt to its slots in a random
    order. `pair_type` [pairs] must hold exactly the plan's multiset of types."""
    order = rng.permutation(len(pair_type))
    pairs = order[np.argsort(pair_type[order], kind="stable")]
    slots = np.argsort(self.slot_type, kind="stable")
    out = np.empty(len(slots), np.int64)
    out[slots] = pairs
    return out


def _pair_types(src: np.ndarray, tgt: np.ndarray, base: int) -> np.ndarray:
  return np.asarray(tgt, np.int64) * base + np.asarray(src, np.int64)


def _fill(counts: np.ndarray, room: int) -> dict[int, int]:
  """{length: how many} from the available `counts` with the largest total <= `room`; among
  fills of that total, the most plentiful lengths first. A bounded subset sum on bit sets
  (Python ints): bit x of reach[i] says that total x can be made from the first i lengths."""
  sizes = [int(z) for z in np.nonzero(counts[:room + 1])[0] if z > 0]
  sizes.sort(key=lambda z: (int(counts[z]), z))
  mask = (1 << (room + 1)) - 1
  reach = [1]
  for z in sizes:
    r, left, step = reach[-1], min(int(counts[z]), room // z), 1
    while left > 0:  # binary splitting: 1, 2, 4, ... copies
      take = min(step, left)
      r |= (r << (take * z)) & mask
      left -= take
      step *= 2
    reach.append(r)
  total, used = reach[-1].bit_length() - 1, {}
  for i in range(len(sizes) - 1, -1, -1):
    z = sizes[i]
    for m in range(min(int(counts[z]), total // z), -1, -1):
      if (reach[i] >> (total - m * z)) & 1:
        if m:
          used[z] = m
        total -= m * z
        break
  return used


def _row_patterns(tgt: np.ndarray, cls: np.ndarray, classes: list[tuple[int, int]]
                  ) -> list[tuple[int, dict[int, int], int]]:
  """Stage 1: [(class, {target length: count}, rows of that pattern)]. Classes are filled
  longest first; each of a class's rows opens with a pair that needs that class, and every
  pair needing a class is placed in one of its rows."""
  size = classes[-1][0] + 1
  total = np.bincount(tgt, minlength=size)
  # Pairs left of each class by target length. A row takes its pairs of a length from the
  # highest class first (`_deal_balanced` does the same), so a class's own pairs are
  # those its rows and the longer classes' rows have not taken.
  own = [np.bincount(tgt[cls == c], minlength=size) for c in range(len(classes))]
  out = []
  for c in range(len(classes) - 1, -1, -1):
    while own[c].any():
      big = int(np.nonzero(own[c])[0][-1])
      total[big] -= 1
      used = _fill(total, classes[c][0] - big)
      total[big] += 1
      used[big] = used.get(big, 0) + 1
      repeats = min(int(own[c][big]), min(int(total[z]) // m for z, m in used.items()))
      for z, m in used.items():
        total[z] -= repeats * m
        left = repeats * m
        for lower in range(c, -1, -1):
          taken = min(int(own[lower][z]), left)
          own[lower][z] -= taken
          left -= taken
      out.append((c, used, repeats))
  return out


def _deal_balanced(src: np.ndarray, tgt: np.ndarray, cls: np.ndarray, ratio: float,
                   patterns, rng: np.random.Generator):
  """Stage 2: (row class [rows], slot row [slots], slot pair [slots]), the pairs of each
  target length dealt so that each row's source total stays near `ratio` x its target
  total: slot by slot (longest target lengths first), the rows with the most source room
  get the longest sources."""
  row_class, slot_row, slot_size, slot_rank = [], [], [], []
  rows = 0
  for c, used, k in patterns:
    row_class.append(np.full(k, c, np.int32))
    for z, m in used.items():
      slot_row.append(np.tile(np.arange(rows, rows + k), m))
      slot_size.append(np.full(k * m, z))
      slot_rank.append(np.repeat(np.arange(m), k))
    rows += k
  row_class = np.concatenate(row_class)
  slot_row, slot_size, slot_rank = (np.concatenate(a) for a in (slot_row, slot_size,
                                                                  slot_rank))
  slot_class = row_class[slot_row]
  slot_pair = np.empty(len(slot_row), np.int64)
  free = np.ones(len(src), bool)
  src_sum, tgt_sum = np.zeros(rows), np.zeros(rows)
  noise = rng.random(len(src))
  for c in range(int(row_class.max()), -1, -1):
    in_c = np.nonzero(slot_class == c)[0]
    if not len(in_c):
      continue
    # The pairs this class's slots take: for each target length, the pairs of the highest
    # classes first (every pair that needs this class, then the next shorter class's), in
    # a random order within a class.
    need = np.bincount(slot_size[in_c], minlength=tgt.max() + 1)
    pool = np.nonzero(free)[0]
    pool = pool[np.lexsort((noise[pool], -cls[pool], tgt[pool]))]
    first = np.searchsorted(tgt[pool], np.arange(len(need)))
    rank = np.arange(len(pool)) - first[tgt[pool]]
    chosen = pool[rank < need[tgt[pool]]]
    free[chosen] = False
    chosen = chosen[np.lexsort((rng.random(len(chosen)), tgt[chosen]))]
    start = np.searchsorted(tgt[chosen], np.arange(len(need) + 1))
    taken = np.zeros(len(need), np.int64)
    in_c = in_c[np.lexsort((slot_rank[in_c], -slot_size[in_c]))]
    bounds = np.nonzero(np.diff(slot_size[in_c]) | np.diff(slot_rank[in_c]))[0] + 1
    for group in np.split(in_c, bounds):
      z = int(slot_size[group[0]])
      pairs = chosen[start[z] + taken[z]:start[z] + taken[z] + len(group)]
      taken[z] += len(group)
      r = slot_row[group]
      by_room = np.argsort(src_sum[r] - ratio * tgt_sum[r], kind="stable")
      by_source = np.argsort(-src[pairs], kind="stable")
      slot_pair[group[by_room]] = pairs[by_source]
      src_sum[r[by_room]] += src[pairs[by_source]]
      tgt_sum[r] += z
  return row_class, slot_row, slot_pair


def _give_back(src: np.ndarray, tgt: np.ndarray, ratio: float, classes, row_class, slot_row,
               slot_pair) -> np.ndarray:
  """Whether each slot's pair leaves its row: in rows whose sources overflow the class's
  source length, the pairs with the most source for their target until the rest fits."""
  limit = np.array([ls for _, ls in classes])[row_class]
  src_sum = np.bincount(slot_row, weights=src[slot_pair], minlength=len(row_class))
  leave = np.zeros(len(slot_row), bool)
  over = np.nonzero(src_sum > limit)[0]
  if not len(over):
    return leave
  # Slots of the overflowing rows, most source-heavy first within each row.
  mine = np.nonzero(np.isin(slot_row, over))[0]
  heavy = src[slot_pair[mine]] - ratio * tgt[slot_pair[mine]]
  mine = mine[np.lexsort((-heavy, slot_row[mine]))]
  excess = dict(zip(over.tolist(), (src_sum[over] - limit[over]).tolist()))
  for i in mine.tolist():
    r = int(slot_row[i])
    if excess[r] > 0:
      leave[i] = True
      excess[r] -= int(src[slot_pair[i]])
  return leave


def pair_classes(src: np.ndarray, tgt: np.ndarray, classes: list[tuple[int, int]]
                 ) -> np.ndarray:
  """The shortest row class each pair of source and target lengths fits alone."""
  lt = np.array([c[0] for c in classes])
  ls = np.array([c[1] for c in classes])
  fits = (tgt[:, None] <= lt[None]) & (src[:, None] <= ls[None])
  if len(src) and not fits[:, -1].all():
    raise ValueError(f"a pair does not fit the longest row class {classes[-1]}")
  return np.argmax(fits, axis=1)


def make_plan(src: np.ndarray, tgt: np.ndarray, classes: list[tuple[int, int]],
              seed: int = 0) -> Plan:
  """The rows of `classes` that hold the pairs of source and target lengths `src`, `tgt`
  (EOS included; each pair fits the last class)."""
  src, tgt = np.asarray(src, np.int64), np.asarray(tgt, np.int64)
  cls = pair_classes(src, tgt, classes)
  ratio = float(src.sum() / max(tgt.sum(), 1))
  rng = np.random.default_rng(seed)
  row_class, row_pairs = [], []  # per round: classes [rows], and (slot row, slot pair)
  pending, rows = np.arange(len(src)), 0
  for round_ in range(MAX_REPACKS + 1):
    if not len(pending):
      break
    if round_ == MAX_REPACKS:  # what still overflows goes one pair to a row (always fits)
      row_class.append(cls[pending].astype(np.int32))
      row_pairs.append((rows + np.arange(len(pending)), pending))
      rows += len(pending)
      break
    s, t, c = src[pending], tgt[pending], cls[pending]
    patterns = _row_patterns(t, c, classes)
    r_class, s_row, s_pair = _deal_balanced(s, t, c, ratio, patterns, rng)
    leave = _give_back(s, t, ratio, classes, r_class, s_row, s_pair)
    row_class.append(r_class)
    row_pairs.append((rows + s_row[~leave], pending[s_pair[~leave]]))
    rows += len(r_class)
    pending = pending[s_pair[leave]]
  row_class = np.concatenate(row_class) if row_class else np.zeros(0, np.int32)
  slot_row = np.concatenate([r for r, _ in row_pairs]) if row_pairs else np.zeros(0, np.int64)
  slot_pair = np.concatenate([p for _, p in row_pairs]) if row_pairs else np.zeros(0, np.int64)
  # A row emptied by giving back every pair is dropped.
  kept = np.bincount(slot_row, minlength=len(row_class)) > 0
  renumber = np.cumsum(kept) - 1
  slot_row, row_class = renumber[slot_row], row_class[kept]
  order = np.argsort(slot_row, kind="stable")
  slot_row, slot_pair = slot_row[order], slot_pair[order]
  row_start = np.searchsorted(slot_row, np.arange(len(row_class) + 1))
  base = max(max(c) for c in classes) + 1
  return Plan(classes, row_class.astype(np.int32), row_start.astype(np.int64),
              _pair_types(src[slot_pair], tgt[slot_pair], base), base)


def gather_rows(flat: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                row_pairs: list[np.ndarray] | tuple[np.ndarray, np.ndarray], length: int,
                total_rows: int) -> np.ndarray:
  """[total_rows, length] int32: row r holds the sentences of pairs `row_pairs` one after
  another, each its tokens then EOS, then PAD; rows past the given ones are all PAD.
  `row_pairs` is (row of each sentence, pair of each sentence), sentences in row order."""
  row, pair = row_pairs
  out = np.full((total_rows, length), PAD_ID, np.int32)
  if not len(pair):
    return out
  n = lengths[pair].astype(np.int64)
  span = n + 1  # with EOS
  # Each sentence's offset in its row: the spans before it in the same row.
  ends = np.cumsum(span)
  row_first = np.r_[0, np.nonzero(np.diff(row))[0] + 1]
  row_base = np.repeat(ends[row_first] - span[row_first], np.diff(np.r_[row_first, len(row)]))
  offset = ends - span - row_base
  if (offset + span).max() > length:
    raise ValueError(f"packed sentences overflow a row of {length} tokens")
  # Token j of the concatenated sentences: its place in `out` and in `flat` are each its
  # sentence's start plus j less the tokens of the sentences before it.
  before = np.cumsum(n) - n
  counter = np.arange(int(n.sum()))
  flat_out = out.reshape(-1)
  flat_out[np.repeat(row * length + offset - before, n) + counter] = \
      flat[np.repeat(starts[pair] - before, n) + counter]
  flat_out[row * length + offset + n] = EOS_ID
  return out
