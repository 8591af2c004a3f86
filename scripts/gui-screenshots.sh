#!/usr/bin/env bash
# Regenerates the screenshots of pipetune-gui in docs/images/ (docs/gui.md shows them).
#
#   scripts/gui-screenshots.sh [PROFILE [HARDWARE] [PLAN] [MEASURED_TRACE ...]]
#
# The files go to `pipetune-gui --screenshot` as given (it tells them apart by their format tags).
# With no files it uses the real run shipped in traces/ (cpu-mlp.*: profile, calibrated hardware,
# plan, measured trace). Without those it uses the example profile (tests/data/tiny.profile.json) on four made-up devices (64 MiB
# each, 200 MB/s links) with a [1,2,2,1] x8 plan and, for the overlay, a stand-in measured trace:
# the same plan simulated on a copy of the profile whose layers are 5-20 % slower or faster,
# relabelled "measured" and shifted in time, as a real run would be. It is synthetic: replace it
# with a real run's trace when there is one.
#
# Environment: PIPETUNE_BUILD_DIR (default build-gui, else build) holds pipetune and
# pipetune-gui; PIPETUNE_SCREENSHOT_DIR (default docs/images) receives the images.
set -euo pipefail
cd "$(dirname "$0")/.."

build="${PIPETUNE_BUILD_DIR:-}"
if [ -z "$build" ]; then
  build="build-gui"
  [ -x "$build/gui/app/pipetune-gui" ] || build=build
fi
gui="$build/gui/app/pipetune-gui"
cli="$build/cli/pipetune"
out="${PIPETUNE_SCREENSHOT_DIR:-docs/images}"
for tool in "$gui" "$cli"; do
  [ -x "$tool" ] || { echo "gui-screenshots: $tool not built (cmake --build $build)" >&2; exit 2; }
done
mkdir -p "$out"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

files=("$@")
if [ ${#files[@]} -eq 0 ] && [ -f traces/cpu-mlp.measured.trace.json ]; then
  files=(traces/cpu-mlp.profile.json traces/cpu-mlp.hardware.json traces/cpu-mlp.plan.json
         traces/cpu-mlp.measured.trace.json)
fi
if [ ${#files[@]} -eq 0 ]; then
  profile=tests/data/tiny.profile.json
  hardware="$scratch/hardware-4.json"
  plan="$scratch/plan-4x8.json"
  cat > "$hardware" <<'JSON'
{"format": "pipetune.hardware/1",
 "devices": [{"name": "gpu0", "memory_bytes": 67108864}, {"name": "gpu1", "memory_bytes": 67108864},
             {"name": "gpu2", "memory_bytes": 67108864}, {"name": "gpu3", "memory_bytes": 67108864}],
 "link": {"bandwidth_bytes_per_s": 2e8, "latency_ms": 0.02},
 "launch_overhead_ms": 0.005}
JSON
  cat > "$plan" <<'JSON'
{"format": "pipetune.plan/1", "balance": [1, 2, 2, 1], "chunks": 8,
 "checkpoint": "except_last", "schedule": "gpipe"}
JSON
  python3 - "$profile" "$scratch/perturbed.profile.json" <<'PY'
import json, sys
profile = json.load(open(sys.argv[1]))
forward = [1.12, 0.95, 1.08, 1.20, 0.90, 1.05]
backward = [0.92, 1.10, 0.97, 1.15, 1.05, 0.90]
for i, layer in enumerate(profile["layers"]):
    layer["forward_ms"] = [t * forward[i % 6] for t in layer["forward_ms"]]
    layer["backward_ms"] = [t * backward[i % 6] for t in layer["backward_ms"]]
json.dump(profile, open(sys.argv[2], "w"))
PY
  "$cli" simulate --profile "$scratch/perturbed.profile.json" --hardware "$hardware" --plan "$plan" \
    --trace "$scratch/simulated.json" > /dev/null
  python3 - "$scratch/simulated.json" "$scratch/measured.trace.json" <<'PY'
import json, sys
trace = json.load(open(sys.argv[1]))
trace["pipetune"]["kind"] = "measured"
for event in trace["traceEvents"]:
    if "ts" in event:
        event["ts"] += 4200.0  # the step starts 4.2 ms into the recording
json.dump(trace, open(sys.argv[2], "w"))
PY
  files=("$profile" "$hardware" "$plan" "$scratch/measured.trace.json")
fi

"$gui" --screenshot "$out/gui-overlay.png" --size 1600x1000 "${files[@]}"
echo "wrote $out/gui-overlay.png"

# The same files with less memory per device than the plan's largest predicted peak: the
# devices that no longer fit turn red before anything runs. Needs a profile and a plan file.
profile="" hardware="" plan=""
for f in "${files[@]}"; do
  case "$(head -c 4096 "$f")" in
    *'"pipetune.profile/1"'*) profile="$f" ;;
    *'"pipetune.hardware/1"'*) hardware="$f" ;;
    *'"pipetune.plan/1"'*) [[ "$(head -c 4096 "$f")" == *'"pipetune.trace/1"'* ]] || plan="$f" ;;
  esac
done
if [ -n "$profile" ] && [ -n "$plan" ]; then
  peak=$("$cli" simulate --profile "$profile" ${hardware:+--hardware "$hardware"} --plan "$plan" --json 2> /dev/null |
    python3 -c 'import json, sys; print(max(d["peak_memory_bytes"] for d in json.load(sys.stdin)["devices"]))')
  "$gui" --screenshot "$out/gui-does-not-fit.png" --size 1600x1000 --memory "$((peak * 9 / 10))" \
    "$profile" ${hardware:+"$hardware"} "$plan"
  echo "wrote $out/gui-does-not-fit.png"
fi
