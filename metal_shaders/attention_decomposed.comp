// Kernel variants of this file, one line each (metal_shaders/README.md, "Variants"):
// SB_KERNEL(attention, ATTENTION, "rrrrbw", AttentionArgs, SB_ATTENTION_ARGS, 128, 0)
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// Attention over a KV cache (schema AttentionNode) in order Decomposed (docs/numerics.md); twin
// of cpu_fallback/attention.cpp (order Blocked32: attention.comp, attention_tiles.comp).
// Thread -> output: workgroup w computes query row i = w / hq of
// head h = w % hq. Invocation t scores keys t, t + 128, ... (each a dot32 of its own: 32
// partials over the head dims, then the halving tree), keeps the row's scores, then exps,
// then probabilities (in shared memory up to 4096 keys, else in `scratch`); thread 0 alone
// adds the exps in key order; then t
// computes output columns t, t + 128, ...: 32 partials over the keys (key j feeds partial
// j % 32), the halving tree, one rounding. Every step rounds to the dtype as the
// decomposed ops (BatchMatmul, Mul, Add, Softmax, BatchMatmul) store their results.
#include "common.glsl"

layout(local_size_x = 128) in;
layout(push_constant) uniform Args { SB_ATTENTION_ARGS } args;
const uint kT = 128u;
const uint kMaxHd = 256u;  // the host refuses larger heads

#include "attention_common.glsl"

layout(std430, binding = 0) readonly buffer Q { uint q[]; };
layout(std430, binding = 1) readonly buffer K { uint k[]; };
layout(std430, binding = 2) readonly buffer V { uint v[]; };
layout(std430, binding = 3) readonly buffer S { uint sinks[]; };
layout(std430, binding = 4) buffer Scratch { float scratch[]; };
layout(std430, binding = 5) writeonly buffer O { uint o[]; };

const uint kRowMax = 4096u;  // rows of up to this many scores stay in shared memory
shared float s_q[kMaxHd];
shared float s_out[kMaxHd];
shared float s_red[kT];
shared float s_row[kRowMax];
shared float s_rcp;

// The row's scores, then exps, then probabilities: in shared memory when they fit, else in
// this workgroup's part of `scratch` (the same values either way).
bool g_shared;
uint g_base;
float row_get(uint j) { return g_shared ? s_row[j] : scratch[g_base + j]; }
void row_set(uint j, float v) {
  if (g_shared) s_row[j] = v;
  else scratch[g_base + j] = v;
}
void row_barrier() {
  if (!g_shared) memoryBarrierBuffer();
  barrier();
}

// dot32 of the staged q with key row kb (element e to partial e % 32, ascending e), then the
// halving tree.
float score(uint kb, uint hd) {
  precise float p[32];
  [[unroll]] for (uint l = 0u; l < 32u; ++l) p[l] = 0.0;
  for (uint e0 = 0u; e0 < hd; e0 += 32u) {
    [[unroll]] for (uint l = 0u; l < 32u; ++l) {
      if (e0 + l < hd) p[l] = p[l] + s_q[e0 + l] * SB_LOAD(k, ADT, kb + e0 + l);
    }
  }
  SB_TREE32(p)
  return p[0];
}

// e_0 + e_1 + ... + e_{n-1}, left to right, eight loads issued ahead of their adds.
float sum_in_order(uint n) {
  precise float s = 0.0;
  uint j = 0u;
  for (; j + 8u <= n; j += 8u) {
    float v[8];
    [[unroll]] for (uint l = 0u; l < 8u; ++l) v[l] = row_get(j + l);
    [[unroll]] for (uint l = 0u; l < 8u; ++l) s = s + v[l];
  }
  for (; j < n; ++j) s = s + row_get(j);
  return s;
}

void main() {
  uint t = gl_LocalInvocationID.x;
  uint w = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (w >= args.m * args.hq) return;  // uniform over the workgroup
  uint i = w / args.hq, h = w % args.hq, kh = h / (args.hq / args.hk), hd = HD;
  uint at = args.pos + i, cols = args.len + args.has_sinks;
  g_shared = cols <= kRowMax;
  g_base = w * (args.len + 1u);
  for (uint c = t; c < hd; c += kT) s_q[c] = SB_LOAD(q, ADT, w * hd + c);
  barrier();

  // Scores: s_j = round(round(dot32(q, k_j)) * scale), masked keys + mask_value, rounded.
  for (uint j = t; j < args.len; j += kT) {
    precise float x = rnd(score((kh * args.cache + j) * hd, hd));
    x = rnd(x * args.scale);
    bool masked = j > at || (args.window > 0u && j + args.window <= at);
    if (masked) x = rnd(x + args.mask_value);
    row_set(j, x);
  }
  if (t == 0u && args.has_sinks != 0u) {
    precise float sv = SB_LOAD(sinks, ADT, h) + 0.0;
    row_set(args.len, rnd(sv));
  }
  row_barrier();

  // Softmax: the running max is order-free; the exps are added in key order by one thread.
  float mx = row_get(0u);
  for (uint j = t; j < cols; j += kT) mx = sb_max(mx, row_get(j));
  s_red[t] = mx;
  barrier();
  if (t == 0u) {
    float m = s_red[0];
    for (uint l = 1u; l < kT; ++l) m = sb_max(m, s_red[l]);
    s_red[0] = m;
  }
  barrier();
  float m = s_red[0];
  for (uint j = t; j < cols; j += kT) {
    precise float d = row_get(j) - m;
    row_set(j, sb_exp(d));
  }
  row_barrier();
  if (t == 0u) s_rcp = sb_rcp(sum_in_order(cols));
  barrier();
  for (uint j = t; j < args.len; j += kT) {
    precise float pj = row_get(j) * s_rcp;
    row_set(j, rnd(pj));
  }
  row_barrier();

  // Output columns: dot32 over the keys of p and v[:, c].
  for (uint c = t; c < hd; c += kT) {
    precise float a[32];
    [[unroll]] for (uint l = 0u; l < 32u; ++l) a[l] = 0.0;
    uint vb = kh * args.cache * hd + c;
    for (uint j0 = 0u; j0 < args.len; j0 += 32u) {
      [[unroll]] for (uint l = 0u; l < 32u; ++l) {
        if (j0 + l < args.len) a[l] = a[l] + row_get(j0 + l) * SB_LOAD(v, ADT, vb + (j0 + l) * hd);
      }
    }
    SB_TREE32(a)
    s_out[c] = rnd(a[0]);
  }
  barrier();
  uint per = sb_per_word(ADT), words = hd / per;
  for (uint wd = t; wd < words; wd += kT) {
    uint c = wd * per;
    o[w * words + wd] = per == 1u ? floatBitsToUint(s_out[c]) : sb_encode_word(s_out[c], s_out[c + 1u], ADT);
  }
}
