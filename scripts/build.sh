#!/usr/bin/env bash
# Configures (once) and builds pipetune into ./build. Extra arguments go to CMake's configure
# step, e.g. scripts/build.sh -DPIPETUNE_WITH_QT=OFF.
#
# Environment:
#   PIPETUNE_TARGETS  build only these targets (those this configuration has; demo.sh builds
#                     "pipetune pipetune-gui"), instead of everything with the tests
#   PIPETUNE_JOBS     parallel compile jobs (default: the cores)
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR="${PIPETUNE_BUILD_DIR:-build}"
VENV="${PIPETUNE_VENV:-$HOME/.cache/pipetune/venv}"

args=(-G Ninja -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-Release}" -DPIPETUNE_VENV="$VENV")
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ] || (($#)); then
  cmake -S . -B "$BUILD_DIR" "${args[@]}" "$@"
fi
targets=()
if [ -n "${PIPETUNE_TARGETS:-}" ]; then
  # A target the configuration left out (the GUI without Qt) is skipped, not an error.
  known="$(cmake --build "$BUILD_DIR" --target help)"
  for t in $PIPETUNE_TARGETS; do
    if grep -q "^$t:" <<<"$known"; then targets+=(--target "$t"); fi
  done
fi
cmake --build "$BUILD_DIR" --parallel "${PIPETUNE_JOBS:-$(nproc)}" "${targets[@]}"
