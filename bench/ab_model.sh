#!/usr/bin/env bash
# A/B of `switchboard bench model` on one machine in one run: the variants alternate, ROUNDS
# times, each run printing one line (device, decode and prefill tok/s wall and GPU, dispatches
# a token), then each variant's medians. A variant is TAG or TAG:VAR=VALUE,VAR=VALUE (its
# environment: another library through LD_LIBRARY_PATH, SPIR-V from SWITCHBOARD_SPIRV_DIR
# (bench/spirv_variant.sh builds it), SWITCHBOARD_GPU_REPEAT, ...). A first unreported run
# warms the device.
# Usage: bench/ab_model.sh ROUNDS "BENCH MODEL ARGS" VARIANT [VARIANT ...]
#   e.g. bench/ab_model.sh 3 "--synthetic qwen3-30b-a3b --layers 8 --bits 4 --group-size 64
#        --prompt-len 512 --gen 64 --prefill-runs 1 --device vulkan" main new:SWITCHBOARD_SPIRV_DIR=/tmp/v
# SB: the CLI (default build/release/bin/switchboard).
set -euo pipefail
if [[ $# -lt 3 ]]; then
  sed -n '2,11p' "$0" >&2
  exit 2
fi
SB=${SB:-build/release/bin/switchboard}
ROUNDS=$1
read -r -a ARGS <<<"$2"
shift 2
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT

run() {  # run TAG [VAR=VALUE ...]: one bench, its JSON summarized into a line (and LOG)
  local tag=$1
  shift
  env "$@" "$SB" bench model "${ARGS[@]}" --json 2>&1 | python3 -c '
import json, sys
tag, text = sys.argv[1], sys.stdin.read()
try:
    j = json.loads(text[text.index("{"):text.rindex("}") + 1])
except ValueError:
    print(f"{tag}: no JSON: {text[-300:]!r}"); sys.exit(0)
keys = ["device", "decode_tok_s", "decode_gpu_tok_s", "prefill_tok_s", "prefill_gpu_tok_s",
        "dispatches_per_decode_token"]
print(json.dumps({"variant": tag, **{k: j.get(k) for k in keys}}))' "$tag"
}

variant_env() {  # TAG:VAR=VALUE,... -> VAR=VALUE words
  [[ $1 == *:* ]] && tr ',' '\n' <<<"${1#*:}" || true
}

first=$1
mapfile -t env0 < <(variant_env "$first")
run warm-up "${env0[@]}" >/dev/null
for _ in $(seq "$ROUNDS"); do
  for v in "$@"; do
    mapfile -t e < <(variant_env "$v")
    run "${v%%:*}" "${e[@]}" | tee -a "$LOG"
  done
done
python3 - "$LOG" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
for tag in dict.fromkeys(r["variant"] for r in rows):
    mine = [r for r in rows if r["variant"] == tag]
    med = {k: statistics.median(r[k] for r in mine if isinstance(r.get(k), (int, float)))
           for k in ("decode_tok_s", "decode_gpu_tok_s", "prefill_tok_s", "prefill_gpu_tok_s")
           if any(isinstance(r.get(k), (int, float)) for r in mine)}
    print(json.dumps({"variant": tag, "runs": len(mine), "devices": sorted({r["device"] for r in mine}),
                      "median": {k: round(v, 1) for k, v in med.items()}}))
PY
