"""Where a train step's device time goes, from a `jax.profiler` trace and the step's
optimised HLO: by kind of kernel (matrix products, fusions, reductions, copies and
transposes, collectives) and by region of the model (attention, feed-forward, LayerNorm,
the output layer and loss, the optimiser), with the device's busy time against the wall
time and the costliest kernels.

`python -m t2t_jax.tools.bench --what=profile` prints it for a workload on this machine's
device; the speed check records it for base (its `profile` part). On a GPU each kernel event
names the HLO instruction it runs (its `hlo_op` stat); XLA:CPU records one event per
instruction on its worker threads, so the same parser reads both, and the tests read a CPU
trace and a hand-written GPU trace. On CPU the busy time counts a thread's instructions, so
instructions that run side by side on several threads count once in the busy time but
once each in the kinds and regions.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import os
import re
import tempfile
import time
import warnings
from typing import Any, Callable, Iterable

# The named scopes around the output layer (with its loss) and the optimiser.
from t2t_jax.model import OUTPUT_SCOPE
from t2t_jax.train import OPTIMIZER_SCOPE

KINDS = ("matrix products", "fused attention", "fusions", "reductions",
         "copies and transposes", "collectives", "other")
REGIONS = ("encoder self-attention", "decoder self-attention", "decoder cross-attention",
           "feed-forward", "LayerNorm", "embeddings", "output layer and loss", "optimizer",
           "other")
# Lines of a device plane that repeat the stream's kernels (derived timelines), not kernels.
DERIVED_LINES = ("XLA Modules", "XLA Ops", "Steps", "Framework Ops", "Framework Name Scope",
                 "Source code", "XLA TraceMe")
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute",
               "all-to-all")
MOVES = ("copy", "transpose", "copy-start", "copy-done")
# What only moves or relabels data inside a fusion (a fusion of these alone is a copy).
LAYOUT_OPS = {"parameter", "copy", "transpose", "bitcast", "reshape", "broadcast", "constant",
              "slice", "concatenate", "tuple", "get-tuple-element", "dynamic-slice",
              "dynamic-update-slice", "pad", "convert"}


@dataclasses.dataclass(frozen=True)
class Instruction:
  """One instruction of the optimised HLO: what a kernel runs."""
  name: str
  opcode: str
  op_name: str          # the JAX operation it came from (metadata), with its module path
  fusion_kind: str = ""
  target: str = ""      # a custom call's target
  called: tuple[str, ...] = ()  # the opcodes of the computations it calls (a fusion's body)


_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*[({].*\{\s*$")
_ASSIGN = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")


def _after_type(rest: str) -> str:
  """`rest` past the result type ("f32[2]{0} add(...)" or "(f32[2], s8[4]) custom-call(...)")."""
  if rest.startswith("("):
    depth = 0
    for i, c in enumerate(rest):
      depth += (c == "(") - (c == ")")
      if depth == 0:
        return rest[i + 1:].lstrip()
  return rest.split(" ", 1)[1] if " " in rest else ""


def parse_hlo(hlo_text: str) -> dict[str, Instruction]:
  """Every instruction of an optimised HLO module's text, by name."""
  bodies: dict[str, list[str]] = collections.defaultdict(list)
  raw: list[tuple[str, str, str]] = []  # (name, opcode, whole line)
  computation = ""
  for line in hlo_text.splitlines():
    header = _HEADER.match(line)
    if header and not line.startswith(" "):
      computation = header.group(1)
      continue
    found = _ASSIGN.match(line)
    if not found:
      continue
    op = re.match(r"([a-z][\w\-]*)\(", _after_type(found.group(2)))
    if not op:
      continue
    bodies[computation].append(op.group(1))
    raw.append((found.group(1), op.group(1), line))
  out = {}
  for name, opcode, line in raw:
    get = lambda pattern: (re.search(pattern, line) or [None, ""])[1]
    calls = re.findall(r"(?:calls|to_apply)=%?([\w.\-]+)", line)
    out[name] = Instruction(
        name=name, opcode=opcode, op_name=get(r'op_name="([^"]*)"'),
        fusion_kind=get(r"kind=(k\w+)"), target=get(r'custom_call_target="([^"]*)"'),
        called=tuple(o for c in calls for o in bodies.get(c, ())))
  return out


def kind_of(inst: Instruction) -> str:
  """The kind of work an instruction's kernel does (one of KINDS)."""
  target = inst.target.lower()
  if inst.opcode in ("dot", "convolution") or (
      inst.opcode == "custom-call" and any(w in target for w in ("matmul", "gemm", "cublas"))):
    return "matrix products"
  if inst.opcode == "custom-call" and ("fmha" in target or "attention" in target):
    return "fused attention"
  if inst.opcode.startswith(COLLECTIVES):
    return "collectives"
  if inst.opcode in MOVES:
    return "copies and transposes"
  if inst.opcode in ("reduce", "reduce-window"):
    return "reductions"
  if inst.opcode == "fusion":
    if {"dot", "convolution"} & set(inst.called):
      return "matrix products"
    if inst.fusion_kind == "kCustom" and "fmha" in inst.name:
      return "fused attention"
    if "reduce" in inst.called or inst.fusion_kind == "kInput":
      return "reductions"
    if inst.called and set(inst.called) <= LAYOUT_OPS:
      return "copies and transposes"
    return "fusions"
  return "other"


def region_of(op_name: str) -> str:
  """The part of the model an operation belongs to (one of REGIONS), from its module path."""
  if OPTIMIZER_SCOPE in op_name:
    return "optimizer"
  if OUTPUT_SCOPE in op_name:
    return "output layer and loss"
  if re.search(r"/ln_\w+", op_name):
    return "LayerNorm"
  if "cross_attention" in op_name:
    return "decoder cross-attention"
  if "self_attention" in op_name:
    return "encoder self-attention" if "encoder_" in op_name else "decoder self-attention"
  if "/ffn" in op_name:
    return "feed-forward"
  if re.search(r"/(embed|encoder_positions|decoder_positions)\b", op_name):
    return "embeddings"
  return "other"


@dataclasses.dataclass(frozen=True)
class KernelEvent:
  instruction: str  # the HLO instruction it ran
  kernel: str       # the event's own name (a GPU kernel's name, or the instruction on CPU)
  start_ns: int
  duration_ns: int
  line: str         # the stream or thread it ran on


def kernel_events(planes: Iterable[Any], instructions: dict[str, Instruction]
                  ) -> tuple[str, list[KernelEvent]]:
  """The events that ran the module's instructions: a GPU's or TPU's stream events (their
  `hlo_op` stat names the instruction), else XLA:CPU's per-instruction events on host
  threads. Also says which kind of plane they came from ("device" or "host")."""
  planes = list(planes)
  device = [p for p in planes if p.name.startswith("/device:") and "CPU" not in p.name]
  found: list[KernelEvent] = []
  for plane in device:
    for line in plane.lines:
      if line.name in DERIVED_LINES:
        continue
      for e in line.events:
        with warnings.catch_warnings():  # the profiler's bindings on Python 3.13+, not ours
          warnings.filterwarnings("ignore", r"builtin type .* has no __module__",
                                  DeprecationWarning)
          stats = dict(e.stats)
        op = stats.get("hlo_op", e.name)
        if op in instructions:
          found.append(KernelEvent(str(op), e.name, int(e.start_ns), int(e.duration_ns),
                                   line.name))
  if found:
    return "device", found
  for plane in planes:
    if plane.name.startswith("/device:"):
      continue
    for line in plane.lines:
      for e in line.events:
        if e.name in instructions:
          found.append(KernelEvent(e.name, e.name, int(e.start_ns), int(e.duration_ns),
                                   line.name))
  return "host", found


def busy_ns(events: Iterable[KernelEvent]) -> int:
  """The time at least one of the events was running (their intervals' union)."""
  total, end = 0, None
  for start, stop in sorted((e.start_ns, e.start_ns + e.duration_ns) for e in events):
    if end is None or start > end:
      total += stop - start
      end = stop
    elif stop > end:
      total += stop - end
      end = stop
  return total


def breakdown(planes: Iterable[Any], hlo_text: str, steps: int, wall_sec: float,
              top: int = 15) -> dict[str, Any]:
  """Per step: milliseconds by kind and by region (with shares of the kernels' total), the
  device's busy time against the wall time, and the `top` costliest instructions."""
  instructions = parse_hlo(hlo_text)
  source, events = kernel_events(planes, instructions)
  per_step = lambda ns: round(ns / steps / 1e6, 3)
  kinds: collections.Counter = collections.Counter()
  regions: collections.Counter = collections.Counter()
  by_op: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
  for e in events:
    inst = instructions[e.instruction]
    kinds[kind_of(inst)] += e.duration_ns
    regions[region_of(inst.op_name)] += e.duration_ns
    by_op[e.instruction][0] += e.duration_ns
    by_op[e.instruction][1] += 1
  total = sum(kinds.values())
  share = lambda ns: round(ns / total, 3) if total else 0.0
  busy = busy_ns(events)
  costliest = sorted(by_op.items(), key=lambda kv: -kv[1][0])[:top]
  return {
      "source": source, "steps": steps, "kernel_events": len(events),
      "wall_ms_per_step": round(wall_sec * 1e3 / steps, 3),
      "kernel_ms_per_step": per_step(total), "busy_ms_per_step": per_step(busy),
      "busy_over_wall": round(busy / 1e9 / wall_sec, 3) if wall_sec else None,
      "kinds": {k: {"ms": per_step(kinds[k]), "share": share(kinds[k])} for k in KINDS
                if kinds[k]},
      "regions": {r: {"ms": per_step(regions[r]), "share": share(regions[r])} for r in REGIONS
                  if regions[r]},
      "top": [{"instruction": op, "ms": per_step(ns), "calls_per_step": round(n / steps, 2),
               "kind": kind_of(instructions[op]),
               "region": region_of(instructions[op].op_name),
               "from": _short(instructions[op].op_name)} for op, (ns, n) in costliest],
  }


def _short(op_name: str, width: int = 110) -> str:
  name = re.sub(r"^(jit|pmap)\([^)]*\)/", "", op_name)
  return name if len(name) <= width else "..." + name[-(width - 3):]


def profile(run: Callable[[], Any], hlo_text: str, steps: int) -> dict[str, Any]:
  """`breakdown` of `steps` calls of `run` (each returns arrays to wait for), traced."""
  import jax
  from jax.profiler import ProfileData
  jax.block_until_ready(run())  # compiled and warm before the trace starts
  with tempfile.TemporaryDirectory() as tmp:
    with jax.profiler.trace(tmp):
      t0 = time.perf_counter()
      for _ in range(steps):
        jax.block_until_ready(run())
      wall = time.perf_counter() - t0
    paths = glob.glob(os.path.join(tmp, "**", "*.xplane.pb"), recursive=True)
    if not paths:
      return {"error": "jax.profiler wrote no trace"}
    data = ProfileData.from_file(paths[0])
    return breakdown(data.planes, hlo_text, steps, wall)


def summary(out: dict[str, Any]) -> str:
  """`breakdown`'s result as a few lines of text, for a person reading the log."""
  if "error" in out:
    return f"profile: {out['error']}"
  lines = [f"profile ({out['source']} events): {out['wall_ms_per_step']:.2f} ms per step, "
           f"busy {out['busy_ms_per_step']:.2f} ms ({out['busy_over_wall']:.0%}), kernels "
           f"{out['kernel_ms_per_step']:.2f} ms"]
  for title, table in (("by kind", out["kinds"]), ("by region", out["regions"])):
    lines.append(f"  {title}: " + ", ".join(f"{k} {v['ms']:.2f} ms ({v['share']:.0%})"
                                            for k, v in sorted(table.items(),
                                                               key=lambda kv: -kv[1]["ms"])))
  for t in out["top"][:8]:
    lines.append(f"  {t['ms']:8.3f} ms  {t['kind']:<22} {t['region']:<24} {t['from']}")
  return "\n".join(lines)
