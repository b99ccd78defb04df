// Weighted combine of expert outputs with an optional (sigmoid-gated) shared expert.
#include "cpu_common.h"
#include "exact_math.h"

namespace switchboard::cpu {

Status combine_rows(const float* y, const Tensor& weights, const Tensor& shared, const Tensor& gate, int64_t tokens,
                    int64_t slots, int64_t dim, Tensor& out) {
  SB_CHECK_OR_RETURN(weights.dim(0) == tokens && weights.dim(1) == slots, StatusCode::kInvalidArgument,
                     "weights %s, expected [%lld, %lld]", shape_str(weights.shape()).c_str(), (long long)tokens,
                     (long long)slots);
  if (shared.defined())
    SB_CHECK_OR_RETURN(shared.shape() == (Shape{tokens, dim}), StatusCode::kInvalidArgument,
                       "shared %s, expected [%lld, %lld]", shape_str(shared.shape()).c_str(), (long long)tokens,
                       (long long)dim);
  if (gate.defined())
    SB_CHECK_OR_RETURN(gate.shape() == (Shape{tokens, 1}), StatusCode::kInvalidArgument,
                       "shared_gate %s, expected [%lld, 1]", shape_str(gate.shape()).c_str(), (long long)tokens);
  const float* w = weights.data_as<float>();
  for (int64_t t = 0; t < tokens; ++t) {
    const float sg = gate.defined() ? exact::sigmoid(load_f32(gate.data(), gate.dtype(), t)) : 1.0f;
    for (int64_t d = 0; d < dim; ++d) {
      float acc = 0.0f;
      if (shared.defined()) {
        const float s = load_f32(shared.data(), shared.dtype(), t * dim + d);
        acc = gate.defined() ? sg * s : s;
      }
      for (int64_t j = 0; j < slots; ++j) acc = acc + w[t * slots + j] * y[(t * slots + j) * dim + d];
      store_f32(out.mutable_data(), out.dtype(), t * dim + d, acc);
    }
  }
  return Status::ok();
}

namespace {

Status combine(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsCombineNode();
  SB_ASSIGN_OR_RETURN(Tensor y, ctx.in(n->y.get()));
  SB_ASSIGN_OR_RETURN(Tensor weights, ctx.in(n->weights.get()));
  Tensor shared, gate;
  if (n->shared) {
    SB_ASSIGN_OR_RETURN(shared, ctx.in(n->shared.get()));
  }
  if (n->shared_gate) {
    SB_ASSIGN_OR_RETURN(gate, ctx.in(n->shared_gate.get()));
  }
  const int64_t tokens = weights.dim(0), slots = weights.dim(1), dim = y.dim(1);
  SB_CHECK_OR_RETURN(y.dim(0) == tokens * slots, StatusCode::kInvalidArgument, "y %s does not hold %lld x %lld rows",
                     shape_str(y.shape()).c_str(), (long long)tokens, (long long)slots);
  const float* yf = y.data_as<float>();
  Tensor wide;
  if (y.dtype() != DType::kF32) {
    SB_ASSIGN_OR_RETURN(wide, Tensor::uninitialized(DType::kF32, y.shape()));
    for (int64_t i = 0; i < y.numel(); ++i) wide.mutable_data_as<float>()[i] = load_f32(y.data(), y.dtype(), i);
    yf = wide.data_as<float>();
  }
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(y.dtype(), {tokens, dim}));
  SB_RETURN_IF_ERROR(combine_rows(yf, weights, shared, gate, tokens, slots, dim, out));
  return ctx.out(n->out.get(), std::move(out));
}

}  // namespace

void register_combine_kernels(KernelRegistry& r) { r.add(fb::OpNode::CombineNode, combine); }

}  // namespace switchboard::cpu
