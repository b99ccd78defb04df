// Kernel variants of this file, one line each (metal_shaders/README.md, "Variants"):
// SB_KERNEL(argmax_int, ARGMAX_INT, "rw", ReduceArgs, SB_REDUCE_ARGS, 256, F_INT64)
// SB_KERNEL(reduce, REDUCE, "rw", ReduceArgs, SB_REDUCE_ARGS, 256, 0)
// SB_KERNEL(reduce_mean, REDUCE_MEAN, "rw", ReduceArgs, SB_REDUCE_ARGS, 256, F_DIVIDES)
// SB_KERNEL(argmax, ARGMAX, "rw", ReduceArgs, SB_REDUCE_ARGS, 256, 0)
// SB_KERNEL(argmax_row, ARGMAX_ROW, "rw", ReduceArgs, SB_REDUCE_ARGS, 256, 0)
// SB_KERNEL(argmax_merge, ARGMAX_MERGE, "rw", ReduceArgs, SB_REDUCE_ARGS, 256, 0)
#version 450
#extension GL_GOOGLE_include_directive : require
#ifdef ARGMAX_INT
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#endif
// Reduce Sum/Max/Min and Argmax along one axis, in index order 0..d-1; twin of
// cpu_fallback/reduce.cpp. x is viewed as [outer, d, inner].
// Thread -> output: REDUCE: invocation w writes word w of out [outer, inner] (1 or 2
// elements); ARGMAX: invocation i writes i32 element i; ARGMAX_ROW (inner == 1, long
// rows such as logits): workgroup g writes element g, its 256 threads scanning strided
// positions and combining in shared memory (the winner is order-free: the first NaN,
// else the largest value at its lowest index). With pad0 = P > 1 parts of pad1 positions,
// workgroup g scans part g % P of row g / P and writes its (value bits, index) pair to
// binding 1; ARGMAX_MERGE: workgroup g combines row g's P pairs the same way.
#include "common.glsl"
#if defined(ARGMAX_ROW) || defined(ARGMAX_MERGE)
#define ARGMAX
#define ARGMAX_WIDE
#endif
#ifdef REDUCE_MEAN
#define REDUCE  // reduce_mean: Sum, then one IEEE division by d (see gpu_kernel_table.h)
#endif

layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { uint x[]; };
layout(std430, binding = 1) writeonly buffer O { uint o[]; };
layout(push_constant) uniform Args { SB_REDUCE_ARGS } args;

float at(uint i, uint j) {  // element (output i, position j along the axis)
  uint a = i / args.inner, b = i % args.inner;
  return SB_LOAD(x, args.dtype, (a * args.d + j) * args.inner + b);
}

#ifdef REDUCE
float reduce_one(uint i) {
  if (args.op <= 1u) {  // Sum (and Mean): f32 accumulator from +0, in index order
    precise float acc = 0.0;
    for (uint j = 0u; j < args.d; ++j) acc = acc + at(i, j);
#ifdef REDUCE_MEAN
    if (args.op == 1u) {
      precise float mean = acc / float(args.d);
      return mean;
    }
#endif
    return acc;
  }
  float m = at(i, 0u);  // Max (2) / Min (3): NaN propagates
  for (uint j = 1u; j < args.d; ++j) m = args.op == 2u ? sb_max(m, at(i, j)) : sb_min(m, at(i, j));
  return m;
}

void main() {
  uint w = sb_linear_id();
  uint per = sb_per_word(args.dtype);
  uint i = w * per, count = args.outer * args.inner;
  if (i >= count) return;
  float lo = reduce_one(i);
  float hi = (per == 2u && i + 1u < count) ? reduce_one(i + 1u) : 0.0;
  o[w] = sb_encode_word(lo, hi, args.dtype);
}
#endif

#ifdef ARGMAX_INT
#include "int64.glsl"
void main() {  // integer dtypes: strictly greater wins, so the lowest index among equals
  uint i = sb_linear_id();
  if (i >= args.outer * args.inner) return;
  uint a0 = i / args.inner, b0 = i % args.inner;
  uint best = 0u;
  int64_t bv = SB_LOAD_INT(x, args.dtype, a0 * args.d * args.inner + b0);
  for (uint j = 1u; j < args.d; ++j) {
    int64_t v = SB_LOAD_INT(x, args.dtype, (a0 * args.d + j) * args.inner + b0);
    if (v > bv) {
      best = j;
      bv = v;
    }
  }
  o[i] = best;
}
#endif

#ifdef ARGMAX_WIDE
shared float best_v[256];
shared uint best_j[256];
const uint kNone = 0xffffffffu;

// Whether value v at j wins over bv at bj under the sequential rule.
bool beats(float v, uint j, float bv, uint bj) {
  if (bj == kNone) return j != kNone;
  if (j == kNone) return false;
  if (sb_isnan(bv)) return sb_isnan(v) && j < bj;
  if (sb_isnan(v) || sb_gt(v, bv)) return true;
  return sb_eq(v, bv) && j < bj;
}

void main() {
  uint g = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x, t = gl_LocalInvocationID.x;
#ifdef ARGMAX_MERGE
  uint parts = args.pad0, i = g;  // a workgroup per row
#else
  uint parts = max(args.pad0, 1u), i = g / parts, part = g % parts;
#endif
  if (i >= args.outer) return;  // uniform across the workgroup
  float bv = 0.0;
  uint bj = kNone;
#ifdef ARGMAX_MERGE
  for (uint p = t; p < parts; p += 256u) {
    float v = uintBitsToFloat(x[(i * parts + p) * 2u]);
    uint j = x[(i * parts + p) * 2u + 1u];
    if (beats(v, j, bv, bj)) {
      bv = v;
      bj = j;
    }
  }
#else
  uint lo = parts > 1u ? part * args.pad1 : 0u, hi = parts > 1u ? min(args.d, lo + args.pad1) : args.d;
  for (uint j = lo + t; j < hi; j += 256u) {
    float v = at(i, j);
    if (beats(v, j, bv, bj)) {
      bv = v;
      bj = j;
    }
  }
#endif
  best_v[t] = bv;
  best_j[t] = bj;
  barrier();
  for (uint s = 128u; s > 0u; s >>= 1) {
    if (t < s && beats(best_v[t + s], best_j[t + s], best_v[t], best_j[t])) {
      best_v[t] = best_v[t + s];
      best_j[t] = best_j[t + s];
    }
    barrier();
  }
  if (t != 0u) return;
#ifdef ARGMAX_ROW
  if (parts > 1u) {
    o[g * 2u] = floatBitsToUint(best_v[0]);
    o[g * 2u + 1u] = best_j[0];
    return;
  }
#endif
  o[i] = best_j[0];
}
#elif defined(ARGMAX)
void main() {
  uint i = sb_linear_id();
  if (i >= args.outer * args.inner) return;
  uint best = 0u;
  float bv = at(i, 0u);
  for (uint j = 1u; j < args.d; ++j) {  // the lowest index among equal maxima; NaN is the largest
    float v = at(i, j);
    if (!sb_isnan(bv) && (sb_isnan(v) || sb_gt(v, bv))) {
      best = j;
      bv = v;
    }
  }
  o[i] = best;
}
#endif
