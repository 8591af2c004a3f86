#!/usr/bin/env bash
# Sets up, builds and runs every test. This is what .ci/run calls. Each phase prints its time.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/phase.sh

phase setup scripts/setup.sh
phase format scripts/format-check.sh
phase build scripts/build.sh
phase tests ctest --test-dir "${PIPETUNE_BUILD_DIR:-build}" --output-on-failure --timeout 600 \
  --parallel "${PIPETUNE_JOBS:-$(nproc)}"
