#version 450
#extension GL_GOOGLE_include_directive : require
// Binary (broadcasting) and unary elementwise ops on float dtypes, and Binary on
// i32 (wrapping, FloorDiv toward -inf); twin of cpu_fallback/elementwise.cpp.
// Thread -> output: invocation w writes output word w (one f32/i32 element, or
// elements 2w and 2w+1 of an f16/bf16 tensor).
#include "common.glsl"
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
  return v < 0.0 ? 0.0 : v;  // Relu: NaN and -0 pass through
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
