#!/usr/bin/env bash
# Kernels that stamp each workgroup's start and end, for SWITCHBOARD_GPU_TIMELINE=FILE with
# SWITCHBOARD_SPIRV_DIR=OUT_DIR (Vulkan; VK_KHR_shader_clock): thread 0 of every workgroup appends
# (kernel id | phase << 16, workgroup, workgroups, device clock lo/hi, SM clock lo/hi, 0) at its
# start (phase 0) and after its own return (phase 1). bench/timeline.py reads FILE with
# OUT_DIR/timeline_ids.txt. The stamps cost a few atomics a workgroup: read shapes, not µs.
# Usage: bench/gpu_timeline.sh OUT_DIR [KERNEL ...]   (default: every kernel variant)
set -euo pipefail
if [[ $# -lt 1 ]]; then
  sed -n '2,7p' "$0" >&2
  exit 2
fi
out=$(realpath -m "$1")
shift
here=$(cd "$(dirname "$0")" && pwd)
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
cp "$here/../metal_shaders/"*.comp "$here/../metal_shaders/"*.glsl "$here/../metal_shaders/"*.h "$src/"
mkdir -p "$out"
: >"$out/timeline_ids.txt"
id=0
for comp in "$here/../metal_shaders/"*.comp; do
  stem=$(basename "$comp" .comp)
  # The kernel's text without its #version line, between the stamps' prologue and epilogue.
  grep -v '^#version' "$comp" >"$src/$stem.body"
  while IFS= read -r line; do
    [[ $line =~ ^//\ SB_KERNEL\(([a-z0-9_]+),\ ([A-Z0-9_]+),\ (.*)\)$ ]] || continue
    name=${BASH_REMATCH[1]} define=${BASH_REMATCH[2]} rest=${BASH_REMATCH[3]}
    id=$((id + 1))
    if [[ $# -gt 0 ]] && ! printf '%s\n' "$@" | grep -qx "$name"; then continue; fi
    cat >"$src/$stem.tl.comp" <<GLSL
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_realtime_clock : require
#extension GL_ARB_shader_clock : require
#define main sb_timeline_kernel_main
#include "$stem.body"
#undef main
layout(std430, binding = 16) buffer SbTimeline { uint sb_tl[]; };
void sb_tl_stamp(uint phase) {
  uvec2 rt = clockRealtime2x32EXT(), ck = clock2x32ARB();
  uint b = 8u + 8u * atomicAdd(sb_tl[0], 1u);
  if (b + 8u > uint(sb_tl.length())) return;
  sb_tl[b] = $id | (phase << 16);
  sb_tl[b + 1u] = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  sb_tl[b + 2u] = gl_NumWorkGroups.x * gl_NumWorkGroups.y;
  sb_tl[b + 3u] = rt.x; sb_tl[b + 4u] = rt.y; sb_tl[b + 5u] = ck.x; sb_tl[b + 6u] = ck.y; sb_tl[b + 7u] = 0u;
}
void main() {
  if (gl_LocalInvocationIndex == 0u) sb_tl_stamp(0u);
  sb_timeline_kernel_main();
  if (gl_LocalInvocationIndex == 0u) sb_tl_stamp(1u);
}
GLSL
    opt=()
    [[ $rest =~ F_MMA|F_DOT ]] && opt=(vulkan-only)
    if "$here/spirv_variant.sh" "$src" "$out" "$name" "$stem.tl" "$define" "${opt[@]}" >"$src/err" 2>&1; then
      echo "$id $name" >>"$out/timeline_ids.txt"
    else
      echo "gpu_timeline: $name did not build (left out): $(head -c 600 "$src/err")" >&2
    fi
  done <"$comp"
done
echo "$(wc -l <"$out/timeline_ids.txt") kernels in $out"
