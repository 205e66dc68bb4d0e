#!/bin/bash
# Training on a Cloud TPU VM slice (v4-32: 4 hosts of 4 chips; v5e, v3 ...), run from a
# workstation with gcloud and this checkout. Every host runs the same command, and
# jax.distributed.initialize() finds the slice by itself (--distributed).
#
#   export TPU_NAME=my-v4-32 ZONE=us-central2-b EXPERIMENT=big_enfr BUCKET=my-bucket
#   bash launch/tpu_vm.sh setup                        # this checkout, installed on every host
#   bash launch/tpu_vm.sh train [--set KEY=VALUE ...]  # trains; at the last step, averages
#                                                      # and evaluates on newstest2014
#   bash launch/tpu_vm.sh eval  [--set KEY=VALUE ...]  # averages and evaluates again
#
# Arguments after `train` or `eval` reach t2t_jax.main on every host (--set, --dataset, ...).
# Running `train` again resumes: a preempted slice (spot TPUs send SIGTERM) checkpoints after
# the same step on every host first. Averaging and beam search are one host's work: in the
# job, process 0 runs them on its own chips while the other hosts wait for it.
#
# A TPU VM keeps nothing and its hosts share no disk, so the run lives in a bucket: WORKDIR
# (default gs://BUCKET/t2t_runs/EXPERIMENT) holds checkpoints, TensorBoard, the vocabulary and
# the evaluation; DATA_DIR (default gs://BUCKET/t2t_data) the prepared corpus, which process 0
# prepares once (tfds downloading to its own disk) and uploads, and every host then downloads.
# Checkpoints are complete when orbax's commit marker says so, not by a rename. Any folder
# every host shares at the same path (a Filestore share) serves as well.
#
# setup builds a wheel of this checkout (no URL needed), copies it to every host's home and
# installs it with EXTRAS (default tpu,tfds,gcs: libtpu, tensorflow-datasets for WMT14, gcsfs
# for the bucket) into the virtual environment ~/t2t_jax_env. The hosts need Python >= 3.11
# (PYTHON names it).

set -euo pipefail
: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}"
EXPERIMENT=${EXPERIMENT:-big_enfr}
if [ -z "${WORKDIR:-}" ] || [ -z "${DATA_DIR:-}" ]; then
  : "${BUCKET:?set BUCKET (the run and data go to gs://BUCKET/...), or WORKDIR and DATA_DIR}"
fi
WORKDIR=${WORKDIR:-gs://${BUCKET:-}/t2t_runs/$EXPERIMENT}
DATA_DIR=${DATA_DIR:-gs://${BUCKET:-}/t2t_data}
EXTRAS=${EXTRAS:-tpu,tfds,gcs}
PYTHON=${PYTHON:-python3}
ENV_DIR='$HOME/t2t_jax_env'   # expanded on the hosts
HERE=$(cd "$(dirname "$0")/.." && pwd)

on_hosts() {  # every host at once
  gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker=all --command="$1"
}

# The trainer's command on a host, with this script's extra arguments quoted for its shell.
t2t_command() {
  local mode=$1; shift
  printf 'export T2T_JAX_DATA_DIR=%q && %s/bin/python -m t2t_jax.main --experiment=%q ' \
    "$DATA_DIR" "$ENV_DIR" "$EXPERIMENT"
  printf -- '--workdir=%q --mode=%q --distributed' "$WORKDIR" "$mode"
  [ $# -eq 0 ] || printf ' %q' "$@"
}

subcommand=${1:-}
[ $# -eq 0 ] || shift
case "$subcommand" in
  setup)
    wheels=$(mktemp -d)
    "$PYTHON" -m pip wheel --quiet --no-deps --wheel-dir "$wheels" "$HERE"
    wheel=$(ls "$wheels"/t2t_jax-*.whl)
    gcloud compute tpus tpu-vm scp "$wheel" "$TPU_NAME:" --zone="$ZONE" --worker=all
    on_hosts "$PYTHON -m venv --system-site-packages $ENV_DIR && \
      $ENV_DIR/bin/python -m pip install --quiet --force-reinstall --no-deps \
        \$HOME/$(basename "$wheel") && \
      $ENV_DIR/bin/python -m pip install --quiet \"\$HOME/$(basename "$wheel")[$EXTRAS]\""
    rm -rf "$wheels"
    ;;
  train)
    on_hosts "$(t2t_command train "$@")"
    ;;
  eval)
    on_hosts "$(t2t_command average "$@") && $(t2t_command eval "$@")"
    ;;
  *) echo "usage: $0 setup | train [ARGS...] | eval [ARGS...]" >&2; exit 2 ;;
esac
