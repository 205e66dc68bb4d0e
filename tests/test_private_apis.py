"""The private JAX APIs the code relies on are where it looks for them: a JAX release that
moves one fails here by name, not on a cluster (the multi-process key-value store) or a GPU
(the cuDNN attention with sequence offsets) that CI does not have."""

import inspect


def test_the_distributed_key_value_store_is_where_process_zero_only_looks():
  from jax._src import distributed
  from jax._src.lib import _jax
  assert hasattr(distributed, "global_state") and hasattr(distributed.global_state, "client")
  for method in ("key_value_set", "blocking_key_value_get"):  # parallel.process_zero_only
    assert hasattr(_jax.DistributedRuntimeClient, method), method


def test_the_cudnn_attention_takes_what_the_packed_layout_passes():
  from jax._src.cudnn import fused_attention_stablehlo as cudnn
  params = inspect.signature(cudnn.dot_product_attention).parameters
  for name in ("q_seqlen", "kv_seqlen", "q_offsets", "kv_offsets", "mask_type", "scale",
               "qkv_layout"):  # model.cudnn_packed_attention
    assert name in params, name
  assert {"CAUSAL", "NO_MASK"} <= set(cudnn.MaskType.__members__)


def test_the_jax_floor_in_setup_py_is_the_jax_the_first_ci_leg_runs():
  """On Python 3.11 JAX stops at 0.10.2: the floor setup.py names is what this suite runs on
  there, so the floor is tested, not merely declared (the second leg runs the newest)."""
  import re
  import sys
  from pathlib import Path
  import jax
  floor = re.search(r'"jax>=([\d.]+)"', (Path(__file__).parents[1] / "setup.py").read_text())
  assert floor, "setup.py names no jax floor"
  if sys.version_info[:2] == (3, 11):
    assert jax.__version__ == floor.group(1), (jax.__version__, floor.group(1))
  else:
    as_tuple = lambda v: tuple(int(x) for x in v.split(".")[:3])
    assert as_tuple(jax.__version__) >= as_tuple(floor.group(1))
