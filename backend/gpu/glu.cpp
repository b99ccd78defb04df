// Glu (SwiGLU, GEGLU, clamped SwiGLU) on the GPU (metal_shaders/glu.comp).
#include "gpu_ops.h"

namespace switchboard::gpu {

Status glu(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsGluNode();
  Runtime& rt = rt_of(ctx);
  Tensor g, u;
  SB_ASSIGN_OR_RETURN(BufferRef bg, bind_in(ctx, n->gate.get(), &g));
  SB_ASSIGN_OR_RETURN(BufferRef bu, bind_in(ctx, n->up.get(), &u));
  SB_CHECK_OR_RETURN(g.shape() == u.shape(), StatusCode::kInvalidArgument, "gate %s and up %s differ",
                     shape_str(g.shape()).c_str(), shape_str(u.shape()).c_str());
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(g.dtype(), g.shape()));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  k::GluArgs args{};
  SB_ASSIGN_OR_RETURN(args.n, u32_count(g.numel(), "Glu"));
  args.dtype = static_cast<uint32_t>(g.dtype());
  args.kind = static_cast<uint32_t>(n->kind);
  args.alpha = n->alpha;
  args.limit = n->limit;
  SB_RETURN_IF_ERROR(rt.dispatch("glu", {bg, bu, bo}, &args, sizeof(args), words_of(g.dtype(), g.numel())));
  return ctx.out(n->out.get(), std::move(out));
}

void register_glu(KernelRegistry& r) { r.add(fb::OpNode::GluNode, glu); }

}  // namespace switchboard::gpu
