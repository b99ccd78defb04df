// Kernel variants of this file, one line each (metal_shaders/README.md, "Variants"):
// SB_KERNEL(qmm_row, QMM_ROW, "rrrrrrrwb", QmmArgs, SB_QMM_ARGS, 256, 0)
// SB_KERNEL(qmm_row_2k, QMM_ROW_2K, "rrrrrrrwb", QmmArgs, SB_QMM_ARGS, 256, 0)
// SB_KERNEL(qmm_row_glu, QMM_ROW_GLU, "rrrrrrrwbrrr", QmmGluArgs, SB_QMM_GLU_ARGS, 256, 0)
// SB_KERNEL(qmm_row_glu_2k, QMM_ROW_GLU_2K, "rrrrrrrwbrrr", QmmGluArgs, SB_QMM_GLU_ARGS, 256, 0)
// qmm_row_2k's bindings (y read back: read-write), then combine_weights, shared,
// shared_gate, the per-(token, tile) counters and the combined output.
// SB_KERNEL(qmm_row_combine_2k, QMM_ROW_COMBINE_2K, "rrrrrrrbbrrrbw", QmmCombineArgs, SB_QMM_COMBINE_ARGS, 256, 0)
// The row kernels above for all-4-bit experts on packed int8 dot products.
// SB_KERNEL(qmm_row_dot4, QMM_ROW_DOT4, "rrrrrrrwb", QmmArgs, SB_QMM_ARGS, 256, F_DOT)
// SB_KERNEL(qmm_row_2k_dot4, QMM_ROW_2K_DOT4, "rrrrrrrwb", QmmArgs, SB_QMM_ARGS, 256, F_DOT)
// SB_KERNEL(qmm_row_glu_dot4, QMM_ROW_GLU_DOT4, "rrrrrrrwbrrr", QmmGluArgs, SB_QMM_GLU_ARGS, 256, F_DOT)
// qmm_row_glu's bindings, then the per-pair count of workgroups whose h is stored, then the
// count of matmul_rows16_norm_count workgroups (x stored: its wait_x).
// SB_KERNEL(qmm_row_glu_2k_dot4, QMM_ROW_GLU_2K_DOT4, "rrrrrrrwbrrrbr", QmmGluArgs, SB_QMM_GLU_ARGS, 256, F_DOT)
// qmm_row_combine_2k's bindings, then qmm_row_glu_2k_dot4's counts (its wait_tiles).
// SB_KERNEL(qmm_row_combine_2k_dot4, QMM_ROW_COMBINE_2K_DOT4, "rrrrrrrbbrrrbwr", QmmCombineArgs, SB_QMM_COMBINE_ARGS, 256, F_DOT)
// qmm_row_2k's bindings with x the RmsNorm's input, then its residual, weight, out and sum
// (the _dot4 twin: then qmm_row_combine_2k_dot4's counters of combined tiles, its wait_tiles).
// SB_KERNEL(qmm_row_norm_2k, QMM_ROW_NORM_2K, "rrrrrrrwbrrww", QmmNormArgs, SB_QMM_NORM_ARGS, 256, 0)
// SB_KERNEL(qmm_row_norm_2k_dot4, QMM_ROW_NORM_2K_DOT4, "rrrrrrrwbrrwwr", QmmNormArgs, SB_QMM_NORM_ARGS, 256, F_DOT)
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// GatherQmm's row kernels (decode): QMM_ROW, its variants _GLU, _2K, _GLU_2K and
// _COMBINE_2K, and each of them as *_DOT4 (whose own parts are in
// gather_qmm_row_dot4.glsl; what every GatherQmm schedule shares: gather_qmm_common.glsl).
// Few-row GatherQmm in one dispatch: workgroup (pair p, tile t) quantizes its pair's row
// of x into shared memory (the QUANTIZE steps: same codes, d and sums), then computes
// outputs [t*per_wg, t*per_wg + per_wg) of pair p.
// Thread -> output: task (output o, group g) -> threads tid, tid + 256, ...; each
// forms group g's term s*P + b*X of output o, blocks in order; then thread o adds
// output o's terms in group order. QMM_ROW_GLU: the same for two projections of the
// same pairs (gate, then up: tasks [0, T) and [T, 2T)); thread o rounds both sums to
// the output dtype, as stored outputs would be, and writes their Glu. QMM_ROW_COMBINE:
// then the last workgroup of a (token, tile) combines it, thread -> output word.
// QMM_ROW_NORM_2K: QMM_ROW_2K of RmsNorm's output (order Tree32, norm.comp's RMS_NORM_TREE)
// computed by each workgroup from the norm's input: thread u holds elements [8u, 8u + 8) of
// s = round(x + residual), threads 0..31 dot32's partials, thread 0 the tree and rsqrt; the
// first tile of each row also stores the row's sum and (store_out) its normalized values.

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
#ifdef QMM_ROW_NORM_2K_DOT4
#define QMM_ROW_NORM_2K
#define SB_ROW_DOT4
#define SB_ROW_AFTER  // may follow qmm_row_combine_2k_dot4 without a barrier (args.wait_tiles)
#endif
#ifdef QMM_ROW_NORM_2K
#define QMM_ROW_2K
#define SB_ROW_NORM
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
// *_2K: the same kernels for rows of K <= SB_QMM_ROW_SMALL_K with a quarter of the
// shared memory (faster decode where K allows it).
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
#ifndef QMM_ROW
#error "gather_qmm_row.comp: compile with -DQMM_ROW or one of its variants"
#endif
#include "gather_qmm_common.glsl"
#include "norm_common.glsl"

layout(local_size_x = 256) in;

#if defined(SB_ROW_AFTER) || defined(SB_ROW_WAIT)  // x (h, the combined or the norm output), rhs and the router's weights may be written while this runs
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
layout(std430, binding = 13) coherent writeonly buffer Co { uint cout_[]; };  // read by qmm_row_norm_2k_dot4 as written
#ifdef SB_ROW_AFTER
layout(std430, binding = 14) coherent volatile readonly buffer Dn { uint done[]; };  // per h row: its workgroups done
#endif
layout(push_constant) uniform Args { SB_QMM_COMBINE_ARGS } args;
const uint kProjections = 1u;
shared uint s_last;
#elif defined(SB_ROW_WAIT)  // h: read by qmm_row_combine_2k_dot4 as it is written
layout(std430, binding = 7) coherent writeonly buffer O { uint o[]; };
layout(std430, binding = 12) coherent buffer Dn { uint done[]; };  // per pair: its workgroups whose h is stored
layout(std430, binding = 13) coherent volatile readonly buffer Xd { uint x_done[]; };  // args.wait_x
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
#elif defined(SB_ROW_NORM)
layout(std430, binding = 9) SB_HANDED readonly buffer Nr { uvec4 res4[]; };  // 16-byte aligned (the host checks)
layout(std430, binding = 10) readonly buffer Nw { uint norm_w[]; };
layout(std430, binding = 11) writeonly buffer No { uvec4 norm_out4[]; };
layout(std430, binding = 12) writeonly buffer Ns { uvec4 norm_sum4[]; };
#ifdef SB_ROW_AFTER
layout(std430, binding = 13) coherent volatile readonly buffer Dn { uint done[]; };  // per row: its tiles combined
#endif
layout(push_constant) uniform Args { SB_QMM_NORM_ARGS } args;
const uint kProjections = 1u;
shared float s_row[SB_QMM_ROW_SMALL_K];
shared float s_part[32];
shared float s_inv;
#else
layout(push_constant) uniform Args { SB_QMM_ARGS } args;
const uint kProjections = 1u;
#endif

const uint kThreads = 256u;
const uint kMaxTerms = SB_QMM_ROW_TERMS;  // projections * per_wg * groups (the host checks)
const uint kMaxPerWg = 256u;
const uint kBlocks = SB_ROW_STAGE_K / 32u;
shared uvec4 s_q4[SB_ROW_STAGE_K / 16u];  // x's int8 codes, 16-byte units (a block: two)
#define SQ(i) s_q4[(i) >> 2u][(i) & 3u]
shared uint s_amax[kBlocks];
shared int s_sum[kBlocks];
shared float s_d[kBlocks];
shared float s_term[kMaxTerms];
shared float s_out[kMaxPerWg];

// The block dots and group terms: on packed int8 dot products for the *_DOT4 variants
// (gather_qmm_row_dot4.glsl), on integer multiply-adds otherwise.
#ifdef SB_ROW_DOT4
#include "gather_qmm_row_dot4.glsl"
#else
#define X_DTYPE args.x_dtype
#define OUT_DTYPE args.out_dtype
#define SCALE_DTYPE args.scale_dtype
#define GLU_KIND args.glu_kind
#define NORM_W_DTYPE args.w_dtype
#define row_code(i) codes4[(i) >> 2u][(i)&3u]
#define row_code_up(i) codes_up4[(i) >> 2u][(i)&3u]

// 4-bit block at a multiple of 4 words: one 16-byte load against 8 staged activation words.
#define SB_STAGED_DOT4(NAME, CODES4)                                                                             \
  int NAME(uint base, uint qb) {                                                                                 \
    uvec4 cw = CODES4[base >> 2u];                                                                               \
    int iq = 0;                                                                                                  \
    [[unroll]] for (uint w = 0u; w < 4u; ++w) {                                                                  \
      int xa = int(SQ(qb + 2u * w)), xb = int(SQ(qb + 2u * w + 1u));                                           \
      uint c = cw[w];                                                                                            \
      iq += int(c & 15u) * bitfieldExtract(xa, 0, 8) + int((c >> 4u) & 15u) * bitfieldExtract(xa, 8, 8) +        \
            int((c >> 8u) & 15u) * bitfieldExtract(xa, 16, 8) + int((c >> 12u) & 15u) * bitfieldExtract(xa, 24, 8) + \
            int((c >> 16u) & 15u) * bitfieldExtract(xb, 0, 8) + int((c >> 20u) & 15u) * bitfieldExtract(xb, 8, 8) +  \
            int((c >> 24u) & 15u) * bitfieldExtract(xb, 16, 8) + int(c >> 28u) * bitfieldExtract(xb, 24, 8);    \
    }                                                                                                            \
    return iq;                                                                                                   \
  }

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

// The block dots SB_ROW_TERM calls (the dot4 SB_ROW_TERM loads and dots its blocks itself).
SB_BLOCK_DOT(staged_dot, row_code, SQ)
SB_STAGED_DOT4(staged_dot4, codes4)
#ifdef QMM_ROW_GLU
SB_BLOCK_DOT(staged_dot_up, row_code_up, SQ)
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

SB_LOAD_UNIT(load_unit, x4, X_DTYPE)

#ifdef SB_ROW_NORM
SB_LOAD_UNIT(load_res_unit, res4, X_DTYPE)
// Unit u of row r (v: x's elements on entry, the normalized ones on return), in order Tree32:
// s_i = round(x_i + residual_i); ss = dot32(s, s); r = rsqrt(ss * inv_d + eps);
// out_i = round((s_i * r) * w_i). `store`: this workgroup stores the row's sum and out.
void norm_unit(uint r, uint u, bool mine, bool store, inout float v[8]) {
  uint tid = gl_LocalInvocationID.x, e = r * args.k + u * 8u;
  // Every weight word loaded before any is decoded (one round trip for the eight).
  uint wraw[8];
  [[unroll]] for (uint i = 0u; i < 8u; ++i) wraw[i] = norm_w[sb_word(NORM_W_DTYPE, u * 8u + i)];
  float wv[8];
  [[unroll]] for (uint i = 0u; i < 8u; ++i) wv[i] = sb_decode(wraw[i], NORM_W_DTYPE, u * 8u + i);
  if (args.has_residual != 0u) {
    float rv[8];
    load_res_unit(e, rv);
    [[unroll]] for (uint i = 0u; i < 8u; ++i) {
      precise float a = v[i] + rv[i];
      v[i] = sb_round_to(a, X_DTYPE);
    }
  }
  if (mine) {
    [[unroll]] for (uint i = 0u; i < 8u; ++i) s_row[u * 8u + i] = v[i];
    if (store && args.has_residual != 0u) SB_STORE_UNIT(norm_sum4, e, v, X_DTYPE)
  }
  barrier();
  if (tid < 32u) {  // partial tid: elements tid, tid + 32, ... in order, eight loaded ahead
    precise float p = 0.0;
    for (uint i0 = tid; i0 < args.k; i0 += 256u) {
      float sv[8];
      [[unroll]] for (uint l = 0u; l < 8u; ++l) sv[l] = s_row[min(i0 + 32u * l, args.k - 1u)];
      [[unroll]] for (uint l = 0u; l < 8u; ++l) {
        if (i0 + 32u * l < args.k) p = p + sv[l] * sv[l];
      }
    }
    s_part[tid] = p;
  }
  barrier();
  if (tid == 0u) s_inv = sb_tree32_rsqrt(s_part, args.inv_d, args.eps);
  barrier();
  float inv = s_inv;
  [[unroll]] for (uint i = 0u; i < 8u; ++i) {
    precise float y = (v[i] * inv) * wv[i];
    v[i] = sb_round_to(y, X_DTYPE);
  }
  if (mine && store && args.store_out != 0u) SB_STORE_UNIT(norm_out4, e, v, X_DTYPE)
}
#endif

// Row r of x -> s_q (int8 codes), s_d, s_sum: unit u = elements [8u, 8u + 8) of block u / 4.
#ifdef QMM_ROW_2K
// K <= 2048: at most one unit per thread, its 8 values loaded once (before the first
// barrier) and kept in registers for both passes.
void stage_row(uint r, uint tid) {
  uint blocks = args.k / 32u, units = args.k / 8u, xbase = r * args.k, u = min(tid, units - 1u);
  float v[8];
  load_unit(xbase + u * 8u, v);
#ifdef SB_ROW_NORM
  norm_unit(r, u, tid < units, (gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x) % args.tiles == 0u, v);
#endif
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
    SQ(2u * u) = w0;
    SQ(2u * u + 1u) = w1;
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
    SQ(2u * u) = w[0];
    SQ(2u * u + 1u) = w[1];
    if (s != 0) atomicAdd(s_sum[u >> 2u], s);
    if ((u & 3u) == 0u) s_d[u >> 2u] = d;
  }
  barrier();
}
#endif

#ifdef QMM_ROW_COMBINE
// Counts this workgroup's stored y (pair p, outputs [n0, n0 + cnt)) into its token's
// tile; the last of the token's slots combines the tile's outputs (thread -> word) and
// counts the tile at counters[tokens * tiles + token].
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
      // Eight slots' loads issued before any is used: one L2 round trip instead of eight.
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
  // The tile combined: counted for the next layer's norm kernel (qmm_row_norm_2k_dot4's wait).
  memoryBarrierBuffer();
  barrier();
  if (tid == 0u) atomicAdd(counters[(args.pairs / args.slots) * args.tiles + token], 1u);
}
#endif

#ifdef SB_ROW_WAIT
// rhs[p] once the dispatch before (the router, recorded without a barrier after it) has
// replaced its -1: thread 0 polls it (coherent, volatile loads: faster than atomics),
// bounded, and hands it to the workgroup. The router's workgroups were dispatched first
// and need no slot these hold, so they finish. Gives up with SB_ERR_HANDOFF (the value
// stays -1: a bad index).
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
void wait_for_row(uint r) SB_WAIT_COUNT(done[r], args.wait_tiles, err)
#endif

void main() {
  uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  uint tid = gl_LocalInvocationID.x;
  if (wg >= args.pairs * args.tiles) return;  // uniform over the workgroup
  uint p = wg / args.tiles, n0 = (wg % args.tiles) * args.per_wg;
  uint cnt = min(args.per_wg, args.n - n0);
  int r = args.has_lhs != 0u ? lhs[p] : int(p * args.rows / args.pairs);
#ifdef SB_ROW_WAIT
  // x's row does not depend on the router: staged while it still runs.
  bool staged = args.wait_rhs != 0u && r >= 0 && uint(r) < args.rows;  // uniform
  if (args.wait_x != 0u) SB_WAIT_COUNT(x_done[0], args.wait_x, err)  // x: the norm's output
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
  // one dependent load less before the weights are read.
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
