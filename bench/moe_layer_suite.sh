#!/usr/bin/env bash
# Runs `switchboard bench moe-layer` for every configuration recorded in
# bench/RESULTS.md, each REPEAT times (default 3), and prints one JSON line per
# configuration with the median ms_per_layer (and that run's other fields).
# Usage: bench/moe_layer_suite.sh [build/release/bin/switchboard] [decode|prefill|mixed|cutoff|all]
set -euo pipefail
BIN=${1:-build/release/bin/switchboard}
WHAT=${2:-all}
REPEAT=${REPEAT:-3}

median_run() {
  for _ in $(seq "$REPEAT"); do "$BIN" bench moe-layer "$@" --json; done |
    python3 -c 'import json,sys; r=sorted((json.loads(l) for l in sys.stdin), key=lambda d: d["ms_per_layer"]); print(json.dumps(r[len(r)//2]))'
}

if [[ $WHAT == decode || $WHAT == all ]]; then
  for model in qwen3-30b-a3b olmoe granite-1b-a400m; do median_run --model "$model" --tokens 1; done
  median_run --tokens 1 --sorted always
  median_run --tokens 1 --sorted never
fi
if [[ $WHAT == prefill || $WHAT == all ]]; then
  median_run --tokens 512 --iterations 6
  median_run --tokens 512 --iterations 6 --sorted never
fi
if [[ $WHAT == mixed || $WHAT == all ]]; then
  median_run --tokens 1 --mixed 8:0.05,4:0.80,2:0.15
  median_run --tokens 1 --bits 4
fi
if [[ $WHAT == cutoff || $WHAT == all ]]; then
  for m in 2 4 5 6 7 8 12 16; do
    median_run --tokens "$m" --sorted always
    median_run --tokens "$m" --sorted never
  done
fi
