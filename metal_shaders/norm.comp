#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// Row normalizations along the last axis, in the order of docs/numerics.md; twin of
// cpu_fallback/norm.cpp. Thread -> output: invocation r computes row r (sequential
// over d: running max / sums in index order) and writes its words; rows are whole
// words when d is even for 16-bit dtypes, else two adjacent rows' threads would share
// a word, so the host runs 16-bit odd-d rows through an f32 temporary.
// SOFTMAX_ROW / RMS_NORM_ROW (d <= SB_NORM_ROW_MAX): workgroup g computes row g; its
// 256 threads stage the row's terms (exps, squares) in shared memory and write the
// outputs, invocation t the row's words t, t + 256, ...; thread 0 alone adds the terms,
// in index order, so the bits are the sequential kernel's.
#include "common.glsl"
#ifdef SOFTMAX_ROW
#define SOFTMAX
#define SB_ROW
#endif
#ifdef RMS_NORM_ROW
#define RMS_NORM
#define SB_ROW
#endif

#ifdef SB_ROW
const uint kRow = 256u;  // threads per row (the kernel table's local size)
layout(local_size_x = 256) in;
#else
layout(local_size_x = 64) in;
#endif
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

#ifdef SB_ROW
shared vec4 terms4[SB_NORM_ROW_MAX / 4];  // vec4: the adding thread loads 16 bytes at a time
shared float part[kRow];
#define TERM(i) terms4[(i) >> 2u][(i)&3u]

#define SB_ADD4(s, v) \
  s = s + v.x;        \
  s = s + v.y;        \
  s = s + v.z;        \
  s = s + v.w;

// terms 0, 1, ..., d-1 added left to right. Software-pipelined: the next 16 terms load
// while these 16 add, so the one thread waits on the adds' latency, not on shared memory.
float sum_in_order(uint d) {
  precise float s = 0.0;
  uint i = 0u;
  if (d >= 16u) {
    vec4 a0 = terms4[0], a1 = terms4[1], a2 = terms4[2], a3 = terms4[3];
    for (; i + 32u <= d; i += 16u) {
      uint q = (i + 16u) >> 2u;
      vec4 b0 = terms4[q], b1 = terms4[q + 1u], b2 = terms4[q + 2u], b3 = terms4[q + 3u];
      SB_ADD4(s, a0)
      SB_ADD4(s, a1)
      SB_ADD4(s, a2)
      SB_ADD4(s, a3)
      a0 = b0;
      a1 = b1;
      a2 = b2;
      a3 = b3;
    }
    SB_ADD4(s, a0)
    SB_ADD4(s, a1)
    SB_ADD4(s, a2)
    SB_ADD4(s, a3)
    i += 16u;
  }
  for (; i < d; ++i) s = s + TERM(i);
  return s;
}

// Word w of row r: one f32, or two 16-bit elements (the host sends odd-d 16-bit rows
// through f32, so a row's words are its own).
void put_word(uint r, uint k, float lo, float hi) {
  if (args.out_dtype == SB_DT_F32) {
    o[r * args.d + k] = floatBitsToUint(lo);
    return;
  }
  o[(r * args.d) / 2u + k] = sb_encode16(lo, args.out_dtype) | (sb_encode16(hi, args.out_dtype) << 16);
}

// x[r, i0 + j*kRow] for j < 8 (past the row: the row's last element, which callers skip):
// eight loads in flight per thread, at clamped indices so no branch holds one back.
void load8(uint r, uint i0, out float v[8]) {
  [[unroll]] for (uint j = 0u; j < 8u; ++j) v[j] = xin(r, min(i0 + j * kRow, args.d - 1u));
}

void main() {
  uint r = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (r >= args.rows) return;  // uniform across the workgroup
  uint t = gl_LocalInvocationID.x;
  uint per = args.out_dtype == SB_DT_F32 ? 1u : 2u, words = args.d / per;
  float v[8];
#ifdef SOFTMAX
  float m = xin(r, 0u);  // max is order-free: any grouping gives the sequential result
  for (uint i0 = t; i0 < args.d; i0 += 8u * kRow) {
    load8(r, i0, v);
    [[unroll]] for (uint j = 0u; j < 8u; ++j)
      if (i0 + j * kRow < args.d) m = sb_max(m, v[j]);
  }
  part[t] = m;
  barrier();
  if (t == 0u) {
    for (uint j = 1u; j < kRow; ++j) m = sb_max(m, part[j]);
    part[0] = m;
  }
  barrier();
  m = part[0];
  for (uint i0 = t; i0 < args.d; i0 += 8u * kRow) {
    load8(r, i0, v);
    [[unroll]] for (uint j = 0u; j < 8u; ++j) {
      uint i = i0 + j * kRow;
      precise float d = v[j] - m;
      if (i < args.d) TERM(i) = sb_exp(d);
    }
  }
  barrier();
  if (t == 0u) part[0] = sb_rcp(sum_in_order(args.d));
  barrier();
  float inv = part[0];
  for (uint k = t; k < words; k += kRow) {
    precise float lo = TERM(k * per) * inv;
    precise float hi = per == 2u ? TERM(k * per + 1u) * inv : 0.0;
    put_word(r, k, lo, hi);
  }
#endif
#ifdef RMS_NORM
  for (uint i0 = t; i0 < args.d; i0 += 8u * kRow) {
    load8(r, i0, v);
    [[unroll]] for (uint j = 0u; j < 8u; ++j) {
      uint i = i0 + j * kRow;
      precise float sq = v[j] * v[j];
      if (i < args.d) TERM(i) = sq;
    }
  }
  barrier();
  if (t == 0u) {
    precise float ms = sum_in_order(args.d) * args.inv_d + args.eps;
    part[0] = sb_rsqrt(ms);
  }
  barrier();
  float inv = part[0];
  // Four words per thread in flight: their x and weight loads issue before the math.
  for (uint k0 = t; k0 < words; k0 += 4u * kRow) {
    float xs[8], ws[8];
    [[unroll]] for (uint j = 0u; j < 4u; ++j) {  // clamped indices: words past the row are skipped below
      uint i = min(k0 + j * kRow, words - 1u) * per, i1 = min(i + 1u, args.d - 1u);
      xs[2u * j] = xin(r, i);
      ws[2u * j] = SB_LOAD(w, args.dtype, i);
      xs[2u * j + 1u] = xin(r, i1);
      ws[2u * j + 1u] = SB_LOAD(w, args.dtype, i1);
    }
    [[unroll]] for (uint j = 0u; j < 4u; ++j) {
      if (k0 + j * kRow >= words) continue;
      precise float lo = (xs[2u * j] * inv) * ws[2u * j];
      precise float hi = (xs[2u * j + 1u] * inv) * ws[2u * j + 1u];
      put_word(r, k0 + j * kRow, lo, per == 2u ? hi : 0.0);
    }
  }
#endif
}
#else
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
#endif
