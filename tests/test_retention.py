"""The checkpoint policy (t2t_jax/retention.py): which checkpoints averaging reads and which
pruning keeps, from listings worked out by hand."""

from t2t_jax.retention import MIN_GAP, Spacing, Written, kept, window

STEPS = Spacing("steps", 200)


def _every(spacing, last, *extra):
  return [Written(s) for s in range(spacing, last + 1, spacing)] + [Written(s) for s in extra]


def test_a_run_that_ends_on_its_schedule_averages_the_last_n_scheduled():
  assert window(_every(200, 3200), 5, STEPS) == [2400, 2600, 2800, 3000, 3200]


def test_a_last_step_just_after_a_scheduled_one_replaces_it_not_doubles_it():
  """A time budget ended the run at 3217, 17 steps after 3200: averaging 3200 and 3217 would
  count nearly the same parameters twice; the window is 3217 and the four 200 apart before."""
  assert window(_every(200, 3200, 3217), 5, STEPS) == [2400, 2600, 2800, 3000, 3217]
  # Half a spacing or more after the last scheduled one, both are far enough apart.
  assert MIN_GAP == 0.5
  assert window(_every(200, 3200, 3300), 5, STEPS) == [2600, 2800, 3000, 3200, 3300]


def test_checkpoints_not_written_for_averaging_are_never_read():
  written = _every(200, 1000) + [Written(1100, for_average=False)]  # a signal's, or by time
  assert window(written, 3, STEPS) == [600, 800, 1000]
  assert window(written, 10, STEPS) == [200, 400, 600, 800, 1000]  # fewer than asked: all


def test_minutes_spacing_reads_the_training_time_each_was_written_at():
  minutes = Spacing("minutes", 10)
  written = [Written(s, True, 600.0 * i) for i, s in enumerate((50, 110, 170, 230), start=1)]
  written.append(Written(236, True, 2460.0))  # the last step, one minute after 230's
  assert window(written, 3, minutes) == [110, 170, 236]
  # Without recorded times (older checkpoints) nothing is dropped.
  assert window([Written(w.step) for w in written], 3, minutes) == [170, 230, 236]


def test_pruning_keeps_the_newest_whole_and_the_window_with_parameters_alone():
  written = _every(200, 1000, 1017) + [Written(1010, for_average=False)]
  k = kept(written, keep_whole=2, keep_for_average=3, spacing=STEPS)
  assert k.whole == {1010, 1017}
  assert k.params_only == {600, 800}  # the window is 600, 800, 1017; 1000 is too close
  assert k.deleted([w.step for w in written]) == [200, 400, 1000]
