// Kernel variants of this file, one line each (metal_shaders/README.md, "Variants"):
// SB_KERNEL(rope, ROPE, "rrrwwr", RopeArgs, SB_ROPE_ARGS, 256, 0)
// SB_KERNEL(rope_norm, ROPE_NORM, "rrrwwrr", RopeArgs, SB_ROPE_ARGS, 64, 0)
// SB_KERNEL(rope_qkv, ROPE_QKV, "rrrwwrrrw", RopeArgs, SB_ROPE_ARGS, 256, 0)
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// Rotary embedding (schema RopeNode), HF's rotate_half form; twin of cpu_fallback/rope.cpp.
// ROPE. Thread -> output: invocation w writes output word w (1 or 2 elements, each computed
// alone), and the cache's word at the same place from row pos when has_cache.
// ROPE_NORM (with norm_weight). Thread -> output: workgroup g is head row g (row g / h, head
// g % h); its threads stage the row in shared memory, threads 0..31 hold dot32's partials of
// its squares, thread 0 the halving tree and rsqrt; then the row is normalized in place and
// thread t writes the head's words t, t + 64, ... (and the cache's).
// ROPE_QKV (the fused q/k/v form). Thread -> output: threads 64 s .. 64 s + 63 of workgroup g take
// head slot u = 4 g + s, row u / H', head j = u % H' of the H' = q_heads + 2 k_heads heads read:
// a query (-> out), a key (-> the cache) or a value (-> v_cache, its words copied); queries and
// keys as ROPE_NORM (the norm when given), thread 64 s + t as ROPE_NORM's t. Every global load
// goes out before the first barrier: the kernel is a chain of dependent round trips.
#include "common.glsl"
#include "norm_common.glsl"

#if defined(ROPE_QKV)
#define ROPE_BY_HEAD
layout(local_size_x = 256) in;
const uint kSlots = 4u;  // head rows a workgroup
#elif defined(ROPE_NORM)
#define ROPE_BY_HEAD
layout(local_size_x = 64) in;
const uint kSlots = 1u;
#else
layout(local_size_x = 256) in;
#endif
layout(std430, binding = 0) readonly buffer X { uint x[]; };
layout(std430, binding = 1) readonly buffer C { float cos_t[]; };
layout(std430, binding = 2) readonly buffer S { float sin_t[]; };
layout(std430, binding = 3) writeonly buffer O { uint o[]; };
layout(std430, binding = 4) writeonly buffer K { uint cache[]; };
#ifdef ROPE_BY_HEAD
layout(std430, binding = 5) readonly buffer W { uint w[]; };
layout(std430, binding = 6) readonly buffer Dyn { uint dyn[]; };
#else
layout(std430, binding = 5) readonly buffer Dyn { uint dyn[]; };
#endif
#ifdef ROPE_QKV
layout(std430, binding = 7) readonly buffer KW { uint kw[]; };
layout(std430, binding = 8) writeonly buffer V { uint v_cache[]; };
#endif
layout(push_constant) uniform Args { SB_ROPE_ARGS } args;
#include "spec_constants.glsl"
#define DT SB_SPEC(kSpecDt0, args.dtype)       // x, the output and the caches
#define W_DT SB_SPEC(kSpecDt1, args.w_dtype)   // the (query) norm weights
#define KW_DT SB_SPEC(kSpecDt2, args.kw_dtype) // the keys' norm weights
#define HD SB_SPEC(kSpecExtent, args.hd)       // the head dim

// Row 0's position: pos, plus the word the host writes per execution where pos is an input
// (word 0 is always 0), so a recorded step replays at any position.
uint first_pos() { return args.pos + dyn[args.pos_word]; }

float rnd(float v) { return sb_round_to(v, DT); }

#ifdef ROPE_BY_HEAD
#define SB_ROPE_STAGED
const uint kMaxHd = 256u;  // the host refuses larger heads
shared float s_part[32u * kSlots];
shared float s_inv[kSlots];
shared float s_x[kMaxHd * kSlots];  // [slot][e]: the head row, then (normalized, rounded as RmsNorm stores it)
#ifdef ROPE_QKV
float xin(uint i) { return s_x[i]; }  // i: slot kMaxHd + e (element_at's base is the slot's)
#else
float xin(uint i) { return s_x[i % HD]; }
#endif
#else
float xin(uint i) { return SB_LOAD(x, DT, i); }
#endif

#include "rope_common.glsl"

float element(uint i) {
  uint r = i / HD;
  return element_at(r * HD, i % HD, first_pos() + r / args.h);
}

#ifdef ROPE_BY_HEAD
// Stages the head row at element base into slot `slot` (threads 64 slot .. + 63); with a norm,
// RmsNorm'd (Tree32) by weight words `wsel` (0: w, 1: kw) in place, rounded to x's dtype.
// `live`: the slot holds a head; `norm`: it is normed; `any_norm`: some slot of the workgroup may
// be (uniform: every thread meets the same barriers). The row's and the weights' loads go out
// together before the first barrier (each a global round trip of a short chain otherwise).
void stage_head(uint slot, bool live, uint base, bool norm, bool any_norm, uint wsel) {
  uint t = gl_LocalInvocationID.x & 63u, sx = slot * kMaxHd;
  float xv[kMaxHd / 64u], wv[kMaxHd / 64u];
  [[unroll]] for (uint u = 0u; u < kMaxHd / 64u; ++u) {
    uint e = t + 64u * u;
    xv[u] = wv[u] = 0.0;
    if (!live || e >= HD) continue;
    xv[u] = SB_LOAD(x, DT, base + e);
#ifdef ROPE_QKV
    if (norm) wv[u] = wsel == 0u ? SB_LOAD(w, W_DT, e) : SB_LOAD(kw, KW_DT, e);
#else
    if (norm) wv[u] = SB_LOAD(w, W_DT, e);
#endif
  }
  [[unroll]] for (uint u = 0u; u < kMaxHd / 64u; ++u)
    if (live && t + 64u * u < HD) s_x[sx + t + 64u * u] = xv[u];
  barrier();
  if (!any_norm) return;  // uniform over the workgroup
  if (norm && t < 32u) s_part[32u * slot + t] = head_partial(sx, t);
  barrier();
  if (norm && t == 0u) {
    float part[32];
    [[unroll]] for (uint l = 0u; l < 32u; ++l) part[l] = s_part[32u * slot + l];
    s_inv[slot] = sb_tree32_rsqrt(part, args.inv_d, args.eps);
  }
  barrier();
  if (norm) {
    [[unroll]] for (uint u = 0u; u < kMaxHd / 64u; ++u) {
      uint e = t + 64u * u;
      if (e < HD) s_x[sx + e] = head_normalized(s_x[sx + e], s_inv[slot], wv[u]);
    }
  }
  barrier();
}

#ifdef ROPE_QKV
// This thread's words k = t + 64 u of a head at position p: the cos and sin entries (rounded to
// the dtype, as element_at takes them) of their elements k per + i, loaded before the head is
// staged.
struct HeadTables {
  float c[kMaxHd / 64u][2];
  float s[kMaxHd / 64u][2];
};

HeadTables head_tables(uint per, uint p) {
  uint t = gl_LocalInvocationID.x & 63u, words = HD / per;
  HeadTables h;
  [[unroll]] for (uint u = 0u; u < kMaxHd / 64u; ++u) {
    [[unroll]] for (uint i = 0u; i < 2u; ++i) {
      uint e = (t + 64u * u) * per + i;
      h.c[u][i] = h.s[u][i] = 0.0;
      if (t + 64u * u >= words || i >= per || e >= 2u * args.half_dims) continue;
      uint ti = table_at(e, p);
      h.c[u][i] = rnd(cos_t[ti]);
      h.s[u][i] = rnd(sin_t[ti]);
    }
  }
  return h;
}

// Slot `slot`'s staged head's word t + 64 u with the tables above: element_at's steps.
uint head_word_at(uint slot, uint u, uint per, HeadTables h) {
  uint b = slot * kMaxHd, e = ((gl_LocalInvocationID.x & 63u) + 64u * u) * per;
  float lo = e < 2u * args.half_dims ? element_rot(b, e, h.c[u][0], h.s[u][0]) : xin(b + e);
  float hi = 0.0;
  if (per == 2u) hi = e + 1u < 2u * args.half_dims ? element_rot(b, e + 1u, h.c[u][1], h.s[u][1]) : xin(b + e + 1u);
  return sb_encode_word(lo, hi, DT);
}
#endif
#endif

// Output word wd (and the cache's: rows from pos, contiguous in a [S, h, hd] cache).
void put(uint wd, uint per) {
  uint i = wd * per;
  float lo = element(i);
  float hi = (per == 2u && i + 1u < args.n) ? element(i + 1u) : 0.0;
  uint word = sb_encode_word(lo, hi, DT);
  o[wd] = word;
  if (args.has_cache != 0u) cache[(first_pos() * args.h * HD) / per + wd] = word;
}

void main() {
  uint per = sb_per_word(DT);
#if defined(ROPE_QKV)
  uint heads = args.q_heads + 2u * args.k_heads;
  uint g = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x, slot = gl_LocalInvocationID.x >> 6u;
  uint t = gl_LocalInvocationID.x & 63u, hs = kSlots * g + slot;  // the slot's (row, head) pair
  if (kSlots * g >= args.m * heads) return;  // uniform over the workgroup
  bool live = hs < args.m * heads;
  uint row = live ? hs / heads : 0u, j = live ? hs % heads : 0u, p = first_pos() + row, words = HD / per;
  uint first_k = args.h - 2u * args.k_heads;
  uint src = (row * args.h + (j < args.q_heads ? j : first_k + j - args.q_heads)) * HD;
  bool value = j >= args.q_heads + args.k_heads, query = j < args.q_heads;
  if (live && value) {  // a value head: its words as they are
    uint dst = ((p * args.k_heads + j - args.q_heads - args.k_heads) * HD) / per;
    for (uint k = t; k < words; k += 64u) v_cache[dst + k] = x[src / per + k];
  }
  bool norm = live && !value && (query ? args.has_norm != 0u : args.has_k_norm != 0u);
  HeadTables tab = head_tables(per, p);
  stage_head(slot, live && !value, src, norm, args.has_norm != 0u || args.has_k_norm != 0u, query ? 0u : 1u);
  if (!live || value) return;
  uint dst = query ? ((row * args.q_heads + j) * HD) / per : ((p * args.k_heads + j - args.q_heads) * HD) / per;
  [[unroll]] for (uint u = 0u; u < kMaxHd / 64u; ++u) {
    uint k = t + 64u * u;
    if (k >= words) break;
    uint word = head_word_at(slot, u, per, tab);
    if (query) {
      o[dst + k] = word;
    } else {
      cache[dst + k] = word;
    }
  }
#elif defined(ROPE_NORM)
  uint g = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x, t = gl_LocalInvocationID.x;
  if (g >= args.m * args.h) return;  // uniform over the workgroup
  uint base = g * HD;
  stage_head(0u, true, base, true, true, 0u);
  uint words = HD / per;  // 16-bit heads have even hd (host)
  for (uint k = t; k < words; k += 64u) put(base / per + k, per);
#else
  uint wd = sb_linear_id();
  if (wd * per >= args.n) return;
  put(wd, per);
#endif
}
