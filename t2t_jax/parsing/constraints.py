"""The decoder's grammar: only prefixes of well-formed trees over the input's words, for
the bracket form (`TreeConstraint`) and a label per word (`LabelConstraint`), with or without
the words copied from the input."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from t2t_jax.parsing.brackets import symbol_kind
from t2t_jax.parsing.labels import label_kind
from t2t_jax.special_tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

def _input_piece_at(src: Any, position: Any) -> Any:
  """[b, k] the input piece `src` [b, width] holds at `position` [b, k] (the last past it):
  what a copying constraint's hypothesis places next."""
  import jax.numpy as jnp
  return jnp.take_along_axis(src, jnp.minimum(position, src.shape[1] - 1), axis=1)


@dataclasses.dataclass(frozen=True)
class TreeConstraint:
  """Token tables for constrained beam search (`decode.search_steps`): each hypothesis keeps
  its stack of open labels, its depth and its words so far, and may take only

    an open bracket    while it has words to place (and only as the root at the start),
    `XX`               inside a bracket, while words remain,
    the close bracket  of its innermost open label, not right after opening it, and
                       the root's only once every word is placed,
    EOS                once the root is closed,

  each only if the tokens left before the length limit can still finish the tree. The
  input's word count is its tokens that begin a word (SentencePiece's '▁', and in a word
  vocabulary the unknown word too). With `copy` (a "words" target) a word slot is the
  input's next piece itself instead of `XX`, and brackets come only between words. Hashable,
  so that it can be a static argument of the compiled search."""
  kind: tuple[int, ...]         # per token id: 0 other, 1 open, 2 close, 3 word, 4 EOS
  label: tuple[int, ...]        # per token id: its bracket's label index (0 for others)
  word_start: tuple[int, ...]   # per token id: 1 when the piece begins a word
  max_depth: int = 64
  copy: bool = False

  OTHER, OPEN, CLOSE, WORD, END = 0, 1, 2, 3, 4

  def start(self, inputs: Any, k: int) -> dict[str, Any]:
    import jax.numpy as jnp
    b = inputs.shape[0]
    starts = jnp.asarray(self.word_start, jnp.int32)
    # Slots to fill: words, or with `copy` the input's pieces (EOS and padding are none).
    pieces = (inputs != EOS_ID) & (inputs != PAD_ID)
    n = jnp.sum(pieces, axis=-1) if self.copy else jnp.sum(starts[inputs], axis=-1)
    return {"n_words": n, "src": inputs,
            "stack": jnp.zeros((b, k, self.max_depth), jnp.int32),
            "depth": jnp.zeros((b, k), jnp.int32), "words": jnp.zeros((b, k), jnp.int32),
            "prev": jnp.zeros((b, k), jnp.int32)}

  def _kinds(self, width: int) -> Any:
    """[width] the kind of each id of the model's output (ids past the vocabulary: other)."""
    import jax.numpy as jnp
    return jnp.asarray(self.kind + (self.OTHER,) * max(0, width - len(self.kind)), jnp.int32)

  @staticmethod
  def _next_piece(g: dict[str, Any]) -> Any:
    """[b, k] the input piece each hypothesis places next under `copy`."""
    return _input_piece_at(g["src"], g["words"])

  def _moves(self, g: dict[str, Any], i: Any, max_len: Any) -> dict[str, Any]:
    """[b, k, 1] each: whether an open bracket, a word slot, a close bracket (of the
    innermost label, "top") and EOS may come at step `i` (max_len [b]: tokens before EOS);
    under `copy`, "next": the input piece a word slot places."""
    import jax.numpy as jnp
    depth, words, prev = g["depth"][..., None], g["words"][..., None], g["prev"][..., None]
    n = g["n_words"][:, None, None]
    left = (max_len[:, None, None] - i - 1)  # tokens after this one before EOS must come
    top = jnp.take_along_axis(g["stack"], jnp.maximum(g["depth"] - 1, 0)[..., None],
                              axis=-1)
    # Tokens still needed after a move to (depth d, words w): a slot per word, a close per
    # open bracket.
    need = lambda d, w: (n - w) + d
    out = {"top": top}
    # With `copy`: the input's next piece, and whether a word ends before it (brackets go
    # only between words).
    if self.copy:
      out["next"] = self._next_piece(g)[..., None]
      starts = jnp.asarray(self.word_start, jnp.int32)
      between = (words >= n) | (starts[out["next"]] == 1)
    else:
      between = True
    out["open"] = ((words < n) & between & (depth < self.max_depth) & ((depth > 0) | (i == 0))
                   & (need(depth + 1, words) <= left))
    out["word"] = (depth > 0) & (words < n) & (need(depth, words + 1) <= left)
    out["close"] = ((depth > 0) & between & (prev != self.OPEN)
                    & ((depth > 1) | (words == n)) & (need(depth - 1, words) <= left))
    out["end"] = (depth == 0) & (words == n) & (i > 0)
    return out

  def banned(self, g: dict[str, Any], i: Any, max_len: Any, width: int | None = None) -> Any:
    """[b, k, width]: tokens no hypothesis may take at step `i` (max_len [b]: tokens before
    EOS). `width`: the model's output size, which may exceed the vocabulary's (ids past it
    are banned)."""
    import jax.numpy as jnp
    pad = max(0, (width or len(self.kind)) - len(self.kind))
    kind = self._kinds(len(self.kind) + pad)[None, None, :]
    label = jnp.asarray(self.label + (0,) * pad, jnp.int32)[None, None, :]
    ok = self._moves(g, i, max_len)
    slot = (jnp.arange(kind.shape[-1])[None, None, :] == ok["next"]) if self.copy else \
        (kind == self.WORD)
    allowed = ((kind == self.OPEN) & ok["open"]) | (slot & ok["word"]) | \
        ((kind == self.CLOSE) & ok["close"] & (label == ok["top"])) | \
        ((kind == self.END) & ok["end"])
    return ~allowed

  def candidates(self, logits: Any, g: dict[str, Any], i: Any, max_len: Any,
                 min_len: Any) -> tuple[Any, Any, Any]:
    """The only tokens a hypothesis can take, as a few columns instead of the whole
    vocabulary: every open bracket, every close bracket, the word slot (`XX`, or under
    `copy` the input's next piece) and EOS: their log-probabilities [b, k, columns], token
    ids, and whether each is allowed (not a close of another label than the innermost, not
    past `max_len` unless EOS, not EOS before `min_len`). The same scores at the same ids as `rescore`,
    a log-softmax and `banned` over the whole vocabulary give (every other id is banned
    there), for a top-k over k x columns instead of k x vocabulary."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    x = logits.astype(jnp.float32)
    b, k, width = x.shape
    kind = np.asarray(self.kind)
    opens, closes = np.flatnonzero(kind == self.OPEN), np.flatnonzero(kind == self.CLOSE)
    eos = int(np.flatnonzero(kind == self.END)[0])
    norm = jax.nn.logsumexp(x, axis=-1, keepdims=True)
    ok = self._moves(g, i, max_len)
    if self.copy:  # P(a word now): every word piece's probability together (`rescore`)
      slot_id = ok["next"]
      slot = jax.nn.logsumexp(jnp.where(jnp.asarray(self._word_pieces(width)), x, -jnp.inf),
                              axis=-1, keepdims=True)
    else:
      word = int(np.flatnonzero(kind == self.WORD)[0])
      slot_id, slot = jnp.full((b, k, 1), word, jnp.int32), x[..., word:word + 1]
    close_label = jnp.asarray(np.asarray(self.label)[closes], jnp.int32)
    allowed = jnp.concatenate([
        jnp.broadcast_to(ok["open"], (b, k, len(opens))),
        ok["close"] & (close_label == ok["top"]), ok["word"], ok["end"]], axis=-1)
    limit = (i >= max_len)[:, None, None]    # only EOS at the length limit
    early = (i < min_len)[:, None, None]     # no EOS before the shortest length
    allowed = allowed & jnp.concatenate([jnp.broadcast_to(~limit, (b, k, allowed.shape[-1] - 1)),
                                         jnp.broadcast_to(~early, (b, k, 1))], axis=-1)
    scores = jnp.concatenate([x[..., opens], x[..., closes], slot, x[..., eos:eos + 1]],
                             axis=-1) - norm
    ids = jnp.concatenate([jnp.broadcast_to(jnp.asarray(opens, jnp.int32), (b, k, len(opens))),
                           jnp.broadcast_to(jnp.asarray(closes, jnp.int32),
                                            (b, k, len(closes))),
                           slot_id.astype(jnp.int32), jnp.full((b, k, 1), eos, jnp.int32)],
                          axis=-1)
    return scores, ids, allowed

  def _word_pieces(self, width: int) -> Any:
    """[width] bool: the ids that are pieces of words (not brackets, `XX`, EOS, PAD, BOS, or
    past the vocabulary)."""
    import numpy as np
    kind = np.asarray(self.kind + (self.OTHER,) * max(0, width - len(self.kind)))
    ids = np.arange(width)
    return (kind == self.OTHER) & (ids != PAD_ID) & (ids != BOS_ID) & (ids < len(self.kind))

  def rescore(self, g: dict[str, Any], logits: Any) -> Any:
    """[b, k, width] log-probabilities to search with. Under `copy` the input decides which
    word comes next and the model only whether one does: the next piece takes the
    probability of all the word pieces together (the model's P(a word now), what `XX` is in
    the paper's form), the other word pieces none. Otherwise the logits as they are."""
    import jax
    import jax.numpy as jnp
    if not self.copy:
      return logits
    width = logits.shape[-1]
    ids = jnp.arange(width)
    word = jnp.asarray(self._word_pieces(width))
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    slot = jax.nn.logsumexp(jnp.where(word, logp, -jnp.inf), axis=-1, keepdims=True)
    # Once every word is placed there is no next word: the "next piece" is the input's EOS,
    # which keeps its own probability, and the row stays the model's (its words banned).
    placing = (g["words"] < g["n_words"][:, None])[..., None]
    out = jnp.where(word & placing, -jnp.inf, logp)
    return jnp.where((ids == self._next_piece(g)[..., None]) & placing, slot, out)

  def advance(self, g: dict[str, Any], beams: Any, tokens: Any) -> dict[str, Any]:
    """The grammar state after hypotheses `beams` [b, m] took `tokens` [b, m]."""
    import jax.numpy as jnp
    take = lambda x: jnp.take_along_axis(x, beams.reshape(beams.shape + (1,) * (x.ndim - 2)),
                                         axis=1)
    stack, depth, words = take(g["stack"]), take(g["depth"]), take(g["words"])
    kind = jnp.take(jnp.asarray(self.kind, jnp.int32), tokens, mode="fill", fill_value=0)
    label = jnp.take(jnp.asarray(self.label, jnp.int32), tokens, mode="fill", fill_value=0)
    slot = jnp.clip(depth, 0, self.max_depth - 1)
    pushed = jnp.where(jnp.arange(self.max_depth) == slot[..., None], label[..., None], stack)
    stack = jnp.where((kind == self.OPEN)[..., None], pushed, stack)
    depth = jnp.clip(depth + (kind == self.OPEN) - (kind == self.CLOSE), 0, self.max_depth)
    # Under `copy` a piece that is no bracket or EOS can only have been the next input piece.
    words = words + ((kind == self.OTHER) if self.copy else (kind == self.WORD))
    return {**g, "stack": stack, "depth": depth, "words": words, "prev": kind}

  def keep(self, g: dict[str, Any], idx: Any) -> dict[str, Any]:
    """The hypotheses `idx` [b, k] of [b, m] (the live ones after a step)."""
    import jax.numpy as jnp
    take = lambda x: jnp.take_along_axis(x, idx.reshape(idx.shape + (1,) * (x.ndim - 2)),
                                         axis=1)
    return {**g, **{key: take(g[key]) for key in ("stack", "depth", "words", "prev")}}


def constraint_for(pieces: Sequence[str], eos_id: int, unknown_is_word: bool = False,
                   copy: bool = False) -> TreeConstraint:
  """The constraint's tables for a vocabulary given as its pieces (by id); `unknown_is_word`:
  the vocabulary's unknown piece stands for a whole word (SentencePiece's word model);
  `copy`: word slots copy the input's pieces ("words" targets)."""
  labels: dict[str, int] = {}
  kind, label, start = [], [], []
  for i, piece in enumerate(pieces):
    k, lab = symbol_kind(piece)
    code = {"open": 1, "close": 2, "word": 3}.get(k, 0)
    if i == eos_id:
      code = 4
    kind.append(code)
    label.append(labels.setdefault(lab, len(labels) + 1) if code in (1, 2) else 0)
    start.append(int(piece.startswith("\u2581") or (unknown_is_word and i == UNK_ID)))
  return TreeConstraint(tuple(kind), tuple(label), tuple(start), copy=copy)


@dataclasses.dataclass(frozen=True)
class LabelConstraint:
  """Token tables for constrained beam search over a label per word (`to_labels`): a
  hypothesis may take a pair label while it has labelled fewer than all but the last word
  and the label keeps it at or below the root, the last-word label for the last word, EOS
  after it, nothing else. With `copy` (the words between the labels), the input's pieces
  come in order and each pair's label right after its second word: those steps have one
  allowed token, which the search scores as certain (log-probability 0); with `tags` too,
  each whole word's POS tag (the model's choice among the tags) before anything else. Every
  output is then a tree over the input's words. Hashable, so that it can be a static
  argument of the compiled search."""
  kind: tuple[int, ...]        # per token id: 0 other, 1 pair label, 2 last-word label, 4 EOS,
  change: tuple[int, ...]      # 8 POS tag; a pair label's depth change (0 for others)
  word_start: tuple[int, ...]  # per token id: 1 when the piece begins a word
  copy: bool = False
  tags: bool = False           # under `copy`: each whole word's POS tag right after it

  OTHER, PAIR, LAST, END, TAG = 0, 1, 2, 4, 8

  def start(self, inputs: Any, k: int) -> dict[str, Any]:
    import jax.numpy as jnp
    b = inputs.shape[0]
    n = jnp.sum(jnp.asarray(self.word_start, jnp.int32)[inputs], axis=-1)
    zeros = jnp.zeros((b, k), jnp.int32)
    return {"n_words": n, "n_pieces": jnp.sum((inputs != EOS_ID) & (inputs != PAD_ID), axis=-1),
            "src": inputs, "labels": zeros, "depth": zeros, "pieces": zeros, "words": zeros,
            "tags": zeros}

  def _moves(self, g: dict[str, Any]) -> dict[str, Any]:
    """[b, k, 1] each: whether a pair label, the last-word label, EOS and (under `copy`) the
    input's next piece ("next", its id) may come next."""
    import jax.numpy as jnp
    labels, words, pieces = (g[key][..., None] for key in ("labels", "words", "pieces"))
    n, n_pieces = g["n_words"][:, None, None], g["n_pieces"][:, None, None]
    out = {"depth": g["depth"][..., None], "end": (labels == n) & (n > 0)}
    if not self.copy:
      out["pair"], out["last"] = labels < n - 1, labels == n - 1
      return out
    out["next"] = _input_piece_at(g["src"], g["pieces"])[..., None]
    starts = jnp.asarray(self.word_start, jnp.int32)
    left = pieces < n_pieces
    boundary = ~left | (starts[out["next"]] == 1)  # the word before is whole
    caught_up = labels == jnp.maximum(words - 1, 0)  # each word after the first labelled
    tagged = g["tags"][..., None] == words if self.tags else True  # each whole word tagged
    out["copy"] = left & (~boundary | (caught_up & tagged))
    out["pair"] = boundary & tagged & (labels < n - 1) & (labels < words - 1)
    out["last"] = ~left & (words == n) & (labels == n - 1) & tagged
    out["tag"] = boundary & (g["tags"][..., None] < words) if self.tags else False
    return out

  def _allowed(self, ok: dict[str, Any], kind: Any, change: Any, at_limit: Any) -> Any:
    """[b, k, columns] whether each label or EOS column (`kind`, `change`) may come next;
    `at_limit` [b, 1, 1]: the length limit is reached, where EOS may end an unfinished
    sequence (a limit too short for it: the repair rule then starts from its labels)."""
    return (((kind == self.PAIR) & ok["pair"] & (ok["depth"] + change >= 1))
            | ((kind == self.LAST) & ok["last"])
            | ((kind == self.TAG) & ok.get("tag", False))
            | ((kind == self.END) & (ok["end"] | at_limit)))

  def _tables(self, width: int) -> tuple[Any, Any]:
    import jax.numpy as jnp
    pad = max(0, width - len(self.kind))
    return (jnp.asarray(self.kind + (self.OTHER,) * pad, jnp.int32),
            jnp.asarray(self.change + (0,) * pad, jnp.int32))

  def banned(self, g: dict[str, Any], i: Any, max_len: Any, width: int | None = None) -> Any:
    """[b, k, width]: tokens no hypothesis may take (ids past the vocabulary included)."""
    import jax.numpy as jnp
    width = width or len(self.kind)
    kind, change = self._tables(width)
    ok = self._moves(g)
    allowed = self._allowed(ok, kind[None, None, :], change[None, None, :],
                            (i >= max_len)[:, None, None])
    if self.copy:
      allowed = allowed | ((jnp.arange(width)[None, None, :] == ok["next"]) & ok["copy"])
    return ~allowed

  def candidates(self, logits: Any, g: dict[str, Any], i: Any, max_len: Any,
                 min_len: Any) -> tuple[Any, Any, Any]:
    """The label columns and EOS (and under `copy` the input's next piece, scored 0) alone:
    their log-probabilities [b, k, columns], ids, and whether each is allowed (`banned`'s
    rule; at the length limit only EOS, no EOS before `min_len`)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    x = logits.astype(jnp.float32)
    b, k, _ = x.shape
    cols = np.flatnonzero(np.asarray(self.kind) != self.OTHER)
    kind = jnp.asarray(np.asarray(self.kind)[cols], jnp.int32)
    change = jnp.asarray(np.asarray(self.change)[cols], jnp.int32)
    ok = self._moves(g)
    allowed = self._allowed(ok, kind, change, (i >= max_len)[:, None, None])
    scores = x[..., cols] - jax.nn.logsumexp(x, axis=-1, keepdims=True)
    ids = jnp.broadcast_to(jnp.asarray(cols, jnp.int32), (b, k, len(cols)))
    if self.copy:
      allowed = jnp.concatenate([allowed, ok["copy"]], axis=-1)
      scores = jnp.concatenate([scores, jnp.zeros((b, k, 1), jnp.float32)], axis=-1)
      ids = jnp.concatenate([ids, ok["next"].astype(jnp.int32)], axis=-1)
      kind = jnp.concatenate([kind, jnp.zeros((1,), jnp.int32)])
    is_end = kind == self.END
    allowed = allowed & jnp.where(is_end, i >= min_len[:, None, None],
                                  i < max_len[:, None, None])
    return scores, ids, allowed

  def rescore(self, g: dict[str, Any], logits: Any) -> Any:
    """Under `copy`, a step that copies the input's next piece has no choice: that piece
    scores log-probability 0 (every other token none). Otherwise the logits as they are."""
    import jax.numpy as jnp
    if not self.copy:
      return logits
    ok = self._moves(g)
    forced = jnp.where(jnp.arange(logits.shape[-1]) == ok["next"], 0.0, -jnp.inf)
    return jnp.where(ok["copy"], forced, logits.astype(jnp.float32))

  def advance(self, g: dict[str, Any], beams: Any, tokens: Any) -> dict[str, Any]:
    """The state after hypotheses `beams` [b, m] took `tokens` [b, m]."""
    import jax.numpy as jnp
    take = lambda key: jnp.take_along_axis(g[key], beams, axis=1)
    kind = jnp.take(jnp.asarray(self.kind, jnp.int32), tokens, mode="fill", fill_value=0)
    change = jnp.take(jnp.asarray(self.change, jnp.int32), tokens, mode="fill", fill_value=0)
    out = {**g, "labels": take("labels") + ((kind == self.PAIR) | (kind == self.LAST)),
           "depth": take("depth") + change}
    if self.copy:  # any other token can only have been the input's next piece
      starts = jnp.take(jnp.asarray(self.word_start, jnp.int32), tokens, mode="fill",
                        fill_value=0)
      copied = kind == self.OTHER
      out["pieces"] = take("pieces") + copied
      out["words"] = take("words") + (copied & (starts == 1))
      out["tags"] = take("tags") + (kind == self.TAG)
    return out

  def keep(self, g: dict[str, Any], idx: Any) -> dict[str, Any]:
    import jax.numpy as jnp
    return {**g, **{key: jnp.take_along_axis(g[key], idx, axis=1)
                    for key in ("labels", "depth", "pieces", "words", "tags")}}


def label_constraint_for(pieces: Sequence[str], eos_id: int, unknown_is_word: bool = False,
                         copy: bool = False, tags: bool = False) -> LabelConstraint:
  """The label constraint's tables for a vocabulary given as its pieces (by id); `copy`:
  the words come between the labels (`to_labels(..., words=True)`), `tags`: each with its
  POS tag after it."""
  kind, change, start = [], [], []
  for i, piece in enumerate(pieces):
    k, delta, _, _ = label_kind(piece)
    code = {"pair": LabelConstraint.PAIR, "last": LabelConstraint.LAST,
            "tag": LabelConstraint.TAG}.get(k, 0)
    if i == eos_id:
      code = LabelConstraint.END
    kind.append(code)
    change.append(delta if code == LabelConstraint.PAIR else 0)
    start.append(int((piece.startswith("\u2581") and k == "other")
                     or (unknown_is_word and i == UNK_ID)))
  return LabelConstraint(tuple(kind), tuple(change), tuple(start), copy, tags and copy)
