#version 450
#extension GL_GOOGLE_include_directive : require
// Cast between float dtypes (f32, f16, bf16); twin of cpu_fallback/cast.cpp.
// Thread -> output: invocation w writes output word w (1 or 2 elements).
#include "common.glsl"

layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { uint x[]; };
layout(std430, binding = 1) writeonly buffer O { uint o[]; };
layout(push_constant) uniform Args { SB_CAST_ARGS } args;

void main() {
  uint w = sb_linear_id();
  uint per = sb_per_word(args.to_dtype);
  uint i = w * per;
  if (i >= args.n) return;
  float lo = SB_LOAD(x, args.from_dtype, i);
  float hi = (per == 2u && i + 1u < args.n) ? SB_LOAD(x, args.from_dtype, i + 1u) : 0.0;
  o[w] = sb_encode_word(lo, hi, args.to_dtype);
}
