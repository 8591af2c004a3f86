#!/usr/bin/env bash
# What a what-if costs from the command line: the start-up of `pipetune simulate` (which loads no
# LibTorch), the same through pipetune-torch (what every command paid when there was one
# program), and a thousand plans simulated one process each against one `simulate --plans`.
#
#   bench/cli/startup.sh [BUILD_DIR]        (default build; docs/benchmarks.md, "CLI start-up")
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${1:-build}"
cli="$build/cli/pipetune"
torch_cli="$build/cli/pipetune-torch"
profile=traces/cpu-mlp.profile.json
args=(simulate --profile "$profile" --balance 5,4 --chunks 4)

# Median wall time of `runs` cold starts of a command, in milliseconds.
median_ms() {
  local runs=$1
  shift
  for _ in $(seq "$runs"); do
    local start end
    start=$(date +%s%N)
    "$@" >/dev/null 2>&1
    end=$(date +%s%N)
    echo $(((end - start) / 1000))
  done | sort -n | awk '{ v[NR] = $1 } END { printf "%.1f", v[int((NR + 1) / 2)] / 1000 }'
}

echo "pipetune simulate, cold process:        $(median_ms 21 "$cli" "${args[@]}") ms (median of 21)"
if [ -x "$torch_cli" ]; then
  echo "pipetune-torch simulate, cold process:  $(median_ms 5 "$torch_cli" "${args[@]}") ms (median of 5)"
fi

# A thousand plans of the profile's 9 layers over 2 to 4 stages, chunks 1 to 16, every
# checkpoint mode.
plans="$(mktemp)"
trap 'rm -f "$plans"' EXIT
python3 - "$plans" <<'PY'
import itertools, json, sys
out = []
modes = ["never", "always", "except_last"]
for stages in (2, 3, 4):
    for cuts in itertools.combinations(range(1, 9), stages - 1):
        ends = (0,) + cuts + (9,)
        balance = [b - a for a, b in zip(ends, ends[1:])]
        for chunks in (1, 2, 4, 8, 16):
            for mode in modes:
                out.append({"balance": balance, "chunks": chunks, "checkpoint": mode,
                            "schedule": "1f1b"})
with open(sys.argv[1], "w") as f:
    for plan in out[:1000]:
        f.write(json.dumps(plan) + "\n")
PY
count=$(wc -l <"$plans")
start=$(date +%s%N)
"$cli" simulate --profile "$profile" --plans "$plans" >/dev/null 2>&1
end=$(date +%s%N)
echo "simulate --plans, $count plans, one process: $(((end - start) / 1000000)) ms"
start=$(date +%s%N)
while IFS= read -r line; do
  "$cli" simulate --profile "$profile" --plans - <<<"$line" >/dev/null 2>&1
done <"$plans"
end=$(date +%s%N)
echo "the same $count plans, one process each:  $(((end - start) / 1000000)) ms"
