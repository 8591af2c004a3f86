#!/usr/bin/env bash
# The GPU half of pipetune, on a GPU machine that has CUDA, its own torch, CMake, ninja and a
# compiler, but none of the Debian packages (they come in the kit that scripts/gpu-kit.sh packs).
#
#   scripts/gpu-check.sh [PHASE...]     (no phase: all of them, in this order)
#
#   kit      unpack .gpu-kit/kit.tar.xz into a private prefix
#   build    configure against the image's own torch (GUI off, CUDA and CUPTI required), build
#   test     the whole suite with PIPETUNE_REQUIRE_GPU=1: a GPU test that skips fails
#   profile  zoo models at GPU sizes, timed by CUPTI and by CUDA events, against whole-model runs
#   record   validate every checkpoint mode, both schedules, several chunk counts, 2 stages on the GPU
#   bench    executor overhead, and against torch.distributed.pipelining, on the GPU
#   partitions  stages at once on shares of the GPU's SMs (green contexts), against the simulator
#   pack     put logs, profiles, reports and traces into at most 8 files under $OUT
#
# Each phase fits well inside 10 minutes on 16 cores. The build and results stay in
# $PIPETUNE_GPU_WORK (default /tmp/pipetune-gpu) between commands while the machine is up, so
# `build test` then `profile record bench` does not build twice. When $OUT is set (the device
# tool sets it), `pack` runs at the end of every invocation.
#
# Environment: PIPETUNE_KEEP_GOING=1 (run the later phases after one fails), PIPETUNE_KIT (default
# .gpu-kit/kit.tar.xz), PIPETUNE_BUILD_TARGETS (build only these, e.g. a re-check's tests),
# PIPETUNE_GPU_WORK, PIPETUNE_TEST_TIMEOUT (seconds one test may take, default 600: less keeps a
# hanging GPU test from spending a short lease), PIPETUNE_RECORD_STEPS (steps per round of the
# record's plans, default 20),
# PIPETUNE_RECORD_ROUNDS (rounds the record's plans take turns in, default 4: a launch-bound
# plan runs at the host's pace, which moves by a third within minutes, so each plan's steps are
# spread over the whole record), PIPETUNE_SM_PARTITIONS (the partitions phase's shares of the
# SMs, default 2),
# PIPETUNE_PYTHON
# (default python3: the one that has the image's torch), PIPETUNE_BUILD_DIR (default
# $PIPETUNE_GPU_WORK/build), PIPETUNE_CMAKE_ARGS (more configure flags, e.g. a sanitizer build:
# PIPETUNE_BUILD_DIR=/tmp/asan PIPETUNE_CMAKE_ARGS=-DPIPETUNE_SANITIZE=address).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"

kit="${PIPETUNE_KIT:-$root/.gpu-kit/kit.tar.xz}"
work="${PIPETUNE_GPU_WORK:-/tmp/pipetune-gpu}"
prefix="$work/kit"
build="${PIPETUNE_BUILD_DIR:-$work/build}"
python="${PIPETUNE_PYTHON:-python3}"
cli="$build/cli/pipetune"
jobs="$(nproc)"
mkdir -p "$work/logs"
log="$work/logs/gpu-check.log"

say() { printf 'gpu-check: %s\n' "$*" | tee -a "$log" >&2; }
fail() { say "FAILED: $*"; exit 1; }
# Runs a command with its output in the log and on stdout.
logged() { "$@" 2>&1 | tee -a "$log"; return "${PIPESTATUS[0]}"; }

phase_kit() {
  [ -f "$kit" ] || fail "no kit at $kit: run scripts/gpu-kit.sh on the CPU machine and carry .gpu-kit"
  local stamp
  stamp="$(cksum < "$kit")"
  if [ -f "$prefix/.stamp" ] && [ "$(cat "$prefix/.stamp")" = "$stamp" ]; then
    say "kit already unpacked in $prefix"
    return
  fi
  rm -rf "$prefix"
  mkdir -p "$prefix"
  tar -C "$prefix" -xJf "$kit"
  echo "$stamp" > "$prefix/.stamp"
  say "kit unpacked in $prefix ($(du -sh "$prefix" | cut -f1))"
}

machine_summary() {
  {
    echo "# GPU check, $(date -u '+%F %T') UTC"
    echo
    echo '```'
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 || true
    "$python" - <<'PY' 2>&1 || true
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device", p.name, f"{p.total_memory / 2**30:.1f} GiB", p.multi_processor_count, "SMs")
PY
    echo "nvcc: $(nvcc --version 2>/dev/null | tail -1)"
    echo "cxx: $(c++ --version | head -1)"
    echo "cmake: $(cmake --version | head -1)"
    echo "cores: $jobs"
    echo '```'
  } > "$work/logs/machine.md"
  cat "$work/logs/machine.md" >> "$log"
}

phase_build() {
  [ -f "$prefix/.stamp" ] || phase_kit
  local torch_prefix py_prefix version pinned
  torch_prefix="$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
  py_prefix="$("$python" -c 'import sys; print(sys.prefix)')"
  version="$("$python" -c 'import torch; print(torch.__version__.split("+")[0])')"
  pinned="$(sed -n 's/^TORCH_VERSION="${PIPETUNE_TORCH_VERSION:-\([^}]*\)}"$/\1/p' scripts/setup.sh)"
  if [ "$version" != "$pinned" ]; then
    say "WARNING: this image has torch $version, scripts/setup.sh pins $pinned: pin $version so CI compiles what runs here"
  else
    say "torch $version, as scripts/setup.sh pins"
  fi
  # GPU-only build: the architectures of the GPU at hand, the GUI off.
  local arch
  arch="$("$python" -c 'import torch; c = torch.cuda.get_device_capability(0); print(f"{c[0]}.{c[1]}")' 2>/dev/null || echo 9.0)"
  if [ ! -f "$build/build.ninja" ]; then
    logged cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DPIPETUNE_WITH_QT=OFF -DPIPETUNE_WITH_TORCH=ON -DPIPETUNE_WITH_CUDA=ON \
      -DPIPETUNE_VENV="$py_prefix" -DTORCH_CUDA_ARCH_LIST="$arch" \
      -DCMAKE_PREFIX_PATH="$prefix/usr;$torch_prefix" ${PIPETUNE_CMAKE_ARGS:-} > "$work/logs/configure.log" ||
      { cat "$work/logs/configure.log"; fail "configure (see logs/configure.log)"; }
    grep -q 'pipetune: building.*cuda, cupti' "$work/logs/configure.log" ||
      { grep 'pipetune:' "$work/logs/configure.log"; fail "configure left out CUDA or CUPTI"; }
  fi
  grep 'pipetune:' "$work/logs/configure.log" | tee -a "$log" >&2
  # -k 0: every compile error of a first contact in one go, not only the first.
  # shellcheck disable=SC2086 # a list of targets
  logged cmake --build "$build" --parallel "$jobs" ${PIPETUNE_BUILD_TARGETS:+--target $PIPETUNE_BUILD_TARGETS} -- -k 0 \
    > "$work/logs/build.log" ||
    { tail -60 "$work/logs/build.log"; fail "build (see logs/build.log)"; }
  say "built in $build"
}

phase_test() {
  [ -x "$cli" ] || phase_build
  # Every GPU test must run here: a skip for want of a GPU is a failure.
  local rc=0
  PIPETUNE_REQUIRE_GPU=1 ctest --test-dir "$build" --output-on-failure \
    --timeout "${PIPETUNE_TEST_TIMEOUT:-600}" --parallel "$jobs" \
    --output-junit "$work/logs/tests.xml" > "$work/logs/tests.log" 2>&1 || rc=$?
  tail -25 "$work/logs/tests.log" | tee -a "$log"
  # The GPU tests by name, so the record says they ran (and did not skip).
  grep -E '(Gpu|Cuda|CUDA|Cupti)' "$work/logs/tests.log" | grep -E 'Test +#' | tee -a "$log" || true
  [ "$rc" -eq 0 ] || fail "tests (see logs/tests.log)"
  say "tests passed"
}

# name, model spec, batch: GPU-meaningful sizes for each zoo family.
gpu_models=(
  "gpt gpt:layers=8,width=1024,heads=16,seq=512,vocab=32000 16"
  "resnet resnet:blocks=8,channels=64,image=224,classes=1000 32"
  "mlp mlp:layers=8,width=8192 1024"
)

phase_profile() {
  [ -x "$cli" ] || phase_build
  local dir="$work/profiles"
  mkdir -p "$dir"
  for entry in "${gpu_models[@]}"; do
    read -r name spec batch <<< "$entry"
    for timer in cupti events; do
      say "profile $name ($spec, batch $batch) with --timer $timer"
      local started=$SECONDS
      logged "$cli" profile --model "$spec" --batch "$batch" --device cuda --timer "$timer" \
        --progress none -o "$dir/$name.$timer.profile.json" --hardware "$dir/$name.hardware.json" ||
        fail "profile $name --timer $timer"
      echo "$name $timer $((SECONDS - started))" >> "$dir/seconds.txt"
    done
    # The whole model as one stage, one micro-batch: its measured step against the layer sums.
    printf '{"format": "pipetune.plan/1", "balance": [%s], "chunks": 1, "checkpoint": "never", "schedule": "gpipe"}\n' \
      "$("$python" -c "import json,sys; print(len(json.load(open(sys.argv[1]))['layers']))" "$dir/$name.cupti.profile.json")" \
      > "$dir/$name.whole.plan.json"
    "$cli" run --model "$spec" --batch "$batch" --device cuda --plan "$dir/$name.whole.plan.json" \
      --steps 20 --warmup 3 --optimizer none --json > "$dir/$name.whole.run.json" 2>> "$log" ||
      fail "run $name as one stage"
  done
  logged "$python" bench/gpu/profile_check.py "$dir" | tee "$dir/profile_check.md"
}

# Smaller than the profile phase's models, so that every plan of the record runs many steps.
record_models=(
  "gpt gpt:layers=8,width=1024,heads=16,seq=256,vocab=8192 16"
  "resnet resnet:blocks=6,channels=64,image=112,classes=100 32"
  "mlp mlp:layers=8,width=4096 512"
)

# Plan SRC with every stage on cuda:0, written to DST: the stages take turns on the one GPU.
on_one_gpu() {
  "$python" -c '
import json, sys
plan = json.load(open(sys.argv[1]))
plan["devices"] = ["cuda:0"] * len(plan["balance"])
json.dump(plan, open(sys.argv[2], "w"), indent=2)' "$1" "$2"
}

phase_record() {
  [ -x "$cli" ] || phase_build
  local dir="$work/record"
  mkdir -p "$dir"
  for entry in "${record_models[@]}"; do
    read -r name spec batch <<< "$entry"
    local out="$dir/$name"
    mkdir -p "$out/plans"
    say "record $name: profile ($spec, batch $batch)"
    logged "$cli" profile --model "$spec" --batch "$batch" --device cuda --progress none \
      -o "$out/profile.json" --hardware "$out/hardware.json" || fail "profile $name for the record"
    # Every checkpoint mode, both schedules, chunk counts 2, 4, 8: the best 2-stage balance of
    # each (planned for two such GPUs), then both stages put on the one GPU.
    local plans=()
    for mode in never except_last always; do
      for schedule in gpipe 1f1b; do
        for chunks in 2 4 8; do
          local file="$out/plans/$mode-$schedule-$chunks.plan.json"
          "$cli" plan --profile "$out/profile.json" --devices 2 --chunks "$chunks" --checkpoint "$mode" \
            --schedule "$schedule" --top 1 -o "$file.two" > /dev/null || fail "plan $name $mode $schedule $chunks"
          on_one_gpu "$file.two" "$file"
          rm -f "$file.two"
          plans+=("$file")
        done
      done
    done
    say "record $name: validate ${#plans[@]} plans, both stages on cuda:0"
    local list
    list="$(IFS=,; echo "${plans[*]}")"
    logged "$cli" validate --model "$spec" --batch "$batch" --device cuda --devices 1 \
      --profile "$out/profile.json" --hardware "$out/hardware.json" --calibration-plans 0 \
      --plan "$list" --steps "${PIPETUNE_RECORD_STEPS:-20}" --warmup 2 --rounds "${PIPETUNE_RECORD_ROUNDS:-4}" --progress none --out "$out/validate" \
      > "$out/validate.txt" || fail "validate $name (see record/$name/validate.txt)"
    cat "$out/validate.txt" >> "$log"
  done
  logged "$python" bench/validation/record_table.py "$dir"/*/validate/report.json | tee "$dir/table.md"
}

# K stages really at once on the one GPU: stage k on share k of its SMs (CUDA green contexts,
# `--sm-partitions K`), profiled on one share, so the simulator's overlap and bubble are
# measured, not only each task's time. Each model also runs one plan with its stages taking
# turns on the whole GPU, for what the overlap is worth.
phase_partitions() {
  [ -x "$cli" ] || phase_build
  local dir="$work/partitions" shares="${PIPETUNE_SM_PARTITIONS:-2}"
  mkdir -p "$dir"
  for entry in "${record_models[@]}"; do
    read -r name spec batch <<< "$entry"
    local out="$dir/$name"
    mkdir -p "$out"
    say "partitions $name: profile ($spec, batch $batch) on 1 of $shares shares of the SMs"
    logged "$cli" profile --model "$spec" --batch "$batch" --device cuda --sm-partitions "$shares" \
      --progress none -o "$out/profile.json" || fail "profile $name on a share"
    for schedule in gpipe 1f1b; do
      for chunks in 2 4 8; do
        local stem="$out/$schedule-$chunks"
        "$cli" plan --profile "$out/profile.json" --devices "$shares" --chunks "$chunks" \
          --checkpoint never --schedule "$schedule" --top 1 -o "$stem.plan.json" > /dev/null 2>> "$log" ||
          fail "plan $name $schedule x$chunks for $shares shares"
        "$cli" simulate --profile "$out/profile.json" --plan "$stem.plan.json" --json \
          > "$stem.predicted.json" 2>> "$log" || fail "simulate $name $schedule x$chunks"
        "$cli" run --model "$spec" --batch "$batch" --device cuda --sm-partitions "$shares" \
          --plan "$stem.plan.json" --steps "${PIPETUNE_RECORD_STEPS:-20}" --warmup 2 --progress none \
          --json --trace "$stem.measured.trace.json" > "$stem.run.json" 2>> "$log" ||
          fail "run $name $schedule x$chunks on $shares shares (see gpu-check.log)"
      done
    done
    on_one_gpu "$out/1f1b-4.plan.json" "$out/1f1b-4.turns.plan.json"
    "$cli" run --model "$spec" --batch "$batch" --device cuda --plan "$out/1f1b-4.turns.plan.json" \
      --steps "${PIPETUNE_RECORD_STEPS:-20}" --warmup 2 --progress none --json \
      > "$out/1f1b-4.turns.run.json" 2>> "$log" || fail "run $name 1f1b x4, stages in turn"
  done
  logged "$python" bench/validation/partitions_table.py "$dir" | tee "$dir/table.md"
  # The same in one command, for the last model: validate on the shares, with its profile.
  say "partitions $name: validate --sm-partitions $shares (its 2 best plans)"
  logged "$cli" validate --model "$spec" --batch "$batch" --device cuda --sm-partitions "$shares" \
    --devices "$shares" --profile "$dir/$name/profile.json" --top 2 --steps 5 --warmup 2 \
    --calibration-plans 0 --progress none --out "$dir/validate-$name" ||
    fail "validate $name --sm-partitions $shares"
}

phase_bench() {
  [ -x "$cli" ] || phase_build
  local dir="$work/bench"
  mkdir -p "$dir"
  say "bench: executor overhead on cuda"
  logged "$build/bench/executor/pipetune_executor_bench" --device cuda 20 | tee "$dir/executor_overhead.txt" ||
    fail "executor bench"
  say "bench: against torch.distributed.pipelining on cuda"
  for width in 1024 4096; do
    logged "$python" bench/compare_torch_pipelining.py --pipetune "$cli" --device cuda --width "$width" \
      --batch 256 --chunks 8 --steps 30 | tee -a "$dir/torch_pipelining.txt" || fail "torch comparison"
  done
  say "bench: profiler speed"
  cat "$work/profiles/seconds.txt" 2>/dev/null | tee "$dir/profiler_seconds.txt" || true
}

phase_pack() {
  [ -n "${OUT:-}" ] || { say "pack: \$OUT is not set; results stay in $work"; return; }
  cp "$log" "$OUT/gpu-check.log" 2>/dev/null || true
  [ -f "$work/logs/tests.log" ] && xz -T0 -c "$work/logs/tests.log" > "$OUT/tests.log.xz"
  [ -f "$work/logs/machine.md" ] && cp "$work/logs/machine.md" "$OUT/machine.md"
  local what
  for what in profiles record partitions bench; do
    [ -d "$work/$what" ] && tar -C "$work" -cJf "$OUT/$what.tar.xz" "$what"
  done
  [ -f "$work/logs/build.log" ] && tail -200 "$work/logs/build.log" > "$OUT/build-tail.log"
  ls -la "$OUT" >&2
}

phases=("$@")
((${#phases[@]})) || phases=(kit build test profile record partitions bench)
machine_summary
status=0
for p in "${phases[@]}"; do
  case "$p" in
    kit | build | test | profile | record | partitions | bench | pack) ;;
    *) fail "unknown phase '$p' (kit, build, test, profile, record, partitions, bench, pack)" ;;
  esac
  started=$SECONDS
  say "== $p"
  if ! ( "phase_$p" ); then
    status=1
    say "phase $p failed after $((SECONDS - started)) s"
    [ "${PIPETUNE_KEEP_GOING:-0}" = 1 ] || break
    continue
  fi
  say "== $p took $((SECONDS - started)) s"
done
[ "${phases[*]}" = pack ] || phase_pack
exit "$status"
