// Kernel variants of this file, one line each (metal_shaders/README.md, "Variants"):
// SB_KERNEL(glu, GLU, "rrw", GluArgs, SB_GLU_ARGS, 256, 0)
#version 450
#extension GL_GOOGLE_include_directive : require
// Gated activations (SwiGLU, GEGLU, clamped SwiGLU); twin of cpu_fallback/glu.cpp.
// Thread -> output: invocation w writes output word w (1 or 2 elements).
#include "common.glsl"

layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer G { uint g[]; };
layout(std430, binding = 1) readonly buffer U { uint u[]; };
layout(std430, binding = 2) writeonly buffer O { uint o[]; };
layout(push_constant) uniform Args { SB_GLU_ARGS } args;

float glu(uint i) {
  return sb_glu(SB_LOAD(g, args.dtype, i), SB_LOAD(u, args.dtype, i), args.kind, args.alpha, args.limit);
}

void main() {
  uint w = sb_linear_id();
  uint per = sb_per_word(args.dtype);
  uint i = w * per;
  if (i >= args.n) return;
  float lo = glu(i);
  float hi = (per == 2u && i + 1u < args.n) ? glu(i + 1u) : 0.0;
  o[w] = sb_encode_word(lo, hi, args.dtype);
}
