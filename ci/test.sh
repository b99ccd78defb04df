#!/usr/bin/env bash
# Builds and runs every test: the dev preset (Debug + ASan/UBSan) through ctest,
# then the libFuzzer targets (clang + ASan/UBSan) for a bounded time.
# Installs its own dependencies first. FUZZ_SECONDS (default 60) is split
# between the fuzz targets; set it to 0 to skip fuzzing.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/install-deps.sh
JOBS=${JOBS:-$(nproc)}

cmake --preset dev
cmake --build --preset dev -j "$JOBS"
ctest --preset dev -j "$JOBS"

FUZZ_SECONDS=${FUZZ_SECONDS:-60}
if [ "$FUZZ_SECONDS" -gt 0 ]; then
  cmake --preset fuzz
  cmake --build --preset fuzz -j "$JOBS" --target program_fuzz safetensors_fuzz
  targets=(program_fuzz safetensors_fuzz)
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
