"""Learning curves: one run, or every member of an ensemble run, from metrics.jsonl."""

import json

from t2t_jax.tools import plot


def _write_run(directory, dev_ppls):
  directory.mkdir(parents=True)
  rows = []
  for i, ppl in enumerate(dev_ppls, start=1):
    rows.append({"step": 100 * i, "loss": 5.0 / i, "loss_mean": 5.0 / i, "elapsed_sec": 60.0 * i})
    rows.append({"step": 100 * i, "dev_ppl": ppl})
  (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_an_ensemble_run_plots_each_member_and_titles_the_ensemble_bleu(tmp_path):
  _write_run(tmp_path / "member0", [30.0, 10.0, 7.0])
  _write_run(tmp_path / "member1", [32.0, 11.0])
  (tmp_path / "eval").mkdir()
  (tmp_path / "eval" / "valid.json").write_text(json.dumps({"split": "valid", "sacrebleu": 40.2}))
  runs = plot.runs_of(str(tmp_path))
  assert [label for label, _ in runs] == ["member0", "member1"]
  assert [len(rows) for _, rows in runs] == [6, 4]
  out = plot.plot(str(tmp_path), str(tmp_path / "curve.png"))
  assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.endswith(".png")


def test_a_single_run_plots_its_own_metrics(tmp_path):
  _write_run(tmp_path / "run", [20.0, 8.0])
  assert [label for label, _ in plot.runs_of(str(tmp_path / "run"))] == [""]
  plot.plot(str(tmp_path / "run"), str(tmp_path / "run.png"))
  assert (tmp_path / "run.png").stat().st_size > 1000
