// Binary (broadcasting) and Unary on the GPU (metal_shaders/elementwise.comp): word
// kernels for f32/f16/bf16/i32, the int64.glsl twins for the other integer dtypes.
#include "gpu_ops.h"
#include "op_shapes.h"

namespace switchboard::gpu {
namespace {

Status binary(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsBinaryNode();
  Runtime& rt = rt_of(ctx);
  Tensor a, b;
  SB_ASSIGN_OR_RETURN(BufferRef ba, bind_in(ctx, n->a.get(), &a));
  SB_ASSIGN_OR_RETURN(BufferRef bb, bind_in(ctx, n->b.get(), &b));
  SB_ASSIGN_OR_RETURN(Shape shape, ops::broadcast_shape(a.shape(), b.shape()));
  SB_CHECK_OR_RETURN(shape.size() <= SB_MAX_RANK, StatusCode::kUnimplemented, "rank %zu exceeds %d", shape.size(),
                     SB_MAX_RANK);
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(a.dtype(), shape));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  k::BinaryArgs args{};
  SB_ASSIGN_OR_RETURN(args.n, u32_count(out.numel(), "Binary"));
  args.op = static_cast<uint32_t>(n->op);
  args.dtype = static_cast<uint32_t>(a.dtype());
  args.rank = static_cast<uint32_t>(shape.size());
  std::vector<int64_t> sa = ops::broadcast_strides(a.shape(), shape), sb = ops::broadcast_strides(b.shape(), shape);
  for (size_t d = 0; d < shape.size(); ++d) {
    args.shape[d] = static_cast<uint32_t>(shape[d]);
    args.sa[d] = static_cast<uint32_t>(sa[d]);
    args.sb[d] = static_cast<uint32_t>(sb[d]);
  }
  if (needs_int_kernel_binary(a.dtype())) {
    SB_RETURN_IF_ERROR(rt.dispatch("binary_int", {ba, bb, bo, rt.error_word()}, &args, sizeof(args),
                                   int_invocations(a.dtype(), out.numel())));
  } else {
    SB_RETURN_IF_ERROR(rt.dispatch(n->op == fb::BinaryOp::Div ? "binary_div" : "binary", {ba, bb, bo, rt.error_word()},
                                   &args, sizeof(args), words_of(out.dtype(), out.numel())));
  }
  return ctx.out(n->out.get(), std::move(out));
}

Status unary(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsUnaryNode();
  Runtime& rt = rt_of(ctx);
  Tensor x;
  SB_ASSIGN_OR_RETURN(BufferRef bx, bind_in(ctx, n->x.get(), &x));
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(x.dtype(), x.shape()));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  k::UnaryArgs args{};
  SB_ASSIGN_OR_RETURN(args.n, u32_count(x.numel(), "Unary"));
  args.op = static_cast<uint32_t>(n->op);
  args.dtype = static_cast<uint32_t>(x.dtype());
  if (needs_int_kernel_unary(x.dtype()))
    SB_RETURN_IF_ERROR(rt.dispatch("unary_int", {bx, bo}, &args, sizeof(args), int_invocations(x.dtype(), x.numel())));
  else
    SB_RETURN_IF_ERROR(rt.dispatch("unary", {bx, bo}, &args, sizeof(args), words_of(x.dtype(), x.numel())));
  return ctx.out(n->out.get(), std::move(out));
}

}  // namespace

void register_elementwise(KernelRegistry& r) {
  r.add(fb::OpNode::BinaryNode, binary);
  r.add(fb::OpNode::UnaryNode, unary);
}

}  // namespace switchboard::gpu
