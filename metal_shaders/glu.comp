#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// Gated activations (SwiGLU, GEGLU, clamped SwiGLU); twin of cpu_fallback/glu.cpp.
// Thread -> output: GLU: invocation w writes output word w (1 or 2 elements); GLU16
// (bindings at 16-byte aligned offsets, the host checks): invocation v writes 16-byte
// unit v (4 or 8 elements, each from its own independent chain of steps).
#include "common.glsl"

layout(local_size_x = 256) in;
#ifdef GLU16
layout(std430, binding = 0) readonly buffer G { uvec4 g4[]; };
layout(std430, binding = 1) readonly buffer U { uvec4 u4[]; };
layout(std430, binding = 2) writeonly buffer O { uvec4 o4[]; };
#else
layout(std430, binding = 0) readonly buffer G { uint g[]; };
layout(std430, binding = 1) readonly buffer U { uint u[]; };
layout(std430, binding = 2) writeonly buffer O { uint o[]; };
#endif
layout(push_constant) uniform Args { SB_GLU_ARGS } args;

#ifdef GLU16
void main() {
  uint v = sb_linear_id();
  uint per = sb_per_word(args.dtype), n = 4u * per;  // elements per unit
  if (v * n >= args.n) return;
  uvec4 gw = g4[v], uw = u4[v];
  float r[8];
  [[unroll]] for (uint e = 0u; e < 8u; ++e) {
    r[e] = 0.0;
    if (e < n && v * n + e < args.n)
      r[e] = sb_glu(sb_decode(gw[e / per], args.dtype, e), sb_decode(uw[e / per], args.dtype, e), args.kind, args.alpha,
                    args.limit);
  }
  uvec4 out_words;
  [[unroll]] for (uint c = 0u; c < 4u; ++c)
    out_words[c] = per == 2u ? sb_encode_word(r[2u * c], r[2u * c + 1u], args.dtype) : floatBitsToUint(r[c]);
  o4[v] = out_words;
}
#else
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
#endif
