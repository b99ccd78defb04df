// dot32 (docs/numerics.md: 32 strided partial sums, product then add, then the halving tree)
// and the vector helpers of the float kernels, per SIMD path; every path gives the same bits.
#include <cstdint>
#if defined(__x86_64__)
#include "x86_intrin.h"
#endif

#include "cpu_common.h"
#include "exact_math.h"
#if defined(__x86_64__)
#include "exact_math_avx512.h"
#endif
#include "gather_qmm.h"

namespace switchboard::cpu {

namespace {

float dot32_portable(const float* x, const float* w, int64_t k) {
  float part[32] = {};
  for (int64_t i = 0; i < k; ++i) part[i & 31] = part[i & 31] + x[i] * w[i];
  for (int s = 16; s >= 1; s >>= 1)
    for (int i = 0; i < s; ++i) part[i] = part[i] + part[i + s];
  return part[0];
}

#if defined(__x86_64__)
// The same 32 partial sums as vectors (separate multiply and add, never fused). Masked
// tail lanes add a +0 product, which leaves a partial unchanged: a partial starts at +0
// and a round-to-nearest sum is -0 only when both terms are, so it is never -0.
// The halving tree over the 32 partials held as p0 = [0, 16), p1 = [16, 32).
__attribute__((target("avx512f"))) inline float tree512(__m512 p0, __m512 p1) {
  const __m512 s16 = _mm512_add_ps(p0, p1);  // [j] = p[j] + p[j + 16]
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(s16),
                                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s16), 1)));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

__attribute__((target("avx512f"))) float dot32_avx512(const float* x, const float* w, int64_t k) {
  __m512 p0 = _mm512_setzero_ps(), p1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    p0 = _mm512_add_ps(p0, _mm512_mul_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(w + i)));
    p1 = _mm512_add_ps(p1, _mm512_mul_ps(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(w + i + 16)));
  }
  if (i < k) {
    const int64_t r = k - i;
    const __mmask16 m0 = static_cast<__mmask16>(r >= 16 ? 0xffff : (1u << r) - 1);
    const __mmask16 m1 = static_cast<__mmask16>(r <= 16 ? 0 : (1u << (r - 16)) - 1);
    p0 = _mm512_add_ps(p0, _mm512_mul_ps(_mm512_maskz_loadu_ps(m0, x + i), _mm512_maskz_loadu_ps(m0, w + i)));
    p1 = _mm512_add_ps(p1, _mm512_mul_ps(_mm512_maskz_loadu_ps(m1, x + i + 16), _mm512_maskz_loadu_ps(m1, w + i + 16)));
  }
  return tree512(p0, p1);
}

__attribute__((target("avx2"))) float dot32_avx2(const float* x, const float* w, int64_t k) {
  __m256 p[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= k; i += 32)
    for (int q = 0; q < 4; ++q)
      p[q] = _mm256_add_ps(p[q], _mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * q), _mm256_loadu_ps(w + i + 8 * q)));
  if (i < k) {
    for (int q = 0; q < 4; ++q) {
      alignas(32) int32_t lane[8];
      for (int l = 0; l < 8; ++l) lane[l] = i + 8 * q + l < k ? -1 : 0;
      const __m256i m = _mm256_load_si256(reinterpret_cast<const __m256i*>(lane));
      p[q] = _mm256_add_ps(p[q], _mm256_mul_ps(_mm256_maskload_ps(x + i + 8 * q, m), _mm256_maskload_ps(w + i + 8 * q, m)));
    }
  }
  const __m256 s8 = _mm256_add_ps(_mm256_add_ps(p[0], p[2]), _mm256_add_ps(p[1], p[3]));  // 16, then 8
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

// Four rows' dot32 in one pass over x: the same partials and tree per row as dot32_avx512,
// four independent chains at once.
__attribute__((target("avx512f"))) void dot32_x4_avx512(const float* x, const float* const* w, int64_t k,
                                                         float* out) {
  __m512 p[4][2];
  for (int q = 0; q < 4; ++q) p[q][0] = p[q][1] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    const __m512 x0 = _mm512_loadu_ps(x + i), x1 = _mm512_loadu_ps(x + i + 16);
    for (int q = 0; q < 4; ++q) {
      p[q][0] = _mm512_add_ps(p[q][0], _mm512_mul_ps(x0, _mm512_loadu_ps(w[q] + i)));
      p[q][1] = _mm512_add_ps(p[q][1], _mm512_mul_ps(x1, _mm512_loadu_ps(w[q] + i + 16)));
    }
  }
  if (i < k) {
    const int64_t r = k - i;
    const __mmask16 m0 = static_cast<__mmask16>(r >= 16 ? 0xffff : (1u << r) - 1);
    const __mmask16 m1 = static_cast<__mmask16>(r <= 16 ? 0 : (1u << (r - 16)) - 1);
    const __m512 x0 = _mm512_maskz_loadu_ps(m0, x + i), x1 = _mm512_maskz_loadu_ps(m1, x + i + 16);
    for (int q = 0; q < 4; ++q) {
      p[q][0] = _mm512_add_ps(p[q][0], _mm512_mul_ps(x0, _mm512_maskz_loadu_ps(m0, w[q] + i)));
      p[q][1] = _mm512_add_ps(p[q][1], _mm512_mul_ps(x1, _mm512_maskz_loadu_ps(m1, w[q] + i + 16)));
    }
  }
  for (int q = 0; q < 4; ++q) out[q] = tree512(p[q][0], p[q][1]);
}

__attribute__((target("avx512f"))) void axpy_avx512(float* y, float a, const float* v, int64_t n) {
  const __m512 av = _mm512_set1_ps(a);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, _mm512_add_ps(_mm512_loadu_ps(y + i), _mm512_mul_ps(av, _mm512_loadu_ps(v + i))));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(y + i, m,
                          _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + i), _mm512_mul_ps(av, _mm512_maskz_loadu_ps(m, v + i))));
  }
}

// axpy over rows, the y columns in registers through the rows (chunks of 128 columns).
__attribute__((target("avx512f"))) void axpy_rows_avx512(float* y, const float* a, const float* v, int64_t stride,
                                                         int64_t rows, int64_t n) {
  for (int64_t c0 = 0; c0 < n; c0 += 128) {
    const int64_t w = n - c0 < 128 ? n - c0 : 128;
    __mmask16 m[8];
    __m512 acc[8];
    for (int q = 0; q < 8; ++q) {
      const int64_t left = w - 16 * q;
      m[q] = left >= 16  ? static_cast<__mmask16>(0xffff)
             : left <= 0 ? static_cast<__mmask16>(0)
                         : static_cast<__mmask16>((1u << left) - 1);
      acc[q] = _mm512_maskz_loadu_ps(m[q], y + c0 + 16 * q);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const __m512 av = _mm512_set1_ps(a[r]);
      const float* vr = v + r * stride + c0;
      for (int q = 0; q < 8; ++q)
        acc[q] = _mm512_add_ps(acc[q], _mm512_mul_ps(av, _mm512_maskz_loadu_ps(m[q], vr + 16 * q)));
    }
    for (int q = 0; q < 8; ++q) _mm512_mask_storeu_ps(y + c0 + 16 * q, m[q], acc[q]);
  }
}

__attribute__((target("avx512f,avx512dq"))) int exp_avx512(float* x, int n) {
  int i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, exact::avx512::exp(_mm512_loadu_ps(x + i)));
  return i;
}

__attribute__((target("avx2"))) void axpy_avx2(float* y, float a, const float* v, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_mul_ps(av, _mm256_loadu_ps(v + i))));
  for (; i < n; ++i) y[i] = y[i] + a * v[i];
}
#endif

}  // namespace

float dot32(const float* x, const float* w, int64_t k) {
#if defined(__x86_64__)
  const CpuPath path = active_cpu_path();
  if (path >= CpuPath::kAvx512Vnni) return dot32_avx512(x, w, k);
  if (path >= CpuPath::kAvx2) return dot32_avx2(x, w, k);
#endif
  return dot32_portable(x, w, k);
}

void dot32_x4(const float* x, const float* const* w, int64_t k, float* out) {
#if defined(__x86_64__)
  if (active_cpu_path() >= CpuPath::kAvx512Vnni) return dot32_x4_avx512(x, w, k, out);
#endif
  for (int q = 0; q < 4; ++q) out[q] = dot32(x, w[q], k);
}

void axpy(float* y, float a, const float* v, int64_t n) {
#if defined(__x86_64__)
  const CpuPath path = active_cpu_path();
  if (path >= CpuPath::kAvx512Vnni) return axpy_avx512(y, a, v, n);
  if (path >= CpuPath::kAvx2) return axpy_avx2(y, a, v, n);
#endif
  for (int64_t i = 0; i < n; ++i) y[i] = y[i] + a * v[i];
}

void axpy_rows(float* y, const float* a, const float* v, int64_t stride, int64_t rows, int64_t n) {
#if defined(__x86_64__)
  if (active_cpu_path() >= CpuPath::kAvx512Vnni) return axpy_rows_avx512(y, a, v, stride, rows, n);
#endif
  for (int64_t r = 0; r < rows; ++r) axpy(y, a[r], v + r * stride, n);
}

void exp_inplace(float* x, int n) {
  int i = 0;
#if defined(__x86_64__)
  if (active_cpu_path() >= CpuPath::kAvx512Vnni) i = exp_avx512(x, n);
#endif
  exact::exp_n(x + i, x + i, n - i);
}

}  // namespace switchboard::cpu
