#!/usr/bin/env bash
# Every test binary that runs pipetune's own code under the sanitizers, each kind in one build
# of its own, built once and used for every run of that kind:
#   build-asan (ASan + UBSan + LSan): the sim/ and planner tests and the executor's CPU tests;
#     the distributed tests, whose ranks (`pipetune run --distributed`, the rank helper) are
#     built there too, so every process they start is sanitized; and the GUI tests (model
#     library, widgets offscreen) when Qt is found.
#   build-tsan (TSan): the executor's tests, every one of which runs worker and copy threads.
# .ci/run calls this after the normal suite. Each phase prints its time.
#
#   scripts/sanitize.sh [asan|tsan]   (default: both)
#   PIPETUNE_SANITIZE_PARTS="sim executor"   which ASan runs (default: all four, "sim executor
#   distributed gui"; fewer for a quicker look: the distributed and GUI parts add the CLI, the
#   distributed library and the GUI to the ASan tree, docs/reliability.md, "CI's budget")
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/phase.sh
phase setup scripts/setup.sh  # idempotent: seconds when everything is there

VENV="${PIPETUNE_VENV:-$HOME/.cache/pipetune/venv}"
jobs="${PIPETUNE_JOBS:-$(nproc)}"
which="${1:-all}"
parts="${PIPETUNE_SANITIZE_PARTS:-sim executor distributed gui}"

# -g1 (line tables) is what a report's stack needs; -O1, as the sanitizers' own docs advise,
# compiles a quarter faster than -O2 (run_command.cpp under ASan: 37 s against 49 s) for runs
# that are a little slower. Only sim/ and its planner, whose tests are where a sanitized run
# spends its time, are built so: the tests' own sources and what drives LibTorch, Qt and processes
# (executor, CLI, GUI, ...) at -O0, which halves a test file's compile time under ASan and takes a
# third off a LibTorch one's. The benchmarks and CUDA are left out. Configured on every run (seconds
# when nothing changed), so that a tree made before a change of these flags takes it.
configure() {  # DIR SANITIZERS QT
  cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
    -DPIPETUNE_VENV="$VENV" -DPIPETUNE_SANITIZE="$2" -DPIPETUNE_WITH_QT="$3" \
    -DPIPETUNE_WITH_CUDA=OFF -DPIPETUNE_BUILD_BENCH=OFF -DPIPETUNE_TESTS_OPTIMIZE=-O0 \
    -DPIPETUNE_OUTSIDE_SIM_OPTIMIZE=-O0 >/dev/null
}
has_target() { cmake --build "$1" --target help | grep -q "^$2:"; }
wanted() { [[ " $parts " == *" $1 "* ]]; }

# A report is a failure: abort at the first one, with a stack. Child processes (ranks, the
# GUI's `pipetune run`) inherit these.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:halt_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/scripts/tsan.supp"
export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp"

run_one() {  # NAME: one sanitized test binary
  case "$1" in
    asan-sim) phase asan-sim build-asan/tests/sim/pipetune_sim_tests --gtest_brief=1 ;;
    asan-planner) phase asan-planner build-asan/tests/sim/planner/pipetune_planner_tests --gtest_brief=1 ;;
    asan-executor) phase asan-executor build-asan/tests/executor/pipetune_executor_tests --gtest_brief=1 ;;
    asan-distributed)
      phase asan-distributed build-asan/tests/distributed/pipetune_distributed_tests --gtest_brief=1 ;;
    asan-gui) phase asan-gui env QT_QPA_PLATFORM=offscreen build-asan/tests/gui/pipetune_gui_tests --gtest_brief=1 ;;
    tsan-executor) phase tsan-executor build-tsan/tests/executor/pipetune_executor_tests --gtest_brief=1 ;;
  esac
}
# lanes "A B" "C D": runs A then B beside C then D, and prints each lane's output when both have
# ended. The lanes' own phases print their times but stay out of the phase table, whose total
# would count their overlap twice. Fails if either lane does.
lanes() {
  local dir status=0 i
  dir="$(mktemp -d)"
  for i in 1 2; do
    local lane="${!i}"
    (
      PIPETUNE_PHASE_LOG=""
      for t in $lane; do run_one "$t" || exit; done
    ) >"$dir/$i.log" 2>&1 &
  done
  for i in 1 2; do wait -n || status=$?; done
  cat "$dir/1.log" "$dir/2.log" >&2
  rm -rf "$dir"
  return "$status"
}

# Both trees are built first, then the runs go two at a time: none of them keeps both cores
# busy for long. The planner's tests (one thread, minutes) beside the sim/, executor and GUI
# ones: 148-165 s against 257 s one after the other; then the distributed tests (three ranks
# each) beside TSan's executor tests: 107 s against 183 s (docs/reliability.md, "CI's budget").
first=() second=() third=() fourth=()
if [ "$which" = all ] || [ "$which" = asan ]; then
  phase asan-configure configure build-asan "address,undefined" AUTO
  targets=()
  if wanted sim; then
    targets+=(pipetune_sim_tests pipetune_planner_tests)
    first+=(asan-planner)
    second+=(asan-sim)
  fi
  if wanted executor; then
    targets+=(pipetune_executor_tests)
    second+=(asan-executor)
  fi
  if wanted distributed && has_target build-asan pipetune_distributed_tests; then
    targets+=(pipetune_distributed_tests)
    third+=(asan-distributed)
  fi
  if wanted gui && has_target build-asan pipetune_gui_tests; then
    targets+=(pipetune_gui_tests)
    second+=(asan-gui)
  fi
  phase asan-build cmake --build build-asan --parallel "$jobs" --target "${targets[@]}"
fi
if [ "$which" = all ] || [ "$which" = tsan ]; then
  phase tsan-configure configure build-tsan thread OFF
  phase tsan-build cmake --build build-tsan --parallel "$jobs" --target pipetune_executor_tests
  fourth+=(tsan-executor)
fi
phase sanitized-runs-1 lanes "${first[*]}" "${second[*]}"
phase sanitized-runs-2 lanes "${third[*]}" "${fourth[*]}"
