"""BLEU through our code path against sacreBLEU's documented example and hand-made cases."""

import pytest

from t2t_jax import bleu


def test_sacrebleu_documented_example():
  # The example from sacreBLEU's README: BLEU = 48.53 with two reference streams.
  refs = [["The dog bit the man.", "It was not unexpected.", "The man bit him first."],
          ["The dog had bit the man.", "No one was surprised.", "The man had bitten the dog."]]
  hyps = ["The dog bit the man.", "It wasn't surprising.", "The man had just bitten him."]
  score, signature = bleu.sacrebleu_score(hyps, refs)
  assert score == pytest.approx(48.53, abs=0.005)
  assert "tok:13a" in signature and "case:mixed" in signature


def test_reference_against_itself_is_100_on_both_figures():
  refs = ["Ein Mann lächelt einen ausgestopften Löwen an.",
          "Die Schritt-für-Schritt-Anleitung ist gut, sagte er."]
  assert bleu.sacrebleu_score(refs, refs)[0] == pytest.approx(100.0)
  assert bleu.tokenized_bleu(refs, refs, "de") == pytest.approx(100.0)


def test_compound_splitting_as_in_the_paper():
  assert bleu.split_compounds("Schritt-für-Schritt gut - ja") == \
      "Schritt ##AT##-##AT## für ##AT##-##AT## Schritt gut - ja"


def test_tokenized_bleu_rewards_compound_parts():
  # Getting one part of a hyphenated compound right earns n-gram credit only
  # once the compound is split, which is why the paper's figure is higher.
  refs = ["Das ist eine Schritt-für-Schritt-Anleitung ."]
  hyps = ["Das ist eine Schritt-für-Schritt-Hilfe ."]
  assert bleu.tokenized_bleu(hyps, refs, "de") > bleu.sacrebleu_score(hyps, refs)[0]


def test_french_hyphens_are_not_split_as_german_compounds():
  """Only German's compounds are split (the paper's English->German recipe): a French
  hypothesis scores as BLEU on its Moses tokens alone ('peut-être' one token; split, its
  halves and the ##AT## marker would earn n-gram credit of their own)."""
  import sacrebleu
  refs, hyps = ["C'est peut-être vrai."], ["C'est peut-être faux."]
  tokens = lambda lines: bleu.moses_tokenize(lines, "fr")
  assert tokens(hyps) == ["C' est peut-être faux ."]
  plain = sacrebleu.metrics.BLEU(tokenize="none", force=True).corpus_score(
      tokens(hyps), [tokens(refs)]).score
  assert bleu.tokenized_bleu(hyps, refs, "fr") == pytest.approx(plain)
  assert bleu.tokenized_bleu(hyps, refs, "fr") != pytest.approx(
      bleu.tokenized_bleu(hyps, refs, "de"))


def test_an_english_german_eval_says_which_newstest2014_it_decoded():
  """WMT's newstest2014 for en-de comes full (3,003 lines: tfds, the Hugging Face hub) and
  filtered (2,737: sacreBLEU's -t wmt14): the record says which, whatever the source."""
  from t2t_jax.data_sources import test_set_note
  full = test_set_note("tfds:wmt14_translate/de-en:en-de", "test", 3003)
  assert "full set" in full and "3,003 lines" in full and "2,737" in full
  assert "filtered set" in test_set_note("folder:/data/wmt:en-de", "newstest2014", 2737)
  assert "full set" in test_set_note("hf:wmt/wmt14/de-en:en-de", "test", 3003)
  # Other directions, pairs, splits and sizes: nothing to say.
  for spec, split, n in [("tfds:wmt14_translate/de-en:de-en", "test", 3003),
                         ("tfds:wmt14_translate/fr-en:en-fr", "test", 3003),
                         ("tfds:wmt14_translate/de-en:en-de", "validation", 3000),
                         ("folder:/data/wmt:en-de", "newstest2014", 100), ("demo", "test", 3003)]:
    assert test_set_note(spec, split, n) is None


def test_t2ts_reference_tweak_writes_the_references_german_quotes_as_ascii():
  """T2T scored against a newstest2014.de whose „ “ were `"` (tensor2tensor#317): a
  hypothesis with ASCII quotes matches that reference exactly, and only that figure says so;
  the comma stays after the closing quote (Moses' normalize-punctuation would move it)."""
  assert bleu.t2t_quotes("„Ja“, sagte er. “Nein”") == '"Ja", sagte er. "Nein"'
  assert bleu.t2t_quotes("«Oui», dit-il.") == "«Oui», dit-il."   # guillemets are kept
  refs = ["Er sagte: „Das Haus ist sehr groß und alt“, und ging nach Hause."]
  hyps = ['Er sagte: "Das Haus ist sehr groß und alt", und ging nach Hause.']
  assert bleu.tokenized_bleu(hyps, refs, "de", t2t_reference=True) == pytest.approx(100.0)
  assert bleu.tokenized_bleu(hyps, refs, "de") < 90.0


def test_an_eval_gives_the_t2t_reference_figure_for_german_only():
  from t2t_jax import tasks
  refs = ["„Ja“, sagte er."]
  de = tasks.TRANSLATION.score(["x"], ['"Ja", sagte er.'], refs, "de")
  assert de["t2t_reference_bleu"] == pytest.approx(100.0)
  assert de["t2t_reference_bleu"] > de["tokenized_bleu"]
  assert "T2T's reference quotes: 100.00" in tasks.TRANSLATION.summary(de)
  assert "t2t_reference_bleu" not in tasks.TRANSLATION.score(["x"], ["Oui."], ["Oui."], "fr")
