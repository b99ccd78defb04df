// Helpers shared by the benchmarks.
#pragma once

#include <cstdint>

#include "switchboard/tensor.h"

namespace switchboard::bench {

// n pseudo-random u32 words (xorshift64 from `seed`): any bit pattern is a valid code stream.
inline Tensor random_words(int64_t n, uint64_t seed) {
  Tensor t = Tensor::zeros(DType::kU32, {n}).value();
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < n; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    t.mutable_data_as<uint32_t>()[i] = static_cast<uint32_t>(x);
  }
  return t;
}

}  // namespace switchboard::bench
