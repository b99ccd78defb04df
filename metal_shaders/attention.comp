// Kernel variants of this file, one line each (metal_shaders/README.md, "Variants"):
// SB_KERNEL(attention, ATTENTION, "rrrrbw", AttentionArgs, SB_ATTENTION_ARGS, 128, 0)
// SB_KERNEL(attention_blocks, ATTENTION_BLOCKS, "rrrwr", AttentionArgs, SB_ATTENTION_ARGS, 128, 0)
// SB_KERNEL(attention_merge, ATTENTION_MERGE, "rrwr", AttentionArgs, SB_ATTENTION_ARGS, 128, 0)
// attention_blocks of one decode row that first computes Rope's q/k/v form itself: x (q, k and v
// heads), the caches (the new key and value appended), scratch, dyn, cos, sin, the norm weights.
// SB_KERNEL(attention_blocks_rope, ATTENTION_BLOCKS_ROPE, "rbbwrrrrr", AttentionRopeArgs, SB_ATTENTION_ROPE_ARGS, 128, 0)
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// Attention over a KV cache (schema AttentionNode) in the orders of docs/numerics.md; twin of
// cpu_fallback/attention.cpp.
// ATTENTION (order Decomposed). Thread -> output: workgroup w computes query row i = w / hq of
// head h = w % hq. Invocation t scores keys t, t + 128, ... (each a dot32 of its own: 32
// partials over the head dims, then the halving tree), keeps the row's scores, then exps,
// then probabilities (in shared memory up to 4096 keys, else in `scratch`); thread 0 alone
// adds the exps in key order; then t
// computes output columns t, t + 128, ...: 32 partials over the keys (key j feeds partial
// j % 32), the halving tree, one rounding. Every step rounds to the dtype as the
// decomposed ops (BatchMatmul, Mul, Add, Softmax, BatchMatmul) store their results.
// ATTENTION_BLOCKS (order Blocked32). Thread -> output: workgroup w is split s = w % nsplit of
// pair r = w / nsplit (row row0 + r / hq, head r % hq) and takes key blocks b = s, s + nsplit,
// ... in turn; per block thread t holds partials 8 (t % 4) .. +7 of key t / 4's dot32, threads
// 0..31 finish key t's score and exp, thread t sums o_b columns t, t + 128; thread 0 writes
// (m_b, l_b). Blocks without a visible key write nothing. A block's values do not depend on
// the split that computes it.
// ATTENTION_BLOCKS_ROPE: ATTENTION_BLOCKS for one query row at position `at` whose q, k and v
// are Rope's q/k/v form input x: each workgroup normalizes and rotates its query head as
// rope_qkv would (threads 0..31 the norm's partials); a workgroup whose blocks hold key `at`
// does the same for the new key (threads 32..63) and takes key `at` from shared memory and its
// value from x (the cache may not hold them yet); the group's first query head's workgroup
// appends them to the caches. The same bits as rope_qkv, then ATTENTION_BLOCKS.
// ATTENTION_MERGE (order Blocked32). Thread -> output: workgroup w is pair w. Up to kMerge
// blocks, the merge's exps come first: thread 0 walks the running max, thread t computes the
// factors a, c of blocks t, t + 128, ... into shared memory; then thread t merges output words
// t, t + 128, ... (one or two columns a word) in block order. Past kMerge blocks each thread
// walks the blocks itself (the same operations).
#include "common.glsl"

layout(local_size_x = 128) in;
#ifdef ATTENTION_BLOCKS_ROPE
#define ATTENTION_BLOCKS
layout(push_constant) uniform Args { SB_ATTENTION_ROPE_ARGS } args;
#else
layout(push_constant) uniform Args { SB_ATTENTION_ARGS } args;
#endif
const uint kT = 128u;
const uint kMaxHd = 256u;  // the host refuses larger heads

#include "attention_common.glsl"

// Halving tree 16, 8, 4, 2, 1 over 32 partials.
#define SB_TREE32(p)                                                   \
  [[unroll]] for (uint h2 = 16u; h2 >= 1u; h2 >>= 1u) {                \
    [[unroll]] for (uint l = 0u; l < h2; ++l) p[l] = p[l] + p[l + h2]; \
  }

#ifdef ATTENTION
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
#endif  // ATTENTION

#if defined(ATTENTION_BLOCKS) || defined(ATTENTION_MERGE)

// The first query's position: pos, plus the word the host writes per execution where pos is
// an input (word 0 is always 0), so a recorded decode step replays at any position.
uint first_pos();

// Pair r of this dispatch: its query row's visible keys [lo, hi) (op_shapes.h visible_keys).
void visible(uint r, out uint lo, out uint hi) {
  uint at = first_pos() + args.row0 + r / args.hq;
  lo = first_visible(at);
  hi = at + 1u;
}
uint ml_at(uint r, uint b) { return (r * args.nb + b) * 2u; }
uint ob_at(uint r, uint b) { return args.rows * args.hq * args.nb * 2u + (r * args.nb + b) * HD; }
#endif

#ifdef ATTENTION_BLOCKS
layout(std430, binding = 0) readonly buffer Q { uint q[]; };  // ATTENTION_BLOCKS_ROPE: Rope's x
#ifdef ATTENTION_BLOCKS_ROPE
layout(std430, binding = 1) buffer K { uint k[]; };
layout(std430, binding = 2) buffer V { uint v[]; };
#else
layout(std430, binding = 1) readonly buffer K { uint k[]; };
layout(std430, binding = 2) readonly buffer V { uint v[]; };
#endif
layout(std430, binding = 3) writeonly buffer Scratch { float scratch[]; };
layout(std430, binding = 4) readonly buffer Dyn { uint dyn[]; };
uint first_pos() { return args.pos + dyn[args.pos_word]; }
#ifdef ATTENTION_BLOCKS_ROPE
layout(std430, binding = 5) readonly buffer C { float cos_t[]; };
layout(std430, binding = 6) readonly buffer S { float sin_t[]; };
layout(std430, binding = 7) readonly buffer W { uint w[]; };
layout(std430, binding = 8) readonly buffer KW { uint kw[]; };
#define W_DT SB_SPEC(kSpecDt1, (args.rope_flags >> 8u) & 0xffu)    // the query norm weights
#define KW_DT SB_SPEC(kSpecDt2, (args.rope_flags >> 16u) & 0xffu)  // the key norm weights
#define SB_ROPE_STAGED
shared float s_x[2u * kMaxHd];  // the query head row at 0, the new key's at kMaxHd
shared float s_knew[kMaxHd];    // the new key as the cache holds it
shared float s_rp[64];          // the norms' partials: query 0..31, key 32..63
shared float s_rinv[2];
float xin(uint i) { return s_x[i]; }
#include "norm_common.glsl"
#include "rope_common.glsl"
uint g_jnew = 0xffffffffu;  // the new key's position where this workgroup's blocks hold it
uint g_vnew = 0u;           // its value's first element in x
#endif

shared float s_q[kMaxHd];
shared float s_part[kBlock * 33u];  // key kk's 32 partials at kk * 33 (padded against bank clashes)
shared float s_s[kBlock];
shared float s_mx[kBlock];  // the block max's halving tree
shared float s_e[kBlock];

// Key block b of pair r (head kh of query row i; s_q holds the query).
void block(uint r, uint b, uint kh, uint lo, uint hi) {
  uint t = gl_LocalInvocationID.x, hd = HD, b0 = b * kBlock;
  uint j0 = max(lo, b0), j1 = min(hi, b0 + kBlock);

  // dot32(q, k_j): this thread's 8 partials l = g8 .. g8 + 7 over dims e = l, l + 32, ...
  uint kk = t >> 2u, g8 = (t & 3u) * 8u, j = b0 + kk;
  if (j >= j0 && j < j1) {
    precise float p[8];
    [[unroll]] for (uint l = 0u; l < 8u; ++l) p[l] = 0.0;
    uint kb = key_at(kh, j);
    // Unrolled over the head's chunks of 32 dims so the loads are issued ahead of the adds.
    [[unroll]] for (uint e0 = 0u; e0 < kMaxHd; e0 += 32u) {
      if (e0 < hd) {
        float kx[8];
#ifdef ATTENTION_BLOCKS_ROPE
        // The new key from shared memory: its cache row is being written by another workgroup.
        [[dont_flatten]] if (j == g_jnew) {
          [[unroll]] for (uint l = 0u; l < 8u; ++l) kx[l] = e0 + g8 + l < hd ? s_knew[e0 + g8 + l] : 0.0;
        } else
#endif
        {
          [[unroll]] for (uint l = 0u; l < 8u; ++l) kx[l] = e0 + g8 + l < hd ? SB_LOAD(k, ADT, kb + e0 + g8 + l) : 0.0;
        }
        [[unroll]] for (uint l = 0u; l < 8u; ++l) {
          if (e0 + g8 + l < hd) p[l] = p[l] + s_q[e0 + g8 + l] * kx[l];
        }
      }
    }
    [[unroll]] for (uint l = 0u; l < 8u; ++l) s_part[kk * 33u + g8 + l] = p[l];
  }
  barrier();
  if (t < kBlock && b0 + t >= j0 && b0 + t < j1) {
    precise float p[32];
    [[unroll]] for (uint l = 0u; l < 32u; ++l) p[l] = s_part[t * 33u + l];
    SB_TREE32(p)
    precise float x = rnd(p[0]);
    s_s[t] = rnd(x * args.scale);
  }
  barrier();

  // m_b (order-free: a halving tree over the visible keys' scores), e_j = exp(s_j - m_b), then
  // l_b and o_b in key order.
  if (t < kBlock) s_mx[t] = s_s[clamp(t + b0, j0, j1 - 1u) - b0];  // repeats change no max
  barrier();
  [[unroll]] for (uint h = 16u; h >= 1u; h >>= 1u) {
    if (t < h) s_mx[t] = sb_max(s_mx[t], s_mx[t + h]);
    barrier();
  }
  float mb = s_mx[0];
  if (t < kBlock && b0 + t >= j0 && b0 + t < j1) {
    precise float d = s_s[t] - mb;
    s_e[t] = sb_exp(d);
  }
  barrier();
  uint obase = ob_at(r, b);
  for (uint c = t; c < hd; c += kT) {
    // Key order; the block's values loaded at once (clamped, never past the visible keys).
    float vx[kBlock];
#ifdef ATTENTION_BLOCKS_ROPE
    // The new key's block (uniform): its value from x, never from the cache row being written.
    [[dont_flatten]] if (g_jnew >= b0 && g_jnew < b0 + kBlock) {
      [[unroll]] for (uint l = 0u; l < kBlock; ++l) {
        uint jj = clamp(b0 + l, j0, j1 - 1u);
        [[dont_flatten]] if (jj == g_jnew) vx[l] = SB_LOAD(q, ADT, g_vnew + c);
        else vx[l] = SB_LOAD(v, ADT, key_at(kh, jj) + c);
      }
    } else
#endif
    {
      [[unroll]] for (uint l = 0u; l < kBlock; ++l) vx[l] = SB_LOAD(v, ADT, key_at(kh, clamp(b0 + l, j0, j1 - 1u)) + c);
    }
    precise float acc = 0.0;
    [[unroll]] for (uint l = 0u; l < kBlock; ++l) {
      if (b0 + l >= j0 && b0 + l < j1) acc = acc + s_e[l] * vx[l];
    }
    scratch[obase + c] = acc;
  }
  if (t == 0u) {
    float ex[kBlock];
    [[unroll]] for (uint l = 0u; l < kBlock; ++l) ex[l] = s_e[l];
    precise float lb = 0.0;
    [[unroll]] for (uint l = 0u; l < kBlock; ++l) {
      if (b0 + l >= j0 && b0 + l < j1) lb = lb + ex[l];
    }
    scratch[ml_at(r, b)] = mb;
    scratch[ml_at(r, b) + 1u] = lb;
  }
  barrier();  // the next block reuses the shared arrays
}

#ifdef ATTENTION_BLOCKS_ROPE
// Rope's q/k/v form for query head h of the row at position `at` (x row 0) -> s_q; where this
// split's blocks hold key `at`, the new key -> s_knew (g_jnew, g_vnew set), and the group's
// first query head appends the key and the value to the caches.
void rope_heads(uint split, uint h, uint kh, uint at) {
  uint t = gl_LocalInvocationID.x, hd = HD, per = sb_per_word(ADT);
  uint xh = args.x_heads, kbase = (xh - 2u * args.hk + kh) * hd, vbase = (xh - args.hk + kh) * hd;
  uint bnew = at / kBlock;
  bool fresh = bnew >= split && (bnew - split) % args.nsplit == 0u;  // uniform
  bool qn = (args.rope_flags & 1u) != 0u, kn = (args.rope_flags & 2u) != 0u;
  for (uint c = t; c < hd; c += kT) {
    s_x[c] = SB_LOAD(q, ADT, h * hd + c);
    if (fresh) s_x[kMaxHd + c] = SB_LOAD(q, ADT, kbase + c);
  }
  barrier();
  if (t < 32u && qn) s_rp[t] = head_partial(0u, t);
  if (t >= 32u && t < 64u && fresh && kn) s_rp[t] = head_partial(kMaxHd, t - 32u);
  barrier();
  if (t == 0u || t == 32u) {
    float part[32];
    [[unroll]] for (uint l = 0u; l < 32u; ++l) part[l] = s_rp[t + l];
    if (t == 0u ? qn : fresh && kn) s_rinv[t / 32u] = sb_tree32_rsqrt(part, args.inv_d, args.eps);
  }
  barrier();
  for (uint c = t; c < hd; c += kT) {
    if (qn) s_x[c] = head_normalized(s_x[c], s_rinv[0], SB_LOAD(w, W_DT, c));
    if (fresh && kn) s_x[kMaxHd + c] = head_normalized(s_x[kMaxHd + c], s_rinv[1], SB_LOAD(kw, KW_DT, c));
  }
  barrier();
  for (uint c = t; c < hd; c += kT) {
    s_q[c] = rnd(element_at(0u, c, at));
    if (fresh) s_knew[c] = rnd(element_at(kMaxHd, c, at));
  }
  if (fresh) {
    g_jnew = at;
    g_vnew = vbase;
  }
  barrier();
  if (fresh && h % (args.hq / args.hk) == 0u) {  // the caches' rows at `at`, as rope_qkv writes them
    uint kw0 = key_at(kh, at) / per, vw0 = vbase / per;
    for (uint wd = t; wd < hd / per; wd += kT) {
      uint c = wd * per;
      k[kw0 + wd] = sb_encode_word(s_knew[c], per == 2u ? s_knew[c + 1u] : 0.0, ADT);
      v[kw0 + wd] = q[vw0 + wd];
    }
  }
}
#endif

void main() {
  uint t = gl_LocalInvocationID.x;
  uint w = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (w >= args.rows * args.hq * args.nsplit) return;  // uniform over the workgroup
  uint split = w % args.nsplit, r = w / args.nsplit, hd = HD;
  uint i = args.row0 + r / args.hq, h = r % args.hq, kh = h / (args.hq / args.hk);
  uint lo, hi;
  visible(r, lo, hi);
  if (split * kBlock >= hi) return;  // uniform: no visible block for this split
#ifdef ATTENTION_BLOCKS_ROPE
  rope_heads(split, h, kh, hi - 1u);
#else
  for (uint c = t; c < hd; c += kT) s_q[c] = SB_LOAD(q, ADT, (i * args.hq + h) * hd + c);
  barrier();
#endif
  for (uint b = split; b < args.nb && b * kBlock < hi; b += args.nsplit) {
    if (b * kBlock + kBlock > lo) block(r, b, kh, lo, hi);
  }
}
#endif  // ATTENTION_BLOCKS

#ifdef ATTENTION_MERGE
layout(std430, binding = 0) readonly buffer S { uint sinks[]; };
layout(std430, binding = 1) readonly buffer Scratch { float scratch[]; };
layout(std430, binding = 2) writeonly buffer O { uint o[]; };
layout(std430, binding = 3) readonly buffer Dyn { uint dyn[]; };
uint first_pos() { return args.pos + dyn[args.pos_word]; }

const uint kMerge = 1024u;
shared float s_m[kMerge];  // the state's max after block b (first .. last)
shared float s_a[kMerge];  // exp(m before - m after) of block b
shared float s_c[kMerge];  // exp(m_b - m after) of block b

void main() {
  uint t = gl_LocalInvocationID.x;
  uint r = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (r >= args.rows * args.hq) return;  // uniform over the workgroup
  uint i = args.row0 + r / args.hq, h = r % args.hq, hd = HD;
  uint lo, hi;
  visible(r, lo, hi);
  uint first = lo / kBlock, last = (hi - 1u) / kBlock, count = last - first + 1u;
  bool staged = count <= kMerge;
  if (staged) {
    if (t == 0u) {
      float m = scratch[ml_at(r, first)];
      s_m[0] = m;
      uint b = 1u;
      for (; b + 8u <= count; b += 8u) {  // eight maxima loaded ahead
        float mx[8];
        [[unroll]] for (uint u = 0u; u < 8u; ++u) mx[u] = scratch[ml_at(r, first + b + u)];
        [[unroll]] for (uint u = 0u; u < 8u; ++u) {
          m = sb_max(m, mx[u]);
          s_m[b + u] = m;
        }
      }
      for (; b < count; ++b) {
        m = sb_max(m, scratch[ml_at(r, first + b)]);
        s_m[b] = m;
      }
    }
    barrier();
    for (uint b = t + 1u; b < count; b += kT) {
      precise float da = s_m[b - 1u] - s_m[b], dc = scratch[ml_at(r, first + b)] - s_m[b];
      s_a[b] = sb_exp(da);
      s_c[b] = sb_exp(dc);
    }
    barrier();
  }
  uint per = sb_per_word(ADT), words = hd / per;
  for (uint wd = t; wd < words; wd += kT) {
    uint c = wd * per;
    // The state (m, l, o) starts as the first block's and takes in each later one.
    precise float m = scratch[ml_at(r, first)], l = scratch[ml_at(r, first) + 1u];
    precise float o0 = scratch[ob_at(r, first) + c];
    precise float o1 = per == 2u ? scratch[ob_at(r, first) + c + 1u] : 0.0;
    uint b = first + 1u;
    if (staged) {  // the same steps, eight blocks' partials loaded ahead
      for (; b + 8u <= last + 1u; b += 8u) {
        float lx[8], ox0[8], ox1[8];
        [[unroll]] for (uint u = 0u; u < 8u; ++u) {
          lx[u] = scratch[ml_at(r, b + u) + 1u];
          ox0[u] = scratch[ob_at(r, b + u) + c];
          ox1[u] = per == 2u ? scratch[ob_at(r, b + u) + c + 1u] : 0.0;
        }
        [[unroll]] for (uint u = 0u; u < 8u; ++u) {
          float a = s_a[b + u - first], cc = s_c[b + u - first];
          m = s_m[b + u - first];
          l = l * a + lx[u] * cc;
          o0 = o0 * a + ox0[u] * cc;
          o1 = o1 * a + ox1[u] * cc;
        }
      }
    }
    for (; b <= last; ++b) {
      float a, cc;
      if (staged) {
        a = s_a[b - first];
        cc = s_c[b - first];
        m = s_m[b - first];
      } else {
        float mb = scratch[ml_at(r, b)];
        float mn = sb_max(m, mb);
        precise float da = m - mn, dc = mb - mn;
        a = sb_exp(da);
        cc = sb_exp(dc);
        m = mn;
      }
      l = l * a + scratch[ml_at(r, b) + 1u] * cc;
      o0 = o0 * a + scratch[ob_at(r, b) + c] * cc;
      if (per == 2u) o1 = o1 * a + scratch[ob_at(r, b) + c + 1u] * cc;
    }
    if (args.has_sinks != 0u) {  // a block of one key with l = 1 and no values
      precise float sv = SB_LOAD(sinks, ADT, h) + 0.0;
      sv = rnd(sv);
      float mn = sb_max(m, sv);
      precise float da = m - mn, dc = sv - mn;
      float a = sb_exp(da);
      l = l * a + sb_exp(dc);
      o0 = o0 * a;
      o1 = o1 * a;
    }
    float rc = sb_rcp(l);
    precise float y0 = o0 * rc, y1 = o1 * rc;
    o[(i * args.hq + h) * words + wd] = per == 1u ? floatBitsToUint(rnd(y0)) : sb_encode_word(y0, y1, ADT);
  }
}
#endif  // ATTENTION_MERGE

