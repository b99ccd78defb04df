// Typed element access shared by every layer above the core: f32/f16/bf16 values read
// and written as f32 (rounded to nearest even on store), integers as int64, and the
// NaN-propagating max/min of docs/numerics.md.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "switchboard/tensor.h"

namespace switchboard::ops {

inline float load_f32(const void* base, DType t, int64_t i) {
  const auto* p = static_cast<const uint8_t*>(base);
  switch (t) {
    case DType::kF32: { float v; std::memcpy(&v, p + i * 4, 4); return v; }
    case DType::kF16: { uint16_t v; std::memcpy(&v, p + i * 2, 2); return f16_to_f32(v); }
    case DType::kBF16: { uint16_t v; std::memcpy(&v, p + i * 2, 2); return bf16_to_f32(v); }
    default: return 0.f;
  }
}

inline void store_f32(void* base, DType t, int64_t i, float v) {
  auto* p = static_cast<uint8_t*>(base);
  switch (t) {
    case DType::kF32: std::memcpy(p + i * 4, &v, 4); break;
    case DType::kF16: { uint16_t h = f32_to_f16(v); std::memcpy(p + i * 2, &h, 2); break; }
    case DType::kBF16: { uint16_t h = f32_to_bf16(v); std::memcpy(p + i * 2, &h, 2); break; }
    default: break;
  }
}

// v rounded to `t` (f32, f16 or bf16) and widened back: what a store and reload gives.
inline float round_to(float v, DType t) {
  if (t == DType::kF16) return f16_to_f32(f32_to_f16(v));
  if (t == DType::kBF16) return bf16_to_f32(f32_to_bf16(v));
  return v;
}

// max/min independent of operand order: NaN from either side propagates, and
// for equal values (+0 vs -0) max picks +0 and min picks -0.
inline float max_f32(float a, float b) {
  if (a != a || b != b) return a != a ? a : b;
  if (a == b) return f32_from_bits(f32_bits(a) & f32_bits(b));
  return a > b ? a : b;
}
inline float min_f32(float a, float b) {
  if (a != a || b != b) return a != a ? a : b;
  if (a == b) return f32_from_bits(f32_bits(a) | f32_bits(b));
  return a < b ? a : b;
}

// Integer dtypes (and bool) widened to int64.
inline int64_t load_i64(const void* base, DType t, int64_t i) {
  const auto* p = static_cast<const uint8_t*>(base);
  switch (t) {
    case DType::kI32: { int32_t v; std::memcpy(&v, p + i * 4, 4); return v; }
    case DType::kI64: { int64_t v; std::memcpy(&v, p + i * 8, 8); return v; }
    case DType::kU32: { uint32_t v; std::memcpy(&v, p + i * 4, 4); return v; }
    case DType::kU8: return p[i];
    case DType::kBool: return p[i] != 0;
    default: return 0;
  }
}

// Stores the low bits (two's-complement wrap), like a C++ integer conversion.
inline void store_i64(void* base, DType t, int64_t i, int64_t v) {
  auto* p = static_cast<uint8_t*>(base);
  switch (t) {
    case DType::kI32: { auto w = static_cast<int32_t>(static_cast<uint32_t>(v)); std::memcpy(p + i * 4, &w, 4); break; }
    case DType::kI64: std::memcpy(p + i * 8, &v, 8); break;
    case DType::kU32: { auto w = static_cast<uint32_t>(v); std::memcpy(p + i * 4, &w, 4); break; }
    case DType::kU8: p[i] = static_cast<uint8_t>(v); break;
    case DType::kBool: p[i] = v != 0; break;
    default: break;
  }
}

// Every element widened to f32 (f32, f16 or bf16 sources).
std::vector<float> widen_f32(const Tensor& t);
// t's elements as f32: its own data when it is f32 (no copy: weights are read every
// step), else widened into *storage.
const float* f32_data(const Tensor& t, std::vector<float>* storage);

}  // namespace switchboard::ops
