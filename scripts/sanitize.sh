#!/usr/bin/env bash
# The sim/ and executor CPU tests under AddressSanitizer + UndefinedBehaviorSanitizer, and the
# executor's (threaded) tests under ThreadSanitizer, each in a build of its own (build-asan,
# build-tsan) with only what those tests need. .ci/run calls this after the normal suite.
#
#   scripts/sanitize.sh [asan|tsan]   (default: both)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh  # idempotent: seconds when everything is there

VENV="${PIPETUNE_VENV:-$HOME/.cache/pipetune/venv}"
jobs="${PIPETUNE_JOBS:-$(nproc)}"
which="${1:-all}"

configure() {  # DIR SANITIZERS
  if [ ! -f "$1/CMakeCache.txt" ]; then
    cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPIPETUNE_VENV="$VENV" \
      -DPIPETUNE_SANITIZE="$2" -DPIPETUNE_WITH_QT=OFF -DPIPETUNE_WITH_CUDA=OFF -DPIPETUNE_BUILD_BENCH=OFF
  fi
}

# A report is a failure: abort at the first one, with a stack.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:halt_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/scripts/tsan.supp"
export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp"

if [ "$which" = all ] || [ "$which" = asan ]; then
  configure build-asan "address,undefined"
  cmake --build build-asan --parallel "$jobs" --target pipetune_sim_tests pipetune_executor_tests
  echo "== ASan+UBSan: sim tests" >&2
  build-asan/tests/sim/pipetune_sim_tests --gtest_brief=1
  echo "== ASan+UBSan: executor tests" >&2
  build-asan/tests/executor/pipetune_executor_tests --gtest_brief=1
fi
if [ "$which" = all ] || [ "$which" = tsan ]; then
  configure build-tsan thread
  cmake --build build-tsan --parallel "$jobs" --target pipetune_executor_tests
  echo "== TSan: executor tests" >&2
  build-tsan/tests/executor/pipetune_executor_tests --gtest_brief=1
fi
