"""What runs differently on CPU, GPU and TPU: every such decision is made here.

The model and the trainer are the plain JAX/Flax code. Each function below names one
path that only XLA:CPU takes, and why; a GPU or TPU takes the plain path unless a
measurement there (results/device_check/) shows a custom one is faster.
The functions that start processes (`host_platform`, `member_shares`) decide without
initialising JAX: on a GPU that would claim the device's memory before the children
that need it exist.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
from typing import Any, Callable, Literal, Mapping, Sequence

from t2t_jax.errors import UserError

Platform = Literal["cpu", "gpu", "tpu"]
ModelPath = Literal["plain", "cpu_tuned"]

# Set by the ensemble and sweep commands for each member run: the CPUs it may use.
MEMBER_CPUS_ENV = "T2T_JAX_MEMBER_CPUS"


def _canonical(name: str) -> str:
  name = name.strip().lower()
  return "gpu" if name in ("cuda", "rocm", "gpu") else name


def platform() -> str:
  """The backend the arrays live on (initialises JAX): "cpu", "gpu" or "tpu"."""
  import jax
  return _canonical(jax.default_backend())


def model_path(implementation: str) -> ModelPath:
  """`model.implementation` resolved: "auto" is "cpu_tuned" on CPU and "plain" elsewhere.

  cpu_tuned: bf16 x bf16 -> float32 dots with float32 activations (AMX runs these ~4x faster
  than float32, while bf16-out dots are slower on XLA:CPU), float32 gradient dots (XLA:CPU
  cannot run some bf16 x bf16 -> float32 gradient dots) and a hand-written pre-softmax
  gradient (XLA:CPU copied the [tokens, vocab] gradient into transposed order). plain: Flax's
  own mixed precision, bf16 activations between the matmuls, autodiff everywhere.
  """
  if implementation == "auto":
    return "cpu_tuned" if platform() == "cpu" else "plain"
  if implementation not in ("plain", "cpu_tuned"):
    raise ValueError(f"model.implementation={implementation!r}")
  return implementation  # type: ignore[return-value]


# bf16 tensor cores begin with Ampere (compute capability 8.0: A100, A10, RTX 30xx); V100
# (7.0), T4 (7.5) and P100 (6.0) have none, and emulate bf16 at no gain over float32.
BF16_CAPABILITY = (8, 0)


def compute_dtype(setting: str) -> str:
  """`model.dtype` resolved: "auto" is bfloat16 on TPU and on GPUs from Ampere on, whose
  matrix units run bf16 several times faster than float32 (every speed figure in results/ is
  bf16); float32 on older GPUs (`BF16_CAPABILITY`: fp16 with loss scaling, as fairseq runs
  V100s, is not implemented here) and on CPU, where bf16 gains little without AMX and the
  paper's arithmetic costs nothing extra."""
  if setting == "auto":
    if platform() == "cpu":
      return "float32"
    if platform() == "gpu" and (_compute_capability() or BF16_CAPABILITY) < BF16_CAPABILITY:
      return "float32"
    return "bfloat16"
  if setting not in ("float32", "bfloat16"):
    raise ValueError(f"model.dtype={setting!r}")
  return setting


def fused_projections(setting: bool | str) -> bool:
  """`model.fused_projections` resolved: "auto" is on for GPU and TPU, off on CPU.

  On a GPU, Q, K and V as three [d, d] products leave each weight gradient's [d, d] output
  (K = all of the micro-batch's tokens) too small to fill the multiprocessors; one [d, 3d]
  product fills three times as many. On XLA:CPU one product measured slower (base, bf16,
  64 x 64 tokens, 2-core Xeon, 2026-11-27: 0.072 and 0.064 steps/s fused against 0.079 and
  0.076 unfused), so CPU keeps the three layers.
  """
  if setting == "auto":
    return platform() != "cpu"
  return bool(setting)


def allreduce_as_one_buffer() -> bool:
  """Whether the step's gradient all-reduce should be one flat buffer, not one per tensor.

  XLA combines the step's all-reduces into one tuple all-reduce, but across processes
  on CPU (gloo) each tuple element is its own exchange: ~4 ms each, 130 ms per step for
  the 34 tensors of a one-layer model. GPUs and TPUs reduce the tuple in one launch, so
  the extra concatenate and split would only cost memory traffic there.
  """
  return platform() == "cpu"


# --- step levers: each "auto" setting resolved per backend ------------------------------

# XLA:CPU's best micro-batch: larger ones leave the caches and run slower per token
# (results/trainer_overhead/); also the default where a device reports no memory.
CPU_MICRO_BATCH_TOKENS = 4096
# The share of a device's allocatable memory (XLA's `bytes_limit`, itself ~75% of the GPU's
# memory by default) that the auto micro-batch may fill by its estimate. The estimate
# (`model.train_bytes_per_token`) is rough, so the rest is the margin for it and for XLA's
# temporaries.
MICRO_BATCH_MEMORY_FRACTION = 0.8
MICRO_BATCH_MULTIPLE = 1024  # auto sizes are rounded down to this many tokens


def device_memory_bytes() -> int | None:
  """Memory XLA may allocate on the first local device, or None where it is not reported."""
  import jax
  try:
    stats = jax.local_devices()[0].memory_stats()
  except Exception:  # some backends do not implement memory_stats
    return None
  return int(stats["bytes_limit"]) if stats and stats.get("bytes_limit") else None


def micro_batch_tokens(setting: int | str, tokens_per_device: int,
                       memory_estimate: Callable[[], tuple[float, float]]) -> int:
  """`train.max_tokens_per_batch` resolved: tokens per device per micro-batch.

  "auto": on CPU, CPU_MICRO_BATCH_TOKENS. On a GPU or TPU, the whole per-device share of
  the update (`tokens_per_device`) when its estimated training memory fits the device, so
  the paper's 25k-token update runs as one micro-batch on one 80 GB GPU; else the largest
  multiple of MICRO_BATCH_MULTIPLE that fits. Large micro-batches keep the GPU's kernels
  large: the 2026-11-26 H200 check ran base at 271k target tok/s with 4k tokens per
  micro-batch and 603k with 16k. `memory_estimate()` gives (bytes per token, fixed bytes);
  it is called only when the device's memory decides.
  """
  if setting != "auto":
    return int(setting)
  if platform() == "cpu":
    return CPU_MICRO_BATCH_TOKENS
  memory = device_memory_bytes()
  if memory is None:
    return CPU_MICRO_BATCH_TOKENS
  bytes_per_token, fixed_bytes = memory_estimate()
  fit = (MICRO_BATCH_MEMORY_FRACTION * memory - fixed_bytes) / bytes_per_token
  if fit >= tokens_per_device:
    return int(tokens_per_device)
  return max(MICRO_BATCH_MULTIPLE, int(fit) // MICRO_BATCH_MULTIPLE * MICRO_BATCH_MULTIPLE)


def packing(setting: bool | str) -> bool:
  """`data.packing` resolved: "auto" packs on every backend, as measured.

  On an accelerator each step shape costs a compilation (41 s for base on an H200,
  2026-11-27) and a TPU tolerates few shapes; packed, base_ende meets 1 step shape on
  WMT-shaped data instead of 28, with 0.6% of the target slots padding instead of 8.9%
  (results/packing/README.md). On one H200 (2026-11-28) a packed base_ende run reached
  0.877x the synthetic step's tok/s, steady 114 s after launch with 7 programs compiled;
  the bucketed run was still compiling 31 programs after 200 s.
  """
  if setting == "auto":
    return True
  return bool(setting)


# Tokens per chunk of the chunked output layer and loss on GPU and TPU: a [4096, 37k] float32
# chunk of logits is 0.6 GB, against 3.7 GB for the whole of a 25k-token micro-batch.
LOSS_CHUNK_TOKENS = 4096


def loss_chunk_tokens(setting: int | str) -> int:
  """`train.loss_chunk_tokens` resolved: 0 computes the whole [tokens, vocab] logits at once.

  "auto": 0 on CPU, where the cpu_tuned path's hand-written logits gradient is measured
  (results/trainer_overhead/); LOSS_CHUNK_TOKENS on GPU and TPU, where the full float32
  logits of a large micro-batch cost gigabytes of memory and several passes of memory
  traffic (`loss.chunked_loss_sums` forms each chunk's gradient in its forward pass).
  """
  if setting != "auto":
    return int(setting)
  return 0 if platform() == "cpu" else LOSS_CHUNK_TOKENS


# Source tokens per device in one beam-search batch. XLA:CPU's search costs in proportion to
# its rows, and 2,048 tokens (about 64 sentences) measured best there. A GPU's search step
# costs nearly the same from a few sentences up to about 1,024 (one kernel per operation
# either way), so a GPU or TPU takes 1,024 sentences of 32 tokens at once; their caches in bf16
# (4 beams, 6 layers, 82 positions) are about 4 GB for base, 8 GB for big.
CPU_DECODE_BATCH_TOKENS = 2048
DEVICE_DECODE_BATCH_TOKENS = 32768


def decode_batch_tokens(setting: int | str) -> int:
  """`decode.batch_tokens` resolved: "auto" is CPU_DECODE_BATCH_TOKENS on CPU and
  DEVICE_DECODE_BATCH_TOKENS on GPU and TPU."""
  if setting != "auto":
    return int(setting)
  return CPU_DECODE_BATCH_TOKENS if platform() == "cpu" else DEVICE_DECODE_BATCH_TOKENS


def attention_implementation(dtype: str) -> str | None:
  """`jax.nn.dot_product_attention`'s implementation for the fused attention path: cuDNN's
  fused kernel on a GPU in bf16 (it takes no float32); XLA's own elsewhere."""
  return "cudnn" if compute_dtype(dtype) == "bfloat16" and platform() == "gpu" else None


# cuDNN's packed layout (a row's sentences as sequences of their own) needs compute
# capability 9.0 (Hopper) or later (jax._src.cudnn.fused_attention_stablehlo says so).
PACKED_LAYOUT_CAPABILITY = (9, 0)


def _compute_capability() -> tuple[int, ...] | None:
  import jax
  capability = getattr(jax.devices()[0], "compute_capability", None)
  try:
    return tuple(int(x) for x in str(capability).split("."))
  except ValueError:
    return None


def segment_attention(setting: str, dtype: str) -> str:
  """`model.segment_attention` resolved, for the fused attention path on packed rows:
  "offsets" (cuDNN's packed layout) or "bias" (a mask over the whole row).

  "auto" is bias, the layout the fused path has run on an H200 (2026-11-27, 0.95x the
  einsum path at 32 tokens a row). Offsets have not run on a GPU yet (2026-11-28): `bench
  --what=speed_check --packed_attention` checks them against bias on one packed batch and
  times the step at packed shapes with each.
  """
  if setting == "offsets":
    capability = _compute_capability() or (0,)
    if attention_implementation(dtype) != "cudnn" or capability < PACKED_LAYOUT_CAPABILITY:
      raise UserError("model.segment_attention=offsets runs cuDNN's packed layout: it needs "
                      "model.dtype=bfloat16 on a Hopper or newer GPU (this is "
                      f"{platform()}); use bias or auto")
    if importlib.util.find_spec("jax._src.cudnn.fused_attention_stablehlo") is None:
      import jax
      raise UserError(f"model.segment_attention=offsets: jax {jax.__version__} has no "
                      "jax._src.cudnn.fused_attention_stablehlo (the packed layout's entry "
                      "point); use bias or auto")
    return "offsets"
  return "bias"


def resolved_levers(cfg: Any) -> dict[str, Any]:
  """Each setting this module decides, as this backend resolves the config's value ("auto"
  or the user's): what the start-up line and `--mode=config` print."""
  m, t = cfg.model, cfg.train
  out = {"model.dtype": compute_dtype(m.dtype),
         "model.implementation": model_path(m.implementation),
         "model.fused_projections": fused_projections(m.fused_projections),
         "data.packing": packing(cfg.data.packing),
         "train.loss_chunk_tokens": loss_chunk_tokens(t.loss_chunk_tokens),
         "decode.batch_tokens": decode_batch_tokens(cfg.decode.batch_tokens)}
  if m.fused_attention:
    out["model.segment_attention"] = segment_attention(m.segment_attention, m.dtype)
  return out


# XLA options set on GPU hosts before JAX starts (`apply_xla_flags`), appended to the user's
# XLA_FLAGS; a flag the user set already is left as the user set it. The latency-hiding
# scheduler orders the step so that the gradient all-reduce of one layer overlaps the
# backward pass of the next (JAX's GPU performance guide recommends it for data parallelism);
# on one GPU it has nothing to overlap. `python -m t2t_jax.tools.bench --what=device_check --levers`
# measures each candidate against none.
GPU_XLA_FLAGS = ("--xla_gpu_enable_latency_hiding_scheduler=true",)
XLA_FLAGS_OFF_ENV = "T2T_JAX_NO_XLA_FLAGS"  # set to 1: add none of them (for A/B measurements)


def xla_flags_for(platform_name: str, current: str) -> str:
  """XLA_FLAGS for a process on `platform_name`: `current` plus the backend's own flags that
  `current` does not set."""
  if platform_name != "gpu":
    return current
  have = {f.split("=", 1)[0] for f in current.split()}
  extra = [f for f in GPU_XLA_FLAGS if f.split("=", 1)[0] not in have]
  return " ".join([current.strip(), *extra]).strip()


def apply_xla_flags(environ: dict[str, str] = os.environ) -> None:  # type: ignore[assignment]
  """Entry points call this before JAX starts: XLA reads XLA_FLAGS once, at start-up."""
  if environ.get(XLA_FLAGS_OFF_ENV) == "1":
    return
  flags = xla_flags_for(host_platform(environ), environ.get("XLA_FLAGS", ""))
  if flags:
    environ["XLA_FLAGS"] = flags


def _installed_plugins() -> set[str]:
  """Names of the installed JAX accelerator plugins ("cuda", "rocm", "tpu")."""
  found = set()
  try:
    names = [ep.name for ep in importlib.metadata.entry_points(group="jax_plugins")]
  except Exception:  # a broken distribution's metadata must not stop a CPU run
    names = []
  if importlib.util.find_spec("jax_plugins") is not None:
    import jax_plugins  # namespace package of the older plugins (jax_plugins.xla_cuda12)
    names += [os.path.basename(p) for path in jax_plugins.__path__ for p in
              (os.listdir(path) if os.path.isdir(path) else [])]
  for name in names:
    for kind in ("cuda", "rocm", "tpu"):
      if kind in name.lower():
        found.add(kind)
  if importlib.util.find_spec("libtpu") is not None:
    found.add("tpu")
  return found


def _gpu_nodes(dev: str) -> list[int]:
  try:
    return sorted(int(m.group(1)) for m in (re.fullmatch(r"nvidia(\d+)", n) for n in
                                            os.listdir(dev)) if m)
  except OSError:
    return []


def host_platform(environ: Mapping[str, str] = os.environ, dev: str = "/dev",
                  plugins: set[str] | None = None) -> str:
  """The backend JAX will pick in a process started with `environ`, guessed without
  initialising JAX: JAX_PLATFORMS when set, else an installed accelerator plugin with its
  device present, else "cpu"."""
  chosen = environ.get("JAX_PLATFORMS") or environ.get("JAX_PLATFORM_NAME")
  if chosen:
    return _canonical(chosen.split(",")[0])
  plugins = _installed_plugins() if plugins is None else plugins
  if ("cuda" in plugins and _gpu_nodes(dev)) or ("rocm" in plugins and
                                                  os.path.exists(os.path.join(dev, "kfd"))):
    return "gpu"
  if "tpu" in plugins and (os.path.exists(os.path.join(dev, "accel0"))
                           or os.path.isdir(os.path.join(dev, "vfio"))):
    return "tpu"
  return "cpu"


def cpu_host_tricks(environ: Mapping[str, str] = os.environ) -> bool:
  """Whether the host-side CPU tricks apply (glibc huge pages in `hostmem`, members pinned
  to cores): only when the arrays live on the CPU, whose step temporaries they are for."""
  return host_platform(environ) == "cpu"


def core_shares(cpus: Sequence[int], members: int) -> list[list[int]] | None:
  """Disjoint, contiguous, near-equal shares of `cpus`, one per member; None when there are
  fewer CPUs than members (then members share all of them)."""
  cpus = sorted(cpus)
  if len(cpus) < members:
    return None
  size, extra = divmod(len(cpus), members)
  shares, start = [], 0
  for i in range(members):
    end = start + size + (1 if i < extra else 0)
    shares.append(cpus[start:end])
    start = end
  return shares


def member_shares(members: int, environ: Mapping[str, str] = os.environ, dev: str = "/dev",
                  plugins: set[str] | None = None) -> list[tuple[str, dict[str, str]]] | None:
  """For runs side by side on one host (ensemble members, sweep rows): per run, what it gets
  and the environment variables that give it that. On CPU a share of the cores, on GPU a
  share of the visible GPUs; None when there are fewer of them than runs (they share all).

  A TPU host's chips are not split between processes here: a UserError says so.
  """
  kind = host_platform(environ, dev, plugins)
  if kind == "tpu":
    raise UserError(f"{members} runs side by side on one TPU host are not supported; "
                    "run them one after another, or as separate jobs (--print_commands)")
  if kind == "gpu":
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    gpus = ([g for g in visible.split(",") if g.strip()] if visible is not None
            else [str(i) for i in _gpu_nodes(dev)])
    shares = core_shares(range(len(gpus)), members)
    if shares is None:
      return None
    return [(f"GPUs {','.join(gpus[i] for i in share)}",
             {"CUDA_VISIBLE_DEVICES": ",".join(gpus[i] for i in share)}) for share in shares]
  cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else []
  shares = core_shares(cpus, members)
  if shares is None:
    return None
  return [(f"cores {','.join(map(str, s))}", {MEMBER_CPUS_ENV: ",".join(map(str, s))})
          for s in shares]


def pin_member() -> None:
  """In a member run, first thing: keep to the cores `member_shares` gave it (CPU only)."""
  cpus = os.environ.get(MEMBER_CPUS_ENV)
  if cpus and hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, [int(c) for c in cpus.split(",")])
