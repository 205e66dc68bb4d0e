#!/bin/bash
# Training on a Cloud TPU VM slice (e.g. v3-32 = 4 hosts x 8 cores), run from a workstation
# with gcloud. Every host runs the same command; jax.distributed.initialize() finds the
# slice by itself (--distributed). Not run in this repository's CI (no TPU).
#
#   TPU_NAME=my-v3-32 ZONE=europe-west4-a bash launch/tpu_vm.sh setup
#   TPU_NAME=my-v3-32 ZONE=europe-west4-a EXPERIMENT=big_enfr bash launch/tpu_vm.sh train
#   TPU_NAME=my-v3-32 ZONE=europe-west4-a EXPERIMENT=big_enfr bash launch/tpu_vm.sh eval
#
# WORKDIR must be one directory all hosts share: mount a Filestore (NFS) share or a
# gcsfuse bucket at the same path on every host (a gs:// --workdir is refused: it would
# become a local folder that vanishes with the VM). A v3-8 (one host) needs no --distributed.
# On gcsfuse a directory rename is not atomic: a host killed while a checkpoint is renamed
# into place can leave a partial checkpoint folder. The next start finds that it does not
# restore, sets it aside and resumes from the one before, so no step is lost but that
# checkpoint's; averaging and evaluation read only complete checkpoints. Filestore (NFS) has
# atomic renames and none of this.

set -euo pipefail
: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}"
EXPERIMENT=${EXPERIMENT:-big_enfr}
WORKDIR=${WORKDIR:-/mnt/shared/t2t_runs/$EXPERIMENT}
REPO_URL=${REPO_URL:-}   # where the hosts clone t2t_jax from

on_all_hosts() {
  gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker=all --command="$1"
}
on_host_0() {
  gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker=0 --command="$1"
}

case "${1:-train}" in
  setup)
    : "${REPO_URL:?set REPO_URL to clone t2t_jax on the hosts}"
    on_all_hosts "git clone $REPO_URL t2t_jax 2>/dev/null || git -C t2t_jax pull; \
      cd t2t_jax && pip install -e '.[tpu]'"
    ;;
  train)
    # Preemption (spot/preemptible TPUs) sends SIGTERM: every host checkpoints after the
    # same step; running this command again resumes.
    on_all_hosts "cd t2t_jax && python -m t2t_jax.main --experiment=$EXPERIMENT \
      --workdir=$WORKDIR --distributed"
    ;;
  eval)
    on_host_0 "cd t2t_jax && python -m t2t_jax.main --experiment=$EXPERIMENT \
      --workdir=$WORKDIR --mode=average && python -m t2t_jax.main \
      --experiment=$EXPERIMENT --workdir=$WORKDIR --mode=eval"
    ;;
  *) echo "usage: $0 setup|train|eval" >&2; exit 2 ;;
esac
