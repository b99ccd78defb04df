// Kernel variants of this file, one line each (metal_shaders/README.md, "Variants"):
// SB_KERNEL(causal_conv1d, CAUSAL_CONV1D, "rrbwr", ConvArgs, SB_CONV_ARGS, 64, 0)
// SB_KERNEL(gated_delta_rule, GATED_DELTA_RULE, "rrrrrbwr", DeltaArgs, SB_DELTA_ARGS, 64, 0)
// SB_KERNEL(gated_delta_rule_128, GATED_DELTA_RULE_128, "rrrrrbwr", DeltaArgs, SB_DELTA_ARGS, 64, 0)
// SB_KERNEL(gated_delta_prep, GATED_DELTA_PREP, "rrrrrw", DeltaArgs, SB_DELTA_ARGS, 64, 0)
// SB_KERNEL(gated_delta_rule_prepped, GATED_DELTA_RULE_PREPPED, "rrbwr", DeltaArgs, SB_DELTA_ARGS, 64, 0)
// SB_KERNEL(gated_delta_rule_128_prepped, GATED_DELTA_RULE_128_PREPPED, "rrbwr", DeltaArgs, SB_DELTA_ARGS, 64, 0)
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// Gated DeltaNet's ops (schema CausalConv1dNode, GatedDeltaRuleNode); twin of
// cpu_fallback/linear_attention.cpp. Both walk the rows in order inside one dispatch, so a
// prefill gives each token the bits of decoding it alone.
#include "common.glsl"

layout(local_size_x = 64) in;

#ifdef CAUSAL_CONV1D
// Thread -> output: invocation w owns channel word w (1 or 2 channels) of every row: it keeps
// the word's last K - 1 inputs in registers, writes its outputs row by row, then its state.
const uint kMaxK = 8u;  // the host refuses wider kernels
layout(std430, binding = 0) readonly buffer X { uint x[]; };
layout(std430, binding = 1) readonly buffer W { uint w[]; };
layout(std430, binding = 2) buffer St { uint state[]; };
layout(std430, binding = 3) writeonly buffer O { uint o[]; };
layout(std430, binding = 4) readonly buffer Dyn { uint dyn[]; };
layout(push_constant) uniform Args { SB_CONV_ARGS } args;

float conv(float hist[kMaxK], float cur, uint c) {
  precise float acc = 0.0;
  uint h = args.k - 1u;
  for (uint j = 0u; j < h; ++j) acc = acc + SB_LOAD(w, args.dtype, c * args.k + j) * hist[j];
  acc = acc + SB_LOAD(w, args.dtype, c * args.k + h) * cur;
  float y = sb_round_to(acc, args.dtype);
  return args.silu != 0u ? sb_silu(y) : y;
}

void main() {
  uint per = sb_per_word(args.dtype), words = (args.c + per - 1u) / per, wd = sb_linear_id();
  if (wd >= words) return;
  uint c0 = wd * per, h = args.k - 1u;
  bool two = per == 2u && c0 + 1u < args.c;
  bool fresh = args.pos + dyn[args.pos_word] == 0u;
  float h0[kMaxK], h1[kMaxK];  // channel c0's and c0 + 1's last inputs, oldest first
  for (uint j = 0u; j < h; ++j) {
    h0[j] = fresh ? 0.0 : SB_LOAD(state, args.dtype, j * args.c + c0);
    h1[j] = fresh || !two ? 0.0 : SB_LOAD(state, args.dtype, j * args.c + c0 + 1u);
  }
  for (uint t = 0u; t < args.m; ++t) {
    float x0 = SB_LOAD(x, args.dtype, t * args.c + c0), x1 = two ? SB_LOAD(x, args.dtype, t * args.c + c0 + 1u) : 0.0;
    float y0 = conv(h0, x0, c0), y1 = two ? conv(h1, x1, c0 + 1u) : 0.0;
    o[(t * args.c) / per + wd] = sb_encode_word(y0, y1, args.dtype);
    for (uint j = 0u; j + 1u < h; ++j) {
      h0[j] = h0[j + 1u];
      h1[j] = h1[j + 1u];
    }
    if (h > 0u) {
      h0[h - 1u] = x0;
      h1[h - 1u] = x1;
    }
  }
  for (uint j = 0u; j < h; ++j) state[(j * args.c) / per + wd] = sb_encode_word(h0[j], h1[j], args.dtype);
}
#endif

#ifdef GATED_DELTA_RULE_PREPPED
#define GATED_DELTA_RULE
#define SB_DELTA_PREPPED
#endif
#ifdef GATED_DELTA_RULE_128_PREPPED
#define GATED_DELTA_RULE_128
#define SB_DELTA_PREPPED
#endif
#ifdef GATED_DELTA_RULE_128
#define GATED_DELTA_RULE
#define DK_FIXED 1  // dk == 128 (the host's choice): the unrolled loops lose their guards
#else
#define DK_FIXED 0
#endif

#if defined(GATED_DELTA_PREP) || (defined(GATED_DELTA_RULE) && !defined(SB_DELTA_PREPPED))
// A row's gates for value head h: beta = round(sigmoid(b)), alpha = exp(-exp(a_log) softplus(a + dt_bias)).
#define SB_DELTA_GATES(t, h, beta, alpha)                                                  \
  {                                                                                        \
    uint g_ = (t) * args.hv + (h);                                                         \
    beta = sb_round_to(sb_sigmoid(SB_LOAD(b_in, args.dtype, g_)), args.dtype);             \
    precise float z_ = SB_LOAD(a_in, args.dtype, g_) + SB_LOAD(dt_bias, args.ab_dtype, h); \
    precise float gate_ = -sb_exp(SB_LOAD(a_log, args.ab_dtype, h)) * sb_softplus(z_);     \
    alpha = sb_exp(gate_);                                                                 \
  }
#endif

#ifdef GATED_DELTA_PREP
// A prefill's per-row terms of GatedDeltaRule, apart from the recurrence (which then waits on
// no single thread): the same operations as GATED_DELTA_RULE's. Thread -> output: workgroup
// w is row t = w / hk, key head kh = w % hk: thread 0 sums q's squares, thread 1 k's (index
// order); thread i % 64 writes q' = q rsqrt(.) scale and k' = k rsqrt(.) at
// prep[((t hk + kh) 2 + {0, 1}) dk + i]; thread u < hv / hk the gates of value head
// kh hv / hk + u at prep[m hk 2 dk + (t hv + h) 2 + {0: beta, 1: alpha}].
layout(std430, binding = 0) readonly buffer Qkv { uint qkv[]; };
layout(std430, binding = 1) readonly buffer A { uint a_in[]; };
layout(std430, binding = 2) readonly buffer B { uint b_in[]; };
layout(std430, binding = 3) readonly buffer AL { uint a_log[]; };
layout(std430, binding = 4) readonly buffer DB { uint dt_bias[]; };
layout(std430, binding = 5) writeonly buffer P { float prep[]; };
layout(push_constant) uniform Args { SB_DELTA_ARGS } args;

shared float s_q[128];
shared float s_k[128];
shared float s_r[2];  // rsqrt for q, for k

void main() {
  uint w = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (w >= args.m * args.hk) return;  // uniform over the workgroup
  uint t = w / args.hk, kh = w % args.hk, t0 = gl_LocalInvocationID.x, dk = args.dk, row = t * args.width;
  for (uint i = t0; i < dk; i += 64u) {
    s_q[i] = SB_LOAD(qkv, args.dtype, row + kh * dk + i);
    s_k[i] = SB_LOAD(qkv, args.dtype, row + (args.hk + kh) * dk + i);
  }
  barrier();
  if (t0 < 2u) {
    precise float ss = 0.0;
    for (uint i = 0u; i < dk; ++i) {
      float x = t0 == 0u ? s_q[i] : s_k[i];
      ss = ss + x * x;
    }
    s_r[t0] = args.l2norm != 0u ? sb_rsqrt(ss + 1e-6) : 1.0;
  }
  uint per_kh = args.hv / args.hk, gates = args.m * args.hk * 2u * dk;
  for (uint u = t0; u < per_kh; u += 64u) {
    uint h = kh * per_kh + u;
    float beta, alpha;
    SB_DELTA_GATES(t, h, beta, alpha)
    prep[gates + (t * args.hv + h) * 2u] = beta;
    prep[gates + (t * args.hv + h) * 2u + 1u] = alpha;
  }
  barrier();
  uint at = (t * args.hk + kh) * 2u * dk;
  for (uint i = t0; i < dk; i += 64u) {
    float q = s_q[i], k = s_k[i];
    if (args.l2norm != 0u) {
      precise float qn = q * s_r[0], kn = k * s_r[1];
      q = qn;
      k = kn;
    }
    precise float qs = q * args.scale;
    prep[at + i] = qs;
    prep[at + dk + i] = k;
  }
}
#endif

#ifdef GATED_DELTA_RULE
// Thread -> output: workgroup g is value head g / B's columns 64 (g % B) .. + 63 (B = ceil(dv / 64));
// thread j keeps
// its column of the state [dk] in registers through every row. Per row: the q/k head staged in
// shared memory, thread 0 sums their squares (index order) and computes the gates, then each
// thread updates its column and writes out[t, h, column] (16-bit: thread pairs' halves joined
// in shared memory, the even thread writes the word). SB_DELTA_PREPPED (prefills): the
// normalized q, k and the gates come from GATED_DELTA_PREP's buffer instead.
const uint kMaxDk = 128u;  // the host refuses larger key heads
layout(std430, binding = 0) readonly buffer Qkv { uint qkv[]; };
#ifdef SB_DELTA_PREPPED
layout(std430, binding = 1) readonly buffer P { float prep[]; };
layout(std430, binding = 2) buffer St { float state[]; };
layout(std430, binding = 3) writeonly buffer O { uint o[]; };
layout(std430, binding = 4) readonly buffer Dyn { uint dyn[]; };
#else
layout(std430, binding = 1) readonly buffer A { uint a_in[]; };
layout(std430, binding = 2) readonly buffer B { uint b_in[]; };
layout(std430, binding = 3) readonly buffer AL { uint a_log[]; };
layout(std430, binding = 4) readonly buffer DB { uint dt_bias[]; };
layout(std430, binding = 5) buffer St { float state[]; };
layout(std430, binding = 6) writeonly buffer O { uint o[]; };
layout(std430, binding = 7) readonly buffer Dyn { uint dyn[]; };
#endif
layout(push_constant) uniform Args { SB_DELTA_ARGS } args;

#ifdef SB_DELTA_PREPPED
shared float s_q[2u * kMaxDk];  // two rows' q' and k': row t's at (t % 2) kMaxDk
shared float s_k[2u * kMaxDk];

// Row t's terms into registers: q' and k' at i = tid, tid + 64 (i < dk), beta, alpha and
// the value v_j the thread's column reads.
void prep_load(uint t, uint kh, uint h, uint j, bool live, out float q2[2], out float k2[2], out vec3 bav) {
  uint t0 = gl_LocalInvocationID.x, dk = args.dk, pq = (t * args.hk + kh) * 2u * dk;
  uint pg = args.m * args.hk * 2u * dk + (t * args.hv + h) * 2u;
  [[unroll]] for (uint u = 0u; u < 2u; ++u) {
    uint i = t0 + 64u * u;
    q2[u] = i < dk ? prep[pq + i] : 0.0;
    k2[u] = i < dk ? prep[pq + dk + i] : 0.0;
  }
  float vj = live ? SB_LOAD(qkv, args.dtype, t * args.width + 2u * args.hk * dk + h * args.dv + j) : 0.0;
  bav = vec3(prep[pg], prep[pg + 1u], vj);
}

void prep_store(uint base, float q2[2], float k2[2]) {
  uint t0 = gl_LocalInvocationID.x;
  [[unroll]] for (uint u = 0u; u < 2u; ++u) {
    if (t0 + 64u * u < args.dk) {
      s_q[base + t0 + 64u * u] = q2[u];
      s_k[base + t0 + 64u * u] = k2[u];
    }
  }
}
#else
shared float s_q[kMaxDk];
shared float s_k[kMaxDk];
shared float s_scalars[4];  // rsqrt for q, for k, beta, alpha
#endif
shared float s_out[64];

void main() {
  uint g = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x, blocks = (args.dv + 63u) / 64u;
  if (g >= args.hv * blocks) return;  // uniform over the workgroup
  uint h = g / blocks, t0 = gl_LocalInvocationID.x, j = (g % blocks) * 64u + t0;
  uint dk = args.dk, dv = args.dv, kh = h / (args.hv / args.hk);
  bool live = j < dv;
  bool fresh = args.pos + dyn[args.pos_word] == 0u;
  float s[kMaxDk];
  [[unroll]] for (uint i = 0u; i < kMaxDk; ++i)
    s[i] = (live && !fresh && (DK_FIXED != 0 || i < dk)) ? state[(h * dk + i) * dv + j] : 0.0;
  uint per = sb_per_word(args.dtype);
#ifdef SB_DELTA_PREPPED
  // Each row's terms are loaded a row ahead (their loads in flight during the row before) and
  // staged in the other shared buffer: one barrier a row.
  float nq[2], nk[2];
  vec3 nbav;
  prep_load(0u, kh, h, j, live, nq, nk, nbav);
  prep_store(0u, nq, nk);
  barrier();
#endif
  for (uint t = 0u; t < args.m; ++t) {
    uint row = t * args.width;
#ifdef SB_DELTA_PREPPED
    uint sb = (t & 1u) * kMaxDk;
    float beta = nbav.x, alpha = nbav.y, vj = nbav.z;
    if (t + 1u < args.m) prep_load(t + 1u, kh, h, j, live, nq, nk, nbav);
#else
    const uint sb = 0u;
    barrier();  // the last row's shared values are read
    for (uint i = t0; i < dk; i += 64u) {
      s_q[i] = SB_LOAD(qkv, args.dtype, row + kh * dk + i);
      s_k[i] = SB_LOAD(qkv, args.dtype, row + (args.hk + kh) * dk + i);
    }
    barrier();
    if (t0 == 0u) {
      precise float sq = 0.0, sk = 0.0;
      for (uint i = 0u; i < dk; ++i) {
        sq = sq + s_q[i] * s_q[i];
        sk = sk + s_k[i] * s_k[i];
      }
      s_scalars[0] = args.l2norm != 0u ? sb_rsqrt(sq + 1e-6) : 1.0;
      s_scalars[1] = args.l2norm != 0u ? sb_rsqrt(sk + 1e-6) : 1.0;
      float beta, alpha;
      SB_DELTA_GATES(t, h, beta, alpha)
      s_scalars[2] = beta;
      s_scalars[3] = alpha;
    }
    barrier();
    for (uint i = t0; i < dk; i += 64u) {
      if (args.l2norm != 0u) {
        precise float qn = s_q[i] * s_scalars[0], kn = s_k[i] * s_scalars[1];
        s_q[i] = qn;
        s_k[i] = kn;
      }
      precise float qs = s_q[i] * args.scale;
      s_q[i] = qs;
    }
    barrier();
    float beta = s_scalars[2], alpha = s_scalars[3];
#endif
    precise float m = 0.0, acc_o = 0.0;
    [[unroll]] for (uint i = 0u; i < kMaxDk; ++i) {
      if (DK_FIXED != 0 || i < dk) {
        precise float v = s[i] * alpha;
        s[i] = v;
        m = m + v * s_k[sb + i];
      }
    }
#ifndef SB_DELTA_PREPPED
    float vj = live ? SB_LOAD(qkv, args.dtype, row + 2u * args.hk * dk + h * dv + j) : 0.0;
#endif
    precise float delta = (vj - m) * beta;
    [[unroll]] for (uint i = 0u; i < kMaxDk; ++i) {
      if (DK_FIXED != 0 || i < dk) {
        precise float v = s[i] + s_k[sb + i] * delta;
        s[i] = v;
        acc_o = acc_o + v * s_q[sb + i];
      }
    }
    uint at = (t * args.hv + h) * dv + j;
    if (per == 1u) {
      if (live) o[at] = floatBitsToUint(acc_o);
    } else {
      s_out[t0] = acc_o;
      barrier();
      if (live && (t0 & 1u) == 0u) o[at >> 1] = sb_encode_word(s_out[t0], j + 1u < dv ? s_out[t0 + 1u] : 0.0, args.dtype);
    }
#ifdef SB_DELTA_PREPPED
    // The other buffer's readers (row t - 1) passed the last barrier; row t's pass the next.
    if (t + 1u < args.m) prep_store(sb ^ kMaxDk, nq, nk);
    barrier();
#endif
  }
  if (live)
    [[unroll]] for (uint i = 0u; i < kMaxDk; ++i)
      if (DK_FIXED != 0 || i < dk) state[(h * dk + i) * dv + j] = s[i];
}
#endif
