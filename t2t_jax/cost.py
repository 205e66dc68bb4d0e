"""Training cost in FLOPs, as Table 2 estimates it and as the model's shapes count it.

Table 2's footnote: "We estimate the number of floating point operations used to train a
model by multiplying the training time, the number of GPUs used, and an estimate of the
sustained single-precision floating-point capacity of each GPU", with 2.8, 3.7, 6.0 and 9.5
TFLOPS for K80, K40, M40 and P100. Base trained 12 hours on 8 P100s (3.3e18), big 3.5 days
(2.3e19). The analytic count beside it is 6 FLOPs per parameter of each matrix product per
token it is applied to (forward 2, backward 4), encoder products per source token, decoder
products and the output layer per target token; attention's own score products (QK^T and
the weighted values) add 12 h d_k per query and key position, a few percent at sentence
lengths of ~30 and left out.
"""

from __future__ import annotations

from typing import Any

# Sustained single-precision TFLOPS: the paper's (Table 2's footnote), and for newer devices
# their vendors' FP32 (non-tensor-core) peak as the same kind of figure. A name inside another
# (L4 in L40S, H100 in H100 PCIe) is another device: the longest name a kind holds is its.
SUSTAINED_TFLOPS = {"K80": 2.8, "K40": 3.7, "M40": 6.0, "P100": 9.5,
                    "V100": 15.7, "T4": 8.1, "A100": 19.5, "L4": 30.3, "L40": 90.5,
                    "L40S": 91.6, "H100": 67.0, "H100 PCIe": 51.0, "H100 NVL": 60.0,
                    "H200": 67.0, "H200 NVL": 60.0}


def sustained_tflops(device_kind: str) -> float | None:
  """The table's figure for a device kind as JAX names it ("NVIDIA H100 80GB HBM3" -> 67.0,
  "NVIDIA H100 PCIe" -> 51.0); None for kinds it has none for (CPUs, TPUs)."""
  words = device_kind.lower().replace("-", " ").split()
  held = [name for name in SUSTAINED_TFLOPS
          if any(words[i:i + len(name.split())] == name.lower().split()
                 for i in range(len(words)))]
  return SUSTAINED_TFLOPS[max(held, key=len)] if held else None


def table2_flops(hours: float, devices: int, tflops: float) -> float:
  """Training time x number of devices x sustained rate (Table 2's estimate)."""
  return hours * 3600.0 * devices * tflops * 1e12


def analytic_flops(model_cfg: Any, steps: int, source_tokens: int, target_tokens: int
                   ) -> float:
  """6 x (matrix parameters x the tokens they see), over `steps` updates of
  `source_tokens` and `target_tokens` each."""
  m = model_cfg
  d, ff, h = m.d_model, m.d_ff, m.num_heads
  attention = d * h * (2 * m.d_k + m.d_v) + h * m.d_v * d      # Q, K, V and output
  feed_forward = 2 * d * ff
  encoder = m.num_encoder_layers * (attention + feed_forward)
  decoder = m.num_layers * (2 * attention + feed_forward)      # self- and cross-attention
  output = d * m.vocab_size
  per_step = source_tokens * encoder + target_tokens * (decoder + output)
  return 6.0 * per_step * steps


def summary(model_cfg: Any, steps: int, source_tokens: int, target_tokens: int,
            train_seconds: float, devices: int, device_kind: str) -> dict[str, Any]:
  """Both estimates for a run, as the end of training prints them and the sweep reports."""
  tflops = sustained_tflops(device_kind)
  return {"analytic_flops": analytic_flops(model_cfg, steps, source_tokens, target_tokens),
          "table2_flops": (table2_flops(train_seconds / 3600.0, devices, tflops)
                           if tflops else None),
          "device_kind": device_kind, "devices": devices, "sustained_tflops": tflops,
          "train_hours": round(train_seconds / 3600.0, 3)}


def describe(found: dict[str, Any]) -> str:
  table2 = (f"{found['table2_flops']:.2g} FLOPs as Table 2 estimates it ({found['train_hours']:g}"
            f" h x {found['devices']} x {found['sustained_tflops']:g} TFLOPS)"
            if found["table2_flops"] else
            f"no Table 2 estimate ({found['device_kind']} has no sustained-rate figure)")
  return f"training cost: {table2}; {found['analytic_flops']:.2g} FLOPs by the model's shapes"
