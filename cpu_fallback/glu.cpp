// Gated activations: SwiGLU, GEGLU (tanh approximation) and gpt-oss's clamped SwiGLU.
#include "cpu_common.h"
#include "exact_math.h"
#include "gather_qmm_x86.h"
#if defined(__x86_64__)
#include "exact_math_avx512.h"
#endif

namespace switchboard::cpu {

namespace {
float glu(fb::GluKind kind, float g, float u, float alpha, float limit) {
  switch (kind) {
    case fb::GluKind::SwiGLU: return exact::silu(g) * u;
    case fb::GluKind::GEGLU: return exact::gelu_tanh(g) * u;
    case fb::GluKind::ClampedSwiGLU: {
      const float gc = min_f32(g, limit);
      const float uc = max_f32(min_f32(u, limit), -limit);
      return (gc * exact::sigmoid(alpha * gc)) * (uc + 1.0f);
    }
  }
  return 0.0f;
}

// silu(g) * u over whole 16-lane vectors; returns how many elements it did.
#if defined(__x86_64__)
__attribute__((target("avx512f,avx512dq"))) int64_t swiglu_f32_avx512(const float* g, const float* u, float* out,
                                                                        int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(out + i, _mm512_mul_ps(exact::avx512::silu(_mm512_loadu_ps(g + i)), _mm512_loadu_ps(u + i)));
  return i;
}
#else
int64_t swiglu_f32_avx512(const float*, const float*, float*, int64_t) { return 0; }
#endif

Status glu_kernel(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsGluNode();
  SB_ASSIGN_OR_RETURN(Tensor g, ctx.in(n->gate.get()));
  SB_ASSIGN_OR_RETURN(Tensor u, ctx.in(n->up.get()));
  SB_CHECK_OR_RETURN(g.shape() == u.shape(), StatusCode::kInvalidArgument, "gate %s and up %s differ",
                     shape_str(g.shape()).c_str(), shape_str(u.shape()).c_str());
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(g.dtype(), g.shape()));
  int64_t i = 0;
  if (n->kind == fb::GluKind::SwiGLU && g.dtype() == DType::kF32 && fast_paths_enabled())
    i = swiglu_f32_avx512(g.data_as<float>(), u.data_as<float>(), out.mutable_data_as<float>(), g.numel());
  for (; i < g.numel(); ++i)
    store_f32(out.mutable_data(), g.dtype(), i,
              glu(n->kind, load_f32(g.data(), g.dtype(), i), load_f32(u.data(), u.dtype(), i), n->alpha, n->limit));
  return ctx.out(n->out.get(), std::move(out));
}

}  // namespace

void register_glu_kernels(KernelRegistry& r) { r.add(fb::OpNode::GluNode, glu_kernel); }

}  // namespace switchboard::cpu
