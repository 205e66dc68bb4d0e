#!/bin/bash
# The miniature Table 3 on Multi30k en->de (results/table3_mini/README.md).
# Usage, from the repository root: bash results/table3_mini/command.sh WORKDIR [FLAGS]
# (resumable: run it again after an interruption; extra flags such as --print_commands or
# --report_only go to the sweep). Needs ../shared/data/multi30k.
set -euo pipefail
workdir="${1:?usage: command.sh WORKDIR [sweep flags]}"
shift
python -m t2t_jax.tools.sweep --sweep=table3 --workdir="$workdir" \
  --dataset=folder:../shared/data/multi30k:en-de --width_scale=0.25 --depth_scale=0.5 \
  --set model.vocab_size=8000 --set model.max_len=128 --set data.max_length=128 \
  --set data.bucket_growth=2.0 --set train.steps=360 --set train.tokens_per_step=1024 \
  --set train.max_tokens_per_batch=1024 --set train.warmup_steps=100 \
  --set train.learning_rate_scale=0.25 --set train.eval_every_steps=360 \
  --set train.checkpoint_every_steps=360 --set train.log_every_steps=60 \
  --set decode.max_extra_length=20 "$@"
