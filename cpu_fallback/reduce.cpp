// Reductions along one axis (accumulated in index order) and argmax.
#include "cpu_common.h"

namespace switchboard::cpu {
namespace {

Shape reduced_shape(const Shape& s, int64_t axis, bool keepdims) {
  Shape out = s;
  if (keepdims) out[axis] = 1;
  else out.erase(out.begin() + axis);
  return out;
}

Status reduce(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsReduceNode();
  SB_ASSIGN_OR_RETURN(Tensor x, ctx.in(n->x.get()));
  SB_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n->axis, x.rank()));
  AxisSplit s = split_at(x.shape(), axis);
  SB_CHECK_OR_RETURN(s.dim > 0 || n->op == fb::ReduceOp::Sum, StatusCode::kInvalidArgument,
                     "reduction over an empty axis of %s", shape_str(x.shape()).c_str());
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::zeros(x.dtype(), reduced_shape(x.shape(), axis, n->keepdims)));
  for (int64_t o = 0; o < s.outer; ++o) {
    for (int64_t i = 0; i < s.inner; ++i) {
      const int64_t base = o * s.dim * s.inner + i;
      float acc = n->op == fb::ReduceOp::Sum || n->op == fb::ReduceOp::Mean ? 0.f : load_f32(x.data(), x.dtype(), base);
      for (int64_t j = 0; j < s.dim; ++j) {
        float v = load_f32(x.data(), x.dtype(), base + j * s.inner);
        switch (n->op) {
          case fb::ReduceOp::Sum:
          case fb::ReduceOp::Mean: acc = acc + v; break;
          case fb::ReduceOp::Max: acc = max_f32(acc, v); break;
          case fb::ReduceOp::Min: acc = min_f32(acc, v); break;
        }
      }
      if (n->op == fb::ReduceOp::Mean) acc = acc / static_cast<float>(s.dim);
      store_f32(out.mutable_data(), out.dtype(), o * s.inner + i, acc);
    }
  }
  return ctx.out(n->out.get(), std::move(out));
}

// NaN counts as the largest value; among equal values the lowest index wins.
Status argmax(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsArgmaxNode();
  SB_ASSIGN_OR_RETURN(Tensor x, ctx.in(n->x.get()));
  SB_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n->axis, x.rank()));
  AxisSplit s = split_at(x.shape(), axis);
  SB_CHECK_OR_RETURN(s.dim > 0, StatusCode::kInvalidArgument, "argmax over an empty axis of %s",
                     shape_str(x.shape()).c_str());
  SB_CHECK_OR_RETURN(s.dim <= INT32_MAX, StatusCode::kOutOfRange, "axis too long for i32 indices");
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::zeros(DType::kI32, reduced_shape(x.shape(), axis, n->keepdims)));
  const bool is_float = dtype_is_float(x.dtype());
  auto* dst = out.mutable_data_as<int32_t>();
  for (int64_t o = 0; o < s.outer; ++o) {
    for (int64_t i = 0; i < s.inner; ++i) {
      const int64_t base = o * s.dim * s.inner + i;
      int64_t best = 0;
      if (is_float) {
        float bv = load_f32(x.data(), x.dtype(), base);
        for (int64_t j = 1; j < s.dim && bv == bv; ++j) {
          float v = load_f32(x.data(), x.dtype(), base + j * s.inner);
          if (v != v || v > bv) { bv = v; best = j; }
        }
      } else {
        int64_t bv = load_i64(x.data(), x.dtype(), base);
        for (int64_t j = 1; j < s.dim; ++j) {
          int64_t v = load_i64(x.data(), x.dtype(), base + j * s.inner);
          if (v > bv) { bv = v; best = j; }
        }
      }
      dst[o * s.inner + i] = static_cast<int32_t>(best);
    }
  }
  return ctx.out(n->out.get(), std::move(out));
}

}  // namespace

void register_reduce_kernels(KernelRegistry& r) {
  r.add(fb::OpNode::ReduceNode, reduce);
  r.add(fb::OpNode::ArgmaxNode, argmax);
}

}  // namespace switchboard::cpu
