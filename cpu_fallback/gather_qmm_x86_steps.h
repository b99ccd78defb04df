// The float steps of the GatherQmm contract (docs/numerics.md) on 16 output rows
// at once (lane = output row), shared by the AVX-512 VNNI path
// (gather_qmm_x86.cpp) and the AMX path (gather_qmm_amx.cpp): both feed them the
// same exact int32 block sums Iq_j, so both give the portable path's bits.
#pragma once

#if defined(__x86_64__)
#include "x86_intrin.h"

#include <cstdint>

#include "switchboard/dtype.h"

namespace switchboard::cpu::x86::steps {

#define SB_STEPS_AVX512 __attribute__((target("avx512f")))

// 16 scales or biases in the source dtype, widened exactly to f32.
SB_STEPS_AVX512 inline __m512 load16(const uint8_t* p, DType t) {
  if (t == DType::kF32) return _mm512_loadu_ps(p);
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  if (t == DType::kF16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));  // bf16
}

// One 32-block: P = P + float(Iq_j) * d_j (the product is exact, d_j a power of two).
SB_STEPS_AVX512 inline __m512 block_step(__m512 p, __m512i iq, __m512 d) {
  return _mm512_add_ps(p, _mm512_mul_ps(_mm512_cvtepi32_ps(iq), d));
}

// One weight group: acc = acc + (s_g * P + b_g * X_g): two products, their sum, then the add.
SB_STEPS_AVX512 inline __m512 group_step(__m512 acc, __m512 s, __m512 b, __m512 p, __m512 x) {
  return _mm512_add_ps(acc, _mm512_add_ps(_mm512_mul_ps(s, p), _mm512_mul_ps(b, x)));
}

#undef SB_STEPS_AVX512

}  // namespace switchboard::cpu::x86::steps

#endif
