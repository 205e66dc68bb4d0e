"""What differs between the paper's two tasks, asked in one place.

Translation (sections 6.1-6.2) and constituency parsing (section 6.3) train, average and
decode with the same code; they differ in where their pairs come from, how a target is
tokenised and turned back into text, what constrains the search, and how outputs are
scored. A `Task` answers those questions for the data pipeline, the decoder, `--mode=eval`,
the dev score during training and the sweep's report; the task follows from the data
source (`ptb:` specs are parsing, every other source translation).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Sequence

from t2t_jax import bleu, parsing
from t2t_jax.special_tokens import EOS_ID


@dataclasses.dataclass(frozen=True)
class Task:
  """Translation: SentencePiece on both sides, unconstrained search, BLEU."""
  name: str = "translation"
  metric: str = "bleu"          # the dev score's key: dev_bleu
  metric_label: str = "sacreBLEU"

  def vocabulary_symbols(self, train_targets: Iterable[str]) -> list[str]:
    """Pieces the vocabulary must hold whole (SentencePiece's user-defined symbols)."""
    del train_targets
    return []

  def vocabulary(self, base: Any) -> Any:
    """The vocabulary decoding and scoring use, from the SentencePiece model `base`."""
    return base

  def constraint(self, vocab: Any) -> Any:
    """What the beam search may not extend a hypothesis with (None: nothing)."""
    del vocab
    return None

  def prepare_input(self, line: str, pretokenized: bool = False) -> str:
    """A user's input line as the model reads it (translation: as it is)."""
    del pretokenized
    return line

  def search_constraint(self, cfg: Any, vocab: Any) -> Any:
    """The constraint a decoder of `cfg` searches under: the task's, unless
    `decode.constrained` is off."""
    return self.constraint(vocab) if cfg.decode.constrained else None

  def output(self, source: str, hypothesis: str) -> str:
    """The text a user reads for `hypothesis`, decoded from `source`."""
    del source
    return hypothesis

  def score(self, sources: Sequence[str], outputs: Sequence[str], references: Sequence[str],
            lang: str) -> dict[str, Any]:
    """The split's figures for eval/<split>.json; `metric` among them."""
    del sources
    value, signature = bleu.sacrebleu_score(list(outputs), list(references))
    out = {"sacrebleu": round(value, 2), "bleu": round(value, 2),
           "tokenized_bleu": round(bleu.tokenized_bleu(list(outputs), list(references), lang),
                                   2), "signature": signature}
    if lang in bleu.T2T_QUOTE_LANGS:
      out["t2t_reference_bleu"] = round(bleu.tokenized_bleu(
          list(outputs), list(references), lang, t2t_reference=True), 2)
    return out

  def summary(self, result: dict[str, Any]) -> str:
    t2t = (f"  (T2T's reference quotes: {result['t2t_reference_bleu']:.2f})"
           if "t2t_reference_bleu" in result else "")
    return (f"sacreBLEU {result['sacrebleu']:.2f} ({result['signature']})  tokenized BLEU "
            f"{result['tokenized_bleu']:.2f}{t2t}")

  def dev_score(self, sources: Sequence[str], outputs: Sequence[str],
                references: Sequence[str]) -> float:
    return bleu.sacrebleu_score(list(outputs), list(references))[0]


@dataclasses.dataclass(frozen=True)
class ParsingTask(Task):
  """Parsing: words in, a tree out (labelled brackets with POS tags as one symbol, or a label
  per word), decoded under the tree constraint and scored with EVALB's rules (COLLINS.prm).
  With `data.tree_target=tagged_word_labels` the model predicts each word's POS tag and the
  trees carry its tags (EVALB's tagging accuracy beside F1). Every other form predicts none:
  the scored trees carry the gold tags (tagging accuracy 100 by construction), as seq2seq
  parsers that emit `XX` are scored, and `--mode=translate` writes `XX`."""
  name: str = "parsing"
  metric: str = "f1"
  metric_label: str = "EVALB F1"
  words: bool = False  # `data.tree_target` "words": targets hold the words, copied in search
  labels: bool = False  # `data.tree_target` "labels": a label per word (parsing.to_labels);
  # "word_labels": with `words` too, the words between the labels
  tags: bool = False  # "tagged_word_labels": each word's POS tag after it, predicted

  def prepare_input(self, line: str, pretokenized: bool = False) -> str:
    """Raw text tokenised as the treebank is (or its tokens as given), brackets escaped:
    the words the output tree is over."""
    return parsing.prepare_sentence(line, pretokenized)

  def vocabulary_symbols(self, train_targets: Iterable[str]) -> list[str]:
    if self.labels:
      return parsing.label_symbols(train_targets)
    return parsing.tree_symbols(train_targets)

  def vocabulary(self, base: Any) -> Any:
    return parsing.TreeVocabulary(base, self.words)

  def constraint(self, vocab: Any) -> Any:
    if self.labels:
      return parsing.label_constraint_for(vocab.pieces(), EOS_ID, vocab.model_type == "word",
                                          copy=self.words, tags=self.tags)
    return parsing.constraint_for(vocab.pieces(), EOS_ID, vocab.model_type == "word",
                                  copy=self.words)

  def trees(self, sources: Sequence[str], outputs: Sequence[str],
            gold: Sequence[parsing.Tree] | None = None) -> tuple[list[str], int]:
    """Each output as a one-line tree under TOP over its source's words (with the words and
    tags of the `gold` trees when given: a "tags" source is no sentence); and how many
    outputs the fixed repair rule had to change (never, under the constraint, unless the
    input's words and pieces disagree)."""
    trees, repaired = [], 0
    for n, (src, out) in enumerate(zip(sources, outputs)):
      words = src.split()
      if not words:
        trees.append("")
        continue
      symbols = out.split()
      # Targets that hold the words must copy the sentence's: an output with other words is
      # no parse of it (its tree would be scored over the gold words), so it is repaired.
      copied = not self.words or parsing.copies_words(symbols, words)
      if self.words:
        symbols = parsing.as_word_slots(symbols)
      predicted = None
      if self.labels:
        ok = copied and parsing.labels_well_formed(symbols, len(words), self.words, self.tags)
        kinds = [parsing.label_kind(s) for s in symbols]
        if self.tags:  # the model's tags, one a word (XX where a repaired output has none)
          predicted = ([k[2] for k in kinds if k[0] == "tag"] + [parsing.WORD] * len(words)
                       )[:len(words)]
        symbols = [s for s, k in zip(symbols, kinds) if k[0] in ("pair", "last")]
        to_tree = parsing.from_labels
        if not ok:
          symbols, repaired = parsing.repair_labels(symbols, len(words)), repaired + 1
      else:
        to_tree = parsing.to_tree
        if not (copied and parsing.is_well_formed(symbols, len(words))):
          symbols, repaired = parsing.repair(symbols, len(words)), repaired + 1
      tags = None
      if gold is not None:
        words, tags = map(list, zip(*gold[n].leaves()))
      trees.append(parsing.with_top(to_tree(symbols, words, predicted or tags)))
    return trees, repaired

  def output(self, source: str, hypothesis: str) -> str:
    return self.trees([source], [hypothesis])[0][0]

  def score(self, sources: Sequence[str], outputs: Sequence[str], references: Sequence[str],
            lang: str) -> dict[str, Any]:
    del lang
    gold_trees = [next(parsing.read_trees(r, "reference")) for r in references]
    trees, repaired = self.trees(sources, outputs, gold_trees)
    gold = [parsing.with_top(t) for t in gold_trees]
    result = parsing.evalb(gold, trees)
    # An empty sentence has no tree; every other output was one unless it was repaired.
    well_formed = sum(1 for s in sources if s.split()) - repaired
    return {"f1": result["f1"], "recall": result["recall"],
            "precision": result["precision"], "complete_match": result["complete_match"],
            "evalb": result, "repaired": repaired, "well_formed": well_formed,
            "well_formed_pct": round(100.0 * well_formed / max(len(outputs), 1), 2),
            "pos_tags": ("predicted" if self.tags else
                         "gold tags copied into the predicted trees (not predicted)"),
            "tagging_accuracy": result["tagging_accuracy"],
            "_trees": trees, "_gold": gold}

  def summary(self, result: dict[str, Any]) -> str:
    return (f"EVALB (COLLINS.prm) F1 {result['f1']:.2f}  recall {result['recall']:.2f}  "
            f"precision {result['precision']:.2f}  complete match "
            f"{result['complete_match']:.2f}"
            + (f"  tagging accuracy {result['tagging_accuracy']:.2f}" if self.tags else "")
            + f"  [well-formed {result['well_formed']}, repaired {result['repaired']}]")

  def dev_score(self, sources: Sequence[str], outputs: Sequence[str],
                references: Sequence[str]) -> float:
    return self.score(sources, outputs, references, "")["f1"]


TRANSLATION, PARSING = Task(), ParsingTask()


def for_dataset(spec: str) -> Task:
  """The task a `--dataset` spec's data is for: a treebank is parsed, the rest translated."""
  return PARSING if spec.startswith("ptb:") else TRANSLATION


def for_config(cfg: Any) -> Task:
  task = for_dataset(cfg.data.dataset)
  if task is PARSING and cfg.data.tree_target in ("words", "tags"):
    return dataclasses.replace(PARSING, words=True)
  if task is PARSING and cfg.data.tree_target in ("labels", "word_labels", "tagged_word_labels"):
    return dataclasses.replace(PARSING, labels=True, words=cfg.data.tree_target != "labels",
                               tags=cfg.data.tree_target == "tagged_word_labels")
  return task
