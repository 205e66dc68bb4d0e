"""Learning curve of a run: `python -m t2t_jax.tools.plot --workdir=DIR [--output=PNG]`.

Training loss and dev perplexity against wall-clock training time, read from
WORKDIR/metrics.jsonl (for an ensemble run, each WORKDIR/member<i>/metrics.jsonl);
the final BLEU figures from WORKDIR/eval/*.json, when present, go in the title.
"""

from __future__ import annotations

import glob
import json

from t2t_jax import jsonl
import os
import sys

from absl import app, flags

FLAGS = flags.FLAGS


def read_metrics(workdir: str, missing_ok: bool = False) -> list[dict]:
  """WORKDIR/metrics.jsonl, one dict per logged step; [] for a run not yet logging when
  `missing_ok`, else FileNotFoundError."""
  from t2t_jax import storage
  path = storage.join(workdir, "metrics.jsonl")
  if not storage.exists(path):
    if missing_ok:
      return []
    raise FileNotFoundError(f"no metrics in {path}: train first")
  return jsonl.read(path)


def runs_of(workdir: str) -> list[tuple[str, list[dict]]]:
  """(label, metrics) of the workdir's run, or of each member of an ensemble run."""
  members = sorted(glob.glob(os.path.join(workdir, "member*", "metrics.jsonl")))
  if members and not os.path.exists(os.path.join(workdir, "metrics.jsonl")):
    return [(os.path.basename(os.path.dirname(p)), read_metrics(os.path.dirname(p)))
            for p in members]
  return [("", read_metrics(workdir))]


def plot(workdir: str, output: str) -> str:
  """Writes the learning curve PNG and returns its path."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(8, 4.5))
  ax2 = ax.twinx()
  for (label, rows), style in zip(runs_of(workdir), ["-", "--", ":", "-."] * 4):
    train = [r for r in rows if "loss" in r and "elapsed_sec" in r]
    dev = [r for r in rows if "dev_ppl" in r]
    # Dev rows logged on a non-logging step carry no time: take the nearest logged one's.
    times = {r["step"]: r["elapsed_sec"] for r in train}
    dev_t = [times.get(r["step"], max((t for s, t in times.items() if s <= r["step"]),
                                      default=0.0)) / 60 for r in dev]
    suffix = f" ({label})" if label else ""
    # The mean over each logging window when logged (one step's loss jumps with its bucket).
    ax.plot([r["elapsed_sec"] / 60 for r in train],
            [r.get("loss_mean", r["loss"]) for r in train], style, color="tab:blue",
            label="training loss (label-smoothed)" + suffix)
    ax2.plot(dev_t, [r["dev_ppl"] for r in dev], "o" + style, color="tab:red",
             label="dev perplexity" + suffix)
  ax.set_xlabel("training time (minutes)")
  ax.set_ylabel("training loss", color="tab:blue")
  ax2.set_ylabel("dev perplexity (per wordpiece)", color="tab:red")
  ax2.set_yscale("log")
  if len(ax.lines) > 1:
    handles = ax.get_legend_handles_labels()
    handles2 = ax2.get_legend_handles_labels()
    ax.legend(handles[0] + handles2[0], handles[1] + handles2[1], fontsize=8)
  title = os.path.basename(os.path.normpath(workdir))
  for path in sorted(glob.glob(os.path.join(workdir, "eval", "*.json"))):
    with open(path) as f:
      r = json.load(f)
    title += f" | {r['split']}: sacreBLEU {r['sacrebleu']:.1f}"
  ax.set_title(title)
  fig.tight_layout()
  fig.savefig(output, dpi=100)
  plt.close(fig)
  return output


def main(argv: list[str]) -> None:
  del argv
  if not FLAGS.workdir:
    print("error: --workdir is required", file=sys.stderr)
    sys.exit(2)
  try:
    out = plot(FLAGS.workdir, FLAGS.output or os.path.join(FLAGS.workdir, "learning_curve.png"))
  except FileNotFoundError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  print(f"wrote {out}")


if __name__ == "__main__":
  # Defined here, not on import, so that the sweep and the device check can read metrics
  # through this module beside their own flags.
  flags.DEFINE_string("workdir", None, "A training workdir (with metrics.jsonl).")
  flags.DEFINE_string("output", None, "PNG path (default WORKDIR/learning_curve.png).")
  app.run(main)
