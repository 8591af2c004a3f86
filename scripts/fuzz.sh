#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) in build-fuzz/ and runs each one for a fixed
# number of executions from a scratch copy of its seed corpus (fuzz/corpus/<target>/ stays as
# it is). Exits non-zero when any target finds a crash, leak, UBSan report, escaped exception or
# hang; the input that did it is kept under build-fuzz/fuzz-artifacts/.
#
#   PIPETUNE_FUZZ_RUNS     executions per target (default 1000000; batch_file, which goes through
#                          LibTorch's archive reader at a few hundred executions a second, 20000)
#   PIPETUNE_FUZZ_TARGETS  targets to run (default: all seven; batch_file needs the torch venv
#                          that scripts/setup.sh makes)
#   PIPETUNE_FUZZ_DIR      build folder (default build-fuzz)
#   PIPETUNE_JOBS          build jobs (default: the number of cores)
set -euo pipefail
cd "$(dirname "$0")/.."

targets="${PIPETUNE_FUZZ_TARGETS:-profile hardware plan trace cli_flags schedule_csv batch_file}"
venv="${PIPETUNE_VENV:-$HOME/.cache/pipetune/venv}"
build="${PIPETUNE_FUZZ_DIR:-build-fuzz}"
jobs="${PIPETUNE_JOBS:-$(nproc)}"

# Per target: its input size bound (JSON files and torch.save archives need room; a plan, a
# schedule or a command line does not), its executions, and its memory limits. batch_file runs
# fewer (LibTorch under ASan is slow) and gets more memory: LibTorch's unpickler reserves a
# string as long as the pickle says (up to 4 GiB) before it reads it, then refuses the short
# read; address space outside a sanitizer, but ASan shadows such a block with 512 MiB of real
# memory, so it gets room for two of them.
set_limits() {
  runs="${PIPETUNE_FUZZ_RUNS:-1000000}" rss_mb=2048 malloc_mb=2048
  case "$1" in
    profile | trace) max_len=65536 ;;
    hardware) max_len=16384 ;;
    batch_file) max_len=16384 runs="${PIPETUNE_FUZZ_RUNS:-20000}" rss_mb=6144 malloc_mb=4400 ;;
    plan | schedule_csv) max_len=4096 ;;
    *) max_len=1024 ;;
  esac
}

# LibTorch only for the batch-file target: the others build in seconds without it.
torch=OFF
[[ " $targets " == *" batch_file "* ]] && torch=ON
cmake -S . -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DPIPETUNE_FUZZ=ON \
  -DPIPETUNE_WITH_TORCH="$torch" -DPIPETUNE_VENV="$venv" -DPIPETUNE_WITH_QT=OFF -DPIPETUNE_WITH_CUDA=OFF \
  -DPIPETUNE_BUILD_TESTS=OFF -DPIPETUNE_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
build_targets=()
for t in $targets; do build_targets+=("${t}_fuzz"); done
cmake --build "$build" -j "$jobs" --target "${build_targets[@]}"

logs="$build/fuzz-logs"
artifacts="$build/fuzz-artifacts"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$logs" "$artifacts"

# LibTorch's own leaks on a malformed archive are suppressed (the file says which and why);
# pipetune's are findings.
export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp"
failed=0
summary=()
for t in $targets; do
  corpus="$scratch/$t"
  rm -rf "${artifacts:?}/$t"  # only this run's findings
  mkdir -p "$corpus" "$artifacts/$t"
  cp fuzz/corpus/"$t"/* "$corpus"/
  seeds=$(find "fuzz/corpus/$t" -type f | wc -l)
  log="$logs/$t.log"
  set_limits "$t"
  echo "== $t: $runs runs from $seeds seeds (log: $log)"
  status=0
  # A fresh TMPDIR per run: cli_flags_fuzz writes its fixture files there.
  TMPDIR="$scratch" "$build/fuzz/${t}_fuzz" -runs="$runs" -max_len="$max_len" -timeout=10 \
    -rss_limit_mb="$rss_mb" -malloc_limit_mb="$malloc_mb" -print_final_stats=1 \
    -artifact_prefix="$artifacts/$t/" "$corpus" \
    >"$log" 2>&1 || status=$?
  executed=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  seconds=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
  coverage=$(sed -n 's/^#[0-9]*.*DONE *cov: \([0-9]*\).*/\1/p' "$log" | tail -1)
  if [[ $status -eq 0 ]]; then
    result="ok"
  else
    failed=1
    crash=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
    result="FAILED (exit $status${crash:+, input $crash})"
    grep -m 5 -E 'ERROR:|runtime error:|uncaught exception|fuzz invariant|deadly signal' "$log" || true
  fi
  line="$t: ${executed:-?} executions in ${seconds:-?} s, ${rate:-?} exec/s, cov ${coverage:-?}: $result"
  echo "$line"
  summary+=("$line")
done

echo
echo "== fuzz summary"
printf '%s\n' "${summary[@]}"
exit "$failed"
