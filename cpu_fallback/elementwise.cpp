// Binary (broadcasting) and unary elementwise kernels.
#include <algorithm>
#include <cmath>

#include "cpu_common.h"
#include "exact_math.h"

namespace switchboard::cpu {

namespace {

float apply_f(fb::BinaryOp op, float a, float b) {
  switch (op) {
    case fb::BinaryOp::Add: return a + b;
    case fb::BinaryOp::Sub: return a - b;
    case fb::BinaryOp::Mul: return a * b;
    case fb::BinaryOp::Div: return a / b;
    case fb::BinaryOp::Max: return max_f32(a, b);
    case fb::BinaryOp::Min: return min_f32(a, b);
    case fb::BinaryOp::FloorDiv: return 0.f;  // rejected by the validator
  }
  return 0.f;
}

int64_t apply_i(fb::BinaryOp op, int64_t a, int64_t b) {
  auto ua = static_cast<uint64_t>(a), ub = static_cast<uint64_t>(b);
  switch (op) {
    case fb::BinaryOp::Add: return static_cast<int64_t>(ua + ub);  // wraps, no UB
    case fb::BinaryOp::Sub: return static_cast<int64_t>(ua - ub);
    case fb::BinaryOp::Mul: return static_cast<int64_t>(ua * ub);
    case fb::BinaryOp::Max: return std::max(a, b);
    case fb::BinaryOp::Min: return std::min(a, b);
    case fb::BinaryOp::Div: return 0;  // rejected by the validator
    case fb::BinaryOp::FloorDiv: {
      if (b == 0) return 0;                          // binary() reports division by zero before calling
      if (a == INT64_MIN && b == -1) return INT64_MIN;  // wraps, like the other integer ops
      int64_t q = a / b;
      return (a % b != 0 && ((a % b < 0) != (b < 0))) ? q - 1 : q;
    }
  }
  return 0;
}

Status binary(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsBinaryNode();
  SB_ASSIGN_OR_RETURN(Tensor a, ctx.in(n->a.get()));
  SB_ASSIGN_OR_RETURN(Tensor b, ctx.in(n->b.get()));
  SB_ASSIGN_OR_RETURN(Shape shape, broadcast_shape(a.shape(), b.shape()));
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::zeros(a.dtype(), shape));
  std::vector<int64_t> sa = broadcast_strides(a.shape(), shape), sb = broadcast_strides(b.shape(), shape);
  const int64_t n_out = out.numel(), rank = static_cast<int64_t>(shape.size());
  const bool is_float = dtype_is_float(a.dtype());
  if (n->op == fb::BinaryOp::FloorDiv)
    for (int64_t i = 0; i < b.numel(); ++i)
      SB_CHECK_OR_RETURN(load_i64(b.data(), b.dtype(), i) != 0, StatusCode::kInvalidArgument, "FloorDiv by zero");
  std::vector<int64_t> idx(shape.size(), 0);
  int64_t ia = 0, ib = 0;
  for (int64_t i = 0; i < n_out; ++i) {
    if (is_float) store_f32(out.mutable_data(), a.dtype(), i, apply_f(n->op, load_f32(a.data(), a.dtype(), ia), load_f32(b.data(), b.dtype(), ib)));
    else store_i64(out.mutable_data(), a.dtype(), i, apply_i(n->op, load_i64(a.data(), a.dtype(), ia), load_i64(b.data(), b.dtype(), ib)));
    // Odometer over the output index; offsets follow the broadcast strides.
    for (int64_t d = rank - 1; d >= 0; --d) {
      ia += sa[d];
      ib += sb[d];
      if (++idx[d] < shape[d]) break;
      ia -= sa[d] * shape[d];
      ib -= sb[d] * shape[d];
      idx[d] = 0;
    }
  }
  return ctx.out(n->out.get(), std::move(out));
}

Status unary(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsUnaryNode();
  SB_ASSIGN_OR_RETURN(Tensor x, ctx.in(n->x.get()));
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::zeros(x.dtype(), x.shape()));
  const int64_t count = x.numel();
  if (dtype_is_float(x.dtype())) {
    for (int64_t i = 0; i < count; ++i) {
      float v = load_f32(x.data(), x.dtype(), i), r = v;
      switch (n->op) {
        case fb::UnaryOp::Neg: r = -v; break;
        case fb::UnaryOp::Abs: r = std::fabs(v); break;
        case fb::UnaryOp::Square: r = v * v; break;
        case fb::UnaryOp::Relu: r = v < 0.f ? 0.f : v; break;  // NaN and -0 pass through
        case fb::UnaryOp::Exp: r = exact::exp(v); break;
        case fb::UnaryOp::Rcp: r = exact::rcp(v); break;
        case fb::UnaryOp::Rsqrt: r = exact::rsqrt(v); break;
        case fb::UnaryOp::Sigmoid: r = exact::sigmoid(v); break;
        case fb::UnaryOp::Silu: r = exact::silu(v); break;
        case fb::UnaryOp::Tanh: r = exact::tanh(v); break;
        case fb::UnaryOp::GeluTanh: r = exact::gelu_tanh(v); break;
        case fb::UnaryOp::Softplus: r = exact::softplus(v); break;
      }
      store_f32(out.mutable_data(), x.dtype(), i, r);
    }
  } else {
    for (int64_t i = 0; i < count; ++i) {
      int64_t v = load_i64(x.data(), x.dtype(), i), r = v;
      auto uv = static_cast<uint64_t>(v);
      switch (n->op) {
        case fb::UnaryOp::Neg: r = static_cast<int64_t>(0 - uv); break;
        case fb::UnaryOp::Abs: r = v < 0 ? static_cast<int64_t>(0 - uv) : v; break;
        case fb::UnaryOp::Square: r = static_cast<int64_t>(uv * uv); break;
        case fb::UnaryOp::Relu: r = v < 0 ? 0 : v; break;
        default: break;  // float-only ops (the validator rejects them on integers)
      }
      store_i64(out.mutable_data(), x.dtype(), i, r);
    }
  }
  return ctx.out(n->out.get(), std::move(out));
}

}  // namespace

void register_elementwise_kernels(KernelRegistry& r) {
  r.add(fb::OpNode::BinaryNode, binary);
  r.add(fb::OpNode::UnaryNode, unary);
}

}  // namespace switchboard::cpu
