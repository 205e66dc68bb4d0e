"""t2t_jax/tools/results.py: every table of figures in the documents is what its records
render, a hand edit is caught, every record names where and when it was measured, and the
projection follows its stated formula."""

import json
import re
import shutil

import pytest

from t2t_jax.tools import results

from helpers import REPO

RESULTS_TABLE = re.compile(r"<!-- table:results -->\n(.*?)<!-- /table -->", re.S)


def test_every_documents_tables_are_their_records_and_every_record_has_its_provenance():
  """What `python -m t2t_jax.tools.results --check` checks; re-render and commit on failure."""
  assert results.check() == []


def test_a_hand_edited_figure_in_a_rendered_table_is_reported():
  readme = (REPO / "README.md").read_text()
  table = RESULTS_TABLE.search(readme).group(1)
  edited = readme.replace(table, table.replace("sacreBLEU 39.59", "sacreBLEU 41.00"))
  assert edited != readme
  rendered, changed = results.render(edited, "README.md")
  assert changed == ["README.md: table results"]
  assert rendered == readme  # rendering puts the record's figure back


def test_every_figure_table_in_the_readme_and_benchmarks_is_rendered():
  """A Markdown table outside the markers holds no measurement: the ones allowed there are
  the modes and the benchmark fields (their headers)."""
  allowed = {"| `--mode=` | what it does |", "| field | meaning |"}
  for name in ("README.md", "BENCHMARKS.md"):
    text = results.MARKER.sub("", (REPO / name).read_text())
    headers = [m.group(0) for m in re.finditer(r"^\|.*\|$(?=\n\|[-:| ]+\|$)", text, re.M)]
    assert set(headers) <= allowed, (name, set(headers) - allowed)


def test_a_record_without_its_machine_or_date_is_reported(tmp_path, monkeypatch):
  root = tmp_path / "results"
  shutil.copytree(REPO / "results", root)
  path = root / "checkpoint_disk" / "big_ende.json"
  record = json.loads(path.read_text())
  del record["machine"], record["date"]
  path.write_text(json.dumps(record))
  monkeypatch.setattr(results, "RESULTS", root)
  assert results.missing_provenance() == [
      "results/checkpoint_disk/big_ende.json: no machine, date"]


def test_the_projection_is_steps_times_tokens_over_the_measured_rate():
  """base_ende: 100,000 steps of 25,000 target tokens (the paper's section 5.1-5.2) at the
  real run's rate, by hand: 100000 * 25000 / 585278 / 3600 = 1.19 h."""
  real = results.one(results.REAL_RUN)["real_run_packed"]["steady_target_tokens_per_sec"]
  assert real == 585278
  row = next(l for l in results.table_projection().splitlines() if "`base_ende`" in l)
  assert "| 1.2 h (projected) |" in row and "100,000 x 25,000 tokens / 585k tok/s" in row


@pytest.mark.parametrize("name", sorted(results.TABLES))
def test_every_table_is_placed_in_a_document(name):
  placed = "".join(p.read_text() for p in results.documents())
  assert f"<!-- table:{name} -->" in placed


def test_the_documents_hold_no_work_history():
  """No issue numbers, sessions or loans of machines in what a user reads."""
  for path in results.documents():
    text = path.read_text()
    found = re.findall(r".{0,40}(?:issue [0-9]|session|was lent|lease).{0,40}", text, re.I)
    assert not found, (path.name, found)


def test_the_readme_fits_in_a_few_screens():
  assert len((REPO / "README.md").read_text()) <= 8000   # both of the paper's results
  assert len((REPO / "USAGE.md").read_text()) <= 20000
  assert len((REPO / "WORKSPACE.md").read_text()) <= 15000
  # The results' own pages, 17 of them (CI's times the newest): a few screens each at most.
  assert sum(len(p.read_text()) for p in (REPO / "results").glob("*/README.md")) <= 36000
