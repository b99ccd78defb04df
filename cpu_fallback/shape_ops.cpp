// Data-movement kernels: slice, concat, slice update, transpose (reshape and copy:
// backend/ops/view_kernels.cpp, shared with the GPU).
#include <algorithm>

#include "cpu_common.h"
#include "view_kernels.h"

namespace switchboard::cpu {
namespace {

Status slice(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsSliceNode();
  SB_ASSIGN_OR_RETURN(Tensor x, ctx.in(n->x.get()));
  SB_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n->axis, x.rank()));
  SB_ASSIGN_OR_RETURN(auto range, slice_range(ctx, *n, x, axis));
  const auto [start, stop] = range;
  const int64_t d = x.dim(axis);
  Shape shape = x.shape();
  shape[axis] = stop - start;
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::zeros(x.dtype(), shape));
  AxisSplit s = split_at(x.shape(), axis);
  const size_t row = static_cast<size_t>(s.inner) * dtype_size(x.dtype());
  const auto* src = static_cast<const uint8_t*>(x.data());
  auto* dst = static_cast<uint8_t*>(out.mutable_data());
  for (int64_t o = 0; o < s.outer; ++o)
    std::memcpy(dst + o * (stop - start) * row, src + (o * d + start) * row, (stop - start) * row);
  return ctx.out(n->out.get(), std::move(out));
}

Status concat(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsConcatNode();
  std::vector<Tensor> xs;
  for (const fb::Tid& t : n->inputs) {
    SB_ASSIGN_OR_RETURN(Tensor x, ctx.in(&t));
    xs.push_back(std::move(x));
  }
  SB_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n->axis, xs[0].rank()));
  SB_ASSIGN_OR_RETURN(Shape shape, concat_shape(xs, axis));
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::zeros(xs[0].dtype(), shape));
  AxisSplit s = split_at(shape, axis);
  const size_t esz = dtype_size(out.dtype());
  auto* dst = static_cast<uint8_t*>(out.mutable_data());
  for (int64_t o = 0; o < s.outer; ++o) {
    for (const Tensor& x : xs) {
      size_t bytes = static_cast<size_t>(x.dim(axis) * s.inner) * esz;
      std::memcpy(dst, static_cast<const uint8_t*>(x.data()) + o * bytes, bytes);
      dst += bytes;
    }
  }
  return ctx.out(n->out.get(), std::move(out));
}

Status slice_update(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsSliceUpdateNode();
  SB_ASSIGN_OR_RETURN(Tensor u, ctx.in(n->update.get()));
  SB_ASSIGN_OR_RETURN(int64_t start, ctx.resolve(n->start.get()));
  SB_ASSIGN_OR_RETURN(Tensor dst, ctx.inplace(n->dst.get()));
  SB_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n->axis, dst.rank()));
  SB_RETURN_IF_ERROR(check_slice_update(u, dst, axis, start));
  const int64_t d = dst.dim(axis), len = u.dim(axis);
  AxisSplit s = split_at(dst.shape(), axis);
  const size_t row = static_cast<size_t>(s.inner) * dtype_size(dst.dtype());
  auto* out = static_cast<uint8_t*>(dst.mutable_data());
  const auto* src = static_cast<const uint8_t*>(u.data());
  for (int64_t o = 0; o < s.outer; ++o) std::memcpy(out + (o * d + start) * row, src + o * len * row, len * row);
  return Status::ok();
}

// Walks out in order over the plan's merged axes; the innermost axis copies as one
// run when x holds it contiguously (the usual head/token swap of attention).
Status transpose(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsTransposeNode();
  SB_ASSIGN_OR_RETURN(Tensor x, ctx.in(n->x.get()));
  SB_ASSIGN_OR_RETURN(TransposePlan p, transpose_plan(x, n->perm));
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::zeros(x.dtype(), p.out_shape));
  if (out.numel() == 0) return ctx.out(n->out.get(), std::move(out));
  if (p.dims.empty()) {
    p.dims.push_back(1);
    p.src_strides.push_back(1);
  }
  const size_t es = dtype_size(x.dtype()), r = p.dims.size();
  const bool run = p.src_strides.back() == 1;
  const int64_t inner = p.dims.back(), outer = out.numel() / inner;
  const auto* src = static_cast<const uint8_t*>(x.data());
  auto* dst = static_cast<uint8_t*>(out.mutable_data());
  std::vector<int64_t> idx(r, 0);
  int64_t base = 0;  // x's element offset of idx (inner index 0)
  for (int64_t o = 0; o < outer; ++o) {
    uint8_t* d = dst + static_cast<size_t>(o * inner) * es;
    if (run) {
      std::memcpy(d, src + static_cast<size_t>(base) * es, static_cast<size_t>(inner) * es);
    } else {
      for (int64_t i = 0; i < inner; ++i)
        std::memcpy(d + static_cast<size_t>(i) * es, src + static_cast<size_t>(base + i * p.src_strides.back()) * es, es);
    }
    for (size_t a = r - 1; a-- > 0;) {  // odometer over the outer axes
      base += p.src_strides[a];
      if (++idx[a] < p.dims[a]) break;
      base -= p.src_strides[a] * p.dims[a];
      idx[a] = 0;
    }
  }
  return ctx.out(n->out.get(), std::move(out));
}

Status full(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsFullNode();
  SB_ASSIGN_OR_RETURN(Shape shape, full_shape(ctx, *n));
  const auto t = static_cast<DType>(n->dtype);
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::zeros(t, shape));
  fill_value(out.mutable_data(), t, out.numel(), n->value);
  return ctx.out(n->out.get(), std::move(out));
}

}  // namespace

void register_shape_kernels(KernelRegistry& r) {
  r.add(fb::OpNode::FullNode, full);
  register_view_kernels(r);
  r.add(fb::OpNode::SliceNode, slice);
  r.add(fb::OpNode::ConcatNode, concat);
  r.add(fb::OpNode::SliceUpdateNode, slice_update);
  r.add(fb::OpNode::TransposeNode, transpose);
}

}  // namespace switchboard::cpu
