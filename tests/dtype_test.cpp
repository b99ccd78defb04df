// f16/bf16 conversions are part of the numerics contract: every device must
// produce these exact bits, so they are checked exhaustively.
#include <gtest/gtest.h>

#include <cmath>

#include "exact_math.h"
#include "switchboard/dtype.h"

namespace switchboard {
namespace {

TEST(DType, NamesRoundTrip) {
  for (int i = 0; i < kNumDTypes; ++i) {
    auto t = static_cast<DType>(i);
    ASSERT_EQ(dtype_from_name(dtype_name(t)), t);
  }
  EXPECT_FALSE(dtype_from_name("f8").has_value());
  EXPECT_FALSE(dtype_is_valid(kNumDTypes));
  EXPECT_FALSE(dtype_is_valid(-1));
}

// Every f16 value widens exactly and narrows back to itself (NaNs stay NaN).
TEST(DType, F16RoundTripsEveryValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    ASSERT_EQ(f32_to_f16(f), h) << "h=" << h;
  }
}

// Round to nearest even against the compiler's own conversion, over a dense
// sample of all f32 bit patterns (every 251st, plus all halfway cases near 1).
TEST(DType, F16MatchesHardwareRoundNearestEven) {
#if defined(__FLT16_MAX__)
  auto check = [](uint32_t u) {
    float f = f32_from_bits(u);
    if (std::isnan(f)) return;
    _Float16 hw = static_cast<_Float16>(f);
    uint16_t want;
    std::memcpy(&want, &hw, 2);
    ASSERT_EQ(f32_to_f16(f), want) << std::hex << "f32 bits 0x" << u;
  };
  for (uint64_t u = 0; u < (1ull << 32); u += 251) check(static_cast<uint32_t>(u));
  for (uint32_t m = 0; m < (1u << 13); ++m) check(0x3f800000u | (m << 10) | 0x1000u);  // halfway ties
#else
  // No _Float16 on this compiler: check the known ties by hand.
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3c00);          // tie, rounds to even (down)
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);      // tie, rounds to even (up)
#endif
}

TEST(DType, F16EdgeCases) {
  EXPECT_EQ(f32_to_f16(65504.f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.f), 0x7c00);  // halfway to the next binade rounds to inf
  EXPECT_EQ(f32_to_f16(-0.f), 0x8000);
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);  // exact half of it: ties to even (zero)
  EXPECT_EQ(f32_to_f16(0x1.8p-25f), 0x0001);
  EXPECT_EQ(f16_to_f32(0x0001), 0x1p-24f);
  EXPECT_TRUE(std::isinf(f16_to_f32(0xfc00)));
}

TEST(DType, BF16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x3f808000u)), 0x3f80);  // tie → even
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x3f818000u)), 0x3f82);  // tie → even (up)
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x7f7fffffu)), 0x7f80);  // max float rounds to inf
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f32_from_bits(0x7f800001u)))));  // payload in low bits
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = bf16_to_f32(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      ASSERT_EQ(f32_to_bf16(f), h);
    }
  }
}

}  // namespace
}  // namespace switchboard

// exact::exp_n (attention's block of exps, written without branches) gives exact::exp's bits
// on a sample of every 997th f32 bit pattern (both signs, NaNs, infinities, denormals).
TEST(ExactMath, ExpOfManyIsExpBitForBit) {
  std::vector<float> x, y;
  for (uint64_t b = 0; b <= 0xffffffffull; b += 997) x.push_back(switchboard::f32_from_bits(static_cast<uint32_t>(b)));
  for (float v : {0.0f, -0.0f, 88.0f, 88.0001f, -87.0f, -87.0001f, 1e-30f, -1e-30f}) x.push_back(v);
  y.resize(x.size());
  switchboard::exact::exp_n(x.data(), y.data(), static_cast<int>(x.size()));
  size_t differ = 0;
  for (size_t i = 0; i < x.size(); ++i)
    differ += switchboard::f32_bits(y[i]) != switchboard::f32_bits(switchboard::exact::exp(x[i]));
  EXPECT_EQ(differ, 0u) << "of " << x.size();
}

// exact::silu_n (the conv's SiLUs side by side) gives exact::silu's bits, in place too.
TEST(ExactMath, SiluOfManyIsSiluBitForBit) {
  std::vector<float> x;
  for (uint64_t b = 0; b <= 0xffffffffull; b += 997) x.push_back(switchboard::f32_from_bits(static_cast<uint32_t>(b)));
  for (float v : {0.0f, -0.0f, 88.0f, -88.0f, 87.5f, -87.5f, 20.0f, -20.0f}) x.push_back(v);
  std::vector<float> y = x;
  switchboard::exact::silu_n(y.data(), y.data(), static_cast<int>(y.size()));
  size_t differ = 0;
  for (size_t i = 0; i < x.size(); ++i)
    differ += !(std::isnan(y[i]) && std::isnan(x[i])) &&
              switchboard::f32_bits(y[i]) != switchboard::f32_bits(switchboard::exact::silu(x[i]));
  EXPECT_EQ(differ, 0u) << "of " << x.size();
}
