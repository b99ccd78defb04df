// Kernel variants of this file, one line each (metal_shaders/README.md, "Variants"):
// SB_KERNEL(gather_rows, GATHER_ROWS, "rrwb", PermuteArgs, SB_PERMUTE_ARGS, 256, 0)
// SB_KERNEL(gather_rows16, GATHER_ROWS16, "rrwb", PermuteArgs, SB_PERMUTE_ARGS, 256, 0)
// SB_KERNEL(invert_permutation, INVERT, "rbb", PermuteArgs, SB_PERMUTE_ARGS, 256, 0)
// SB_KERNEL(argsort, ARGSORT, "rw", ArgsortArgs, SB_ARGSORT_ARGS, 256, 0)
// argsort that also writes each rank's key and its index divided by args.div (the sorted MoE's
// pairs: order, experts, tokens): keys, order, sorted keys, quotients.
// SB_KERNEL(argsort_moe, ARGSORT_MOE, "rwww", ArgsortArgs, SB_ARGSORT_ARGS, 256, 0)
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// GatherRows (out[p] = x[idx[p]]) and the inverse permutation that turns
// ScatterRows (out[idx[p]] = x[p]) into a gather; twin of cpu_fallback/permute.cpp.
#include "common.glsl"

layout(local_size_x = 256) in;
#ifdef ARGSORT_MOE
#define ARGSORT
#endif
#ifndef ARGSORT
layout(push_constant) uniform Args { SB_PERMUTE_ARGS } args;
#endif

#ifdef GATHER_ROWS
// Thread -> output: invocation w writes word w of out; each unit in it comes from
// the source row its output row names. Rows are units of 1, 2 or 4 bytes (8-byte
// dtypes are two 4-byte units), so a word may span two rows.
layout(std430, binding = 0) readonly buffer X { uint x[]; };
layout(std430, binding = 1) readonly buffer I { int idx[]; };
layout(std430, binding = 2) writeonly buffer O { uint o[]; };
layout(std430, binding = 3) buffer E { uint err[]; };

void main() {
  uint w = sb_linear_id();
  if (w >= args.out_words) return;
  uint per = 4u / args.unit_bytes;
  uint bits = args.unit_bytes * 8u;
  uint mask = bits == 32u ? 0xffffffffu : ((1u << bits) - 1u);
  uint total = args.rows * args.row_units;
  uint word = 0u;
  for (uint s = 0u; s < per; ++s) {
    uint e = w * per + s;
    if (e >= total) break;
    uint r = e / args.row_units, c = e % args.row_units;
    int src = idx[r];
    if (src < 0 || uint(src) >= args.src_rows) {
      atomicOr(err[0], SB_ERR_INDEX);
      continue;
    }
    uint se = uint(src) * args.row_units + c;
    word |= ((x[se / per] >> ((se % per) * bits)) & mask) << (s * bits);
  }
  o[w] = word;
}
#endif

#ifdef GATHER_ROWS16
// GATHER_ROWS for rows of whole 16-byte units at 16-byte aligned bindings (the host
// checks): thread -> output: invocation v copies 16-byte unit v of out (row v / units
// per row) with one load, one division per 16 bytes instead of two per word.
layout(std430, binding = 0) readonly buffer X { uvec4 x[]; };
layout(std430, binding = 1) readonly buffer I { int idx[]; };
layout(std430, binding = 2) writeonly buffer O { uvec4 o[]; };
layout(std430, binding = 3) buffer E { uint err[]; };

void main() {
  uint v = sb_linear_id();
  if (v >= args.out_words / 4u) return;
  uint per_row = args.row_units * args.unit_bytes / 16u;
  uint r = v / per_row;
  int src = idx[r];
  if (src < 0 || uint(src) >= args.src_rows) {
    atomicOr(err[0], SB_ERR_INDEX);
    o[v] = uvec4(0u);
    return;
  }
  o[v] = x[uint(src) * per_row + (v - r * per_row)];
}
#endif

#ifdef INVERT
// Thread -> entry: invocation p claims inv[idx[p]]; a second claim of one row, or an
// index out of range, raises SB_ERR_PERMUTATION.
layout(std430, binding = 0) readonly buffer I { int idx[]; };
layout(std430, binding = 1) buffer V { uint inv[]; };
layout(std430, binding = 2) buffer E { uint err[]; };

void main() {
  uint p = sb_linear_id();
  if (p >= args.rows) return;
  int dst = idx[p];
  if (dst < 0 || uint(dst) >= args.rows || atomicCompSwap(inv[dst], 0xffffffffu, p) != 0xffffffffu)
    atomicOr(err[0], SB_ERR_PERMUTATION);
}
#endif

#ifdef ARGSORT
// Stable ascending argsort by ranks: the rank of key i counts the keys smaller, or equal
// with a lower index; out[rank] = i. Thread -> output: workgroup g ranks keys
// [16g, 16g + 16); thread t counts key 16g + t % 16 against the (t / 16)-th sixteenth of
// all keys (so n keys keep 16n threads busy), the counts summed in shared memory.
// ARGSORT_MOE: also sorted[rank] = keys[i] and quot[rank] = i / div (div >= 1).
layout(std430, binding = 0) readonly buffer K { int keys[]; };
layout(std430, binding = 1) writeonly buffer O { int order[]; };
#ifdef ARGSORT_MOE
layout(std430, binding = 2) writeonly buffer S { int sorted[]; };
layout(std430, binding = 3) writeonly buffer Q { int quot[]; };
#endif
layout(push_constant) uniform Args { SB_ARGSORT_ARGS } args;
shared uint s_rank[16];

void main() {
  uint t = gl_LocalInvocationID.x;
  uint i = (sb_linear_id() >> 8u) * 16u + (t & 15u), part = t >> 4u;
  if (t < 16u) s_rank[t] = 0u;
  barrier();
  int v = 0;
  if (i < args.n) {
    v = keys[i];
    uint span = (args.n + 15u) / 16u, rank = 0u;
    uint lo = part * span, hi = min(args.n, (part + 1u) * span);
    for (uint j0 = lo; j0 < hi; j0 += 8u) {  // 8 loads issued together (at clamped indices)
      int u[8];
      [[unroll]] for (uint d = 0u; d < 8u; ++d) u[d] = keys[min(j0 + d, hi - 1u)];
      [[unroll]] for (uint d = 0u; d < 8u; ++d) {
        uint j = j0 + d;
        if (j < hi && (u[d] < v || (u[d] == v && j < i))) ++rank;
      }
    }
    atomicAdd(s_rank[t & 15u], rank);
  }
  barrier();
  if (t < 16u && i < args.n) {
    order[s_rank[t]] = int(i);
#ifdef ARGSORT_MOE
    sorted[s_rank[t]] = v;
    quot[s_rank[t]] = int(i / args.div);
#endif
  }
}
#endif
