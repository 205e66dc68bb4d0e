# The stage clock of .ci/run (sourced): `stage NAME` ends the stage before it, printing its
# seconds, and starts NAME; at exit the table of every stage and the total.
clock="$(mktemp)"; stage_name=""; stage_start=$SECONDS
stage() {
  [ -z "$stage_name" ] || printf 'ci stage: %-34s %5d s\n' "$stage_name" $((SECONDS - stage_start)) \
    | tee -a "$clock"
  stage_name="${1:-}"; stage_start=$SECONDS
}
trap 'stage; echo; cat "$clock"; printf "ci stage: %-34s %5d s\n" total $SECONDS' EXIT
