"""Multi30k (and Tatoeba) English->German/French on a 2-core CPU in one hour (../shared/data).

  python -m t2t_jax.main --experiment=multi30k_ende --workdir=runs/multi30k_ende

Expected test2016 sacreBLEU: multi30k_ende 39.6, multi30k_enfr 59.1; tatoeba_ende 39.1 on its
test split (2026-11-25, results/multi30k_ende, results/multi30k_enfr, results/tatoeba_ende).

The paper's recipe (post-LN, shared BPE, Adam 0.9/0.98, warmup + inverse
square root, label smoothing, averaging, beam 4 with alpha 0.6) scaled to a
29k-pair corpus and a CPU, plus an ensemble of two models trained side by side
in the same hour. Each deviation from the paper has its reason inline.
"""

import os

from t2t_jax.config import (AverageConfig, DataConfig, DecodeConfig, EnsembleConfig,
                            ExperimentConfig, ModelConfig, TrainConfig)

# ../shared/data/multi30k beside the repository; a missing folder is a one-line error that
# names the path and suggests --dataset=folder:PATH.
SHARED_DATA = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "..",
                                            "shared", "data"))
MULTI30K = os.path.join(SHARED_DATA, "multi30k")
TATOEBA_ENDE = os.path.join(SHARED_DATA, "tatoeba_ende")


def _one_hour_recipe(dataset: str, test_split: str) -> ExperimentConfig:
  # Why each setting: the comment beside it; the figures: results/multi30k_ende/README.md.
  return ExperimentConfig(
      # 29k pairs cannot feed a 63M-parameter model, and an hour of CPU is the limit: 3+3
      # layers of width 128 (2.4M parameters) learnt fastest per minute of what was tried.
      model=ModelConfig(vocab_size=8000, num_layers=3, d_model=128, d_ff=512, num_heads=4,
                        d_k=32, d_v=32,
                        dropout=0.1,  # the paper's; 0.2 and 0.3 scored lower on valid
                        # 0.2, not the paper's 0.1: a 29k-pair corpus overfits within the hour.
                        label_smoothing=0.2, max_len=128),
      data=DataConfig(dataset=dataset, train_split="train", dev_split="valid",
                      test_split=test_split,
                      # A joint 8k BPE suits a 29k-pair corpus (37k would leave most pieces rare).
                      vocab_type="bpe", max_length=128,
                      # Coarser buckets than T2T's 10%: fewer shapes to compile in one hour.
                      bucket_growth=1.2),
      # ~3k tokens per step (under a second a step here). The hour is a wall-time budget that
      # includes compilation and dev evaluation, so `steps` is only an upper bound.
      train=TrainConfig(steps=10000, max_train_minutes=60.0, tokens_per_step=3072,
                        max_tokens_per_batch=3072, warmup_steps=600, checkpoint_every_steps=200,
                        checkpoint_every_minutes=10.0,
                        # The paper's schedule never anneals; an hour ends mid-schedule, so the
                        # rate falls linearly to 0 over its last 20 minutes.
                        cooldown_minutes=20.0,
                        eval_every_steps=500, log_every_steps=100),
      # Minimum Bayes risk among 8 beam hypotheses, not the paper's best of 4: chosen on valid.
      decode=DecodeConfig(beam_size=8, alpha=0.6, max_extra_length=50, mbr=True,
                          mbr_temperature=2.0),
      average=AverageConfig(last=5),
      # Two seeds trained at once, one per core, decoded together: this model's step scales
      # about linearly with cores, so each member gets what one model got on two cores, and one
      # model is near convergence by the hour's end.
      ensemble=EnsembleConfig(members=2),
  )


def multi30k_ende() -> ExperimentConfig:
  return _one_hour_recipe(f"folder:{MULTI30K}:en-de", "test2016")


def multi30k_enfr() -> ExperimentConfig:
  return _one_hour_recipe(f"folder:{MULTI30K}:en-fr", "test2016")


# The same recipe, unchanged, on a different corpus (166k short pairs): evidence that it is
# not tuned to Multi30k.
def tatoeba_ende() -> ExperimentConfig:
  return _one_hour_recipe(f"folder:{TATOEBA_ENDE}:en-de", "test")


EXPERIMENTS = {
    "multi30k_ende": (multi30k_ende, "Multi30k en->de, two 3+3-layer d128 models, one hour on "
                      "2 CPU cores"),
    "multi30k_enfr": (multi30k_enfr, "Multi30k en->fr, two 3+3-layer d128 models, one hour on "
                      "2 CPU cores"),
    "tatoeba_ende": (tatoeba_ende, "Tatoeba en->de with the multi30k_ende recipe, one hour on "
                     "a 2-core CPU"),
}
