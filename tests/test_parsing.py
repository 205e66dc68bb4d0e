"""Parsing (paper section 6.3): treebank reading and preprocessing on hand-made trees, the
tree as a sequence and back, the decoder's tree constraint, and bracket scoring checked rule
by rule against figures worked out by hand from EVALB's COLLINS.prm."""

import dataclasses
import json
import random
import subprocess
import sys

import numpy as np
import pytest

from conftest import shared_data
from helpers import main_command
from t2t_jax import parsing, tasks
from t2t_jax.special_tokens import EOS_ID

MRG = """
( (S
    (NP-SBJ-1 (NNP Mr.) (NNP Vinken) )
    (VP (VBZ is)
      (NP-PRD (NN chairman) )
      (SBAR (-NONE- 0) (S (-NONE- *T*-1) )))
    (. .) ))
( (S (NP=2 (-LRB- -LRB-) (NN x) (-RRB- -RRB-)) (VP (VBD ran)) ))
"""


def tree(text):
  return next(parsing.read_trees(text, "test"))


# --- reading and preprocessing -----------------------------------------------------------

def test_preprocessing_removes_empty_elements_and_the_constituents_they_empty():
  first, second = [parsing.preprocess(t) for t in parsing.read_trees(MRG, "x.mrg")]
  # The SBAR held only traces: it goes with them, and so does the S inside it.
  assert first.to_string() == ("(S (NP (NNP Mr.) (NNP Vinken)) (VP (VBZ is) (NP (NN chairman)))"
                               " (. .))")
  # NP=2 -> NP; -LRB- and -RRB- stay as tags and words; the outer unlabelled bracket goes.
  assert second.to_string() == "(S (NP (-LRB- -LRB-) (NN x) (-RRB- -RRB-)) (VP (VBD ran)))"


def test_labels_lose_function_tags_and_indices_but_pos_tags_beginning_with_a_dash_stay():
  assert [parsing.strip_label(l) for l in ("NP-SBJ-1", "PP-CLR", "NP=2", "S-TPC-3", "-LRB-",
                                           "-NONE-", "ADVP|PRT", "NP")] == \
      ["NP", "PP", "NP", "S", "-LRB-", "-NONE-", "ADVP|PRT", "NP"]


def test_an_outer_bracket_over_several_constituents_becomes_top():
  t = parsing.preprocess(tree("( (NP (NN a)) (VP (VB b)) )"))
  assert t.to_string() == "(TOP (NP (NN a)) (VP (VB b)))"
  assert parsing.preprocess(tree("( (S (-NONE- *)) )")) is None


@pytest.mark.parametrize("text, message", [
    ("( (S (NP (NN a)) )", "tree 1: unbalanced brackets (unclosed at end of file)"),
    ("(S (NN a)))", "tree 2: expected '(' but found ')'"),
    ("( (S (NP) (NN a)) )", "tree 1: empty constituent (NP)"),
    ("( (S (NN a) b) )", "word 'b' beside constituents"),
])
def test_a_tree_that_does_not_parse_is_one_line_naming_the_file_and_the_tree(text, message):
  with pytest.raises(parsing.TreeError) as e:
    list(parsing.read_trees(text, "wsj_0042.mrg"))
  assert str(e.value).startswith("wsj_0042.mrg: ") and message in str(e.value)
  assert "\n" not in str(e.value)


# --- the sequence form -------------------------------------------------------------------

def test_a_tree_becomes_the_papers_bracket_sequence_and_back_over_the_inputs_words():
  t = parsing.preprocess(tree("( (S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .)) )"))
  symbols = parsing.linearize(t)
  assert " ".join(symbols) == "(S (NP XX XX )NP (VP XX )VP XX )S"
  assert parsing.is_well_formed(symbols, 4)
  back = parsing.to_tree(symbols, ["The", "cat", "sat", "."], ["DT", "NN", "VBD", "."])
  assert back.to_string() == t.to_string()
  assert parsing.to_tree(symbols, ["a", "b", "c", "d"]).to_string() == \
      "(S (NP (XX a) (XX b)) (VP (XX c)) (XX d))"


@pytest.mark.parametrize("symbols, words, ok", [
    ("(S XX XX )S", 2, True),
    ("(S XX XX )S", 3, False),                 # a word too few
    ("(S XX )S (S XX )S", 2, False),           # two roots
    ("(S (NP XX )VP )S", 1, False),            # mismatched close
    ("(S (NP )NP XX )S", 1, False),            # an empty constituent
    ("(S XX", 1, False),                       # unclosed
    ("XX", 1, False),                          # a word outside every bracket
    ("(S XX foo )S", 1, False),                # a symbol that is no bracket
])
def test_well_formed_means_one_rooted_balanced_tree_with_the_words_count(symbols, words, ok):
  assert parsing.is_well_formed(symbols.split(), words) is ok


@pytest.mark.parametrize("symbols, words, repaired", [
    ("(S (NP XX XX )NP XX )S", 3, "(S (NP XX XX )NP XX )S"),     # already a tree: unchanged
    ("(S (NP XX XX )VP XX )S", 3, "(S (NP XX XX XX )NP )S"),     # a stray close is dropped
    ("(S (NP XX XX", 3, "(S (NP XX XX XX )NP )S"),               # missing words, then closes
    ("(S XX XX XX XX )S", 2, "(S XX XX )S"),                     # extra word slots dropped
    ("(NP XX )NP (VP XX )VP", 2, "(S (NP XX )NP (VP XX )VP )S"),  # two roots: wrapped
    ("(S (NP )NP XX )NP )S", 1, "(S XX )S"),                     # empty NP removed
    ("foo", 2, "(S XX XX )S"),
])
def test_the_repair_rule_gives_a_tree_over_exactly_the_inputs_words(symbols, words, repaired):
  out = parsing.repair(symbols.split(), words)
  assert " ".join(out) == repaired
  assert parsing.is_well_formed(out, words)


# --- the decoder's constraint -------------------------------------------------------------

PIECES = ["<pad>", "</s>", "<s>", "<unk>", "XX", "(NP", ")NP", "(S", ")S", "(VP", ")VP",
          "\u2581the", "\u2581cat", "s", "\u2581sat"]


def _constraint():
  return parsing.constraint_for(PIECES, EOS_ID)


def _walk(constraint, words_ids, max_len, rng, prefix=None):
  """A random walk through the allowed tokens (or along `prefix`, checking each is allowed)."""
  import jax.numpy as jnp
  inputs = jnp.array([words_ids + [EOS_ID]])
  g = constraint.start(inputs, 1)
  out = []
  for i in range(max_len + 1):
    banned = np.asarray(constraint.banned(g, jnp.int32(i), jnp.array([max_len])))[0, 0]
    allowed = np.nonzero(~banned)[0]
    token = prefix[i] if prefix is not None else int(rng.choice(allowed))
    assert token in allowed, (out, PIECES[token], [PIECES[a] for a in allowed])
    if token == EOS_ID:
      return out
    out.append(token)
    g = constraint.advance(g, jnp.zeros((1, 1), jnp.int32), jnp.array([[token]]))
  raise AssertionError("no EOS by the length limit")


def test_the_constraint_allows_only_well_formed_trees_with_the_inputs_word_count():
  rng = np.random.default_rng(0)
  c = _constraint()
  words = [11, 12, 13, 14]  # "the cat s sat": three words (pieces starting with '▁')
  for max_len in (5, 8, 20):
    for _ in range(30):
      symbols = [PIECES[t] for t in _walk(c, words, max_len, rng)]
      assert parsing.is_well_formed(symbols, 3), symbols
      assert len(symbols) <= max_len


def test_the_constraint_allows_every_prefix_of_a_real_tree():
  c = _constraint()
  ids = {p: i for i, p in enumerate(PIECES)}
  gold = "(S (NP XX XX )NP (VP XX )VP )S".split()
  walked = _walk(c, [11, 12, 14], len(gold), None, [ids[s] for s in gold] + [EOS_ID])
  assert [PIECES[t] for t in walked] == gold


def test_constrained_beam_search_of_an_untrained_model_gives_trees_over_the_words():
  import jax
  from t2t_jax import decode, model
  from t2t_jax.config import ModelConfig
  cfg = ModelConfig(vocab_size=len(PIECES), num_layers=1, d_model=16, d_ff=32, num_heads=2,
                    d_k=8, d_v=8, dropout=0.0)
  params = model.Transformer(cfg).init(jax.random.PRNGKey(0), np.ones((1, 4), np.int32),
                                        np.ones((1, 4), np.int32))["params"]
  inputs = np.array([[11, 12, 13, 14, EOS_ID, 0], [11, 14, EOS_ID, 0, 0, 0]], np.int32)
  seqs, scores = decode.beam_search(params, inputs, cfg, beam_size=3, alpha=0.3,
                                    max_extra_length=6, constraint=_constraint())
  for row, words in zip(np.asarray(seqs), (3, 2)):
    best = [PIECES[t] for t in decode.strip(row[0])]
    assert parsing.is_well_formed(best, words), best


def test_a_words_target_holds_the_words_and_the_copying_constraint_copies_them_in_order():
  """`data.tree_target=words`: the target has the words where the paper has XX, and under
  `copy` a word slot may only be the input's next piece: random walks give the input's
  pieces in order, brackets never inside a word ('▁cat' 's'), and well-formed trees."""
  t = tree("(S (NP (DT the) (NNS cats)) (VP (VBD sat)))")
  assert parsing.linearize(t, words=True) == "(S (NP the cats )NP (VP sat )VP )S".split()
  rng = np.random.default_rng(0)
  c = parsing.constraint_for(PIECES, EOS_ID, copy=True)
  source = [11, 12, 13, 14]  # ▁the ▁cat s ▁sat: three words, four pieces
  for max_len in (6, 9, 20):
    for _ in range(20):
      walked = _walk(c, source, max_len, rng)
      assert [t for t in walked if not parsing.is_bracket(PIECES[t])] == source
      assert walked[walked.index(13) - 1] == 12  # no bracket between '▁cat' and 's'
      slots = [PIECES[t] if parsing.is_bracket(PIECES[t]) else "XX" for t in walked if t != 13]
      assert parsing.is_well_formed(slots, 3), [PIECES[t] for t in walked]
  ids = {p: i for i, p in enumerate(PIECES)}
  gold = "(S (NP \u2581the \u2581cat s )NP (VP \u2581sat )VP )S".split()
  assert [PIECES[t] for t in _walk(c, source, len(gold), None,
                                   [ids[s] for s in gold] + [EOS_ID])] == gold
  # XX is no word slot under copy.
  g = c.start(np.array([source + [EOS_ID]]), 1)
  g = c.advance(g, np.zeros((1, 1), np.int32), np.array([[ids["(S"]]]))
  banned = np.asarray(c.banned(g, 1, np.array([20])))[0, 0]
  assert banned[ids["XX"]] and not banned[11] and banned[12]


def test_under_copy_the_next_word_scores_what_all_words_together_do():
  """The input decides which word comes next; the model only whether one does: the next
  piece gets P(any word piece), the other word pieces nothing, brackets and EOS keep theirs,
  and the scores still sum to one. Without it, a model unsure which word comes next would
  rather open another bracket (an early recipe checkpoint opened (QP sixty times)."""
  import jax
  c = parsing.constraint_for(PIECES, EOS_ID, copy=True)
  g = c.start(np.array([[11, 12, 13, 14, EOS_ID]]), 1)
  g = c.advance(g, np.zeros((1, 1), np.int32), np.array([[PIECES.index("(S")]]))
  logits = np.random.default_rng(0).normal(size=(1, 1, len(PIECES))).astype(np.float32)
  p = np.asarray(jax.nn.softmax(logits))[0, 0]
  q = np.exp(np.asarray(c.rescore(g, logits)))[0, 0]
  words = [i for i, piece in enumerate(PIECES)  # '<unk>' and the pieces; not XX, no word here
           if not parsing.is_bracket(piece) and i not in (0, 1, 2) and piece != "XX"]
  assert q[11] == pytest.approx(p[words].sum(), rel=1e-5)  # '▁the', the input's first piece
  assert all(q[w] == 0 for w in words if w != 11)
  brackets = [i for i, piece in enumerate(PIECES) if parsing.is_bracket(piece)] + [EOS_ID]
  np.testing.assert_allclose(q[brackets], p[brackets], rtol=1e-5)
  assert q.sum() == pytest.approx(1.0, rel=1e-5)
  # The paper's form: nothing changes.
  xx = parsing.constraint_for(PIECES, EOS_ID)
  assert np.array_equal(np.asarray(xx.rescore(xx.start(np.array([[11, EOS_ID]]), 1), logits)),
                        logits)


def test_under_copy_a_finished_tree_ends_with_the_models_own_eos_probability():
  """Once every word is placed, the input's next "piece" is its EOS: the word slot's
  probability went to EOS instead of EOS's own (and the row no longer summed to one), so a
  finished tree was scored by how much the model wanted another word."""
  import jax
  import jax.numpy as jnp
  c = parsing.constraint_for(PIECES, EOS_ID, copy=True)
  ids = {p: i for i, p in enumerate(PIECES)}
  g = c.start(jnp.array([[11, 14, EOS_ID]]), 1)  # "▁the ▁sat"
  for s in ["(S", "\u2581the", "\u2581sat", ")S"]:
    g = c.advance(g, jnp.zeros((1, 1), jnp.int32), jnp.array([[ids[s]]]))
  logits = jnp.asarray(np.random.default_rng(0).normal(size=(1, 1, len(PIECES))), jnp.float32)
  want = np.asarray(jax.nn.log_softmax(logits))[0, 0, EOS_ID]
  assert np.asarray(c.rescore(g, logits))[0, 0, EOS_ID] == pytest.approx(want, abs=1e-6)
  scores, tokens, allowed = (np.asarray(a)[0, 0] for a in c.candidates(
      logits, g, jnp.int32(4), jnp.array([10]), jnp.array([1])))
  assert [int(t) for t in tokens[allowed]] == [EOS_ID]
  assert scores[allowed][0] == pytest.approx(want, abs=1e-6)


def test_the_searchs_few_columns_score_what_the_whole_vocabulary_does():
  """The search ranks a constraint's few allowed tokens (`candidates`: the brackets, the
  word slot, EOS) instead of banning the rest of the vocabulary (`banned`, `rescore`): at
  every state of random walks, both forms, with and without the length limit and the
  shortest length, the same tokens are allowed with the same log-probabilities."""
  import jax
  import jax.numpy as jnp
  rng = np.random.default_rng(1)
  width = len(PIECES) + 3  # a model output wider than the vocabulary
  source = [11, 12, 13, 14]
  for copy in (False, True):
    c = parsing.constraint_for(PIECES, EOS_ID, copy=copy)
    for max_len in (6, 9, 14):
      inputs = jnp.array([source + [EOS_ID]])
      g = c.start(inputs, 1)
      for i in range(max_len + 2):
        logits = jnp.asarray(rng.normal(size=(1, 1, width)) * 3, jnp.float32)
        for min_len in (1, 5):
          ml, mn = jnp.array([max_len]), jnp.array([min_len])
          full = np.asarray(jax.nn.log_softmax(c.rescore(g, logits)))[0, 0]
          ids = np.arange(width)
          banned = np.asarray(c.banned(g, jnp.int32(i), ml, width))[0, 0] | (
              (ids == 0) | (ids == 2) | (ids >= len(PIECES)) | ((i >= max_len) & (ids != EOS_ID))
              | ((i < min_len) & (ids == EOS_ID)))
          want = {int(t): full[t] for t in np.flatnonzero(~banned)}
          scores, tokens, allowed = (np.asarray(a)[0, 0] for a in c.candidates(
              logits, g, jnp.int32(i), ml, mn))
          got = {int(t): v for t, v, a in zip(tokens, scores, allowed) if a}
          assert got.keys() == want.keys(), (copy, i, got.keys(), want.keys())
          for t in got:
            assert got[t] == pytest.approx(want[t], abs=1e-5), (copy, i, PIECES[t] if t < len(PIECES) else t, got, want)
        allowed = np.flatnonzero(~np.asarray(c.banned(g, jnp.int32(i), jnp.array([max_len])))[0, 0])
        token = int(rng.choice(allowed)) if len(allowed) else EOS_ID
        if token == EOS_ID:
          break
        g = c.advance(g, jnp.zeros((1, 1), jnp.int32), jnp.array([[token]]))


# --- a label per word (Gomez-Rodriguez & Vilares 2018) ------------------------------------

@pytest.mark.parametrize("text, labels", [
    # Worked by hand: word i's label is (ancestors shared with word i+1) - (those word i-1
    # shared with word i), then the lowest shared constituent; the last word's is @end.
    # The/cat share S NP (2), cat/sat S (1), sat/on S VP (2), on/the S VP PP (3),
    # the/mat S VP PP NP (4), mat/. S (1).
    ("(S (NP (DT The) (NN cat)) (VP (VBD sat) (PP (IN on) (NP (DT the) (NN mat)))) (. .))",
     "@+2:NP @-1:S @+1:VP @+1:PP @+1:NP @-3:S @end"),
    # A constituent over one word rides on that word's label.
    ("(S (NP (PRP It)) (VP (VBD rained)) (. .))", "@+1:S/NP @+0:S/VP @end"),
    # A chain of single-child constituents is one node, above a word too.
    ("(S (VP (VB Go) (ADVP (RB away))))", "@+1:S+VP @end/ADVP"),
    ("(NP (NN Hello))", "@end/NP"),
])
def test_a_tree_becomes_a_label_per_word_and_back(text, labels):
  t = tree(text)
  assert " ".join(parsing.to_labels(t)) == labels
  words, tags = zip(*t.leaves())
  assert parsing.labels_well_formed(labels.split(), len(words))
  assert parsing.from_labels(labels.split(), words, tags).to_string() == t.to_string()


@pytest.mark.parametrize("labels, words, ok", [
    ("@+1:S @end", 2, True),
    ("@+1:S @end", 3, False),              # a label too few
    ("@+1:S @+0:S", 2, False),             # no last-word label
    ("@end @+1:S", 2, False),              # the last-word label first
    ("@+1:S @-1:NP @end", 3, False),       # the depth falls above the root
    ("@+1:S the @end", 3, False),          # a word is no label
])
def test_well_formed_labels_are_one_per_word_and_never_rise_above_the_root(labels, words, ok):
  assert parsing.labels_well_formed(labels.split(), words) is ok


@pytest.mark.parametrize("labels, words, repaired, tree_text", [
    ("@+1:S @end", 2, "@+1:S @end", "(S (XX a) (XX b))"),
    # A later label of the same constituent wins.
    ("@+2:NP", 3, "@+2:NP @+0:S @end", "(S (XX a) (XX b) (XX c))"),
    ("@+1:S @+1:NP @+1:VP @end", 3, "@+1:S @+1:NP @end", "(S (XX a) (NP (XX b) (XX c)))"),
    ("foo @end/NP", 1, "@end/NP", "(NP (XX a))"),
    # Below the root is the root: b joins the S.
    ("@+1:S @-2:VP @end", 3, "@+1:S @-2:VP @end", "(VP (XX a) (XX b) (XX c))"),
])
def test_the_label_repair_rule_gives_a_label_per_word(labels, words, repaired, tree_text):
  out = parsing.repair_labels(labels.split(), words)
  assert " ".join(out) == repaired
  assert parsing.from_labels(out, "abc"[:words]).to_string() == tree_text


LABEL_PIECES = ["<pad>", "</s>", "<s>", "<unk>", "@+1:S", "@+2:NP", "@-1:S", "@+0:NP",
                "@-2:VP", "@end", "@end/NP", "\u2581the", "\u2581cat", "s", "\u2581sat"]


def test_the_label_constraint_gives_a_label_per_input_word_and_the_search_ranks_its_columns():
  """Random walks through what the constraint allows are well-formed label sequences, one
  per input word (pieces beginning with '▁': '▁cat' 's' is one word); the gold sequence is
  allowed all the way; the search's few columns (`candidates`) allow and score what banning
  the rest of the vocabulary does."""
  import jax
  import jax.numpy as jnp
  c = parsing.label_constraint_for(LABEL_PIECES, EOS_ID)
  rng = np.random.default_rng(0)
  source = [11, 12, 13, 14]  # three words
  for _ in range(40):
    g = c.start(jnp.array([source + [EOS_ID]]), 1)
    out = []
    for i in range(10):
      logits = jnp.asarray(rng.normal(size=(1, 1, len(LABEL_PIECES) + 2)), jnp.float32)
      banned = np.asarray(c.banned(g, jnp.int32(i), jnp.array([20]), logits.shape[-1]))[0, 0]
      full = np.asarray(jax.nn.log_softmax(logits))[0, 0]
      scores, ids, allowed = (np.asarray(a)[0, 0] for a in c.candidates(
          logits, g, jnp.int32(i), jnp.array([20]), jnp.array([1])))
      assert sorted(ids[allowed]) == sorted(np.flatnonzero(~banned))
      np.testing.assert_allclose(scores[allowed], full[ids[allowed]], atol=1e-5)
      token = int(rng.choice(np.flatnonzero(~banned)))
      if token == EOS_ID:
        break
      out.append(LABEL_PIECES[token])
      g = c.advance(g, jnp.zeros((1, 1), jnp.int32), jnp.array([[token]]))
    assert parsing.labels_well_formed(out, 3), out
  g = c.start(jnp.array([source + [EOS_ID]]), 1)
  for label in ["@+2:NP", "@-1:S", "@end"]:
    token = LABEL_PIECES.index(label)
    assert not np.asarray(c.banned(g, 0, jnp.array([20])))[0, 0, token], label
    g = c.advance(g, jnp.zeros((1, 1), jnp.int32), jnp.array([[token]]))
  assert np.flatnonzero(~np.asarray(c.banned(g, 0, jnp.array([20])))[0, 0]).tolist() == [EOS_ID]
  # A length limit too short for the sequence: EOS may end it there (and only there), so the
  # search returns its best unfinished hypothesis for the repair rule instead of nothing.
  g = c.advance(c.start(jnp.array([source + [EOS_ID]]), 1), jnp.zeros((1, 1), jnp.int32),
                jnp.array([[LABEL_PIECES.index("@+2:NP")]]))
  for i, limit in ((1, 5), (1, 1)):
    logits = jnp.zeros((1, 1, len(LABEL_PIECES)), jnp.float32)
    _, ids, allowed = (np.asarray(a)[0, 0] for a in c.candidates(
        logits, g, jnp.int32(i), jnp.array([limit]), jnp.array([1])))
    eos_allowed = not np.asarray(c.banned(g, jnp.int32(i), jnp.array([limit])))[0, 0, EOS_ID]
    assert (EOS_ID in ids[allowed]) == eos_allowed == (i >= limit)


def test_with_the_words_the_label_constraint_copies_them_and_labels_each_pair_after_it():
  """`data.tree_target=word_labels`: random walks copy the input's pieces in order ('▁cat' 's'
  one word, no label inside it), a pair label right after each word from the second on,
  the last-word label once every word is in, then EOS; a copy step allows one token, which
  both the search's columns and the rescored whole vocabulary score 0."""
  import jax
  import jax.numpy as jnp
  t = tree("(S (NP (DT the) (NNS cats)) (VP (VBD sat)))")
  assert " ".join(parsing.to_labels(t, words=True)) == "the cats @+2:NP sat @-1:S @end/VP"
  c = parsing.label_constraint_for(LABEL_PIECES, EOS_ID, copy=True)
  rng = np.random.default_rng(0)
  source = [11, 12, 13, 14]  # ▁the ▁cat s ▁sat: three words, four pieces
  for _ in range(30):
    g = c.start(jnp.array([source + [EOS_ID]]), 1)
    out = []
    for i in range(12):
      logits = jnp.asarray(rng.normal(size=(1, 1, len(LABEL_PIECES))), jnp.float32)
      banned = np.asarray(c.banned(g, jnp.int32(i), jnp.array([20])))[0, 0]
      full = np.asarray(jax.nn.log_softmax(c.rescore(g, logits)))[0, 0]
      scores, ids, allowed = (np.asarray(a)[0, 0] for a in c.candidates(
          logits, g, jnp.int32(i), jnp.array([20]), jnp.array([1])))
      assert sorted(ids[allowed]) == sorted(np.flatnonzero(~banned))
      np.testing.assert_allclose(scores[allowed], full[ids[allowed]], atol=1e-5)
      token = int(rng.choice(np.flatnonzero(~banned)))
      if not parsing.is_label(LABEL_PIECES[token]) and token != EOS_ID:
        assert (~banned).sum() == 1 and scores[allowed][0] == 0
      if token == EOS_ID:
        break
      out.append(LABEL_PIECES[token])
      g = c.advance(g, jnp.zeros((1, 1), jnp.int32), jnp.array([[token]]))
    assert [p for p in out if not parsing.is_label(p)] == [LABEL_PIECES[i] for i in source]
    assert out[2] == "s" and parsing.is_label(out[3])  # the label after '▁cat s', not inside
    words = [p if parsing.is_label(p) else "XX" for p in out if p != "s"]
    assert parsing.labels_well_formed(words, 3, words=True), out


def test_constrained_beam_search_of_an_untrained_model_gives_a_label_per_word():
  import jax
  from t2t_jax import decode, model
  from t2t_jax.config import ModelConfig
  cfg = ModelConfig(vocab_size=len(LABEL_PIECES), num_layers=1, d_model=16, d_ff=32,
                    num_heads=2, d_k=8, d_v=8, dropout=0.0)
  params = model.Transformer(cfg).init(jax.random.PRNGKey(0), np.ones((1, 4), np.int32),
                                        np.ones((1, 4), np.int32))["params"]
  inputs = np.array([[11, 12, 13, 14, EOS_ID, 0], [11, 14, EOS_ID, 0, 0, 0],
                     [12, EOS_ID, 0, 0, 0, 0]], np.int32)
  seqs, _ = decode.beam_search(params, inputs, cfg, beam_size=3, alpha=0.3,
                               max_extra_length=300,
                               constraint=parsing.label_constraint_for(LABEL_PIECES, EOS_ID))
  for row, words in zip(np.asarray(seqs), (3, 2, 1)):
    best = [LABEL_PIECES[t] for t in decode.strip(row[0])]
    assert parsing.labels_well_formed(best, words), best


def test_the_parsing_task_scores_labels_with_gold_tags_and_counts_the_repaired_outputs():
  task = dataclasses.replace(tasks.PARSING, labels=True)
  source = "The cat sat on the mat ."
  gold = GOLD[5:-1]
  good = "@+2:NP @-1:S @+1:VP @+1:PP @+1:NP @-3:S @end"
  result = task.score([source, source], [good, "@+1:S @end"], [gold, gold], "")
  assert result["repaired"] == 1 and result["well_formed"] == 1
  assert result["_trees"][0] == parsing.with_top(tree(gold))
  assert result["f1"] < 100


def test_every_tree_of_the_sample_comes_back_from_its_labels():
  path = shared_data("ptb_wsj_sample")
  count = 0
  for split in ("train", "dev", "test"):
    for sentence, target, gold in parsing.iter_examples(parsing.split_files(path, split),
                                                        "labels"):
      t = tree(gold)
      assert parsing.labels_well_formed(target.split(), len(sentence.split()))
      assert parsing.from_labels(target.split(), *zip(*t.leaves())).to_string() == gold
      count += 1
  assert count == 3396 + 273 + 245  # the sample's README


# --- scoring as EVALB (COLLINS.prm) -------------------------------------------------------

GOLD = "(TOP (S (NP (DT The) (NN cat)) (VP (VBD sat) (PP (IN on) (NP (DT the) (NN mat)))) (. .)))"


def test_a_perfect_parse_scores_100_and_is_a_complete_match():
  r = parsing.evalb([GOLD], [GOLD])
  assert (r["recall"], r["precision"], r["f1"], r["complete_match"]) == (100, 100, 100, 100)


def test_figures_worked_out_by_hand():
  # Gold brackets (TOP ignored, '.' deleted): S[0,6] NP[0,2] VP[2,6] PP[3,6] NP[4,6] = 5.
  # Test: S[0,6] NP[0,2] VP[2,6] NP[3,6]-as-wrong-label... : S, NP[0,2], VP[2,6] match;
  # (NP (IN on) ...) [3,6] has the wrong label, and the inner NP[4,6] is missing: 3 of 4.
  test = "(TOP (S (NP (DT The) (NN cat)) (VP (VBD sat) (NP (IN on) (DT the) (NN mat))) (. .)))"
  r = parsing.evalb([GOLD], [test])
  assert r["recall"] == round(100 * 3 / 5, 2) and r["precision"] == round(100 * 3 / 4, 2)
  p, rec = 3 / 4, 3 / 5
  assert r["f1"] == round(100 * 2 * p * rec / (p + rec), 2)
  assert r["complete_match"] == 0


def test_punctuation_is_deleted_by_its_tag_so_where_it_attaches_does_not_count():
  # The '.' inside the VP instead of under S: the same brackets once it is deleted.
  moved = "(TOP (S (NP (DT The) (NN cat)) (VP (VBD sat) (PP (IN on) (NP (DT the) (NN mat))) (. .))))"
  assert parsing.evalb([GOLD], [moved])["f1"] == 100
  # A constituent holding only punctuation has no width left and is not counted.
  extra = GOLD.replace("(. .)", "(X (. .))")
  assert parsing.evalb([GOLD], [extra])["precision"] == 100


def test_top_is_ignored_and_advp_equals_prt_and_function_tags_are_cut():
  gold = "(TOP (S (NP (PRP He)) (VP (VBD gave) (PRT (RP up)))))"
  assert parsing.evalb([gold], [gold.replace("PRT", "ADVP")])["f1"] == 100
  assert parsing.evalb([gold], [gold.replace("(NP (PRP", "(NP-SBJ (PRP")])["f1"] == 100
  # Without the TOP bracket the test tree has the same counted brackets.
  assert parsing.evalb([gold], [gold[5:-1]])["f1"] == 100


def test_crossing_brackets_are_counted_on_the_test_side():
  gold = "(TOP (S (NP (DT a) (NN b)) (VP (VB c) (NN d))))"
  test = "(TOP (S (DT a) (X (NN b) (VB c)) (NN d)))"  # X[1,3] crosses NP[0,2] and VP[2,4]
  r = parsing.evalb([gold], [test])
  assert r["average_crossing"] == 1.0  # one test bracket crosses (counted once)


def test_length_or_word_mismatches_are_error_sentences_and_an_empty_one_is_skipped():
  short = "(TOP (S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .)))"
  other_word = GOLD.replace("(NN mat)", "(NN hat)")
  r = parsing.evalb([GOLD, GOLD, GOLD, GOLD], [GOLD, short, other_word, ""])
  assert (r["error_sentences"], r["skipped_sentences"], r["valid_sentences"]) == (2, 1, 1)
  assert r["f1"] == 100  # only the valid sentence counts


def test_sentences_longer_than_40_words_are_left_out_of_the_len40_figures():
  long = "(TOP (S " + " ".join(f"(NN w{i})" for i in range(41)) + "))"
  bad = "(TOP (S (X " + " ".join(f"(NN w{i})" for i in range(41)) + ")))"
  r = parsing.evalb([GOLD, long], [GOLD, bad])
  assert r["precision"] < 100 and r["len<=40"]["precision"] == 100
  assert r["len<=40"]["sentences"] == 1


def test_the_parsing_task_scores_with_gold_tags_and_counts_the_repaired_outputs():
  task = tasks.PARSING
  source = "The cat sat on the mat ."
  gold = GOLD[5:-1]
  good = "(S (NP XX XX )NP (VP XX (PP XX (NP XX XX )NP )PP )VP XX )S"
  result = task.score([source, source], [good, "(S XX XX"], [gold, gold], "")
  assert result["repaired"] == 1 and result["well_formed"] == 1
  assert result["evalb"]["tagging_accuracy"] == 100
  assert result["_trees"][0] == parsing.with_top(tree(gold))


# --- treebank folders ---------------------------------------------------------------------

def _write_ldc(root, files):
  for number, text in files.items():
    folder = root / f"{number // 100:02d}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"wsj_{number:04d}.mrg").write_text(text)


def test_ldcs_layout_is_split_by_section_as_the_paper(tmp_path):
  one = "( (S (NP (NN a)) (VP (VB b))) )\n"
  _write_ldc(tmp_path, {201: one, 2199: one * 2, 2201: one * 3, 2301: one * 4, 2401: one})
  counts = {s: len(list(parsing.iter_examples(parsing.split_files(str(tmp_path), s))))
            for s in ("train", "dev", "test")}
  assert counts == {"train": 3, "dev": 3, "test": 4}  # section 24 is in no split


def test_the_shared_sample_splits_by_file_as_its_readme_says():
  path = shared_data("ptb_wsj_sample")
  counts = {s: len(list(parsing.iter_examples(parsing.split_files(str(path), s))))
            for s in ("train", "dev", "test")}
  assert counts == {"train": 3396, "dev": 273, "test": 245}


def test_a_bad_treebank_file_is_one_line_naming_it(tmp_path):
  _write_ldc(tmp_path, {1: "( (S (NN a)) )\n", 170: "( (S (NN a) )\n", 185: "( (S (NN b)) )"})
  run = subprocess.run(main_command(tmp_path / "w", mode="prepare", experiment="parse_wsj_sample",
                                    sets={"data.dataset": f"ptb:{tmp_path}"}),
                       capture_output=True, text=True)
  assert run.returncode == 2, run.stderr
  last = run.stderr.strip().splitlines()[-1]
  assert last.startswith("error: ") and "wsj_0170.mrg: tree 1: unbalanced" in last


def test_parse_wsj_has_the_parameters_the_papers_settings_imply():
  # 16,384 x 1,024 shared embeddings; an encoder layer: 4 x 1,024^2 attention + 2 x 1,024 x
  # 2,048 feed-forward; a decoder layer one attention more; biases and LayerNorms beside.
  from t2t_jax import model, registry
  d, ff = 1024, 2048
  by_hand = 16384 * d + 4 * (4 * d * d + 2 * d * ff) + 4 * (8 * d * d + 2 * d * ff)
  count = model.count_params(model.abstract_params(registry.get("parse_wsj").model))
  assert by_hand == 100_663_296 and 0 < count - by_hand < 0.001 * by_hand
  run = subprocess.run([sys.executable, "-m", "t2t_jax.main", "--experiment=parse_wsj",
                        "--mode=params"], capture_output=True, text=True)
  assert "100.7M parameters" in run.stdout and f"params: {count}" in run.stdout


def test_a_missing_treebank_is_one_line(tmp_path):
  run = subprocess.run(main_command(tmp_path / "w", experiment="parse_wsj",
                                    sets={"data.dataset": f"ptb:{tmp_path}/nothing"}),
                       capture_output=True, text=True)
  assert run.returncode == 2
  assert run.stderr.strip().splitlines()[-1].startswith("error: ptb:")


@pytest.mark.long
def test_a_parser_trains_evaluates_with_evalb_and_translates_to_trees(tmp_path):
  """The whole path on a hand-made treebank: training, eval's EVALB figures and tree files,
  and --mode=translate printing one tree per line."""
  rng = random.Random(0)
  nouns, verbs = ["cat", "dog", "man", "bird"], ["sees", "likes", "has"]

  def sentence():
    return (f"(S (NP (DT the) (NN {rng.choice(nouns)})) (VP (VBZ {rng.choice(verbs)}) "
            f"(NP (DT a) (NN {rng.choice(nouns)}))) (. .))")
  files = {n: "".join(f"( {sentence()} )\n" for _ in range(30)) for n in range(1, 200, 6)}
  _write_ldc(tmp_path / "tb", files)
  sets = {"data.dataset": f"ptb:{tmp_path / 'tb'}", "train.steps": 40,
          "train.max_train_minutes": 0, "train.cooldown_minutes": 0,
          "model.num_layers": 1, "model.d_model": 32, "model.d_ff": 64, "model.num_heads": 2,
          "model.d_k": 16, "model.d_v": 16, "model.vocab_size": 64, "data.max_length": 32,
          "train.tokens_per_step": 512, "train.max_tokens_per_batch": 512,
          "train.checkpoint_every_steps": 20, "train.eval_every_steps": 40,
          "decode.beam_size": 3, "data.vocab_type": "word", "train.bleu_every_steps": 20,
          "train.bleu_sentences": 20}
  work = tmp_path / "w"
  run = subprocess.run(main_command(work, experiment="parse_wsj_sample", sets=sets),
                       capture_output=True, text=True)
  assert run.returncode == 0, run.stderr[-3000:]
  result = json.loads((work / "eval" / "test.json").read_text())
  assert result["task"] == "parsing" and 0 <= result["f1"] <= 100
  assert result["well_formed"] == result["num_sentences"] and result["repaired"] == 0
  trees = (work / "eval" / "test.trees").read_text().splitlines()
  gold = (work / "eval" / "test.gold").read_text().splitlines()
  assert len(trees) == len(gold) == result["num_sentences"]
  assert parsing.evalb(gold, trees)["f1"] == result["f1"]
  # The dev score during training is EVALB's F1, and the sweep's report reads F1 and the
  # run's Table 2 cost for a parser's row.
  logged = [json.loads(l) for l in (work / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in logged if "dev_f1" in r] == [20, 40]
  # In a process of its own: the sweep tool defines absl flags that another test's import of
  # t2t_jax.main may have defined in this one.
  code = ("import json, sys; from t2t_jax.tools import sweep; "
          "print(json.dumps(sweep.row_result(sys.argv[1])))")
  row = json.loads(subprocess.run([sys.executable, "-c", code, str(work)], capture_output=True,
                                  text=True, check=True).stdout.strip().splitlines()[-1])
  dev = json.loads((work / "eval" / "dev.json").read_text())
  assert row["metric"] == "f1" and row["dev_bleu"] == dev["f1"]
  assert row["train_flops_analytic"] > 0 and "table2_flops" in json.loads(
      (work / "cost.json").read_text())
  # Table 4's decodes average the window they are given (chosen on dev after training), not
  # only the one the run recorded: the last of the two checkpoints alone here.
  code = ("import json, sys; from t2t_jax.tools import parse_table4; print(json.dumps("
          "parse_table4.decode_split(sys.argv[1], 'dev', 3, 0.3, 300, True, {})[0]))")
  for last, says in ((0, "20..40 (2)"), (1, "40..40 (1)")):
    found = json.loads(subprocess.run([sys.executable, "-c", code.format(last), str(work)],
                                      capture_output=True, text=True, check=True
                                      ).stdout.strip().splitlines()[-1])
    assert found["checkpoint"] == f"average of checkpoints {says}", found["checkpoint"]
  # Raw text in, one tree per line out, over the sentence's treebank tokens, which NLTK's
  # reader and ours read; an empty line stays empty; a line longer than the model reads (32
  # tokens here) is refused on its line, not cut and completed by the repair rule.
  import nltk
  lines = ["the dog likes a bird .", "I can't believe it's not butter.",
           'She said "hi" (twice) -- [sic].', "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u2014 \u00fcber.",
           "", " ".join(["word"] * 300), "f(x) = (a+b)"]
  out = subprocess.run(main_command(work, mode="translate", experiment="parse_wsj_sample",
                                    sets=sets), input="".join(l + "\n" for l in lines),
                       capture_output=True, text=True)
  assert out.returncode == 0, out.stderr[-2000:]
  written = out.stdout.split("\n")[:-1]
  assert len(written) == len(lines), out.stdout
  for text, line in zip(lines, written):
    words = parsing.ptb_tokens(text)
    if not words or len(words) >= 32:
      assert line == "", (text, line)
      continue
    assert line.startswith("(TOP ") and tree(line).words() == words, (text, line)
    assert nltk.Tree.fromstring(line).leaves() == words
  assert "line 6: not parsed (an empty line): its 300 words" in out.stderr
  assert written[0] and tree(written[0]).words() == "the dog likes a bird .".split()
  # USAGE's Python example, on this run: a tree, its words, tags and spans, batched.
  from helpers import REPO
  example = (REPO / "USAGE.md").read_text().split("## Parsing")[1].split("```python\n")[1]
  example = example.split("```")[0].replace("runs/parse_wsj", str(work))
  run = subprocess.run([sys.executable, "-c", example], capture_output=True, text=True)
  assert run.returncode == 0, run.stderr[-2000:]
  line, words, tags, spans, count = run.stdout.strip().splitlines()[-5:]
  words = eval(words)
  assert words == parsing.ptb_tokens("I can't believe it's not butter.")
  assert nltk.Tree.fromstring(line).leaves() == words and len(eval(tags)) == len(words)
  assert eval(spans)[0][1:] == (0, len(words)) and count == "2"
  refused = subprocess.run(main_command(work, mode="export", experiment="parse_wsj_sample",
                                        sets=sets) + [f"--output={tmp_path / 'hf'}"],
                           capture_output=True, text=True)
  assert refused.returncode == 2 and "only translation models are exported" in refused.stderr


def test_a_runs_own_evaluation_joins_table4_as_it_was_decoded(tmp_path):
  """`parse_table4 --other_eval`: a run's final evaluation of dev, not decoded again, keeps
  who decoded it (the training run's code) beside its figures, and its trees for EVALB. (In
  a process of its own: the tool defines command-line flags that main's share names with.)"""
  import json
  import subprocess
  import sys
  folder = tmp_path / "eval"
  folder.mkdir()
  (folder / "dev.json").write_text(json.dumps({
      "split": "dev", "f1": 41.5, "checkpoint": f"average of checkpoints 6..8 in {tmp_path}",
      "commit": "abc", "date": "2026-12-03", "machine": "m", "command": "train",
      "beam_size": 21, "constrained": True, "data": "ptb:...", "dtype": "float32"}))
  (folder / "dev.trees").write_text(GOLD + "\n")
  (folder / "dev.gold").write_text(GOLD + "\n")
  code = ("import json, sys; from t2t_jax.tools import parse_table4; "
          "print(json.dumps(parse_table4.stored_eval(sys.argv[1], 'dev')))")
  r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                     text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  found, trees, gold = json.loads(r.stdout)
  assert found["f1"] == 41.5 and found["beam_size"] == 21 and found["constrained"]
  assert found["decoded_by"]["commit"] == "abc" and "commit" not in found
  assert "WORKDIR" in found["checkpoint"] and str(tmp_path) not in found["checkpoint"]
  assert trees == gold == [GOLD]


def test_a_tags_target_parses_the_gold_tags_and_scores_over_the_sentences_words(tmp_path):
  """`data.tree_target=tags`: the sentence is the gold POS tags, the target carries them in
  the words' places (copied by the constrained search), and the scored tree has the gold
  tree's own words and tags, so EVALB finds no word mismatch."""
  from t2t_jax import tasks
  text = "( (S (NP-SBJ (DT The) (NN cat)) (VP (VBD sat)) (. .)) )\n"
  (tmp_path / "wsj_0001.mrg").write_text(text)
  [(sentence, target, gold)] = parsing.iter_examples([str(tmp_path / "wsj_0001.mrg")], "tags")
  assert sentence == "DT NN VBD ."
  assert target == "(S (NP DT NN )NP (VP VBD )VP . )S"
  assert gold == "(S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .))"
  # The model's output over the tags, as the vocabulary decodes it (each copied tag one XX).
  output = "(S (NP XX XX )NP (VP XX )VP XX )S"
  task = dataclasses.replace(tasks.PARSING, words=True)
  result = task.score([sentence], [output], [gold], "")
  assert result["f1"] == 100.0 and result["evalb"]["errors"] == []
  assert result["_trees"] == ["(TOP (S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .)))"]


class _Pieces:
  """A SentencePiece-like base vocabulary over LABEL_PIECES (unigram: words begin with '▁')."""
  path, model_type, size = "pieces", "unigram", len(LABEL_PIECES)
  content_ids = staticmethod(lambda ids: [int(i) for i in ids])
  id_to_piece = staticmethod(lambda i: LABEL_PIECES[int(i)])


def test_a_decoded_word_is_the_word_its_pieces_spell_and_an_unknown_piece_is_xx():
  vocab = parsing.TreeVocabulary(_Pieces(), words=True)
  the, cat, s, sat, unk = 11, 12, 13, 14, 3
  assert vocab.decode([the, cat, s, LABEL_PIECES.index("@+2:NP"), sat, 9]) == \
      "the cats @+2:NP sat @end"
  assert vocab.decode([the, cat, unk, sat]) == "the XX sat"  # '▁cat' '<unk>': not to check
  assert parsing.TreeVocabulary(_Pieces()).decode([4, 9]) == "@+1:S @end"


@pytest.mark.parametrize("target, output, well_formed", [
    ("word_labels", "the cats @+2:NP sat @-1:S @end/VP", True),
    ("word_labels", "the the @+2:NP the @-1:S @end/VP", False),  # labels right, words not
    ("word_labels", "the XX @+2:NP sat @-1:S @end/VP", True),     # a word it cannot spell
    ("words", "(S (NP the cats )NP (VP sat )VP )S", True),
    ("words", "(S (NP the the )NP (VP the )VP )S", False),
])
def test_an_output_that_writes_other_words_is_no_parse_of_the_sentence(target, output,
                                                                       well_formed):
  """Targets that hold the words are scored over the sentence's words: an unconstrained
  search that wrote `the` for every word was counted well-formed (words were XX before any
  check) and its labels scored over the gold words, up to 100."""
  task = tasks.for_config(dataclasses.replace(
      _parser_cfg(), data=dataclasses.replace(_parser_cfg().data, tree_target=target)))
  gold = "(TOP (S (NP (DT the) (NNS cats)) (VP (VBD sat))))"
  found = task.score(["the cats sat"], [output], [gold], "")
  assert found["well_formed"] == int(well_formed) and found["repaired"] == int(not well_formed)
  if well_formed:
    assert found["f1"] == 100.0


def _parser_cfg():
  from t2t_jax import registry
  return registry.get("parse_wsj_sample")


# --- raw text in: Penn Treebank tokens ------------------------------------------------------

TOKENIZED = [  # NLTK's Treebank tokenizer gives the same tokens (below)
    ("I can't believe it's not butter.", "I ca n't believe it 's not butter ."),
    ('He said, "hello (world)" -- ok?', "He said , `` hello -LRB- world -RRB- '' -- ok ?"),
    ("Caf\u00e9 costs $3,000.50 [approx].", "Caf\u00e9 costs $ 3,000.50 -LSB- approx -RSB- ."),
    ("They're gonna win; we'll see...", "They 're gon na win ; we 'll see ..."),
    ("Cannot stop at 10:30, right?", "Can not stop at 10:30 , right ?"),
    ("Mr. Smith's car isn't red", "Mr. Smith 's car is n't red"),
    ("(which) is {it}", "-LRB- which -RRB- is -LCB- it -RCB-"),
]


@pytest.mark.parametrize("text, tokens", TOKENIZED)
def test_raw_text_is_tokenised_as_the_treebank_is(text, tokens):
  from nltk.tokenize import TreebankWordTokenizer
  assert " ".join(parsing.ptb_tokens(text)) == tokens
  assert " ".join(TreebankWordTokenizer().tokenize(text, convert_parentheses=True)) == tokens


def test_a_sentence_ending_in_an_abbreviation_keeps_its_point_as_the_wsj_trees_do():
  # wsj_0001-0199 end sentences with `(NNP U.S.) (. .)`; NLTK's tokenizer writes `U.S .`.
  assert parsing.ptb_tokens("It sells in the U.S.") == ["It", "sells", "in", "the", "U.S.", "."]
  assert parsing.ptb_tokens("\u201cCurly,\u201d she said.") == \
      ["``", "Curly", ",", "''", "she", "said", "."]


def test_pretokenized_input_keeps_its_tokens_with_brackets_escaped():
  assert parsing.prepare_sentence("f(x) ( can't", pretokenized=True) == "f-LRB-x-RRB- -LRB- can't"
  assert parsing.prepare_sentence("f(x) ( can't") == "f -LRB- x -RRB- -LRB- ca n't"


def test_preparation_says_what_each_split_and_extra_corpus_gave_and_refuses_an_empty_one(
    tmp_path, capsys):
  """An empty extra corpus made `ptb:WSJ+EXTRA` a WSJ-only run under its own name; files
  without a tree vanished without a word."""
  from t2t_jax import data_sources
  from t2t_jax.data_sources import DataError
  one = "( (S (NP (NN a)) (VP (VB b))) )\n"
  _write_ldc(tmp_path / "wsj", {201: one * 2, 202: "", 203: "( (-NONE- *T*) )\n",
                                2201: one})
  (tmp_path / "silver").mkdir()
  (tmp_path / "silver" / "a.trees").write_text(one * 3)
  (tmp_path / "nothing").mkdir()
  spec = f"ptb:{tmp_path / 'wsj'}+{tmp_path / 'silver'}"
  source = data_sources.parse_spec(spec)
  assert len(list(data_sources.treebank_pairs(source, "train"))) == 2 + 3
  err = capsys.readouterr().err
  assert f"split train of {tmp_path / 'wsj'}: 3 file(s), 2 trees" in err
  assert f"extra trees {tmp_path / 'silver'}: 1 file(s), 3 trees" in err
  assert err.count("no tree (an empty file") == 2 and "wsj_0202.mrg" in err
  empty = data_sources.parse_spec(f"ptb:{tmp_path / 'wsj'}+{tmp_path / 'nothing'}")
  with pytest.raises(DataError, match=r"extra trees .*nothing: no tree in 0 file\(s\)"):
    list(data_sources.treebank_pairs(empty, "train"))


def test_every_parser_logs_its_dev_f1_while_training():
  """The paper chose its settings on section 22: each parsing experiment scores a greedy dev
  subset as it trains (parse_wsj had none)."""
  from t2t_jax import registry
  for name in ("parse_wsj", "parse_wsj_semisup", "parse_wsj_sample"):
    t = registry.get(name).train
    assert 0 < t.bleu_every_steps <= t.eval_every_steps and t.bleu_beam_size == 1, name
    assert t.bleu_sentences >= 100, name


# --- predicted POS tags: a tag after each word ---------------------------------------------

TAGGED_PIECES = LABEL_PIECES + ["^DT", "^NN", "^NNS", "^VBD"]


def test_a_tagged_target_puts_each_words_tag_after_it_and_comes_back_to_the_tree():
  t = tree("(S (NP (DT the) (NNS cats)) (VP (VBD sat)))")
  labels = parsing.to_labels(t, words=True, tags=True)
  assert " ".join(labels) == "the ^DT cats ^NNS @+2:NP sat ^VBD @-1:S @end/VP"
  assert parsing.labels_well_formed(labels, 3, words=True, tags=True)
  assert not parsing.labels_well_formed(labels, 3, words=True)  # tags are no words
  task = dataclasses.replace(tasks.PARSING, labels=True, words=True, tags=True)
  gold = parsing.with_top(t)
  # The model's tags, not the gold ones: NN for `cats` costs one tag, no bracket.
  out = "the ^DT cats ^NN @+2:NP sat ^VBD @-1:S @end/VP"
  found = task.score(["the cats sat"], [out], [gold], "")
  assert found["f1"] == 100.0 and found["well_formed"] == 1
  assert found["_trees"][0] == "(TOP (S (NP (DT the) (NN cats)) (VP (VBD sat))))"
  assert found["tagging_accuracy"] == pytest.approx(200 / 3, abs=0.01)
  assert found["pos_tags"] == "predicted" and "tagging accuracy 66.67" in task.summary(found)


def test_the_tagged_constraint_copies_each_word_then_takes_one_tag_then_its_label():
  """Random walks through what the tagged constraint allows are well-formed tagged label
  sequences over the input's words ('▁cat' 's' one word: its tag after 's')."""
  import jax.numpy as jnp
  c = parsing.label_constraint_for(TAGGED_PIECES, EOS_ID, copy=True, tags=True)
  rng = np.random.default_rng(0)
  source = [11, 12, 13, 14]  # ▁the ▁cat s ▁sat: three words
  tag_ids = {TAGGED_PIECES.index(t) for t in ("^DT", "^NN", "^NNS", "^VBD")}
  for _ in range(30):
    g = c.start(jnp.array([source + [EOS_ID]]), 1)
    out = []
    for i in range(14):
      banned = np.asarray(c.banned(g, jnp.int32(i), jnp.array([30])))[0, 0]
      token = int(rng.choice(np.flatnonzero(~banned)))
      if token == EOS_ID:
        break
      out.append(TAGGED_PIECES[token])
      g = c.advance(g, jnp.zeros((1, 1), jnp.int32), jnp.array([[token]]))
    assert [p for p in out if not parsing.is_label(p)] == [TAGGED_PIECES[i] for i in source]
    assert out[1] in {TAGGED_PIECES[t] for t in tag_ids} and out[4][0] == "^", out
    words = [p if parsing.is_label(p) else "XX" for p in out if p != "s"]
    assert parsing.labels_well_formed(words, 3, words=True, tags=True), out
