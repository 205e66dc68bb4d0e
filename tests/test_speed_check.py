"""The GPU speed check's arithmetic: the peak it trusts, the ratios and the 8-GPU projection."""

import json
import types

import pytest

from t2t_jax.tools import speed_check


def test_a_peak_far_below_what_this_gpu_kind_reaches_is_suspect_not_divided_by():
  # The 2026-11-26 H200 check read 603 TFLOP/s; machines like ours reach 769-798.
  low = speed_check.peak_reading(603e12, "NVIDIA H200")
  assert low["suspect"] and "603" in low["note"] and low["datasheet"] == 989e12
  assert low["measured_over_datasheet"] == pytest.approx(0.61, abs=0.01)
  assert not speed_check.peak_reading(780e12, "NVIDIA H100 80GB HBM3")["suspect"]
  assert speed_check.device_family("NVIDIA H100 80GB HBM3") == "H100"
  assert speed_check.peak_reading(1e12, "cpu")["suspect"] is False  # nothing to compare with


def _data(quick=False):
  train = {"target_tokens_per_sec": 900e3, "achieved_flops_per_sec": 4e14, "steps_per_sec": 35}
  big = {"target_tokens_per_sec": 300e3, "achieved_flops_per_sec": 4.5e14}
  share = {"steps_per_sec": 200.0, "params": 63_000_000, "batch": 100, "length": 32, "accum": 1}
  return {"quick": quick,
          "trainer": {"loop_ms_per_step": 31.0},
          "jax": {"device": {"kind": "NVIDIA H100 80GB HBM3", "jax": "0.11"},
                  "matmul_peak": 780e12, "train base {}": train, "train big {}": big,
                  'train base {"share_of": 8}': share,
                  'train base {"model.fused_attention": true}': {"target_tokens_per_sec": 990e3},
                  "bare_step": {"steps_per_sec": 35.0},
                  "decode": {"sentences_per_sec": 5000.0}},
          "peers": {"peer train base": {"target_tokens_per_sec": 500e3},
                    "peer train base compile": {"target_tokens_per_sec": 600e3},
                    "peer train big": {"error": "exited with 1"},
                    "peer decode base": {"sentences_per_sec": 2500.0}}}


def test_summary_compares_with_the_faster_peer_and_checks_each_target():
  s = speed_check.summarise(_data())
  assert s["base_over_peer"] == {"value": 1.5, "target": 1.3, "met": True}  # 900k / 600k
  assert s["big_over_peer"]["value"] is None and s["big_over_peer"]["met"] is None
  assert s["big_target_tokens_per_sec"]["met"] is False  # 300k < 320k
  assert s["loop_over_step"]["value"] == pytest.approx(31.0 / (1e3 / 35), abs=1e-3)
  assert s["loop_over_step"]["met"] is False  # 31 ms of trainer over a 28.6 ms step: 1.085
  assert s["decode_over_peer"] == {"value": 2.0, "target": 1.5, "met": True}
  assert s["levers_over_defaults"] == {'train base {"model.fused_attention": true}': 1.1}
  assert s["base_measured_peak_fraction"] == round(4e14 / 780e12, 4)
  assert s["failed"] == {"peer train big": "exited with 1"}
  assert all(v["met"] is None for k, v in speed_check.summarise(_data(quick=True)).items()
             if isinstance(v, dict) and "met" in v)


def test_eight_gpu_projection_adds_the_ring_allreduce_to_the_share_step():
  p = speed_check.summarise(_data())["base_8_gpus"]
  # 5 ms measured; ring all-reduce: 2 * 7/8 * 4 bytes * 63M / 400 GB/s = 1.1025 ms.
  assert p["projection"] and p["measured_share_step_ms"] == 5.0
  assert p["allreduce_ms"] == pytest.approx(1.10, abs=0.01)
  assert p["target_tokens_per_sec"] == round(8 * 3200 / 6.1025e-3)


def test_xla_levers_are_ratios_to_the_defaults_measured_beside_them():
  data = {"quick": False, "jax": {},
          "xla defaults": {"xla_flag": "", "train base {}": {"target_tokens_per_sec": 500e3}},
          "xla cuBLAS products only (no Triton GEMM)": {
              "xla_flag": "--xla_gpu_enable_triton_gemm=false",
              "train base {}": {"target_tokens_per_sec": 550e3}},
          "xla cuBLASLt products": {"xla_flag": "--xla_gpu_enable_cublaslt=true",
                                    "error": "exited with 1"}}
  s = speed_check.summarise(data)
  assert s["levers_over_defaults"] == {"xla: cuBLAS products only (no Triton GEMM)": 1.1,
                                       "xla: cuBLASLt products": None}


def test_the_bf16_result_peak_is_read_beside_the_float32_result_peak():
  data = _data()
  data["jax"]["matmul_peak_bf16_out"] = 700e12
  s = speed_check.summarise(data)
  assert s["matmul_peak_bf16_out"] == 700e12
  assert s["matmul_peak_bf16_out_over_f32_out"] == round(700 / 780, 3)


def test_a_real_run_is_read_against_the_synthetic_step_of_the_same_call():
  data = _data()
  data["real_run_packed"] = {"steady_target_tokens_per_sec": 850e3,
                             "seconds_to_steady_state": 95.0}
  data["real_run_bucketed"] = {"steady_target_tokens_per_sec": 700e3,
                               "seconds_to_steady_state": 400.0}
  s = speed_check.summarise(data)
  # 850k real tok/s over the synthetic 900k: 0.944 >= 0.9; 700k: 0.778.
  assert s["real_run_packed_over_synthetic"] == {"value": 0.944, "target": 0.9, "met": True}
  assert s["real_run_bucketed_over_synthetic"]["met"] is False
  assert s["real_run_packed_seconds_to_steady_state"]["met"] is True
  assert s["real_run_bucketed_seconds_to_steady_state"] == {"value": 400.0, "target": 120.0,
                                                            "met": False}


def _fake_real_run_check(monkeypatch, tmp_path, budget_s, batching, spends, sets=()):
  """speed_check.run(real_run=True) with its runs replaced by stand-ins that advance a fake
  clock by `spends[part]` seconds; returns the parts that ran and the JSON written."""
  clock = [1000.0]
  ran = []
  monkeypatch.setattr(speed_check.time, "time", lambda: clock[0])
  def corpus(quick, root, data):
    clock[0] += spends["corpus"]
    return {"corpus": str(tmp_path / "c")}
  def real_run(quick, corpus_dir, root, log, packing, extra):
    name = "packed" if packing else "bucketed"
    ran.append(name + "".join(f" {x}" for x in extra))
    clock[0] += spends[name]
    return {"steady_target_tokens_per_sec": 1.0, "seconds_to_steady_state": 1.0}
  def run_lines(cmd, env, timeout, log):
    ran.append("synthetic")
    clock[0] += spends["synthetic"]
    return [], None
  monkeypatch.setattr(speed_check, "_real_run_corpus", corpus)
  monkeypatch.setattr(speed_check, "_real_run", real_run)
  monkeypatch.setattr(speed_check, "_run_lines", run_lines)
  out = tmp_path / "check.json"
  speed_check.run(False, str(out), real_run=True, budget_s=budget_s, real_run_batching=batching,
                  real_run_sets=sets)
  return ran, json.loads(out.read_text())


def test_the_bucketed_real_run_starts_only_with_the_time_it_may_need(monkeypatch, tmp_path):
  # As on the H200 (2026-11-28): corpus 12 s, packed 200 s, synthetic 52 s; 276 s were then
  # left of 540, and a bucketed run that compiled 31 programs for over 200 s did not fit them.
  spends = {"corpus": 12, "packed": 200, "synthetic": 52, "bucketed": 500}
  ran, data = _fake_real_run_check(monkeypatch, tmp_path, None, "both", spends)
  assert ran == ["packed", "synthetic"]
  assert "real_run_batching=bucketed" in data["real_run_bucketed"]["skipped"]
  ran, _ = _fake_real_run_check(monkeypatch, tmp_path, None, "bucketed", spends)
  assert ran == ["synthetic", "bucketed"]  # alone, it fits the 540 s: 64 s spent, 450 needed
  ran, _ = _fake_real_run_check(monkeypatch, tmp_path, 2000, "both", spends)
  assert ran == ["packed", "synthetic", "bucketed"]


def test_the_real_runs_take_the_users_sets(monkeypatch, tmp_path):
  spends = {"corpus": 1, "packed": 1, "synthetic": 1, "bucketed": 1}
  ran, _ = _fake_real_run_check(monkeypatch, tmp_path, 2000, "both", spends,
                                sets=["model.fused_attention=true"])
  assert ran == ["packed model.fused_attention=true", "synthetic",
                 "bucketed model.fused_attention=true"]


def test_bench_packed_rows_fill_every_row_with_paired_sentences():
  """`bench --what=train --segment_mean`'s rows: no padding, each row ends a sentence, the
  source and target rows end sentences at the same places (the pairs' counts agree, which
  the model pairs them by), and the lengths average near the asked mean."""
  import numpy as np
  from t2t_jax.model import segments
  from t2t_jax.special_tokens import EOS_ID, PAD_ID
  from t2t_jax.tools.bench_step import packed_rows
  src, tgt = packed_rows(np.random.default_rng(0), 64, 128, 25.0, 100)
  assert src.shape == tgt.shape == (64, 128)
  assert not (src == PAD_ID).any() and (tgt[:, -1] == EOS_ID).all()
  np.testing.assert_array_equal(src == EOS_ID, tgt == EOS_ID)
  ids = np.asarray(segments(tgt).ids)
  lengths = np.concatenate([np.bincount(row)[1:] for row in ids])
  assert lengths.min() >= 2 and 20 < lengths.mean() < 30, lengths.mean()


def test_packed_attention_cases_read_against_the_synthetic_step():
  """`--packed_attention`'s summary: each packed case's tok/s over the synthetic step of the
  same call, apart from the levers; a case that failed reads None."""
  cases = speed_check.packed_attention_cases(quick=False)
  keys = [f"train {name} {json.dumps(sets, sort_keys=True)}" for name, sets in cases]
  assert keys[0] == "train base {}" and len(keys) == 4
  rates = [600e3, 540e3, 570e3, None]
  jax_parts = {k: ({"target_tokens_per_sec": r} if r else {"error": "UserError: Hopper"})
               for k, r in zip(keys, rates)}
  s = speed_check.summarise({"jax": jax_parts})
  assert s["packed_over_synthetic"] == {keys[1]: 0.9, keys[2]: 0.95, keys[3]: None}
  assert "levers_over_defaults" not in s


def test_a_packed_case_times_the_same_tokens_in_packed_rows(monkeypatch):
  """A packed case hands the step benchmark the synthetic step's tokens as rows of its
  length with sentences packed in them, and the rest of its sets as config (micro-batches
  as on a GPU)."""
  from t2t_jax.tools import bench_step
  seen = {}

  def prepare_train(cfg, name, n, batch, length, accum, segment_mean):
    seen.update(batch=batch, length=length, accum=accum, segment_mean=segment_mean,
                fused=cfg.model.fused_attention, layout=cfg.model.segment_attention)
    return types.SimpleNamespace(cfg=cfg)
  monkeypatch.setattr(bench_step, "prepare_train", prepare_train)
  monkeypatch.setattr(bench_step, "time_train", lambda *a, **k: {})
  monkeypatch.setattr(speed_check, "_peak_memory", lambda: None)
  from t2t_jax import input_pipeline  # a GPU's micro-batch: the whole step at once
  monkeypatch.setattr(input_pipeline, "micro_batch_tokens",
                      lambda cfg, n: cfg.train.tokens_per_step)
  name, sets = speed_check.packed_attention_cases(quick=False)[3]
  speed_check._train_case(name, False, sets, 1)
  assert seen["batch"] * seen["accum"] * seen["length"] == speed_check.ROWS * speed_check.LENGTH
  assert seen["length"] == speed_check.PACKED_ROW
  assert seen["segment_mean"] == speed_check.SEGMENT_MEAN
  assert seen["fused"] and seen["layout"] == "offsets"
  speed_check._train_case("base", False, {}, 1)  # the synthetic step: one sentence a row
  assert (seen["length"], seen["segment_mean"]) == (speed_check.LENGTH, None)


def test_cases_compiled_ahead_are_timed_with_their_programs_and_keep_their_errors(
    monkeypatch, capsys):
  """With `compile_ahead` every case's step is compiled before any is timed, and the timings
  run those programs: the pmapped step itself is never called. A case that cannot compile
  (the packed layout on this CPU) reports its own error; the others are still timed."""
  from t2t_jax.tools import bench_step
  prepare = bench_step.prepare_train

  class CompileOnly:
    def __init__(self, p_train):
      self.lower = p_train.lower

    def __call__(self, *args):
      raise AssertionError("the step was called instead of its program compiled ahead")

  def prepare_train(*args, **kwargs):
    bench = prepare(*args, **kwargs)
    bench.p_train.fn = CompileOnly(bench.p_train.fn)
    return bench
  monkeypatch.setattr(bench_step, "prepare_train", prepare_train)
  offsets = {"model.fused_attention": True, "model.segment_attention": "offsets",
             "packed_rows_of": speed_check.QUICK_PACKED_ROW}
  cases = [("base", {}), ("base", offsets)]
  speed_check.jax_part({"quick": True, "train": cases, "compile_ahead": True})
  parts = {line["part"]: line["value"] for line in map(json.loads,
                                                       capsys.readouterr().out.splitlines())}
  keys = [speed_check._case_key(name, sets) for name, sets in cases]
  assert parts["compile_ahead"]["failed"] == keys[1:]
  assert parts[keys[0]]["compiled_ahead"] and parts[keys[0]]["target_tokens_per_sec"] > 0
  assert "Hopper" in parts[keys[1]]["error"]


def test_a_case_that_cannot_compile_ahead_from_shapes_is_timed_compiling_at_its_first_call(
    monkeypatch, capsys):
  """Compiling ahead lowers the step from the state's shapes; should that fail where a first
  call compiles (a JAX version, say), the case is still timed, and says why it was not
  compiled ahead."""
  from t2t_jax.tools import bench_step

  def compile(self):
    raise TypeError("shapes refused")
  monkeypatch.setattr(bench_step.TrainBench, "compile", compile)
  speed_check.jax_part({"quick": True, "train": [("base", {})], "compile_ahead": True})
  parts = {line["part"]: line["value"] for line in map(json.loads,
                                                       capsys.readouterr().out.splitlines())}
  case = parts[speed_check._case_key("base", {})]
  assert case["target_tokens_per_sec"] > 0 and not case.get("compiled_ahead")
  assert case["compile_ahead_error"] == "TypeError: shapes refused"


def test_the_packed_layout_agreement_part_reads_both_layouts(monkeypatch):
  """`--packed_attention`'s first part on this CPU, cuDNN's documented behaviour standing in
  for the kernel: the layouts agree; a kernel that drops a sentence's attention does not."""
  import jax.numpy as jnp
  from helpers import offsets_layout_on_cpu, packed_layout_reference
  offsets_layout_on_cpu(monkeypatch)
  s = speed_check.summarise({"jax": {
      "packed_layout_agreement": speed_check.packed_layout_agreement(quick=True)}})
  assert s["packed_layout_agreement"]["agrees"], s["packed_layout_agreement"]

  def drops_the_first_sentence(q, k, v, q_seqlen, *rest):
    return packed_layout_reference(q, k, v, q_seqlen.at[:, 0].set(-1), *rest)
  offsets_layout_on_cpu(monkeypatch, drops_the_first_sentence)
  s = speed_check.summarise({"jax": {
      "packed_layout_agreement": speed_check.packed_layout_agreement(quick=True)}})
  assert not s["packed_layout_agreement"]["agrees"]
