"""The paper's four WMT14 models (Vaswani et al. 2017, sections 5-6, Table 3).

  python -m t2t_jax.main --experiment=big_enfr --workdir=runs/big_enfr

Expected (the paper's Table 2, newstest2014, tokenized BLEU): base_ende 27.3, big_ende 28.4,
base_enfr 38.1, big_enfr 41.8, after 12 hours (base) or 3.5 days (big) on 8 P100 GPUs. Not
yet reproduced here: no run of these sizes has been trained (see results/).
"""

import dataclasses

from t2t_jax.config import (AverageConfig, DataConfig, ExperimentConfig, ModelConfig,
                            TrainConfig)

WMT14_ENDE = DataConfig(dataset="tfds:wmt14_translate/de-en:en-de", vocab_type="bpe")
# Section 5.1: en-fr uses a 32000 word-piece vocabulary (SentencePiece unigram). The paper
# trains on "36M sentences"; tfds's fr-en training split is every WMT14 fr-en corpus, about
# 40.8M pairs, unfiltered: the paper does not say how it filtered (fairseq's length and
# ratio filters keep about 35.5M).
WMT14_ENFR = DataConfig(dataset="tfds:wmt14_translate/fr-en:en-fr", vocab_type="unigram")

BASE = ModelConfig(vocab_size=37000, num_layers=6, d_model=512, d_ff=2048, num_heads=8,
                   d_k=64, d_v=64, dropout=0.1, label_smoothing=0.1)
# Table 3 "big": d_model 1024, d_ff 4096, h 16 (so d_k = d_v = 64), P_drop 0.3.
BIG = dataclasses.replace(BASE, d_model=1024, d_ff=4096, num_heads=16, dropout=0.3)

# Section 5.2: 100k steps for base, 300k for big. Checkpoints for averaging every 10 minutes
# of the paper's hardware, in steps (100k steps in 12 h, 300k in 3.5 days: 1,389 and 595).
# Dev BLEU of 100 sentences, greedy, with every dev evaluation: about a second on a GPU against
# hours of training (not the paper's; its dev BLEU is Table 3's, after training).
BASE_TRAIN = TrainConfig(steps=100_000, tokens_per_step=25_000, warmup_steps=4000,
                         checkpoint_every_steps=1400, bleu_every_steps=5000)
BIG_TRAIN = dataclasses.replace(BASE_TRAIN, steps=300_000, checkpoint_every_steps=600)


def base_ende() -> ExperimentConfig:
  return ExperimentConfig(model=BASE, data=WMT14_ENDE, train=BASE_TRAIN,
                          average=AverageConfig(last=5))


def big_ende() -> ExperimentConfig:
  return ExperimentConfig(model=BIG, data=WMT14_ENDE, train=BIG_TRAIN,
                          average=AverageConfig(last=20))


def base_enfr() -> ExperimentConfig:
  return ExperimentConfig(model=dataclasses.replace(BASE, vocab_size=32000),
                          data=WMT14_ENFR, train=BASE_TRAIN, average=AverageConfig(last=5))


def big_enfr() -> ExperimentConfig:
  return ExperimentConfig(model=dataclasses.replace(BIG, vocab_size=32000, dropout=0.1),
                          data=WMT14_ENFR, train=BIG_TRAIN, average=AverageConfig(last=20))


# name -> (config, description): what t2t_jax.registry finds.
EXPERIMENTS = {
    "base_ende": (base_ende, "paper base model, WMT14 en->de"),
    "big_ende": (big_ende, "paper big model, WMT14 en->de (P_drop 0.3)"),
    "base_enfr": (base_enfr, "paper base model, WMT14 en->fr"),
    "big_enfr": (big_enfr, "paper big model, WMT14 en->fr (section 6.1: P_drop 0.1)"),
}
