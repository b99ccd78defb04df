// Kernel variants of this file, one line each (metal_shaders/README.md, "Variants"):
// SB_KERNEL(softmax, SOFTMAX, "rb", NormArgs, SB_NORM_ARGS, 64, 0)
// SB_KERNEL(rms_norm, RMS_NORM, "rrb", NormArgs, SB_NORM_ARGS, 64, 0)
// SB_KERNEL(softmax_row, SOFTMAX_ROW, "rb", NormArgs, SB_NORM_ARGS, 256, 0)
// SB_KERNEL(rms_norm_row, RMS_NORM_ROW, "rrb", NormArgs, SB_NORM_ARGS, 256, 0)
// SB_KERNEL(rms_norm_tree, RMS_NORM_TREE, "rrrww", NormArgs, SB_NORM_ARGS, 256, 0)
// SB_KERNEL(rms_norm_tree_q8, RMS_NORM_TREE_Q8, "rrrwwwww", NormQ8Args, SB_NORM_Q8_ARGS, 256, 0)
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
// outputs, invocation t the row's words t, t + 256, ... (their elements loaded once and
// kept in registers); thread 0 alone adds the terms, in index order, so the bits are the
// sequential kernel's; softmax's running max is an order-free reduction (row_max).
#ifdef RMS_NORM_TREE_Q8
#define RMS_NORM_TREE
#include "gather_qmm_common.glsl"  // common.glsl, then the Q8 steps (q8_params, q8_code)
#else
#include "common.glsl"
#endif
#include "norm_common.glsl"

#ifdef RMS_NORM_TREE
// RMS_NORM_TREE (RmsNorm order Tree32; pad0 = 1: with a residual; gated = 1: binding 1 is the
// gate, out = round(round(x r w) * silu(gate))). Thread -> output: workgroup
// g computes row g; its 256 threads load s_i = round(x_i + residual_i) (or x_i) into shared
// memory at once (rows past SB_NORM_ROW_MAX recompute s_i from memory instead); threads 0..31
// hold dot32's partials (thread l adds s_i * s_i for i = l, l + 32, ... in order), thread 0 the
// halving tree and rsqrt; thread t writes output (and sum) words t, t + 256, ...
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { uint x[]; };
layout(std430, binding = 1) readonly buffer R { uint res[]; };
layout(std430, binding = 2) readonly buffer W { uint w[]; };
layout(std430, binding = 3) writeonly buffer O { uint o[]; };
layout(std430, binding = 4) writeonly buffer Sum { uint sum_o[]; };
#ifdef RMS_NORM_TREE_Q8
// RMS_NORM_TREE_Q8 (rows staged whole, d a multiple of 32, gated 0; the host checks): the
// output rounded to its dtype also quantized as quantize_q8 would read it from memory, block
// b of row r by threads 8 b' + w (word w; b' = b mod 32, rounds of 32 blocks); o written only
// with store_out.
layout(std430, binding = 5) writeonly buffer Q { uint q8[]; };
layout(std430, binding = 6) writeonly buffer D { float q8_d[]; };
layout(std430, binding = 7) writeonly buffer S { int q8_sum[]; };
layout(push_constant) uniform Args { SB_NORM_Q8_ARGS } args;
shared uint s_amax[SB_NORM_ROW_MAX / 32];
shared int s_qsum[SB_NORM_ROW_MAX / 32];
#else
layout(push_constant) uniform Args { SB_NORM_ARGS } args;
#endif
#include "spec_constants.glsl"
#define DT SB_SPEC(kSpecDt0, args.dtype)     // x, the residual / gate, the outputs
#define W_DT SB_SPEC(kSpecDt1, args.w_dtype) // the weights
#define ROW_D SB_SPEC(kSpecExtent, args.d)  // the row length
shared float s_part[32];
shared float s_inv;
shared float s_row[SB_NORM_ROW_MAX];

float s_at(uint g) {
  float v = SB_LOAD(x, DT, g);
  if (args.pad0 != 0u) {
    precise float a = v + SB_LOAD(res, DT, g);
    v = sb_round_to(a, DT);
  }
  return v;
}

#ifdef RMS_NORM_TREE_Q8
// Element j of code word w of block b of the staged output: quantize_q8's K order, or
// qmm_mma4's (permute).
float q8_elem(uint b, uint w, uint j) {
  return s_row[32u * b + (args.permute != 0u ? 8u * (w >> 1u) + 2u * j + (w & 1u) : 4u * w + j)];
}

// quantize_q8's steps on row r's staged output: the block amax and the code sum by shared
// atomics (integers: any order), then each thread's code word.
void quantize_row(uint r, uint t) {
  uint blocks = ROW_D / 32u;
  for (uint u = t; u < 8u * blocks; u += 256u) {
    uint amax = 0u;
    [[unroll]] for (uint j = 0u; j < 4u; ++j) amax = max(amax, floatBitsToUint(q8_elem(u >> 3u, u & 7u, j)) & 0x7fffffffu);
    atomicMax(s_amax[u >> 3u], amax);
  }
  barrier();
  for (uint u = t; u < 8u * blocks; u += 256u) {
    uint b = u >> 3u, w = u & 7u;
    float scale, d;
    bool zero;
    q8_params(s_amax[b], scale, d, zero);
    uint word = 0u;
    int part = 0;
    [[unroll]] for (uint j = 0u; j < 4u; ++j) {
      int c = zero ? 0 : q8_code(q8_elem(b, w, j), scale);
      part += c;
      word |= (uint(c) & 0xffu) << (8u * j);
    }
    atomicAdd(s_qsum[b], part);
    q8[(r * blocks + b) * 8u + w] = word;
    if (w == 0u) q8_d[r * blocks + b] = d;
  }
  barrier();
  for (uint b = t; b < blocks; b += 256u) q8_sum[r * blocks + b] = s_qsum[b];
}
#endif

void main() {
  uint r = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (r >= args.rows) return;  // uniform across the workgroup
  uint t = gl_LocalInvocationID.x, base = r * ROW_D;
  bool staged = ROW_D <= SB_NORM_ROW_MAX;
  if (staged)
    for (uint i = t; i < ROW_D; i += 256u) s_row[i] = s_at(base + i);
#ifdef RMS_NORM_TREE_Q8
  for (uint b = t; b < ROW_D / 32u; b += 256u) {
    s_amax[b] = 0u;
    s_qsum[b] = 0;
  }
#endif
  barrier();
  if (t < 32u) {
    precise float p = 0.0;
    for (uint i = t; i < ROW_D; i += 32u) {
      float v = staged ? s_row[i] : s_at(base + i);
      p = p + v * v;
    }
    s_part[t] = p;
  }
  barrier();
  if (t == 0u) s_inv = sb_tree32_rsqrt(s_part, args.inv_d, args.eps);
  barrier();
  float inv = s_inv;
  uint per = sb_per_word(DT), words = ROW_D / per;  // 16-bit rows have even d (host)
  for (uint k = t; k < words; k += 256u) {
    uint i = k * per;
    float a = staged ? s_row[i] : s_at(base + i);
    float b = per == 2u ? (staged ? s_row[i + 1u] : s_at(base + i + 1u)) : 0.0;
    precise float lo = (a * inv) * SB_LOAD(w, W_DT, i);
    precise float hi = per == 2u ? (b * inv) * SB_LOAD(w, W_DT, i + 1u) : 0.0;
    if (args.gated != 0u) {
      lo = sb_round_to(lo, DT) * sb_silu(SB_LOAD(res, DT, base + i));
      if (per == 2u) hi = sb_round_to(hi, DT) * sb_silu(SB_LOAD(res, DT, base + i + 1u));
    }
    uint y = sb_encode_word(lo, hi, DT);
#ifdef RMS_NORM_TREE_Q8
    // The stored values (as the quantizer would load them), over this thread's own s_row slots.
    s_row[i] = per == 2u ? sb_decode(y, DT, 0u) : uintBitsToFloat(y);
    if (per == 2u) s_row[i + 1u] = sb_decode(y, DT, 1u);
    if (args.store_out != 0u) o[r * words + k] = y;
#else
    o[r * words + k] = y;
#endif
    if (args.pad0 != 0u) sum_o[r * words + k] = sb_encode_word(a, b, DT);
  }
#ifdef RMS_NORM_TREE_Q8
  barrier();
  quantize_row(r, t);
#endif
}
#else
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

// The thread's elements stay in registers from the one load to the output (decode rows
// are latency-bound: no second trip to memory). Thread t owns words t + kRow * j; element
// q of its kElems: f32 word q, 16-bit the two halves of word q / 2.
const uint kElems = SB_NORM_ROW_MAX / kRow;
uint elem(uint t, uint q, uint per) { return per == 1u ? t + kRow * q : 2u * (t + kRow * (q >> 1u)) + (q & 1u); }

// xs[q] = x[r, elem q] (past the row: its last element, never used): all loads issued at once.
void load_elems(uint r, uint t, uint per, out float xs[kElems]) {
  [[unroll]] for (uint q = 0u; q < kElems; ++q) xs[q] = xin(r, min(elem(t, q, per), args.d - 1u));
}

#ifdef SOFTMAX
shared int s_key[kRow];
shared uint s_zeros[kRow], s_nan[kRow];

// The running max of the row in index order (max_f32: a NaN sticks, equal values AND
// their bits) as an order-free reduction: the first NaN if any, else the value of the
// largest order key; for the key 0 (+-0) the AND of all zeros' bits.
float row_max(uint r, uint t, uint per, float xs[kElems]) {
  int key = int(0x80000000u);
  uint zeros = 0xffffffffu, nan_at = 0xffffffffu;
  [[unroll]] for (uint q = 0u; q < kElems; ++q) {
    uint e = elem(t, q, per);
    if (e >= args.d) continue;
    if (sb_isnan(xs[q])) {
      nan_at = min(nan_at, e);
    } else {
      int k = sb_key(xs[q]);
      key = max(key, k);
      if (k == 0) zeros &= floatBitsToUint(xs[q]);
    }
  }
  s_key[t] = key;
  s_zeros[t] = zeros;
  s_nan[t] = nan_at;
  barrier();
  for (uint s = kRow / 2u; s > 0u; s >>= 1u) {
    if (t < s) {
      s_key[t] = max(s_key[t], s_key[t + s]);
      s_zeros[t] &= s_zeros[t + s];
      s_nan[t] = min(s_nan[t], s_nan[t + s]);
    }
    barrier();
  }
  return s_nan[0] != 0xffffffffu ? xin(r, s_nan[0]) : sb_from_key(s_key[0], s_zeros[0]);
}
#endif

void main() {
  uint r = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (r >= args.rows) return;  // uniform across the workgroup
  uint t = gl_LocalInvocationID.x;
  uint per = args.out_dtype == SB_DT_F32 ? 1u : 2u, words = args.d / per;
  float xs[kElems];
  load_elems(r, t, per, xs);
#ifdef SOFTMAX
  float m = row_max(r, t, per, xs);
  [[unroll]] for (uint q = 0u; q < kElems; ++q) {
    uint e = elem(t, q, per);
    precise float d = xs[q] - m;
    if (e < args.d) TERM(e) = sb_exp(d);
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
  float ws[kElems];  // the weights too, loaded with x
  [[unroll]] for (uint q = 0u; q < kElems; ++q) ws[q] = SB_LOAD(w, args.w_dtype, min(elem(t, q, per), args.d - 1u));
  [[unroll]] for (uint q = 0u; q < kElems; ++q) {
    uint e = elem(t, q, per);
    precise float sq = xs[q] * xs[q];
    if (e < args.d) TERM(e) = sq;
  }
  barrier();
  if (t == 0u) {
    precise float ms = sum_in_order(args.d) * args.inv_d + args.eps;
    part[0] = sb_rsqrt(ms);
  }
  barrier();
  float inv = part[0];
  // Output word t + kRow * j from elements j (f32) or 2j, 2j + 1 (16-bit), constant indices.
  if (per == 1u) {
    [[unroll]] for (uint j = 0u; j < kElems; ++j) {
      precise float lo = (xs[j] * inv) * ws[j];
      if (t + kRow * j < words) put_word(r, t + kRow * j, lo, 0.0);
    }
  } else {
    [[unroll]] for (uint j = 0u; j < kElems / 2u; ++j) {
      precise float lo = (xs[2u * j] * inv) * ws[2u * j];
      precise float hi = (xs[2u * j + 1u] * inv) * ws[2u * j + 1u];
      if (t + kRow * j < words) put_word(r, t + kRow * j, lo, hi);
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
    precise float v = (xin(r, i) * inv) * SB_LOAD(w, args.w_dtype, i);
    put(r * args.d + i, v);
  }
#endif
}
#endif
#endif  // RMS_NORM_TREE
