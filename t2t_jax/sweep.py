r"""Sweeps: `python -m t2t_jax.sweep --sweep=table3 --workdir=DIR [--set KEY=VALUE ...]`.

Runs every row of a sweep one after another, each as the ordinary training
command in DIR/<experiment>/ (so each row resumes and finishes like any run),
then writes DIR/<sweep>.md, .csv and .png next to the paper's figures.
`--print_commands` prints one launch command per row instead (one cluster job
per row). `--set` applies to every row first; a row's own model change wins over
it, so a miniature keeps the ablation it names, while `--set train.*` reaches
every row (a miniature trains all rows, big included, on one schedule).
"""

from __future__ import annotations

import csv
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from typing import Any

from absl import app, flags

from t2t_jax.config import ConfigError, parse_set_flags

FLAGS = flags.FLAGS
flags.DEFINE_string("sweep", "table3", "Which sweep (table3).")
flags.DEFINE_string("workdir", None, "Directory holding one workdir per row.")
flags.DEFINE_multi_string("set", [], "Override for every row: --set train.steps=1000.")
flags.DEFINE_string("dataset", None, "Data source spec for every row.")
flags.DEFINE_string("rows", None, "Comma-separated subset of the sweep's rows.")
flags.DEFINE_bool("print_commands", False, "Print one launch command per row and exit.")
flags.DEFINE_bool("report_only", False, "Only write the table from finished rows.")
flags.DEFINE_float("width_scale", None, "Miniature: multiply every row's own widths (d_model, "
                   "d_ff, d_k, d_v) by this factor, so rows keep their ratios to base.")
flags.DEFINE_float("depth_scale", None, "Miniature: multiply every row's own num_layers by this "
                   "factor (rounded, at least 1), so N=2/4/6/8 at 0.5 become 1/2/3/4.")

# The model fields each miniature flag scales.
SCALED_FIELDS = {"width_scale": ("d_model", "d_ff", "d_k", "d_v"),
                 "depth_scale": ("num_layers",)}


def sweep_rows(name: str) -> dict[str, tuple]:
  """Row name -> (description, changes, paper dev PPL, paper dev BLEU, paper params M)."""
  if name != "table3":
    raise ValueError(f"unknown sweep {name!r}; valid: table3")
  from experiments import table3
  return table3.ROWS


def row_command(row: str, workdir: str, sets: dict[str, str], dataset: str | None,
                changes: dict, scales: dict[str, float] | None = None) -> list[str]:
  """The training command of one row: the sweep's overrides, then the row's own.

  `scales` (model field -> factor) scales the row's own values, so a miniature keeps each
  row's ratio to base: Table 3's d_model 256 / 512 / 1024 at 0.25 become 64 / 128 / 256,
  its N=2/4/6/8 at 0.5 become 1/2/3/4.
  """
  cmd = [sys.executable, "-m", "t2t_jax.main", f"--experiment={row}",
         f"--workdir={os.path.join(workdir, row)}"]
  if dataset:
    cmd.append(f"--dataset={dataset}")
  # A row's model and regularisation changes are its ablation and win over --set; its
  # schedule (big's 300k steps) does not: a miniature trains every row for the same steps.
  ablation_keys = {k for k in changes if not k.startswith("train.")}
  for key, value in sets.items():
    if key not in ablation_keys:
      cmd += ["--set", f"{key}={value}"]
  if scales:
    from experiments import get
    m = get(row).model
    for key, scale in scales.items():
      # round-half-up: N=2/4/6/8 at 0.5 must stay four distinct depths 1/2/3/4
      cmd += ["--set", f"model.{key}={max(1, int(getattr(m, key) * scale + 0.5))}"]
  return cmd


def row_result(row_dir: str) -> dict[str, Any] | None:
  """Dev PPL, dev BLEU and parameter count of a finished row, else None."""
  info_path = os.path.join(row_dir, "experiment.json")
  if not os.path.exists(info_path):
    return None
  with open(info_path) as f:
    info = json.load(f)
  dev = info["config"]["data"]["dev_split"]
  eval_path = os.path.join(row_dir, "eval", f"{dev}.json")
  if not os.path.exists(eval_path):
    return None
  with open(eval_path) as f:
    ev = json.load(f)
  ppl, elapsed = None, None
  with open(os.path.join(row_dir, "metrics.jsonl")) as f:
    for line in f:
      r = json.loads(line)
      if "dev_ppl" in r:
        ppl = r["dev_ppl"]
      elapsed = r.get("elapsed_sec", elapsed)
  from t2t_jax import model
  from t2t_jax.config import ModelConfig
  params = model.count_params(model.abstract_params(ModelConfig(**info["config"]["model"])))
  return {"dev_ppl": ppl, "dev_bleu": ev["sacrebleu"], "dev_tokenized_bleu": ev["tokenized_bleu"],
          "params": params, "steps": info["config"]["train"]["steps"],
          "train_minutes": round(elapsed / 60, 1) if elapsed is not None else None}


def write_report(workdir: str, sweep: str, rows: dict[str, tuple]) -> list[str]:
  """DIR/<sweep>.md, .csv and .png: ours next to the paper's; unfinished rows pending."""
  table = []
  for row, (desc, _, p_ppl, p_bleu, p_params) in rows.items():
    r = row_result(os.path.join(workdir, row))
    table.append({"experiment": row, "change": desc,
                  "params": r["params"] if r else None,
                  "params_m": round(r["params"] / 1e6, 1) if r else None,
                  "dev_ppl": round(r["dev_ppl"], 2) if r and r["dev_ppl"] else None,
                  "dev_bleu": r["dev_bleu"] if r else None,
                  "dev_tokenized_bleu": r["dev_tokenized_bleu"] if r else None,
                  "paper_params_m": p_params, "paper_dev_ppl": p_ppl, "paper_dev_bleu": p_bleu,
                  "steps": r["steps"] if r else None,
                  "train_minutes": r["train_minutes"] if r else None,
                  "status": "done" if r else "pending"})
  csv_path = os.path.join(workdir, f"{sweep}.csv")
  with open(csv_path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(table[0]))
    w.writeheader()
    w.writerows(table)
  fmt = lambda x: "pending" if x is None else str(x)
  # The paper's BLEU is tokenized (section 6.1 / T2T's script): it is compared with our
  # tokenized BLEU; sacreBLEU (detokenized) is given beside it for comparison with peers.
  lines = ["| experiment | change | params (M) | paper | dev PPL | paper "
           "| dev BLEU, tokenized | paper (tokenized) | dev sacreBLEU | steps | train min |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for t in table:
    lines.append(f"| {t['experiment']} | {t['change']} | {fmt(t['params_m'])} | "
                 f"{t['paper_params_m'] or ''} | {fmt(t['dev_ppl'])} | {t['paper_dev_ppl']} | "
                 f"{fmt(t['dev_tokenized_bleu'])} | {t['paper_dev_bleu']} | "
                 f"{fmt(t['dev_bleu'])} | {fmt(t['steps'])} | {fmt(t['train_minutes'])} |")
  md_path = os.path.join(workdir, f"{sweep}.md")
  with open(md_path, "w") as f:
    f.write("\n".join(lines) + "\n")
  png_path = os.path.join(workdir, f"{sweep}.png")
  _chart(table, png_path)
  return [md_path, csv_path, png_path]


def _chart(table: list[dict], path: str) -> None:
  """Each row against base, ours next to the paper's: a miniature's absolute numbers are on
  another scale from the paper's, but the direction and size of each change compare."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  names = [t["experiment"].replace("table3_", "") for t in table]
  base = next((t for t in table if t["experiment"].endswith("_base")), table[0])
  x = range(len(table))
  nan = float("nan")
  fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(8, 0.6 * len(table)), 7), sharex=True)
  panels = ((top, "dev_tokenized_bleu", "tokenized dev BLEU - base's", lambda v, b: v - b, 0.0),
            (bottom, "dev_ppl", "dev PPL / base's", lambda v, b: v / b, 1.0))
  for ax, key, label, rel, level in panels:
    paper_key = "paper_dev_bleu" if key == "dev_tokenized_bleu" else "paper_" + key
    for offset, column, name in ((-0.2, key, "ours"), (0.2, paper_key, "paper")):
      b = base[column]
      ax.bar([i + offset for i in x],
             [rel(t[column], b) if t[column] is not None and b else nan
              for t in table], width=0.4, label=name)
    ax.axhline(level, color="gray", linewidth=0.8)
    ax.set_ylabel(label)
    ax.legend()
  bottom.set_ylim(bottom=0)
  bottom.set_xticks(list(x))
  bottom.set_xticklabels(names, rotation=60, ha="right")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def _run_forwarding_sigterm(cmd: list[str]) -> int:
  """Runs a row; SIGTERM is passed on (the row checkpoints and exits 0). Ctrl-C reaches the
  row through the terminal's process group, so the sweep itself ignores SIGINT meanwhile."""
  proc = subprocess.Popen(cmd)
  old_term = signal.signal(signal.SIGTERM, lambda signum, frame: proc.send_signal(signum))
  old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
  try:
    return proc.wait()
  finally:
    signal.signal(signal.SIGTERM, old_term)
    signal.signal(signal.SIGINT, old_int)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if not FLAGS.workdir:
    print("error: --workdir is required", file=sys.stderr)
    sys.exit(2)
  try:
    rows = sweep_rows(FLAGS.sweep)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  if FLAGS.rows:
    wanted = [r.strip() for r in FLAGS.rows.split(",")]
    unknown = [r for r in wanted if r not in rows]
    if unknown:
      print(f"error: unknown rows {unknown}; valid: {', '.join(rows)}", file=sys.stderr)
      sys.exit(2)
    rows = {r: rows[r] for r in wanted}
  try:
    sets = parse_set_flags(FLAGS.set)
  except ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  scales: dict[str, float] = {}
  for flag, fields in SCALED_FIELDS.items():
    factor = FLAGS[flag].value
    if factor is None:
      continue
    clash = [f"model.{f}" for f in fields if f"model.{f}" in sets]
    if factor <= 0 or clash:
      print(f"error: --{flag} must be > 0 and excludes --set of {', '.join(fields)}"
            f"{' (got ' + ', '.join(clash) + ')' if clash else ''}", file=sys.stderr)
      sys.exit(2)
    scales.update(dict.fromkeys(fields, factor))
  workdir = os.path.abspath(FLAGS.workdir)
  commands = {row: row_command(row, workdir, sets, FLAGS.dataset, spec[1], scales)
              for row, spec in rows.items()}
  if FLAGS.print_commands:
    for cmd in commands.values():
      print(" ".join(shlex.quote(c) for c in ["python"] + cmd[1:]))
    return
  os.makedirs(workdir, exist_ok=True)
  paths = None  # the report as last written, if nothing changed since
  if not FLAGS.report_only:
    for i, (row, cmd) in enumerate(commands.items(), 1):
      if row_result(os.path.join(workdir, row)) is not None:
        print(f"[{i}/{len(commands)}] {row}: finished, skipped", flush=True)
        continue
      paths = None
      print(f"[{i}/{len(commands)}] {row}: {' '.join(shlex.quote(c) for c in cmd[1:])}",
            flush=True)
      start = time.time()
      rc = _run_forwarding_sigterm(cmd)
      if rc != 0:
        print(f"[{i}/{len(commands)}] {row}: failed with exit code {rc}", flush=True)
        if rc == 130 or rc < 0:
          sys.exit(rc if rc > 0 else 1)
        continue
      if row_result(os.path.join(workdir, row)) is None:  # stopped by a signal: resume later
        print(f"sweep stopped during {row}; run the same command to resume", flush=True)
        break
      print(f"[{i}/{len(commands)}] {row}: done in {time.time() - start:.0f}s", flush=True)
      paths = write_report(workdir, FLAGS.sweep, rows)  # the table so far, should it stop
  for path in paths or write_report(workdir, FLAGS.sweep, rows):
    print(f"wrote {path}")


if __name__ == "__main__":
  app.run(main)
