// Kernel variants of this file, one line each (metal_shaders/README.md, "Variants"):
// SB_KERNEL(rope, ROPE, "rrrwwr", RopeArgs, SB_ROPE_ARGS, 256, 0)
// SB_KERNEL(rope_norm, ROPE_NORM, "rrrwwrr", RopeArgs, SB_ROPE_ARGS, 64, 0)
// SB_KERNEL(rope_qkv, ROPE_QKV, "rrrwwrrrw", RopeArgs, SB_ROPE_ARGS, 64, 0)
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
// ROPE_QKV (the fused q/k/v form). Thread -> output: workgroup g is row g / H', head j = g % H'
// of the H' = q_heads + 2 k_heads heads read: a query (-> out), a key (-> the cache) or a value
// (-> v_cache, its words copied); queries and keys as ROPE_NORM (the norm when given).
#include "common.glsl"
#include "norm_common.glsl"

#if defined(ROPE_NORM) || defined(ROPE_QKV)
#define ROPE_BY_HEAD
layout(local_size_x = 64) in;
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
shared float s_part[32];
shared float s_inv;
shared float s_x[kMaxHd];  // the head row, then (normalized, rounded as RmsNorm stores it)
float xin(uint i) { return s_x[i % HD]; }
#else
float xin(uint i) { return SB_LOAD(x, DT, i); }
#endif

#include "rope_common.glsl"

float element(uint i) {
  uint r = i / HD;
  return element_at(r * HD, i % HD, first_pos() + r / args.h);
}

#ifdef ROPE_BY_HEAD
// Stages the head row at element base; with a norm, RmsNorm'd (Tree32) by weight words `wsel`
// (0: w, 1: kw) in place, rounded to x's dtype.
void stage_head(uint base, bool norm, uint wsel) {
  uint t = gl_LocalInvocationID.x;
  for (uint e = t; e < HD; e += 64u) s_x[e] = SB_LOAD(x, DT, base + e);
  barrier();
  if (!norm) return;  // uniform over the workgroup
  if (t < 32u) s_part[t] = head_partial(0u, t);
  barrier();
  if (t == 0u) s_inv = sb_tree32_rsqrt(s_part, args.inv_d, args.eps);
  barrier();
  for (uint e = t; e < HD; e += 64u) {
#ifdef ROPE_QKV
    float we = wsel == 0u ? SB_LOAD(w, W_DT, e) : SB_LOAD(kw, KW_DT, e);
#else
    float we = SB_LOAD(w, W_DT, e);
#endif
    s_x[e] = head_normalized(s_x[e], s_inv, we);
  }
  barrier();
}

// The staged head's words, rotated at position p, as 16-bit pairs or f32 words (hd even for 16 bits).
uint head_word(uint k, uint per, uint p) {
  float lo = element_at(0u, k * per, p);
  float hi = per == 2u ? element_at(0u, k * per + 1u, p) : 0.0;
  return sb_encode_word(lo, hi, DT);
}
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
  uint g = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x, t = gl_LocalInvocationID.x;
  if (g >= args.m * heads) return;  // uniform over the workgroup
  uint row = g / heads, j = g % heads, p = first_pos() + row, words = HD / per;
  uint first_k = args.h - 2u * args.k_heads;
  uint src = (row * args.h + (j < args.q_heads ? j : first_k + j - args.q_heads)) * HD;
  if (j >= args.q_heads + args.k_heads) {  // a value head: its words as they are
    uint dst = ((p * args.k_heads + j - args.q_heads - args.k_heads) * HD) / per;
    for (uint k = t; k < words; k += 64u) v_cache[dst + k] = x[src / per + k];
    return;
  }
  bool query = j < args.q_heads;
  stage_head(src, query ? args.has_norm != 0u : args.has_k_norm != 0u, query ? 0u : 1u);
  if (query) {
    uint dst = ((row * args.q_heads + j) * HD) / per;
    for (uint k = t; k < words; k += 64u) o[dst + k] = head_word(k, per, p);
  } else {
    uint dst = ((p * args.k_heads + j - args.q_heads) * HD) / per;
    for (uint k = t; k < words; k += 64u) cache[dst + k] = head_word(k, per, p);
  }
#elif defined(ROPE_NORM)
  uint g = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x, t = gl_LocalInvocationID.x;
  if (g >= args.m * args.h) return;  // uniform over the workgroup
  uint base = g * HD;
  stage_head(base, true, 0u);
  uint words = HD / per;  // 16-bit heads have even hd (host)
  for (uint k = t; k < words; k += 64u) put(base / per + k, per);
#else
  uint wd = sb_linear_id();
  if (wd * per >= args.n) return;
  put(wd, per);
#endif
}
