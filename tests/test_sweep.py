"""The Table 3 sweep on a two-row miniature: commands, resumability and the report."""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import FAST_DATA, REPO, TINY_MODEL, cpu_devices, set_flags

MINI = {**TINY_MODEL, **FAST_DATA, "train.steps": 10, "train.tokens_per_step": 512,
        "train.max_tokens_per_batch": 512, "train.checkpoint_every_steps": 10,
        "train.eval_every_steps": 10, "decode.beam_size": 1}


def _sweep(workdir, *extra):
  args = [sys.executable, "-m", "t2t_jax.tools.sweep", "--sweep=table3", f"--workdir={workdir}",
          "--dataset=demo", "--rows=table3_base,table3_c_n2"]
  args += set_flags(MINI)
  return subprocess.run(args + list(extra), cwd=REPO, capture_output=True, text=True,
                        timeout=900)


def test_print_commands_gives_one_launch_command_per_row_and_the_row_change_wins(tmp_path):
  r = _sweep(tmp_path, "--print_commands")
  assert r.returncode == 0, r.stderr[-2000:]
  lines = r.stdout.strip().splitlines()
  assert len(lines) == 2
  assert "--experiment=table3_base" in lines[0] and "model.num_layers=1" in lines[0]
  # (C) N=2 is the row's own change: the sweep-wide num_layers=1 must not undo it.
  assert "--experiment=table3_c_n2" in lines[1] and "model.num_layers" not in lines[1]
  assert not (tmp_path / "table3_base").exists()


def test_width_and_depth_scale_keep_each_rows_ratio_to_base(tmp_path):
  args = [sys.executable, "-m", "t2t_jax.tools.sweep", "--sweep=table3", f"--workdir={tmp_path}",
          "--rows=table3_base,table3_c_d256,table3_b_dk16,table3_big,table3_c_n2,table3_c_n8",
          "--width_scale=0.25", "--depth_scale=0.5", "--set", "train.steps=7",
          "--print_commands"]
  r = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  base, d256, dk16, big, n2, n8 = r.stdout.strip().splitlines()
  # Paper depths 6 (base, big), 2 and 8 (C): halved they stay distinct and ordered.
  assert "model.num_layers=3" in base and "model.num_layers=3" in big
  assert "model.num_layers=1" in n2 and "model.num_layers=4" in n8
  # Paper: base d512/ff2048/dk64; (C) d256 with d_k 32; (B) d_k 16; big d1024/ff4096.
  assert all(f"model.{k}" in base for k in ("d_model=128", "d_ff=512", "d_k=16", "d_v=16"))
  assert "model.d_model=64" in d256 and "model.d_k=8" in d256
  assert "model.d_k=4" in dk16 and "model.d_model=128" in dk16
  assert "model.d_model=256" in big and "model.d_ff=1024" in big
  # big's 300k steps are its schedule, not its ablation: the miniature's steps reach it too.
  assert "train.steps=7" in big and "train.steps=7" in base
  for clash in ("model.d_model=64", "model.num_layers=2"):
    r = subprocess.run(args + ["--set", clash], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and "excludes --set" in r.stderr


def test_a_bad_set_or_dataset_is_one_error_before_any_row_runs(tmp_path):
  for bad, message in ((["--set", "model.bogus=1"], "unknown config key 'model.bogus'"),
                       (["--set", "train.steps=-3"], "train.steps: must be positive"),
                       ([f"--dataset=folder:{tmp_path / 'none'}:en-de"], "folder not found")):
    r = _sweep(tmp_path / "sweep", *bad)
    assert r.returncode == 2 and message in r.stderr, r.stderr[-2000:]
    assert len(r.stderr.strip().splitlines()) == 1
  assert not (tmp_path / "sweep").exists()


@pytest.mark.long
def test_two_row_sweep_runs_resumes_and_reports(tmp_path):
  r = _sweep(tmp_path)
  assert r.returncode == 0, r.stderr[-3000:]
  with open(tmp_path / "table3.csv") as f:
    rows = {row["experiment"]: row for row in csv.DictReader(f)}
  assert set(rows) == {"table3_base", "table3_c_n2"}
  assert all(row["status"] == "done" for row in rows.values())
  assert int(rows["table3_c_n2"]["params"]) > int(rows["table3_base"]["params"])
  assert rows["table3_base"]["paper_dev_bleu"] == "25.8"
  assert (tmp_path / "table3.png").stat().st_size > 0
  assert "| table3_c_n2 | (C) N=2 |" in (tmp_path / "table3.md").read_text()
  # Table 3 reports dev figures only: the rows decode no test split.
  assert sorted(p.name for p in (tmp_path / "table3_base" / "eval").glob("*.json")) == \
      ["valid.json"]
  again = _sweep(tmp_path)  # finished rows are skipped
  assert again.returncode == 0
  assert again.stdout.count("finished, skipped") == 2


def test_report_marks_rows_not_yet_run_as_pending(tmp_path):
  r = _sweep(tmp_path, "--report_only")
  assert r.returncode == 0, r.stderr[-2000:]
  assert (tmp_path / "table3.md").read_text().count("pending") >= 6


@pytest.mark.long
def test_two_rows_at_once_with_seeds_stop_on_sigterm_resume_and_aggregate(tmp_path):
  """--parallel=2: two runs side by side, each on its own core; a SIGTERM stops both with a
  checkpoint, the same command finishes them, and base's two seeds make one row with a spread."""
  args = [sys.executable, "-m", "t2t_jax.tools.sweep", "--sweep=table3", f"--workdir={tmp_path}",
          "--dataset=demo", "--rows=table3_base,table3_c_n2", "--parallel=2", "--seeds=2",
          "--seeds_for=table3_base"]
  # The first call asks for more steps than either run can take before the signal, so the
  # SIGTERM always finds both running however far apart they start; the resume asks for a
  # few steps more than the furthest got.
  every = {"train.log_every_steps": 2}
  args_long = args + set_flags({**MINI, **every, "train.steps": 100_000,
                                "train.checkpoint_every_steps": 100_000,
                                "train.eval_every_steps": 100_000})
  env = {**os.environ, "XLA_FLAGS": cpu_devices(1)}
  proc = subprocess.Popen(args_long, cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  first = [tmp_path / "table3_base", tmp_path / "table3_base_seed1"]
  deadline = time.time() + 300
  while time.time() < deadline and not all((d / "metrics.jsonl").exists() for d in first):
    time.sleep(0.2)
  proc.send_signal(signal.SIGTERM)
  out, _ = proc.communicate(timeout=300)
  assert "sweep stopped on SIGTERM" in out, out[-3000:]
  assert "[table3_base] cores" in out and "[table3_base_seed1] cores" in out
  stopped_at = []
  for d in first:  # both were running, both stopped with a checkpoint
    steps = [int(p.name) for p in (d / "checkpoints").iterdir() if p.name.isdigit()]
    assert steps, d
    stopped_at.append(max(steps))
  assert not (tmp_path / "table3_c_n2").exists()  # nothing new starts after the signal

  total = max(stopped_at) + 8
  args += set_flags({**MINI, **every, "train.steps": total,
                     "train.checkpoint_every_steps": total, "train.eval_every_steps": 4})
  r = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
  assert r.stdout.count("resuming from checkpoint") == 2
  assert "sweep: 3 of 3 runs finished, 0 running, 0 queued" in r.stdout
  with open(tmp_path / "table3.csv") as f:
    rows = {row["experiment"]: row for row in csv.DictReader(f)}
  base, n2 = rows["table3_base"], rows["table3_c_n2"]
  assert base["seeds"] == "2" and n2["seeds"] == "1" and base["status"] == "done"
  ppls = [[json.loads(l)["dev_ppl"] for l in (d / "metrics.jsonl").read_text().splitlines()
           if "dev_ppl" in l][-1] for d in first]
  assert float(base["dev_ppl"]) == round(sum(ppls) / 2, 2)
  assert float(base["dev_ppl_spread"]) == round(max(ppls) - min(ppls), 2) > 0
  falls = []  # the fall of dev PPL over each seed's last eval interval, in percent
  for d in first:
    curve = {r["step"]: r["dev_ppl"] for r in map(json.loads, (d / "metrics.jsonl").open())
             if "dev_ppl" in r}
    *_, before, last = [curve[s] for s in sorted(curve)]
    falls.append(100 * (before - last) / before)
  assert float(base["dev_ppl_last_fall_pct"]) == round(sum(falls) / 2, 2)
  assert n2["dev_ppl_vs_base"] in ("agrees", "opposes", "within noise")
  assert n2["as_run"] == "N=2" and base["as_run"] == ""  # the model each row trained
  md = (tmp_path / "table3.md").read_text()
  assert "rows outside the noise move in the paper's direction" in md
  assert (tmp_path / "table3_dev_curves.png").stat().st_size > 0
  # A later --report_only without --seeds still counts the seeds on disk.
  r = subprocess.run(args[:5] + ["--report_only"], cwd=REPO, env=env, capture_output=True,
                     text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  with open(tmp_path / "table3.csv") as f:
    assert {row["experiment"]: row for row in csv.DictReader(f)}["table3_base"]["seeds"] == "2"
