#!/usr/bin/env bash
# Sets up, builds and runs every test. This is what .ci/run calls.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
scripts/build.sh
ctest --test-dir "${PIPETUNE_BUILD_DIR:-build}" --output-on-failure --timeout 600 \
  --parallel "${PIPETUNE_JOBS:-$(nproc)}"
