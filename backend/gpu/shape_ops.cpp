// Full, Slice, Concat, SliceUpdate and Transpose on the GPU (metal_shaders/shape_ops.comp);
// Reshape and Copy never touch bytes (backend/ops/view_kernels.cpp).
#include "gpu_ops.h"
#include "op_shapes.h"
#include "view_kernels.h"

namespace switchboard::gpu {
namespace {

Status full(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsFullNode();
  Runtime& rt = rt_of(ctx);
  SB_ASSIGN_OR_RETURN(Shape shape, ops::full_shape(ctx, *n));
  const auto t = static_cast<DType>(n->dtype);
  // The fill pattern: two words hold whole elements of every dtype; the CPU kernel
  // encodes them, so the values are the CPU's by construction.
  SB_ASSIGN_OR_RETURN(Tensor pattern, Tensor::zeros(t, {static_cast<int64_t>(8 / dtype_size(t))}));
  std::vector<uint8_t> bytes(8);
  ops::fill_value(pattern.mutable_data(), t, pattern.numel(), n->value);
  std::memcpy(bytes.data(), pattern.data(), 8);
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(t, shape));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  k::FillArgs args{};
  const uint64_t words = words_of(t, out.numel());
  SB_ASSIGN_OR_RETURN(args.words, u32_count(static_cast<int64_t>(words), "Full"));
  std::memcpy(&args.pattern0, bytes.data(), 4);
  std::memcpy(&args.pattern1, bytes.data() + 4, 4);
  SB_RETURN_IF_ERROR(rt.dispatch("fill", {bo}, &args, sizeof(args), words));
  return ctx.out(n->out.get(), std::move(out));
}

// `at` (region_at): the destination shifted by dyn word at.word times at_units units on the device.
struct RegionShift {
  uint32_t word = 0;
  int64_t units = 0;
  BufferRef words;
};

Status copy_region(Runtime& rt, DType dtype, BufferRef src, BufferRef dst, int64_t outer, int64_t len, int64_t src_off,
                   int64_t src_stride, int64_t dst_off, int64_t dst_stride, const RegionShift& at = {}) {
  if (outer == 0 || len == 0) return Status::ok();
  const int64_t es = static_cast<int64_t>(dtype_size(dtype)), m = es == 8 ? 2 : 1;
  const int64_t unit = es == 8 ? 4 : es, per = 4 / unit;
  const int64_t first = dst_off * m, last = (dst_off + (outer - 1) * dst_stride + len) * m;  // units [first, last)
  SB_RETURN_IF_ERROR(u32_count(std::max(last, (src_off + (outer - 1) * src_stride + len) * m), "copy").status());
  k::RegionArgs a{};
  a.outer = static_cast<uint32_t>(outer);
  a.len = static_cast<uint32_t>(len * m);
  a.src_off = static_cast<uint32_t>(src_off * m);
  a.src_stride = static_cast<uint32_t>(src_stride * m);
  a.dst_off = static_cast<uint32_t>(first);
  a.dst_stride = static_cast<uint32_t>(dst_stride * m);
  a.unit_bytes = static_cast<uint32_t>(unit);
  a.first_word = static_cast<uint32_t>(first / per);
  a.words = static_cast<uint32_t>((last + per - 1) / per - first / per);
  if (!at.word) return rt.dispatch("region", {src, dst}, &a, sizeof(a), a.words);
  a.dyn_word = at.word;
  a.dyn_units = static_cast<uint32_t>(at.units * m);
  return rt.dispatch("region_at", {src, dst, at.words}, &a, sizeof(a), a.words);
}

Status slice(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsSliceNode();
  Runtime& rt = rt_of(ctx);
  Tensor x;
  SB_ASSIGN_OR_RETURN(BufferRef bx, bind_in(ctx, n->x.get(), &x));
  SB_ASSIGN_OR_RETURN(int64_t axis, ops::normalize_axis(n->axis, x.rank()));
  SB_ASSIGN_OR_RETURN(auto range, ops::slice_range(ctx, *n, x, axis));
  const auto [start, stop] = range;
  const int64_t d = x.dim(axis);
  Shape shape = x.shape();
  shape[static_cast<size_t>(axis)] = stop - start;
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(x.dtype(), shape));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  const ops::AxisSplit s = ops::split_at(x.shape(), axis);
  const int64_t len = (stop - start) * s.inner;
  SB_RETURN_IF_ERROR(copy_region(rt, x.dtype(), bx, bo, s.outer, len, start * s.inner, d * s.inner, 0, len));
  return ctx.out(n->out.get(), std::move(out));
}

Status concat(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsConcatNode();
  Runtime& rt = rt_of(ctx);
  std::vector<Tensor> xs(n->inputs.size());
  std::vector<BufferRef> bs(n->inputs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    SB_ASSIGN_OR_RETURN(bs[i], bind_in(ctx, &n->inputs[i], &xs[i]));
  }
  SB_ASSIGN_OR_RETURN(int64_t axis, ops::normalize_axis(n->axis, xs[0].rank()));
  SB_ASSIGN_OR_RETURN(Shape shape, ops::concat_shape(xs, axis));
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(xs[0].dtype(), shape));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  const ops::AxisSplit s = ops::split_at(shape, axis);
  int64_t at = 0;  // along the axis
  for (size_t i = 0; i < xs.size(); ++i) {
    const int64_t len = xs[i].dim(axis) * s.inner;
    SB_RETURN_IF_ERROR(copy_region(rt, out.dtype(), bs[i], bo, s.outer, len, 0, len, at * s.inner, s.dim * s.inner));
    at += xs[i].dim(axis);
  }
  return ctx.out(n->out.get(), std::move(out));
}

// dst[..., start:start+len, ...] = update, in place in dst's device memory.
Status slice_update(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsSliceUpdateNode();
  Runtime& rt = rt_of(ctx);
  Tensor u;
  SB_ASSIGN_OR_RETURN(BufferRef bu, bind_in(ctx, n->update.get(), &u));
  SB_ASSIGN_OR_RETURN(DynamicArg start, dynamic_arg(ctx, n->start.get()));
  SB_ASSIGN_OR_RETURN(InPlace buf, inplace_on_device(ctx, n->dst.get()));
  const Tensor& dst = buf.dev;
  SB_ASSIGN_OR_RETURN(int64_t axis, ops::normalize_axis(n->axis, dst.rank()));
  SB_RETURN_IF_ERROR(ops::check_slice_update(u, dst, axis, start.value));
  const int64_t d = dst.dim(axis), len = u.dim(axis);
  SB_ASSIGN_OR_RETURN(BufferRef bd, rt.bind(dst, false));
  const ops::AxisSplit s = ops::split_at(dst.shape(), axis);
  // The start read on the device where a step of it moves the destination by whole words
  // (the value cache's rows): region_at; else the start goes in the arguments.
  const int64_t es = static_cast<int64_t>(dtype_size(dst.dtype()));
  RegionShift at;
  if (start.word && (s.inner * es) % 4 == 0) {
    SB_RETURN_IF_ERROR(u32_count(dst.numel() * (es == 8 ? 2 : 1), "SliceUpdate").status());
    at = {start.word, s.inner, start.words};
    ctx.guard_dynamic(n->start.get(), 0, d - len);
  } else {
    SB_RETURN_IF_ERROR(ctx.resolve(n->start.get()).status());  // baked in: recorded work is for this start only
  }
  const int64_t fixed = at.word ? 0 : start.value;
  SB_RETURN_IF_ERROR(
      copy_region(rt, dst.dtype(), bu, bd, s.outer, len * s.inner, 0, len * s.inner, fixed * s.inner, d * s.inner, at));
  return keep_on_device(ctx, n->dst.get(), buf);
}

Status transpose(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsTransposeNode();
  Runtime& rt = rt_of(ctx);
  Tensor x;
  SB_ASSIGN_OR_RETURN(BufferRef bx, bind_in(ctx, n->x.get(), &x));
  SB_ASSIGN_OR_RETURN(ops::TransposePlan p, ops::transpose_plan(x, n->perm));
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(x.dtype(), p.out_shape));
  if (out.numel() == 0) return ctx.out(n->out.get(), std::move(out));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  SB_ASSIGN_OR_RETURN(uint32_t numel, u32_count(x.numel(), "Transpose"));
  SB_CHECK_OR_RETURN(p.dims.size() <= SB_TRANSPOSE_MAX_RANK, StatusCode::kUnimplemented, "Transpose of rank %zu",
                     p.dims.size());
  k::TransposeArgs a{};
  a.rank = static_cast<uint32_t>(p.dims.size());
  for (size_t i = 0; i < p.dims.size(); ++i) {
    a.dims[i] = static_cast<uint32_t>(p.dims[i]);
    a.strides[i] = static_cast<uint32_t>(p.src_strides[i]);
  }
  a.elem_bytes = static_cast<uint32_t>(dtype_size(x.dtype()));
  a.numel = numel;
  a.invocations = a.elem_bytes == 8 ? numel : static_cast<uint32_t>(words_of(x.dtype(), x.numel()));
  SB_RETURN_IF_ERROR(rt.dispatch("transpose", {bx, bo}, &a, sizeof(a), a.invocations));
  return ctx.out(n->out.get(), std::move(out));
}

}  // namespace

void register_shape_ops(KernelRegistry& r) {
  r.add(fb::OpNode::FullNode, full);
  r.add(fb::OpNode::SliceNode, slice);
  r.add(fb::OpNode::ConcatNode, concat);
  r.add(fb::OpNode::SliceUpdateNode, slice_update);
  r.add(fb::OpNode::TransposeNode, transpose);
  ops::register_view_kernels(r);
}

}  // namespace switchboard::gpu
