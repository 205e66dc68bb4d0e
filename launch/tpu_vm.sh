#!/bin/bash
# Training on a Cloud TPU VM slice (v4-32: 4 hosts of 4 chips; v5e, v3 ...), run from a
# workstation with gcloud and this checkout. Every host runs the same command, and
# jax.distributed.initialize() finds the slice by itself (--distributed).
#
#   export TPU_NAME=my-v4-32 ZONE=us-central2-b EXPERIMENT=big_enfr BUCKET=my-bucket
#   bash launch/tpu_vm.sh setup                        # this checkout, installed on every host
#   bash launch/tpu_vm.sh train [--set KEY=VALUE ...]  # starts training in the background on
#                                                      # every host and returns; at the last
#                                                      # step it averages and evaluates
#   bash launch/tpu_vm.sh attach                       # follows host 0's log (WORKER=N: N's)
#   bash launch/tpu_vm.sh eval  [--set KEY=VALUE ...]  # averages and evaluates again
#
# `train` detaches: the job outlives the workstation's ssh session. Each host writes its own
# log, ~/t2t_jax_train.log, and copies it to LOG_DIR (default WORKDIR/logs/host<N>.log) every
# LOG_EVERY_S (60) seconds and when its trainer exits (its last line: "exit STATUS"), so the
# bucket shows every host's progress; `attach` re-attaches to one (Ctrl-C leaves it running).
# A preempted spot slice is deleted with its hosts: create it again, `setup`, then `train`
# resumes from the bucket's newest checkpoint.
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
# (PYTHON names it): TPU VM images built on Ubuntu 22.04 ship 3.10; `sudo apt-get install -y
# python3.11 python3.11-venv` on every host, then PYTHON=python3.11. The trainer runs with
# EPATH_USE_TF=false: gs:// through gcsfs, as the tests run it, even with TensorFlow installed.

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
LOG_DIR=${LOG_DIR:-$WORKDIR/logs}
LOG_EVERY_S=${LOG_EVERY_S:-60}
HOST_LOG='$HOME/t2t_jax_train.log'
HERE=$(cd "$(dirname "$0")/.." && pwd)

on_hosts() {  # every host at once
  gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker=all --command="$1"
}

# The trainer's command on a host, with this script's extra arguments quoted for its shell.
t2t_command() {
  local mode=$1; shift
  printf 'export T2T_JAX_DATA_DIR=%q EPATH_USE_TF=false && %s/bin/python -m t2t_jax.main ' \
    "$DATA_DIR" "$ENV_DIR"
  printf -- '--experiment=%q ' "$EXPERIMENT"
  printf -- '--workdir=%q --mode=%q --distributed' "$WORKDIR" "$mode"
  [ $# -eq 0 ] || printf ' %q' "$@"
}

# A host's command that runs `$1` in the background, its output in HOST_LOG, copied to
# LOG_DIR/host<N>.log (N: the TPU worker number, from the VM's metadata) while it runs and
# when it ends.
detached() {
  local upload
  case "$LOG_DIR" in
    gs://*) upload="gcloud storage cp --quiet $HOST_LOG $LOG_DIR/host\$n.log" ;;
    *) upload="mkdir -p $(printf %q "$LOG_DIR") && cp $HOST_LOG $(printf %q "$LOG_DIR")/host\$n.log" ;;
  esac
  local worker='n=${TPU_WORKER_ID:-$(curl -sf -m 2 -H Metadata-Flavor:Google '
  worker+='http://metadata.google.internal/computeMetadata/v1/instance/attributes/'
  worker+='agent-worker-number || hostname)}'
  local job="$1 > $HOST_LOG 2>&1; echo \"exit \$?\" >> $HOST_LOG"
  local body="$worker; ($job) & pid=\$!; while kill -0 \$pid 2>/dev/null; do $upload; sleep $LOG_EVERY_S & wait \$!; done; $upload"
  printf 'nohup bash -c %q > /dev/null 2>&1 < /dev/null &' "$body"
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
    on_hosts "$(detached "$(t2t_command train "$@")")"
    echo "training in the background on every host; its logs: $LOG_DIR/host<N>.log;" \
      "follow host 0 with: bash $0 attach"
    ;;
  attach)
    gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker="${WORKER:-0}" \
      --command="tail -n +1 -F $HOST_LOG"
    ;;
  eval)
    on_hosts "$(t2t_command average "$@") && $(t2t_command eval "$@")"
    ;;
  *) echo "usage: $0 setup | train [ARGS...] | attach | eval [ARGS...]" >&2; exit 2 ;;
esac
