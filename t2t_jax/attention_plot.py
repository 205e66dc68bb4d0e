"""Pictures of every attention head for one sentence, like the paper's appendix figures."""

from __future__ import annotations

from typing import Any

import numpy as np

from t2t_jax import model
from t2t_jax.config import ModelConfig
from t2t_jax.special_tokens import BOS_ID, EOS_ID


def _pieces(vocab: Any, ids: list[int]) -> list[str]:
  names = {EOS_ID: "</s>", BOS_ID: "<s>"}
  piece = getattr(vocab, "id_to_piece", None)
  return [names.get(i) or (piece(i) if piece else str(i)) for i in ids]


def attention_weights(params: Any, cfg: ModelConfig, src: list[int], tgt: list[int],
                      layer: int) -> dict[str, np.ndarray]:
  """Head-wise weights [heads, queries, keys] of `layer` for a teacher-forced pair."""
  _, state = model.Transformer(cfg).apply(
      {"params": params}, np.array([src], np.int32), np.array([tgt], np.int32),
      mutable=["intermediates"])
  inter = state["intermediates"]
  get = lambda block, name: np.asarray(inter[block][name]["attention_weights"][0][0])
  return {"encoder self-attention": get(f"encoder_{layer}", "self_attention"),
          "decoder self-attention": get(f"decoder_{layer}", "self_attention"),
          "encoder-decoder attention": get(f"decoder_{layer}", "cross_attention")}


def plot(params: Any, cfg: ModelConfig, vocab: Any, src: list[int], tgt: list[int],
         layer: int, path: Any, title: str = "", image_format: str | None = None) -> Any:
  """Writes an image grid (PNG unless `image_format` or the file name says otherwise) to
  `path`, a file name or a binary file: one row per attention kind, one column per head."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  if not 0 <= layer < cfg.num_layers:
    raise ValueError(f"layer must be in [0, {cfg.num_layers}), got {layer}")
  weights = attention_weights(params, cfg, src, tgt, layer)
  src_labels = _pieces(vocab, src)
  dec_in_labels = _pieces(vocab, [BOS_ID] + tgt[:-1])
  heads = cfg.num_heads
  labels = {"encoder self-attention": (src_labels, src_labels),
            "decoder self-attention": (dec_in_labels, dec_in_labels),
            "encoder-decoder attention": (dec_in_labels, src_labels)}
  cell = 0.22 * max(len(src), len(tgt)) + 1.0
  fig, axes = plt.subplots(3, heads, figsize=(cell * heads, cell * 3), squeeze=False)
  for row, (kind, w) in enumerate(weights.items()):
    q_labels, k_labels = labels[kind]
    for h in range(heads):
      ax = axes[row][h]
      ax.imshow(w[h], cmap="viridis", vmin=0.0, vmax=1.0)
      ax.set_xticks(range(len(k_labels)), k_labels, rotation=90, fontsize=6)
      ax.set_yticks(range(len(q_labels)), q_labels, fontsize=6)
      ax.set_title(f"{kind}\nlayer {layer}, head {h}", fontsize=7)
  if title:
    fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=110, format=image_format)
  plt.close(fig)
  return path


