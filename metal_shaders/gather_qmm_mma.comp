// Kernel variants of this file, one line each (metal_shaders/README.md, "Variants"):
// SB_KERNEL(qmm_mma, QMM_MMA, "rrrrrrrrrwb", QmmArgs, SB_QMM_ARGS, 256, F_MMA)
// SB_KERNEL(qmm_mma4, QMM_MMA4, "rrrrrrrrrwb", QmmArgs, SB_QMM_ARGS, 256, F_MMA)
// qmm_mma4's bindings (out: h's Q8 codes), then the up projection's codes, scales and
// biases, h's block scales d and code sums.
// SB_KERNEL(qmm_mma4_glu, QMM_MMA4_GLU, "rrrrrrrrrwbrrrww", QmmGluArgs, SB_QMM_GLU_ARGS, 256, F_MMA)
// SB_KERNEL(qmm_mma_probe, QMM_MMA_PROBE, "w", ProbeArgs, SB_PROBE_ARGS, 32, F_MMA)
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// Vulkan only: int8 cooperative matrices (no MSL).
#extension GL_NV_cooperative_matrix : require
#extension GL_NV_integer_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
// GatherQmm's sorted tiles (gather_qmm_tile.comp's QMM_TILES work list) on int8
// cooperative matrices: QMM_MMA, QMM_MMA4 (all-4-bit experts), QMM_MMA4_GLU (gate and up,
// their Glu, h's Q8 blocks) and QMM_MMA_PROBE (the start-up check of the fragment
// layout); thread -> output at each kernel below. Shared parts: gather_qmm_common.glsl.
#ifdef QMM_MMA4_GLU  // QMM_MMA4 for a gate and an up projection: out = the Q8 blocks of their Glu
#define QMM_MMA4
#define SB_MMA_GLU
#endif
#ifdef QMM_MMA4  // QMM_MMA for 4-bit experts only: fewer registers, so faster
#define QMM_MMA
#define SB_MMA_BITS4
#endif
#include "gather_qmm_common.glsl"

#ifdef QMM_MMA_PROBE
layout(local_size_x = 32) in;
#else
layout(local_size_x = 256) in;
#endif

#ifdef QMM_MMA
// QMM_TILE's work on int8 tensor cores (Vulkan with VK_NV_cooperative_matrix only; the
// host falls back to QMM_TILE elsewhere): tiles of up to kTp = 64 pairs (the work list
// made for SB_QMM_MMA_PAIRS: an expert's weights are read once per 64 of its pairs) x 64
// columns per workgroup, chunks of kCh = 4 blocks (32 K values each) in one shared
// buffer; the next chunk's global loads are in flight while this one's MMAs run, the
// weight codes of the chunk after it are touched (one word a sector) so that they come
// from L2 (registers for a deeper prefetch would cost occupancy), and a subgroup skips the
// MMAs of its 16-row groups that hold no pair. (SB_MMA_CHUNK = 2 and SB_MMA_BUFFERS = 2
// compile forms bench/RESULTS.md measured slower on 32-pair tiles: more registers or shared
// memory, fewer workgroups per SM; 8 blocks a chunk, measured slower too, is gone: each thread
// stages one (pair, block)'s d, so kCh kTp <= 256.) Per 32-block, subgroup w multiplies
// rows 16 (w % 2) + 32 g + [0, 16) (g < 2) of Q8 codes by columns 16 (w / 2) + [0, 16) of
// weight codes (16x16x32 integer MMAs, one B fragment for both) into exact int32 block
// dots Iq, and each invocation runs the float steps of docs/numerics.md (block and group
// order) on the Iq it holds.
// Thread -> output (lane l of subgroup w): element e of accumulator g is row
// 16 (w % 2) + 32 g + l / 4 + 8 (e / 4), column 16 (w / 2) + 8 ((e / 2) % 2) + 2 (l % 4) + e % 2 —
// NVIDIA's fragment layout, which the device's start-up probe (QMM_MMA_PROBE) confirms
// before this kernel is used.
// 8-bit codes q are stored as q - 128 (int8) and their block dot gets 128 * Sx back.
layout(std430, binding = 0) readonly buffer Q { uvec4 q4[]; };  // 8 words per block (16-byte aligned: host check)
layout(std430, binding = 1) readonly buffer D { float dq[]; };
layout(std430, binding = 2) readonly buffer S { int sq[]; };
layout(std430, binding = 3) readonly buffer Wt { uint codes[]; };
layout(std430, binding = 3) readonly buffer Wt4 { uvec4 codes4[]; };  // the same words, 16 bytes at a time
layout(std430, binding = 4) readonly buffer Sc { uint scales[]; };
layout(std430, binding = 5) readonly buffer Bi { uint biases[]; };
layout(std430, binding = 6) readonly buffer L { int lhs[]; };
layout(std430, binding = 7) readonly buffer T { uint tiles[]; };
layout(std430, binding = 8) readonly buffer Ex { uint expert_info[]; };  // [E] bits, then [E] word offsets
layout(std430, binding = 9) writeonly buffer O { uint o[]; };  // SB_MMA_GLU: h's Q8 codes
layout(std430, binding = 10) buffer Er { uint err[]; };
#ifdef SB_MMA_GLU
// QMM_MMA4_GLU: workgroup (tile, c) computes gate and up columns [32c, 32c + 32) (the
// weight columns 0..31 of the tile are gate rows, 32..63 up rows), then h = Glu of the
// two rounded to the output dtype, and writes h's Q8 block c of each pair (the
// QUANTIZE steps, in this kernel's permuted K order: the down projection's qmm_mma4
// reads them). Thread -> block word after the MMAs: pairs tid / 8 + 32 g, code word tid % 8.
layout(std430, binding = 11) readonly buffer WtU { uint codes_up[]; };
layout(std430, binding = 11) readonly buffer WtU4 { uvec4 codes_up4[]; };
layout(std430, binding = 12) readonly buffer ScU { uint up_scales[]; };
layout(std430, binding = 13) readonly buffer BiU { uint up_biases[]; };
layout(std430, binding = 14) writeonly buffer HD { float hd[]; };
layout(std430, binding = 15) writeonly buffer HS { int hs[]; };
layout(push_constant) uniform Args { SB_QMM_GLU_ARGS } args;
#define MMA_COLS 32u  // output columns per workgroup
#else
layout(push_constant) uniform Args { SB_QMM_ARGS } args;
#define MMA_COLS 64u
#endif
#include "spec_constants.glsl"
#define SCALE_DT SB_SPEC(kSpecDt0, args.scale_dtype)  // the weights' scales and biases
#define OUT_DT SB_SPEC(kSpecDt1, args.out_dtype)      // the outputs (QMM_MMA4_GLU: h)
#define GLU_KIND SB_SPEC(kSpecDt2, args.glu_kind)     // QMM_MMA4_GLU's Glu (a kind, not a dtype)
#define Q_K SB_SPEC(kSpecExtent, args.k)             // x's columns
#define Q_N SB_SPEC(kSpecExtent2, args.n)            // outputs a pair (QMM_MMA4_GLU: h's)
#define Q_GS SB_SPEC(kSpecExtent3, args.group_size)  // the weights' group size

const uint kTp = SB_QMM_MMA_PAIRS, kTn = 64u;
// 16-row groups a subgroup multiplies: 1 or 2 (SB_QMM_MMA_PAIRS 32 or 64; mma_chunks has a copy for each).
const uint kRg = kTp / 32u;
#ifndef SB_MMA_CHUNK
#define SB_MMA_CHUNK 4
#endif
#ifndef SB_MMA_BUFFERS
#define SB_MMA_BUFFERS 1
#endif
#if (SB_MMA_CHUNK != 2 && SB_MMA_CHUNK != 4) || (SB_MMA_BUFFERS != 1 && SB_MMA_BUFFERS != 2)
#error "SB_MMA_CHUNK: 2 or 4 blocks (a thread stages one (pair, block)'s d and code sum); SB_MMA_BUFFERS: 1 or 2"
#endif
const uint kCh = uint(SB_MMA_CHUNK);    // blocks per chunk
const uint kNb = uint(SB_MMA_BUFFERS);  // shared buffers: 2, or 1 (a second barrier a chunk)
const uint kLd = (kTn * kCh + 255u) / 256u;  // (column, block) weight loads per thread a chunk
const uint kLa = (2u * kTp * kCh + 255u) / 256u;  // 16-byte Q8 code loads per thread a chunk
const uint kAb = 8u * kCh + 4u;   // words per shared row of a chunk's int8 codes + 4 of padding (bank spread)
const uint kABuf = kTp * kAb, kBBuf = kTn * kAb;  // one buffer of A, of B
#ifdef SB_MMA_GLU
// s_a and s_b in one array: after the MMAs it holds the rounded gate and up results,
// [pair][64] (the NVIDIA driver fits fewer workgroups per SM with more shared memory).
const uint kAbWords = kNb * (kABuf + kBBuf);
// The Glu epilogue's words: [pair][64] results, then each pair's amax bits (kEpMax) and code sum (kEpSum).
const uint kEpMax = kTp * 64u, kEpSum = kTp * 65u, kEpWords = kTp * 66u;
shared uint s_ab[kAbWords > kEpWords ? kAbWords : kEpWords];  // the epilogue's [pair][64] and counters too
#define s_a s_ab
#define s_b s_ab
const uint kA0 = 0u, kB0 = kNb * kABuf;
#else
shared uint s_a[kNb * kABuf];  // Q8 codes, row-major [buffer][pair][k]
shared uint s_b[kNb * kBBuf];  // weight codes, [buffer][column][k]: B (k x n) column-major
const uint kA0 = 0u, kB0 = 0u;
#endif
#ifdef SB_MMA_BITS4
// A (pair, block)'s d and X term float(Sx) d as one vec2, and a column pair's scale and bias as
// one vec4 (s, b of the even column, then the odd one's): fewer shared loads in the float steps.
shared vec2 s_dx[kNb * kCh * kTp];       // [buffer][block][pair]
shared vec4 s_sbp[kNb * kCh * kTn / 2u];  // [buffer][block][column / 2]
#else
shared float s_d[kNb * kCh * kTp];  // [buffer][block][pair]
shared int s_sx[kNb * kCh * kTp];
shared float s_scale[kNb * kCh * kTn];  // [buffer][block][column]: the block's group's s
shared float s_bias[kNb * kCh * kTn];
#endif
shared int s_row[kTp];
#ifndef SB_MMA_BITS4  // (declared but unused, it would still take shared memory: fewer workgroups per SM)
shared uint s_raw[256u * 8u];  // each thread's weight words, for the widths other than 4 and 8
#endif

#include "gather_qmm_mma_stage.glsl"  // stage_block: a block's codes as int8 in s_b

#ifdef SB_MMA_BITS4
// The scales and biases staged once per group of the chunk, not once per block: block jb of a
// chunk (which starts at a multiple of kCh) finds its group's in slot group_slot(jb) (the group's
// first block in the chunk, or 0), where group_loader(jb)'s threads stored them. The loads this
// saves read words other threads read too; they cost the kernel more than their bytes say.
uint group_slot(uint jb, uint gshift) { return jb & ~(min(1u << gshift, kCh) - 1u); }
// 16-bit scales, groups of 2 blocks, an even number of groups a column: a chunk's two groups'
// scales (and biases) are one word, loaded by block 0's threads.
bool pair16(uint gshift) { return sb_is16(SCALE_DT) && gshift == 1u && kCh == 4u && (Q_K / Q_GS) % 2u == 0u; }
bool group_loader(uint jb, uint gshift) { return pair16(gshift) ? jb == 0u : group_slot(jb, gshift) == jb; }
#endif

// Where this thread's loads of chunk 0 start (mma_load); chunk j0 adds j0 blocks.
// Load i of a thread is entry tid + 256 i: weight words of column e / kCh's block e % kCh,
// the scale and bias of column e % 64 for block e / 64 (4-bit kernels: group_loader's only).
struct MmaBases {
  int xrow[kLa];  // Q8 row of load i's pair (tid + 256 i) / (2 kCh) (-1: none, or past 2 kTp kCh)
  int drow;       // Q8 row of pair tid / kCh for d and the code sum (-1: none, or tid >= kCh kTp)
  uint w[kLd];    // first word of the load's column block in chunk 0
  bool wlive[kLd];  // its column inside n
  uint s[kLd];    // scale index of the load's column, group 0
  bool wup[kLd];  // SB_MMA_GLU: the weight words, and the scales, are the up projection's
  bool sup[kLd];
};

// A chunk in registers: Q8 codes of pair e / (2 kCh) (16-byte unit e % (2 kCh) of the
// chunk; e = tid + 256 i), d and code sum (pair tid / kCh, block tid % kCh), kLd column blocks of weight
// words and kLd scale/bias pairs.
struct MmaChunk {
  uvec4 xa[kLa];
  uint ds[2];
  uint w[kLd][8];
  float sb[kLd][2];
  float sb2[kLd][2];  // pair16: the next group's (slot 2)
};

// This thread's global words of the chunk at block j0 (group_size is a power of two: a shift).
void mma_load(uint j0, uint blocks, uint bits, uint gshift, MmaBases b, out MmaChunk c) {
  uint tid = gl_LocalInvocationID.x;
  [[unroll]] for (uint i = 0u; i < kLa; ++i) {
    uint u = (tid + 256u * i) % (2u * kCh);  // 16-byte unit of the pair's chunk: block j0 + u / 2
    c.xa[i] = b.xrow[i] >= 0 && j0 + (u >> 1u) < blocks ? q4[(uint(b.xrow[i]) * blocks + j0) * 2u + u] : uvec4(0u);
  }
  c.ds[0] = c.ds[1] = 0u;
  uint jd = j0 + tid % kCh;
  if (b.drow >= 0 && jd < blocks) {
    c.ds[0] = floatBitsToUint(dq[uint(b.drow) * blocks + jd]);
    c.ds[1] = uint(sq[uint(b.drow) * blocks + jd]);
  }
  [[unroll]] for (uint l = 0u; l < kLd; ++l) {
    uint e = tid + 256u * l, j = j0 + e % kCh;
    if (e >= kTn * kCh) break;  // past the chunk's entries (mma_stage skips them too)
    bool live = b.wlive[l] && j < blocks;
    uint base = b.w[l] + j0 * bits;
    if (bits == 4u && (base & 3u) == 0u) {  // the common case: one 16-byte load
#ifdef SB_MMA_GLU
      uvec4 v = live ? (b.wup[l] ? codes_up4[base >> 2u] : codes4[base >> 2u]) : uvec4(0u);
#else
      uvec4 v = live ? codes4[base >> 2u] : uvec4(0u);
#endif
      c.w[l][0] = v.x;
      c.w[l][1] = v.y;
      c.w[l][2] = v.z;
      c.w[l][3] = v.w;
      c.w[l][4] = c.w[l][5] = c.w[l][6] = c.w[l][7] = 0u;
    } else {
#ifdef SB_MMA_GLU
      [[unroll]] for (uint i = 0u; i < 8u; ++i)
        c.w[l][i] = live && i < bits ? (b.wup[l] ? codes_up[base + i] : codes[base + i]) : 0u;
#else
      [[unroll]] for (uint i = 0u; i < 8u; ++i) c.w[l][i] = live && i < bits ? codes[base + i] : 0u;
#endif
    }
#ifdef SB_MMA_BITS4
    if (!group_loader(e / 64u, gshift)) continue;  // uniform over each subgroup: its block's group is loaded by another
#endif
    uint sidx = b.s[l] + (min(j0 + e / 64u, blocks - 1u) >> gshift);
#ifdef SB_MMA_BITS4
    if (pair16(gshift)) {
#ifdef SB_MMA_GLU
      uint ws = b.sup[l] ? up_scales[sidx >> 1u] : scales[sidx >> 1u], wb = b.sup[l] ? up_biases[sidx >> 1u] : biases[sidx >> 1u];
#else
      uint ws = scales[sidx >> 1u], wb = biases[sidx >> 1u];
#endif
      c.sb[l][0] = sb_decode(ws, SCALE_DT, 0u);
      c.sb[l][1] = sb_decode(wb, SCALE_DT, 0u);
      c.sb2[l][0] = sb_decode(ws, SCALE_DT, 1u);
      c.sb2[l][1] = sb_decode(wb, SCALE_DT, 1u);
      continue;
    }
#endif
#ifdef SB_MMA_GLU
    if (b.sup[l]) {
      c.sb[l][0] = SB_LOAD(up_scales, SCALE_DT, sidx);
      c.sb[l][1] = SB_LOAD(up_biases, SCALE_DT, sidx);
      continue;
    }
#endif
    c.sb[l][0] = SB_LOAD(scales, SCALE_DT, sidx);
    c.sb[l][1] = SB_LOAD(biases, SCALE_DT, sidx);
  }
}

// One word of each 32-byte sector of this thread's weight codes in the chunk at block j0
// (0 past the weights): loaded only to bring the sectors into L2 before mma_load asks.
uint mma_prefetch(uint j0, uint blocks, uint bits, MmaBases b) {
  uint tid = gl_LocalInvocationID.x, v = 0u;
  [[unroll]] for (uint l = 0u; l < kLd; ++l) {
    uint e = tid + 256u * l, j = j0 + e % kCh;
    if (e >= kTn * kCh) break;
    if ((e & 1u) != 0u || !b.wlive[l] || j >= blocks) continue;  // 4-bit codes: 2 blocks a sector (wider: in part)
    uint base = b.w[l] + j0 * bits;
#ifdef SB_MMA_GLU
    v ^= b.wup[l] ? codes_up[base] : codes[base];
#else
    v ^= codes[base];
#endif
  }
  return v;
}

// A chunk from registers into shared buffer `buf`.
void mma_stage(uint bits, uint gshift, uint buf, MmaChunk c) {
  uint tid = gl_LocalInvocationID.x;
  [[unroll]] for (uint i = 0u; i < kLa; ++i) {
    uint e = tid + 256u * i;
    if (e >= 2u * kTp * kCh) break;  // uniform over each subgroup
    uint at = kA0 + buf * kABuf + (e / (2u * kCh)) * kAb + 4u * (e % (2u * kCh));
    s_a[at] = c.xa[i].x;
    s_a[at + 1u] = c.xa[i].y;
    s_a[at + 2u] = c.xa[i].z;
    s_a[at + 3u] = c.xa[i].w;
  }
  if (tid < kCh * kTp) {
    uint at = (buf * kCh + tid % kCh) * kTp + tid / kCh;
#ifdef SB_MMA_BITS4  // only the X term float(Sx) d is needed: made once per (pair, block)
    precise float xd = float(int(c.ds[1])) * uintBitsToFloat(c.ds[0]);
    s_dx[at] = vec2(uintBitsToFloat(c.ds[0]), xd);
#else
    s_d[at] = uintBitsToFloat(c.ds[0]);
    s_sx[at] = int(c.ds[1]);
#endif
  }
  [[unroll]] for (uint l = 0u; l < kLd; ++l) {
    uint e = tid + 256u * l;
    if (e >= kTn * kCh) break;  // uniform over each subgroup
#ifdef SB_MMA_BITS4
    if (group_loader(e / 64u, gshift)) {
      uint sp = (buf * kCh + e / 64u) * (kTn / 2u) + (e % 64u) / 2u, half_ = 2u * (e & 1u);
      s_sbp[sp][half_] = c.sb[l][0];
      s_sbp[sp][half_ + 1u] = c.sb[l][1];
      if (pair16(gshift)) {
        s_sbp[sp + kTn][half_] = c.sb2[l][0];  // slot 2: two blocks on
        s_sbp[sp + kTn][half_ + 1u] = c.sb2[l][1];
      }
    }
#else
    s_scale[(buf * kCh + e / 64u) * kTn + e % 64u] = c.sb[l][0];
    s_bias[(buf * kCh + e / 64u) * kTn + e % 64u] = c.sb[l][1];
#endif
    stage_block(bits, c.w[l], kB0 + buf * kBBuf + (e / kCh) * kAb + 8u * (e % kCh));
  }
}

// Chunk j0's blocks from shared buffer buf for this subgroup's first `groups` 16-row groups
// (a constant at each call: no per-group branch), into the float steps of docs/numerics.md.
// Branch-free where the chunk is whole: the driver then issues a block's MMAs while the previous
// block's float steps run (it does not move them across a branch; bench/RESULTS.md).
void mma_chunk(uint j0, uint buf, uint blocks, uint per_group, uint bits, uint groups, uint r0, uint c0,
               uint mr, uint mc, precise inout float acc[8 * kRg],
               precise inout float pg[8 * kRg], precise inout float xg[2 * kRg]) {
  bool whole = blocks % kCh == 0u && kCh % per_group == 0u;  // constants where k and the group size are
  [[unroll]] for (uint jb = 0u; jb < kCh; ++jb) {
    uint j = j0 + jb;
    if (!whole && j >= blocks) break;  // uniform: cooperative-matrix ops stay in uniform control flow
    icoopmatNV<8, 3, 32, 16> mw;
    coopMatLoadNV(mw, s_b, kB0 + buf * kBBuf + mc * kAb + 8u * jb, kAb, true);
    // j0 is a multiple of kCh: where kCh is one of per_group, jb alone places the block.
    uint jg = whole ? jb : j;
    bool first_block = (jg & (per_group - 1u)) == 0u, last_block = ((jg + 1u) & (per_group - 1u)) == 0u;  // uniform
    // Columns c0 + {0, 1, 8, 9} (past n, for odd f32 widths: column n - 1's scales,
    // not stored); element e has column c0 + 8 ((e / 2) % 2) + e % 2.
#ifdef SB_MMA_BITS4
    uint sat = (buf * kCh + group_slot(jb, uint(findLSB(per_group)))) * kTn + c0;
#else
    uint sat = (buf * kCh + jb) * kTn + c0;
#endif
    float sc[4], bc[4];
    if (last_block) {
#ifdef SB_MMA_BITS4
      vec4 p0 = s_sbp[sat >> 1u], p1 = s_sbp[(sat + 8u) >> 1u];  // c0 is even
      sc = float[4](p0.x, p0.z, p1.x, p1.z);
      bc = float[4](p0.y, p0.w, p1.y, p1.w);
#else
      sc = float[4](s_scale[sat], s_scale[sat + 1u], s_scale[sat + 8u], s_scale[sat + 9u]);
      bc = float[4](s_bias[sat], s_bias[sat + 1u], s_bias[sat + 8u], s_bias[sat + 9u]);
#endif
    }
    [[unroll]] for (uint g = 0u; g < kRg; ++g) {
      if (g >= groups) break;  // a constant at each call
      icoopmatNV<8, 3, 16, 32> ma;
      coopMatLoadNV(ma, s_a, kA0 + buf * kABuf + (mr + 32u * g) * kAb + 8u * jb, kAb, false);
      icoopmatNV<32, 3, 16, 16> md = icoopmatNV<32, 3, 16, 16>(0);
      md = coopMatMulAddNV(ma, mw, md);
      uint at = (buf * kCh + jb) * kTp + r0 + 32u * g;
#ifdef SB_MMA_BITS4
      vec2 dx0 = s_dx[at], dx1 = s_dx[at + 8u];
      float d[2] = float[2](dx0.x, dx1.x);
      const int sx[2] = int[2](0, 0);  // (8-bit codes only)
      float xd[2] = float[2](dx0.y, dx1.y);
#else
      float d[2] = float[2](s_d[at], s_d[at + 8u]);
      int sx[2] = int[2](s_sx[at], s_sx[at + 8u]);
      precise float xd[2] = float[2](float(sx[0]) * d[0], float(sx[1]) * d[1]);
#endif
      // A group's first block assigns P and X instead of adding to 0: the same bits,
      // since float(Iq) d and float(Sx) d are never -0 (d >= 0 or NaN, and Iq = 0 if d = 0).
      if (first_block) {
        xg[2u * g] = xd[0];
        xg[2u * g + 1u] = xd[1];
        [[unroll]] for (uint e = 0u; e < 8u; ++e) {
          int iq = md[e] + (bits == 8u ? 128 * sx[e >> 2u] : 0);
          pg[8u * g + e] = float(iq) * d[e >> 2u];
        }
      } else {
        xg[2u * g] = xg[2u * g] + xd[0];
        xg[2u * g + 1u] = xg[2u * g + 1u] + xd[1];
        [[unroll]] for (uint e = 0u; e < 8u; ++e) {
          int iq = md[e] + (bits == 8u ? 128 * sx[e >> 2u] : 0);
          pg[8u * g + e] = pg[8u * g + e] + float(iq) * d[e >> 2u];
        }
      }
      if (last_block) {  // a group ends: acc += s*P + b*X per output
        [[unroll]] for (uint e = 0u; e < 8u; ++e) {
          uint h = e >> 2u, c = (e & 1u) + 2u * ((e >> 1u) & 1u);
          precise float t = sc[c] * pg[8u * g + e] + bc[c] * xg[2u * g + h];
          acc[8u * g + e] = acc[8u * g + e] + t;
        }
      }
    }
  }
}

// mma_chunk in a copy for each count of live 16-row groups of this subgroup (uniform over it).
void mma_chunks(uint j0, uint buf, uint blocks, uint per_group, uint bits, uint count, uint r0, uint c0, uint mr,
                uint mc, precise inout float acc[8 * kRg], precise inout float pg[8 * kRg],
                precise inout float xg[2 * kRg]) {
  if (mr + 32u < count && kRg == 2u) {
    mma_chunk(j0, buf, blocks, per_group, bits, 2u, r0, c0, mr, mc, acc, pg, xg);
  } else if (mr < count) {
    mma_chunk(j0, buf, blocks, per_group, bits, 1u, r0, c0, mr, mc, acc, pg, xg);
  }
}

#ifdef SB_MMA_GLU
// The gate and up results rounded into s_ab (free after the MMAs' last barrier); then
// h = Glu (rounded) and its Q8 block for each pair of the tile: pair tid / 8 owns the
// block, thread tid % 8 its code word i (h columns 8 (i / 2) + 2 j + i % 2, j < 4:
// qmm_mma4's K order); the block's amax and code sum by shared atomics on s_ab's words after
// the [pair][64] results (integers: any order).
void glu_q8_epilogue(float acc[8 * kRg], uint r0, uint c0, uint first, uint count, uint n0) {
  uint tid = gl_LocalInvocationID.x;
  if (tid < 2u * kTp) s_ab[kEpMax + tid] = 0u;  // [0, kTp): amax bits per pair, [kTp, 2 kTp): code sums
  // Rows past the tile's pairs are never stored: no Glu (exact exp, the costly part), no Q8.
  [[unroll]] for (uint g = 0u; g < kRg; ++g) {
    if ((r0 & ~15u) + 32u * g >= count) break;  // uniform over the subgroup: its 16 rows hold no pair
    [[unroll]] for (uint e = 0u; e < 8u; ++e)
      s_ab[(r0 + 32u * g + 8u * (e >> 2u)) * 64u + c0 + 8u * ((e >> 1u) & 1u) + (e & 1u)] =
          floatBitsToUint(sb_round_to(acc[8u * g + e], OUT_DT));
  }
  barrier();
  uint i = tid & 7u;
  float hv[4 * kRg];
  [[unroll]] for (uint g = 0u; g < kRg; ++g) {
    uint r = (tid >> 3u) + 32u * g, amax = 0u;
    if (r >= count) break;
    [[unroll]] for (uint j = 0u; j < 4u; ++j) {
      uint c = 8u * (i >> 1u) + 2u * j + (i & 1u);
      float gv = uintBitsToFloat(s_ab[r * 64u + c]), uv = uintBitsToFloat(s_ab[r * 64u + 32u + c]);
      hv[4u * g + j] = sb_round_to(sb_glu(gv, uv, GLU_KIND, args.glu_alpha, args.glu_limit), OUT_DT);
      amax = max(amax, floatBitsToUint(hv[4u * g + j]) & 0x7fffffffu);
    }
    atomicMax(s_ab[kEpMax + r], amax);
  }
  barrier();
  uint word[kRg];
  float d[kRg];
  [[unroll]] for (uint g = 0u; g < kRg; ++g) {
    uint r = (tid >> 3u) + 32u * g;
    if (r >= count) break;
    float scale;
    bool zero;
    q8_params(s_ab[kEpMax + r], scale, d[g], zero);
    word[g] = 0u;
    int part = 0;
    [[unroll]] for (uint j = 0u; j < 4u; ++j) {
      int code = zero ? 0 : q8_code(hv[4u * g + j], scale);
      part += code;
      word[g] |= (uint(code) & 0xffu) << (8u * j);
    }
    atomicAdd(s_ab[kEpSum + r], uint(part));  // two's complement: the int sum's bits
  }
  barrier();
  [[unroll]] for (uint g = 0u; g < kRg; ++g) {
    uint r = (tid >> 3u) + 32u * g;
    if (r >= count) break;
    uint blocks = Q_N / 32u, at = (first + r) * blocks + n0 / 32u;
    o[at * 8u + i] = word[g];
    if (i == 0u) {
      hd[at] = d[g];
      hs[at] = int(s_ab[kEpSum + r]);
    }
  }
}
#endif

void main() {
  uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  uint tid = gl_LocalInvocationID.x, warp = tid >> 5u;
  uint tile = wg / args.tiles, n0 = (wg % args.tiles) * MMA_COLS;
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
#ifdef SB_MMA_BITS4  // every expert 4-bit (the host checks): the other widths' code compiled out
  const uint bits = 4u;
#else
  uint bits = expert_info[ex];
  if (bits == 0u) {  // expert 0 pruned, without rhs (the work list never holds a pruned expert)
    if (tid == 0u) atomicOr(err[0], SB_ERR_PRUNED);
    return;
  }
#endif
  uint row_words = Q_K * bits / 32u;
  uint wbase = expert_info[args.experts + ex];
  uint blocks = Q_K / 32u, per_group = Q_GS / 32u;
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
  uint lane = tid & 31u, r0 = 16u * (warp & 1u) + (lane >> 2u), c0 = 16u * (warp >> 1u) + 2u * (lane & 3u);
  precise float acc[8 * kRg], pg[8 * kRg], xg[2 * kRg];  // [g][e], [g][e], [g][e / 4]
  [[unroll]] for (uint i = 0u; i < 8u * kRg; ++i) acc[i] = pg[i] = 0.0;
  [[unroll]] for (uint i = 0u; i < 2u * kRg; ++i) xg[i] = 0.0;
  barrier();
  MmaBases mb;
  [[unroll]] for (uint i = 0u; i < kLa; ++i) {
    uint e = tid + 256u * i;
    mb.xrow[i] = e < 2u * kTp * kCh ? s_row[e / (2u * kCh)] : -1;
  }
  mb.drow = tid < kCh * kTp ? s_row[tid / kCh] : -1;
  [[unroll]] for (uint l = 0u; l < kLd; ++l) {
    uint e = tid + 256u * l, c = e / kCh, sc = e % 64u;
#ifdef SB_MMA_GLU  // tile columns 32..63 are the up projection's columns 0..31
    mb.wup[l] = c >= 32u;
    mb.sup[l] = sc >= 32u;
    c &= 31u;
    sc &= 31u;
#else
    mb.wup[l] = mb.sup[l] = false;
#endif
    mb.w[l] = wbase + (n0 + c) * row_words + (e % kCh) * bits;
    mb.wlive[l] = n0 + c < Q_N;
    mb.s[l] = (ex * Q_N + min(n0 + sc, Q_N - 1u)) * args.groups;
  }
  uint gshift = uint(findLSB(per_group));
  MmaChunk ck;
  uint pf_sink = 0u;
  mma_load(0u, blocks, bits, gshift, mb, ck);
  mma_stage(bits, gshift, 0u, ck);
  barrier();
  uint mr = 16u * (warp & 1u), mc = 16u * (warp >> 1u);
  // Every chunk but the last (no uniform branch in the steady loop): the next chunk's loads, a
  // touch of the one after it (nothing past the weights), this chunk's MMAs, the next staged.
  uint j0 = 0u, buf = 0u;
  for (; j0 + kCh < blocks; j0 += kCh, buf = (buf + 1u) % kNb) {
    mma_load(j0 + kCh, blocks, bits, gshift, mb, ck);
    uint pf_new = mma_prefetch(j0 + 2u * kCh, blocks, bits, mb);
    mma_chunks(j0, buf, blocks, per_group, bits, count, r0, c0, mr, mc, acc, pg, xg);
    // Two buffers: the other one's last readers passed the previous barrier, this one's pass
    // the next. One: its readers are done first.
    if (kNb == 1u) barrier();
    mma_stage(bits, gshift, (buf + 1u) % kNb, ck);
    barrier();
    pf_sink ^= pf_new;
  }
  mma_chunks(j0, buf, blocks, per_group, bits, count, r0, c0, mr, mc, acc, pg, xg);
  barrier();  // (the Glu epilogue reuses the shared buffers)
  if (pf_sink == 0x9e3779b9u && count == 0u) atomicOr(err[0], 0u);  // never (count >= 1): keeps the prefetch loads
#ifdef SB_MMA_GLU
  glu_q8_epilogue(acc, r0, c0, first, count, n0);
#else
  [[unroll]] for (uint i = 0u; i < 8u * kRg; i += 2u) {  // elements i, i + 1: columns n, n + 1 of one row
    uint e = i & 7u, pl = r0 + 32u * (i >> 3u) + 8u * (e >> 2u), n = n0 + c0 + 8u * ((e >> 1u) & 1u);
    uint at = (first + pl) * Q_N + n;
    if (pl < count && n < Q_N) {
      if (sb_per_word(OUT_DT) == 2u) {
        o[at >> 1u] = sb_encode_word(acc[i], acc[i + 1u], OUT_DT);
      } else {
        o[at] = floatBitsToUint(acc[i]);
        if (n + 1u < Q_N) o[at + 1u] = floatBitsToUint(acc[i + 1u]);
      }
    }
  }
#endif
}
#endif

#ifdef QMM_MMA_PROBE
// The accumulator layout QMM_MMA assumes, checked on the device at start-up: one
// 16x16x32 MMA of A[r][0] = r, A[r][1] = 16 and B[0][c] = 1, B[1][c] = c (all else 0)
// gives C[r][c] = r + 16c. Thread -> output: lane l writes its element e to
// out[8l + e] and the element count to out[256].
layout(std430, binding = 0) writeonly buffer O { int o[]; };
layout(push_constant) uniform Args { SB_PROBE_ARGS } args;
shared uint s_a[16u * 8u];  // A row-major, 8 words (32 int8) per row
shared uint s_b[16u * 8u];  // B column-major, 8 words per column

void main() {
  uint l = gl_LocalInvocationID.x;
  for (uint i = l; i < 128u; i += 32u) {
    uint rc = i >> 3u;  // row of A, column of B
    s_a[i] = (i & 7u) == 0u ? rc | (16u << 8u) : 0u;
    s_b[i] = (i & 7u) == 0u ? 1u | (rc << 8u) : 0u;
  }
  barrier();
  icoopmatNV<8, 3, 16, 32> ma;
  coopMatLoadNV(ma, s_a, 0u, 8u, false);
  icoopmatNV<8, 3, 32, 16> mb;
  coopMatLoadNV(mb, s_b, 0u, 8u, true);
  icoopmatNV<32, 3, 16, 16> md = icoopmatNV<32, 3, 16, 16>(0);
  md = coopMatMulAddNV(ma, mb, md);
  for (uint e = 0u; e < 8u; ++e) o[8u * l + e] = e < uint(md.length()) ? md[e] : -1;
  if (l == 0u) o[256] = args.n == 1u ? md.length() : -1;  // the host passes n = 1
}
#endif
