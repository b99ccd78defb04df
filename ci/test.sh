#!/usr/bin/env bash
# Checks the structure (ci/check_structure.py), builds the release preset, builds and runs
# every test in the dev preset (Debug + ASan/UBSan) through ctest, the concurrency test under
# ThreadSanitizer (tsan preset), then the libFuzzer
# targets (clang + ASan/UBSan) for a bounded time; every build with -Werror.
# Installs its own dependencies first. FUZZ_SECONDS (default 60) is split
# between the fuzz targets; set it to 0 to skip fuzzing.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/install-deps.sh
JOBS=${JOBS:-$(nproc)}

# Structure first (seconds): layer crossings, file sizes, shader families with host files.
python3 ci/check_structure.py

# Every build warning-clean: -Werror in the dev build (tests run from it), the release
# build (what ci/demo.sh shows a new user) and the fuzz build below.
cmake --preset release -DSWITCHBOARD_WERROR=ON
cmake --build --preset release -j "$JOBS"
cmake --preset dev -DSWITCHBOARD_WERROR=ON
cmake --build --preset dev -j "$JOBS"
# Every op-harness case also runs on Vulkan through lavapipe (Mesa's CPU driver) and must
# match the CPU bit for bit; SWITCHBOARD_REQUIRE_VULKAN turns a missing device into a failure.
export VK_DRIVER_FILES=/usr/share/vulkan/icd.d/lvp_icd.x86_64.json
export SWITCHBOARD_TEST_DEVICES=vulkan SWITCHBOARD_REQUIRE_VULKAN=1
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp} MESA_SHADER_CACHE_DIR=${MESA_SHADER_CACHE_DIR:-$PWD/build/mesa_cache}
ctest --preset dev -j "$JOBS"

# The CLI driven as an attacker or an unlucky user would (hostile configs, weights, programs,
# prompts, output paths, concurrent exports) on the ASan/UBSan build: no crash, no hang, no
# half-written or mismatched output (tests/probe/cli_probe.py; --scale full: ~9,000 inputs).
python3 tests/probe/cli_probe.py --scale ci --bin build/dev/bin/switchboard --mem-limit-mb 0

# Many sessions on one program at once (CPU and lavapipe) under ThreadSanitizer: any race fails.
cmake --preset tsan -DSWITCHBOARD_WERROR=ON
cmake --build --preset tsan -j "$JOBS" --target concurrency_test
TSAN_OPTIONS="halt_on_error=1 suppressions=$PWD/tests/tsan.supp" build/tsan/tests/concurrency_test

FUZZ_SECONDS=${FUZZ_SECONDS:-60}
if [ "$FUZZ_SECONDS" -gt 0 ]; then
  cmake --preset fuzz -DSWITCHBOARD_WERROR=ON
  cmake --build --preset fuzz -j "$JOBS" --target program_fuzz safetensors_fuzz model_config_fuzz
  targets=(program_fuzz safetensors_fuzz model_config_fuzz)
  per=$(( FUZZ_SECONDS / ${#targets[@]} ))
  for t in "${targets[@]}"; do
    corpus_src="fuzz/corpus/${t%_fuzz}"
    work=$(mktemp -d)
    cp -r "$corpus_src"/. "$work"/
    echo "== fuzzing $t for ${per}s (seed corpus: $corpus_src)"
    log="$work.log"
    # libFuzzer prints a line per new input; show the tail on success, everything on failure.
    if ! "build/fuzz/fuzz/$t" -max_total_time="$per" -max_len=8192 -print_final_stats=1 "$work" > "$log" 2>&1; then
      cat "$log"
      echo "ci/test.sh: $t found a crash (reproducer written to the current directory)"
      exit 1
    fi
    tail -n 12 "$log"
    rm -rf "$work" "$log"
  done
fi
echo "ci/test.sh: all tests passed"
