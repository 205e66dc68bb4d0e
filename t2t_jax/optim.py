"""The paper's optimiser (section 5.3): Adam(0.9, 0.98, 1e-9) with warmup + inverse square root
(optionally with a linear cooldown to zero at the last step or at the end of a time budget)."""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp
import optax

from t2t_jax.config import ExperimentConfig


def learning_rate(step, d_model: int, warmup_steps: int, scale: float = 1.0,
                  total_steps: int = 0, cooldown_steps: int = 0):
  """lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), for step >= 1.

  With `cooldown_steps` > 0 the paper's rate is also multiplied by a linear ramp
  that falls to 0 at update `total_steps` (a deviation for budgeted runs: a run of
  known length ends at a low rate instead of stopping mid-descent).
  """
  step = jnp.maximum(jnp.asarray(step, jnp.float32), 1.0)
  lr = scale * d_model ** -0.5 * jnp.minimum(step ** -0.5, step * warmup_steps ** -1.5)
  if cooldown_steps > 0:
    lr = lr * jnp.clip((total_steps - step) / cooldown_steps, 0.0, 1.0)
  return lr


def budget_ramp(elapsed_sec: float, budget_sec: float, cooldown_sec: float) -> float:
  """The factor on the rate in a time-budgeted cooldown: 1 until the last `cooldown_sec` of
  the budget, then falling linearly to 0 when `elapsed_sec` reaches `budget_sec`."""
  if cooldown_sec <= 0:
    return 1.0
  return min(1.0, max(0.0, (budget_sec - elapsed_sec) / cooldown_sec))


def schedule(cfg: ExperimentConfig) -> Callable:
  """optax counts updates from 0; update number n (1-based) uses lrate(n)."""
  t = cfg.train
  return lambda count: learning_rate(count + 1, cfg.model.d_model, t.warmup_steps,
                                     t.learning_rate_scale, t.steps, t.cooldown_steps)


def make_optimizer(cfg: ExperimentConfig) -> optax.GradientTransformation:
  t = cfg.train
  return optax.adam(schedule(cfg), b1=t.adam_b1, b2=t.adam_b2, eps=t.adam_eps)
