// Kernel variants of this file, one line each (metal_shaders/README.md, "Variants"):
// SB_KERNEL(causal_conv1d, CAUSAL_CONV1D, "rrbwr", ConvArgs, SB_CONV_ARGS, 64, 0)
// SB_KERNEL(gated_delta_rule, GATED_DELTA_RULE, "rrrrrbwr", DeltaArgs, SB_DELTA_ARGS, 64, 0)
// SB_KERNEL(gated_delta_rule_128, GATED_DELTA_RULE_128, "rrrrrbwr", DeltaArgs, SB_DELTA_ARGS, 64, 0)
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

#ifdef GATED_DELTA_RULE_128
#define GATED_DELTA_RULE
#define DK_FIXED 1  // dk == 128 (the host's choice): the unrolled loops lose their guards
#else
#define DK_FIXED 0
#endif

#ifdef GATED_DELTA_RULE
// Thread -> output: workgroup g is value head g / B's columns 64 (g % B) .. + 63 (B = ceil(dv / 64));
// thread j keeps
// its column of the state [dk] in registers through every row. Per row: the q/k head staged in
// shared memory, thread 0 sums their squares (index order) and computes the gates, then each
// thread updates its column and writes out[t, h, column] (16-bit: thread pairs' halves joined
// in shared memory, the even thread writes the word).
const uint kMaxDk = 128u;  // the host refuses larger key heads
layout(std430, binding = 0) readonly buffer Qkv { uint qkv[]; };
layout(std430, binding = 1) readonly buffer A { uint a_in[]; };
layout(std430, binding = 2) readonly buffer B { uint b_in[]; };
layout(std430, binding = 3) readonly buffer AL { uint a_log[]; };
layout(std430, binding = 4) readonly buffer DB { uint dt_bias[]; };
layout(std430, binding = 5) buffer St { float state[]; };
layout(std430, binding = 6) writeonly buffer O { uint o[]; };
layout(std430, binding = 7) readonly buffer Dyn { uint dyn[]; };
layout(push_constant) uniform Args { SB_DELTA_ARGS } args;

shared float s_q[kMaxDk];
shared float s_k[kMaxDk];
shared float s_scalars[4];  // rsqrt for q, for k, beta, alpha
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
  for (uint t = 0u; t < args.m; ++t) {
    uint row = t * args.width;
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
      uint g = t * args.hv + h;
      s_scalars[2] = sb_round_to(sb_sigmoid(SB_LOAD(b_in, args.dtype, g)), args.dtype);
      precise float z = SB_LOAD(a_in, args.dtype, g) + SB_LOAD(dt_bias, args.ab_dtype, h);
      precise float gate = -sb_exp(SB_LOAD(a_log, args.ab_dtype, h)) * sb_softplus(z);
      s_scalars[3] = sb_exp(gate);
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
    precise float m = 0.0, acc_o = 0.0;
    float beta = s_scalars[2], alpha = s_scalars[3];
    [[unroll]] for (uint i = 0u; i < kMaxDk; ++i) {
      if (DK_FIXED != 0 || i < dk) {
        precise float v = s[i] * alpha;
        s[i] = v;
        m = m + v * s_k[i];
      }
    }
    float vj = live ? SB_LOAD(qkv, args.dtype, row + 2u * args.hk * dk + h * dv + j) : 0.0;
    precise float delta = (vj - m) * beta;
    [[unroll]] for (uint i = 0u; i < kMaxDk; ++i) {
      if (DK_FIXED != 0 || i < dk) {
        precise float v = s[i] + s_k[i] * delta;
        s[i] = v;
        acc_o = acc_o + v * s_q[i];
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
  }
  if (live)
    [[unroll]] for (uint i = 0u; i < kMaxDk; ++i)
      if (DK_FIXED != 0 || i < dk) state[(h * dk + i) * dv + j] = s[i];
}
#endif
