// GatherMm (float experts) on the GPU (metal_shaders/gather_mm.comp).
#include <algorithm>

#include "gpu_ops.h"

namespace switchboard::gpu {
namespace {

Status gather_mm(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsGatherMmNode();
  Runtime& rt = rt_of(ctx);
  Tensor x, w, lhs, rhs;
  SB_ASSIGN_OR_RETURN(BufferRef bx, bind_in(ctx, n->x.get(), &x));
  SB_ASSIGN_OR_RETURN(BufferRef bw, bind_in(ctx, n->w.get(), &w));
  BufferRef bl, br;
  SB_RETURN_IF_ERROR(bind_indices(ctx, n->lhs_indices, n->rhs_indices, bx, lhs, rhs, bl, br));
  const int64_t rows = x.dim(0), kdim = x.dim(1), experts = w.dim(0), nout = w.dim(1);
  SB_CHECK_OR_RETURN(w.dim(2) == kdim, StatusCode::kInvalidArgument, "w %s does not match K = %lld",
                     shape_str(w.shape()).c_str(), (long long)kdim);
  const int64_t pairs = rhs.defined() ? rhs.numel() : lhs.defined() ? lhs.numel() : rows;
  SB_CHECK_OR_RETURN((!lhs.defined() || lhs.numel() == pairs) && (lhs.defined() || rows == 0 || pairs % rows == 0),
                     StatusCode::kInvalidArgument, "index lengths do not match (%lld pairs, %lld rows)",
                     (long long)pairs, (long long)rows);
  SB_RETURN_IF_ERROR(u32_count(w.numel(), "GatherMm weights").status());
  SB_RETURN_IF_ERROR(u32_count(pairs * std::max<int64_t>(rows, nout), "GatherMm").status());
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(x.dtype(), {pairs, nout}));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  k::GatherMmArgs args{static_cast<uint32_t>(pairs),
                       static_cast<uint32_t>(nout),
                       static_cast<uint32_t>(kdim),
                       static_cast<uint32_t>(rows),
                       static_cast<uint32_t>(experts),
                       static_cast<uint32_t>(x.dtype()),
                       lhs.defined(),
                       rhs.defined()};
  // One workgroup of 32 lanes per output word (gather_mm.comp).
  SB_RETURN_IF_ERROR(rt.dispatch("gather_mm", {bx, bw, bl, br, bo, rt.error_word()}, &args, sizeof(args),
                                 32 * words_of(x.dtype(), pairs * nout)));
  return ctx.out(n->out.get(), std::move(out));
}

}  // namespace

void register_gather_mm(KernelRegistry& r) { r.add(fb::OpNode::GatherMmNode, gather_mm); }

}  // namespace switchboard::gpu
