// 16-lane AVX-512 versions of exact_math.h: the same operations in the same
// order on each lane, so every lane's bits equal the scalar routine's.
#pragma once

#include "x86_intrin.h"

namespace switchboard::exact::avx512 {

#define SB_AVX512 __attribute__((target("avx512f,avx512dq")))

SB_AVX512 inline __m512 round_even(__m512 v) {
  const __m512 magic = _mm512_set1_ps(12582912.0f);
  return _mm512_sub_ps(_mm512_add_ps(v, magic), magic);
}

SB_AVX512 inline __m512 exp(__m512 x) {
  // Lanes outside [-87, 88] (and NaN) are computed on a clamped value, then replaced.
  const __m512 xc = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
  const __m512 n = round_even(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504f)));
  __m512 r = _mm512_sub_ps(xc, _mm512_mul_ps(n, _mm512_set1_ps(0.693145751953125f)));
  r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(1.42860677e-06f)));
  __m512 p = _mm512_set1_ps(1.38888889e-03f);
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(8.33333333e-03f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(4.16666667e-02f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.66666667e-01f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(0.5f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.0f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
  __m512 y = _mm512_mul_ps(p, _mm512_castsi512_ps(e));
  y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(88.0f), _CMP_GT_OQ), y, _mm512_set1_ps(__builtin_inff()));
  y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ), y, _mm512_setzero_ps());
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), y, x);
}

SB_AVX512 inline __m512 rcp(__m512 x) {
  __m512 r = _mm512_castsi512_ps(_mm512_sub_epi32(_mm512_set1_epi32(0x7EF311C3), _mm512_castps_si512(x)));
  const __m512 two = _mm512_set1_ps(2.0f);
  for (int i = 0; i < 3; ++i) r = _mm512_mul_ps(r, _mm512_sub_ps(two, _mm512_mul_ps(x, r)));
  // !(x <= 2^125): NaN stays NaN, anything larger (and +inf) gives +0.
  const __mmask16 big = _mm512_cmp_ps_mask(x, _mm512_set1_ps(4.2535296e37f), _CMP_NLE_UQ);
  const __m512 big_value = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_setzero_ps(), x);
  return _mm512_mask_blend_ps(big, r, big_value);
}

SB_AVX512 inline __m512 sigmoid(__m512 x) {
  const __m512 neg = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN)));
  return rcp(_mm512_add_ps(_mm512_set1_ps(1.0f), exp(neg)));
}

SB_AVX512 inline __m512 silu(__m512 x) { return _mm512_mul_ps(x, sigmoid(x)); }

#undef SB_AVX512

}  // namespace switchboard::exact::avx512
