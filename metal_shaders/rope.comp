// Kernel variants of this file, one line each (metal_shaders/README.md, "Variants"):
// SB_KERNEL(rope, ROPE, "rrrw", RopeArgs, SB_ROPE_ARGS, 256, 0)
#version 450
#extension GL_GOOGLE_include_directive : require
// Rotary embedding (schema RopeNode), HF's rotate_half form; twin of cpu_fallback/rope.cpp.
// Thread -> output: invocation w writes output word w (1 or 2 elements, each computed alone).
#include "common.glsl"

layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { uint x[]; };
layout(std430, binding = 1) readonly buffer C { float cos_t[]; };
layout(std430, binding = 2) readonly buffer S { float sin_t[]; };
layout(std430, binding = 3) writeonly buffer O { uint o[]; };
layout(push_constant) uniform Args { SB_ROPE_ARGS } args;

float rnd(float v) { return sb_round_to(v, args.dtype); }

// Element i of the output: a rotated pair member, or x itself past the rotated dims.
float element(uint i) {
  uint r = i / args.hd, e = i % args.hd, base = r * args.hd, half_dims = args.half_dims;
  if (e >= 2u * half_dims) return SB_LOAD(x, args.dtype, i);
  uint f = e < half_dims ? e : e - half_dims, t = (args.pos + r / args.h) * half_dims + f;
  float c = rnd(cos_t[t]), s = rnd(sin_t[t]);
  float x1 = SB_LOAD(x, args.dtype, base + f), x2 = SB_LOAD(x, args.dtype, base + half_dims + f);
  precise float v;
  if (e < half_dims) {
    precise float a = x1 * c, b = x2 * s;
    v = rnd(a) - rnd(b);
  } else {
    precise float a = x2 * c, b = x1 * s;
    v = rnd(a) + rnd(b);
  }
  return v;
}

void main() {
  uint w = sb_linear_id();
  uint per = sb_per_word(args.dtype);
  uint i = w * per;
  if (i >= args.n) return;
  float lo = element(i);
  float hi = (per == 2u && i + 1u < args.n) ? element(i + 1u) : 0.0;
  o[w] = sb_encode_word(lo, hi, args.dtype);
}
