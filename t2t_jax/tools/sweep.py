r"""Sweeps: `python -m t2t_jax.tools.sweep --sweep=table3 --workdir=DIR [--set KEY=VALUE ...]`.

Runs every row of a sweep, each as the ordinary training command in DIR/<experiment>/ (so
each row resumes and finishes like any run), `--parallel=K` of them at once on their shares
of the host (one per GPU, or per share of the CPU cores), and `--seeds=S` seeds of each (or
of the rows in `--seeds_for`) in DIR/<experiment>_seed<i>/. Then it writes DIR/<sweep>.md,
.csv and .png next to the paper's figures: each row's mean over its seeds and their spread,
and whether its difference from base stands above the seed band.
`--print_commands` prints one launch command per run instead (one cluster job per run). `--set` applies to every row first; a row's own model change wins over
it, so a miniature keeps the ablation it names, while `--set train.*` reaches
every row (a miniature trains all rows, big included, on one schedule).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from typing import Any

from absl import app, flags, logging

from t2t_jax import backend, registry, side_by_side, storage
from t2t_jax.config import SweepRow, override, parse_set_flags, validate
from t2t_jax.errors import UserError

FLAGS = flags.FLAGS
flags.DEFINE_string("sweep", "table3", "Which sweep (table3).")
flags.DEFINE_string("workdir", None, "Directory holding one workdir per row.")
flags.DEFINE_multi_string("set", [], "Override for every row: --set train.steps=1000.")
flags.DEFINE_string("dataset", None, "Data source spec for every row.")
flags.DEFINE_string("rows", None, "Comma-separated subset of the sweep's rows.")
flags.DEFINE_bool("print_commands", False, "Print one launch command per run and exit.")
flags.DEFINE_integer("parallel", 1, "Runs at once, each on its share of the host's GPUs or "
                     "CPU cores (as ensemble members are).")
flags.DEFINE_integer("seeds", 1, "Seeds per row (train.seed, +1, ...): the report gives each "
                     "row's mean and spread, and the seed band of base.")
flags.DEFINE_string("seeds_for", None, "Comma-separated rows that get --seeds seeds (default: "
                    "every row); the others train once.")
flags.DEFINE_bool("report_only", False, "Only write the table from finished rows.")
flags.DEFINE_float("width_scale", None, "Miniature: multiply every row's own widths (d_model, "
                   "d_ff, d_k, d_v) by this factor, so rows keep their ratios to base.")
flags.DEFINE_float("depth_scale", None, "Miniature: multiply every row's own num_layers by this "
                   "factor (rounded, at least 1), so N=2/4/6/8 at 0.5 become 1/2/3/4.")

# The model fields each miniature flag scales.
SCALED_FIELDS = {"width_scale": ("d_model", "d_ff", "d_k", "d_v"),
                 "depth_scale": ("num_layers",)}


def sweep_rows(name: str) -> dict[str, SweepRow]:
  """Row name -> its change and the paper's figures."""
  return registry.sweep(name)


@dataclasses.dataclass(frozen=True)
class Run:
  """One training run of a sweep: a row with one of its seeds (0: the row's own seed)."""
  row: str
  seed: int = 0

  @property
  def name(self) -> str:
    return self.row if self.seed == 0 else f"{self.row}_seed{self.seed}"


def sweep_runs(rows: list[str], seeds: int, seeds_for: list[str] | None) -> list[Run]:
  """Every row's runs, a row's seeds one after another, in the sweep's row order."""
  return [Run(row, seed) for row in rows
          for seed in range(seeds if seeds_for is None or row in seeds_for else 1)]


def row_command(run: Run, workdir: str, sets: dict[str, str], dataset: str | None,
                changes: dict, scales: dict[str, float] | None = None) -> list[str]:
  """The training command of one run of a row: the sweep's overrides, then the row's own;
  a seed > 0 adds it to the seed the run would otherwise have.

  `scales` (model field -> factor) scales the row's own values, so a miniature keeps each
  row's ratio to base: Table 3's d_model 256 / 512 / 1024 at 0.25 become 64 / 128 / 256,
  its N=2/4/6/8 at 0.5 become 1/2/3/4.
  """
  row = run.row
  # A row's model and regularisation changes are its ablation and win over --set; its
  # schedule (big's 300k steps) does not: a miniature trains every row for the same steps.
  ablation_keys = {k for k in changes if not k.startswith("train.")}
  items = [f"{key}={value}" for key, value in sets.items() if key not in ablation_keys]
  if scales:
    m = registry.get(row).model
    for key, scale in scales.items():
      # round-half-up: N=2/4/6/8 at 0.5 must stay four distinct depths 1/2/3/4
      items.append(f"model.{key}={max(1, int(getattr(m, key) * scale + 0.5))}")
  if run.seed:
    seed = int(sets.get("train.seed", registry.get(row).train.seed)) + run.seed
    items.append(f"train.seed={seed}")
  return side_by_side.train_command(row, os.path.join(workdir, run.name), dataset, items)


def _dev_curve(metrics: list[dict]) -> dict[int, float]:
  """Step -> dev PPL of one run (a resumed run may log a step again: the last wins)."""
  return {r["step"]: r["dev_ppl"] for r in metrics if "dev_ppl" in r}


def _run_dev_curve(workdir: str, run: Run) -> dict[int, float]:
  from t2t_jax.tools import plot
  return _dev_curve(plot.read_metrics(os.path.join(workdir, run.name), missing_ok=True))


def row_result(row_dir: str) -> dict[str, Any] | None:
  """Dev PPL, dev BLEU and parameter count of a finished row, else None."""
  info_path = storage.join(row_dir, "experiment.json")
  if not storage.exists(info_path):
    return None
  info = json.loads(storage.read_text(info_path))
  dev = info["config"]["data"]["dev_split"]
  eval_path = storage.join(row_dir, "eval", f"{dev}.json")
  if not storage.exists(eval_path):
    return None
  ev = json.loads(storage.read_text(eval_path))
  from t2t_jax.tools import plot
  metrics = plot.read_metrics(row_dir)
  elapsed = next((r["elapsed_sec"] for r in reversed(metrics) if "elapsed_sec" in r), None)
  dev_ppl = _dev_curve(metrics)
  curve = [dev_ppl[step] for step in sorted(dev_ppl)]
  from t2t_jax import model
  from t2t_jax.config import ModelConfig
  params = model.count_params(model.abstract_params(ModelConfig(**info["config"]["model"])))
  # How far the row still was from converging: the fall of dev PPL over its last eval interval.
  last_fall = 100 * (curve[-2] - curve[-1]) / curve[-2] if len(curve) > 1 else None
  # A parser's row is scored by EVALB's F1 (its eval JSON has no BLEU): it fills the
  # score columns, and the report names them so (`write_files`).
  parser = ev.get("task") == "parsing"
  cost_path = storage.join(row_dir, "cost.json")
  cost = json.loads(storage.read_text(cost_path)) if storage.exists(cost_path) else {}
  return {"dev_ppl": curve[-1] if curve else None, "dev_ppl_last_fall_pct": last_fall,
          "dev_bleu": ev["f1"] if parser else ev["sacrebleu"],
          "dev_tokenized_bleu": ev["f1"] if parser else ev["tokenized_bleu"],
          "metric": "f1" if parser else "bleu",
          "train_flops_table2": cost.get("table2_flops"),
          "train_flops_analytic": cost.get("analytic_flops"),
          "params": params, "steps": info["config"]["train"]["steps"],
          "train_minutes": round(elapsed / 60, 1) if elapsed is not None else None}


def _first(results: list[dict[str, Any]], key: str) -> Any:
  return results[0].get(key) if results else None


def _mean_and_spread(values: list[float]) -> tuple[float | None, float | None]:
  """Mean, and max - min (None with fewer than two values)."""
  if not values:
    return None, None
  return statistics.mean(values), (max(values) - min(values) if len(values) > 1 else None)


def aggregate(workdir: str, rows: dict[str, SweepRow], runs: list[Run]) -> list[dict[str, Any]]:
  """One entry per row: its finished seeds' mean and spread, the paper's figures, and whether
  its difference from base stands above base's seed band (max - min over base's seeds)."""
  table = []
  for row, spec in rows.items():
    results = [r for r in (row_result(os.path.join(workdir, run.name))
                           for run in runs if run.row == row) if r]
    entry: dict[str, Any] = {"experiment": row, "change": spec.change,
                             "seeds": len(results),
                             "seeds_planned": sum(run.row == row for run in runs)}
    for key in ("dev_ppl", "dev_tokenized_bleu", "dev_bleu", "dev_ppl_last_fall_pct"):
      mean, spread = _mean_and_spread([r[key] for r in results if r[key] is not None])
      entry[key] = round(mean, 2) if mean is not None else None
      entry[key + "_spread"] = round(spread, 2) if spread is not None else None
    entry.update(metric=results[0]["metric"] if results else None,
                 train_flops_table2=_first(results, "train_flops_table2"),
                 train_flops_analytic=_first(results, "train_flops_analytic"),
                 params=results[0]["params"] if results else None,
                 params_m=round(results[0]["params"] / 1e6, 1) if results else None,
                 paper_params_m=spec.paper_params_m, paper_dev_ppl=spec.paper_dev_ppl,
                 paper_dev_bleu=spec.paper_dev_bleu,
                 steps=results[0]["steps"] if results else None,
                 train_minutes=round(statistics.mean(r["train_minutes"] for r in results), 1)
                 if results and all(r["train_minutes"] is not None for r in results) else None,
                 status="done" if len(results) == entry["seeds_planned"] else
                 ("pending" if not results else "partial"))
    table.append(entry)
  base = next((t for t in table if t["experiment"].endswith("_base")), None)
  for t, (row, _) in zip(table, rows.items()):
    t["as_run"] = _as_run(workdir, runs, row, base)
  for t in table:
    for key, paper_key in (("dev_ppl", "paper_dev_ppl"), ("dev_tokenized_bleu", "paper_dev_bleu")):
      t[key + "_vs_base"] = _direction(t, base, key, paper_key)
  return table


# Table 3's names for the model fields a row changes.
_PAPER_NAMES = {"num_heads": "h", "num_layers": "N", "dropout": "P_drop",
                "label_smoothing": "eps_ls"}


def _as_run(workdir: str, runs: list[Run], row: str, base: dict | None) -> str:
  """What a row's first run changed against base's, in the model as trained (a miniature
  scales Table 3's sizes): "h=1, d_k=128, d_v=128"; "" for base, None before it starts."""
  def model_of(name: str) -> dict | None:
    run = next((r for r in runs if r.row == name), None)
    path = storage.join(workdir, run.name, "experiment.json") if run else ""
    if not path or not storage.exists(path):
      return None
    return json.loads(storage.read_text(path))["config"]["model"]
  ours = model_of(row)
  theirs = model_of(base["experiment"]) if base else None
  if ours is None or theirs is None:
    return None
  return ", ".join(f"{_PAPER_NAMES.get(k, k)}={v}" for k, v in ours.items()
                   if theirs.get(k) != v)


def _direction(t: dict, base: dict | None, key: str, paper_key: str) -> str:
  """How a row's difference from base compares with the paper's: "agrees" or "opposes" (both
  outside base's seed band), "within noise", "paper: no change", or "" (base, or no figure)."""
  if base is None or t is base or t[key] is None or base[key] is None:
    return ""
  paper_diff = t[paper_key] - base[paper_key]
  if abs(paper_diff) < 1e-9:
    return "paper: no change"
  ours = t[key] - base[key]
  band = base[key + "_spread"]
  if band is not None and abs(ours) <= band:
    return "within noise"
  return "agrees" if (ours > 0) == (paper_diff > 0) else "opposes"


def direction_counts(table: list[dict]) -> dict[str, dict[str, int]]:
  """Per measure: how many rows agree with / oppose the paper's direction, or are in the noise."""
  out = {}
  for key in ("dev_ppl", "dev_tokenized_bleu"):
    counts: dict[str, int] = {}
    for t in table:
      if t[key + "_vs_base"]:
        counts[t[key + "_vs_base"]] = counts.get(t[key + "_vs_base"], 0) + 1
    out[key] = counts
  return out


def write_report(workdir: str, sweep: str, rows: dict[str, SweepRow], runs: list[Run]
                 ) -> list[str]:
  """DIR/<sweep>.md, .csv, .png and _dev_curves.png: ours next to the paper's, the seed band,
  the direction count; unfinished rows marked pending."""
  table = aggregate(workdir, rows, runs)
  with storage.local_folder(workdir) as local:  # in a bucket: written here, then uploaded
    paths = write_files(local, sweep, table, workdir, runs)
  return [storage.join(workdir, os.path.basename(p)) for p in paths]


def write_files(folder: str, sweep: str, table: list[dict], workdir: str, runs: list[Run]
                ) -> list[str]:
  """The report's files in a local folder, from the rows in `workdir`."""
  csv_path = os.path.join(folder, f"{sweep}.csv")
  with open(csv_path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(table[0]))
    w.writeheader()
    w.writerows(table)

  def fmt(t: dict, key: str) -> str:
    if t[key] is None:
      return "pending"
    spread = t.get(key + "_spread")
    return f"{t[key]} ({spread:g})" if spread is not None else str(t[key])
  def flops(t: dict) -> str:  # Table 2's cost column, then the count from the shapes
    if t.get("train_flops_analytic") is None:
      return "pending"
    table2 = t.get("train_flops_table2")
    return (f"{table2:.2g} / " if table2 else "- / ") + f"{t['train_flops_analytic']:.2g}"
  # The paper's BLEU is tokenized (section 6.1 / T2T's script): it is compared with our
  # tokenized BLEU; sacreBLEU (detokenized) is given beside it for comparison with peers.
  # Parsers' rows are scored by EVALB's F1 instead.
  parsers = all(t.get("metric") == "f1" for t in table if t.get("metric"))
  score = ("dev F1 (EVALB) | paper | vs base | dev F1 " if parsers and any(
      t.get("metric") for t in table) else
      "dev BLEU, tokenized | paper (tokenized) | vs base | dev sacreBLEU ")
  lines = ["| experiment | change | as run | params (M) | paper | seeds | dev PPL | paper "
           f"| vs base | {score}"
           "| steps | last PPL fall (%) | train min | cost, FLOPs: Table 2 / shapes |",
           "|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---|---:|---:|---:|---:|---:|"]
  for t in table:
    as_run = "pending" if t["as_run"] is None else t["as_run"]
    lines.append(f"| {t['experiment']} | {t['change']} | {as_run} | "
                 f"{t['params_m'] or 'pending'} | "
                 f"{t['paper_params_m'] or ''} | {t['seeds']} | {fmt(t, 'dev_ppl')} | "
                 f"{t['paper_dev_ppl']} | {t['dev_ppl_vs_base']} | "
                 f"{fmt(t, 'dev_tokenized_bleu')} | {t['paper_dev_bleu']} | "
                 f"{t['dev_tokenized_bleu_vs_base']} | {fmt(t, 'dev_bleu')} | "
                 f"{t['steps'] or 'pending'} | {fmt(t, 'dev_ppl_last_fall_pct')} | "
                 f"{t['train_minutes'] or 'pending'} | {flops(t)} |")
  counts = direction_counts(table)
  lines += ["", "Figures are means over a row's seeds, with max - min in parentheses. A row "
            "is within noise when its difference from base is no larger than base's seed "
            "spread. \"as run\" is the row's model against base's, as trained here. \"last "
            "PPL fall\" is how much dev perplexity fell over the last eval interval: a row "
            "still falling faster than base is further from convergence (see "
            f"{sweep}_dev_curves.png)."]
  for key, label in (("dev_ppl", "dev PPL"), ("dev_tokenized_bleu", "dev BLEU (tokenized)")):
    c = counts[key]
    outside = c.get("agrees", 0) + c.get("opposes", 0)
    lines.append(f"- {label}: {c.get('agrees', 0)} of {outside} rows outside the noise move "
                 f"in the paper's direction; {c.get('within noise', 0)} within noise, "
                 f"{c.get('paper: no change', 0)} where the paper's figure does not change.")
  md_path = os.path.join(folder, f"{sweep}.md")
  with open(md_path, "w") as f:
    f.write("\n".join(lines) + "\n")
  png_path = os.path.join(folder, f"{sweep}.png")
  _chart(table, png_path)
  curves_path = os.path.join(folder, f"{sweep}_dev_curves.png")
  _dev_curves(workdir, table, runs, curves_path)
  return [md_path, csv_path, png_path, curves_path]


def _chart(table: list[dict], path: str) -> None:
  """Each row against base, ours next to the paper's, with base's seed band shaded: a
  miniature's absolute numbers are on another scale from the paper's, but the direction and
  size of each change compare."""
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
    band = base.get(key + "_spread")
    if band and base[key]:
      half = band if key == "dev_tokenized_bleu" else band / base[key]
      ax.axhspan(level - half, level + half, color="gray", alpha=0.25,
                 label=f"base's seed spread ({base['seeds']} seeds)")
    ax.axhline(level, color="gray", linewidth=0.8)
    ax.set_ylabel(label)
    ax.legend()
  bottom.set_ylim(bottom=0)
  bottom.set_xticks(list(x))
  bottom.set_xticklabels(names, rotation=60, ha="right")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def _dev_curves(workdir: str, table: list[dict], runs: list[Run], path: str) -> None:
  """One panel per row: its dev perplexity against step, relative to base's mean over its
  seeds at the same step, with base's seed band shaded. Where a row differs from the paper,
  its panel shows whether the gap is settled or still moving when training stops."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  base = next((t["experiment"] for t in table if t["experiment"].endswith("_base")), None)
  base_curves = [c for c in (_run_dev_curve(workdir, r) for r in runs if r.row == base) if c]
  steps = sorted(set.intersection(*(set(c) for c in base_curves))) if base_curves else []
  mean = {s: statistics.mean(c[s] for c in base_curves) for s in steps}
  others = [t["experiment"] for t in table if t["experiment"] != base]
  cols = 5
  n_rows = max(1, -(-len(others) // cols))
  fig, axes = plt.subplots(n_rows, cols, figsize=(3.2 * cols, 2.4 * n_rows), sharex=True,
                           sharey=True, squeeze=False)
  for ax, row in zip(axes.flat, others):
    ax.set_title(row.replace("table3_", ""), fontsize=9)
    ax.axhline(0, color="black", linewidth=0.8)
    if len(base_curves) > 1:
      ax.fill_between(steps, [100 * (min(c[s] for c in base_curves) / mean[s] - 1) for s in steps],
                      [100 * (max(c[s] for c in base_curves) / mean[s] - 1) for s in steps],
                      color="gray", alpha=0.3, linewidth=0)
    for run in (r for r in runs if r.row == row):
      curve = _run_dev_curve(workdir, run)
      shared = [s for s in steps if s in curve]
      ax.plot(shared, [100 * (curve[s] / mean[s] - 1) for s in shared], marker=".")
  for ax in axes.flat[len(others):]:
    ax.set_visible(False)
  for ax in axes[:, 0]:
    ax.set_ylabel("dev PPL vs base (%)", fontsize=8)
  for ax in axes[-1, :]:
    ax.set_xlabel("step", fontsize=8)
  fig.suptitle(f"dev perplexity against base's mean at each step; grey: base's "
               f"{len(base_curves)} seeds (max - min); below 0 is better", fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=90)
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


def _run_side_by_side(commands: dict[Run, list[str]], workdir: str, k: int) -> None:
  """Runs the unfinished runs, `k` at once, each on its share of the host. A SIGTERM or Ctrl-C is passed on to the running ones (each checkpoints and exits)
  and starts no more; the same command resumes them."""
  shares = backend.member_shares(k)
  if shares is None:
    print(f"warning: fewer cores or GPUs than --parallel={k}; the runs share them all",
          flush=True)
  queue = [run for run in commands if row_result(os.path.join(workdir, run.name)) is None]
  for run in commands:
    if run not in queue:
      print(f"{run.name}: finished, skipped", flush=True)
  free, running, failed, signalled = list(range(k)), {}, [], []
  finished, durations = len(commands) - len(queue), []

  def forward(signum, frame):
    signalled.append(signal.Signals(signum).name)
    for proc, *_ in running.values():
      if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)

  old = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
  try:
    while running or (queue and not signalled):
      while queue and free and not signalled:
        run, slot = queue.pop(0), free.pop(0)
        where, share_env = shares[slot] if shares else ("shared devices", {})
        run_dir = storage.join(workdir, run.name)
        storage.makedirs(run_dir)
        cmd = commands[run]
        print(f"[{run.name}] {where}: {' '.join(shlex.quote(c) for c in ['python'] + cmd[1:])}",
              flush=True)
        log = side_by_side.log_file(run_dir)
        proc, relay = side_by_side.start_logged_run(cmd, log, f"[{run.name}] ", share_env)
        running[slot] = (proc, relay, run, time.time(), log)
      time.sleep(0.5)
      for slot, (proc, relay, run, start, log) in list(running.items()):
        if proc.poll() is None:
          continue
        relay.join(timeout=10)
        side_by_side.keep_log(storage.join(workdir, run.name), log)
        del running[slot]
        free.append(slot)
        if proc.returncode != 0:
          failed.append(run.name)
          print(f"[{run.name}] failed with exit code {proc.returncode} (its log: "
                f"{os.path.join(workdir, run.name, 'train.log')})", flush=True)
        elif row_result(storage.join(workdir, run.name)) is not None:
          durations.append(time.time() - start)
          finished += 1
          print(f"[{run.name}] done in {durations[-1]:.0f}s", flush=True)
          _print_progress(finished, len(commands), len(running), len(queue), durations, k)
  finally:
    for sig, handler in old.items():
      signal.signal(sig, handler)
  if signalled:
    print(f"sweep stopped on {signalled[0]}; run the same command to resume", flush=True)
  if failed:
    raise UserError(f"{len(failed)} run(s) failed: {', '.join(failed)}")


def _print_progress(finished: int, total: int, running: int, queued: int,
                    durations: list[float], k: int) -> None:
  """One line for a sweep that runs for hours: where it stands and roughly how long is left
  (runs still to finish x this invocation's median run time / runs at once)."""
  left = (running + queued) * statistics.median(durations) / k
  print(f"sweep: {finished} of {total} runs finished, {running} running, {queued} queued; "
        f"about {left / 3600:.1f} h left at {statistics.median(durations) / 60:.0f} min a run",
        flush=True)


def _run_one_by_one(commands: dict[Run, list[str]], workdir: str) -> None:
  """Runs the unfinished runs one after another in this terminal."""
  for i, (run, cmd) in enumerate(commands.items(), 1):
    if row_result(os.path.join(workdir, run.name)) is not None:
      print(f"[{i}/{len(commands)}] {run.name}: finished, skipped", flush=True)
      continue
    print(f"[{i}/{len(commands)}] {run.name}: {' '.join(shlex.quote(c) for c in cmd[1:])}",
          flush=True)
    start = time.time()
    rc = _run_forwarding_sigterm(cmd)
    if rc != 0:
      print(f"[{i}/{len(commands)}] {run.name}: failed with exit code {rc}", flush=True)
      if rc == 130 or rc < 0:
        sys.exit(rc if rc > 0 else 1)
      continue
    if row_result(os.path.join(workdir, run.name)) is None:  # stopped by a signal
      print(f"sweep stopped during {run.name}; run the same command to resume", flush=True)
      return
    print(f"[{i}/{len(commands)}] {run.name}: done in {time.time() - start:.0f}s", flush=True)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # keep JAX's backend-probing INFO lines quiet
  try:
    _main()
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


def _seeds_on_disk(workdir: str, runs: list[Run]) -> list[Run]:
  """Seed runs in `workdir` beyond the planned ones (a --report_only without the --seeds the
  sweep ran with), so the report never silently leaves a trained seed out."""
  planned, rows = set(runs), {run.row for run in runs}
  found = []
  for name in sorted(storage.listdir(workdir)) if storage.isdir(workdir) else []:
    row, sep, seed = name.rpartition("_seed")
    if sep and row in rows and seed.isdigit() and Run(row, int(seed)) not in planned:
      found.append(Run(row, int(seed)))
  return found


def _check_commands(commands: dict[Run, list[str]]) -> None:
  """Builds each run's config as its command will, so a bad --set or --dataset is one error
  now, not a failure per row once the sweep runs."""
  from t2t_jax import data_sources
  for run, cmd in commands.items():
    items = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--set"]
    cfg = override(registry.get(run.row), parse_set_flags(items))
    dataset = next((arg.split("=", 1)[1] for arg in cmd if arg.startswith("--dataset=")), None)
    if dataset:
      cfg = override(cfg, {"data.dataset": dataset})
    validate(cfg)
    data_sources.parse_spec(cfg.data.dataset)


def _main() -> None:
  if not FLAGS.workdir:
    raise UserError("--workdir is required")
  if FLAGS.parallel < 1 or FLAGS.seeds < 1:
    raise UserError(f"--parallel and --seeds must be at least 1 (got {FLAGS.parallel}, "
                    f"{FLAGS.seeds})")
  try:
    rows = sweep_rows(FLAGS.sweep)
  except ValueError as e:
    raise UserError(str(e)) from None
  if FLAGS.rows:
    wanted = [r.strip() for r in FLAGS.rows.split(",")]
    unknown = [r for r in wanted if r not in rows]
    if unknown:
      raise UserError(f"unknown rows {unknown}; valid: {', '.join(rows)}")
    rows = {r: rows[r] for r in wanted}
  seeds_for = [r.strip() for r in FLAGS.seeds_for.split(",")] if FLAGS.seeds_for else None
  if seeds_for and [r for r in seeds_for if r not in rows]:
    raise UserError(f"--seeds_for: {[r for r in seeds_for if r not in rows]} are not rows of "
                    f"this sweep; valid: {', '.join(rows)}")
  sets = parse_set_flags(FLAGS.set)
  scales: dict[str, float] = {}
  for flag, fields in SCALED_FIELDS.items():
    factor = FLAGS[flag].value
    if factor is None:
      continue
    clash = [f"model.{f}" for f in fields if f"model.{f}" in sets]
    if factor <= 0 or clash:
      raise UserError(f"--{flag} must be > 0 and excludes --set of {', '.join(fields)}"
                      f"{' (got ' + ', '.join(clash) + ')' if clash else ''}")
    scales.update(dict.fromkeys(fields, factor))
  storage.check_supported(FLAGS.workdir, "--workdir")
  workdir = storage.normalize(FLAGS.workdir)  # a folder, or one in a bucket (gs://)
  runs = sweep_runs(list(rows), FLAGS.seeds, seeds_for)
  commands = {run: row_command(run, workdir, sets, FLAGS.dataset, dict(rows[run.row].sets),
                               scales) for run in runs}
  _check_commands(commands)
  if FLAGS.print_commands:
    for cmd in commands.values():
      print(" ".join(shlex.quote(c) for c in ["python"] + cmd[1:]))
    return
  storage.makedirs(workdir)
  if not FLAGS.report_only:
    if FLAGS.parallel > 1:
      _run_side_by_side(commands, workdir, FLAGS.parallel)
    else:
      _run_one_by_one(commands, workdir)
  for path in write_report(workdir, FLAGS.sweep, rows, runs + _seeds_on_disk(workdir, runs)):
    print(f"wrote {path}")


if __name__ == "__main__":
  app.run(main)
