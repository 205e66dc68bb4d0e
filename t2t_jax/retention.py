"""Which training checkpoints are averaged and which are kept: the policy, apart from orbax.

Section 6.1 averages "the last 5 checkpoints, which were written at 10-minute intervals".
Training writes checkpoints on a schedule (`average.spacing`: every
`train.checkpoint_every_steps` steps, or every `train.checkpoint_every_minutes` minutes of
training), at its last step, and off schedule (by time between scheduled ones, on a
signal). Averaging reads a window of the scheduled ones and the last step's; everything here
decides from a listing of what was written, so that it can be tested without writing any.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

# Two averaged checkpoints are at least this fraction of the spacing apart: a run ended by its
# time budget (or by `steps` between scheduled checkpoints) writes its last step just after a
# scheduled one, and averaging both would count nearly the same parameters twice.
MIN_GAP = 0.5


@dataclasses.dataclass(frozen=True)
class Written:
  """A checkpoint as the policy sees it."""
  step: int
  for_average: bool = True           # on the averaging schedule, or the last step's
  elapsed_sec: float | None = None   # training time when it was written (None: not recorded)


@dataclasses.dataclass(frozen=True)
class Spacing:
  """How far apart averaged checkpoints are: in steps or in minutes of training."""
  kind: str = "steps"   # "steps" | "minutes"
  every: float = 0.0    # steps, or minutes; 0: no spacing rule (every one written for averaging)

  @classmethod
  def of(cls, cfg: Any) -> "Spacing":
    """The spacing `cfg.average.spacing` names, from the train config's schedule."""
    kind = cfg.average.spacing
    every = (cfg.train.checkpoint_every_steps if kind == "steps"
             else cfg.train.checkpoint_every_minutes)
    return cls(kind, float(every))

  def gap(self, newer: Written, older: Written) -> float | None:
    """How many spacings apart two checkpoints are (None: unknown, taken as far enough)."""
    if not self.every:
      return None
    if self.kind == "steps":
      return (newer.step - older.step) / self.every
    if newer.elapsed_sec is None or older.elapsed_sec is None:
      return None
    return (newer.elapsed_sec - older.elapsed_sec) / (60.0 * self.every)


def window(written: Sequence[Written], n: int, spacing: Spacing = Spacing()) -> list[int]:
  """The steps averaging reads, oldest first: from the newest checkpoint written for averaging
  back, each next one at least `MIN_GAP` spacings before the one taken after it, `n` in all
  (fewer when fewer were written)."""
  taken: list[Written] = []
  for w in sorted((w for w in written if w.for_average), key=lambda w: -w.step):
    if len(taken) == n:
      break
    gap = spacing.gap(taken[-1], w) if taken else None
    if gap is None or gap >= MIN_GAP:
      taken.append(w)
  return sorted(w.step for w in taken)


@dataclasses.dataclass(frozen=True)
class Kept:
  """What pruning leaves: the checkpoints kept whole (to resume from) and those kept with
  their parameters alone (for averaging); every other one is deleted."""
  whole: frozenset[int]
  params_only: frozenset[int]

  def deleted(self, steps: Sequence[int]) -> list[int]:
    return [s for s in steps if s not in self.whole and s not in self.params_only]


def kept(committed: Sequence[Written], keep_whole: int, keep_for_average: int,
         spacing: Spacing = Spacing()) -> Kept:
  """The newest `keep_whole` committed checkpoints whole, and the window of
  `keep_for_average` (`window`) with their parameters. Only committed checkpoints count: one
  still being written is not yet one to resume from, so the older ones stay whole until it
  is (`Checkpointer` prunes before each save and after the last)."""
  steps = sorted(w.step for w in committed)
  whole = frozenset(steps[-keep_whole:] if keep_whole else [])
  averaged = frozenset(window(committed, keep_for_average, spacing)
                       if keep_for_average else [])
  return Kept(whole, averaged - whole)
