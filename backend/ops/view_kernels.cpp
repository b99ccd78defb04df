#include "view_kernels.h"

#include "op_shapes.h"

namespace switchboard::ops {

Status reshape_kernel(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsReshapeNode();
  SB_ASSIGN_OR_RETURN(Tensor x, ctx.in(n->x.get()));
  SB_ASSIGN_OR_RETURN(Shape shape, reshape_shape(ctx, *n, x));
  SB_ASSIGN_OR_RETURN(Tensor out, x.reshaped(shape));
  return ctx.out(n->out.get(), std::move(out));
}

Status copy_kernel(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsCopyNode();
  SB_ASSIGN_OR_RETURN(Tensor x, ctx.in(n->x.get()));
  return ctx.out(n->out.get(), std::move(x));
}

void register_view_kernels(KernelRegistry& r) {
  r.add(fb::OpNode::ReshapeNode, reshape_kernel);
  r.add(fb::OpNode::CopyNode, copy_kernel);
}

}  // namespace switchboard::ops
