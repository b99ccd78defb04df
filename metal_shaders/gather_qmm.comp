#version 450
#extension GL_GOOGLE_include_directive : require
// GatherQmm on the integer contract of docs/numerics.md; twin of
// cpu_fallback/gather_qmm.cpp. QUANTIZE makes the Q8 activation blocks, QMM the
// quantized expert matmul. Integer dots are exact in any order; the float steps
// run in the contract's fixed order.
#include "common.glsl"

layout(local_size_x = 64) in;

#ifdef QUANTIZE
// Thread -> output: invocation b quantizes 32-block b (row b / (k/32)): 8 words of
// int8 codes, its scale d = 2^-sh and its code sum.
layout(std430, binding = 0) readonly buffer X { uint x[]; };
layout(std430, binding = 1) writeonly buffer Q { uint q[]; };
layout(std430, binding = 2) writeonly buffer D { float dq[]; };
layout(std430, binding = 3) writeonly buffer S { int sq[]; };
layout(push_constant) uniform Args { SB_Q8_ARGS } args;

void main() {
  uint blk = sb_linear_id();
  uint blocks = args.k / 32u;
  if (blk >= args.rows * blocks) return;
  uint base = blk * 32u;  // element index: row-major [rows, k] and blocks are contiguous
  float amax = 0.0;
  bool finite = true;
  for (uint i = 0u; i < 32u; ++i) {
    float a = uintBitsToFloat(floatBitsToUint(SB_LOAD(x, args.dtype, base + i)) & 0x7fffffffu);
    finite = finite && sb_le(a, 3.4028235e38);
    amax = sb_gt(a, amax) ? a : amax;
  }
  int s = 0;
  if (!finite || sb_lt(amax, 7.8886090522101181e-31)) {  // 2^-100
    for (uint w = 0u; w < 8u; ++w) q[blk * 8u + w] = 0u;
    dq[blk] = finite ? 0.0 : uintBitsToFloat(0x7fc00000u);
  } else {
    int sh = 6 - (int((floatBitsToUint(amax) >> 23) & 0xffu) - 127);
    precise float top = amax * sb_pow2i(sh);
    if (sb_gt(sb_round_even(top), 127.0)) --sh;
    float scale = sb_pow2i(sh);
    for (uint w = 0u; w < 8u; ++w) {
      uint word = 0u;
      for (uint j = 0u; j < 4u; ++j) {
        precise float v = SB_LOAD(x, args.dtype, base + w * 4u + j) * scale;
        int c = int(sb_round_even(v));
        s += c;
        word |= (uint(c) & 0xffu) << (8u * j);
      }
      q[blk * 8u + w] = word;
    }
    dq[blk] = sb_pow2i(-sh);
  }
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

// Exact int dot of 32-block j of a code row (a block is exactly `bits` words) with
// the activation block at word qb.
int block_dot(uint base, uint bits, uint qb) {
  int iq = 0;
  if (bits == 4u || bits == 2u || bits == 8u) {  // codes never straddle words
    uint per_word = 32u / bits, mask = (1u << bits) - 1u;
    for (uint w = 0u; w < bits; ++w) {
      uint cw = codes[base + w];
      for (uint i = 0u; i < per_word; ++i) {
        uint idx = w * per_word + i;
        int xv = bitfieldExtract(int(q[qb + (idx >> 2)]), int(8u * (idx & 3u)), 8);
        iq += int((cw >> (i * bits)) & mask) * xv;
      }
    }
    return iq;
  }
  uint mask = (1u << bits) - 1u;
  for (uint i = 0u; i < 32u; ++i) {
    uint bit = i * bits;
    uint sh = bit & 31u;
    uint v = codes[base + (bit >> 5)] >> sh;
    if (sh + bits > 32u) v |= codes[base + (bit >> 5) + 1u] << (32u - sh);
    iq += int(v & mask) * bitfieldExtract(int(q[qb + (i >> 2)]), int(8u * (i & 3u)), 8);
  }
  return iq;
}

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
