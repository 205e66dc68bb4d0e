"""What many tests share: the tiny model, fast data settings, and the training command."""

import sys
from pathlib import Path

from t2t_jax import registry
from t2t_jax.config import override

REPO = Path(__file__).resolve().parents[1]
# One layer of width 32 on the demo pair's data: each run takes seconds.
TINY_MODEL = {"model.num_layers": 1, "model.d_model": 32, "model.d_ff": 64, "model.num_heads": 2,
              "model.d_k": 16, "model.d_v": 16, "model.vocab_size": 64}
# Three length buckets: few shapes to compile.
FAST_DATA = {"data.max_length": 32, "data.bucket_growth": 2.0}


def tiny_cfg(**changes):
  """The demo experiment with the tiny model, no dropout unless `changes` set it."""
  return override(registry.get("demo"), {**TINY_MODEL, "model.dropout": 0.0, **changes})


def set_flags(sets: dict) -> list[str]:
  """{"train.steps": 10} -> ["--set", "train.steps=10"]."""
  return [arg for k, v in sets.items() for arg in ("--set", f"{k}={v}")]


def main_command(workdir, mode="train", experiment="demo", sets=None) -> list[str]:
  """`python -m t2t_jax.main` for `workdir` with `--set` flags."""
  return [sys.executable, "-m", "t2t_jax.main", f"--experiment={experiment}",
          f"--workdir={workdir}", f"--mode={mode}"] + set_flags(sets or {})
