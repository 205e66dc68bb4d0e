#!/bin/bash
# Table 3 on Multi30k en->de, each row trained near convergence (README.md beside this file).
# Usage, from the repository root: bash results/table3_converged/command.sh WORKDIR [FLAGS]
# Two runs at a time, one per core; base with 3 seeds for the noise band. Resumable: run it
# again after an interruption (finished runs are skipped, a half-trained one resumes); extra
# flags such as --print_commands or --report_only go to the sweep. Needs ../shared/data/multi30k.
set -euo pipefail
workdir="${1:?usage: command.sh WORKDIR [sweep flags]}"
shift
python -m t2t_jax.tools.sweep --sweep=table3 --workdir="$workdir" \
  --dataset=folder:../shared/data/multi30k:en-de --width_scale=0.25 --depth_scale=0.5 \
  --parallel=2 --seeds=3 --seeds_for=table3_base \
  --set model.vocab_size=8000 --set model.max_len=128 --set data.max_length=128 \
  --set data.bucket_growth=1.2 --set train.steps=2400 --set train.tokens_per_step=3072 \
  --set train.max_tokens_per_batch=3072 --set train.warmup_steps=600 \
  --set train.eval_every_steps=400 --set train.checkpoint_every_steps=400 \
  --set train.keep_checkpoints=3 --set train.log_every_steps=100 "$@"
