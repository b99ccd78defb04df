// Kernel variants of this file, one line each (metal_shaders/README.md, "Variants"):
// SB_KERNEL(quantize_q8, QUANTIZE, "rwww", Q8Args, SB_Q8_ARGS, 64, 0)
// SB_KERNEL(quantize_q8_16, QUANTIZE16, "rwww", Q8Args, SB_Q8_ARGS, 64, 0)
// SB_KERNEL(qmm, QMM, "rrrrrrrrrwb", QmmArgs, SB_QMM_ARGS, 64, 0)
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// GatherQmm's Q8 activation quantizer (QUANTIZE, QUANTIZE16) and its generic kernel (QMM:
// any pairs, any bit widths); thread -> output at each kernel below. The other
// schedules: gather_qmm_row.comp (decode rows), gather_qmm_tile.comp (sorted tiles),
// gather_qmm_mma.comp (the tiles on int8 cooperative matrices); what they share is in
// gather_qmm_common.glsl.
#include "gather_qmm_common.glsl"

layout(local_size_x = 64) in;

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
#define q_word(i) q[i]
SB_BLOCK_DOT(block_dot, codes_word, q_word)

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
