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
    finite = finite && a <= 3.4028235e38;
    amax = a > amax ? a : amax;
  }
  int s = 0;
  if (!finite || amax < 7.8886090522101181e-31) {  // 2^-100
    for (uint w = 0u; w < 8u; ++w) q[blk * 8u + w] = 0u;
    dq[blk] = finite ? 0.0 : uintBitsToFloat(0x7fc00000u);
  } else {
    int sh = 6 - (int((floatBitsToUint(amax) >> 23) & 0xffu) - 127);
    precise float top = amax * sb_pow2i(sh);
    if (sb_round_even(top) > 127.0) --sh;
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
// Thread -> output: workgroup w writes word w of out [pairs, n] (one f32 element, or
// two f16/bf16 elements). For each element (pair p, row n) thread t computes the
// exact integer dots of 32-blocks t, t+64, ...; threads then form the groups' terms
// (s*P + b*X, blocks in order) and thread 0 adds the terms in group order.
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
const uint kMaxBlocks = 256u;  // k <= 8192 (the host checks)
shared int s_iq[kMaxBlocks];
shared float s_term[kMaxBlocks];
shared float s_out[2];

// Element e = (pair, row) into s_out[slot]. Every branch depends only on workgroup-
// uniform values, so all threads reach the same barriers.
void qdot(uint e, uint slot) {
  uint tid = gl_LocalInvocationID.x;
  uint p = e / args.n, n = e % args.n;
  int ex = args.has_rhs != 0u ? rhs[p] : 0;
  int r = args.has_lhs != 0u ? lhs[p] : int(p * args.rows / args.pairs);
  uint fault = 0u;
  if (ex < 0 || uint(ex) >= args.experts || r < 0 || uint(r) >= args.rows) fault = SB_ERR_INDEX;
  else if (expert_info[ex] == 0u) fault = SB_ERR_PRUNED;
  if (args.sorted != 0u && p > 0u && fault == 0u && rhs[p - 1u] > ex && tid == 0u) atomicOr(err[0], SB_ERR_UNSORTED);
  if (fault != 0u) {
    if (tid == 0u) {
      atomicOr(err[0], fault);
      s_out[slot] = 0.0;
    }
    return;
  }
  uint bits = expert_info[ex];
  uint mask = (1u << bits) - 1u;
  uint row = expert_info[args.experts + uint(ex)] + n * (args.k * bits / 32u);
  uint blocks = args.k / 32u, per_group = args.group_size / 32u;
  uint xrow = uint(r) * blocks;
  // A 32-block of codes is exactly `bits` words: blocks never share a word.
  for (uint j = tid; j < blocks; j += kThreads) {
    uint base = row + j * bits;
    int iq = 0;
    for (uint i = 0u; i < 32u; ++i) {
      uint bit = i * bits;
      uint sh = bit & 31u;
      uint v = codes[base + (bit >> 5)] >> sh;
      if (sh + bits > 32u) v |= codes[base + (bit >> 5) + 1u] << (32u - sh);
      iq += int(v & mask) * bitfieldExtract(int(q[(xrow + j) * 8u + (i >> 2)]), int(8u * (i & 3u)), 8);
    }
    s_iq[j] = iq;
  }
  barrier();
  uint sidx = (uint(ex) * args.n + n) * args.groups;
  for (uint g = tid; g < args.groups; g += kThreads) {
    precise float pg = 0.0, xg = 0.0;
    for (uint j = g * per_group; j < (g + 1u) * per_group; ++j) {
      float d = dq[xrow + j];
      pg = pg + float(s_iq[j]) * d;
      xg = xg + float(sq[xrow + j]) * d;
    }
    float sc = SB_LOAD(scales, args.scale_dtype, sidx + g);
    float bc = SB_LOAD(biases, args.scale_dtype, sidx + g);
    precise float term = sc * pg + bc * xg;
    s_term[g] = term;
  }
  barrier();
  if (tid == 0u) {
    precise float acc = 0.0;
    for (uint g = 0u; g < args.groups; ++g) acc = acc + s_term[g];
    s_out[slot] = acc;
  }
  barrier();
}

void main() {
  uint w = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  uint per = sb_per_word(args.out_dtype);
  uint i = w * per;
  uint count = args.pairs * args.n;
  if (i >= count) return;
  qdot(i, 0u);
  bool two = per == 2u && i + 1u < count;
  if (two) qdot(i + 1u, 1u);
  if (gl_LocalInvocationID.x == 0u) o[w] = sb_encode_word(s_out[0], two ? s_out[1] : 0.0, args.out_dtype);
}
#endif
