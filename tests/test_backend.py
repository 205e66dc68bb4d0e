"""The backend seam: both model paths compute the paper's function, mixed precision keeps
float32 where it matters, and host-side CPU tricks stay on CPU hosts."""

import dataclasses
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t_jax import backend, hostmem, model, registry, train
from t2t_jax.config import ModelConfig, override
from t2t_jax.errors import UserError

CFG = ModelConfig(vocab_size=300, num_layers=2, d_model=64, d_ff=128, num_heads=4, d_k=16,
                  d_v=16, dropout=0.1)


def _loss_logits_grads(cfg: ModelConfig, params):
  rng = np.random.default_rng(0)
  inputs = jnp.asarray(rng.integers(4, cfg.vocab_size, (4, 12)), jnp.int32)
  targets = jnp.asarray(rng.integers(4, cfg.vocab_size, (4, 10)), jnp.int32)

  def loss(p):
    logits = model.Transformer(cfg).apply({"params": p}, inputs, targets, train=True,
                                          rngs={"dropout": jax.random.PRNGKey(1)})
    return jnp.mean(jax.nn.log_softmax(logits)[..., 5]), logits
  (value, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  return value, logits, grads


def _max_diff(a, b) -> float:
  return max(float(jnp.max(jnp.abs(x - y))) for x, y in
             zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


def test_plain_and_cpu_tuned_paths_compute_the_same_function_and_gradient():
  params = model.init_params(CFG, jax.random.PRNGKey(0))
  plain = _loss_logits_grads(dataclasses.replace(CFG, implementation="plain"), params)
  tuned = _loss_logits_grads(dataclasses.replace(CFG, implementation="cpu_tuned"), params)
  fused = _loss_logits_grads(dataclasses.replace(CFG, implementation="plain",
                                                 fused_attention=True), params)
  for other in (tuned, fused):
    assert _max_diff(plain[1], other[1]) < 1e-4
    assert _max_diff(plain[2], other[2]) < 1e-5
  assert backend.model_path("auto") == "cpu_tuned"  # these tests run on CPU


@pytest.mark.parametrize("implementation", ["plain", "cpu_tuned"])
def test_bf16_is_within_bf16_tolerance_of_float32(implementation):
  params = model.init_params(CFG, jax.random.PRNGKey(0))
  f32 = _loss_logits_grads(dataclasses.replace(CFG, implementation=implementation), params)
  bf16 = _loss_logits_grads(dataclasses.replace(CFG, implementation=implementation,
                                                dtype="bfloat16"), params)
  assert bf16[1].dtype == jnp.float32  # logits, hence softmax and loss, in float32
  assert all(g.dtype == jnp.float32 for g in jax.tree_util.tree_leaves(bf16[2]))
  # bf16 has 8 bits of mantissa: relative error ~2^-8 per product, a few times that summed.
  assert _max_diff(f32[1], bf16[1]) < 0.05 * float(jnp.max(jnp.abs(f32[1])))
  assert abs(float(f32[0] - bf16[0])) < 0.01 * abs(float(f32[0]))


def _dot_output_dtypes(cfg: ModelConfig) -> set[str]:
  params = model.init_params(cfg, jax.random.PRNGKey(0))
  tokens = jnp.ones((2, 6), jnp.int32)
  jaxpr = jax.make_jaxpr(lambda p: model.Transformer(cfg).apply({"params": p}, tokens, tokens))(
      params)
  # Every dot of the forward pass, nested jaxprs included, as printed: "c:bf16[2,6,128] = dot_general[".
  return set(re.findall(r":(\w+)\[[\d,]*\] = dot_general\[", str(jaxpr)))


def test_plain_bf16_keeps_activations_in_bf16_and_cpu_tuned_returns_float32():
  """On accelerators the matmul outputs (the activations between them) are bf16, halving their
  memory traffic; XLA:CPU runs bf16 x bf16 -> float32 dots faster than bf16 -> bf16 ones."""
  plain = _dot_output_dtypes(dataclasses.replace(CFG, implementation="plain", dtype="bfloat16"))
  tuned = _dot_output_dtypes(dataclasses.replace(CFG, implementation="cpu_tuned",
                                                 dtype="bfloat16"))
  assert plain == {"bf16"}
  assert tuned == {"f32"}


@pytest.mark.parametrize("implementation", ["plain", "cpu_tuned"])
def test_a_bf16_residual_stream_is_bf16_between_sub_layers_and_close_to_float32(implementation):
  """model.residual_dtype=bfloat16: LayerNorm outputs and embedding sums are bf16 (half the
  traffic between sub-layers); LayerNorm's statistics stay float32, so a stream whose mean
  is far from 0 still normalises as float32 does."""
  cfg = dataclasses.replace(CFG, implementation=implementation, dtype="bfloat16")
  lean = dataclasses.replace(cfg, residual_dtype="bfloat16")
  params = model.init_params(CFG, jax.random.PRNGKey(0))
  tokens = jnp.asarray(np.random.default_rng(0).integers(4, CFG.vocab_size, (2, 6)), jnp.int32)
  encode = lambda c: model.Transformer(c).apply({"params": params}, tokens,
                                                method=model.Transformer.encode)
  assert encode(cfg).dtype == jnp.float32 and encode(lean).dtype == jnp.bfloat16
  f32 = _loss_logits_grads(CFG, params)
  bf16 = _loss_logits_grads(lean, params)
  assert bf16[1].dtype == jnp.float32
  assert _max_diff(f32[1], bf16[1]) < 0.05 * float(jnp.max(jnp.abs(f32[1])))
  assert abs(float(f32[0] - bf16[0])) < 0.01 * abs(float(f32[0]))
  x = jnp.asarray(100.0 + 4.0 * np.random.default_rng(1).normal(size=(4, 64)), jnp.bfloat16)
  ln = model.layer_norm(lean)
  out = ln.apply(ln.init(jax.random.PRNGKey(0), x), x)
  expected = (np.float32(x) - np.float32(x).mean(-1, keepdims=True)) / np.sqrt(
      np.float32(x).var(-1, keepdims=True) + 1e-6)
  assert out.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.float32(out), expected, atol=0.05)


@pytest.mark.long
def test_bf16_loss_curve_tracks_float32_on_the_demo(tmp_path):
  sets = {"model.num_layers": 1, "model.d_model": 64, "model.d_ff": 128, "model.num_heads": 2,
          "model.d_k": 32, "model.d_v": 32, "train.steps": 40, "train.warmup_steps": 20,
          # 3x the paper's rate made the float32 run spike on 8 devices when the summation
          # order of its gradients changed by one rounding; 1.5x learns as fast, steadily.
          "train.learning_rate_scale": 1.5, "data.bucket_growth": 2.0,
          "train.log_every_steps": 10, "train.checkpoint_every_steps": 1000,
          "train.final_eval": False, "train.eval_every_steps": 1000,
          "train.tokens_per_step": 1024, "train.max_tokens_per_batch": 1024}
  curves = {}
  runs = {"float32": {"model.dtype": "float32"}, "bfloat16": {"model.dtype": "bfloat16"},
          "bf16 residual stream": {"model.dtype": "bfloat16", "model.residual_dtype": "bfloat16"}}
  for name, run in runs.items():
    workdir = tmp_path / name.replace(" ", "_")
    train.train_and_evaluate(override(registry.get("demo"), {**sets, **run}), str(workdir))
    rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
    curves[name] = np.array([r["loss"] for r in rows if "loss" in r])
  f32 = curves["float32"]
  assert f32[-1] < f32[0] - 0.2 < np.log(1000) - 2  # it learns: tracking is a real comparison
  for name in ("bfloat16", "bf16 residual stream"):
    assert len(curves[name]) == len(f32) == 4
    assert curves[name][-1] < curves[name][0] - 0.2
    # Rounding sends the runs down different paths: close, not equal (within 1% at step 10).
    np.testing.assert_allclose(curves[name], f32, rtol=0.05, err_msg=name)
  assert not np.array_equal(curves["bf16 residual stream"], curves["bfloat16"])


def test_host_platform_is_decided_without_initialising_jax(tmp_path):
  dev = tmp_path / "dev"
  dev.mkdir()
  assert backend.host_platform({"JAX_PLATFORMS": "cuda,cpu"}, str(dev), set()) == "gpu"
  assert backend.host_platform({"JAX_PLATFORMS": "cpu"}, str(dev), {"cuda"}) == "cpu"
  assert backend.host_platform({}, str(dev), {"cuda"}) == "cpu"  # a plugin but no GPU
  (dev / "nvidia0").touch()
  (dev / "nvidia1").touch()
  assert backend.host_platform({}, str(dev), {"cuda"}) == "gpu"
  assert backend.host_platform({}, str(dev), set()) == "cpu"  # a GPU but no plugin
  (dev / "accel0").touch()
  assert backend.host_platform({}, str(dev), {"tpu"}) == "tpu"


def test_member_shares_split_the_gpus_and_refuse_a_tpu_host(tmp_path):
  dev = tmp_path / "dev"
  dev.mkdir()
  for i in range(8):
    (dev / f"nvidia{i}").touch()
  shares = backend.member_shares(3, {}, str(dev), {"cuda"})
  assert [env["CUDA_VISIBLE_DEVICES"] for _, env in shares] == ["0,1,2", "3,4,5", "6,7"]
  visible = backend.member_shares(2, {"CUDA_VISIBLE_DEVICES": "4,6"}, str(dev), {"cuda"})
  assert [env["CUDA_VISIBLE_DEVICES"] for _, env in visible] == ["4", "6"]
  assert backend.member_shares(9, {}, str(dev), {"cuda"}) is None
  with pytest.raises(UserError, match="TPU"):
    backend.member_shares(2, {"JAX_PLATFORMS": "tpu"}, str(dev), set())
  cpu = backend.member_shares(1, {"JAX_PLATFORMS": "cpu"}, str(dev), set())
  assert backend.MEMBER_CPUS_ENV in cpu[0][1]


def test_huge_pages_are_only_for_a_cpu_backend():
  assert hostmem.huge_page_env({"JAX_PLATFORMS": "cuda"}) is None
  assert hostmem.huge_page_env({"JAX_PLATFORMS": "tpu"}) is None


def test_auto_micro_batch_fills_the_device_and_stays_4096_on_cpu(monkeypatch):
  """On one 80 GB GPU the paper's 25k-token update of base and big is one micro-batch; on
  8 GPUs each takes its 1/8; a 16 GB device accumulates; a CPU keeps its measured 4096;
  a number given by hand wins."""
  from t2t_jax import input_pipeline
  base = override(registry.get("base_ende"), {"model.dtype": "bfloat16"})
  big = override(registry.get("big_ende"), {"model.dtype": "bfloat16"})
  monkeypatch.setattr(backend, "platform", lambda: "gpu")
  monkeypatch.setattr(backend, "device_memory_bytes", lambda: int(0.75 * 80 * 2 ** 30))
  for cfg in (base, big):
    assert input_pipeline.micro_batch_tokens(cfg, 1) == 25_000
    assert input_pipeline.accumulation_steps(cfg, 1) == 1
    assert input_pipeline.micro_batch_tokens(cfg, 8) == 3125
  monkeypatch.setattr(backend, "device_memory_bytes", lambda: int(0.75 * 16 * 2 ** 30))
  small = input_pipeline.micro_batch_tokens(big, 1)
  assert small % backend.MICRO_BATCH_MULTIPLE == 0 and 1024 <= small < 25_000
  assert input_pipeline.accumulation_steps(big, 1) == -(-25_000 // small) > 1
  assert input_pipeline.micro_batch_tokens(
      override(base, {"train.max_tokens_per_batch": "2048"}), 1) == 2048
  monkeypatch.setattr(backend, "platform", lambda: "cpu")
  assert input_pipeline.micro_batch_tokens(base, 1) == backend.CPU_MICRO_BATCH_TOKENS == 4096
  assert input_pipeline.accumulation_steps(base, 1) == 7  # the paper's 25k in 4096s


def test_levers_resolve_per_backend(monkeypatch):
  assert backend.loss_chunk_tokens("auto") == 0  # these tests run on CPU
  assert backend.attention_implementation("bfloat16") is None
  monkeypatch.setattr(backend, "platform", lambda: "gpu")
  assert backend.loss_chunk_tokens("auto") == backend.LOSS_CHUNK_TOKENS
  assert backend.loss_chunk_tokens(0) == 0
  assert backend.attention_implementation("bfloat16") == "cudnn"
  assert backend.attention_implementation("float32") is None  # cuDNN takes no float32


def test_gpu_xla_flags_are_added_on_gpu_hosts_only_and_never_override_the_user():
  flag = backend.GPU_XLA_FLAGS[0]
  name = flag.split("=")[0]
  assert backend.xla_flags_for("cpu", "--a=1") == "--a=1"
  assert backend.xla_flags_for("gpu", "--a=1").split() == ["--a=1", *backend.GPU_XLA_FLAGS]
  mine = f"{name}=false"
  assert backend.xla_flags_for("gpu", mine).split().count(mine) == 1
  assert flag not in backend.xla_flags_for("gpu", mine)
  env = {"JAX_PLATFORMS": "cuda", "XLA_FLAGS": "--a=1"}
  backend.apply_xla_flags(env)
  assert flag in env["XLA_FLAGS"]
  env = {"JAX_PLATFORMS": "cuda", backend.XLA_FLAGS_OFF_ENV: "1"}
  backend.apply_xla_flags(env)
  assert "XLA_FLAGS" not in env
  env = {"JAX_PLATFORMS": "cpu"}
  backend.apply_xla_flags(env)
  assert "XLA_FLAGS" not in env


@pytest.mark.parametrize("platform, capability, auto", [
    ("cpu", None, "float32"), ("gpu", (9, 0), "bfloat16"), ("gpu", (8, 0), "bfloat16"),
    ("gpu", (7, 0), "float32"), ("gpu", (7, 5), "float32"), ("gpu", (6, 0), "float32"),
    ("tpu", None, "bfloat16")])
def test_model_dtype_auto_is_bf16_where_the_matrix_units_have_it(monkeypatch, platform,
                                                                 capability, auto):
  """bf16 on TPU and on GPUs from Ampere (H100 9.0, A100 8.0); float32 on V100 (7.0), T4
  (7.5) and P100 (6.0), which have no bf16 tensor cores, and on CPU."""
  monkeypatch.setattr(backend, "platform", lambda: platform)
  monkeypatch.setattr(backend, "_compute_capability", lambda: capability)
  assert backend.compute_dtype("auto") == auto
  assert backend.compute_dtype("float32") == "float32"  # a setting is kept as given
  assert backend.compute_dtype("bfloat16") == "bfloat16"
