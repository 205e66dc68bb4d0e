"""tools/progress_check.py: the first progress line read against the lines after it."""

import pytest

from t2t_jax.tools.progress_check import first_line_against_the_run


def _line(step, tok_s, eta, t):
  return {"step": step, "tokens_per_sec": tok_s, "eta_sec": eta, "time": t, "loss": 1.0}


def test_the_first_line_is_read_against_the_median_of_the_later_lines_and_the_time_left():
  """Hand-made: lines at steps 50..200 every 50 s of wall time, the first at 800 tok/s and
  the later ones at 900, 1000, 1100 (median 1000); a dev-loss row without a rate is no
  progress line. The first line's ETA of 120 s against the 150 s from it to the last line."""
  rows = [_line(50, 800.0, 120.0, 1000.0), {"step": 50, "dev_loss": 2.0},
          _line(100, 900.0, 60.0, 1050.0), _line(150, 1100.0, 30.0, 1100.0),
          _line(200, 1000.0, 0.0, 1150.0)]
  got = first_line_against_the_run(rows)
  assert got["steady_tokens_per_sec"] == 1000.0
  assert got["first_over_steady"] == pytest.approx(0.8)
  assert got["seconds_actually_left"] == 150.0
  assert got["eta_over_actual"] == pytest.approx(0.8)
  assert (got["first_step"], got["last_step"], got["lines"]) == (50, 200, 4)


def test_a_run_with_too_few_lines_for_a_steady_rate_is_refused():
  with pytest.raises(ValueError, match="at least 3"):
    first_line_against_the_run([_line(50, 800.0, 10.0, 0.0), _line(100, 900.0, 0.0, 10.0)])


def test_the_tool_imports_beside_main_whose_flag_names_it_shares():
  """Its flags (--experiment, --workdir, --set, --out) are main's names too: defined on import,
  they failed every test module collected after main's in the same process."""
  import subprocess
  import sys
  r = subprocess.run([sys.executable, "-c", "import t2t_jax.main, t2t_jax.tools.progress_check"],
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
