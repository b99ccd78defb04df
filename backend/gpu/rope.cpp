// Rotary embedding on the GPU (metal_shaders/rope.comp): one thread per output word.
#include "gpu_ops.h"
#include "op_shapes.h"

namespace switchboard::gpu {
namespace {

Status rope(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsRopeNode();
  Runtime& rt = rt_of(ctx);
  Tensor x, cos, sin;
  SB_ASSIGN_OR_RETURN(BufferRef bx, bind_in(ctx, n->x.get(), &x));
  SB_ASSIGN_OR_RETURN(BufferRef bc, bind_in(ctx, n->cos.get(), &cos));
  SB_ASSIGN_OR_RETURN(BufferRef bs, bind_in(ctx, n->sin.get(), &sin));
  SB_ASSIGN_OR_RETURN(int64_t pos, ctx.resolve(n->pos.get()));
  SB_ASSIGN_OR_RETURN(ops::RopeDims d, ops::rope_dims(x, cos, sin, pos));
  SB_RETURN_IF_ERROR(u32_count(d.table_rows * d.half, "rope tables").status());
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(x.dtype(), x.shape()));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  k::RopeArgs args{};
  SB_ASSIGN_OR_RETURN(args.n, u32_count(x.numel(), "rope"));
  args.m = static_cast<uint32_t>(d.m);
  args.h = static_cast<uint32_t>(d.h);
  args.hd = static_cast<uint32_t>(d.hd);
  args.half_dims = static_cast<uint32_t>(d.half);
  args.pos = static_cast<uint32_t>(d.pos);
  args.dtype = static_cast<uint32_t>(x.dtype());
  if (x.numel() > 0)
    SB_RETURN_IF_ERROR(rt.dispatch("rope", {bx, bc, bs, bo}, &args, sizeof(args), words_of(x.dtype(), x.numel())));
  return ctx.out(n->out.get(), std::move(out));
}

}  // namespace

void register_rope(KernelRegistry& r) { r.add(fb::OpNode::RopeNode, rope); }

}  // namespace switchboard::gpu
