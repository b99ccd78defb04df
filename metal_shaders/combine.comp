#version 450
#extension GL_GOOGLE_include_directive : require
// Weighted combine of expert outputs with an optional (sigmoid-gated) shared
// expert; twin of cpu_fallback/combine.cpp. Slots are added in order 0..k-1.
// Thread -> output: invocation w writes word w of out [T, D] (1 or 2 elements).
#include "common.glsl"

layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer Y { uint y[]; };
layout(std430, binding = 1) readonly buffer W { float weights[]; };
layout(std430, binding = 2) readonly buffer S { uint shared_x[]; };
layout(std430, binding = 3) readonly buffer Gt { uint gate[]; };
layout(std430, binding = 4) writeonly buffer O { uint o[]; };
layout(push_constant) uniform Args { SB_COMBINE_ARGS } args;

float combine(uint i) {
  uint t = i / args.dim, d = i % args.dim;
  precise float acc = 0.0;
  if (args.has_shared != 0u) {
    float s = SB_LOAD(shared_x, args.shared_dtype, i);
    if (args.has_gate != 0u) {
      float sg = sb_sigmoid(SB_LOAD(gate, args.gate_dtype, t));
      acc = sg * s;
    } else {
      acc = s;
    }
  }
  for (uint j = 0u; j < args.slots; ++j) {
    uint p = t * args.slots + j;
    acc = acc + weights[p] * SB_LOAD(y, args.dtype, p * args.dim + d);
  }
  return acc;
}

void main() {
  uint w = sb_linear_id();
  uint per = sb_per_word(args.dtype);
  uint i = w * per;
  uint count = args.tokens * args.dim;
  if (i >= count) return;
  float lo = combine(i);
  float hi = (per == 2u && i + 1u < count) ? combine(i + 1u) : 0.0;
  o[w] = sb_encode_word(lo, hi, args.dtype);
}
