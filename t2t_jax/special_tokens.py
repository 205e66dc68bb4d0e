"""Reserved token ids, shared by the vocabulary, the model and decoding."""

PAD_ID = 0  # padding; masked everywhere and never predicted
EOS_ID = 1  # ends every target sentence
BOS_ID = 2  # first decoder input (targets shifted right)
UNK_ID = 3
