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
// each chunk of kChunk keys, staged in shared memory by one round of coalesced loads (a
// thread reading its sixteenth from global memory waited one load latency every 8 keys);
// the counts summed in shared memory.
// ARGSORT_MOE: also sorted[rank] = keys[i] and quot[rank] = i / div (div >= 1).
layout(std430, binding = 0) readonly buffer K { int keys[]; };
layout(std430, binding = 1) writeonly buffer O { int order[]; };
#ifdef ARGSORT_MOE
layout(std430, binding = 2) writeonly buffer S { int sorted[]; };
layout(std430, binding = 3) writeonly buffer Q { int quot[]; };
#endif
layout(push_constant) uniform Args { SB_ARGSORT_ARGS } args;
const uint kChunk = 4096u, kSlice = kChunk / 16u;  // keys a chunk, a thread's keys of it
shared ivec4 s_keys[kChunk / 4u];  // the chunk, key c at [c / 4][c % 4]
shared uint s_rank[16];

// The keys of s_keys[4 q0 .. 4 q0 + kSlice) that count before key v: u < v, or u <= v where
// every one of them has a lower index than v's (le).
uint count_slice(uint q0, int v, bool le) {
  uint n = 0u;
  if (le) {
    for (uint q = q0; q < q0 + kSlice / 4u; ++q) {
      ivec4 u = s_keys[q];
      n += uint(u.x <= v) + uint(u.y <= v) + uint(u.z <= v) + uint(u.w <= v);
    }
  } else {
    for (uint q = q0; q < q0 + kSlice / 4u; ++q) {
      ivec4 u = s_keys[q];
      n += uint(u.x < v) + uint(u.y < v) + uint(u.z < v) + uint(u.w < v);
    }
  }
  return n;
}

void main() {
  uint t = gl_LocalInvocationID.x;
  uint i = (sb_linear_id() >> 8u) * 16u + (t & 15u), part = t >> 4u;
  if (t < 16u) s_rank[t] = 0u;
  int v = i < args.n ? keys[i] : 0;
  uint rank = 0u;
  for (uint c0 = 0u; c0 < args.n; c0 += kChunk) {
    int x[kChunk / 256u];
    [[unroll]] for (uint u = 0u; u < kChunk / 256u; ++u) {
      uint j = c0 + t + 256u * u;
      x[u] = j < args.n ? keys[j] : 0;
    }
    barrier();  // the previous chunk's counts are done
    [[unroll]] for (uint u = 0u; u < kChunk / 256u; ++u) {
      uint c = t + 256u * u;
      s_keys[c >> 2u][c & 3u] = x[u];
    }
    barrier();
    uint lo = c0 + part * kSlice, hi = min(lo + kSlice, args.n);
    if (i < args.n && lo < hi) {
      if (hi - lo == kSlice && (hi <= i || lo > i)) {  // a whole slice on one side of i
        rank += count_slice(part * (kSlice / 4u), v, hi <= i);
      } else {
        for (uint j = lo; j < hi; ++j) {
          int u = s_keys[(j - c0) >> 2u][(j - c0) & 3u];
          if (u < v || (u == v && j < i)) ++rank;
        }
      }
    }
  }
  if (i < args.n) atomicAdd(s_rank[t & 15u], rank);
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
