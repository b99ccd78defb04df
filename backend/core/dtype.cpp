#include "switchboard/dtype.h"

namespace switchboard {

namespace {
struct DTypeInfo {
  const char* name;
  size_t size;
  bool is_float;
};
constexpr DTypeInfo kInfo[kNumDTypes] = {
    {"f32", 4, true}, {"f16", 2, true}, {"bf16", 2, true}, {"i32", 4, false},
    {"i64", 8, false}, {"u8", 1, false}, {"u32", 4, false}, {"bool", 1, false},
};
}  // namespace

bool dtype_is_valid(int raw) { return raw >= 0 && raw < kNumDTypes; }
size_t dtype_size(DType t) { return kInfo[static_cast<int>(t)].size; }
const char* dtype_name(DType t) { return kInfo[static_cast<int>(t)].name; }
bool dtype_is_float(DType t) { return kInfo[static_cast<int>(t)].is_float; }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (int i = 0; i < kNumDTypes; ++i)
    if (name == kInfo[i].name) return static_cast<DType>(i);
  return std::nullopt;
}

uint16_t f32_to_f16(float f) {
  uint32_t x = f32_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf (or is inf)
  if (abs < 0x38800000u) {
    // Subnormal f16 (or zero): shift the implicit-1 mantissa, round to nearest even.
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // below half the smallest subnormal
    uint32_t exp = abs >> 23;
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - exp;  // 14 + (112 - exp) + ... : maps 2^-15..2^-24 into 10 bits
    uint32_t halfway = 1u << (shift - 1);
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t q = mant >> shift;
    if (rem > halfway || (rem == halfway && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  // Normal: rebias the exponent, round the low 13 bits to nearest even.
  uint32_t r = abs - 0x38000000u;
  r += 0xfffu + ((r >> 13) & 1u);
  return static_cast<uint16_t>(sign | (r >> 13));
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return f32_from_bits(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return f32_from_bits(sign);
    // Normalize the subnormal: value = mant * 2^-24.
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    return f32_from_bits(sign | ((112u - static_cast<uint32_t>(e)) << 23) | ((mant & 0x3ffu) << 13));
  }
  return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

}  // namespace switchboard
