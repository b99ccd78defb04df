// GatherMm: float experts. Each output is dot32 (docs/numerics.md): 32 strided
// partial sums (product, then add) combined by a fixed halving tree.
#include <vector>
#if defined(__x86_64__)
#include "x86_intrin.h"
#endif

#include "cpu_common.h"
#include "gather_qmm.h"
#include "parallel.h"

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
  const __m512 s16 = _mm512_add_ps(p0, p1);  // [j] = p[j] + p[j + 16]
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(s16),
                                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s16), 1)));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
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

namespace {

Status gather_mm(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsGatherMmNode();
  SB_ASSIGN_OR_RETURN(Tensor x, ctx.in(n->x.get()));
  SB_ASSIGN_OR_RETURN(Tensor w, ctx.in(n->w.get()));
  const int64_t rows = x.dim(0), k = x.dim(1), experts = w.dim(0), nout = w.dim(1);
  SB_CHECK_OR_RETURN(w.dim(2) == k, StatusCode::kInvalidArgument, "w %s does not match K = %lld",
                     shape_str(w.shape()).c_str(), (long long)k);
  SB_ASSIGN_OR_RETURN(std::vector<int64_t> rhs, read_indices(ctx, n->rhs_indices, "rhs_indices", experts));
  SB_ASSIGN_OR_RETURN(std::vector<int64_t> lhs, read_indices(ctx, n->lhs_indices, "lhs_indices", rows));
  const int64_t pairs = n->rhs_indices ? static_cast<int64_t>(rhs.size()) : n->lhs_indices ? static_cast<int64_t>(lhs.size()) : rows;
  SB_CHECK_OR_RETURN((!n->lhs_indices || static_cast<int64_t>(lhs.size()) == pairs) &&
                         (n->lhs_indices || rows == 0 || pairs % rows == 0),
                     StatusCode::kInvalidArgument, "index lengths do not match (%lld pairs, %lld rows)",
                     (long long)pairs, (long long)rows);
  std::vector<float> x_store, w_store;
  const float *xf = f32_data(x, &x_store), *wf = f32_data(w, &w_store);
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::zeros(x.dtype(), {pairs, nout}));
  parallel_for(pairs, 1, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      const int64_t r = n->lhs_indices ? lhs[p] : (rows ? p * rows / pairs : 0), ex = n->rhs_indices ? rhs[p] : 0;
      for (int64_t j = 0; j < nout; ++j)
        store_f32(out.mutable_data(), out.dtype(), p * nout + j, dot32(xf + r * k, wf + (ex * nout + j) * k, k));
    }
  });
  return ctx.out(n->out.get(), std::move(out));
}

}  // namespace

void register_gather_mm_kernels(KernelRegistry& r) { r.add(fb::OpNode::GatherMmNode, gather_mm); }

}  // namespace switchboard::cpu
