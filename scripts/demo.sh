#!/usr/bin/env bash
# Sets up, builds and runs `pipetune demo`: the README's main job. It builds what the demo
# runs (the pipetune command and the GUI it tells you to open), not the tests, benches and
# fuzzers: scripts/test.sh builds those.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
PIPETUNE_TARGETS="pipetune pipetune-gui" scripts/build.sh
exec "${PIPETUNE_BUILD_DIR:-build}/cli/pipetune" demo "$@"
