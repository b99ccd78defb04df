#!/usr/bin/env bash
# The main job: build the release preset and run `switchboard demo`.
# Installs its own dependencies first. Extra arguments go to `demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/install-deps.sh
cmake --preset release
cmake --build --preset release -j "${JOBS:-$(nproc)}" --target switchboard_cli
build/release/bin/switchboard demo --save build/release/demo "$@"
