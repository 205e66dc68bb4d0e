"""Raw text into Penn Treebank tokens, as the WSJ trees hold them, so that a parser reads a
user's sentence as it read its training trees: punctuation and brackets split off,
contractions split (`ca n't`, `it 's`), double quotes as `` and '', brackets escaped as
-LRB- -RRB- -LSB- -RSB- -LCB- -RCB- (a leaf with a parenthesis is no tree EVALB or
`nltk.Tree.fromstring` reads). The rules are the treebank's tokenizer conventions (its sed
script, as NLTK and Moses port it); numbers keep their commas and points (`3,000` `3.5`).
"""

from __future__ import annotations

import re

BRACKETS = {"(": "-LRB-", ")": "-RRB-", "[": "-LSB-", "]": "-RSB-", "{": "-LCB-",
            "}": "-RCB-"}
_CURLY = {"\u201c": '"', "\u201d": '"', "\u201e": '"', "\u2018": "'", "\u2019": "'"}

# Each (pattern, replacement) in order, on the sentence padded with spaces.
_RULES = [
    (re.compile(r'(^|[\s(\[{<])"'), r"\1 `` "),          # an opening double quote
    (re.compile(r"(^|[\s(\[{<])'(?=[^\s'])(?!(?:s|m|d|ll|re|ve|t)\b)", re.I), r"\1 ` "),
    (re.compile(r"\.\.\."), " ... "),
    (re.compile(r"[;@#$%&?!]"), r" \g<0> "),
    (re.compile(r"([,:])(?!\d)|(?<!\d)([,:])"), r" \1\2 "),  # not inside 3,000 or 10:30
    (re.compile(r"([^.])(\.)([\]\)}>\"']*)\s*$"), r"\1 \2\3 "),  # the sentence's last period
    (re.compile(r"[\]\[(){}<>]"), r" \g<0> "),
    (re.compile(r"--"), " -- "),
    (re.compile(r'"'), " '' "),                           # any other double quote closes
    (re.compile(r"(\S)('')"), r"\1 \2 "),
    (re.compile(r"([^' ])('[sSmMdD]|') "), r"\1 \2 "),
    (re.compile(r"([^' ])('ll|'LL|'re|'RE|'ve|'VE|n't|N'T) "), r"\1 \2 "),
]
# Words the treebank writes as two tokens.
_SPLIT_WORDS = re.compile(
    r"(?i)\b(can)(not)\b|\b(d)('ye)\b|\b(gim)(me)\b|\b(gon)(na)\b|\b(got)(ta)\b|"
    r"\b(lem)(me)\b|\b(mor)('n)\b|\b(wan)(na)(?=\s)|(?<=\s)('t)(is)\b|(?<=\s)('t)(was)\b")


def ptb_tokens(text: str) -> list[str]:
  """`I can't believe it's "not" butter (really).` -> I ca n't believe it 's `` not ''
  butter -LRB- really -RRB- ."""
  text = "".join(_CURLY.get(c, c) for c in text)
  text = f" {text.strip()} "
  for pattern, replacement in _RULES:
    text = pattern.sub(replacement, text)
  text = _SPLIT_WORDS.sub(lambda m: " ".join(g for g in m.groups() if g), f" {text} ")
  tokens = text.split()
  # An abbreviation that ends the sentence keeps its point, and the sentence's comes after
  # it (`p.m. .`, `U.S. .`), as in the WSJ trees.
  if len(tokens) > 1 and tokens[-1] == "." and "." in tokens[-2] and tokens[-2] != "...":
    tokens[-2] += "."
  return [escape(token) for token in tokens]


def escape(token: str) -> str:
  """A token as a tree's leaf: a bracket as its treebank name (`(` -> -LRB-), brackets
  inside a longer token too (`f(x)` -> f-LRB-x-RRB-)."""
  if token in BRACKETS:
    return BRACKETS[token]
  return "".join(BRACKETS.get(c, c) if c in "()" else c for c in token)


def prepare(line: str, pretokenized: bool = False) -> str:
  """A line as the parser reads it: tokenised as the treebank is, or (`pretokenized`) its
  space-separated tokens as given, each escaped."""
  return " ".join([escape(t) for t in line.split()] if pretokenized else ptb_tokens(line))
