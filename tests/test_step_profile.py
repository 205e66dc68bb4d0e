"""The step profile's parser, on a hand-written GPU trace and on a real CPU trace of a step."""

import numpy as np
import pytest

from t2t_jax.tools import step_profile

# The optimised HLO of a made-up GPU step: a cuBLAS product, a Triton product (a fusion that
# calls a dot), a reduction fusion, an elementwise fusion, a transpose fusion and an
# all-reduce, each with the JAX operation it came from.
HLO = """HloModule pmap_train_step

%fused_reduce (p0: f32[8,4]) -> f32[8] {
  %p0 = f32[8,4]{1,0} parameter(0)
  %c = f32[] constant(0)
  ROOT %r = f32[8]{0} reduce(f32[8,4]{1,0} %p0, f32[] %c), dimensions={1}, to_apply=%add
}

%fused_add (p0: f32[8,4], p1: f32[8,4]) -> f32[8,4] {
  %p0 = f32[8,4]{1,0} parameter(0)
  %p1 = f32[8,4]{1,0} parameter(1)
  ROOT %a = f32[8,4]{1,0} add(f32[8,4]{1,0} %p0, f32[8,4]{1,0} %p1)
}

%fused_transpose (p0: bf16[8,4]) -> bf16[4,8] {
  %p0 = bf16[8,4]{1,0} parameter(0)
  ROOT %t = bf16[4,8]{1,0} transpose(bf16[8,4]{1,0} %p0), dimensions={1,0}
}

%triton_gemm (p0: bf16[8,4], p1: bf16[4,4]) -> bf16[8,4] {
  %p0 = bf16[8,4]{1,0} parameter(0)
  %p1 = bf16[4,4]{1,0} parameter(1)
  ROOT %d = bf16[8,4]{1,0} dot(bf16[8,4]{1,0} %p0, bf16[4,4]{1,0} %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (x: bf16[8,4], w: bf16[4,4]) -> f32[8] {
  %x = bf16[8,4]{1,0} parameter(0)
  %w = bf16[4,4]{1,0} parameter(1)
  %custom-call.1 = (bf16[8,4]{1,0}, s8[1024]{0}) custom-call(bf16[8,4]{1,0} %x, bf16[4,4]{1,0} %w), custom_call_target="__cublas$lt$matmul", metadata={op_name="pmap(train_step)/jit(main)/encoder_0/self_attention/query/dot_general"}
  %fusion.2 = bf16[8,4]{1,0} fusion(bf16[8,4]{1,0} %x, bf16[4,4]{1,0} %w), kind=kCustom, calls=%triton_gemm, metadata={op_name="pmap(train_step)/jit(main)/transpose(jvp(Transformer))/decoder_1/ffn/wi/dot_general"}
  %fusion.3 = f32[8]{0} fusion(f32[8,4]{1,0} %y), kind=kInput, calls=%fused_reduce, metadata={op_name="pmap(train_step)/jit(main)/decoder_0/ln_ffn/reduce_sum"}
  %fusion.4 = f32[8,4]{1,0} fusion(f32[8,4]{1,0} %y, f32[8,4]{1,0} %z), kind=kLoop, calls=%fused_add, metadata={op_name="pmap(train_step)/jit(main)/optimizer/add"}
  %fusion.5 = bf16[4,8]{1,0} fusion(bf16[8,4]{1,0} %x), kind=kLoop, calls=%fused_transpose, metadata={op_name="pmap(train_step)/jit(main)/decoder_0/cross_attention/transpose"}
  %all-reduce.6 = f32[8]{0} all-reduce(f32[8]{0} %fusion.3), replica_groups={}, to_apply=%add, metadata={op_name="pmap(train_step)/jit(main)/pmean"}
  ROOT %fusion.7 = f32[8]{0} fusion(f32[8,4]{1,0} %y), kind=kInput, calls=%fused_reduce, metadata={op_name="pmap(train_step)/jit(main)/output_layer/reduce_max"}
}
"""

# Kernels on two streams of a GPU plane (microseconds: start, duration), one derived line that
# repeats a kernel (it must not count twice), and host events (which a GPU trace ignores).
KERNELS = [  # (stream, kernel name, hlo_op, start us, duration us)
    ("Stream #13(Compute)", "sm90_xmma_gemm_bf16bf16", "custom-call.1", 0, 40),
    ("Stream #13(Compute)", "triton_gemm_dot", "fusion.2", 40, 30),
    ("Stream #13(Compute)", "input_reduce_fusion", "fusion.3", 70, 5),
    ("Stream #13(Compute)", "loop_add_fusion", "fusion.4", 80, 10),
    ("Stream #13(Compute)", "loop_transpose_fusion", "fusion.5", 90, 5),
    ("Stream #14(Compute)", "ncclAllReduce", "all-reduce.6", 85, 20),
    ("Stream #13(Compute)", "input_reduce_fusion", "fusion.7", 110, 10),
]


def _gpu_trace_text() -> str:
  names = sorted({k[1] for k in KERNELS})
  meta = "".join(f' event_metadata {{ key: {i + 1} value {{ id: {i + 1} name: "{n}" }} }}'
                 for i, n in enumerate(names))
  lines = []
  for line_id, stream in enumerate(sorted({k[0] for k in KERNELS}) + ["XLA Ops"]):
    events = "".join(
        f" events {{ metadata_id: {names.index(name) + 1} offset_ps: {start * 10**6}"
        f" duration_ps: {dur * 10**6} stats {{ metadata_id: 1 str_value: \"{op}\" }} }}"
        for s, name, op, start, dur in KERNELS if s == stream or (
            stream == "XLA Ops" and op == "custom-call.1"))
    lines.append(f' lines {{ id: {line_id} name: "{stream}" timestamp_ns: 1000{events} }}')
  host = (' planes { id: 2 name: "/host:CPU" lines { id: 0 name: "python" timestamp_ns: 0'
          ' events { metadata_id: 1 offset_ps: 0 duration_ps: 999000000 } }'
          ' event_metadata { key: 1 value { id: 1 name: "fusion.4" } } }')
  return (f'planes {{ id: 1 name: "/device:GPU:0"{"".join(lines)}{meta}'
          f' stat_metadata {{ key: 1 value {{ id: 1 name: "hlo_op" }} }} }}{host}')


def test_the_parser_reads_a_gpu_trace_by_kind_region_and_busy_time():
  from jax.profiler import ProfileData
  data = ProfileData.from_text_proto(_gpu_trace_text())
  out = step_profile.breakdown(data.planes, HLO, steps=2, wall_sec=200e-6)
  assert out["source"] == "device"
  assert out["kernel_events"] == len(KERNELS)           # the derived line's copy not counted
  ms = lambda us: round(us / 2 / 1000, 3)               # two steps in the trace
  assert out["kinds"] == {
      "matrix products": {"ms": ms(70), "share": round(70 / 120, 3)},
      "fusions": {"ms": ms(10), "share": round(10 / 120, 3)},
      "reductions": {"ms": ms(15), "share": round(15 / 120, 3)},
      "copies and transposes": {"ms": ms(5), "share": round(5 / 120, 3)},
      "collectives": {"ms": ms(20), "share": round(20 / 120, 3)}}
  assert {r: v["ms"] for r, v in out["regions"].items()} == {
      "encoder self-attention": ms(40), "feed-forward": ms(30), "LayerNorm": ms(5),
      "optimizer": ms(10), "decoder cross-attention": ms(5), "other": ms(20),
      "output layer and loss": ms(10)}
  # Busy: 0-75 us, 80-105 us (the all-reduce overlaps the stream's kernels), 110-120 us.
  assert out["busy_ms_per_step"] == ms(110)
  assert out["wall_ms_per_step"] == 0.1 and out["busy_over_wall"] == round(110 / 200, 3)
  assert [t["instruction"] for t in out["top"][:2]] == ["custom-call.1", "fusion.2"]
  assert out["top"][0]["from"].startswith("jit(main)/encoder_0/self_attention/query")


def test_regions_follow_the_module_path_and_the_named_scopes():
  r = step_profile.region_of
  assert r("pmap(f)/transpose(jvp(Transformer))/encoder_3/self_attention/key/dot_general") == \
      "encoder self-attention"
  assert r("pmap(f)/decoder_0/self_attention/attention_weights") == "decoder self-attention"
  assert r("pmap(f)/decoder_0/ln_self_attention/mul") == "LayerNorm"
  assert r("pmap(f)/encoder_1/ffn/wo/add") == "feed-forward"
  assert r("pmap(f)/embed/take") == "embeddings"
  assert r("pmap(f)/output_layer/custom_vjp_call") == "output layer and loss"
  assert r("pmap(f)/optimizer/sqrt") == "optimizer"
  assert r("pmap(f)/pmean") == "other"


def test_a_cpu_trace_of_the_trainers_step_covers_every_region():
  """A real trace of the trainer's pmapped step on XLA:CPU: every instruction event is
  classified; the model's regions, the output layer with its loss and the optimiser all
  show; busy time is at most the wall time (one thread's union), and the kernels' sum at
  least the busy time."""
  import jax
  from t2t_jax import optim, parallel, train
  from t2t_jax.config import override
  from helpers import tiny_cfg
  cfg = override(tiny_cfg(), {"train.tokens_per_step": 64, "train.max_tokens_per_batch": 64})
  optimizer = optim.make_optimizer(cfg)
  p_train, _ = train.make_steps(cfg, optimizer, devices=jax.local_devices()[:1])
  rng = np.random.default_rng(0)
  batch = parallel.shard({k: rng.integers(4, cfg.model.vocab_size, (1, 1, 8, 8)).astype(
      np.int32) for k in ("inputs", "targets")}, 1)
  box = [parallel.replicate(train.init_state(cfg, optimizer), 1)]
  key = parallel.replicate(jax.random.PRNGKey(0), 1)

  def one():
    box[0], metrics = p_train(box[0], batch, key)
    return metrics
  one()
  hlo = p_train.lower(box[0], batch, key).compile().as_text()
  out = step_profile.profile(one, hlo, steps=3)
  assert out["source"] == "host" and out["kernel_events"] > 0
  assert out["kinds"]["matrix products"]["ms"] > 0
  for region in ("encoder self-attention", "decoder self-attention", "decoder cross-attention",
                 "feed-forward", "LayerNorm", "output layer and loss", "optimizer"):
    assert out["regions"].get(region, {}).get("ms", 0) > 0, (region, out["regions"])
  assert sum(v["share"] for v in out["kinds"].values()) == pytest.approx(1, abs=0.01)
  assert sum(v["ms"] for v in out["regions"].values()) == pytest.approx(
      out["kernel_ms_per_step"], rel=0.01)
  assert out["busy_ms_per_step"] <= out["wall_ms_per_step"]
  assert out["busy_ms_per_step"] <= out["kernel_ms_per_step"] + 1e-3
