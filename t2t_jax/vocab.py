"""The shared SentencePiece vocabulary (paper section 5.1: one vocabulary for both sides)."""

from __future__ import annotations

import os
import tempfile
from typing import Iterable, Sequence

from t2t_jax.special_tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID


class Vocabulary:
  """SentencePiece model with the project's reserved ids (PAD 0, EOS 1, BOS 2, UNK 3)."""

  def __init__(self, path: str):
    import sentencepiece as spm
    self.path = path
    self._sp = spm.SentencePieceProcessor(model_file=path)
    if (self._sp.pad_id(), self._sp.eos_id(), self._sp.bos_id(), self._sp.unk_id()) != \
        (PAD_ID, EOS_ID, BOS_ID, UNK_ID):
      raise ValueError(f"{path}: SentencePiece model does not use the reserved ids")

  @property
  def size(self) -> int:
    return self._sp.get_piece_size()

  def encode(self, text: str) -> list[int]:
    """Token ids without EOS."""
    return self._sp.encode(text)

  def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
    return self._sp.encode(list(texts))

  def decode(self, ids: Iterable[int]) -> str:
    """Text of the ids up to the first EOS; PAD/BOS are ignored."""
    out = []
    for t in ids:
      t = int(t)
      if t == EOS_ID:
        break
      if t not in (PAD_ID, BOS_ID):
        out.append(t)
    return self._sp.decode(out)

  def id_to_piece(self, i: int) -> str:
    return self._sp.id_to_piece(int(i))


def train(lines: Iterable[str], model_path: str, vocab_size: int, model_type: str) -> Vocabulary:
  """Trains a shared vocabulary on `lines` (both sides of the training split).

  `hard_vocab_limit=False` lets a small corpus produce fewer pieces than asked
  for instead of failing; the size used is always <= `vocab_size`.
  """
  import sentencepiece as spm
  os.makedirs(os.path.dirname(model_path), exist_ok=True)
  with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".txt", delete=False,
                                   dir=os.path.dirname(model_path)) as f:
    for line in lines:
      f.write(line.replace("\n", " ") + "\n")
    corpus = f.name
  try:
    spm.SentencePieceTrainer.train(
        input=corpus, model_prefix=model_path[:-len(".model")], vocab_size=vocab_size,
        model_type=model_type, pad_id=PAD_ID, eos_id=EOS_ID, bos_id=BOS_ID, unk_id=UNK_ID,
        hard_vocab_limit=False, character_coverage=1.0, input_sentence_size=3_000_000,
        shuffle_input_sentence=True, num_threads=os.cpu_count() or 1,
        max_sentence_length=65536, minloglevel=2)
  finally:
    os.remove(corpus)
  return Vocabulary(model_path)
