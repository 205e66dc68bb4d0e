"""The Transformer of "Attention Is All You Need" (Vaswani et al. 2017) in Flax linen.

Faithful to the paper rather than to later practice:
  * post-LayerNorm sub-layers: LayerNorm(x + Dropout(Sublayer(x)))      (section 3.1, 5.4)
  * one embedding matrix for source, target and the pre-softmax projection,
    multiplied by sqrt(d_model) on lookup                                 (section 3.4)
  * sinusoidal positions, or learned ones (Table 3 row E)                 (section 3.5)
  * per-head d_k and d_v independent of d_model / h (Table 3 row B)       (section 3.2.2)
  * dropout only on sub-layer outputs and embedding+position sums         (section 5.4);
    T2T's attention and ReLU dropout are options, off by default

It reads top to bottom in the paper's order: positions (3.5), attention (3.2), the
feed-forward network (3.3), the encoder and decoder layers (3.1), then the whole model with
its shared embeddings and output projection (3.4); dropout (5.4) and the parameter helpers
follow. The products run through `cpu_kernels` in the compute dtype: `model.dtype=bfloat16`
is mixed precision (parameters, LayerNorm, the residual stream, softmax and the loss stay
float32; matmul inputs are bf16), and XLA:CPU gets its own faster paths there.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from t2t_jax import backend
from t2t_jax import cpu_kernels as kernels
from t2t_jax.config import ModelConfig
from t2t_jax.special_tokens import BOS_ID, EOS_ID, PAD_ID

Array = jax.Array
NEG_INF = -1e9  # additive mask: exp(-1e9) is exactly 0 in float32
# The named scope of the output projection (and, in training, its loss): step profiles
# (tools/step_profile.py) tell its instructions apart by it.
OUTPUT_SCOPE = "output_layer"


# ---------------------------------------------------------------------------------------
# Positions (section 3.5) and masks (section 3.2.3)


def sinusoidal_positions(length: int, d_model: int, offset: Array | int = 0) -> Array:
  """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...) (section 3.5), for
  positions offset .. offset + length - 1; `offset` may be traced (cached decoding)."""
  return sinusoids(offset + jnp.arange(length), d_model)


class Positions(nn.Module):
  """Adds sinusoidal or learned (Table 3 row E) position encodings."""
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x: Array, offset: Array | int = 0, positions: Array | None = None
               ) -> Array:
    """Adds the encodings of positions offset, offset+1, ... to x [b, L, d], or of each
    token's own `positions` [b, L] (its place in its sentence of a packed row)."""
    length, d = x.shape[1], x.shape[2]
    if self.cfg.positional == "learned":
      table = self.param("embedding", nn.initializers.normal(stddev=d ** -0.5),
                         (self.cfg.max_len, d))
      if positions is not None:
        return x + jnp.take(table, positions, axis=0)
      if isinstance(offset, int) and offset + length > self.cfg.max_len:
        raise ValueError(f"sequence length {offset + length} exceeds "
                         f"model.max_len={self.cfg.max_len} (learned positions)")
      return x + jax.lax.dynamic_slice_in_dim(table, offset, length, axis=0)[None]
    if positions is not None:
      return x + sinusoids(positions, d)
    return x + sinusoidal_positions(length, d, offset)[None]


def sinusoids(positions: Array, d_model: int) -> Array:
  """The encodings [..., d_model] of integer `positions` [...] (section 3.5)."""
  pos = positions.astype(jnp.float32)[..., None]
  inv_freq = jnp.power(10000.0, -jnp.arange(0, d_model, 2, dtype=jnp.float32) / d_model)
  angle = pos * inv_freq
  return jnp.stack([jnp.sin(angle), jnp.cos(angle)], axis=-1).reshape(*positions.shape,
                                                                     d_model)


@flax.struct.dataclass
class Segments:
  """Where the sentences of packed rows are: each token's sentence (1, 2, ... in its row; 0
  for padding) and its position in that sentence. A sentence ends at its EOS, so the
  sentences of a row are found from its tokens alone."""
  ids: Array        # int32 [batch, length]
  positions: Array  # int32 [batch, length]


def segments(tokens: Array) -> Segments:
  """The Segments of rows of EOS-terminated sentences packed one after another, then PAD."""
  eos = tokens == EOS_ID
  starts = jnp.concatenate([jnp.ones_like(eos[:, :1]), eos[:, :-1]], axis=1)
  ids = jnp.where(tokens == PAD_ID, 0, jnp.cumsum(starts, axis=1))
  index = jnp.arange(tokens.shape[1])
  first = jax.lax.cummax(jnp.where(starts, index, 0), axis=1)
  # Padding is at position 0: counted on from the last sentence, a packed source row longer
  # than `model.max_len` would index past the learned table (NaN rows, a NaN loss).
  positions = jnp.where(ids > 0, index - first, 0)
  return Segments(ids.astype(jnp.int32), positions.astype(jnp.int32))


def segment_bias(query_ids: Array, key_ids: Array, causal: bool = False) -> Array:
  """[batch, 1, Lq, Lk] additive bias: a query sees the keys of its own sentence only (and,
  with `causal`, none after it), so a packed row's sentences never attend to each other."""
  allowed = (query_ids[:, :, None] == key_ids[:, None, :]) & (key_ids[:, None, :] > 0)
  if causal:
    allowed &= jnp.tril(jnp.ones((query_ids.shape[1], key_ids.shape[1]), bool))
  return jnp.where(allowed, 0.0, NEG_INF).astype(jnp.float32)[:, None]


@flax.struct.dataclass
class SegmentMask:
  """Which keys each query sees in packed rows, for the fused kernel's packed layout:
  sentence j of a query row attends to sentence j of its key row only (with `causal`, to
  none after itself). `query_ids`/`key_ids` are the rows' `Segments.ids`."""
  query_ids: Array  # int32 [batch, Lq]
  key_ids: Array    # int32 [batch, Lk]
  causal: bool = flax.struct.field(pytree_node=False, default=False)


# Sentences a packed row of L tokens may hold on the packed-layout path: L / 8 (at least
# 2). The layout's buffers and kernel grid are sized by this bound, not by the sentences
# present, so it is kept near what rows hold: base_ende's 128-token rows on WMT-shaped data
# hold 5.1 sentences on average and 6 at most (2026-11-28). A batch with a fuller row takes
# the bias layout instead, so the bound changes speed, never results.
TOKENS_PER_SEGMENT_BOUND = 8


def max_segments(query_length: int, key_length: int) -> int:
  return max(2, min(query_length, key_length) // TOKENS_PER_SEGMENT_BOUND)


def segment_offsets(query_ids: Array, key_ids: Array, limit: int
                    ) -> tuple[Array, Array, Array, Array]:
  """The packed layout of the first `limit` sentences of each row, as cuDNN takes it
  (`jax._src.cudnn.fused_attention_stablehlo.dot_product_attention`): q_seqlen and kv_seqlen
  [batch, limit], each sentence's length; q_offsets and kv_offsets [batch, limit + 1], each
  sentence's first position; -1 past a row's sentences. A sentence missing from either row
  is left out of both, so query and key sentences stay paired in order."""
  j = jnp.arange(1, limit + 1, dtype=jnp.int32)

  def lengths_and_starts(ids):
    member = ids[:, None, :] == j[None, :, None]                 # [batch, limit, L]
    return jnp.sum(member, -1, dtype=jnp.int32), jnp.argmax(member, -1).astype(jnp.int32)

  q_len, q_start = lengths_and_starts(query_ids)
  k_len, k_start = lengths_and_starts(key_ids)
  present = (q_len > 0) & (k_len > 0)
  none = jnp.full((query_ids.shape[0], 1), -1, jnp.int32)
  return (jnp.where(present, q_len, -1), jnp.where(present, k_len, -1),
          jnp.concatenate([jnp.where(present, q_start, -1), none], axis=1),
          jnp.concatenate([jnp.where(present, k_start, -1), none], axis=1))


def cudnn_packed_attention(q: Array, k: Array, v: Array, q_seqlen: Array, kv_seqlen: Array,
                           q_offsets: Array, kv_offsets: Array, causal: bool) -> Array:
  """cuDNN's fused attention in its packed layout: each (row, sentence) is a sequence of
  its own. Positions outside every sentence are left undefined. JAX's public
  `jax.nn.dot_product_attention` has no packed layout, hence the private module."""
  from jax._src.cudnn import fused_attention_stablehlo as cudnn
  mask = cudnn.MaskType.CAUSAL if causal else cudnn.MaskType.NO_MASK
  return cudnn.dot_product_attention(q, k, v, q_seqlen=q_seqlen, kv_seqlen=kv_seqlen,
                                     q_offsets=q_offsets, kv_offsets=kv_offsets, scale=1.0,
                                     mask_type=mask, qkv_layout="BTNH")


@flax.struct.dataclass
class KeyMask:
  """Which keys each query sees, as the fused kernel takes it: the first `lengths[b]` keys of
  row b (our batches are padded on the right), and with `causal` none after the query.

  Lengths are at least 1: a row of padding only (a batch's filler rows) would otherwise
  have no key at all, a softmax over nothing, where the bias path gives a finite value.
  """
  lengths: Array  # int32 [batch]
  causal: bool = flax.struct.field(pytree_node=False, default=False)


def key_mask(tokens: Array, causal: bool = False) -> KeyMask:
  """The KeyMask of right-padded `tokens` [batch, length] as keys."""
  lengths = jnp.sum(tokens != PAD_ID, axis=-1).astype(jnp.int32)
  return KeyMask(jnp.maximum(lengths, 1), causal)


def padding_bias(tokens: Array) -> Array:
  """[batch, 1, 1, length] additive bias hiding padded key positions."""
  return jnp.where(tokens != PAD_ID, 0.0, NEG_INF).astype(jnp.float32)[:, None, None, :]


def causal_bias(length: int) -> Array:
  """[1, 1, length, length]: position i attends to j <= i only (section 3.2.3)."""
  allowed = jnp.tril(jnp.ones((length, length), dtype=bool))
  return jnp.where(allowed, 0.0, NEG_INF).astype(jnp.float32)[None, None]


def beam_history_bias(ancestry: Array, position: Array) -> Array:
  """[b, 1, beams, beams * length] additive bias for cached decoding: hypothesis j of a
  sentence sees position t of cache slot s iff `ancestry` [b, beams, length] says its prefix
  wrote position t to slot s, and t <= `position` (causality)."""
  b, beams, length = ancestry.shape
  visible = ((ancestry[:, :, None, :] == jnp.arange(beams)[:, None])
             & (jnp.arange(length) <= position))              # [b, query beam, slot, pos]
  return jnp.where(visible, 0.0, NEG_INF).reshape(b, 1, beams, beams * length)


def shift_right(targets: Array) -> Array:
  """Decoder inputs: BOS followed by the targets, dropping the last position."""
  start = jnp.full_like(targets[:, :1], BOS_ID)
  return jnp.concatenate([start, targets[:, :-1]], axis=1)


# ---------------------------------------------------------------------------------------
# Attention (section 3.2) and the feed-forward network (section 3.3)


class MultiHeadAttention(nn.Module):
  """MultiHead(Q, K, V) = Concat(head_1..h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

  The paper's projections are plain matrices (no biases), section 3.2.2. Keys
  and values can be projected once (`project_kv`) and reused by `attend`, which
  is how cached decoding avoids re-running the prefix.
  """
  cfg: ModelConfig
  first_row: Array | int = 0

  def setup(self):
    h, d_k, d_v = self.cfg.num_heads, self.cfg.d_k, self.cfg.d_v
    # Fused: the same parameter matrices, multiplied side by side (`cpu_kernels.project`).
    layer = kernels.Kernel if self._fused else (lambda n: kernels.dense(self.cfg, n, False))
    self.query, self.key, self.value = layer(h * d_k), layer(h * d_k), layer(h * d_v)
    self.out = kernels.dense(self.cfg, self.cfg.d_model, False)
    self.weights_dropout = Dropout(self.cfg.attention_dropout, self.first_row)

  @property
  def _fused(self) -> bool:
    return backend.fused_projections(self.cfg.fused_projections)

  def _project(self, x: Array, which: tuple[str, ...]) -> list[Array]:
    """x [b, L, d_model] through the named projections, heads split: [b, L, h, d_k or d_v]."""
    layers = [getattr(self, name) for name in which]
    if self._fused:
      ys = kernels.project(self.cfg, x, [layer(x.shape[-1]) for layer in layers])
    else:
      ys = [layer(x) for layer in layers]
    return [y.reshape(*x.shape[:2], self.cfg.num_heads, -1) for y in ys]

  def project_qkv(self, x: Array) -> tuple[Array, Array, Array]:
    """Self-attention's queries (scaled, section 3.2.1), keys and values of x [b, L, d]."""
    q, k, v = self._project(x, ("query", "key", "value"))
    return q * (1.0 / math.sqrt(self.cfg.d_k)), k, v

  def project_q(self, x_q: Array) -> Array:
    """Queries [b, L, h, d_k], scaled by 1/sqrt(d_k) (scaled dot-product attention, 3.2.1)."""
    return self._project(x_q, ("query",))[0] * (1.0 / math.sqrt(self.cfg.d_k))

  def project_kv(self, x_kv: Array) -> tuple[Array, Array]:
    """[b, L, d_model] -> keys [b, L, h, d_k], values [b, L, h, d_v]."""
    k, v = self._project(x_kv, ("key", "value"))
    return k, v

  def attend(self, q: Array, k: Array, v: Array, bias: Array | None, train: bool = False,
             mask: "KeyMask | SegmentMask | None" = None) -> Array:
    """Attention of scaled queries q [b, Lq, h, d_k] over keys and values. `bias` masks the
    einsum path; the fused path takes the same mask as `mask` (key lengths and causality),
    which cuDNN applies inside its kernel without a bias tensor, or packed rows' sentences
    as a SegmentMask (cuDNN's packed layout)."""
    cfg = self.cfg
    b, lq = q.shape[:2]
    if isinstance(mask, SegmentMask):
      return self.out(self._attend_segments(q, k, v, mask).reshape(b, lq, -1))
    if cfg.fused_attention:
      out = (self._fused_kernel(q, k, v, key_value_seq_lengths=mask.lengths,
                                is_causal=mask.causal)
             if mask is not None else self._fused_kernel(q, k, v, bias=bias))
      return self.out(out.reshape(b, lq, cfg.num_heads * cfg.d_v))
    logits = kernels.einsum(cfg, "bqhd,bkhd->bhqk", q, k).astype(jnp.float32) + bias
    weights = jax.nn.softmax(logits, axis=-1)
    self.sow("intermediates", "attention_weights", weights)
    weights = self.weights_dropout(weights, deterministic=not train)
    out = kernels.einsum(cfg, "bhqk,bkhd->bqhd", weights, v).reshape(b, lq, cfg.num_heads * cfg.d_v)
    return self.out(out)

  def _fused_kernel(self, q: Array, k: Array, v: Array, bias: Array | None = None,
                    **mask_args: Any) -> Array:
    """`jax.nn.dot_product_attention` in the compute dtype (cuDNN's kernel on a GPU in
    bf16) over scaled queries, masked by `bias` or by its key-length arguments."""
    dt = kernels.compute_dtype(self.cfg)
    return jax.nn.dot_product_attention(
        q.astype(dt), k.astype(dt), v.astype(dt),
        bias=None if bias is None else bias.astype(dt), scale=1.0,
        implementation=backend.attention_implementation(self.cfg.dtype), **mask_args)

  def _attend_segments(self, q: Array, k: Array, v: Array, mask: SegmentMask) -> Array:
    """Fused attention of packed rows in cuDNN's packed layout. The kernel leaves positions
    outside every sentence undefined, in its outputs and in its gradients, so padding is
    zeroed on the way in and out (a select, which drops even NaN). A batch with a row of
    more sentences than the layout's bound takes the bias layout (`lax.cond`)."""
    dt = kernels.compute_dtype(self.cfg)
    q, k, v = q.astype(dt), k.astype(dt), v.astype(dt)
    q_in, k_in = (mask.query_ids > 0)[..., None, None], (mask.key_ids > 0)[..., None, None]
    limit = max_segments(q.shape[1], k.shape[1])

    def packed(q, k, v):
      q, k, v = jnp.where(q_in, q, 0), jnp.where(k_in, k, 0), jnp.where(k_in, v, 0)
      out = cudnn_packed_attention(q, k, v, *segment_offsets(mask.query_ids, mask.key_ids,
                                                               limit), mask.causal)
      return jnp.where(q_in, out, 0).astype(dt)

    def whole_rows(q, k, v):
      bias = segment_bias(mask.query_ids, mask.key_ids, mask.causal)
      return self._fused_kernel(q, k, v, bias=bias).astype(dt)

    fits = jnp.maximum(jnp.max(mask.query_ids), jnp.max(mask.key_ids)) <= limit
    return jax.lax.cond(fits, packed, whole_rows, q, k, v)

  def attend_group(self, q: Array, k: Array, v: Array, bias: Array) -> Array:
    """Attention for cached decoding: the n scaled queries [b * n, 1, h, d_k] of each of b groups
    (a sentence's beams) over the group's keys and values [b, h, S, d], heads first (the
    layout the products read); `bias` [b, 1, n, S] says which keys each query sees.

    A sentence's beams share one cache, so a search never copies caches when it reorders
    its hypotheses: each beam sees its own history through `bias`.
    """
    cfg = self.cfg
    b, _, length, _ = k.shape
    n = q.shape[0] // b
    q = q.reshape(b, n, cfg.num_heads, cfg.d_k)
    # Heads first before the products: XLA:CPU ran the products 2.5x slower when they
    # transposed the queries themselves.
    q = q.transpose(0, 2, 1, 3)
    logits = kernels.einsum(cfg, "bhnd,bhsd->bhns", q, k).astype(jnp.float32) + bias
    weights = jax.nn.softmax(logits, axis=-1)
    out = kernels.einsum(cfg, "bhns,bhsd->bhnd", weights, v).transpose(0, 2, 1, 3)
    return self.out(out.reshape(b * n, 1, cfg.num_heads * cfg.d_v))

  def __call__(self, x_q: Array, x_kv: Array | None, bias: Array, train: bool = False,
               mask: "KeyMask | SegmentMask | None" = None) -> Array:
    """Attention of x_q over x_kv; x_kv None is self-attention (one product for Q, K, V)."""
    if x_kv is None:
      q, k, v = self.project_qkv(x_q)
    else:
      q, (k, v) = self.project_q(x_q), self.project_kv(x_kv)
    return self.attend(q, k, v, bias, train, mask)


class FeedForward(nn.Module):
  """FFN(x) = max(0, x W1 + b1) W2 + b2, section 3.3."""
  cfg: ModelConfig
  first_row: Array | int = 0

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    x = nn.relu(kernels.dense(self.cfg, self.cfg.d_ff, True, name="wi")(x))
    x = Dropout(self.cfg.relu_dropout, self.first_row)(x, deterministic=not train)
    return kernels.dense(self.cfg, self.cfg.d_model, True, name="wo")(x)


# ---------------------------------------------------------------------------------------
# The encoder and decoder layers (section 3.1)


def layer_norm(cfg: ModelConfig, name: str | None = None) -> nn.LayerNorm:
  """LayerNorm whose output is the residual stream's dtype (`model.residual_dtype`); Flax
  computes its mean and variance in float32 whatever that dtype is."""
  return nn.LayerNorm(dtype=kernels.residual_dtype(cfg), name=name)



class EncoderLayer(nn.Module):
  cfg: ModelConfig
  first_row: Array | int = 0

  @nn.compact
  def __call__(self, x: Array, self_bias: Array, train: bool,
               self_mask: KeyMask | SegmentMask | None = None) -> Array:
    row = self.first_row
    drop = lambda y: Dropout(self.cfg.dropout, row)(y, deterministic=not train)
    x = layer_norm(self.cfg, "ln_self_attention")(x + drop(MultiHeadAttention(
        self.cfg, row, name="self_attention")(x, None, self_bias, train, self_mask)))
    return layer_norm(self.cfg, "ln_ffn")(
        x + drop(FeedForward(self.cfg, row, name="ffn")(x, train)))


class DecoderLayer(nn.Module):
  """Masked self-attention, encoder-decoder attention, feed-forward (section 3.1).

  `step` runs one position against a key/value cache: the self-attention cache
  holds the keys/values of earlier positions, the cross-attention keys/values
  are projected once per sentence.
  """
  cfg: ModelConfig
  first_row: Array | int = 0

  def setup(self):
    self.self_attention = MultiHeadAttention(self.cfg, self.first_row)
    self.cross_attention = MultiHeadAttention(self.cfg, self.first_row)
    self.ffn = FeedForward(self.cfg, self.first_row)
    self.ln_self_attention = layer_norm(self.cfg)
    self.ln_cross_attention = layer_norm(self.cfg)
    self.ln_ffn = layer_norm(self.cfg)
    self.dropout = Dropout(self.cfg.dropout, self.first_row)

  def _ffn(self, y, train):
    return self.ln_ffn(y + self.dropout(self.ffn(y, train), deterministic=not train))

  def __call__(self, y: Array, encoded: Array, self_bias: Array, cross_bias: Array,
               train: bool, self_mask: KeyMask | SegmentMask | None = None,
               cross_mask: KeyMask | SegmentMask | None = None) -> Array:
    drop = lambda z: self.dropout(z, deterministic=not train)
    y = self.ln_self_attention(y + drop(self.self_attention(y, None, self_bias, train, self_mask)))
    y = self.ln_cross_attention(y + drop(self.cross_attention(y, encoded, cross_bias, train,
                                                              cross_mask)))
    return self._ffn(y, train)

  def init_cache(self, encoded: Array, max_length: int, beams: int) -> dict[str, Array]:
    """Per sentence: self-attention keys and values [b, h, beams, max_length, d], one slot
    per beam, and the cross-attention ones [b, h, src_len, d], projected once (all of a
    sentence's beams read them)."""
    cfg = self.cfg
    b = encoded.shape[0]
    cross_k, cross_v = (x.transpose(0, 2, 1, 3)
                        for x in self.cross_attention.project_kv(encoded))
    dt = cross_k.dtype
    return {"self_k": jnp.zeros((b, cfg.num_heads, beams, max_length, cfg.d_k), dt),
            "self_v": jnp.zeros((b, cfg.num_heads, beams, max_length, cfg.d_v), dt),
            "cross_k": cross_k, "cross_v": cross_v}

  def step(self, y: Array, cache: dict[str, Array], position: Array, self_bias: Array,
           cross_bias: Array) -> tuple[Array, dict[str, Array]]:
    """y [b * beams, 1, d_model] at `position`; returns its output and the updated cache.

    The hypothesis in beam slot j writes its key and value to slot j of the sentence's
    cache; `self_bias` [b, 1, beams, beams * length] (`beam_history_bias`) says which slots
    and positions each hypothesis's history holds.
    """
    b, h, beams, length, _ = cache["self_k"].shape
    put = lambda c, x: jax.lax.dynamic_update_slice_in_dim(
        c, x.reshape(b, beams, h, 1, -1).transpose(0, 2, 1, 3, 4), position, axis=3)
    q, k, v = self.self_attention.project_qkv(y)
    self_k, self_v = put(cache["self_k"], k), put(cache["self_v"], v)
    flat = lambda c: c.reshape(b, h, beams * length, -1)
    y = self.ln_self_attention(y + self.self_attention.attend_group(
        q, flat(self_k), flat(self_v), self_bias))
    y = self.ln_cross_attention(y + self.cross_attention.attend_group(
        self.cross_attention.project_q(y), cache["cross_k"], cache["cross_v"], cross_bias))
    return self._ffn(y, False), {**cache, "self_k": self_k, "self_v": self_v}


# ---------------------------------------------------------------------------------------
# The model: shared embeddings, the stacks, the output projection (3.4)


class Transformer(nn.Module):
  """Encoder-decoder Transformer; `encode` and `decode` are usable on their own.

  `first_row`: the batch's first row in the training step's global batch, which
  places each example's dropout masks (see `dropout_keep_mask`). `packed`: the teacher-forced
  rows hold several sentences each (`segments`); each sentence then attends only within
  itself, and its positions restart at 0, so its loss and gradient are what they are alone.
  """
  cfg: ModelConfig
  first_row: Array | int = 0
  packed: bool = False

  def setup(self):
    cfg = self.cfg
    # Shared source/target/pre-softmax matrix (section 3.4); N(0, d^-1/2) so that
    # embeddings times sqrt(d_model) have unit scale.
    self.embed = nn.Embed(cfg.vocab_size, cfg.d_model, name="embed",
                          embedding_init=nn.initializers.normal(stddev=cfg.d_model ** -0.5))
    self.encoder_positions = Positions(cfg, name="encoder_positions")
    self.decoder_positions = Positions(cfg, name="decoder_positions")
    self.embed_dropout = Dropout(cfg.dropout, self.first_row)
    self.encoder_layers = [EncoderLayer(cfg, self.first_row, name=f"encoder_{i}")
                           for i in range(cfg.num_encoder_layers)]
    self.decoder_layers = [DecoderLayer(cfg, self.first_row, name=f"decoder_{i}")
                           for i in range(cfg.num_layers)]

  @property
  def _segment_offsets(self) -> bool:
    """Packed rows reach the fused kernel as sentence offsets (cuDNN's packed layout)."""
    return (self.cfg.fused_attention
            and backend.segment_attention(self.cfg.segment_attention, self.cfg.dtype) == "offsets")

  def _embed(self, tokens: Array, positions: nn.Module, train: bool,
             segs: Segments | None = None) -> Array:
    x = self.embed(tokens) * math.sqrt(self.cfg.d_model)
    x = positions(x, positions=None if segs is None else segs.positions)
    x = self.embed_dropout(x, deterministic=not train)
    return x.astype(kernels.residual_dtype(self.cfg))

  def encode(self, inputs: Array, train: bool = False, segs: Segments | None = None) -> Array:
    """[batch, src_len] token ids -> [batch, src_len, d_model]; `segs`: packed rows."""
    x = self._embed(inputs, self.encoder_positions, train, segs)
    # The fused kernel masks by key lengths (`mask`); the einsum path by an additive bias.
    # Packed rows' sentences need a bias on both paths (key lengths cannot say them).
    bias = None if self.cfg.fused_attention else padding_bias(inputs)
    mask = key_mask(inputs)
    if segs is not None:
      bias, mask = segment_bias(segs.ids, segs.ids), None
      if self._segment_offsets:
        bias, mask = None, SegmentMask(segs.ids, segs.ids)
    for layer in self.encoder_layers:
      x = layer(x, bias, train, mask)
    return x

  def decode(self, encoded: Array, inputs: Array, decoder_inputs: Array,
             train: bool = False) -> Array:
    """Logits [batch, tgt_len, vocab] for decoder input tokens (BOS-shifted targets).

    `inputs` are the source tokens, used only to mask padded encoder positions.
    """
    return self.logits(self.decoder_output(encoded, inputs, decoder_inputs, train))

  def decoder_output(self, encoded: Array, inputs: Array, decoder_inputs: Array,
                     train: bool = False,
                     segs: tuple[Segments, Segments] | None = None) -> Array:
    """The last decoder layer's output [batch, tgt_len, d_model], before the logits. `segs`:
    the (source, target) Segments of packed rows."""
    y = self._embed(decoder_inputs, self.decoder_positions, train,
                    None if segs is None else segs[1])
    length = decoder_inputs.shape[1]
    self_bias, cross_bias = None, None
    if not self.cfg.fused_attention:
      self_bias = causal_bias(length) + padding_bias(decoder_inputs)
      cross_bias = padding_bias(inputs)
    self_mask, cross_mask = key_mask(decoder_inputs, causal=True), key_mask(inputs)
    if segs is not None:
      src, tgt = segs
      self_bias = segment_bias(tgt.ids, tgt.ids, causal=True)
      cross_bias = segment_bias(tgt.ids, src.ids)
      self_mask = cross_mask = None
      if self._segment_offsets:
        self_bias = cross_bias = None
        self_mask = SegmentMask(tgt.ids, tgt.ids, causal=True)
        cross_mask = SegmentMask(tgt.ids, src.ids)
    for layer in self.decoder_layers:
      y = layer(y, encoded, self_bias, cross_bias, train, self_mask, cross_mask)
    return y

  def init_cache(self, encoded: Array, max_length: int, beams: int = 1
                 ) -> list[dict[str, Array]]:
    """Per decoder layer: empty self-attention keys/values for `max_length` positions of
    `beams` hypotheses per sentence, and the cross-attention keys/values, projected once per
    sentence."""
    return [layer.init_cache(encoded, max_length, beams) for layer in self.decoder_layers]

  def decode_step(self, cache: list[dict[str, Array]], tokens: Array, position: Array,
                  inputs: Array, ancestry: Array | None = None
                  ) -> tuple[Array, list[dict[str, Array]]]:
    """Logits [b * beams, vocab] for the next token after `tokens` [b * beams] at `position`,
    for the sentences `inputs` [b, src_len] (beams rows each, in order).

    Costs one decoder position: earlier positions come from `cache`. `ancestry` [b, beams,
    cache length]: see `DecoderLayer.step`; by default each beam's history is its own slot.
    """
    b = inputs.shape[0]
    beams, length = cache[0]["self_k"].shape[2:4]
    if ancestry is None:
      ancestry = jnp.broadcast_to(jnp.arange(beams)[:, None], (b, beams, length))
    y = self.embed(tokens[:, None]) * math.sqrt(self.cfg.d_model)
    # The residual stream's dtype, as `_embed` gives the teacher-forced decoder.
    y = self.decoder_positions(y, offset=position).astype(kernels.residual_dtype(self.cfg))
    self_bias, cross_bias = beam_history_bias(ancestry, position), padding_bias(inputs)
    new_cache = []
    for layer, layer_cache in zip(self.decoder_layers, cache):
      y, layer_cache = layer.step(y, layer_cache, position, self_bias, cross_bias)
      new_cache.append(layer_cache)
    return self.logits(y)[:, 0], new_cache

  def logits(self, y: Array) -> Array:
    """Pre-softmax projection with the shared embedding matrix (section 3.4), or with its
    copy in the compute dtype when `inference_variables` made one."""
    embedding = self.embed.embedding
    if self.has_variable(COMPUTE_COPIES, "embedding"):
      embedding = self.get_variable(COMPUTE_COPIES, "embedding")
    with jax.named_scope(OUTPUT_SCOPE):
      return kernels.tied_logits(y, embedding, self.cfg)

  def __call__(self, inputs: Array, targets: Array, train: bool = False) -> Array:
    """Teacher-forced logits for `targets` (which end in EOS, padded with PAD)."""
    return self.logits(self.features(inputs, targets, train))

  def features(self, inputs: Array, targets: Array, train: bool = False) -> Array:
    """Teacher-forced decoder output [batch, tgt_len, d_model] for `targets`: what the
    pre-softmax projection takes (the chunked loss applies it chunk by chunk)."""
    decoder_inputs = shift_right(targets)
    segs = (segments(inputs), segments(targets)) if self.packed else None
    if segs is not None:  # each packed sentence starts from BOS, not the previous one's EOS
      decoder_inputs = jnp.where((segs[1].positions == 0) & (targets != PAD_ID), BOS_ID,
                                 decoder_inputs)
    # Positions past the sentence (target PAD) are masked as keys; without this the
    # shifted-in EOS would look like a real token there.
    decoder_inputs = jnp.where((targets == PAD_ID) & (decoder_inputs != BOS_ID),
                               PAD_ID, decoder_inputs)
    encoded = self.encode(inputs, train, None if segs is None else segs[0])
    return self.decoder_output(encoded, inputs, decoder_inputs, train, segs)


# ---------------------------------------------------------------------------------------
# Dropout (section 5.4): a counter hash, so masks follow each example's place in the global
# batch, not the device layout (exact resume on another device count)


def _mix32(h: Array) -> Array:
  """MurmurHash3's 32-bit finaliser: every input bit flips each output bit with p ~ 1/2."""
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def dropout_keep_mask(key: Array, shape: tuple[int, ...], rate: float,
                      first_row: Array | int = 0) -> Array:
  """Boolean keep mask with P(keep) = 1 - rate (to 2^-32), as a counter-based hash.

  On XLA:CPU `jax.random.bits` costs ~15 ns per element (threefry is not
  vectorised), which made dropout masks ~11% of a training step; hashing the
  element index with two key words drawn from `key` is ~50x cheaper. Masks are
  a pure function of `key`, so resumed runs replay them exactly. The index counts
  from row `first_row` of the batch (axis 0): a row's mask depends on its place in
  the whole batch, not on how the batch was split over devices.
  """
  k = jax.random.bits(key, (2,), jnp.uint32)
  row_elements = math.prod(shape[1:])
  index = (jax.lax.iota(jnp.uint32, math.prod(shape)).reshape(shape)
           + jnp.asarray(first_row, jnp.uint32) * jnp.uint32(row_elements))
  h = _mix32(_mix32(index * jnp.uint32(0x9E3779B9) + k[0]) ^ k[1])
  return h >= jnp.uint32(min(int(round(rate * 2.0 ** 32)), 2 ** 32 - 1))


class Dropout(nn.Module):
  """Inverted dropout (section 5.4) with the cheap mask of `dropout_keep_mask`."""
  rate: float
  first_row: Array | int = 0  # x's first row in the step's global batch (train.train_step)

  @nn.compact
  def __call__(self, x: Array, deterministic: bool) -> Array:
    if deterministic or self.rate == 0.0:
      return x
    keep = dropout_keep_mask(self.make_rng("dropout"), x.shape, self.rate, self.first_row)
    return jnp.where(keep, x * jnp.asarray(1.0 / (1.0 - self.rate), x.dtype), jnp.zeros_like(x))


# ---------------------------------------------------------------------------------------
# Parameters


def _init(cfg: ModelConfig, rng: Array, batch: int = 1, length: int = 8) -> Any:
  tokens = jnp.ones((batch, length), jnp.int32)
  return Transformer(cfg).init({"params": rng}, tokens, tokens, train=False)["params"]


def init_params(cfg: ModelConfig, rng: Array, batch: int = 1, length: int = 8) -> Any:
  """Initialises parameters with dummy shapes (the model is shape-polymorphic).

  Jitted: run op by op, the dummy forward pass compiles each small op on its own
  (seconds of start-up on CPU).
  """
  return jax.jit(_init, static_argnums=(0, 2, 3))(cfg, rng, batch, length)


def abstract_params(cfg: ModelConfig) -> Any:
  """Parameter shapes without allocating or computing anything (fast for big models): a
  new tree each call, of shapes traced once per config (~0.2 s a trace on a CPU, which a
  command's disk and memory checks and its checkpoint reads each asked for)."""
  return jax.tree_util.tree_map(lambda x: x, _traced_shapes(cfg))


@functools.lru_cache(maxsize=32)
def _traced_shapes(cfg: ModelConfig) -> Any:
  return jax.eval_shape(lambda rng: _init(cfg, rng), jax.random.PRNGKey(0))


def train_bytes_per_token(cfg: ModelConfig, length: int, full_logits: bool) -> float:
  """A generous estimate of the device memory one target token's training costs (its
  source token with it): the activations autodiff keeps for the backward pass, per layer,
  plus the float32 logits and their gradient when they are built whole. It sizes the auto
  micro-batch (backend.micro_batch_tokens); the device check records the peak it measured.

  Per token and layer: float32 residual-stream tensors (sub-layer inputs, LayerNorm
  outputs), the compute-dtype projections, attention scores over `length` keys per head
  (none kept by the fused kernel), the FFN's hidden layer, dropout masks; x1.5 for XLA's
  temporaries.
  """
  c = 2 if kernels.bf16(cfg) else 4
  d, h = cfg.d_model, cfg.num_heads
  scores = 0 if cfg.fused_attention else h * length * (4 + c)
  attention = 8 * d + 4 * c * h * max(cfg.d_k, cfg.d_v) + scores
  ffn = 8 * d + 2 * c * cfg.d_ff
  encoder = attention + ffn + 3 * d
  decoder = 2 * attention + ffn + 4 * d
  logits = 8 * cfg.vocab_size if full_logits else 0
  return 1.5 * (cfg.num_encoder_layers * encoder + cfg.num_layers * decoder + logits)


COMPUTE_COPIES = "compute_copies"  # the variable collection of `inference_variables`' copies


def inference_variables(params: Any, cfg: ModelConfig) -> dict[str, Any]:
  """The variables a decoder applies the model with: in bf16, a bf16 copy of the embedding
  for the output projection and, on the plain path, every dense matrix ("kernel") in bf16,
  made once before a search instead of at each of its steps. The products read the same
  bf16 values either way (they cast their float32 inputs), so the search finds the same
  hypotheses; biases, LayerNorm and the embedding lookup keep float32. (Where the dense
  layers promote their matrices to float32 first, XLA:CPU's path, they stay float32.)"""
  if not kernels.bf16(cfg):
    return {"params": params}
  if kernels.dense_reads_bf16_as_is(cfg):
    cast = lambda path, x: (x.astype(jnp.bfloat16)
                            if getattr(path[-1], "key", None) == "kernel" else x)
    params = jax.tree_util.tree_map_with_path(cast, params)
  return {"params": params,
          COMPUTE_COPIES: {"embedding": params["embed"]["embedding"].astype(jnp.bfloat16)}}


def count_params(tree: Any) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(tree)))


def param_count(cfg: ModelConfig) -> int:
  """`count_params` of `cfg`'s model from its shapes (`abstract_params`)."""
  return count_params(abstract_params(cfg))


def param_breakdown(params: Any) -> dict[str, int]:
  """Parameter counts per top-level module, layers grouped (encoder_* -> encoder)."""
  groups: dict[str, int] = {}
  for name, sub in params.items():
    key = name.rsplit("_", 1)[0] if name.rsplit("_", 1)[-1].isdigit() else name
    groups[key] = groups.get(key, 0) + count_params(sub)
  return groups
