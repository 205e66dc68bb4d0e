"""The shared SentencePiece vocabulary (paper section 5.1: one vocabulary for both sides)."""

from __future__ import annotations

import os
from typing import Iterable, Sequence

from t2t_jax.errors import UserError
from t2t_jax.special_tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID


class Vocabulary:
  """SentencePiece model with the project's reserved ids (PAD 0, EOS 1, BOS 2, UNK 3)."""

  def __init__(self, path: str):
    import sentencepiece as spm
    self.path = path
    try:
      self._sp = spm.SentencePieceProcessor(model_file=path)
    except (OSError, RuntimeError) as e:  # a truncated or foreign file
      raise UserError(f"{path} is not a SentencePiece model "
                      f"({(str(e).strip().splitlines() or ['unreadable'])[-1][:200]})") from None
    if (self._sp.pad_id(), self._sp.eos_id(), self._sp.bos_id(), self._sp.unk_id()) != \
        (PAD_ID, EOS_ID, BOS_ID, UNK_ID):
      raise UserError(f"{path}: SentencePiece model does not use the reserved ids (PAD 0, "
                      f"EOS 1, BOS 2, UNK 3)")

  @property
  def size(self) -> int:
    return self._sp.get_piece_size()

  @property
  def model_type(self) -> str:
    """SentencePiece's model type: "bpe", "unigram", "word" or "char"."""
    from sentencepiece import sentencepiece_model_pb2
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(self._sp.serialized_model_proto())
    return sentencepiece_model_pb2.TrainerSpec.ModelType.Name(proto.trainer_spec.model_type).lower()

  def encode(self, text: str) -> list[int]:
    """Token ids without EOS."""
    return self._sp.encode(text)

  def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of many texts, on every core (SentencePiece's own threads)."""
    return self._sp.encode(list(texts), num_threads=os.cpu_count() or 1)

  # A target is tokenised as a source is; a task whose targets are other symbols (a tree's
  # brackets, parsing.TreeVocabulary) says otherwise.
  def encode_target(self, text: str) -> list[int]:
    return self.encode(text)

  def encode_targets_many(self, texts: Sequence[str]) -> list[list[int]]:
    return self.encode_many(texts)

  @staticmethod
  def content_ids(ids: Iterable[int]) -> list[int]:
    """The ids up to the first EOS, without PAD and BOS."""
    out = []
    for t in ids:
      t = int(t)
      if t == EOS_ID:
        break
      if t not in (PAD_ID, BOS_ID):
        out.append(t)
    return out

  def decode(self, ids: Iterable[int]) -> str:
    """Text of the ids up to the first EOS; PAD/BOS are ignored."""
    return self._sp.decode(self.content_ids(ids))

  def id_to_piece(self, i: int) -> str:
    return self._sp.id_to_piece(int(i))


def write_sample(text_files: Sequence[str], line_counts: Sequence[int], size: int, seed: int,
                 out_path: str) -> int:
  """Writes a uniform sample of `size` lines drawn from all the files' lines (all of them if
  there are fewer) to `out_path`, in file order; returns how many.

  Our own seeded draw, not SentencePiece's unseeded shuffle: every preparation of a
  corpus, on any host, trains on the same sentences and so yields the same vocabulary.
  """
  import numpy as np
  total = int(sum(line_counts))
  if total <= size:
    chosen = None
  else:
    chosen = np.sort(np.random.default_rng(seed).choice(total, size=size, replace=False))
  written, offset, k = 0, 0, 0
  with open(out_path, "w", encoding="utf-8") as out:
    for path, count in zip(text_files, line_counts):
      with open(path, encoding="utf-8") as f:
        if chosen is None:
          for line in f:
            out.write(line)
            written += 1
        else:
          stop = np.searchsorted(chosen, offset + count)
          wanted = iter(chosen[k:stop] - offset)
          next_wanted = next(wanted, -1)
          for i, line in enumerate(f):
            if i == next_wanted:
              out.write(line)
              written += 1
              next_wanted = next(wanted, -1)
          k = stop
      offset += count
  return written


def train(corpus_path: str, model_path: str, vocab_size: int, model_type: str,
          user_symbols: Sequence[str] = ()) -> Vocabulary:
  """Trains a shared vocabulary on every line of `corpus_path` (a sample of both sides of
  the training split), deterministically: no sampling or shuffling inside SentencePiece.

  `hard_vocab_limit=False` lets a small corpus produce fewer pieces than asked
  for instead of failing; the size used is always <= `vocab_size`.
  """
  import sentencepiece as spm
  from sentencepiece import sentencepiece_model_pb2
  spm.SentencePieceTrainer.train(
      input=corpus_path, model_prefix=model_path[:-len(".model")], vocab_size=vocab_size,
      model_type=model_type, pad_id=PAD_ID, eos_id=EOS_ID, bos_id=BOS_ID, unk_id=UNK_ID,
      hard_vocab_limit=False, character_coverage=1.0, input_sentence_size=0,
      shuffle_input_sentence=False,
      # BPE's pieces do not depend on the thread count (checked: 1, 2, 4); unigram's do.
      num_threads=(os.cpu_count() or 1) if model_type == "bpe" else 1,
      max_sentence_length=65536, minloglevel=2,
      # Pieces kept whole whatever the corpus (a parser's bracket symbols): ids 4, 5, ...
      **({"user_defined_symbols": list(user_symbols)} if user_symbols else {}))
  # The model records where and how it was trained (paths, thread count), which differ
  # between hosts; cleared, two hosts' models are byte-identical. Encoding never reads them.
  proto = sentencepiece_model_pb2.ModelProto()
  with open(model_path, "rb") as f:
    proto.ParseFromString(f.read())
  for field in ("input", "model_prefix", "num_threads"):
    proto.trainer_spec.ClearField(field)
  with open(model_path, "wb") as f:
    f.write(proto.SerializeToString())
  os.remove(model_path[:-len(".model")] + ".vocab")
  return Vocabulary(model_path)
