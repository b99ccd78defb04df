// Kernel variants of this file, one line each (metal_shaders/README.md, "Variants"):
// SB_KERNEL(qmm_tiles, QMM_TILES, "rrwb", QmmArgs, SB_QMM_ARGS, 256, 0)
// SB_KERNEL(qmm_tile, QMM_TILE, "rrrrrrrrrwb", QmmArgs, SB_QMM_ARGS, 256, 0)
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// GatherQmm on pairs sorted by expert, in tiles of up to SB_QMM_TILE_PAIRS pairs:
// QMM_TILES (the work list) and QMM_TILE (the tiles' matmul); thread -> output at each
// kernel below. QMM_MMA (gather_qmm_mma.comp) runs tiles of up to SB_QMM_MMA_PAIRS on
// tensor cores.
#include "gather_qmm_common.glsl"

layout(local_size_x = 256) in;

#ifdef QMM_TILES
// The work list of QMM_TILE for pairs sorted by expert (rhs; without, QMM_TILE and
// QMM_MMA take tiles of pairs in order and no list is made): one entry (first pair, pair
// count, expert) per run of up to per_wg pairs of one expert (SB_QMM_TILE_PAIRS;
// SB_QMM_MMA_PAIRS for QMM_MMA), after the count in word 0.
// One workgroup; thread -> experts tid, tid + 256, ...: the runs' ends come from where
// the sorted experts change (one pass over the pairs per 256 experts); thread 0 lays the
// tiles out in expert order.
// Also raises the error bits for bad, pruned or unsorted experts.
layout(std430, binding = 0) readonly buffer R { int rhs[]; };
layout(std430, binding = 1) readonly buffer Ex { uint expert_info[]; };  // [E] bits, then [E] word offsets
layout(std430, binding = 2) writeonly buffer T { uint tiles[]; };
layout(std430, binding = 3) buffer Er { uint err[]; };
layout(push_constant) uniform Args { SB_QMM_ARGS } args;

shared uint s_n[256];
shared uint s_base[256];
shared uint s_lo[256];  // run [lo, hi) of expert e0 + i, from the run boundaries
shared uint s_hi[256];

void main() {
  uint tid = gl_LocalInvocationID.x;
  uint max_tiles = args.tiles, total = 0u, tp = args.per_wg;
  for (uint e0 = 0u; e0 < args.experts; e0 += 256u) {
    s_lo[tid] = 0u;
    s_hi[tid] = 0u;
    barrier();
    // Each run's ends are where the expert changes: no search. On unsorted input (an
    // error) the runs are wrong but stay inside the pairs. Pairs go 8 at a time, their
    // loads issued together (one at a time, the dependent loads' latency dominated).
    for (uint p0 = tid; p0 < args.pairs; p0 += 8u * 256u) {
      int e[8], prev[8], next[8];
      [[unroll]] for (uint i = 0u; i < 8u; ++i) {
        uint p = p0 + 256u * i;
        e[i] = p < args.pairs ? rhs[p] : -1;
        prev[i] = p > 0u && p <= args.pairs ? rhs[p - 1u] : -1;
        next[i] = p + 1u < args.pairs ? rhs[p + 1u] : -1;
      }
      [[unroll]] for (uint i = 0u; i < 8u; ++i) {
        uint p = p0 + 256u * i;
        if (p >= args.pairs) break;
        if (e0 == 0u) {
          if (e[i] < 0 || uint(e[i]) >= args.experts) atomicOr(err[0], SB_ERR_INDEX);
          else if (expert_info[e[i]] == 0u) atomicOr(err[0], SB_ERR_PRUNED);
          if (prev[i] > e[i]) atomicOr(err[0], SB_ERR_UNSORTED);
        }
        uint rel = uint(e[i]) - e0;  // experts below e0 wrap past 256
        if (e[i] >= 0 && rel < 256u) {
          if (prev[i] != e[i]) s_lo[rel] = p;
          if (next[i] != e[i]) s_hi[rel] = p + 1u;
        }
      }
    }
    barrier();
    uint e = e0 + tid, lo = s_lo[tid], hi = s_hi[tid], n = 0u;
    if (e < args.experts && expert_info[e] != 0u && hi > lo) n = (hi - lo + tp - 1u) / tp;
    // The tiles before expert e0 + tid: an inclusive scan of the counts in 8 doubling
    // steps (s_n and s_base take turns), then total + that minus its own count.
    s_n[tid] = n;
    barrier();
    [[unroll]] for (uint step = 0u; step < 8u; ++step) {
      uint off = 1u << step;
      if ((step & 1u) == 0u) s_base[tid] = s_n[tid] + (tid >= off ? s_n[tid - off] : 0u);
      else s_n[tid] = s_base[tid] + (tid >= off ? s_base[tid - off] : 0u);
      barrier();
    }
    uint before = total + s_n[tid] - n;  // 8 steps end in s_n
    total += s_n[255];
    barrier();
    for (uint t = 0u; t < n; ++t) {
      uint slot = before + t;
      if (slot >= max_tiles) break;  // only on unsorted input, which raised an error
      uint first = lo + t * tp;
      tiles[1u + 3u * slot] = first;
      tiles[2u + 3u * slot] = min(tp, hi - first);
      tiles[3u + 3u * slot] = e;
    }
    barrier();
  }
  if (tid == 0u) tiles[0] = min(total, max_tiles);
}
#endif

#ifdef QMM_TILE
// Many-row GatherQmm on pairs sorted by expert: workgroup (tile t, column block c)
// computes outputs [first, first + count) x [64c, 64c + 64) of tile t (QMM_TILES), so
// each weight is read once per tile of up to 32 pairs. Per chunk of 64 K values the
// Q8 codes of the tile's rows and the expert's weight codes are unpacked to shared ints;
// codes of <= 4 bits two columns to an int, so one integer multiply-add serves two outputs.
// Thread -> output: tid = 16*tn + tp computes pairs {tp, tp + 16} x columns
// {2tn, 2tn + 1, 2tn + 32, 2tn + 33}; block dots are exact integers, then the float
// steps of docs/numerics.md in block and group order per output.
layout(std430, binding = 0) readonly buffer Q { uint q[]; };
layout(std430, binding = 1) readonly buffer D { float dq[]; };
layout(std430, binding = 2) readonly buffer S { int sq[]; };
layout(std430, binding = 3) readonly buffer Wt { uint codes[]; };
layout(std430, binding = 4) readonly buffer Sc { uint scales[]; };
layout(std430, binding = 5) readonly buffer Bi { uint biases[]; };
layout(std430, binding = 6) readonly buffer L { int lhs[]; };
layout(std430, binding = 7) readonly buffer T { uint tiles[]; };
layout(std430, binding = 8) readonly buffer Ex { uint expert_info[]; };  // [E] bits, then [E] word offsets
layout(std430, binding = 9) writeonly buffer O { uint o[]; };
layout(std430, binding = 10) buffer Er { uint err[]; };
layout(push_constant) uniform Args { SB_QMM_ARGS } args;

const uint kTp = SB_QMM_TILE_PAIRS, kTn = 64u;
const uint kStride = 17u;  // ivec4 per shared row: 64 values + 4 of padding (bank spread)
shared ivec4 s_x[kTp * kStride];
shared ivec4 s_w[kTn * kStride];
shared float s_d[kTp * 2u];
shared int s_sx[kTp * 2u];
shared int s_row[kTp];

// Codes [c0, c0 + 16) of weight row `row` (from word `base`) as ints in s_w.
void stage_codes(uint base, uint bits, uint c0, uint dst) {
  uint v[16];
  if (bits == 4u) {
    uint a = codes[base + (c0 >> 3u)], b = codes[base + (c0 >> 3u) + 1u];
    for (uint i = 0u; i < 8u; ++i) {
      v[i] = (a >> (4u * i)) & 15u;
      v[i + 8u] = (b >> (4u * i)) & 15u;
    }
  } else {
    uint mask = (1u << bits) - 1u;
    for (uint i = 0u; i < 16u; ++i) {
      uint bit = (c0 + i) * bits, sh = bit & 31u;
      uint x = codes[base + (bit >> 5u)] >> sh;
      if (sh + bits > 32u) x |= codes[base + (bit >> 5u) + 1u] << (32u - sh);
      v[i] = x & mask;
    }
  }
  for (uint i = 0u; i < 4u; ++i) s_w[dst + i] = ivec4(v[4u * i], v[4u * i + 1u], v[4u * i + 2u], v[4u * i + 3u]);
}

int dot4(ivec4 a, ivec4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }

// Codes [c0, c0 + 8) of a row (c0 a multiple of 8, bits <= 4) as one word, lowest first.
uint codes_word(uint base, uint bits, uint c0) {
  uint bit = c0 * bits, sh = bit & 31u;
  uint v = codes[base + (bit >> 5u)] >> sh;
  if (sh + 8u * bits > 32u) v |= codes[base + (bit >> 5u) + 1u] << (32u - sh);
  return v;
}

// This thread's global words of chunk j0 (blocks j0, j0 + 1), kept in registers until
// stored to shared memory: activation words [0..1], d and code sum [2..3] (threads
// < 64), and on the packed path the two columns' codes [4..5].
void load_chunk(uint j0, uint blocks, uint n0, uint wbase, uint row_words, uint bits, bool packed, inout uint staged[6]) {
  uint tid = gl_LocalInvocationID.x;
  uint cb = min(2u, blocks - j0);
  int r = s_row[tid >> 3u];
  for (uint jb = 0u; jb < 2u; ++jb) staged[jb] = r >= 0 && jb < cb ? q[(uint(r) * blocks + j0 + jb) * 8u + (tid & 7u)] : 0u;
  if (tid < 2u * kTp && (tid & 1u) < cb) {
    int rr = s_row[tid >> 1u];
    uint j = uint(rr) * blocks + j0 + (tid & 1u);
    staged[2] = rr >= 0 ? floatBitsToUint(dq[j]) : 0u;
    staged[3] = rr >= 0 ? uint(sq[j]) : 0u;
  }
  staged[4] = 0u;
  staged[5] = 0u;
  uint pair = tid >> 3u, part = tid & 7u, n = n0 + 2u * pair;
  if (packed && part * 8u < cb * 32u && n < args.n) {
    uint c0 = j0 * 32u + part * 8u;
    staged[4] = codes_word(wbase + n * row_words, bits, c0);
    staged[5] = codes_word(wbase + (n + 1u) * row_words, bits, c0);
  }
}

void main() {
  uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  uint tid = gl_LocalInvocationID.x;
  uint tile = wg / args.tiles, n0 = (wg % args.tiles) * kTn;
  uint first, count, ex = 0u;
  if (args.has_rhs == 0u) {  // every pair expert 0's, in order: tile t is pairs [per_wg t, +per_wg), no work list
    first = tile * args.per_wg;
    if (first >= args.pairs) return;  // uniform over the workgroup
    count = min(args.per_wg, args.pairs - first);
  } else {
    if (tile >= tiles[0]) return;  // uniform over the workgroup
    first = tiles[1u + 3u * tile];
    count = tiles[2u + 3u * tile];
    ex = tiles[3u + 3u * tile];
  }
  uint bits = expert_info[ex], row_words = args.k * bits / 32u;
  if (bits == 0u) {  // expert 0 pruned, without rhs (the work list never holds a pruned expert)
    if (tid == 0u) atomicOr(err[0], SB_ERR_PRUNED);
    return;
  }
  uint wbase = expert_info[args.experts + ex];
  uint blocks = args.k / 32u, per_group = args.group_size / 32u;
  // Codes of <= 4 bits: two columns per int (see below); the host keeps args.n even here.
  bool packed = bits <= 4u && (args.n & 1u) == 0u;
  if (tid < kTp) {
    int r = -1;
    if (tid < count) {
      uint p = first + tid;
      r = args.has_lhs != 0u ? lhs[p] : int(p * args.rows / args.pairs);
      if (r < 0 || uint(r) >= args.rows) {
        atomicOr(err[0], SB_ERR_INDEX);
        r = -1;
      }
    }
    s_row[tid] = r;
  }
  uint tp = tid & 15u, tn = tid >> 4u;
  uint col[4] = uint[4](2u * tn, 2u * tn + 1u, 2u * tn + 32u, 2u * tn + 33u);
  precise float acc[8], pg[8], xg[2];
  for (uint i = 0u; i < 8u; ++i) acc[i] = pg[i] = 0.0;
  xg[0] = xg[1] = 0.0;
  barrier();
  // Chunk j0's global words are loaded into registers one chunk ahead (staged[]), so
  // their latency overlaps the previous chunk's arithmetic.
  uint staged[6];
  load_chunk(0u, blocks, n0, wbase, row_words, bits, packed, staged);
  for (uint j0 = 0u; j0 < blocks; j0 += 2u) {
    uint cb = min(2u, blocks - j0);
    {  // activations: thread -> (pair tid / 8, word tid % 8) of each block
      uint a = tid >> 3u, w = tid & 7u;
      for (uint jb = 0u; jb < cb; ++jb) {
        int word = int(staged[jb]);
        s_x[a * kStride + jb * 8u + w] = ivec4(bitfieldExtract(word, 0, 8), bitfieldExtract(word, 8, 8),
                                               bitfieldExtract(word, 16, 8), bitfieldExtract(word, 24, 8));
      }
      if (tid < 2u * kTp && (tid & 1u) < cb) {
        s_d[tid] = uintBitsToFloat(staged[2]);
        s_sx[tid] = int(staged[3]);
      }
    }
    if (packed) {  // weights, columns 2q and 2q + 1 in one int: thread -> (q = tid / 8, codes [8 (tid % 8), +8))
      uint q = tid >> 3u, part = tid & 7u;
      if (part * 8u < cb * 32u) {
        uint wa = staged[4], wb = staged[5];
        uint dst = q * kStride + part * 2u;
        ivec4 v[2];
        for (uint i = 0u; i < 8u; ++i) {
          uint m = (1u << bits) - 1u, sh = bits * i;
          v[i >> 2u][i & 3u] = int(((wa >> sh) & m) | (((wb >> sh) & m) << 16u));
        }
        s_w[dst] = v[0];
        s_w[dst + 1u] = v[1];
      }
    } else {  // weights: thread -> (column tid / 4, codes [16 (tid % 4), +16) of the chunk)
      uint c = tid >> 2u, part = tid & 3u;
      if (part * 16u < cb * 32u) {
        uint dst = c * kStride + part * 4u;
        if (n0 + c < args.n) stage_codes(wbase + (n0 + c) * row_words, bits, j0 * 32u + part * 16u, dst);
        else for (uint i = 0u; i < 4u; ++i) s_w[dst + i] = ivec4(0);
      }
    }
    barrier();
    if (j0 + 2u < blocks) load_chunk(j0 + 2u, blocks, n0, wbase, row_words, bits, packed, staged);
    for (uint jb = 0u; jb < cb; ++jb) {
      int iq[8] = int[8](0, 0, 0, 0, 0, 0, 0, 0);
      if (packed) {
        // Two columns per int product: L + 2^16 H with |L|, |H| <= 16 * 127 * 15 < 2^15 per
        // half block, so L is the low 16 bits (signed) and H = (acc - L) >> 16, exactly.
        for (uint h = 0u; h < 2u; ++h) {
          int acc2[4] = int[4](0, 0, 0, 0);
          for (uint i = 4u * h; i < 4u * h + 4u; ++i) {
            ivec4 xa = s_x[tp * kStride + jb * 8u + i], xb = s_x[(tp + 16u) * kStride + jb * 8u + i];
            ivec4 w0 = s_w[tn * kStride + jb * 8u + i], w1 = s_w[(tn + 16u) * kStride + jb * 8u + i];
            acc2[0] += dot4(xa, w0);
            acc2[1] += dot4(xa, w1);
            acc2[2] += dot4(xb, w0);
            acc2[3] += dot4(xb, w1);
          }
          for (uint u = 0u; u < 4u; ++u) {
            int lo = bitfieldExtract(acc2[u], 0, 16);
            iq[2u * u] += lo;
            iq[2u * u + 1u] += (acc2[u] - lo) >> 16;
          }
        }
      } else {
        for (uint i = 0u; i < 8u; ++i) {
          ivec4 xa = s_x[tp * kStride + jb * 8u + i], xb = s_x[(tp + 16u) * kStride + jb * 8u + i];
          for (uint c = 0u; c < 4u; ++c) {
            ivec4 wv = s_w[col[c] * kStride + jb * 8u + i];
            iq[c] += dot4(xa, wv);
            iq[4u + c] += dot4(xb, wv);
          }
        }
      }
      uint j = j0 + jb;
      for (uint a = 0u; a < 2u; ++a) {
        float d = s_d[(tp + 16u * a) * 2u + jb];
        xg[a] = xg[a] + float(s_sx[(tp + 16u * a) * 2u + jb]) * d;
        for (uint c = 0u; c < 4u; ++c) pg[4u * a + c] = pg[4u * a + c] + float(iq[4u * a + c]) * d;
      }
      if ((j + 1u) % per_group == 0u) {  // group g ends: acc += s*P + b*X per output
        uint g = j / per_group;
        for (uint c = 0u; c < 4u; ++c) {
          uint n = n0 + col[c];
          if (n >= args.n) continue;
          uint sidx = (ex * args.n + n) * args.groups + g;
          float sc = SB_LOAD(scales, args.scale_dtype, sidx), bc = SB_LOAD(biases, args.scale_dtype, sidx);
          for (uint a = 0u; a < 2u; ++a) {
            precise float term = sc * pg[4u * a + c] + bc * xg[a];
            acc[4u * a + c] = acc[4u * a + c] + term;
            pg[4u * a + c] = 0.0;
          }
        }
        xg[0] = xg[1] = 0.0;
      }
    }
    barrier();
  }
  for (uint a = 0u; a < 2u; ++a) {
    uint pl = tp + 16u * a;
    if (pl >= count) continue;
    uint e0 = (first + pl) * args.n + n0;
    for (uint h = 0u; h < 2u; ++h) {  // columns col[2h], col[2h] + 1 (even: a whole f16/bf16 word)
      uint n = col[2u * h];
      if (n0 + n >= args.n) continue;
      float lo = acc[4u * a + 2u * h], hi = acc[4u * a + 2u * h + 1u];
      if (sb_per_word(args.out_dtype) == 2u) {
        o[(e0 + n) >> 1u] = sb_encode_word(lo, hi, args.out_dtype);
      } else {
        o[e0 + n] = floatBitsToUint(lo);
        if (n0 + n + 1u < args.n) o[e0 + n + 1u] = floatBitsToUint(hi);
      }
    }
  }
}
#endif
