// Kernel variants of this file, one line each (metal_shaders/README.md, "Variants"):
// SB_KERNEL(attention_tiles, ATTENTION_TILES, "rrrrwrb", AttentionArgs, SB_ATTENTION_ARGS, 256, 0)
// SB_KERNEL(attention_tiles_q8, ATTENTION_TILES_Q8, "rrrrwrbwww", AttentionQ8Args, SB_ATTENTION_Q8_ARGS, 256, 0)
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// Attention (schema AttentionNode) in order Blocked32 for prefill rows, the same operations as
// attention.comp's block kernels and cpu_fallback/attention.cpp (docs/numerics.md).
// ATTENTION_TILES (head dims 32k <= 128). Thread -> output:
// workgroup w takes cache head kh = w % hk and a tile of kTile = 32 query vectors v = (row, head
// of the group) of it, and walks the tile's key blocks in order, the softmax state on chip.
// Scores: thread t computes query vectors t / 16 + 16y against keys t % 16 + 16x (x, y < 2),
// each dot32's halving tree as four subtrees of 8 partials, the block's keys staged in shared
// memory and the queries, widened once into this workgroup's scratch, read through the cache;
// thread t takes the max and exps of vector t / 8's keys 4 (t % 8) .. +3 (the block max from
// the vector's 8 partial maxes); threads 0..kTile-1 each own query vector t's sums and merge
// factors; values: thread t owns query vectors t / 16 + 16y (y < 2) at dims 4(t % 16) .. +3 and
// 64 + 4(t % 16) .. +3. (kTile is kernel_args.h's SB_ATTENTION_TILE, the host's too: 32, which
// this mapping assumes; bench/RESULTS.md compares 64.)
#ifdef ATTENTION_TILES_Q8
#include "gather_qmm_common.glsl"  // common.glsl, then the Q8 steps (q8_params, q8_code)
#else
#include "common.glsl"
#endif

layout(local_size_x = 256) in;
#ifdef ATTENTION_TILES_Q8
layout(push_constant) uniform Args { SB_ATTENTION_Q8_ARGS } args;
#else
layout(push_constant) uniform Args { SB_ATTENTION_ARGS } args;
#endif
#include "attention_common.glsl"

layout(std430, binding = 0) readonly buffer Q { uint q[]; };
layout(std430, binding = 1) readonly buffer K { uint k[]; };
layout(std430, binding = 2) readonly buffer V { uint v[]; };
layout(std430, binding = 3) readonly buffer S { uint sinks[]; };
layout(std430, binding = 4) writeonly buffer O { uint o[]; };
layout(std430, binding = 5) readonly buffer Dyn { uint dyn[]; };
layout(std430, binding = 6) buffer QScratch { vec4 qs[]; };  // 32 kTile vec4 a workgroup
uint first_pos() { return args.pos + dyn[args.pos_word]; }

const uint kTile = SB_ATTENTION_TILE;  // query vectors a workgroup: 32
const uint kVy = kTile / 16u;    // query vectors a thread accumulates values for
const uint kPad = 33u;   // s_e's row stride (rows on different banks)
// The block's keys at [p * kKeyStride + key] (component c: dim p + 32 c, zero past hd); then its
// values at [key * hd / 4 + d / 4]. The stride of 33 spreads a key's staged dims over banks.
const uint kKeyStride = 33u;
shared vec4 s_kv[32u * kKeyStride];
shared float s_e[kTile * kPad];  // [v][key]: scores, then exps
shared uint s_rng[kTile];        // v's visible keys in the block: lo | hi << 8 (lo == hi: none)
shared uint s_mode[kTile];       // 0: v skips the block, 1: its first visible block, 2: a later one
shared float s_a[kTile];         // the block's max, then the merge's a (sinks: a too)
shared float s_pm[256];          // [v][i]: the block max of vector v's keys 4i .. 4i + 3
shared float s_c[kTile];         // the merge's c (at the end: rcp(l))
#ifdef ATTENTION_TILES_Q8
// ATTENTION_TILES_Q8: also the Q8 blocks of the stored output as quantize_q8 would make them from
// memory (GatherQmm's x [rows, hq hd]: a vector's hd / 32 blocks; qmm_mma4's K order with
// q8_permute); o written only with q8_store_out. Thread -> (block, code word) 8 b + w of the
// tile's blocks (rounds of 32 blocks), from the rounded outputs staged in s_kv.
layout(std430, binding = 7) writeonly buffer Q8 { uint q8[]; };
layout(std430, binding = 8) writeonly buffer Q8D { float q8_d[]; };
layout(std430, binding = 9) writeonly buffer Q8S { int q8_sum[]; };
shared uint s_amax[kTile * 4u];  // [v][block of the vector] (hd <= 128)
shared int s_qsum[kTile * 4u];
#endif

uint g_kh, g_v0, g_nv, g_group, g_qs;

// Query vector vv of the tile: its row i and head h; false past the dispatch's vectors.
bool row_head(uint vv, out uint i, out uint h) {
  uint gv = g_v0 + vv;
  i = args.row0 + gv / g_group;
  h = g_kh * g_group + gv % g_group;
  return gv < g_nv;
}

// The tile's queries widened to f32 in this workgroup's scratch, partial p of vector v at
// qs[g_qs + p * kTile + v] (component c: dim p + 32 c), read back through the cache per block.
void stage_queries() {
  uint t = gl_LocalInvocationID.x;
  [[unroll]] for (uint u = 0u; u < kTile / 8u; ++u) {
    uint e = t + 256u * u, vv = e % kTile, p = e / kTile, i, h;
    vec4 x = vec4(0.0);
    if (row_head(vv, i, h)) {
      uint b = (i * args.hq + h) * HD;
      [[unroll]] for (uint c = 0u; c < 4u; ++c) {
        if (p + 32u * c < HD) x[c] = SB_LOAD(q, ADT, b + p + 32u * c);
      }
    }
    qs[g_qs + p * kTile + vv] = x;
  }
}

// Staging task u of this thread (T = t + 256 u): dims d and d + 1 of key kk = T / 64, d = 2 (T % 64),
// so a subgroup loads consecutive words of one row (one 128-byte line a load for 16-bit rows);
// values are stored contiguously, keys 4-way over the banks (rows kKeyStride apart).
void stage_task(uint u, out uint kk, out uint d) {
  uint tk = gl_LocalInvocationID.x + 256u * u;
  kk = tk >> 6u;
  d = 2u * (tk & 63u);
}

// A block's staging reads for this thread, as stored: task u's word (16-bit: both dims) in w0[u],
// f32's second dim in w1[u]; 0 (+0.0) past the cache or hd. (Keys loaded a whole block ahead in
// registers measured slower: the kernel sits at 128 registers, bench/RESULTS.md.)
struct Staged {
  uint w0[8];
  uint w1[8];
};

void stage_load(bool values, uint b0, out Staged g) {
  bool is16 = sb_is16(ADT);
  [[unroll]] for (uint u = 0u; u < 8u; ++u) {
    uint kk, d;
    stage_task(u, kk, d);
    g.w0[u] = 0u;
    g.w1[u] = 0u;
    if (d >= HD || b0 + kk >= args.cache) continue;
    uint e = key_at(g_kh, b0 + kk) + d;  // even: rows of 32k dims
    if (values) {
      g.w0[u] = is16 ? v[e >> 1u] : v[e];
      if (!is16) g.w1[u] = v[e + 1u];
    } else {
      g.w0[u] = is16 ? k[e >> 1u] : k[e];
      if (!is16) g.w1[u] = k[e + 1u];
    }
  }
}

// The staged reads into s_kv: keys at [p * 32 + key] (component c: dim p + 32 c, zeros past hd),
// values at [key * hd / 4 + d / 4].
void stage_store(bool values, Staged g) {
  uint hd4 = HD / 4u;
  bool is16 = sb_is16(ADT);
  [[unroll]] for (uint u = 0u; u < 8u; ++u) {
    uint kk, d;
    stage_task(u, kk, d);
    float x0 = sb_decode(g.w0[u], ADT, 0u), x1 = is16 ? sb_decode(g.w0[u], ADT, 1u) : uintBitsToFloat(g.w1[u]);
    if (values) {
      if (d >= HD) continue;
      if ((d & 3u) == 0u) {
        s_kv[kk * hd4 + d / 4u].xy = vec2(x0, x1);
      } else {
        s_kv[kk * hd4 + d / 4u].zw = vec2(x0, x1);
      }
    } else {
      s_kv[(d & 31u) * kKeyStride + kk][d >> 5u] = x0;
      s_kv[((d + 1u) & 31u) * kKeyStride + kk][(d + 1u) >> 5u] = x1;
    }
  }
}

// Partial p of a dot32 from its four dims (zeros past hd add nothing: a partial is never -0).
float leaf(vec4 a, vec4 b) {
  precise float p = 0.0;
  p = p + a.x * b.x;
  p = p + a.y * b.y;
  p = p + a.z * b.z;
  p = p + a.w * b.w;
  return p;
}

// The subtree t3[base] = ((P0 + P16) + (P8 + P24)) + ((P4 + P20) + (P12 + P28)) (partials
// base + offset) for query vectors vq + 16y and keys kq + 16x (x, y < 2): res[2y + x]. Two
// vectors by two keys: each staged key vec4 and query vec4 serves two scores (the loop is bound
// by its loads, not its adds).
void quarter(uint base, uint vq, uint kq, out float res[4]) {
  precise float t3[4];
  [[unroll]] for (uint half_ = 0u; half_ < 2u; ++half_) {
    precise float t2[4];
    [[unroll]] for (uint pp = 0u; pp < 2u; ++pp) {
      uint pa = base + 4u * (half_ + 2u * pp), pb = pa + 16u;
      vec4 qa[2], qb[2], ka[2], kb[2];
      [[unroll]] for (uint i = 0u; i < 2u; ++i) {
        qa[i] = qs[g_qs + pa * kTile + vq + 16u * i];
        qb[i] = qs[g_qs + pb * kTile + vq + 16u * i];
        ka[i] = s_kv[pa * kKeyStride + kq + 16u * i];
        kb[i] = s_kv[pb * kKeyStride + kq + 16u * i];
      }
      [[unroll]] for (uint j = 0u; j < 4u; ++j) {
        uint y = j >> 1u, x = j & 1u;
        precise float t1 = leaf(qa[y], ka[x]) + leaf(qb[y], kb[x]);
        t2[j] = pp == 0u ? t1 : t2[j] + t1;
      }
    }
    [[unroll]] for (uint j = 0u; j < 4u; ++j) t3[j] = half_ == 0u ? t2[j] : t3[j] + t2[j];
  }
  [[unroll]] for (uint j = 0u; j < 4u; ++j) res[j] = t3[j];
}

// Scores of the staged block for this thread's 2 x 2 (vector, key) pairs into s_e:
// (t3[0] + t3[2]) + (t3[1] + t3[3]), rounded, scaled, rounded.
void scores() {
  uint t = gl_LocalInvocationID.x, kq = t & 15u, vq = t >> 4u;
  precise float h0[4], h1[4];
  float r[4];
  quarter(0u, vq, kq, r);
  [[unroll]] for (uint j = 0u; j < 4u; ++j) h0[j] = r[j];
  quarter(2u, vq, kq, r);
  [[unroll]] for (uint j = 0u; j < 4u; ++j) h0[j] = h0[j] + r[j];
  quarter(1u, vq, kq, r);
  [[unroll]] for (uint j = 0u; j < 4u; ++j) h1[j] = r[j];
  quarter(3u, vq, kq, r);
  [[unroll]] for (uint j = 0u; j < 4u; ++j) h1[j] = h1[j] + r[j];
  [[unroll]] for (uint j = 0u; j < 4u; ++j) {
    precise float s = h0[j] + h1[j];
    precise float v = rnd(s);
    s_e[(vq + 16u * (j >> 1u)) * kPad + kq + 16u * (j & 1u)] = rnd(v * args.scale);
  }
}

#ifdef ATTENTION_TILES_Q8
// Element j of code word w of block c of vector v's staged output: quantize_q8's K order, or
// qmm_mma4's (q8_permute).
float tile_elem(uint v, uint c, uint w, uint j) {
  uint e = 32u * c + (args.q8_permute != 0u ? 8u * (w >> 1u) + 2u * j + (w & 1u) : 4u * w + j);
  return s_kv[v * (HD / 4u) + (e >> 2u)][e & 3u];
}

// quantize_q8's steps on the tile's staged outputs: each block's amax and code sum by shared
// atomics (integers: any order), then each thread's code words. Block c of vector v (row i, head
// h) is block (i hq + h) hd / 32 + c of GatherQmm's x.
void quantize_tile(uint t) {
  uint per_v = HD / 32u, tasks = 8u * kTile * per_v;
  for (uint u = t; u < tasks; u += 256u) {
    uint b = u >> 3u, w = u & 7u, v = b / per_v, i, h;
    if (!row_head(v, i, h)) continue;
    uint amax = 0u;
    [[unroll]] for (uint j = 0u; j < 4u; ++j) amax = max(amax, floatBitsToUint(tile_elem(v, b % per_v, w, j)) & 0x7fffffffu);
    atomicMax(s_amax[b], amax);
  }
  barrier();
  for (uint u = t; u < tasks; u += 256u) {
    uint b = u >> 3u, w = u & 7u, v = b / per_v, i, h;
    if (!row_head(v, i, h)) continue;
    float scale, d;
    bool zero;
    q8_params(s_amax[b], scale, d, zero);
    uint word = 0u;
    int part = 0;
    [[unroll]] for (uint j = 0u; j < 4u; ++j) {
      int c = zero ? 0 : q8_code(tile_elem(v, b % per_v, w, j), scale);
      part += c;
      word |= (uint(c) & 0xffu) << (8u * j);
    }
    atomicAdd(s_qsum[b], part);
    uint gb = (i * args.hq + h) * per_v + b % per_v;
    q8[gb * 8u + w] = word;
    if (w == 0u) q8_d[gb] = d;
  }
  barrier();
  for (uint b = t; b < kTile * per_v; b += 256u) {
    uint i, h;
    if (row_head(b / per_v, i, h)) q8_sum[(i * args.hq + h) * per_v + b % per_v] = s_qsum[b];
  }
}
#endif

void main() {
  uint t = gl_LocalInvocationID.x;
  uint w = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  g_group = args.hq / args.hk;
  g_nv = args.rows * g_group;
  uint tiles = (g_nv + kTile - 1u) / kTile;
  if (w >= tiles * args.hk) return;  // uniform over the workgroup
  g_kh = w % args.hk;
  g_v0 = (tiles - 1u - w / args.hk) * kTile;  // the longest rows first
  g_qs = w * 32u * kTile;
  uint hd = HD, hd4 = hd / 4u, p0 = first_pos() + args.row0;
  uint last_v = min(g_v0 + kTile, g_nv) - 1u;
  uint at_a = p0 + g_v0 / g_group, hi_b = p0 + last_v / g_group + 1u;
  uint lo_a = first_visible(at_a);
  stage_queries();
  memoryBarrierBuffer();

  // Thread t < kTile: vector t's softmax state (m, l). Every thread: the visible keys of vector
  // t / (256 / kTile), whose exps (and part of the max) it computes.
  uint mi, mh, ei, eh;
  bool mine = t < kTile && row_head(t, mi, mh);
  const uint ke = kTile / 8u, per = 256u / kTile;  // a thread's keys, a vector's threads (exps)
  uint ev = t / per;
  bool e_mine = row_head(ev, ei, eh);
  uint e_at = first_pos() + ei, e_lo = first_visible(e_at);
  float m_run = 0.0, l_run = 0.0;
  bool started = false;
  // Values: thread t's vectors vq + 16y at dims 4 dg .. + 3 and 64 + 4 dg .. + 3 (units dg, dg + 16).
  uint dg = t & 15u, vq = t >> 4u;
  vec4 o0[kVy], o1[kVy];
  [[unroll]] for (uint y = 0u; y < kVy; ++y) {
    o0[y] = vec4(0.0);
    o1[y] = vec4(0.0);
  }

  for (uint b0 = lo_a / kBlock * kBlock; b0 < hi_b; b0 += kBlock) {
    // The block's keys are read before the barrier (their latency overlaps the wait).
    Staged ks, vs;
    stage_load(false, b0, ks);
    barrier();  // the last block's values are read (and, the first time, the queries written)
    stage_store(false, ks);
    barrier();
    scores();
    barrier();
    // Vector ev's visible keys in the block and the max of this thread's keys kTile / 8 from
    // (t % per) kTile / 8 of them (-inf: none); the values staged meanwhile.
    uint e_rng = 0u;
    {
      uint j0 = max(e_lo, b0), j1 = min(e_at + 1u, b0 + kBlock);
      float pm = uintBitsToFloat(0xff800000u);  // max's identity, NaNs and zeros included
      if (e_mine && j0 < j1) {
        uint r0 = j0 - b0, r1 = j1 - b0;
        e_rng = r0 | (r1 << 8u);
        [[unroll]] for (uint u = 0u; u < ke; ++u) {
          uint kk = (t % per) * ke + u;
          if (kk >= r0 && kk < r1) pm = sb_max(pm, s_e[ev * kPad + kk]);
        }
      }
      s_pm[t] = pm;
      if (t % per == 0u) s_rng[ev] = e_rng;
    }
    stage_load(true, b0, vs);
    stage_store(true, vs);
    barrier();
    // m_b = max of vector ev's partial maxes (order-free); e_j = exp(s_j - m_b) for this
    // thread's keys.
    if ((e_rng & 255u) < (e_rng >> 8u)) {
      uint r0 = e_rng & 255u, r1 = e_rng >> 8u;
      float mb = s_pm[ev * per];
      [[unroll]] for (uint i = 1u; i < per; ++i) mb = sb_max(mb, s_pm[ev * per + i]);
      if (t % per == 0u) s_a[ev] = mb;
      [[unroll]] for (uint u = 0u; u < ke; ++u) {
        uint kk = (t % per) * ke + u;
        if (kk >= r0 && kk < r1) {
          precise float d = s_e[ev * kPad + kk] - mb;
          s_e[ev * kPad + kk] = sb_exp(d);
        }
      }
    }
    barrier();
    // l_b in key order, then the merge's factors.
    if (t < kTile) {
      uint rng = s_rng[t], r0 = rng & 255u, r1 = rng >> 8u, mode = 0u;
      if (r0 < r1) {
        precise float lb = 0.0;
        [[unroll]] for (uint u = 0u; u < kBlock; ++u) {
          if (u >= r0 && u < r1) lb = lb + s_e[t * kPad + u];
        }
        float mb = s_a[t];
        if (!started) {
          m_run = mb;
          l_run = lb;
          started = true;
          mode = 1u;
        } else {
          float mn = sb_max(m_run, mb);
          precise float da = m_run - mn, dc = mb - mn;
          float a = sb_exp(da), c = sb_exp(dc);
          precise float ln = l_run * a + lb * c;
          l_run = ln;
          m_run = mn;
          s_a[t] = a;
          s_c[t] = c;
          mode = 2u;
        }
      }
      s_mode[t] = mode;
    }
    barrier();
    // o_b in key order over each vector's visible keys, merged into the state at once.
    precise vec4 a0[kVy], a1[kVy];
    uint r0[kVy], r1[kVy];
    [[unroll]] for (uint y = 0u; y < kVy; ++y) {
      a0[y] = vec4(0.0);
      a1[y] = vec4(0.0);
      uint rng = s_rng[vq + 16u * y];
      r0[y] = rng & 255u;
      r1[y] = rng >> 8u;
    }
    bool full = true;  // every key of the block visible to this thread's vectors: no tests
    [[unroll]] for (uint y = 0u; y < kVy; ++y) full = full && r0[y] == 0u && r1[y] == kBlock;
    if (full) {
      [[dont_unroll]] for (uint kk = 0u; kk < kBlock; ++kk) {
        vec4 v0 = s_kv[kk * hd4 + dg], v1 = s_kv[kk * hd4 + dg + 16u];
        [[unroll]] for (uint y = 0u; y < kVy; ++y) {
          float e = s_e[(vq + 16u * y) * kPad + kk];
          a0[y] = a0[y] + e * v0;
          a1[y] = a1[y] + e * v1;
        }
      }
    } else {
      // Kept rolled: unrolled, the kernel was slower on the H100 (bench/RESULTS.md).
      [[dont_unroll]] for (uint kk = 0u; kk < kBlock; ++kk) {
        vec4 v0 = s_kv[kk * hd4 + dg], v1 = s_kv[kk * hd4 + dg + 16u];
        [[unroll]] for (uint y = 0u; y < kVy; ++y) {
          if (kk >= r0[y] && kk < r1[y]) {
            float e = s_e[(vq + 16u * y) * kPad + kk];
            a0[y] = a0[y] + e * v0;
            a1[y] = a1[y] + e * v1;
          }
        }
      }
    }
    [[unroll]] for (uint y = 0u; y < kVy; ++y) {
      uint mode = s_mode[vq + 16u * y];
      if (mode == 1u) {
        o0[y] = a0[y];
        o1[y] = a1[y];
      } else if (mode == 2u) {
        float a = s_a[vq + 16u * y], c = s_c[vq + 16u * y];
        precise vec4 n0 = o0[y] * a + a0[y] * c, n1 = o1[y] * a + a1[y] * c;
        o0[y] = n0;
        o1[y] = n1;
      }
    }
  }

  // The sink (a block of one key with l = 1 and no values), then out = round(o * rcp(l)).
  barrier();
  if (mine) {
    float a = 1.0;
    if (args.has_sinks != 0u) {
      precise float sv = SB_LOAD(sinks, ADT, mh) + 0.0;
      sv = rnd(sv);
      float mn = sb_max(m_run, sv);
      precise float da = m_run - mn, dc = sv - mn;
      a = sb_exp(da);
      precise float ln = l_run * a + sb_exp(dc);
      l_run = ln;
    }
    s_a[t] = a;
    s_c[t] = sb_rcp(l_run);
  }
  barrier();
  uint out_per = sb_per_word(ADT);
  [[unroll]] for (uint y = 0u; y < kVy; ++y) {
    uint i, h;
    if (!row_head(vq + 16u * y, i, h)) continue;
    float a = s_a[vq + 16u * y], rc = s_c[vq + 16u * y];
    [[unroll]] for (uint un = 0u; un < 2u; ++un) {
      uint unit = dg + 16u * un;
      if (unit >= hd4) continue;
      precise vec4 x = un == 0u ? o0[y] : o1[y];
      if (args.has_sinks != 0u) x = x * a;
      precise vec4 yv = x * rc;
      uint e0 = (i * args.hq + h) * hd + unit * 4u;
#ifdef ATTENTION_TILES_Q8
      // The stored values (as quantize_q8 would load them) staged for the blocks below.
      vec4 st = yv;
      if (out_per != 1u) {
        uint w0 = sb_encode_word(yv.x, yv.y, ADT), w1 = sb_encode_word(yv.z, yv.w, ADT);
        st = vec4(sb_decode(w0, ADT, 0u), sb_decode(w0, ADT, 1u), sb_decode(w1, ADT, 0u), sb_decode(w1, ADT, 1u));
      }
      s_kv[(vq + 16u * y) * hd4 + unit] = st;
      if (args.q8_store_out == 0u) continue;
#endif
      if (out_per == 1u) {
        [[unroll]] for (uint c = 0u; c < 4u; ++c) o[e0 + c] = floatBitsToUint(yv[c]);
      } else {
        o[e0 / 2u] = sb_encode_word(yv.x, yv.y, ADT);
        o[e0 / 2u + 1u] = sb_encode_word(yv.z, yv.w, ADT);
      }
    }
  }
#ifdef ATTENTION_TILES_Q8
  for (uint b = t; b < kTile * 4u; b += 256u) {
    s_amax[b] = 0u;
    s_qsum[b] = 0;
  }
  barrier();
  quantize_tile(t);
#endif
}
