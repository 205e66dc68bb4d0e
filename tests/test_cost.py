"""Table 2's training cost: its own estimate reproduced from the paper's inputs, and the
count from a model's shapes checked by hand."""

import pytest

from t2t_jax import cost
from t2t_jax.config import ModelConfig


def test_table2s_estimates_come_back_from_the_papers_own_inputs():
  # Base: 12 hours on 8 P100s at 9.5 TFLOPS; big: 3.5 days (Table 2: 3.3e18 and 2.3e19).
  assert f"{cost.table2_flops(12, 8, cost.sustained_tflops('Tesla P100-SXM2-16GB')):.1e}" == \
      "3.3e+18"
  assert f"{cost.table2_flops(3.5 * 24, 8, 9.5):.1e}" == "2.3e+19"
  assert [cost.SUSTAINED_TFLOPS[k] for k in ("K80", "K40", "M40", "P100")] == [2.8, 3.7, 6.0,
                                                                                9.5]


def test_each_device_kind_reads_its_own_figure_not_one_whose_name_it_contains():
  # Vendors' FP32 (non-tensor-core) peaks: L4 30.3, L40 90.5, L40S 91.6; H100 SXM 67, PCIe 51,
  # NVL 60. "L4" is inside "L40S" and "H100" inside "H100 PCIe": each read the other's.
  kinds = {"NVIDIA L4": 30.3, "NVIDIA L40": 90.5, "NVIDIA L40S": 91.6,
           "NVIDIA H100 80GB HBM3": 67.0, "NVIDIA H100 PCIe": 51.0, "NVIDIA H100 NVL": 60.0,
           "NVIDIA A100-SXM4-80GB": 19.5, "Tesla V100-SXM2-16GB": 15.7}
  assert {k: cost.sustained_tflops(k) for k in kinds} == kinds
  assert cost.sustained_tflops("NVIDIA GeForce RTX 4090") is None


def test_the_encoder_is_charged_the_source_tokens_that_come_with_the_target_budget(tmp_path):
  """`train.tokens_per_step` counts target tokens. A parser's sentences are under half its
  trees' length: charging the encoder the target budget counted its products 2x or more."""
  import json
  from types import SimpleNamespace
  from t2t_jax import train
  from helpers import tiny_cfg
  cfg = tiny_cfg(**{"train.tokens_per_step": 1000})
  run = SimpleNamespace(cfg=cfg, ds=SimpleNamespace(source_per_target_token=lambda: 0.4),
                        clock=SimpleNamespace(elapsed=lambda: 60.0),
                        saver=SimpleNamespace(ckpt=SimpleNamespace(
                            directory=str(tmp_path / "checkpoints"))))
  train.record_cost(run, 7)
  found = json.loads((tmp_path / train.COST_FILE).read_text())
  assert found["analytic_flops"] == pytest.approx(cost.analytic_flops(cfg.model, 7, 400, 1000))
  assert found["analytic_flops"] < cost.analytic_flops(cfg.model, 7, 1000, 1000)


def test_a_device_without_a_figure_gets_no_table2_estimate():
  assert cost.sustained_tflops("cpu") is None
  assert cost.sustained_tflops("NVIDIA H100 80GB HBM3") == 67.0
  found = cost.summary(ModelConfig(), 10, 100, 100, 3600.0, 2, "cpu")
  assert found["table2_flops"] is None and "no Table 2 estimate" in cost.describe(found)


def test_the_count_from_the_shapes_by_hand():
  # One layer each, d 4, d_ff 8, 2 heads of d_k = d_v = 2, vocabulary 10.
  m = ModelConfig(num_layers=1, d_model=4, d_ff=8, num_heads=2, d_k=2, d_v=2, vocab_size=10)
  attention = 4 * 2 * 2 * 3 + 2 * 2 * 4        # Q, K, V: 4x(2x2) each; output: (2x2)x4 = 64
  feed_forward = 4 * 8 * 2                     # 64
  encoder, decoder, output = attention + feed_forward, 2 * attention + feed_forward, 40
  assert (attention, feed_forward) == (64, 64)
  by_hand = 6 * 3 * (5 * encoder + 7 * (decoder + output))  # 3 steps, 5 / 7 tokens a side
  assert cost.analytic_flops(m, 3, 5, 7) == pytest.approx(by_hand)
  # The paper's base model for its 100k steps of 25k tokens a side: 6 x 25,000 x (18.9M
  # encoder + 25.2M decoder + 18.9M output parameters) x 100,000 = 9.4e17, under a third of
  # Table 2's 3.3e18 estimate.
  assert f"{cost.analytic_flops(ModelConfig(), 100_000, 25_000, 25_000):.1e}" == "9.4e+17"
