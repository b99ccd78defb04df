// Kernel variants of this file, one line each (metal_shaders/README.md, "Variants"):
// SB_KERNEL(cast_i64, CAST_I64, "rw", CastArgs, SB_CAST_ARGS, 256, F_INT64)
// SB_KERNEL(cast, CAST, "rw", CastArgs, SB_CAST_ARGS, 256, 0)
#version 450
#extension GL_GOOGLE_include_directive : require
// Cast between f32, f16, bf16, i32, u32, u8 and bool (cast), and from or to i64
// (cast_i64, int64 arithmetic); twin of cpu_fallback/cast.cpp, rules at CastNode in
// schema/program.fbs. Thread -> output: invocation w writes output word w (4 / size(to)
// elements); for an i64 output, invocation w writes element w (two words).
#ifdef CAST_I64
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#endif
#include "common.glsl"

layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { uint x[]; };
layout(std430, binding = 1) writeonly buffer O { uint o[]; };
layout(push_constant) uniform Args { SB_CAST_ARGS } args;

uint dsize(uint dt) { return dt == SB_DT_U8 || dt == SB_DT_BOOL ? 1u : sb_is16(dt) ? 2u : 4u; }
bool is_float(uint dt) { return dt <= SB_DT_BF16; }

// The source's bits, zero- or sign-extension aside (sources are at most 32 bits).
uint int_bits(uint i) {
  uint dt = args.from_dtype;
  if (dt == SB_DT_U8 || dt == SB_DT_BOOL) {
    uint b = (x[i >> 2] >> ((i & 3u) * 8u)) & 0xffu;
    return dt == SB_DT_BOOL ? uint(b != 0u) : b;
  }
  return x[i];
}

// int -> float, one rounding into `to` (bf16 from |v| >= 2^24 rounded directly).
float int_to_float(uint bits, uint to) {
  bool neg = args.from_dtype == SB_DT_I32 && int(bits) < 0;
  uint mag = neg ? 0u - bits : bits;
  if (to != SB_DT_BF16 || mag < 16777216u) return args.from_dtype == SB_DT_I32 ? float(int(bits)) : float(bits);
  int shift = findMSB(mag) + 1 - 8;  // keep bf16's 8 significant bits
  uint q = mag >> uint(shift), rem = mag & ((1u << uint(shift)) - 1u), half_ulp = 1u << uint(shift - 1);
  if (rem > half_ulp || (rem == half_ulp && (q & 1u) != 0u)) ++q;
  precise float f = float(q) * sb_pow2i(shift);  // exact: q has at most 9 bits
  return neg ? -f : f;
}

// float -> int: truncate toward zero, saturate, NaN -> 0 (bool: v != 0, NaN -> true).
uint float_to_int(float v, uint to) {
  if (to == SB_DT_BOOL) return uint(!sb_eq(v, 0.0));  // NaN -> true
  if (sb_isnan(v)) return 0u;
  if (to == SB_DT_I32) return sb_le(v, -2147483648.0) ? 0x80000000u : sb_ge(v, 2147483648.0) ? 0x7fffffffu : uint(int(v));
  if (to == SB_DT_U32) return sb_le(v, 0.0) ? 0u : sb_ge(v, 4294967296.0) ? 0xffffffffu : uint(v);
  return sb_le(v, 0.0) ? 0u : sb_ge(v, 255.0) ? 255u : uint(v);  // u8
}

// Element i converted to `to`, as its bits in the low size(to) bytes.
uint convert(uint i) {
  uint from = args.from_dtype, to = args.to_dtype;
  if (is_float(from)) {
    float v = SB_LOAD(x, from, i);
    if (to == SB_DT_F32) return floatBitsToUint(v);
    if (is_float(to)) return sb_encode16(v, to);
    return float_to_int(v, to);
  }
  uint bits = int_bits(i);
  if (is_float(to)) {
    float f = int_to_float(bits, to);
    return to == SB_DT_F32 ? floatBitsToUint(f) : sb_encode16(f, to);
  }
  if (to == SB_DT_BOOL) return uint(bits != 0u);
  return to == SB_DT_U8 ? (bits & 0xffu) : bits;
}

#ifndef CAST_I64
void main() {
  uint w = sb_linear_id();
  uint size = dsize(args.to_dtype), per = 4u / size;
  uint first = w * per;
  if (first >= args.n) return;
  uint word = 0u;
  for (uint s = 0u; s < per && first + s < args.n; ++s) {
    uint v = convert(first + s);
    word |= size == 4u ? v : (v & ((1u << (8u * size)) - 1u)) << (8u * size * s);
  }
  o[w] = word;
}
#endif  // !CAST_I64

#ifdef CAST_I64
#include "int64.glsl"

float i64_to_float(int64_t v, uint to) {
  bool neg = v < 0;
  uint64_t mag = neg ? uint64_t(0) - uint64_t(v) : uint64_t(v);
  if (to != SB_DT_BF16 || mag < uint64_t(16777216u)) return float(v);
  uint hi = uint(mag >> 32), lo = uint(mag);
  int shift = (hi != 0u ? 32 + findMSB(hi) : findMSB(lo)) + 1 - 8;  // keep bf16's 8 significant bits
  uint64_t q = mag >> uint(shift), rem = mag & ((uint64_t(1) << uint(shift)) - uint64_t(1));
  uint64_t half_ulp = uint64_t(1) << uint(shift - 1);
  if (rem > half_ulp || (rem == half_ulp && (q & uint64_t(1)) != uint64_t(0))) ++q;
  precise float f = float(uint(q)) * sb_pow2i(shift);  // exact: q has at most 9 bits
  return neg ? -f : f;
}

int64_t float_to_i64(float v) {
  if (sb_isnan(v)) return 0;
  if (sb_le(v, -9223372036854775808.0)) return int64_t(0x8000000000000000ul);
  if (sb_ge(v, 9223372036854775808.0)) return int64_t(0x7ffffffffffffffful);
  return int64_t(v);
}

// Element i as `to`, as int64 bits (floats: their bit pattern in the low bits).
int64_t convert64(uint i) {
  uint from = args.from_dtype, to = args.to_dtype;
  if (is_float(from)) {
    float v = SB_LOAD(x, from, i);
    if (to == SB_DT_I64) return float_to_i64(v);
    if (to == SB_DT_F32) return int64_t(floatBitsToUint(v));
    if (is_float(to)) return int64_t(sb_encode16(v, to));
    return int64_t(float_to_int(v, to));
  }
  int64_t v = SB_LOAD_INT(x, from, i);
  if (is_float(to)) {
    float f = i64_to_float(v, to);
    return int64_t(to == SB_DT_F32 ? floatBitsToUint(f) : sb_encode16(f, to));
  }
  if (to == SB_DT_BOOL) return int64_t(v != 0);
  return v;  // stored as its low bits
}

void main() {
  uint w = sb_linear_id();
  uint to = args.to_dtype;
  if (to == SB_DT_I64) {
    if (w >= args.n) return;
    int64_t v = convert64(w);
    o[2u * w] = uint(uint64_t(v));
    o[2u * w + 1u] = uint(uint64_t(v) >> 32);
    return;
  }
  uint size = dsize(to), per = 4u / size;
  uint first = w * per;
  if (first >= args.n) return;
  uint word = 0u;
  for (uint s = 0u; s < per && first + s < args.n; ++s) {
    uint v = uint(uint64_t(convert64(first + s)));
    word |= size == 4u ? v : (v & ((1u << (8u * size)) - 1u)) << (8u * size * s);
  }
  o[w] = word;
}
#endif
