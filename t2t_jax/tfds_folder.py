"""A tfds builder for local `<split>.<src>` / `<split>.<tgt>` files, prepared offline.

Imported lazily (it imports TensorFlow Datasets). Files are validated by
`data_sources.read_pair_files` before this builder runs.
"""

from __future__ import annotations

import tensorflow_datasets as tfds

from t2t_jax import data_sources


class ParallelFolder(tfds.core.GeneratorBasedBuilder):
  """Sentence pairs from a folder; one tfds split per `<split>` file pair."""

  VERSION = tfds.core.Version("1.0.0")
  MANUAL_DOWNLOAD_INSTRUCTIONS = "Files named <split>.<lang> in the manual directory."

  def __init__(self, *, folder: str, src_lang: str, tgt_lang: str, splits: tuple[str, ...],
               **kwargs):
    self._source = data_sources.Source("folder", folder, src_lang, tgt_lang)
    self._splits = splits
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    src, tgt = self._source.src_lang, self._source.tgt_lang
    return tfds.core.DatasetInfo(
        builder=self,
        description=f"Parallel text from {self._source.name}",
        features=tfds.features.FeaturesDict({src: tfds.features.Text(),
                                             tgt: tfds.features.Text()}),
        supervised_keys=(src, tgt),
        # Keep file order, so hypotheses line up with the user's reference files.
        disable_shuffling=True)

  def _split_generators(self, dl_manager):
    del dl_manager  # offline: the files are read directly
    return {split: self._generate_examples(split) for split in self._splits}

  def _generate_examples(self, split: str):
    src, tgt, _ = data_sources.read_pair_files(self._source, split)
    for i, (s, t) in enumerate(zip(src, tgt)):
      yield i, {self._source.src_lang: s, self._source.tgt_lang: t}
