// Kernel variants of this file, one line each (metal_shaders/README.md, "Variants"):
// SB_KERNEL(attention_blocks, ATTENTION_BLOCKS, "rrrwr", AttentionArgs, SB_ATTENTION_ARGS, 128, 0)
// SB_KERNEL(attention_merge, ATTENTION_MERGE, "rrwr", AttentionArgs, SB_ATTENTION_ARGS, 128, 0)
// attention_blocks of one decode row that first computes Rope's q/k/v form itself: x (q, k and v
// heads), the caches (the new key and value appended), scratch, dyn, cos, sin, the norm weights,
// the pairs' counters of splits done.
// SB_KERNEL(attention_blocks_rope, ATTENTION_BLOCKS_ROPE, "rbbwrrrrrb", AttentionRopeArgs, SB_ATTENTION_ROPE_ARGS, 128, 0)
// attention_merge recorded straight after attention_blocks_rope (no barrier): attention_merge's
// bindings, then the blocks' counters and the error word.
// SB_KERNEL(attention_merge_wait, ATTENTION_MERGE_WAIT, "rrwrrb", AttentionArgs, SB_ATTENTION_ARGS, 128, 0)
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// Attention over a KV cache (schema AttentionNode) in order Blocked32 (docs/numerics.md); twin
// of cpu_fallback/attention.cpp (order Decomposed: attention_decomposed.comp).
// ATTENTION_BLOCKS (order Blocked32). Thread -> output: workgroup w is split s = w % nsplit of
// pair r = w / nsplit (row row0 + r / hq, head r % hq) and takes key blocks b = s, s + nsplit,
// ... in turn; per block thread t holds partials 8 (t % 4) .. +7 of key t / 4's dot32, threads
// 0..31 finish key t's score and exp, thread t sums o_b columns t, t + 128; thread 0 writes
// (m_b, l_b). Blocks without a visible key write nothing. A block's values do not depend on
// the split that computes it. A split's first block's keys and values are read into registers
// with the query (one round trip of loads instead of three), each later block's once the block
// before it is done.
// ATTENTION_BLOCKS_ROPE: ATTENTION_BLOCKS for one query row at position `at` whose q, k and v
// are Rope's q/k/v form input x: each workgroup normalizes and rotates its query head as
// rope_qkv would (threads 0..31 the norm's partials); a workgroup whose blocks hold key `at`
// does the same for the new key (threads 32..63) and takes key `at` from shared memory and its
// value from x (the cache may not hold them yet); the group's first query head's workgroup
// appends them to the caches. The same bits as rope_qkv, then ATTENTION_BLOCKS. The norm
// weights and the position's table entries are read with x and the first block's keys. Each
// workgroup, its partials stored and made visible, counts itself in its pair's counter.
// ATTENTION_MERGE (order Blocked32). Thread -> output: workgroup w is pair w. Up to kAll
// blocks (head dims <= 128), every partial of the row is copied into shared memory in one round
// of loads first, then the steps below read them there (the running max as a doubling scan over
// threads 0..count-1, the same maxima). Up to kMerge
// blocks, the merge's exps come first: thread 0 walks the running max, thread t computes the
// factors a, c of blocks t, t + 128, ... into shared memory; then thread t merges output words
// t, t + 128, ... (one or two columns a word) in block order. Past kMerge blocks each thread
// walks the blocks itself (the same operations).
// ATTENTION_MERGE_WAIT: ATTENTION_MERGE whose workgroup first waits (thread 0 polls, bounded)
// until every split of its pair has counted itself: it may run beside attention_blocks_rope.
#include "common.glsl"

#ifdef ATTENTION_MERGE_WAIT
#define ATTENTION_MERGE
#define SB_MERGE_WAIT
#endif

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
#ifdef ATTENTION_BLOCKS_ROPE  // read by attention_merge_wait as it is written
layout(std430, binding = 3) coherent writeonly buffer Scratch { float scratch[]; };
#else
layout(std430, binding = 3) writeonly buffer Scratch { float scratch[]; };
#endif
layout(std430, binding = 4) readonly buffer Dyn { uint dyn[]; };
uint first_pos() { return args.pos + dyn[args.pos_word]; }
#ifdef ATTENTION_BLOCKS_ROPE
layout(std430, binding = 9) coherent buffer Cn { uint counters[]; };  // per pair: splits done, zero at start
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
float knew_at(uint e) { return s_knew[e]; }
#else
float knew_at(uint e) { return 0.0; }  // (never called: no new key)
#endif
uint g_jnew = 0xffffffffu;  // ATTENTION_BLOCKS_ROPE: the new key's position where this split's blocks hold it
uint g_vnew = 0u;           // its value's first element in x

shared float s_q[kMaxHd];
shared float s_part[kBlock * 33u];  // key kk's 32 partials at kk * 33 (padded against bank clashes)
shared float s_s[kBlock];
shared float s_mx[kBlock];  // the block max's halving tree
shared float s_e[kBlock];

// A key block's global reads for this thread, issued before the work that needs them (one round
// trip with the query's): key t / 4's dims e0 + 8 (t % 4) + [0, 8) of each chunk e0 of 32 (kx
// [e0 / 4 + l]), and column t + kT u's values of the block's keys (vx[u][l], clamped to the visible
// keys). The new key's cache row, which another workgroup writes, is never read: its key comes
// from s_knew later and its value from x.
struct BlockRegs {
  float kx[kMaxHd / 4u];
  float vx[kMaxHd / kT][kBlock];
};

void block_load(uint b, uint kh, uint lo, uint hi, out BlockRegs g) {
  uint t = gl_LocalInvocationID.x, hd = HD, b0 = b * kBlock;
  uint j0 = max(lo, b0), j1 = min(hi, b0 + kBlock);
  uint kk = t >> 2u, g8 = (t & 3u) * 8u, j = b0 + kk, kb = key_at(kh, j);
  bool live = j >= j0 && j < j1 && j != g_jnew;
  [[unroll]] for (uint e0 = 0u; e0 < kMaxHd; e0 += 32u) {
    [[unroll]] for (uint l = 0u; l < 8u; ++l) {
      g.kx[e0 / 4u + l] = 0.0;
      if (live && e0 + g8 + l < hd) g.kx[e0 / 4u + l] = SB_LOAD(k, ADT, kb + e0 + g8 + l);
    }
  }
  bool fresh = g_jnew >= b0 && g_jnew < b0 + kBlock;  // uniform: the new key's block
  [[unroll]] for (uint u = 0u; u < kMaxHd / kT; ++u) {
    uint c = t + kT * u;
    [[unroll]] for (uint l = 0u; l < kBlock; ++l) g.vx[u][l] = 0.0;
    if (c >= hd) continue;
    [[dont_flatten]] if (fresh) {
      [[unroll]] for (uint l = 0u; l < kBlock; ++l) {
        uint jj = clamp(b0 + l, j0, j1 - 1u);
        [[dont_flatten]] if (jj == g_jnew) g.vx[u][l] = SB_LOAD(q, ADT, g_vnew + c);
        else g.vx[u][l] = SB_LOAD(v, ADT, key_at(kh, jj) + c);
      }
    } else {
      [[unroll]] for (uint l = 0u; l < kBlock; ++l) g.vx[u][l] = SB_LOAD(v, ADT, key_at(kh, clamp(b0 + l, j0, j1 - 1u)) + c);
    }
  }
}

// Key block b of pair r (head kh of query row i; s_q holds the query, g the block's reads).
void block(uint r, uint b, uint kh, uint lo, uint hi, BlockRegs g) {
  uint t = gl_LocalInvocationID.x, hd = HD, b0 = b * kBlock;
  uint j0 = max(lo, b0), j1 = min(hi, b0 + kBlock);

  // dot32(q, k_j): this thread's 8 partials l = g8 .. g8 + 7 over dims e = l, l + 32, ...
  uint kk = t >> 2u, g8 = (t & 3u) * 8u, j = b0 + kk;
  if (j >= j0 && j < j1) {
    precise float p[8];
    [[unroll]] for (uint l = 0u; l < 8u; ++l) p[l] = 0.0;
    bool knew = j == g_jnew;
    [[unroll]] for (uint e0 = 0u; e0 < kMaxHd; e0 += 32u) {
      if (e0 < hd) {
        [[unroll]] for (uint l = 0u; l < 8u; ++l) {
          float kx = knew && e0 + g8 + l < hd ? knew_at(e0 + g8 + l) : g.kx[e0 / 4u + l];
          if (e0 + g8 + l < hd) p[l] = p[l] + s_q[e0 + g8 + l] * kx;
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
  [[unroll]] for (uint u = 0u; u < kMaxHd / kT; ++u) {
    uint c = t + kT * u;
    if (c >= hd) continue;
    precise float acc = 0.0;
    [[unroll]] for (uint l = 0u; l < kBlock; ++l) {
      if (b0 + l >= j0 && b0 + l < j1) acc = acc + s_e[l] * g.vx[u][l];
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
// split's blocks hold key `at` (g_jnew set), the new key -> s_knew, and the group's first query
// head appends the key and the value to the caches. Block b0's reads (g) are issued after x's
// and with the norm weights' and the tables' (one round trip), where b0 < args.nb.
void rope_heads(uint h, uint kh, uint at, uint b0, uint lo, uint hi, out BlockRegs g) {
  uint t = gl_LocalInvocationID.x, hd = HD, per = sb_per_word(ADT);
  uint xh = args.x_heads, kbase = (xh - 2u * args.hk + kh) * hd, vbase = (xh - args.hk + kh) * hd;
  bool fresh = g_jnew != 0xffffffffu;  // uniform
  bool qn = (args.rope_flags & 1u) != 0u, kn = (args.rope_flags & 2u) != 0u;
  const uint kE = kMaxHd / kT;  // elements a thread: c = t + kT u
  float xq[kE], xk[kE], wq[kE], wk[kE], cs[kE], sn[kE];
  [[unroll]] for (uint u = 0u; u < kE; ++u) {
    uint c = t + kT * u;
    xq[u] = xk[u] = wq[u] = wk[u] = cs[u] = sn[u] = 0.0;
    if (c >= hd) continue;
    xq[u] = SB_LOAD(q, ADT, h * hd + c);
    if (fresh) xk[u] = SB_LOAD(q, ADT, kbase + c);
  }
  [[unroll]] for (uint u = 0u; u < kE; ++u) {
    uint c = t + kT * u;
    if (c >= hd) continue;
    if (qn) wq[u] = SB_LOAD(w, W_DT, c);
    if (fresh && kn) wk[u] = SB_LOAD(kw, KW_DT, c);
    if (c < 2u * args.half_dims) {
      cs[u] = rnd(cos_t[table_at(c, at)]);
      sn[u] = rnd(sin_t[table_at(c, at)]);
    }
  }
  if (b0 < args.nb) block_load(b0, kh, lo, hi, g);
  [[unroll]] for (uint u = 0u; u < kE; ++u) {
    uint c = t + kT * u;
    if (c >= hd) continue;
    s_x[c] = xq[u];
    if (fresh) s_x[kMaxHd + c] = xk[u];
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
  [[unroll]] for (uint u = 0u; u < kE; ++u) {
    uint c = t + kT * u;
    if (c >= hd) continue;
    if (qn) s_x[c] = head_normalized(s_x[c], s_rinv[0], wq[u]);
    if (fresh && kn) s_x[kMaxHd + c] = head_normalized(s_x[kMaxHd + c], s_rinv[1], wk[u]);
  }
  barrier();
  [[unroll]] for (uint u = 0u; u < kE; ++u) {
    uint c = t + kT * u;
    if (c >= hd) continue;
    s_q[c] = rnd(element_rot(0u, c, cs[u], sn[u]));
    if (fresh) s_knew[c] = rnd(element_rot(kMaxHd, c, cs[u], sn[u]));
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

// Split `split` of pair r: its key blocks.
void split_blocks(uint split, uint r) {
  uint t = gl_LocalInvocationID.x, hd = HD;
  uint i = args.row0 + r / args.hq, h = r % args.hq, kh = h / (args.hq / args.hk);
  uint lo, hi;
  visible(r, lo, hi);
  if (split * kBlock >= hi) return;  // uniform: no visible block for this split
  // This split's first block with a visible key (its reads issued with the query's).
  uint b = split;
  while (b < args.nb && b * kBlock < hi && b * kBlock + kBlock <= lo) b += args.nsplit;
  BlockRegs g;
#ifdef ATTENTION_BLOCKS_ROPE
  uint at = hi - 1u, bnew = at / kBlock;
  if (bnew >= split && (bnew - split) % args.nsplit == 0u) {  // uniform: this split holds the new key
    g_jnew = at;
    g_vnew = (args.x_heads - args.hk + kh) * hd;
  }
  rope_heads(h, kh, at, b * kBlock < hi ? b : args.nb, lo, hi, g);
#else
  float qv[kMaxHd / kT];
  [[unroll]] for (uint u = 0u; u < kMaxHd / kT; ++u) {
    uint c = t + kT * u;
    qv[u] = c < hd ? SB_LOAD(q, ADT, (i * args.hq + h) * hd + c) : 0.0;
  }
  if (b < args.nb && b * kBlock < hi) block_load(b, kh, lo, hi, g);
  [[unroll]] for (uint u = 0u; u < kMaxHd / kT; ++u) {
    if (t + kT * u < hd) s_q[t + kT * u] = qv[u];
  }
  barrier();
#endif
  for (; b < args.nb && b * kBlock < hi; b += args.nsplit) {
    block(r, b, kh, lo, hi, g);
    uint bn = b + args.nsplit;
    if (bn < args.nb && bn * kBlock < hi) block_load(bn, kh, lo, hi, g);
  }
}

void main() {
  uint w = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (w >= args.rows * args.hq * args.nsplit) return;  // uniform over the workgroup
  uint r = w / args.nsplit;
  split_blocks(w % args.nsplit, r);
#ifdef ATTENTION_BLOCKS_ROPE
  memoryBarrierBuffer();  // this invocation's partials before the count (every split counts)
  barrier();
  if (gl_LocalInvocationID.x == 0u) atomicAdd(counters[r], 1u);
#endif
}
#endif  // ATTENTION_BLOCKS

#ifdef ATTENTION_MERGE
layout(std430, binding = 0) readonly buffer S { uint sinks[]; };
#ifdef SB_MERGE_WAIT
layout(std430, binding = 1) coherent readonly buffer Scratch { float scratch[]; };
#else
layout(std430, binding = 1) readonly buffer Scratch { float scratch[]; };
#endif
layout(std430, binding = 2) writeonly buffer O { uint o[]; };
layout(std430, binding = 3) readonly buffer Dyn { uint dyn[]; };
uint first_pos() { return args.pos + dyn[args.pos_word]; }
#ifdef SB_MERGE_WAIT
layout(std430, binding = 4) coherent volatile readonly buffer Cn { uint counters[]; };  // polled
layout(std430, binding = 5) buffer Er { uint err[]; };

// Pair r's partials once its args.nsplit workgroups have counted: thread 0 polls, bounded
// (SB_ERR_HANDOFF), then every invocation's later loads see what the count covers. The
// blocks' workgroups were dispatched first and need no slot these hold, so they finish.
void wait_for_pair(uint r) SB_WAIT_COUNT(counters[r], args.nsplit, err)
#endif

const uint kMerge = 1024u;
shared float s_m[kMerge];  // the state's max after block b (first .. last)
shared float s_a[kMerge];  // exp(m before - m after) of block b
shared float s_c[kMerge];  // exp(m_b - m after) of block b
// The state after the last block: the sink (a block of one key with l = 1 and no values), then
// output word wd of row out_row (pair index i * hq + h) = round(o * rcp(l)).
void merge_finish(float m, float l_in, float o0_in, float o1_in, uint out_row, uint wd) {
  uint per = sb_per_word(ADT), words = HD / per;
  precise float l = l_in, o0 = o0_in, o1 = o1_in;
  if (args.has_sinks != 0u) {
    precise float sv = SB_LOAD(sinks, ADT, out_row % args.hq) + 0.0;
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
  o[out_row * words + wd] = per == 1u ? floatBitsToUint(rnd(y0)) : sb_encode_word(y0, y1, ADT);
}

// Block b's merge factors (b >= 1, counted from the row's first block; s_m holds the running
// maxima): a = exp(m before - m after), c = exp(m_b - m after).
void merge_factors(uint b, float mb) {
  precise float da = s_m[b - 1u] - s_m[b], dc = mb - s_m[b];
  s_a[b] = sb_exp(da);
  s_c[b] = sb_exp(dc);
}

// Rows of up to kAll blocks (head dims <= kT): every partial of the row staged at once.
const uint kAll = 32u;
shared float s_ob[kAll * kT];  // o_b of blocks first .. last, [block][dim]
shared float s_ml[2u * kAll];  // (m_b, l_b) of blocks first .. last

// The staged path's steps for a row of count <= kAll blocks, its partials first copied into
// shared memory in one round of loads (their scratch ranges are contiguous: ml_at, ob_at).
void merge_all(uint r, uint first, uint count, uint out_row) {
  uint t = gl_LocalInvocationID.x, hd = HD, n = count * hd, ob0 = ob_at(r, first);
  float ov[kAll];
  [[unroll]] for (uint u = 0u; u < kAll; ++u) ov[u] = scratch[ob0 + min(t + kT * u, n - 1u)];
  float ml = scratch[ml_at(r, first) + min(t, 2u * count - 1u)];
  [[unroll]] for (uint u = 0u; u < kAll; ++u) {
    if (t + kT * u < n) s_ob[t + kT * u] = ov[u];
  }
  if (t < 2u * count) s_ml[t] = ml;
  barrier();
  // The running maxima s_m[b] = max(m_b of blocks first .. b) as a doubling scan whose earlier
  // range is always sb_max's first operand: the in-order walk's bits (the first NaN; +0 over -0).
  if (t < count) s_m[t] = s_ml[2u * t];
  barrier();
  for (uint off = 1u; off < count; off <<= 1u) {  // uniform
    bool step = t < count && t >= off;
    float v = step ? sb_max(s_m[t - off], s_m[t]) : 0.0;
    barrier();
    if (step) s_m[t] = v;
    barrier();
  }
  if (t >= 1u && t < count) merge_factors(t, s_ml[2u * t]);
  barrier();
  uint per = sb_per_word(ADT), words = hd / per;
  if (t >= words) return;
  uint c = t * per;
  precise float l = s_ml[1];
  precise float o0 = s_ob[c], o1 = per == 2u ? s_ob[c + 1u] : 0.0;
  uint b = 1u;
  for (; b + 4u <= count; b += 4u) {  // four blocks' partials loaded, then taken in order
    float a4[4], c4[4], l4[4], p4[4], q4[4];
    [[unroll]] for (uint u = 0u; u < 4u; ++u) {
      a4[u] = s_a[b + u];
      c4[u] = s_c[b + u];
      l4[u] = s_ml[2u * (b + u) + 1u];
      p4[u] = s_ob[(b + u) * hd + c];
      q4[u] = per == 2u ? s_ob[(b + u) * hd + c + 1u] : 0.0;
    }
    [[unroll]] for (uint u = 0u; u < 4u; ++u) {
      l = l * a4[u] + l4[u] * c4[u];
      o0 = o0 * a4[u] + p4[u] * c4[u];
      if (per == 2u) o1 = o1 * a4[u] + q4[u] * c4[u];
    }
  }
  for (; b < count; ++b) {
    float a = s_a[b], cc = s_c[b];
    l = l * a + s_ml[2u * b + 1u] * cc;
    o0 = o0 * a + s_ob[b * hd + c] * cc;
    if (per == 2u) o1 = o1 * a + s_ob[b * hd + c + 1u] * cc;
  }
  merge_finish(s_m[count - 1u], l, o0, o1, out_row, t);
}

// Pair r's blocks merged into its output row.
void merge_row(uint r) {
  uint t = gl_LocalInvocationID.x;
  uint i = args.row0 + r / args.hq, h = r % args.hq, hd = HD;
  uint lo, hi;
  visible(r, lo, hi);
  uint first = lo / kBlock, last = (hi - 1u) / kBlock, count = last - first + 1u;
  if (count <= kAll && hd <= kT) {  // uniform
    merge_all(r, first, count, i * args.hq + h);
    return;
  }
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
    for (uint b = t + 1u; b < count; b += kT) merge_factors(b, scratch[ml_at(r, first + b)]);
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
    merge_finish(m, l, o0, o1, i * args.hq + h, wd);
  }
}

void main() {
  uint r = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (r >= args.rows * args.hq) return;  // uniform over the workgroup
#ifdef SB_MERGE_WAIT
  wait_for_pair(r);
#endif
  merge_row(r);
}
#endif  // ATTENTION_MERGE

