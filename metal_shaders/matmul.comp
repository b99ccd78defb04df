#version 450
#extension GL_GOOGLE_include_directive : require
// Matmul / linear and BatchMatmul with the dot32 order of docs/numerics.md (then +
// bias); twin of cpu_fallback/matmul.cpp. Thread -> output: workgroup w writes word w
// of out [batch, rows, cols] (1 or 2 elements); lane l keeps partial sum l over k = l, l+32, ...
// (product, then add), and the halving tree 16..1 combines them.
#include "common.glsl"

layout(local_size_x = 32) in;
layout(std430, binding = 0) readonly buffer A { uint a[]; };
layout(std430, binding = 1) readonly buffer B { uint b[]; };
layout(std430, binding = 2) readonly buffer Bias { uint bias[]; };
layout(std430, binding = 3) writeonly buffer O { uint o[]; };
layout(push_constant) uniform Args { SB_MATMUL_ARGS } args;

shared float s_part[32];
shared float s_out[2];

void dot32(uint e, uint slot) {
  uint lane = gl_LocalInvocationID.x;
  uint r = e / args.cols, c = e % args.cols;  // r: row over all batches
  uint boff = (r / args.rows / args.group) * args.cols * args.k;  // b's batch (grouped)
  precise float part = 0.0;
  // Eight (a, b) pairs loaded before they are used: one memory wait per eight terms.
  for (uint i0 = lane; i0 < args.k; i0 += 256u) {
    float av[8], bv[8];
    for (uint j = 0u; j < 8u; ++j) {
      uint i = i0 + 32u * j;
      uint bi = boff + (args.transpose_b != 0u ? c * args.k + i : i * args.cols + c);
      av[j] = i < args.k ? SB_LOAD(a, args.dtype, r * args.k + i) : 0.0;
      bv[j] = i < args.k ? SB_LOAD(b, args.b_dtype, bi) : 0.0;
    }
    for (uint j = 0u; j < 8u; ++j)
      if (i0 + 32u * j < args.k) part = part + av[j] * bv[j];
  }
  s_part[lane] = part;
  barrier();
  for (uint s = 16u; s >= 1u; s >>= 1) {
    if (lane < s) {
      precise float sum = s_part[lane] + s_part[lane + s];
      s_part[lane] = sum;
    }
    barrier();
  }
  if (lane == 0u) {
    precise float v = s_part[0];
    if (args.has_bias != 0u) v = v + SB_LOAD(bias, args.bias_dtype, c);
    s_out[slot] = v;
  }
  barrier();
}

void main() {
  uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  uint per = sb_per_word(args.dtype);
  uint i = wg * per;
  uint count = args.batch * args.rows * args.cols;
  if (i >= count) return;
  dot32(i, 0u);
  bool two = per == 2u && i + 1u < count;
  if (two) dot32(i + 1u, 1u);
  if (gl_LocalInvocationID.x == 0u) o[wg] = sb_encode_word(s_out[0], two ? s_out[1] : 0.0, args.dtype);
}
