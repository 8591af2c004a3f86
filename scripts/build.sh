#!/usr/bin/env bash
# Configures (once) and builds pipetune into ./build. Extra arguments go to CMake's configure
# step, e.g. scripts/build.sh -DPIPETUNE_WITH_QT=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR="${PIPETUNE_BUILD_DIR:-build}"
VENV="${PIPETUNE_VENV:-$HOME/.cache/pipetune/venv}"

args=(-G Ninja -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-Release}" -DPIPETUNE_VENV="$VENV")
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ] || (($#)); then
  cmake -S . -B "$BUILD_DIR" "${args[@]}" "$@"
fi
cmake --build "$BUILD_DIR" --parallel "${PIPETUNE_JOBS:-$(nproc)}"
