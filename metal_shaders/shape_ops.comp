// Kernel variants of this file, one line each (metal_shaders/README.md, "Variants"):
// SB_KERNEL(fill, FILL, "w", FillArgs, SB_FILL_ARGS, 256, 0)
// SB_KERNEL(region, REGION, "rb", RegionArgs, SB_REGION_ARGS, 256, 0)
// SB_KERNEL(region_at, REGION_AT, "rbr", RegionArgs, SB_REGION_ARGS, 256, 0)
// SB_KERNEL(transpose, TRANSPOSE, "rw", TransposeArgs, SB_TRANSPOSE_ARGS, 256, 0)
#version 450
#extension GL_GOOGLE_include_directive : require
// Data movement; twin of cpu_fallback/shape_ops.cpp.
//  FILL: every 32-bit word of out from a two-word pattern the host encoded (Full, any
//    dtype). Thread -> output: invocation w writes word w.
//  REGION: a strided block copy (Slice, Concat, SliceUpdate). Thread -> output:
//    invocation i owns dst word first_word + i and rewrites the units of it that lie in
//    the region, keeping the others, so rows that share a word never race. REGION_AT: the
//    same, the destination shifted by an input position read from `dyn` (SliceUpdate in a
//    recorded step).
//  TRANSPOSE: out = x with axes permuted (Transpose), as a gather over up to 8 merged
//    axes. Thread -> output: invocation i writes out word i (1/2/4-byte dtypes: the
//    elements packed in it), or element i (8-byte dtypes: its two words).
#include "common.glsl"

layout(local_size_x = 256) in;

#ifdef FILL
layout(std430, binding = 0) writeonly buffer O { uint o[]; };
layout(push_constant) uniform Args { SB_FILL_ARGS } args;

void main() {
  uint w = sb_linear_id();
  if (w >= args.words) return;
  o[w] = (w & 1u) == 0u ? args.pattern0 : args.pattern1;
}
#endif

#if defined(REGION) || defined(REGION_AT)
layout(std430, binding = 0) readonly buffer S { uint src[]; };
layout(std430, binding = 1) buffer D { uint dst[]; };
#ifdef REGION_AT
layout(std430, binding = 2) readonly buffer Dyn { uint dyn[]; };
#endif
layout(push_constant) uniform Args { SB_REGION_ARGS } args;

void main() {
  uint i = sb_linear_id();
  if (i >= args.words) return;
  uint per = 4u / args.unit_bytes, bits = args.unit_bytes * 8u;
#ifdef REGION_AT
  uint shift = dyn[args.dyn_word] * args.dyn_units;  // a multiple of per (host)
#else
  uint shift = 0u;
#endif
  uint w = args.first_word + shift / per + i, dst_off = args.dst_off + shift;
  uint mask = bits == 32u ? 0xffffffffu : ((1u << bits) - 1u);
  uint word = dst[w];
  for (uint s = 0u; s < per; ++s) {
    uint g = w * per + s;
    if (g < dst_off) continue;
    uint rel = g - dst_off;
    uint r = rel / args.dst_stride, c = rel % args.dst_stride;
    if (r >= args.outer || c >= args.len) continue;
    uint su = args.src_off + r * args.src_stride + c;
    uint v = (src[su / per] >> ((su % per) * bits)) & mask;
    word = (word & ~(mask << (s * bits))) | (v << (s * bits));
  }
  dst[w] = word;
}
#endif

#ifdef TRANSPOSE
layout(std430, binding = 0) readonly buffer S { uint src[]; };
layout(std430, binding = 1) writeonly buffer D { uint dst[]; };
layout(push_constant) uniform Args { SB_TRANSPOSE_ARGS } args;

// x's element index of out element g.
uint src_element(uint g) {
  uint off = 0u;
  for (int a = int(args.rank) - 1; a >= 0; --a) {
    uint d = args.dims[a];
    off += (g % d) * args.strides[a];
    g /= d;
  }
  return off;
}

void main() {
  uint i = sb_linear_id();
  if (i >= args.invocations) return;
  if (args.elem_bytes == 8u) {
    uint s = src_element(i);
    dst[2u * i] = src[2u * s];
    dst[2u * i + 1u] = src[2u * s + 1u];
    return;
  }
  uint per = 4u / args.elem_bytes, bits = args.elem_bytes * 8u;
  uint mask = bits == 32u ? 0xffffffffu : ((1u << bits) - 1u);
  uint word = 0u;
  for (uint s = 0u; s < per; ++s) {
    uint g = i * per + s;
    if (g >= args.numel) break;
    uint su = src_element(g);
    word |= ((src[su / per] >> ((su % per) * bits)) & mask) << (s * bits);
  }
  dst[i] = word;
}
#endif
