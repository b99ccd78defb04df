#!/usr/bin/env bash
# Peak memory of an export (issue #19 item 7): runs `switchboard export ARGS...`, samples the
# process's RssAnon / RssFile from /proc every 0.1 s, then times `inspect --verify` on the
# result. One JSON line. Example (17.7 GB, needs ~18 GB of disk):
#   bench/export_memory.sh build/release/bin/switchboard /tmp/q3 \
#       --synthetic qwen3-30b-a3b --bits 4 --group-size 64 --dtype bf16 --max-seq 640
set -euo pipefail
sb=$1 out=$2
shift 2
t0=$(date +%s.%N)
"$sb" export "$@" --out "$out" > /dev/null 2>&1 &
pid=$!
peak_anon=0 peak_file=0
while kill -0 "$pid" 2> /dev/null; do
  read -r a f < <(awk '/RssAnon/{a=$2} /RssFile/{f=$2} END{print a+0, f+0}' "/proc/$pid/status" 2> /dev/null || echo "0 0")
  [ "$a" -gt "$peak_anon" ] && peak_anon=$a
  [ "$f" -gt "$peak_file" ] && peak_file=$f
  sleep 0.1
done
wait "$pid"
t1=$(date +%s.%N)
"$sb" inspect --verify "$out" > /dev/null
t2=$(date +%s.%N)
largest=$(python3 - "$out/weights.safetensors" << 'PY'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n))
print(max(e["data_offsets"][1] - e["data_offsets"][0] for k, e in h.items() if k != "__metadata__"))
PY
)
printf '{"bench":"export_memory","device":"host CPU (export runs on the host)","weights_bytes":%s,"largest_tensor_bytes":%s,"peak_rss_anon_bytes":%s,"peak_rss_file_bytes":%s,"export_s":%.2f,"verify_s":%.2f}\n' \
  "$(stat -c %s "$out/weights.safetensors")" "$largest" $((peak_anon * 1024)) $((peak_file * 1024)) \
  "$(echo "$t1 - $t0" | bc)" "$(echo "$t2 - $t1" | bc)"
