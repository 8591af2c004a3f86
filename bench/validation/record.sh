#!/usr/bin/env bash
# The accuracy record of docs/validation.md: `pipetune validate` over the zoo's three model
# families, every checkpoint mode, several chunk counts and both schedules, on this machine's
# CPU with 2 devices (PIPETUNE_RECORD_DEVICES=N for more). Each model is profiled and calibrated
# once (its first run), then reused.
#
#   bench/validation/record.sh OUT_DIR [extra validate flags]
#
# then: python3 bench/validation/record_table.py OUT_DIR/*/*/report.json
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:?usage: record.sh OUT_DIR [validate flags]}"
shift
cli="${PIPETUNE_BUILD_DIR:-build}/cli/pipetune"
steps="${PIPETUNE_RECORD_STEPS:-20}"
devices="${PIPETUNE_RECORD_DEVICES:-2}"

models=(
  "mlp mlp:layers=8,width=1024 256"
  "gpt gpt:layers=4,width=256,heads=4,seq=64 32"
  "resnet resnet:blocks=4,channels=32 32"
)
for entry in "${models[@]}"; do
  read -r name spec batch <<< "$entry"
  first=1
  for mode in never except_last always; do
    dir="$out/$name/$mode"
    mkdir -p "$out/$name"
    reuse=()
    if [ $first -eq 0 ]; then
      reuse=(--profile "$out/$name/never/profile.json" --hardware "$out/$name/never/hardware.json")
    fi
    echo "== $name $mode" >&2
    "$cli" validate --model "$spec" --batch "$batch" --devices "$devices" --checkpoint "$mode" --chunks 1,2,4,8 \
      --top 4 --steps "$steps" --rounds 4 --out "$dir" --progress none "${reuse[@]}" "$@" > "$dir.txt" ||
      { echo "validate failed for $name $mode (see $dir.txt)" >&2; exit 1; }
    first=0
  done
done
echo "wrote $out; table: python3 bench/validation/record_table.py $out/*/*/report.json" >&2
