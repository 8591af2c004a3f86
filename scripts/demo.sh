#!/usr/bin/env bash
# Sets up, builds and runs `pipetune demo`: the README's main job.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
scripts/build.sh
exec "${PIPETUNE_BUILD_DIR:-build}/cli/pipetune" demo "$@"
