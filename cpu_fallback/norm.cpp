// Row normalizations along the last axis: softmax and RMSNorm, in the fixed order
// of docs/numerics.md (sequential sums in index order, the exact routines).
#include "cpu_common.h"
#include "exact_math.h"
#include "parallel.h"

namespace switchboard::cpu {
namespace {

// out = e * rcp(sum e), e_i = exp(x_i - m), m the running max in index order.
void softmax_row(const float* x, float* out, int64_t d) {
  float m = x[0];
  for (int64_t i = 0; i < d; ++i) m = max_f32(m, x[i]);
  float sum = 0.0f;
  for (int64_t i = 0; i < d; ++i) {
    out[i] = exact::exp(x[i] - m);
    sum = sum + out[i];
  }
  const float r = exact::rcp(sum);
  for (int64_t i = 0; i < d; ++i) out[i] = out[i] * r;
}

Status softmax(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsSoftmaxNode();
  SB_ASSIGN_OR_RETURN(Tensor x, ctx.in(n->x.get()));
  const int64_t d = x.dim(x.rank() - 1), rows = d ? x.numel() / d : 0;
  const std::vector<float> xf = widen_f32(x);
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(x.dtype(), x.shape()));
  parallel_for(rows, 1, [&](int64_t r0, int64_t r1) {
    std::vector<float> row(static_cast<size_t>(d));
    for (int64_t r = r0; r < r1; ++r) {
      softmax_row(xf.data() + r * d, row.data(), d);
      for (int64_t i = 0; i < d; ++i) store_f32(out.mutable_data(), out.dtype(), r * d + i, row[i]);
    }
  });
  return ctx.out(n->out.get(), std::move(out));
}

Status rms_norm(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsRmsNormNode();
  SB_ASSIGN_OR_RETURN(Tensor x, ctx.in(n->x.get()));
  SB_ASSIGN_OR_RETURN(Tensor w, ctx.in(n->weight.get()));
  const int64_t d = x.dim(x.rank() - 1), rows = d ? x.numel() / d : 0;
  SB_CHECK_OR_RETURN(w.numel() == d, StatusCode::kInvalidArgument, "weight %s does not match the last dim %lld",
                     shape_str(w.shape()).c_str(), (long long)d);
  const std::vector<float> wf = widen_f32(w);
  Tensor res, sum;
  if (n->residual) {  // s = round(x + residual): Binary Add's bits, written to `sum`
    SB_ASSIGN_OR_RETURN(res, ctx.in(n->residual.get()));
    SB_CHECK_OR_RETURN(res.shape() == x.shape() && res.dtype() == x.dtype(), StatusCode::kInvalidArgument,
                       "residual %s does not match x %s", shape_str(res.shape()).c_str(), shape_str(x.shape()).c_str());
    SB_ASSIGN_OR_RETURN(sum, Tensor::uninitialized(x.dtype(), x.shape()));
  }
  Tensor gate;
  if (n->gate) {  // gated: out = round(round(x r w) * silu(gate))
    SB_ASSIGN_OR_RETURN(gate, ctx.in(n->gate.get()));
    SB_CHECK_OR_RETURN(gate.shape() == x.shape() && gate.dtype() == x.dtype(), StatusCode::kInvalidArgument,
                       "gate %s does not match x %s", shape_str(gate.shape()).c_str(), shape_str(x.shape()).c_str());
  }
  const bool tree = n->order == fb::NormOrder::Tree32;
  const float inv_d = inverse_count(d);
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(x.dtype(), x.shape()));
  // Row by row on every thread: the row widened (and summed with the residual), then normalized.
  parallel_for(rows, 1, [&](int64_t r0, int64_t r1) {
    std::vector<float> xr(static_cast<size_t>(d));
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t i = 0; i < d; ++i) xr[static_cast<size_t>(i)] = load_f32(x.data(), x.dtype(), r * d + i);
      if (sum.defined())
        for (int64_t i = 0; i < d; ++i) {
          store_f32(sum.mutable_data(), sum.dtype(), r * d + i,
                    xr[static_cast<size_t>(i)] + load_f32(res.data(), res.dtype(), r * d + i));
          xr[static_cast<size_t>(i)] = load_f32(sum.data(), sum.dtype(), r * d + i);
        }
      const float inv = rms_scale(xr.data(), d, inv_d, n->eps, tree);
      for (int64_t i = 0; i < d; ++i) {
        float y = (xr[static_cast<size_t>(i)] * inv) * wf[static_cast<size_t>(i)];
        if (gate.defined()) y = round_to(y, out.dtype()) * exact::silu(load_f32(gate.data(), gate.dtype(), r * d + i));
        store_f32(out.mutable_data(), out.dtype(), r * d + i, y);
      }
    }
  });
  if (sum.defined()) SB_RETURN_IF_ERROR(ctx.out(n->sum.get(), std::move(sum)));
  return ctx.out(n->out.get(), std::move(out));
}

}  // namespace

float rms_scale(const float* x, int64_t d, float inv_d, float eps, bool tree) {
  float ss = 0.0f;
  if (tree) {
    ss = dot32(x, x, d);
  } else {
    for (int64_t i = 0; i < d; ++i) ss = ss + x[i] * x[i];
  }
  return exact::rsqrt(ss * inv_d + eps);
}

void register_norm_kernels(KernelRegistry& r) {
  r.add(fb::OpNode::SoftmaxNode, softmax);
  r.add(fb::OpNode::RmsNormNode, rms_norm);
}

}  // namespace switchboard::cpu
