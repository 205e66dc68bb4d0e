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
