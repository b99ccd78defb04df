#version 450
#extension GL_GOOGLE_include_directive : require
// Row normalizations along the last axis, in the order of docs/numerics.md; twin of
// cpu_fallback/norm.cpp. Thread -> output: invocation r computes row r (sequential
// over d: running max / sums in index order) and writes its words; rows are whole
// words when d is even for 16-bit dtypes, else two adjacent rows' threads would share
// a word, so the host runs 16-bit odd-d rows through an f32 temporary.
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { uint x[]; };
#ifdef RMS_NORM
layout(std430, binding = 1) readonly buffer W { uint w[]; };
layout(std430, binding = 2) buffer O { uint o[]; };
#else
layout(std430, binding = 1) buffer O { uint o[]; };
#endif
layout(push_constant) uniform Args { SB_NORM_ARGS } args;

float xin(uint r, uint i) { return SB_LOAD(x, args.dtype, r * args.d + i); }

// Writes element i of the output (f32 directly; 16-bit: read-modify-write of its word,
// safe because the row's words belong to this thread alone).
void put(uint i, float v) {
  if (args.out_dtype == SB_DT_F32) {
    o[i] = floatBitsToUint(v);
    return;
  }
  uint sh = (i & 1u) * 16u;
  o[i >> 1] = (o[i >> 1] & ~(0xffffu << sh)) | (sb_encode16(v, args.out_dtype) << sh);
}

void main() {
  uint r = sb_linear_id();
  if (r >= args.rows) return;
#ifdef SOFTMAX
  float m = xin(r, 0u);
  for (uint i = 0u; i < args.d; ++i) m = sb_max(m, xin(r, i));
  precise float sum = 0.0;
  for (uint i = 0u; i < args.d; ++i) {
    precise float d = xin(r, i) - m;
    sum = sum + sb_exp(d);
  }
  float inv = sb_rcp(sum);
  for (uint i = 0u; i < args.d; ++i) {
    precise float d = xin(r, i) - m;
    precise float p = sb_exp(d) * inv;
    put(r * args.d + i, p);
  }
#endif
#ifdef RMS_NORM
  precise float ss = 0.0;
  for (uint i = 0u; i < args.d; ++i) {
    float v = xin(r, i);
    ss = ss + v * v;
  }
  precise float ms = ss * args.inv_d + args.eps;
  float inv = sb_rsqrt(ms);
  for (uint i = 0u; i < args.d; ++i) {
    precise float v = (xin(r, i) * inv) * SB_LOAD(w, args.dtype, i);
    put(r * args.d + i, v);
  }
#endif
}
