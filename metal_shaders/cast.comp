#version 450
#extension GL_GOOGLE_include_directive : require
// Cast between f32, f16, bf16, i32, u32, u8 and bool (i64 has no GPU kernel yet);
// twin of cpu_fallback/cast.cpp, rules at CastNode in schema/program.fbs.
// Thread -> output: invocation w writes output word w (4 / size(to) elements).
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
  if (to == SB_DT_BOOL) return uint(v != 0.0 || sb_isnan(v));
  if (sb_isnan(v)) return 0u;
  if (to == SB_DT_I32) return v <= -2147483648.0 ? 0x80000000u : v >= 2147483648.0 ? 0x7fffffffu : uint(int(v));
  if (to == SB_DT_U32) return v <= 0.0 ? 0u : v >= 4294967296.0 ? 0xffffffffu : uint(v);
  return v <= 0.0 ? 0u : v >= 255.0 ? 255u : uint(v);  // u8
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
