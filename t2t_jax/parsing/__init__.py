"""English constituency parsing as translation (paper section 6.3, Table 4), one concern a
module, in the order a tree travels:

- `trees`: `.mrg` text read into trees, and the literature's preprocessing;
- `treebank`: treebank folders and their splits, read as (sentence, target, gold tree);
- `brackets`: a tree as labelled brackets, the paper's form (POS tags as `XX`), and back;
- `labels`: a tree as one label per word (Gómez-Rodríguez & Vilares 2018), and back;
- `constraints`: the decoder's grammar, only prefixes of trees over the input's words;
- `vocabulary`: words through SentencePiece, tree symbols whole;
- `scoring`: bracket scoring as EVALB computes it with COLLINS.prm;
- `tokenize`: raw text into Penn Treebank tokens, as a parser reads a user's sentence.

The rest of the code knows parsing only as a `tasks.Task` and by the names below; the package
imports nothing from t2t_jax but `errors` and `special_tokens`.
"""

from t2t_jax.parsing.trees import (  # noqa: F401
    Tree, TreeError, TREE_TOKEN, read_trees, EMPTY_TAG, strip_label, preprocess)
from t2t_jax.parsing.brackets import (  # noqa: F401
    WORD, linearize, is_bracket, symbol_kind, is_well_formed, repair, to_tree, with_top)
from t2t_jax.parsing.labels import (  # noqa: F401
    LAST_LABEL, to_labels, label_kind, labels_well_formed, repair_labels, from_labels, is_label,
    label_symbols, copies_words, as_word_slots)
from t2t_jax.parsing.treebank import (  # noqa: F401
    SECTION_SPLITS, SAMPLE_SPLITS, treebank_files, split_ranges, split_files, extra_tree_files,
    iter_file_trees, iter_examples)
from t2t_jax.parsing.scoring import (  # noqa: F401
    DELETE_LABELS, DELETE_FOR_LENGTH, EQUAL_LABELS, CUTOFF_LEN, SentenceScore, score_sentence,
    evalb)
from t2t_jax.parsing.constraints import (  # noqa: F401
    TreeConstraint, constraint_for, LabelConstraint, label_constraint_for)
from t2t_jax.parsing.vocabulary import tree_symbols, TreeVocabulary  # noqa: F401
from t2t_jax.parsing.tokenize import ptb_tokens, prepare as prepare_sentence  # noqa: F401
