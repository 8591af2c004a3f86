# shellcheck shell=bash
# Sourced by test.sh, sanitize.sh and .ci/run: `phase NAME COMMAND...` runs COMMAND and prints
# how long it took, on stderr, whether or not it failed, so CI's log shows where its time goes.
# PIPETUNE_PHASE_LOG, when set, also gets one "NAME SECONDS STATUS" line per phase; .ci/run
# prints them as a table at the end.

phase() {
  local name="$1"
  shift
  local start=$SECONDS status=0
  echo "== phase: $name" >&2
  "$@" || status=$?
  local took=$((SECONDS - start))
  echo "== phase: $name: $((took / 60))m$((took % 60))s$([ "$status" -eq 0 ] || echo " (failed, exit $status)")" >&2
  if [ -n "${PIPETUNE_PHASE_LOG:-}" ]; then
    echo "$name $took $status" >>"$PIPETUNE_PHASE_LOG"
  fi
  return "$status"
}
