#version 450
#extension GL_GOOGLE_include_directive : require
#ifdef QMM_MMA4_GLU  // QMM_MMA4 for a gate and an up projection: out = the Q8 blocks of their Glu
#define QMM_MMA4
#define SB_MMA_GLU
#endif
#ifdef QMM_MMA4  // QMM_MMA for 4-bit experts only: 66 instead of 74 registers on the H100, 6% faster
#define QMM_MMA
#define SB_MMA_BITS4
#endif
#if defined(QMM_MMA) || defined(QMM_MMA_PROBE)  // Vulkan only: int8 cooperative matrices (no MSL)
#extension GL_NV_cooperative_matrix : require
#extension GL_NV_integer_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
#endif
#extension GL_EXT_control_flow_attributes : require
// *_DOT4: the row kernels for all-4-bit experts on packed int8 dot products (OpSDot of
// SPV_KHR_integer_dot_product, which SPIRV-Cross cannot translate: Vulkan only).
#ifdef QMM_ROW_DOT4
#define QMM_ROW
#define SB_ROW_DOT4
#endif
#ifdef QMM_ROW_GLU_DOT4
#define QMM_ROW_GLU
#define SB_ROW_DOT4
#endif
#ifdef QMM_ROW_2K_DOT4
#define QMM_ROW_2K
#define SB_ROW_DOT4
#endif
#ifdef QMM_ROW_GLU_2K_DOT4
#define QMM_ROW_GLU_2K
#define SB_ROW_DOT4
#define SB_ROW_WAIT  // may follow the router without a barrier (args.wait_rhs)
#endif
#ifdef QMM_ROW_COMBINE_2K_DOT4
#define QMM_ROW_COMBINE_2K
#define SB_ROW_DOT4
#define SB_ROW_AFTER  // may follow qmm_row_glu_2k_dot4 without a barrier (args.wait_tiles)
#endif
#ifdef SB_ROW_DOT4
#extension GL_EXT_spirv_intrinsics : require
// OpSDot (4450) with PackedVectorFormat4x8Bit (0): the exact int32 sum of 4 int8 products.
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sb_sdot4x8(uint a, uint b, spirv_literal int packed_format);
#endif
// GatherQmm on the integer contract of docs/numerics.md; twin of
// cpu_fallback/gather_qmm.cpp. QUANTIZE makes the Q8 activation blocks, QMM the
// quantized expert matmul. Integer dots are exact in any order; the float steps
// run in the contract's fixed order.
#include "common.glsl"

// *_2K: the same kernels for rows of K <= SB_QMM_ROW_SMALL_K: a quarter of the shared
// memory (H100 decode: 25% faster at K = 2048 than with room for K = 8192).
#ifdef QMM_ROW_GLU_2K
#define QMM_ROW_GLU
#define QMM_ROW_2K
#endif
#ifdef QMM_ROW_COMBINE_2K  // QMM_ROW_2K whose last workgroup per (token, tile) also combines
#define QMM_ROW_COMBINE
#define QMM_ROW_2K
#endif
#ifdef QMM_ROW_GLU  // QMM_ROW computing two projections and their Glu
#define QMM_ROW
#endif
#ifdef QMM_ROW_2K
#define QMM_ROW
#define SB_ROW_STAGE_K SB_QMM_ROW_SMALL_K
#else
#define SB_ROW_STAGE_K SB_QMM_STAGE_K
#endif
#if defined(QMM_ROW) || defined(QMM_TILES) || defined(QMM_TILE)
layout(local_size_x = 256) in;
#elif defined(QMM_MMA)
layout(local_size_x = 256) in;
#elif defined(QMM_MMA_PROBE)
layout(local_size_x = 32) in;
#else
layout(local_size_x = 64) in;
#endif

// The Q8 steps of docs/numerics.md for one 32-block from the bits of its amax (|x| as
// bits orders non-negative floats, NaN above inf): the scale 2^sh for the codes and
// d = 2^-sh; `zero` when every code is 0 (amax < 2^-100: d = 0; not finite: d = NaN).
void q8_params(uint amax_bits, out float scale, out float d, out bool zero) {
  bool finite = amax_bits <= 0x7f7fffffu;
  zero = !finite || amax_bits < 0x0d800000u;  // 2^-100
  scale = 0.0;
  d = finite ? 0.0 : uintBitsToFloat(0x7fc00000u);
  if (zero) return;
  int sh = 6 - (int(amax_bits >> 23) - 127);
  precise float top = uintBitsToFloat(amax_bits) * sb_pow2i(sh);
  if (sb_gt(sb_round_even(top), 127.0)) --sh;
  scale = sb_pow2i(sh);
  d = sb_pow2i(-sh);
}

int q8_code(float x, float scale) {
  precise float v = x * scale;
  return int(sb_round_even(v));
}

// Exact int dot of a 32-block of codes (exactly `bits` words from CODES[base]) with
// the int8 activation block at word qb of QBUF; codes of 2, 4 and 8 bits never
// straddle words. Defined per code and activation buffer (global or shared).
#define SB_BLOCK_DOT(NAME, CODES, QBUF)                                              \
  int NAME(uint base, uint bits, uint qb) {                                          \
    int iq = 0;                                                                      \
    uint mask = (1u << bits) - 1u;                                                   \
    if (bits == 4u || bits == 2u || bits == 8u) {                                    \
      uint per_word = 32u / bits;                                                    \
      for (uint w = 0u; w < bits; ++w) {                                             \
        uint cw = CODES(base + w);                                                   \
        for (uint i = 0u; i < per_word; ++i) {                                       \
          uint idx = w * per_word + i;                                               \
          int xv = bitfieldExtract(int(QBUF[qb + (idx >> 2)]), int(8u * (idx & 3u)), 8); \
          iq += int((cw >> (i * bits)) & mask) * xv;                                 \
        }                                                                            \
      }                                                                              \
      return iq;                                                                     \
    }                                                                                \
    for (uint i = 0u; i < 32u; ++i) {                                                \
      uint bit = i * bits;                                                           \
      uint sh = bit & 31u;                                                           \
      uint v = CODES(base + (bit >> 5)) >> sh;                                       \
      if (sh + bits > 32u) v |= CODES(base + (bit >> 5) + 1u) << (32u - sh);         \
      iq += int(v & mask) * bitfieldExtract(int(QBUF[qb + (i >> 2)]), int(8u * (i & 3u)), 8); \
    }                                                                                \
    return iq;                                                                       \
  }

#if defined(QUANTIZE) || defined(QUANTIZE16)
// Thread -> output: invocation b quantizes 32-block b (row b / (k/32)): 8 words of
// int8 codes (in qmm_mma4's order with `permute`), its scale d = 2^-sh and its code sum.
// The block's values are loaded once into registers; QUANTIZE16 (x and q bound at
// 16-byte aligned offsets: the host checks) loads and stores 16 bytes at a time.
#ifdef QUANTIZE16
layout(std430, binding = 0) readonly buffer X { uvec4 x4[]; };
layout(std430, binding = 1) writeonly buffer Q { uvec4 q4[]; };
#else
layout(std430, binding = 0) readonly buffer X { uint x[]; };
layout(std430, binding = 1) writeonly buffer Q { uint q[]; };
#endif
layout(std430, binding = 2) writeonly buffer D { float dq[]; };
layout(std430, binding = 3) writeonly buffer S { int sq[]; };
layout(push_constant) uniform Args { SB_Q8_ARGS } args;

// Word i of the block's words (16 of f16/bf16, 32 of f32) starting at word `first`.
uint block_word(uint first, uint i) {
#ifdef QUANTIZE16
  return x4[(first >> 2u) + (i >> 2u)][i & 3u];
#else
  return x[first + i];
#endif
}

void main() {
  uint blk = sb_linear_id();
  uint blocks = args.k / 32u;
  if (blk >= args.rows * blocks) return;
  float v[32];
  if (sb_is16(args.dtype)) {
    [[unroll]] for (uint i = 0u; i < 16u; ++i) {
      uint w = block_word(blk * 16u, i);
      v[2u * i] = sb_decode(w, args.dtype, 0u);
      v[2u * i + 1u] = sb_decode(w, args.dtype, 1u);
    }
  } else {
    [[unroll]] for (uint i = 0u; i < 32u; ++i) v[i] = uintBitsToFloat(block_word(blk * 32u, i));
  }
  uint amax = 0u;
  [[unroll]] for (uint i = 0u; i < 32u; ++i) amax = max(amax, floatBitsToUint(v[i]) & 0x7fffffffu);
  float scale, d;
  bool zero;
  q8_params(amax, scale, d, zero);
  int s = 0;
  uint words[8];
  // Register arrays take constant indices only, so each order has its own unrolled loop.
  if (args.permute != 0u) {
    [[unroll]] for (uint w = 0u; w < 8u; ++w) {
      words[w] = 0u;
      [[unroll]] for (uint j = 0u; j < 4u; ++j) {
        int c = zero ? 0 : q8_code(v[8u * (w >> 1u) + 2u * j + (w & 1u)], scale);
        s += c;
        words[w] |= (uint(c) & 0xffu) << (8u * j);
      }
    }
  } else {
    [[unroll]] for (uint w = 0u; w < 8u; ++w) {
      words[w] = 0u;
      [[unroll]] for (uint j = 0u; j < 4u; ++j) {
        int c = zero ? 0 : q8_code(v[4u * w + j], scale);
        s += c;
        words[w] |= (uint(c) & 0xffu) << (8u * j);
      }
    }
  }
#ifdef QUANTIZE16
  q4[blk * 2u] = uvec4(words[0], words[1], words[2], words[3]);
  q4[blk * 2u + 1u] = uvec4(words[4], words[5], words[6], words[7]);
#else
  [[unroll]] for (uint w = 0u; w < 8u; ++w) q[blk * 8u + w] = words[w];
#endif
  dq[blk] = d;
  sq[blk] = s;
}
#endif

#ifdef QMM
// Thread -> output: workgroup w computes outputs [w*per_wg, (w+1)*per_wg) of out
// [pairs, n] (per_wg even, so f16/bf16 words are whole). Task (output, group) ->
// thread: each task forms its group's term s*P + b*X, blocks in order, with exact
// integer block dots; then thread i adds output i's terms in group order.
layout(std430, binding = 0) readonly buffer Q { uint q[]; };
layout(std430, binding = 1) readonly buffer D { float dq[]; };
layout(std430, binding = 2) readonly buffer S { int sq[]; };
layout(std430, binding = 3) readonly buffer Wt { uint codes[]; };
layout(std430, binding = 4) readonly buffer Sc { uint scales[]; };
layout(std430, binding = 5) readonly buffer Bi { uint biases[]; };
layout(std430, binding = 6) readonly buffer L { int lhs[]; };
layout(std430, binding = 7) readonly buffer R { int rhs[]; };
layout(std430, binding = 8) readonly buffer Ex { uint expert_info[]; };  // [E] bits, then [E] word offsets
layout(std430, binding = 9) writeonly buffer O { uint o[]; };
layout(std430, binding = 10) buffer Er { uint err[]; };
layout(push_constant) uniform Args { SB_QMM_ARGS } args;

const uint kThreads = 64u;
const uint kMaxTerms = 1024u;  // per_wg * groups (the host checks)
const uint kMaxPerWg = 64u;
shared float s_term[kMaxTerms];
shared float s_out[kMaxPerWg];

#define codes_word(i) codes[i]
SB_BLOCK_DOT(block_dot, codes_word, q)

// Group g's term of output e (0 on bad data, which raises an error bit).
float group_term(uint e, uint g) {
  uint p = e / args.n, n = e % args.n;
  int ex = args.has_rhs != 0u ? rhs[p] : 0;
  int r = args.has_lhs != 0u ? lhs[p] : int(p * args.rows / args.pairs);
  if (ex < 0 || uint(ex) >= args.experts || r < 0 || uint(r) >= args.rows) {
    atomicOr(err[0], SB_ERR_INDEX);
    return 0.0;
  }
  uint bits = expert_info[ex];
  if (bits == 0u) {
    atomicOr(err[0], SB_ERR_PRUNED);
    return 0.0;
  }
  if (g == 0u && n == 0u && args.sorted != 0u && p > 0u && rhs[p - 1u] > ex) atomicOr(err[0], SB_ERR_UNSORTED);
  uint row = expert_info[args.experts + uint(ex)] + n * (args.k * bits / 32u);
  uint blocks = args.k / 32u, per_group = args.group_size / 32u;
  uint xrow = uint(r) * blocks;
  precise float pg = 0.0, xg = 0.0;
  for (uint j = g * per_group; j < (g + 1u) * per_group; ++j) {
    int iq = block_dot(row + j * bits, bits, (xrow + j) * 8u);
    float d = dq[xrow + j];
    pg = pg + float(iq) * d;
    xg = xg + float(sq[xrow + j]) * d;
  }
  uint sidx = (uint(ex) * args.n + n) * args.groups + g;
  float sc = SB_LOAD(scales, args.scale_dtype, sidx);
  float bc = SB_LOAD(biases, args.scale_dtype, sidx);
  precise float term = sc * pg + bc * xg;
  return term;
}

void main() {
  uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  uint tid = gl_LocalInvocationID.x;
  uint count = args.pairs * args.n;
  uint e0 = wg * args.per_wg;
  if (e0 >= count) return;  // uniform over the workgroup
  uint tasks = args.per_wg * args.groups;
  for (uint t = tid; t < tasks; t += kThreads) {
    uint e = e0 + t / args.groups;
    s_term[t] = e < count ? group_term(e, t % args.groups) : 0.0;
  }
  barrier();
  if (tid < args.per_wg) {
    precise float acc = 0.0;
    for (uint g = 0u; g < args.groups; ++g) acc = acc + s_term[tid * args.groups + g];
    s_out[tid] = acc;
  }
  barrier();
  uint per = sb_per_word(args.out_dtype);
  uint words = args.per_wg / per;
  if (tid < words) {
    uint i = e0 + tid * per;
    if (i < count) {
      bool two = per == 2u && i + 1u < count;
      o[i / per] = sb_encode_word(s_out[tid * per], two ? s_out[tid * per + 1u] : 0.0, args.out_dtype);
    }
  }
}
#endif

#ifdef QMM_ROW
// Few-row GatherQmm (decode) in one dispatch: workgroup (pair p, tile t) quantizes
// its pair's row of x into shared memory (the QUANTIZE steps: same codes, d and
// sums), then computes outputs [t*per_wg, t*per_wg + per_wg) of pair p.
// Thread -> output: task (output o, group g) -> threads tid, tid + 256, ...; each
// forms group g's term s*P + b*X of output o, blocks in order; then thread o adds
// output o's terms in group order. QMM_ROW_GLU: the same for two projections of the
// same pairs (gate, then up: tasks [0, T) and [T, 2T)); thread o rounds both sums to
// the output dtype, as stored outputs would be, and writes their Glu.
#ifdef SB_ROW_AFTER  // x (h), rhs and the router's weights may be written while this runs
#define SB_HANDED coherent
#else
#define SB_HANDED
#endif
layout(std430, binding = 0) SB_HANDED readonly buffer X { uvec4 x4[]; };  // 16-byte aligned (the host checks)
layout(std430, binding = 1) readonly buffer Wt { uvec4 codes4[]; };  // 16-byte loads of 4-bit blocks
layout(std430, binding = 2) readonly buffer Sc { uint scales[]; };
layout(std430, binding = 3) readonly buffer Bi { uint biases[]; };
layout(std430, binding = 4) readonly buffer L { int lhs[]; };
#if defined(SB_ROW_WAIT) || defined(SB_ROW_AFTER)
layout(std430, binding = 5) coherent volatile readonly buffer R { int rhs[]; };  // polled while the router writes
#else
layout(std430, binding = 5) readonly buffer R { int rhs[]; };
#endif
layout(std430, binding = 6) readonly buffer Ex { uint expert_info[]; };  // [E] bits, then [E] word offsets
#ifdef QMM_ROW_COMBINE
// The down projection with combine_weights: y (binding 7) as GatherQmm stores it, then
// the workgroup that finishes a (token, tile) last - counted by an atomic after its
// stores are made visible - adds the token's slots as combine.comp does: out[t][c] =
// base + sum over slots j of w[t][j] * y[t*k + j][c] (stored products, slot order).
layout(std430, binding = 7) coherent buffer O { uint o[]; };
layout(std430, binding = 9) SB_HANDED readonly buffer Cw { float cweights[]; };
layout(std430, binding = 10) readonly buffer Cs { uint shared_x[]; };
layout(std430, binding = 11) readonly buffer Cg { uint gate[]; };
layout(std430, binding = 12) coherent buffer Cn { uint counters[]; };  // [token][tile], zero at start
layout(std430, binding = 13) writeonly buffer Co { uint cout_[]; };
#ifdef SB_ROW_AFTER
layout(std430, binding = 14) coherent volatile readonly buffer Dn { uint done[]; };  // per h row: its workgroups done
#endif
layout(push_constant) uniform Args { SB_QMM_COMBINE_ARGS } args;
const uint kProjections = 1u;
shared uint s_last;
#elif defined(SB_ROW_WAIT)  // h: read by qmm_row_combine_2k_dot4 as it is written
layout(std430, binding = 7) coherent writeonly buffer O { uint o[]; };
layout(std430, binding = 12) coherent buffer Dn { uint done[]; };  // per pair: its workgroups whose h is stored
#else
layout(std430, binding = 7) writeonly buffer O { uint o[]; };
#endif
layout(std430, binding = 8) buffer Er { uint err[]; };
#ifdef QMM_ROW_COMBINE
#elif defined(QMM_ROW_GLU)
layout(std430, binding = 9) readonly buffer Wu { uvec4 codes_up4[]; };
layout(std430, binding = 10) readonly buffer Su { uint scales_up[]; };
layout(std430, binding = 11) readonly buffer Bu { uint biases_up[]; };
layout(push_constant) uniform Args { SB_QMM_GLU_ARGS } args;
const uint kProjections = 2u;
#else
layout(push_constant) uniform Args { SB_QMM_ARGS } args;
const uint kProjections = 1u;
#endif

#ifdef SB_ROW_DOT4
// Specialization constants (Vulkan only, like these kernels): the host sets them to the
// dispatch's dtypes and Glu kind, so the driver builds only that path (H100 decode: half
// the machine code; gate/up 15.4 -> 14.9 us, down + combine 14.5 -> 12.5 us). ~0u: the
// push constant decides.
layout(constant_id = 0) const uint kSpecXDtype = 0xffffffffu;
layout(constant_id = 1) const uint kSpecOutDtype = 0xffffffffu;
layout(constant_id = 2) const uint kSpecScaleDtype = 0xffffffffu;
layout(constant_id = 3) const uint kSpecGluKind = 0xffffffffu;
#define SB_SPEC(C, ARG) (C != 0xffffffffu ? C : ARG)
#define X_DTYPE SB_SPEC(kSpecXDtype, args.x_dtype)
#define OUT_DTYPE SB_SPEC(kSpecOutDtype, args.out_dtype)
#define SCALE_DTYPE SB_SPEC(kSpecScaleDtype, args.scale_dtype)
#define GLU_KIND SB_SPEC(kSpecGluKind, args.glu_kind)
#else
#define X_DTYPE args.x_dtype
#define OUT_DTYPE args.out_dtype
#define SCALE_DTYPE args.scale_dtype
#define GLU_KIND args.glu_kind
#endif
const uint kThreads = 256u;
const uint kMaxTerms = SB_QMM_ROW_TERMS;  // projections * per_wg * groups (the host checks)
const uint kMaxPerWg = 256u;
const uint kBlocks = SB_ROW_STAGE_K / 32u;
shared uint s_q[SB_ROW_STAGE_K / 4u];
shared uint s_amax[kBlocks];
shared int s_sum[kBlocks];
shared float s_d[kBlocks];
shared float s_term[kMaxTerms];
shared float s_out[kMaxPerWg];

#define row_code(i) codes4[(i) >> 2u][(i)&3u]
#define row_code_up(i) codes_up4[(i) >> 2u][(i)&3u]

#ifdef SB_ROW_DOT4
// x's codes are staged in the permuted order 0, 2, 4, 6 | 1, 3, 5, 7 of each 8: a code
// word's even nibbles (masked) and odd nibbles (shifted, masked) are packed int8x4 that
// line up with its two staged words (codes 0..15 read the same as signed bytes).
int dot4_word(uint c, uint xa, uint xb) {
  return sb_sdot4x8(c & 0x0f0f0f0fu, xa, 0) + sb_sdot4x8((c >> 4u) & 0x0f0f0f0fu, xb, 0);
}
int dot4_block(uvec4 cw, uint qb) {
  int iq = 0;
  [[unroll]] for (uint w = 0u; w < 4u; ++w) iq += dot4_word(cw[w], s_q[qb + 2u * w], s_q[qb + 2u * w + 1u]);
  return iq;
}
#else
// 4-bit block at a multiple of 4 words: one 16-byte load against 8 staged activation words.
#define SB_STAGED_DOT4(NAME, CODES4)                                                                             \
  int NAME(uint base, uint qb) {                                                                                 \
    uvec4 cw = CODES4[base >> 2u];                                                                               \
    int iq = 0;                                                                                                  \
    [[unroll]] for (uint w = 0u; w < 4u; ++w) {                                                                  \
      int xa = int(s_q[qb + 2u * w]), xb = int(s_q[qb + 2u * w + 1u]);                                           \
      uint c = cw[w];                                                                                            \
      iq += int(c & 15u) * bitfieldExtract(xa, 0, 8) + int((c >> 4u) & 15u) * bitfieldExtract(xa, 8, 8) +        \
            int((c >> 8u) & 15u) * bitfieldExtract(xa, 16, 8) + int((c >> 12u) & 15u) * bitfieldExtract(xa, 24, 8) + \
            int((c >> 16u) & 15u) * bitfieldExtract(xb, 0, 8) + int((c >> 20u) & 15u) * bitfieldExtract(xb, 8, 8) +  \
            int((c >> 24u) & 15u) * bitfieldExtract(xb, 16, 8) + int(c >> 28u) * bitfieldExtract(xb, 24, 8);    \
    }                                                                                                            \
    return iq;                                                                                                   \
  }
#endif

#ifdef SB_ROW_DOT4
// Group g's term s*P + b*X of output column n0 + oi of expert ex (row words from wbase;
// every expert is 4-bit, so rows are whole 16-byte units: the host checks). Its blocks
// are loaded two at a time before either is used, so their memory latencies overlap
// (H100 decode gate/up/Glu 17.1 -> 15.8 us).
#define SB_ROW_TERM(NAME, CODES, SCALES, BIASES, DOT, DOT4)                                          \
  float NAME(uint ex, uint n0, uint oi, uint g, uint wbase, uint bits) {                             \
    uint per_group = args.group_size / 32u, end = (g + 1u) * per_group;                              \
    uint sidx = (ex * args.n + n0 + oi) * args.groups + g;                                           \
    float sc = SB_LOAD(SCALES, SCALE_DTYPE, sidx);                                                   \
    float bc = SB_LOAD(BIASES, SCALE_DTYPE, sidx);                                                   \
    uint row4 = (wbase + oi * (args.k / 8u)) >> 2u;                                                  \
    precise float pg = 0.0, xg = 0.0;                                                                \
    for (uint j = g * per_group; j < end; j += 2u) {                                                 \
      bool two = j + 1u < end;                                                                       \
      uvec4 c0 = CODES[row4 + j], c1 = two ? CODES[row4 + j + 1u] : uvec4(0u);                       \
      int iq0 = dot4_block(c0, j * 8u), iq1 = dot4_block(c1, j * 8u + 8u);                           \
      float d0 = s_d[j];                                                                             \
      pg = pg + float(iq0) * d0;                                                                     \
      xg = xg + float(s_sum[j]) * d0;                                                                \
      if (two) {                                                                                     \
        float d1 = s_d[j + 1u];                                                                      \
        pg = pg + float(iq1) * d1;                                                                   \
        xg = xg + float(s_sum[j + 1u]) * d1;                                                         \
      }                                                                                              \
    }                                                                                                \
    precise float term = sc * pg + bc * xg;                                                          \
    return term;                                                                                     \
  }
#else
// Group g's term s*P + b*X of output column n0 + oi of expert ex (row words from wbase).
#define SB_ROW_TERM(NAME, CODES, SCALES, BIASES, DOT, DOT4)                                          \
  float NAME(uint ex, uint n0, uint oi, uint g, uint wbase, uint bits) {                             \
    uint row_words = args.k * bits / 32u, per_group = args.group_size / 32u;                         \
    uint sidx = (ex * args.n + n0 + oi) * args.groups + g;                                           \
    float sc = SB_LOAD(SCALES, SCALE_DTYPE, sidx);                                                   \
    float bc = SB_LOAD(BIASES, SCALE_DTYPE, sidx);                                                   \
    uint row = wbase + oi * row_words;                                                               \
    bool v16 = bits == 4u && (wbase & 3u) == 0u; /* rows are whole 16-byte units */                    \
    precise float pg = 0.0, xg = 0.0;                                                                \
    for (uint j = g * per_group; j < (g + 1u) * per_group; ++j) {                                    \
      int iq = v16 ? DOT4(row + j * 4u, j * 8u) : DOT(row + j * bits, bits, j * 8u);                 \
      float d = s_d[j];                                                                              \
      pg = pg + float(iq) * d;                                                                       \
      xg = xg + float(s_sum[j]) * d;                                                                 \
    }                                                                                                \
    precise float term = sc * pg + bc * xg;                                                          \
    return term;                                                                                     \
  }
#endif

#ifndef SB_ROW_DOT4  // the dot4 SB_ROW_TERM loads and dots its blocks itself
SB_BLOCK_DOT(staged_dot, row_code, s_q)
SB_STAGED_DOT4(staged_dot4, codes4)
#ifdef QMM_ROW_GLU
SB_BLOCK_DOT(staged_dot_up, row_code_up, s_q)
SB_STAGED_DOT4(staged_dot4_up, codes_up4)
#endif
#endif
SB_ROW_TERM(row_term, codes4, scales, biases, staged_dot, staged_dot4)
#ifdef QMM_ROW_GLU
SB_ROW_TERM(row_term_up, codes_up4, scales_up, biases_up, staged_dot_up, staged_dot4_up)
#endif

// The sum of output oi's group terms from s_term[first ...], in group order.
float row_sum(uint first) {
  precise float acc = 0.0;
  for (uint g = 0u; g < args.groups; ++g) acc = acc + s_term[first + g];
  return acc;
}

// Where element i of an 8-element unit goes among its two staged code words.
#ifdef SB_ROW_DOT4
uint q8_word(uint i) { return i & 1u; }  // 0, 2, 4, 6 | 1, 3, 5, 7
uint q8_shift(uint i) { return 8u * (i >> 1u); }
#else
uint q8_word(uint i) { return i >> 2u; }
uint q8_shift(uint i) { return 8u * (i & 3u); }
#endif

// Elements [e, e + 8) of x (e a multiple of 8) from one 16-byte load (f16, bf16) or two
// (f32): every workgroup of a decode projection reads the same row, and element-wise
// loads made that row's staging ~4 us of the H100 dispatch.
void load_unit(uint e, out float v[8]) {
  if (sb_is16(X_DTYPE)) {
    uvec4 w = x4[e >> 3u];
    [[unroll]] for (uint i = 0u; i < 8u; ++i) v[i] = sb_decode(w[i >> 1u], X_DTYPE, i);
  } else {
    uvec4 a = x4[e >> 2u], b = x4[(e >> 2u) + 1u];
    [[unroll]] for (uint i = 0u; i < 4u; ++i) {
      v[i] = uintBitsToFloat(a[i]);
      v[i + 4u] = uintBitsToFloat(b[i]);
    }
  }
}

// Row r of x -> s_q (int8 codes), s_d, s_sum: unit u = elements [8u, 8u + 8) of block u / 4.
#ifdef QMM_ROW_2K
// K <= 2048: at most one unit per thread, its 8 values loaded once (before the first
// barrier) and kept in registers for both passes.
void stage_row(uint r, uint tid) {
  uint blocks = args.k / 32u, units = args.k / 8u, xbase = r * args.k, u = min(tid, units - 1u);
  float v[8];
  load_unit(xbase + u * 8u, v);
  if (tid < blocks) {
    s_amax[tid] = 0u;
    s_sum[tid] = 0;
  }
  barrier();
  if (tid < units) {
    uint m = 0u;
    [[unroll]] for (uint i = 0u; i < 8u; ++i) m = max(m, floatBitsToUint(v[i]) & 0x7fffffffu);
    atomicMax(s_amax[u >> 2u], m);
  }
  barrier();
  if (tid < units) {
    float scale, d;
    bool zero;
    q8_params(s_amax[u >> 2u], scale, d, zero);
    uint w0 = 0u, w1 = 0u;
    int s = 0;
    if (!zero) {
      [[unroll]] for (uint i = 0u; i < 8u; ++i) {
        int c = q8_code(v[i], scale);
        s += c;
        if (q8_word(i) == 0u) w0 |= (uint(c) & 0xffu) << q8_shift(i);
        else w1 |= (uint(c) & 0xffu) << q8_shift(i);
      }
    }
    s_q[2u * u] = w0;
    s_q[2u * u + 1u] = w1;
    if (s != 0) atomicAdd(s_sum[u >> 2u], s);
    if ((u & 3u) == 0u) s_d[u >> 2u] = d;
  }
  barrier();
}
#else
void stage_row(uint r, uint tid) {
  uint blocks = args.k / 32u, units = args.k / 8u, xbase = r * args.k;
  for (uint b = tid; b < blocks; b += kThreads) {
    s_amax[b] = 0u;
    s_sum[b] = 0;
  }
  barrier();
  for (uint u = tid; u < units; u += kThreads) {
    float v[8];
    load_unit(xbase + u * 8u, v);
    uint m = 0u;
    [[unroll]] for (uint i = 0u; i < 8u; ++i) m = max(m, floatBitsToUint(v[i]) & 0x7fffffffu);
    atomicMax(s_amax[u >> 2u], m);
  }
  barrier();
  for (uint u = tid; u < units; u += kThreads) {
    float scale, d;
    bool zero;
    q8_params(s_amax[u >> 2u], scale, d, zero);
    float v[8];
    load_unit(xbase + u * 8u, v);
    uint w[2] = uint[2](0u, 0u);
    int s = 0;
    [[unroll]] for (uint i = 0u; i < 8u; ++i) {
      int c = zero ? 0 : q8_code(v[i], scale);
      s += c;
      w[q8_word(i)] |= (uint(c) & 0xffu) << q8_shift(i);
    }
    s_q[2u * u] = w[0];
    s_q[2u * u + 1u] = w[1];
    if (s != 0) atomicAdd(s_sum[u >> 2u], s);
    if ((u & 3u) == 0u) s_d[u >> 2u] = d;
  }
  barrier();
}
#endif

#ifdef QMM_ROW_COMBINE
// Counts this workgroup's stored y (pair p, outputs [n0, n0 + cnt)) into its token's
// tile; the last of the token's slots combines the tile's outputs (thread -> word).
void combine_tile(uint p, uint tile, uint n0, uint cnt) {
  uint tid = gl_LocalInvocationID.x;
  memoryBarrierBuffer();  // this invocation's y stores before the count
  barrier();
  uint token = p / args.slots;
  if (tid == 0u) s_last = atomicAdd(counters[token * args.tiles + tile], 1u) + 1u == args.slots ? 1u : 0u;
  barrier();
  if (s_last == 0u) return;  // uniform
  memoryBarrierBuffer();  // the other slots' y, counted before ours, are visible now
  uint per = sb_per_word(OUT_DTYPE);
  float sg = args.has_gate != 0u ? sb_sigmoid(SB_LOAD(gate, args.gate_dtype, token)) : 1.0;
  for (uint w = tid; w * per < cnt; w += kThreads) {
    float r2[2] = float[2](0.0, 0.0);
    for (uint h = 0u; h < per && w * per + h < cnt; ++h) {
      uint c = n0 + w * per + h;
      precise float acc = 0.0;
      if (args.has_shared != 0u) {
        float sv = SB_LOAD(shared_x, args.shared_dtype, token * args.n + c);
        precise float gs = sg * sv;
        acc = args.has_gate != 0u ? gs : sv;
      }
      // Eight slots' loads issued before any is used: one L2 round trip instead of eight
      // (H100 decode layer: see bench/RESULTS.md, eleventh session).
      for (uint j0 = 0u; j0 < args.slots; j0 += 8u) {
        float wv[8], yv[8];
        [[unroll]] for (uint d = 0u; d < 8u; ++d) {
          uint q = token * args.slots + min(j0 + d, args.slots - 1u);
          wv[d] = cweights[q];
          yv[d] = SB_LOAD(o, OUT_DTYPE, q * args.n + c);
        }
        [[unroll]] for (uint d = 0u; d < 8u; ++d)
          if (j0 + d < args.slots) acc = acc + wv[d] * yv[d];
      }
      r2[h] = acc;
    }
    cout_[(token * args.n + n0) / per + w] = sb_encode_word(r2[0], r2[1], OUT_DTYPE);
  }
}
#endif

#ifdef SB_ROW_WAIT
// rhs[p] once the dispatch before (the router, recorded without a barrier after it) has
// replaced its -1: thread 0 polls it (coherent, volatile loads: 0.4 us faster on the H100
// than atomics), bounded, and hands it to the workgroup. The router's workgroups were
// dispatched first and need no slot these hold, so they finish. Gives up with
// SB_ERR_HANDOFF (the value stays -1: a bad index).
shared int s_rhs;
int wait_for_rhs(uint p) {
  if (gl_LocalInvocationID.x == 0u) {
    int v = rhs[p];
    for (uint n = 0u; v < 0 && n < (1u << 22); ++n) v = rhs[p];
    if (v < 0) atomicOr(err[0], SB_ERR_HANDOFF);
    s_rhs = v;
  }
  barrier();
  return s_rhs;
}
#endif
#ifdef SB_ROW_AFTER
// Row r of x (h) once its args.wait_tiles gate/up workgroups have stored it and counted
// (qmm_row_glu_2k_dot4 recorded just before, no barrier between): thread 0 polls, bounded
// (SB_ERR_HANDOFF), then every invocation's later loads see what the count covers.
void wait_for_row(uint r) {
  if (gl_LocalInvocationID.x == 0u) {
    uint n = 0u;
    while (done[r] < args.wait_tiles && n < (1u << 22)) ++n;
    if (n == (1u << 22)) atomicOr(err[0], SB_ERR_HANDOFF);
  }
  barrier();
  memoryBarrierBuffer();
}
#endif

void main() {
  uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  uint tid = gl_LocalInvocationID.x;
  if (wg >= args.pairs * args.tiles) return;  // uniform over the workgroup
  uint p = wg / args.tiles, n0 = (wg % args.tiles) * args.per_wg;
  uint cnt = min(args.per_wg, args.n - n0);
  int r = args.has_lhs != 0u ? lhs[p] : int(p * args.rows / args.pairs);
#ifdef SB_ROW_WAIT
  // x's row does not depend on the router: staged while it still runs (H100 decode:
  // see bench/RESULTS.md, eleventh session).
  bool staged = args.wait_rhs != 0u && r >= 0 && uint(r) < args.rows;  // uniform
  if (staged) stage_row(uint(r), tid);
  int ex = 0;
  if (args.has_rhs != 0u) ex = args.wait_rhs != 0u ? wait_for_rhs(p) : rhs[p];  // uniform
#else
#ifdef SB_ROW_AFTER
  if (args.wait_tiles != 0u && r >= 0 && uint(r) < args.rows) wait_for_row(uint(r));  // uniform
#endif
  int ex = args.has_rhs != 0u ? rhs[p] : 0;
#endif
  bool bad = ex < 0 || uint(ex) >= args.experts || r < 0 || uint(r) >= args.rows;
#ifdef SB_ROW_DOT4
  // Every expert is 4-bit (the host checks): where its codes start needs no table lookup,
  // one dependent load less before the weights are read (H100 decode layer: -1.2 us).
  uint bits = bad ? 0u : 4u;
  uint wbase = (uint(max(ex, 0)) * args.n + n0) * (args.k / 8u);
#else
  uint bits = bad ? 0u : expert_info[ex];
#endif
  if (bits == 0u) {  // uniform: one pair per workgroup
    if (tid == 0u) atomicOr(err[0], bad ? SB_ERR_INDEX : SB_ERR_PRUNED);
#ifdef SB_ROW_WAIT
    if (tid == 0u && args.wait_rhs != 0u) atomicAdd(done[p], 1u);  // counted: the down kernel must not wait on it
#endif
    return;
  }
  if (tid == 0u && n0 == 0u && args.sorted != 0u && p > 0u && rhs[p - 1u] > ex) atomicOr(err[0], SB_ERR_UNSORTED);
#ifndef SB_ROW_DOT4
  uint wbase = expert_info[args.experts + uint(ex)] + n0 * (args.k * bits / 32u);
#endif
  uint tasks = cnt * args.groups;
#ifdef SB_ROW_WAIT
  if (!staged) stage_row(uint(r), tid);
#else
  stage_row(uint(r), tid);
#endif

  for (uint t = tid; t < kProjections * tasks; t += kThreads) {
    uint tt = t < tasks ? t : t - tasks;
    uint oi = tt / args.groups, g = tt - oi * args.groups;
#ifdef QMM_ROW_GLU
    s_term[t] = t < tasks ? row_term(uint(ex), n0, oi, g, wbase, bits) : row_term_up(uint(ex), n0, oi, g, wbase, bits);
#else
    s_term[t] = row_term(uint(ex), n0, oi, g, wbase, bits);
#endif
  }
  barrier();
  if (tid < cnt) {
#ifdef QMM_ROW_GLU
    float gv = sb_round_to(row_sum(tid * args.groups), OUT_DTYPE);
    float uv = sb_round_to(row_sum(tasks + tid * args.groups), OUT_DTYPE);
    s_out[tid] = sb_glu(gv, uv, GLU_KIND, args.glu_alpha, args.glu_limit);
#else
    s_out[tid] = row_sum(tid * args.groups);
#endif
  }
  barrier();
  uint per = sb_per_word(OUT_DTYPE);
  uint e0 = p * args.n + n0;  // even when per == 2 (the host checks n and per_wg)
  if (tid * per < cnt) {
    uint i = tid * per;
    bool two = per == 2u && i + 1u < cnt;
    o[(e0 + i) / per] = sb_encode_word(s_out[i], two ? s_out[i + 1u] : 0.0, OUT_DTYPE);
  }
#ifdef QMM_ROW_COMBINE
  combine_tile(p, wg % args.tiles, n0, cnt);
#endif
#ifdef SB_ROW_WAIT
  if (args.wait_rhs != 0u) {  // this workgroup's h stored: count it for the down projection
    memoryBarrierBuffer();
    barrier();
    if (tid == 0u) atomicAdd(done[p], 1u);
  }
#endif
}
#endif

#ifdef QMM_TILES
// The work list of QMM_TILE for pairs sorted by expert (or all of expert 0, without
// rhs): one entry (first pair, pair count, expert) per run of up to SB_QMM_TILE_PAIRS
// pairs of one expert, after the count in word 0. One workgroup; thread -> experts
// tid, tid + 256, ...: the runs' ends come from where the sorted experts change (one
// pass over the pairs per 256 experts); thread 0 lays the tiles out in expert order.
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
  if (tid == 0u && args.has_rhs == 0u && args.pairs > 0u && expert_info[0] == 0u) atomicOr(err[0], SB_ERR_PRUNED);
  uint max_tiles = args.tiles, total = 0u;
  for (uint e0 = 0u; e0 < args.experts; e0 += 256u) {
    s_lo[tid] = 0u;
    s_hi[tid] = 0u;
    barrier();
    if (args.has_rhs == 0u) {  // every pair is expert 0's
      if (e0 == 0u && tid == 0u) s_hi[0] = args.pairs;
    }
    // Each run's ends are where the expert changes: no search. On unsorted input (an
    // error) the runs are wrong but stay inside the pairs. Pairs go 8 at a time, their
    // loads issued together (one at a time, the dependent loads' latency dominated).
    for (uint p0 = tid; args.has_rhs != 0u && p0 < args.pairs; p0 += 8u * 256u) {
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
    if (e < args.experts && expert_info[e] != 0u && hi > lo) n = (hi - lo + SB_QMM_TILE_PAIRS - 1u) / SB_QMM_TILE_PAIRS;
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
      uint first = lo + t * SB_QMM_TILE_PAIRS;
      tiles[1u + 3u * slot] = first;
      tiles[2u + 3u * slot] = min(SB_QMM_TILE_PAIRS, hi - first);
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
  if (tile >= tiles[0]) return;  // uniform over the workgroup
  uint first = tiles[1u + 3u * tile], count = tiles[2u + 3u * tile], ex = tiles[3u + 3u * tile];
  uint bits = expert_info[ex], row_words = args.k * bits / 32u;
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

#ifdef QMM_MMA
// QMM_TILE's work on int8 tensor cores (Vulkan with VK_NV_cooperative_matrix only; the
// host falls back to QMM_TILE elsewhere): the same tiles and workgroup grid, 32 pairs x
// 64 columns per workgroup, chunks of 64 K values. Per 32-block, subgroup w multiplies
// rows 16 (w % 2) + [0, 16) of Q8 codes by columns 16 (w / 2) + [0, 16) of weight codes
// (a 16x16x32 integer MMA) into exact int32 block dots Iq, and each invocation runs the
// float steps of docs/numerics.md (block and group order) on the Iq it holds.
// Thread -> output (lane l of subgroup w): element e of the accumulator is row
// 16 (w % 2) + l / 4 + 8 (e / 4), column 16 (w / 2) + 8 ((e / 2) % 2) + 2 (l % 4) + e % 2 —
// NVIDIA's fragment layout, which the device's start-up probe (QMM_MMA_PROBE) confirms
// before this kernel is used.
// 8-bit codes q are stored as q - 128 (int8) and their block dot gets 128 * Sx back.
layout(std430, binding = 0) readonly buffer Q { uvec2 q2[]; };  // 8 words per block
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
// reads them). Thread -> block word after the MMAs: pair tid / 8, code word tid % 8.
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

const uint kTp = SB_QMM_TILE_PAIRS, kTn = 64u;
const uint kAb = 20u;   // words per shared row of 64 int8 codes: 16 + 4 of padding (bank spread)
#ifdef SB_MMA_GLU
// s_a and s_b in one array: after the MMAs it holds the rounded gate and up results,
// [pair][64] (the NVIDIA driver fits fewer workgroups per SM with more shared memory).
shared uint s_ab[2048];
#define s_a s_ab
#define s_b s_ab
const uint kA0 = 0u, kB0 = kTp * kAb;
#else
shared uint s_a[kTp * kAb];        // Q8 codes, row-major [pair][k]
shared uint s_b[kTn * kAb];        // weight codes, [column][k]: B (k x n) column-major
const uint kA0 = 0u, kB0 = 0u;
#endif
shared float s_d[2u * 2u * kTp];   // [chunk parity][block][pair]
shared int s_sx[2u * 2u * kTp];
shared float s_scale[2u * 2u * kTn];  // [chunk parity][block][column]: the block's group's s
shared float s_bias[2u * 2u * kTn];
shared int s_row[kTp];
#ifndef SB_MMA_BITS4  // (declared but unused, it would still take shared memory: fewer workgroups per SM)
shared uint s_raw[128u * 8u];  // each thread's weight words, for the widths other than 4 and 8
#endif

// A block's 32 codes of `bits` bits, from words w[0..bits), as 8 words of int8 at
// s_b[dst]. Register arrays take constant indices only (a dynamically indexed one
// lives in local memory on NVIDIA); the rare widths go through shared memory, in a
// loop kept rolled (the unrolled one doubled the binary and cost 12% in icache misses).
void stage_block(uint bits, uint w[8], uint dst) {
#ifdef SB_MMA_BITS4
  // The K order inside each 8-code word is permuted to 0, 2, 4, 6, 1, 3, 5, 7 on both
  // sides (quantize_q8 wrote x so): an exact integer dot does not depend on the order.
  [[unroll]] for (uint i = 0u; i < 4u; ++i) {
    s_b[dst + 2u * i] = w[i] & 0x0f0f0f0fu;
    s_b[dst + 2u * i + 1u] = (w[i] >> 4u) & 0x0f0f0f0fu;
  }
#else
  if (bits == 4u) {
    [[unroll]] for (uint i = 0u; i < 4u; ++i) {
      uint a = w[i] & 0x0f0f0f0fu, c = (w[i] >> 4u) & 0x0f0f0f0fu;  // codes 0,2,4,6 and 1,3,5,7
      s_b[dst + 2u * i] = (a & 0xffu) | ((c & 0xffu) << 8u) | ((a & 0xff00u) << 8u) | ((c & 0xff00u) << 16u);
      s_b[dst + 2u * i + 1u] = ((a >> 16u) & 0xffu) | ((c >> 8u) & 0xff00u) | ((a >> 8u) & 0xff0000u) | (c & 0xff000000u);
    }
    return;
  }
  if (bits == 8u) {
    [[unroll]] for (uint i = 0u; i < 8u; ++i) s_b[dst + i] = w[i] ^ 0x80808080u;  // q - 128 as int8
    return;
  }
  uint raw = gl_LocalInvocationID.x * 8u;
  [[unroll]] for (uint i = 0u; i < 8u; ++i) s_raw[raw + i] = w[i];
  [[dont_unroll]] for (uint o = 0u; o < 8u; ++o) {
    uint word = 0u;
    for (uint k = 0u; k < 4u; ++k) {
      uint bit = (4u * o + k) * bits, sh = bit & 31u, wi = bit >> 5u;
      uint v = s_raw[raw + wi] >> sh;
      if (sh + bits > 32u) v |= s_raw[raw + wi + 1u] << (32u - sh);
      word |= (v & ((1u << bits) - 1u)) << (8u * k);
    }
    s_b[dst + o] = word;
  }
#endif
}

// Where this thread's loads of chunk 0 start (mma_load); chunk j0 adds j0 blocks.
struct MmaBases {
  int xrow;    // Q8 row of pair tid / 8 (-1: none)
  int drow;    // Q8 row of pair tid / 2 for d and the code sum (-1: none, or tid >= 64)
  uint w;      // first word of column tid / 2's block tid % 2
  bool wlive;  // tid < 128 and the column inside n
  uint s;      // scale index of column tid % 64, group 0
  bool wup;    // SB_MMA_GLU: the weight words, and the scales, are the up projection's
  bool sup;
};

// This thread's global words of chunk j0 (blocks j0, j0 + 1) into registers: 2 words
// of Q8 codes (pair tid / 8, words 2 (tid % 8) + [0, 2) of the chunk), d and code sum
// (threads < 64: pair tid / 2, block tid % 2); threads < 128: one column block's weight
// words (column tid / 2, block tid % 2) and the scale and bias of column tid % 64 in
// block j0 + tid / 64's group (group_size is a power of two: a shift).
void mma_load(uint j0, uint blocks, uint bits, uint gshift, MmaBases b, out uint xa[2], out uint ds[2], out uint w[8],
              out float sb[2]) {
  uint tid = gl_LocalInvocationID.x;
  {
    uint j = j0 + ((tid & 7u) >> 2u);
    uvec2 v = b.xrow >= 0 && j < blocks ? q2[(uint(b.xrow) * blocks + j) * 4u + (tid & 3u)] : uvec2(0u);
    xa[0] = v.x;
    xa[1] = v.y;
  }
  ds[0] = ds[1] = 0u;
  uint jd = j0 + (tid & 1u);
  if (b.drow >= 0 && jd < blocks) {
    ds[0] = floatBitsToUint(dq[uint(b.drow) * blocks + jd]);
    ds[1] = uint(sq[uint(b.drow) * blocks + jd]);
  }
  bool live = b.wlive && jd < blocks;
  uint base = b.w + j0 * bits;
  if (bits == 4u && (base & 3u) == 0u) {  // the common case: one 16-byte load
#ifdef SB_MMA_GLU
    uvec4 v = live ? (b.wup ? codes_up4[base >> 2u] : codes4[base >> 2u]) : uvec4(0u);
#else
    uvec4 v = live ? codes4[base >> 2u] : uvec4(0u);
#endif
    w[0] = v.x;
    w[1] = v.y;
    w[2] = v.z;
    w[3] = v.w;
    w[4] = w[5] = w[6] = w[7] = 0u;
  } else {
#ifdef SB_MMA_GLU
    [[unroll]] for (uint i = 0u; i < 8u; ++i)
      w[i] = live && i < bits ? (b.wup ? codes_up[base + i] : codes[base + i]) : 0u;
#else
    [[unroll]] for (uint i = 0u; i < 8u; ++i) w[i] = live && i < bits ? codes[base + i] : 0u;
#endif
  }
  uint sidx = b.s + (min(j0 + ((tid >> 6u) & 1u), blocks - 1u) >> gshift);
#ifdef SB_MMA_GLU
  if (b.sup) {
    sb[0] = SB_LOAD(up_scales, args.scale_dtype, sidx);
    sb[1] = SB_LOAD(up_biases, args.scale_dtype, sidx);
    return;
  }
#endif
  sb[0] = SB_LOAD(scales, args.scale_dtype, sidx);
  sb[1] = SB_LOAD(biases, args.scale_dtype, sidx);
}

#ifdef SB_MMA_GLU
// The gate and up results rounded into s_ab (free after the MMAs' last barrier); then
// h = Glu (rounded) and its Q8 block for each pair of the tile: pair tid / 8 owns the
// block, thread tid % 8 its code word i (h columns 8 (i / 2) + 2 j + i % 2, j < 4:
// qmm_mma4's K order); the block's amax and code sum by shared atomics on s_sx (free
// too; integers: any order).
void glu_q8_epilogue(float acc[8], uint r0, uint c0, uint first, uint count, uint n0) {
  uint tid = gl_LocalInvocationID.x;
  if (tid < 2u * kTp) s_sx[tid] = 0;  // [0, 32): amax bits per pair, [32, 64): code sums
  [[unroll]] for (uint e = 0u; e < 8u; ++e)
    s_ab[(r0 + 8u * (e >> 2u)) * 64u + c0 + 8u * ((e >> 1u) & 1u) + (e & 1u)] = floatBitsToUint(sb_round_to(acc[e], args.out_dtype));
  barrier();
  uint r = tid >> 3u, i = tid & 7u;
  float hv[4];
  uint amax = 0u;
  [[unroll]] for (uint j = 0u; j < 4u; ++j) {
    uint c = 8u * (i >> 1u) + 2u * j + (i & 1u);
    float g = uintBitsToFloat(s_ab[r * 64u + c]), u = uintBitsToFloat(s_ab[r * 64u + 32u + c]);
    hv[j] = sb_round_to(sb_glu(g, u, args.glu_kind, args.glu_alpha, args.glu_limit), args.out_dtype);
    amax = max(amax, floatBitsToUint(hv[j]) & 0x7fffffffu);
  }
  atomicMax(s_sx[r], int(amax));  // amax <= 0x7fffffff: an int keeps its order
  barrier();
  amax = uint(s_sx[r]);
  float scale, d;
  bool zero;
  q8_params(amax, scale, d, zero);
  uint word = 0u;
  int part = 0;
  [[unroll]] for (uint j = 0u; j < 4u; ++j) {
    int code = zero ? 0 : q8_code(hv[j], scale);
    part += code;
    word |= (uint(code) & 0xffu) << (8u * j);
  }
  atomicAdd(s_sx[kTp + r], part);
  barrier();
  int sum = s_sx[kTp + r];
  if (r >= count) return;
  uint blocks = args.n / 32u, at = (first + r) * blocks + n0 / 32u;
  o[at * 8u + i] = word;
  if (i == 0u) {
    hd[at] = d;
    hs[at] = sum;
  }
}
#endif

void main() {
  uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  uint tid = gl_LocalInvocationID.x, warp = tid >> 5u, cp = tid & 31u;
  uint tile = wg / args.tiles, n0 = (wg % args.tiles) * MMA_COLS;
  if (tile >= tiles[0]) return;  // uniform over the workgroup
  uint first = tiles[1u + 3u * tile], count = tiles[2u + 3u * tile], ex = tiles[3u + 3u * tile];
#ifdef SB_MMA_BITS4  // every expert 4-bit (the host checks): the other widths' code compiled out
  const uint bits = 4u;
#else
  uint bits = expert_info[ex];
#endif
  uint row_words = args.k * bits / 32u;
  uint wbase = expert_info[args.experts + ex];
  uint blocks = args.k / 32u, per_group = args.group_size / 32u;
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
  precise float acc[8], pg[8], xg[2];
  [[unroll]] for (uint i = 0u; i < 8u; ++i) acc[i] = pg[i] = 0.0;
  xg[0] = xg[1] = 0.0;
  barrier();
  MmaBases mb;
  {
    uint c = (tid >> 1u) & 63u, sc = tid & 63u;
    mb.xrow = s_row[tid >> 3u];
    mb.drow = tid < 2u * kTp ? s_row[(tid >> 1u) & (kTp - 1u)] : -1;
#ifdef SB_MMA_GLU  // tile columns 32..63 are the up projection's columns 0..31
    mb.wup = c >= 32u;
    mb.sup = sc >= 32u;
    c &= 31u;
    sc &= 31u;
#else
    mb.wup = mb.sup = false;
#endif
    mb.w = wbase + (n0 + c) * row_words + (tid & 1u) * bits;
    mb.wlive = tid < 128u && n0 + c < args.n;
    mb.s = (ex * args.n + min(n0 + sc, args.n - 1u)) * args.groups;
  }
  uint gshift = uint(findLSB(per_group));
  uint xa[2], ds[2], w[8];
  float sb[2];
  mma_load(0u, blocks, bits, gshift, mb, xa, ds, w, sb);
  uint mr = 16u * (warp & 1u), mc = 16u * (warp >> 1u);
  for (uint j0 = 0u, parity = 0u; j0 < blocks; j0 += 2u, parity ^= 1u) {
    s_a[kA0 + (tid >> 3u) * kAb + 2u * (tid & 7u)] = xa[0];
    s_a[kA0 + (tid >> 3u) * kAb + 2u * (tid & 7u) + 1u] = xa[1];
    if (tid < 2u * kTp) {
      uint at = (parity * 2u + (tid & 1u)) * kTp + (tid >> 1u);
      s_d[at] = uintBitsToFloat(ds[0]);
#ifdef SB_MMA_BITS4  // only the X term float(Sx) d is needed: made once per (pair, block), kept as bits
      precise float xd = float(int(ds[1])) * uintBitsToFloat(ds[0]);
      s_sx[at] = floatBitsToInt(xd);
#else
      s_sx[at] = int(ds[1]);
#endif
    }
    if (tid < 128u) {
      s_scale[parity * 2u * kTn + tid] = sb[0];
      s_bias[parity * 2u * kTn + tid] = sb[1];
      stage_block(bits, w, kB0 + (tid >> 1u) * kAb + 8u * (tid & 1u));
    }
    barrier();
    if (j0 + 2u < blocks) mma_load(j0 + 2u, blocks, bits, gshift, mb, xa, ds, w, sb);
    [[unroll]] for (uint jb = 0u; jb < 2u; ++jb) {
      uint j = j0 + jb;
      if (j >= blocks) break;  // uniform: the cooperative-matrix ops stay in uniform control flow
      icoopmatNV<8, 3, 16, 32> ma;
      coopMatLoadNV(ma, s_a, kA0 + mr * kAb + 8u * jb, kAb, false);
      icoopmatNV<8, 3, 32, 16> mw;
      coopMatLoadNV(mw, s_b, kB0 + mc * kAb + 8u * jb, kAb, true);
      icoopmatNV<32, 3, 16, 16> md = icoopmatNV<32, 3, 16, 16>(0);
      md = coopMatMulAddNV(ma, mw, md);
      uint at = (parity * 2u + jb) * kTp;
      float d[2] = float[2](s_d[at + r0], s_d[at + r0 + 8u]);
#ifdef SB_MMA_BITS4
      const int sx[2] = int[2](0, 0);  // (8-bit codes only)
      float xd[2] = float[2](intBitsToFloat(s_sx[at + r0]), intBitsToFloat(s_sx[at + r0 + 8u]));
#else
      int sx[2] = int[2](s_sx[at + r0], s_sx[at + r0 + 8u]);
      precise float xd[2] = float[2](float(sx[0]) * d[0], float(sx[1]) * d[1]);
#endif
      // A group's first block assigns P and X instead of adding to 0: the same bits,
      // since float(Iq) d and float(Sx) d are never -0 (d >= 0 or NaN, and Iq = 0 if d = 0).
      if ((j & (per_group - 1u)) == 0u) {  // uniform
        xg[0] = xd[0];
        xg[1] = xd[1];
        [[unroll]] for (uint e = 0u; e < 8u; ++e) {
          int iq = md[e] + (bits == 8u ? 128 * sx[e >> 2u] : 0);
          pg[e] = float(iq) * d[e >> 2u];
        }
      } else {
        xg[0] = xg[0] + xd[0];
        xg[1] = xg[1] + xd[1];
        [[unroll]] for (uint e = 0u; e < 8u; ++e) {
          int iq = md[e] + (bits == 8u ? 128 * sx[e >> 2u] : 0);
          pg[e] = pg[e] + float(iq) * d[e >> 2u];
        }
      }
      if (((j + 1u) & (per_group - 1u)) == 0u) {  // a group ends: acc += s*P + b*X per output
        // Columns c0 + {0, 1, 8, 9} (past n, for odd f32 widths: column n - 1's scales,
        // not stored); element e has column c0 + 8 ((e / 2) % 2) + e % 2.
        uint sat = (parity * 2u + jb) * kTn + c0;
        float sc[4] = float[4](s_scale[sat], s_scale[sat + 1u], s_scale[sat + 8u], s_scale[sat + 9u]);
        float bc[4] = float[4](s_bias[sat], s_bias[sat + 1u], s_bias[sat + 8u], s_bias[sat + 9u]);
        [[unroll]] for (uint e = 0u; e < 8u; ++e) {
          uint h = e >> 2u, c = (e & 1u) + 2u * ((e >> 1u) & 1u);
          precise float t = sc[c] * pg[e] + bc[c] * xg[h];
          acc[e] = acc[e] + t;
        }
      }
    }
    barrier();
  }
#ifdef SB_MMA_GLU
  glu_q8_epilogue(acc, r0, c0, first, count, n0);
#else
  [[unroll]] for (uint e = 0u; e < 8u; e += 2u) {  // elements e, e + 1: columns n, n + 1 of one row
    uint pl = r0 + 8u * (e >> 2u), n = n0 + c0 + 8u * ((e >> 1u) & 1u);
    uint at = (first + pl) * args.n + n;
    if (pl < count && n < args.n) {
      if (sb_per_word(args.out_dtype) == 2u) {
        o[at >> 1u] = sb_encode_word(acc[e], acc[e + 1u], args.out_dtype);
      } else {
        o[at] = floatBitsToUint(acc[e]);
        if (n + 1u < args.n) o[at + 1u] = floatBitsToUint(acc[e + 1u]);
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
