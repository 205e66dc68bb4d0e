"""A WMT-shaped corpus from short real pairs: `python -m t2t_jax.tools.wmt_shaped --out=DIR`.

WMT14's sentences average about 3 times a Tatoeba pair's length, and its
training split has millions of lines. Joining `--join` random Tatoeba pairs per
line gives text of WMT's lengths and vocabulary spread, as many lines as asked,
with the real newstest2013/2014 as newstest2013.*/newstest2014.*: the input
pipeline's and the preparation's benchmarks measure against it without a
download. Deterministic in `--seed`.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("out", None, "Folder to write train.* / newstest2013.* / newstest2014.* to.")
flags.DEFINE_integer("pairs", 500_000, "Training lines to write.")
flags.DEFINE_integer("join", 3, "Tatoeba pairs joined into one line.")
flags.DEFINE_integer("seed", 0, "Seed of the random choice of pairs.")
flags.DEFINE_string("tatoeba", None, "The Tatoeba en-de folder (default: "
                    "../shared/data/tatoeba_ende beside the repository).")
flags.DEFINE_string("newstest", None, "The newstest en-de folder (default: "
                    "../shared/data/wmt_newstest_ende beside the repository).")

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SHARED = os.path.join(os.path.dirname(_REPO), "shared", "data")


def _lines(path: str) -> list[str]:
  with open(path, encoding="utf-8") as f:
    return f.read().split("\n")[:-1]


def write(out: str, pairs: int, join: int, seed: int, tatoeba: str, newstest: str) -> None:
  """Writes the corpus to `out` (en-de)."""
  en, de = (_lines(os.path.join(tatoeba, f"train.{lang}")) for lang in ("en", "de"))
  rng = np.random.default_rng(seed)
  os.makedirs(out, exist_ok=True)
  chunk = 100_000
  with open(os.path.join(out, "train.en"), "w", encoding="utf-8") as f_en, \
       open(os.path.join(out, "train.de"), "w", encoding="utf-8") as f_de:
    for start in range(0, pairs, chunk):
      picks = rng.integers(0, len(en), size=(min(chunk, pairs - start), join))
      f_en.write("".join(" ".join(en[i] for i in row) + "\n" for row in picks))
      f_de.write("".join(" ".join(de[i] for i in row) + "\n" for row in picks))
  for split in ("newstest2013", "newstest2014"):
    for lang in ("en", "de"):
      with open(os.path.join(newstest, f"{split}.{lang}"), encoding="utf-8") as src, \
           open(os.path.join(out, f"{split}.{lang}"), "w", encoding="utf-8") as dst:
        dst.write(src.read())


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if not FLAGS.out:
    raise app.UsageError("--out is required")
  tatoeba = FLAGS.tatoeba or os.path.join(_SHARED, "tatoeba_ende")
  newstest = FLAGS.newstest or os.path.join(_SHARED, "wmt_newstest_ende")
  for folder in (tatoeba, newstest):
    if not os.path.isdir(folder):
      print(f"error: {folder} not found (give --tatoeba / --newstest)", file=sys.stderr)
      sys.exit(2)
  write(FLAGS.out, FLAGS.pairs, FLAGS.join, FLAGS.seed, tatoeba, newstest)
  print(f"wrote {FLAGS.pairs:,d} training pairs ({FLAGS.join} Tatoeba pairs each) and "
        f"newstest2013/2014 to {FLAGS.out}")


if __name__ == "__main__":
  app.run(main)
