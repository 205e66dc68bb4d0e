"""`--mode=export`: a trained run as a Hugging Face MarianMT folder, which stock transformers
loads (`MarianMTModel`, `MarianTokenizer`, `pipeline("translation")`) and CTranslate2's
`ct2-transformers-converter` converts. Written with numpy, json and safetensors alone: exporting
needs neither torch nor transformers.

MarianMT is the paper's architecture (post-LayerNorm, one embedding matrix for source, target
and output scaled by sqrt(d_model), sinusoidal positions, ReLU), so the export is a renaming
of our parameters, except for these differences, each mapped here:

1. Sinusoid layout. Ours interleaves sin and cos (PE[pos, 2i] = sin, PE[pos, 2i+1] = cos, as
   the paper writes it); Marian puts every sin first and every cos second. The model is
   equivariant to any fixed permutation of its model axis (LayerNorm and the residual stream
   treat features alike), so every weight's d_model axis is permuted by `model_axis_order`
   and the exported model computes ours in a reordered basis.
2. Biases. Our attention projections have no biases (section 3.2.2); Marian's have them:
   they are written as zeros, as is Marian's `final_logits_bias`.
3. Start symbol. Our decoder starts from the embedding of BOS (id 2, scaled, plus position
   0). Marian's convention, which CTranslate2's converter assumes, starts from a zero vector:
   the embedding of a `<pad>` row appended as the last id (CTranslate2 drops that row), plus
   position 0. So the exported decoder's position table is written with BOS's scaled
   embedding added to its row 0: the same first input. transformers loads that table from
   the file; its `save_pretrained` leaves position tables out, so re-saving an export loses
   this row (export again instead).
4. Special ids. PAD 0, EOS 1, BOS 2, UNK 3 are SentencePiece's own ids in our vocabulary, and
   `vocab.json` maps every piece to its SentencePiece id, so MarianTokenizer's ids are ours;
   only the piece of id 0 is renamed (`<unused_pad>`), since `<pad>` names the appended
   start row. Generation may never emit PAD, BOS or that row (`bad_words_ids`), as our beam
   search.
5. LayerNorm epsilon. Ours is Flax's 1e-6; Marian's is PyTorch's 1e-5 and cannot be set. It
   is the one difference that remains; its effect on float32 logits is below 2e-6 of their
   size (measured on the demo model), far under float32 rounding's own effect.
6. Length penalty. Ours is GNMT's ((5 + |Y|) / 6)^alpha (the paper's); transformers divides
   by |Y|^length_penalty. Greedy search is identical; beam search ranks finished hypotheses
   slightly differently. `length_penalty` is set to our alpha.

Not exportable, each a one-line error: learned positions (Table 3 row E; Marian's are fixed),
d_k * h != d_model or d_k != d_v (Table 3 rows A and B: Marian's head size is d_model / h).
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import numpy as np

from t2t_jax.config import ExperimentConfig
from t2t_jax.errors import UserError
from t2t_jax.special_tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

FORMATS = ("huggingface",)
# Marian's positions are a fixed table of this many rows: the longest output it can decode.
MAX_POSITIONS = 1024


def model_axis_order(d_model: int) -> np.ndarray:
  """Marian's feature k is our feature order[k]: our sin features (even indices), then our
  cos features (odd indices)."""
  return np.concatenate([np.arange(0, d_model, 2), np.arange(1, d_model, 2)])


def marian_positions(length: int, d_model: int) -> np.ndarray:
  """transformers' Marian position table (sin half, cos half), in float64 then float32 as
  transformers computes it."""
  pos = np.arange(length, dtype=np.float64)[:, None]
  freq = 1.0 / np.power(10000.0, 2 * np.arange(d_model // 2, dtype=np.float64) / d_model)
  return np.concatenate([np.sin(pos * freq), np.cos(pos * freq)], axis=1).astype(np.float32)


def check_exportable(cfg: ExperimentConfig) -> None:
  from t2t_jax import tasks
  if tasks.for_config(cfg).name != "translation":
    raise UserError("export: a parser's targets are tree symbols encoded whole, which a "
                    "MarianMT tokenizer would split; only translation models are exported")
  m = cfg.model
  if m.positional != "sinusoidal":
    raise UserError("export: Marian's positions are fixed sinusoids; a model with learned "
                    "positions (model.positional=learned) cannot be exported")
  if m.d_k != m.d_v or m.d_k * m.num_heads != m.d_model:
    raise UserError(f"export: Marian's heads have d_model / h = {m.d_model / m.num_heads:g} "
                    f"features; this model has d_k={m.d_k}, d_v={m.d_v}")


def marian_state(params: Any, cfg: ExperimentConfig) -> dict[str, np.ndarray]:
  """Our parameter tree as MarianMTModel's state dict (numpy float32, torch's layouts)."""
  m = cfg.model
  order = model_axis_order(m.d_model)
  p = lambda tree: {k: (p(v) if isinstance(v, dict) else np.asarray(v, np.float32))
                    for k, v in tree.items()}
  params = p(params)
  out: dict[str, np.ndarray] = {}

  def linear(prefix: str, kernel: np.ndarray, bias: np.ndarray | None, rows_in: bool,
             cols_out: bool) -> None:
    """Our [in, out] kernel as torch's [out, in] weight, model axes reordered."""
    if rows_in:
      kernel = kernel[order, :]
    if cols_out:
      kernel = kernel[:, order]
      bias = bias[order] if bias is not None else None
    out[f"{prefix}.weight"] = np.ascontiguousarray(kernel.T)
    out[f"{prefix}.bias"] = bias if bias is not None else np.zeros(kernel.shape[1], np.float32)

  def attention(prefix: str, ours: dict[str, Any]) -> None:
    for name, theirs in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
      linear(f"{prefix}.{theirs}", ours[name]["kernel"], None, rows_in=True, cols_out=False)
    linear(f"{prefix}.out_proj", ours["out"]["kernel"], None, rows_in=False, cols_out=True)

  def layer_norm(prefix: str, ours: dict[str, Any]) -> None:
    out[f"{prefix}.weight"] = ours["scale"][order]
    out[f"{prefix}.bias"] = ours["bias"][order]

  def ffn(prefix: str, ours: dict[str, Any]) -> None:
    linear(f"{prefix}.fc1", ours["wi"]["kernel"], ours["wi"]["bias"], rows_in=True,
           cols_out=False)
    linear(f"{prefix}.fc2", ours["wo"]["kernel"], ours["wo"]["bias"], rows_in=False,
           cols_out=True)

  embedding = params["embed"]["embedding"][:, order]
  start_row = np.zeros((1, m.d_model), np.float32)  # Marian's decoder start: a zero vector
  out["model.shared.weight"] = np.ascontiguousarray(np.concatenate([embedding, start_row]))
  out["final_logits_bias"] = np.zeros((1, m.vocab_size + 1), np.float32)
  positions = marian_positions(MAX_POSITIONS, m.d_model)
  positions[0] += embedding[BOS_ID] * np.float32(np.sqrt(m.d_model))  # our first input
  out["model.decoder.embed_positions.weight"] = positions
  for i in range(m.num_encoder_layers):
    ours, theirs = params[f"encoder_{i}"], f"model.encoder.layers.{i}"
    attention(f"{theirs}.self_attn", ours["self_attention"])
    layer_norm(f"{theirs}.self_attn_layer_norm", ours["ln_self_attention"])
    ffn(theirs, ours["ffn"])
    layer_norm(f"{theirs}.final_layer_norm", ours["ln_ffn"])
  for i in range(m.num_layers):
    ours, theirs = params[f"decoder_{i}"], f"model.decoder.layers.{i}"
    attention(f"{theirs}.self_attn", ours["self_attention"])
    layer_norm(f"{theirs}.self_attn_layer_norm", ours["ln_self_attention"])
    attention(f"{theirs}.encoder_attn", ours["cross_attention"])
    layer_norm(f"{theirs}.encoder_attn_layer_norm", ours["ln_cross_attention"])
    ffn(theirs, ours["ffn"])
    layer_norm(f"{theirs}.final_layer_norm", ours["ln_ffn"])
  return out


def marian_config(cfg: ExperimentConfig) -> dict[str, Any]:
  """MarianConfig of the export: our rows plus the appended start row (`<pad>`, the last id)."""
  m = cfg.model
  start = m.vocab_size
  return {
      "architectures": ["MarianMTModel"], "model_type": "marian",
      "vocab_size": start + 1, "decoder_vocab_size": start + 1, "d_model": m.d_model,
      "encoder_layers": m.num_encoder_layers, "decoder_layers": m.num_layers,
      "encoder_attention_heads": m.num_heads, "decoder_attention_heads": m.num_heads,
      "encoder_ffn_dim": m.d_ff, "decoder_ffn_dim": m.d_ff, "activation_function": "relu",
      "dropout": m.dropout, "attention_dropout": m.attention_dropout,
      "activation_dropout": m.relu_dropout, "max_position_embeddings": MAX_POSITIONS,
      "scale_embedding": True, "share_encoder_decoder_embeddings": True,
      "tie_word_embeddings": True, "is_encoder_decoder": True, "init_std": 0.02,
      "pad_token_id": start, "eos_token_id": EOS_ID, "bos_token_id": BOS_ID,
      "decoder_start_token_id": start, "forced_eos_token_id": EOS_ID,
      "use_cache": True, "torch_dtype": "float32",
  }


def generation_config(cfg: ExperimentConfig) -> dict[str, Any]:
  """Our decoding defaults as transformers' (section 6.1: beam 4; GNMT's alpha as
  transformers' length_penalty, which is another formula)."""
  d, start = cfg.decode, cfg.model.vocab_size
  return {"decoder_start_token_id": start, "eos_token_id": EOS_ID, "pad_token_id": start,
          "bos_token_id": BOS_ID, "forced_eos_token_id": EOS_ID,
          "bad_words_ids": [[PAD_ID], [BOS_ID], [start]], "num_beams": d.beam_size,
          "length_penalty": d.alpha, "max_length": MAX_POSITIONS}


START_PIECE = "<pad>"  # Marian's name for its decoder start row, the last id
UNUSED_PAD_PIECE = "<unused_pad>"  # our id 0 (PAD), which the exported model never sees


def tokenizer_files(spm_path: str, out: str, src_lang: str, tgt_lang: str, rows: int) -> int:
  """MarianTokenizer's files: the SentencePiece model as both source.spm and target.spm, and
  vocab.json mapping each piece to its SentencePiece id, then the start row's `<pad>` at id
  `rows` (the model's row count). Returns the SentencePiece vocabulary's size."""
  import sentencepiece as spm
  sp = spm.SentencePieceProcessor(model_file=spm_path)
  names = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
  names[PAD_ID] = UNUSED_PAD_PIECE
  # Ids the SentencePiece model lacks (it may have fewer pieces than the model has rows).
  names += [f"<unused_{i}>" for i in range(len(names), rows)]
  pieces = {name: i for i, name in enumerate(names + [START_PIECE])}
  if len(pieces) != rows + 1:
    raise UserError(f"export: {spm_path} has duplicate pieces; vocab.json cannot map them")
  for name in ("source.spm", "target.spm"):
    shutil.copyfile(spm_path, os.path.join(out, name))
  with open(os.path.join(out, "vocab.json"), "w", encoding="utf-8") as f:
    json.dump(pieces, f, ensure_ascii=False, indent=0)
  specials = {"pad_token": START_PIECE, "eos_token": sp.id_to_piece(EOS_ID),
              "unk_token": sp.id_to_piece(UNK_ID)}
  with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": "MarianTokenizer", "source_lang": src_lang,
               "target_lang": tgt_lang, "separate_vocabs": False,
               "model_max_length": MAX_POSITIONS, **specials}, f, indent=2)
  with open(os.path.join(out, "special_tokens_map.json"), "w") as f:
    json.dump(specials, f, indent=2)
  return sp.get_piece_size()


def export_huggingface(cfg: ExperimentConfig, workdir: str, output: str) -> str:
  """Writes the run's averaged (else newest) parameters and vocabulary as a MarianMT folder;
  returns a line saying what was exported. The folder appears whole or not at all."""
  try:
    from safetensors.numpy import save_file
  except ImportError:  # a default install has it; an environment built otherwise may not
    raise UserError('export needs safetensors: pip install safetensors (or pip install -e ".")'
                    ) from None
  from t2t_jax import checkpoints, data_sources, input_pipeline
  check_exportable(cfg)
  spm_path = input_pipeline.workdir_vocab([workdir])  # checked against its sha256
  if spm_path is None:
    raise UserError(f"export: {workdir} has no {input_pipeline.WORKDIR_VOCAB}; train first")
  loaded = checkpoints.load_params_for_inference(workdir, cfg)
  if loaded is None:
    raise UserError(f"export: {workdir} has no checkpoint; train first")
  params, label = loaded
  from t2t_jax import storage
  spm_path = input_pipeline.local_vocab(spm_path)  # SentencePiece reads local files
  output = storage.normalize(output)
  if storage.exists(output) and storage.listdir(output):
    raise UserError(f"export: {output} exists and is not empty; give a new --output")
  # Built in a local folder; then renamed into place, or, for a bucket, its files uploaded
  # with config.json last (transformers reads a folder from its config).
  with storage.replacing_folder(output, build_locally=True, last=("config.json",),
                                unique=True) as tmp:
    src_lang, tgt_lang = data_sources.spec_languages(cfg.data.dataset) or ("src", "tgt")
    vocab_size = tokenizer_files(spm_path, tmp, src_lang, tgt_lang, cfg.model.vocab_size)
    if vocab_size > cfg.model.vocab_size:
      raise UserError(f"export: the vocabulary has {vocab_size} pieces, more than the "
                      f"model's {cfg.model.vocab_size} rows")
    state = marian_state(params, cfg)
    save_file(state, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(tmp, "config.json"), "w") as f:
      json.dump(marian_config(cfg), f, indent=2)
    # safetensors writes through a private temporary file (mode 0600); the folder's other
    # files follow the umask, and so should this one.
    shutil.copymode(os.path.join(tmp, "config.json"), os.path.join(tmp, "model.safetensors"))
    with open(os.path.join(tmp, "generation_config.json"), "w") as f:
      json.dump(generation_config(cfg), f, indent=2)
    with open(os.path.join(tmp, "t2t_jax_export.json"), "w") as f:
      json.dump({"workdir": workdir, "experiment": cfg.name, "parameters": label,
                 "start_row": cfg.model.vocab_size,
                 "layer_norm_epsilon": {"t2t_jax": 1e-6, "marian": 1e-5}}, f, indent=2)
  return f"exported {label} of {workdir} to {output} (MarianMT, {len(state)} tensors)"
