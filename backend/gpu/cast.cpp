// Cast on the GPU (metal_shaders/cast.comp).
#include "gpu_ops.h"

namespace switchboard::gpu {
namespace {

Status cast(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsCastNode();
  Runtime& rt = rt_of(ctx);
  Tensor x;
  SB_ASSIGN_OR_RETURN(BufferRef bx, bind_in(ctx, n->x.get(), &x));
  const auto to = static_cast<DType>(n->dtype);
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(to, x.shape()));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  k::CastArgs args{};
  SB_ASSIGN_OR_RETURN(args.n, u32_count(x.numel(), "Cast"));
  args.from_dtype = static_cast<uint32_t>(x.dtype());
  args.to_dtype = static_cast<uint32_t>(to);
  if (x.dtype() == DType::kI64 || to == DType::kI64)  // cast_i64: an i64 output is one element per invocation
    SB_RETURN_IF_ERROR(rt.dispatch("cast_i64", {bx, bo}, &args, sizeof(args),
                                   to == DType::kI64 ? static_cast<uint64_t>(x.numel()) : words_of(to, x.numel())));
  else
    SB_RETURN_IF_ERROR(rt.dispatch("cast", {bx, bo}, &args, sizeof(args), words_of(to, x.numel())));
  return ctx.out(n->out.get(), std::move(out));
}

}  // namespace

void register_cast(KernelRegistry& r) { r.add(fb::OpNode::CastNode, cast); }

}  // namespace switchboard::gpu
