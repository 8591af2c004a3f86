#!/usr/bin/env bash
# What one process per device costs against one process with a worker thread per device: the
# same model, plan, batches and seed, `run` then `launch -n K -- run --distributed`, alternated
# ROUNDS times so that a machine slowing down mid-way moves both alike. Prints the median
# pipeline and step times of each and the links the ranks measured.
#
#   bench/distributed/overhead.sh [MODEL_SPEC] [BATCH] [BALANCE] [CHUNKS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
cli="${PIPETUNE_BUILD_DIR:-build}/cli/pipetune"
model="${1:-mlp:layers=8,width=1024}"
batch="${2:-256}"
balance="${3:-5,4}"
chunks="${4:-4}"
rounds="${5:-3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
ranks=$(awk -F, '{print NF}' <<< "$balance")
printf '{"format": "pipetune.plan/1", "balance": [%s], "chunks": %s, "checkpoint": "except_last", "schedule": "gpipe"}\n' \
  "$balance" "$chunks" > "$work/plan.json"
common=(--model "$model" --batch "$batch" --plan "$work/plan.json" --steps 20 --warmup 2 --seed 1 --json --progress none)
for r in $(seq 1 "$rounds"); do
  "$cli" run "${common[@]}" > "$work/one.$r.json"
  "$cli" launch -n "$ranks" -- run "${common[@]}" --distributed --links-out "$work/links.$r.json" > "$work/ranks.$r.json"
done
python3 - "$work" "$rounds" "$model" "$batch" "$balance" "$chunks" <<'PY'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
def pooled(kind, key):
    values = []
    for r in range(1, rounds + 1):
        values += json.load(open(f"{work}/{kind}.{r}.json"))[key]
    return statistics.median(values)
print(f"model {sys.argv[3]}, batch {sys.argv[4]}, balance [{sys.argv[5]}] x{sys.argv[6]}, {rounds} rounds of 20 steps")
for kind, name in (("one", "one process, a thread per device"), ("ranks", "one process per device (Gloo)")):
    print(f"{name:34s} pipeline {pooled(kind, 'pipeline_ms'):8.3f} ms   step {pooled(kind, 'step_ms'):8.3f} ms")
one, ranks = pooled("one", "pipeline_ms"), pooled("ranks", "pipeline_ms")
print(f"{'distributed / single':34s} {ranks / one:8.2f}x")
for r in range(1, rounds + 1):
    for link in json.load(open(f"{work}/links.{r}.json"))["links"]:
        print(f"links round {r}: {link['between'][0]}-{link['between'][1]} latency {link['latency_ms']:.3f} ms, "
              f"bandwidth {link['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s")
PY
