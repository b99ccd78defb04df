// Kernel variants of this file, one line each (metal_shaders/README.md, "Variants"):
// SB_KERNEL(gather_mm, GATHER_MM, "rrrrwb", GatherMmArgs, SB_GATHER_MM_ARGS, 32, 0)
#version 450
#extension GL_GOOGLE_include_directive : require
// GatherMm (float experts) with the dot32 order of docs/numerics.md; twin of
// cpu_fallback/gather_mm.cpp. Thread -> output: workgroup w writes word w of out
// [pairs, n] (1 or 2 elements); for each element, lane l keeps partial sum l
// (elements i = l, l+32, ... in order, product then add), then the halving tree
// s = 16..1 combines them exactly as the CPU does.
#include "common.glsl"

layout(local_size_x = 32) in;
layout(std430, binding = 0) readonly buffer X { uint x[]; };
layout(std430, binding = 1) readonly buffer Wt { uint w[]; };
layout(std430, binding = 2) readonly buffer L { int lhs[]; };
layout(std430, binding = 3) readonly buffer R { int rhs[]; };
layout(std430, binding = 4) writeonly buffer O { uint o[]; };
layout(std430, binding = 5) buffer E { uint err[]; };
layout(push_constant) uniform Args { SB_GATHER_MM_ARGS } args;

shared float s_part[32];
shared float s_out[2];

void dot32(uint e, uint slot) {
  uint lane = gl_LocalInvocationID.x;
  uint p = e / args.n, j = e % args.n;
  int ex = args.has_rhs != 0u ? rhs[p] : 0;
  int r = args.has_lhs != 0u ? lhs[p] : int(p * args.rows / args.pairs);
  if (ex < 0 || uint(ex) >= args.experts || r < 0 || uint(r) >= args.rows) {  // uniform
    if (lane == 0u) {
      atomicOr(err[0], SB_ERR_INDEX);
      s_out[slot] = 0.0;
    }
    return;
  }
  uint xb = uint(r) * args.k, wb = (uint(ex) * args.n + j) * args.k;
  precise float part = 0.0;
  for (uint i = lane; i < args.k; i += 32u) part = part + SB_LOAD(x, args.dtype, xb + i) * SB_LOAD(w, args.dtype, wb + i);
  s_part[lane] = part;
  barrier();
  for (uint s = 16u; s >= 1u; s >>= 1) {
    if (lane < s) {
      precise float sum = s_part[lane] + s_part[lane + s];
      s_part[lane] = sum;
    }
    barrier();
  }
  if (lane == 0u) s_out[slot] = s_part[0];
  barrier();
}

void main() {
  uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  uint per = sb_per_word(args.dtype);
  uint i = wg * per;
  uint count = args.pairs * args.n;
  if (i >= count) return;
  dot32(i, 0u);
  bool two = per == 2u && i + 1u < count;
  if (two) dot32(i + 1u, 1u);
  if (gl_LocalInvocationID.x == 0u) o[wg] = sb_encode_word(s_out[0], two ? s_out[1] : 0.0, args.dtype);
}
