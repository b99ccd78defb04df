// Kernel variants of this file, one line each (metal_shaders/README.md, "Variants"):
// SB_KERNEL(combine, COMBINE, "rrrrw", CombineArgs, SB_COMBINE_ARGS, 256, 0)
// SB_KERNEL(combine16, COMBINE16, "rrrrw", CombineArgs, SB_COMBINE_ARGS, 256, 0)
// SB_KERNEL(combine_rows, COMBINE_ROWS, "rrrrwr", CombineArgs, SB_COMBINE_ARGS, 256, 0)
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// Weighted combine of expert outputs with an optional (sigmoid-gated) shared
// expert; twin of cpu_fallback/combine.cpp. Slots are added in order 0..k-1.
// Thread -> output: COMBINE: invocation w writes word w of out [T, D] (1 or 2
// elements); COMBINE16 (rows of whole 16-byte units, y and out bound at 16-byte aligned
// offsets: the host checks): invocation u writes 16-byte unit u (4 or 8 elements).
// COMBINE_ROWS: COMBINE16 reading row p of y at rows[p] (a fused ScatterRows: y's rows
// by the inverse permutation, which invert_permutation checked).
#include "common.glsl"

layout(local_size_x = 256) in;
#ifdef COMBINE_ROWS
#define COMBINE16
layout(std430, binding = 5) readonly buffer R { uint rows[]; };
#endif
#ifdef COMBINE16
layout(std430, binding = 0) readonly buffer Y { uvec4 y4[]; };
#else
layout(std430, binding = 0) readonly buffer Y { uint y[]; };
#endif
layout(std430, binding = 1) readonly buffer W { float weights[]; };
layout(std430, binding = 2) readonly buffer S { uint shared_x[]; };
layout(std430, binding = 3) readonly buffer Gt { uint gate[]; };
#ifdef COMBINE16
layout(std430, binding = 4) writeonly buffer O { uvec4 o4[]; };
#else
layout(std430, binding = 4) writeonly buffer O { uint o[]; };
#endif
layout(push_constant) uniform Args { SB_COMBINE_ARGS } args;

// The base of element i of token t: sigmoid(gate) * shared, shared, or +0.
float combine_base(uint i, uint t) {
  if (args.has_shared == 0u) return 0.0;
  float s = SB_LOAD(shared_x, args.shared_dtype, i);
  if (args.has_gate == 0u) return s;
  precise float g = sb_sigmoid(SB_LOAD(gate, args.gate_dtype, t)) * s;
  return g;
}

#ifdef COMBINE16
void main() {
  uint u = sb_linear_id();
  uint per = sb_per_word(args.dtype), n = 4u * per;  // elements per unit
  if (u >= args.tokens * args.dim / n) return;
  uint i0 = u * n, t = i0 / args.dim, d = i0 - t * args.dim;
  precise float acc[8];
  [[unroll]] for (uint e = 0u; e < 8u; ++e) acc[e] = e < n ? combine_base(i0 + e, t) : 0.0;
  for (uint j = 0u; j < args.slots; ++j) {
    uint p = t * args.slots + j;
    float w = weights[p];
#ifdef COMBINE_ROWS
    uint r = rows[p];
    uvec4 v = r < args.tokens * args.slots ? y4[(r * args.dim + d) / n] : uvec4(0u);  // else: an error was raised
#else
    uvec4 v = y4[(p * args.dim + d) / n];
#endif
    [[unroll]] for (uint e = 0u; e < 8u; ++e) {
      if (e < n) acc[e] = acc[e] + w * sb_decode(v[e / per], args.dtype, e);
    }
  }
  uvec4 out_words;
  [[unroll]] for (uint c = 0u; c < 4u; ++c)
    out_words[c] = per == 2u ? sb_encode_word(acc[2u * c], acc[2u * c + 1u], args.dtype) : floatBitsToUint(acc[c]);
  o4[u] = out_words;
}
#else
void main() {
  uint w = sb_linear_id();
  uint per = sb_per_word(args.dtype);
  uint i = w * per;
  uint count = args.tokens * args.dim;
  if (i >= count) return;
  // The word's elements i and i + 1 (f16/bf16) may lie in two rows (odd D).
  float out2[2] = float[2](0.0, 0.0);
  [[unroll]] for (uint h = 0u; h < 2u; ++h) {
    uint ih = i + h;
    if (h < per && ih < count) {
      uint t = ih / args.dim, d = ih - t * args.dim;
      precise float acc = combine_base(ih, t);
      for (uint j = 0u; j < args.slots; ++j) {
        uint p = t * args.slots + j;
        acc = acc + weights[p] * SB_LOAD(y, args.dtype, p * args.dim + d);
      }
      out2[h] = acc;
    }
  }
  o[w] = sb_encode_word(out2[0], out2[1], args.dtype);
}
#endif
