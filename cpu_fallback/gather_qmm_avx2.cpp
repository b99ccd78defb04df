// GatherQmm for x86 CPUs with AVX2 but without AVX-512 VNNI. Same repacked tiles
// as gather_qmm_x86.cpp, 8 rows per register: u8 codes x s8 activations go
// through vpmaddubsw + vpmaddwd. vpmaddubsw saturates pair sums at 2^15, so codes
// are always split into fields of at most 4 bits (pair sums <= 2 * 15 * 127).
// The float steps are the contract's, lane = output row: same bits as every path.
#include "gather_qmm_x86.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include "x86_intrin.h"

#include <cstring>

namespace switchboard::cpu::x86 {

bool avx2_available() {
  // clang's __builtin_cpu_supports does not know "f16c": read CPUID leaf 1 (ECX bit 29).
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
  }();
  return ok;
}

namespace {

constexpr int kTile = 16;
#define SB_AVX2 __attribute__((target("avx2,f16c")))

SB_AVX2 inline __m256i dot4(__m256i codes, const int8_t* x) {
  int32_t v;
  std::memcpy(&v, x, 4);
  return _mm256_madd_epi16(_mm256_maddubs_epi16(codes, _mm256_set1_epi32(v)), _mm256_set1_epi16(1));
}

SB_AVX2 inline __m256 load8(const uint8_t* p, DType t) {
  if (t == DType::kF32) return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if (t == DType::kF16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));  // bf16
}

// Iq of one 32-block for the 8 rows of half h of a tile.
template <int FMT>
SB_AVX2 inline __m256i block_dot(const uint8_t* codes, int64_t j, int h, const int8_t* x) {
  constexpr int kChunks = FMT == 4 ? 4 : FMT == 2 ? 2 : 8;
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03);
  __m256i acc = _mm256_setzero_si256();
  for (int c = 0; c < kChunks; ++c) {
    const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(codes + (j * kChunks + c) * 64 + h * 32));
    if constexpr (FMT == 4) {
      const int64_t k = j * 32 + c * 8;
      acc = _mm256_add_epi32(acc, dot4(_mm256_and_si256(v, m4), x + k));
      acc = _mm256_add_epi32(acc, dot4(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), x + k + 4));
    } else if constexpr (FMT == 2) {
      const int64_t k = j * 32 + c * 16;
      for (int i = 0; i < 4; ++i) acc = _mm256_add_epi32(acc, dot4(_mm256_and_si256(_mm256_srli_epi16(v, 2 * i), m2), x + k + 4 * i));
    } else {
      const int64_t k = j * 32 + c * 4;
      const __m256i lo = dot4(_mm256_and_si256(v, m4), x + k);
      const __m256i hi = dot4(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), x + k);
      acc = _mm256_add_epi32(acc, _mm256_add_epi32(lo, _mm256_slli_epi32(hi, 4)));
    }
  }
  return acc;
}

// One token row against one 16-row tile, the whole K.
template <int FMT>
SB_AVX2 void tile_row(const Repacked& rp, const uint8_t* codes, const uint8_t* sb, const int8_t* x, const float* d,
                      const float* xg, float* out) {
  const int64_t per = rp.group_size / kQ8Block;
  const size_t es = dtype_size(rp.scale_dtype);
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t g = 0; g < rp.groups; ++g) {
    __m256 p[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t j = g * per; j < (g + 1) * per; ++j)
      for (int h = 0; h < 2; ++h)
        p[h] = _mm256_add_ps(p[h], _mm256_mul_ps(_mm256_cvtepi32_ps(block_dot<FMT>(codes, j, h, x)), _mm256_set1_ps(d[j])));
    const uint8_t* gsb = sb + g * 2 * kTile * es;
    const __m256 xgv = _mm256_set1_ps(xg[g]);
    for (int h = 0; h < 2; ++h) {
      const __m256 s = load8(gsb + h * 8 * es, rp.scale_dtype), b = load8(gsb + (kTile + h * 8) * es, rp.scale_dtype);
      acc[h] = _mm256_add_ps(acc[h], _mm256_add_ps(_mm256_mul_ps(s, p[h]), _mm256_mul_ps(b, xgv)));
    }
  }
  _mm256_storeu_ps(out, acc[0]);
  _mm256_storeu_ps(out + 8, acc[1]);
}

#undef SB_AVX2

template <int FMT>
void tiles(const Repacked& rp, int e, const Q8Activations& xq, const float* xg, const int64_t* rows, int64_t count,
           int64_t tile0, int64_t tile1, float* out, int64_t stride) {
  const int64_t tile_codes = rp.k * FMT / 8 * kTile;
  const int64_t tile_sb = rp.groups * 2 * kTile * static_cast<int64_t>(dtype_size(rp.scale_dtype));
  const int64_t blocks = xq.k / kQ8Block;
  alignas(32) float tmp[kTile];
  for (int64_t i = 0; i < count; ++i) {
    const int64_t r = rows[i];
    for (int64_t tile = tile0; tile < tile1; ++tile) {
      tile_row<FMT>(rp, rp.codes.get() + rp.code_offset[e] + tile * tile_codes, rp.sb.get() + rp.sb_offset[e] + tile * tile_sb,
                    xq.q.data() + r * xq.k, xq.d.data() + r * blocks, xg + r * rp.groups, tmp);
      const int64_t n0 = tile * kTile, valid = std::min<int64_t>(kTile, rp.n - n0);
      std::memcpy(out + i * stride + (n0 - tile0 * kTile), tmp, static_cast<size_t>(valid) * 4);
    }
  }
}

}  // namespace

void qmm_tiles_avx2(const Repacked& r, int e, const Q8Activations& xq, const float* xg, const int64_t* rows,
                    int64_t count, int64_t tile0, int64_t tile1, float* out, int64_t out_stride) {
  switch (r.format[e]) {
    case 4: tiles<4>(r, e, xq, xg, rows, count, tile0, tile1, out, out_stride); break;
    case 2: tiles<2>(r, e, xq, xg, rows, count, tile0, tile1, out, out_stride); break;
    case 8: tiles<8>(r, e, xq, xg, rows, count, tile0, tile1, out, out_stride); break;
    default: break;
  }
}

}  // namespace switchboard::cpu::x86

#else

namespace switchboard::cpu::x86 {
bool avx2_available() { return false; }
void qmm_tiles_avx2(const Repacked&, int, const Q8Activations&, const float*, const int64_t*, int64_t, int64_t, int64_t,
                    float*, int64_t) {}
}  // namespace switchboard::cpu::x86

#endif
