#!/usr/bin/env bash
# The main job: build the release preset, export the tiny test model (4-bit) and run it:
# greedy tokens from prompt ids, on the CPU and (where a Vulkan device exists) on Vulkan,
# then validate the two side by side. Installs its own dependencies first.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/install-deps.sh
cmake --preset release
cmake --build --preset release -j "${JOBS:-$(nproc)}" --target switchboard_cli
sb=build/release/bin/switchboard
$sb export --tiny-test --bits 4 --out build/release/tiny
$sb run --program build/release/tiny --prompt-ids 1,2,3,4,5 --max-new-tokens 16
$sb run --program build/release/tiny --prompt-ids 1,2,3,4,5 --max-new-tokens 16 --device vulkan
$sb validate --program build/release/tiny --device cpu --device-b vulkan --prompt-ids 1,2,3,4,5 --max-new-tokens 16
