// Reduce and Argmax on the GPU (metal_shaders/reduce.comp).
#include "gpu_ops.h"
#include "op_shapes.h"

namespace switchboard::gpu {
namespace {

Status reduce_like(KernelContext& ctx, const fb::Tid* x_tid, const fb::Tid* out_tid, int32_t axis_in, bool keepdims,
                   uint32_t op, bool is_argmax) {
  Runtime& rt = rt_of(ctx);
  Tensor x;
  SB_ASSIGN_OR_RETURN(BufferRef bx, bind_in(ctx, x_tid, &x));
  SB_ASSIGN_OR_RETURN(int64_t axis, ops::normalize_axis(axis_in, x.rank()));
  const ops::AxisSplit s = ops::split_at(x.shape(), axis);
  SB_CHECK_OR_RETURN(s.dim > 0 || (!is_argmax && op == 0), StatusCode::kInvalidArgument, "%s over an empty axis of %s",
                     is_argmax ? "argmax" : "reduction", shape_str(x.shape()).c_str());
  SB_RETURN_IF_ERROR(u32_count(x.numel(), "Reduce").status());
  Shape shape = x.shape();
  if (keepdims)
    shape[static_cast<size_t>(axis)] = 1;
  else
    shape.erase(shape.begin() + axis);
  const DType out_dtype = is_argmax ? DType::kI32 : x.dtype();
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(out_dtype, shape));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  k::ReduceArgs args{static_cast<uint32_t>(s.outer),
                     static_cast<uint32_t>(s.dim),
                     static_cast<uint32_t>(s.inner),
                     op,
                     static_cast<uint32_t>(x.dtype()),
                     0,
                     0,
                     0};
  // Long contiguous float rows (logits): a workgroup of 256 per output; rows of two parts of
  // kArgmaxPart or more are split over workgroups (one per part) and their winners merged.
  const bool wide = is_argmax && dtype_is_float(x.dtype()) && s.inner == 1 && s.dim >= 1024;
  if (wide) {
    constexpr int64_t kArgmaxPart = 4096;
    const uint64_t parts =
        s.dim >= 2 * kArgmaxPart ? static_cast<uint64_t>((s.dim + kArgmaxPart - 1) / kArgmaxPart) : 1;
    if (parts == 1) {
      SB_RETURN_IF_ERROR(
          rt.dispatch("argmax_row", {bx, bo}, &args, sizeof(args), static_cast<uint64_t>(s.outer) * 256));
      return ctx.out(out_tid, std::move(out));
    }
    args.pad0 = static_cast<uint32_t>(parts);
    args.pad1 = static_cast<uint32_t>(kArgmaxPart);
    SB_ASSIGN_OR_RETURN(BufferRef pairs, rt.scratch(static_cast<size_t>(s.outer) * parts * 8, 0));
    SB_RETURN_IF_ERROR(
        rt.dispatch("argmax_row", {bx, pairs}, &args, sizeof(args), static_cast<uint64_t>(s.outer) * parts * 256));
    SB_RETURN_IF_ERROR(
        rt.dispatch("argmax_merge", {pairs, bo}, &args, sizeof(args), static_cast<uint64_t>(s.outer) * 256));
    return ctx.out(out_tid, std::move(out));
  }
  const char* kernel = is_argmax ? (dtype_is_float(x.dtype()) ? "argmax" : "argmax_int")
                       : op == static_cast<uint32_t>(fb::ReduceOp::Mean) ? "reduce_mean"
                                                                         : "reduce";
  SB_RETURN_IF_ERROR(rt.dispatch(kernel, {bx, bo}, &args, sizeof(args), words_of(out_dtype, out.numel())));
  return ctx.out(out_tid, std::move(out));
}

Status reduce(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsReduceNode();
  return reduce_like(ctx, n->x.get(), n->out.get(), n->axis, n->keepdims, static_cast<uint32_t>(n->op), false);
}

Status argmax(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsArgmaxNode();
  return reduce_like(ctx, n->x.get(), n->out.get(), n->axis, n->keepdims, 0, true);
}

// Copies rows [outer, len] (element units) from src to dst with the given offsets and
// strides (shape_ops.comp REGION); 8-byte dtypes move as two 4-byte units.

}  // namespace

void register_reduce(KernelRegistry& r) {
  r.add(fb::OpNode::ReduceNode, reduce);
  r.add(fb::OpNode::ArgmaxNode, argmax);
}

}  // namespace switchboard::gpu
