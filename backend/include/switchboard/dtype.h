// Element types and the exact f16/bf16 conversions every device implements
// (round to nearest even; see docs/numerics.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace switchboard {

// Values equal schema/program.fbs `DType` (checked by static_assert in the loader).
enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2, kI32 = 3, kI64 = 4, kU8 = 5, kU32 = 6, kBool = 7 };
inline constexpr int kNumDTypes = 8;

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // "f32", "bf16", ...
std::optional<DType> dtype_from_name(std::string_view name);
bool dtype_is_float(DType t);
bool dtype_is_valid(int raw);

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// bf16 <-> f32. NaN stays NaN (quiet), everything else rounds to nearest even.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }

// f16 <-> f32 by bit manipulation (no hardware conversion, so every host agrees).
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);

}  // namespace switchboard
