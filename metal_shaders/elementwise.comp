// Kernel variants of this file, one line each (metal_shaders/README.md, "Variants"):
// SB_KERNEL(binary, BINARY, "rrwb", BinaryArgs, SB_BINARY_ARGS, 256, 0)
// SB_KERNEL(binary_div, BINARY_DIV, "rrwb", BinaryArgs, SB_BINARY_ARGS, 256, F_DIVIDES)
// SB_KERNEL(binary_int, BINARY_INT, "rrwb", BinaryArgs, SB_BINARY_ARGS, 256, F_INT64)
// SB_KERNEL(unary_int, UNARY_INT, "rw", UnaryArgs, SB_UNARY_ARGS, 256, F_INT64)
// SB_KERNEL(unary, UNARY, "rw", UnaryArgs, SB_UNARY_ARGS, 256, 0)
#version 450
#extension GL_GOOGLE_include_directive : require
#if defined(BINARY_INT) || defined(UNARY_INT)
#define INT_OPS
#endif
#ifdef INT_OPS
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#endif
// Binary (broadcasting) and unary elementwise ops; twin of cpu_fallback/elementwise.cpp.
// binary / binary_div / unary: float dtypes (binary also i32, unary also i32/u32);
// thread -> output: invocation w writes output word w (one 32-bit element, or
// elements 2w and 2w+1 of an f16/bf16 tensor). binary_int / unary_int (INT_OPS):
// every integer dtype in int64 (mapping stated below).
#include "common.glsl"
#ifndef INT_OPS
#ifdef BINARY_DIV
#define BINARY  // binary_div: Binary with Div (IEEE division; see gpu_kernel_table.h)
#endif

layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer A { uint a[]; };
#ifdef BINARY
layout(std430, binding = 1) readonly buffer B { uint b[]; };
layout(std430, binding = 2) writeonly buffer O { uint o[]; };
layout(std430, binding = 3) buffer E { uint err[]; };
layout(push_constant) uniform Args { SB_BINARY_ARGS } args;

// i32 ops wrap like the CPU's (int64 math stored to 32 bits); FloorDiv works on
// magnitudes in uint so INT_MIN / -1 wraps to INT_MIN and no signed division is needed.
uint apply_i32(int x, int y) {
  if (args.op == 0u) return uint(x) + uint(y);
  if (args.op == 1u) return uint(x) - uint(y);
  if (args.op == 2u) return uint(x) * uint(y);
  if (args.op == 4u) return uint(max(x, y));
  if (args.op == 5u) return uint(min(x, y));
  if (y == 0) {
    atomicOr(err[0], SB_ERR_DIV_ZERO);
    return 0u;
  }
  uint ux = x < 0 ? 0u - uint(x) : uint(x), uy = y < 0 ? 0u - uint(y) : uint(y);
  uint q = ux / uy, r = ux - q * uy;
  if ((x < 0) == (y < 0)) return q;
  return 0u - q - (r != 0u ? 1u : 0u);
}

float apply(float x, float y) {
  precise float r;
  if (args.op == 0u) r = x + y;
  else if (args.op == 1u) r = x - y;
  else if (args.op == 2u) r = x * y;
#ifdef BINARY_DIV
  else if (args.op == 3u) r = x / y;
#endif
  else if (args.op == 4u) r = sb_max(x, y);
  else r = sb_min(x, y);
  return r;
}

// Output element i through the broadcast strides of a and b.
float element(uint i) {
  uint ia = 0u, ib = 0u, rest = i;
  for (int d = int(args.rank) - 1; d >= 0; --d) {
    uint c = rest % args.shape[d];
    rest /= args.shape[d];
    ia += c * args.sa[d];
    ib += c * args.sb[d];
  }
  return apply(SB_LOAD(a, args.dtype, ia), SB_LOAD(b, args.dtype, ib));
}

uint element_i32(uint i) {
  uint ia = 0u, ib = 0u, rest = i;
  for (int d = int(args.rank) - 1; d >= 0; --d) {
    uint c = rest % args.shape[d];
    rest /= args.shape[d];
    ia += c * args.sa[d];
    ib += c * args.sb[d];
  }
  return apply_i32(int(a[ia]), int(b[ib]));
}
#else
layout(std430, binding = 1) writeonly buffer O { uint o[]; };
layout(push_constant) uniform Args { SB_UNARY_ARGS } args;

// i32 / u32: wrapping like the CPU's int64 math stored to 32 bits.
uint element_int(uint i) {
  uint v = a[i];
  bool neg = args.dtype == SB_DT_I32 && int(v) < 0;
  if (args.op == 0u) return 0u - v;
  if (args.op == 1u) return neg ? 0u - v : v;
  if (args.op == 2u) return v * v;
  return neg ? 0u : v;  // Relu
}

float element(uint i) {
  float v = SB_LOAD(a, args.dtype, i);
  if (args.op == 0u) return uintBitsToFloat(floatBitsToUint(v) ^ 0x80000000u);
  if (args.op == 1u) return uintBitsToFloat(floatBitsToUint(v) & 0x7fffffffu);
  if (args.op == 2u) {
    precise float r = v * v;
    return r;
  }
  if (args.op == 3u) return sb_lt(v, 0.0) ? 0.0 : v;  // Relu: NaN and -0 pass through
  if (args.op == 4u) return sb_exp(v);
  if (args.op == 5u) return sb_rcp(v);
  if (args.op == 6u) return sb_rsqrt(v);
  if (args.op == 7u) return sb_sigmoid(v);
  if (args.op == 8u) return sb_silu(v);
  if (args.op == 9u) return sb_tanh(v);
  if (args.op == 10u) return sb_gelu_tanh(v);
  return sb_softplus(v);
}
#endif

void main() {
  uint w = sb_linear_id();
#ifdef BINARY
  if (args.dtype == SB_DT_I32) {
    if (w < args.n) o[w] = element_i32(w);
    return;
  }
#else
  if (args.dtype == SB_DT_I32 || args.dtype == SB_DT_U32) {
    if (w < args.n) o[w] = element_int(w);
    return;
  }
#endif
  uint per = sb_per_word(args.dtype);
  uint i = w * per;
  if (i >= args.n) return;
  float lo = element(i);
  float hi = (per == 2u && i + 1u < args.n) ? element(i + 1u) : 0.0;
  o[w] = sb_encode_word(lo, hi, args.dtype);
}
#endif  // !INT_OPS

#ifdef INT_OPS
// BINARY_INT / UNARY_INT: every integer dtype, in int64 like the CPU (wrapping;
// FloorDiv toward -inf on magnitudes, so INT64_MIN / -1 wraps). Thread -> output:
// invocation j writes the elements [j*per, j*per+per) (per = 4 for byte dtypes, else
// 1) and their words.
#include "int64.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer A { uint a[]; };
#ifdef BINARY_INT
layout(std430, binding = 1) readonly buffer B { uint b[]; };
layout(std430, binding = 2) writeonly buffer O { uint o[]; };
layout(std430, binding = 3) buffer E { uint err[]; };
layout(push_constant) uniform Args { SB_BINARY_ARGS } args;

int64_t apply_int(int64_t x, int64_t y) {
  if (args.op == 0u) return int64_t(uint64_t(x) + uint64_t(y));
  if (args.op == 1u) return int64_t(uint64_t(x) - uint64_t(y));
  if (args.op == 2u) return int64_t(uint64_t(x) * uint64_t(y));
  if (args.op == 4u) return x > y ? x : y;
  if (args.op == 5u) return x < y ? x : y;
  if (y == 0) {
    atomicOr(err[0], SB_ERR_DIV_ZERO);
    return 0;
  }
  uint64_t ux = x < 0 ? uint64_t(0) - uint64_t(x) : uint64_t(x), uy = y < 0 ? uint64_t(0) - uint64_t(y) : uint64_t(y);
  uint64_t q = ux / uy, r = ux - q * uy;
  if ((x < 0) == (y < 0)) return int64_t(q);
  return int64_t(uint64_t(0) - q - (r != uint64_t(0) ? uint64_t(1) : uint64_t(0)));
}

int64_t element(uint i) {
  uint ia = 0u, ib = 0u, rest = i;
  for (int d = int(args.rank) - 1; d >= 0; --d) {
    uint c = rest % args.shape[d];
    rest /= args.shape[d];
    ia += c * args.sa[d];
    ib += c * args.sb[d];
  }
  return apply_int(SB_LOAD_INT(a, args.dtype, ia), SB_LOAD_INT(b, args.dtype, ib));
}
#else
layout(std430, binding = 1) writeonly buffer O { uint o[]; };
layout(push_constant) uniform Args { SB_UNARY_ARGS } args;

int64_t element(uint i) {
  int64_t v = SB_LOAD_INT(a, args.dtype, i);
  if (args.op == 0u) return int64_t(uint64_t(0) - uint64_t(v));
  if (args.op == 1u) return v < 0 ? int64_t(uint64_t(0) - uint64_t(v)) : v;
  if (args.op == 2u) return int64_t(uint64_t(v) * uint64_t(v));
  return v < 0 ? int64_t(0) : v;  // Relu
}
#endif

void main() {
  uint j = sb_linear_id();
  uint per = sb_int_per(args.dtype), e0 = j * per;
  if (e0 >= args.n) return;
  int64_t vals[4];
  uint count = min(per, args.n - e0);
  for (uint s = 0u; s < count; ++s) vals[s] = element(e0 + s);
  SB_STORE_INTS(o, args.dtype, e0, vals, count)
}
#endif  // INT_OPS
