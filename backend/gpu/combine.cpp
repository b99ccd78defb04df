// Combine (the weighted sum of a token's expert rows, plus an optionally gated shared
// expert) on the GPU (metal_shaders/combine.comp), and the ScatterRows + Combine fusion.
#include "gpu_ops.h"

namespace switchboard::gpu {

Result<CombineOperands> bind_combine(KernelContext& ctx, const fb::Tid* weights_tid, const fb::Tid* shared_tid,
                                     const fb::Tid* gate_tid, int64_t dim) {
  CombineOperands c;
  SB_ASSIGN_OR_RETURN(c.bw, bind_in(ctx, weights_tid, &c.w));
  c.tokens = c.w.dim(0), c.slots = c.w.dim(1);
  c.bs = c.bgate = c.bw;
  if (shared_tid) {
    SB_ASSIGN_OR_RETURN(c.bs, bind_in(ctx, shared_tid, &c.shared));
    SB_CHECK_OR_RETURN(c.shared.shape() == (Shape{c.tokens, dim}), StatusCode::kInvalidArgument,
                       "shared %s, expected [%lld, %lld]", shape_str(c.shared.shape()).c_str(), (long long)c.tokens,
                       (long long)dim);
  }
  if (gate_tid) {
    SB_ASSIGN_OR_RETURN(c.bgate, bind_in(ctx, gate_tid, &c.gate));
    SB_CHECK_OR_RETURN(c.gate.shape() == (Shape{c.tokens, 1}), StatusCode::kInvalidArgument,
                       "shared_gate %s, expected [%lld, 1]", shape_str(c.gate.shape()).c_str(), (long long)c.tokens);
  }
  return c;
}

constexpr int64_t kCombine16MinOutputs = int64_t{1} << 16;

// Whether Combine of y at `by` into `bo` takes combine16: rows of whole 16-byte units at
// aligned offsets (4 or 8 elements a thread), and outputs enough to fill the GPU (a decode
// token's row is faster with the word kernel's 4x more threads: bench/RESULTS.md).
bool combine_by16(const Tensor& y, BufferRef by, BufferRef bo, int64_t outputs) {
  return outputs >= kCombine16MinOutputs && y.dim(1) * static_cast<int64_t>(dtype_size(y.dtype())) % 16 == 0 &&
         by.offset % 16 == 0 && bo.offset % 16 == 0;
}

Status combine_impl(KernelContext& ctx, const Tensor& y, BufferRef by, const CombineOperands& c, const fb::Tid* out_tid,
                    const BufferRef* rows) {
  Runtime& rt = rt_of(ctx);
  const int64_t tokens = c.tokens, slots = c.slots, dim = y.dim(1);
  SB_CHECK_OR_RETURN(y.dim(0) == tokens * slots, StatusCode::kInvalidArgument, "y %s does not hold %lld x %lld rows",
                     shape_str(y.shape()).c_str(), (long long)tokens, (long long)slots);
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(y.dtype(), {tokens, dim}));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  k::CombineArgs args{};
  SB_ASSIGN_OR_RETURN(args.tokens, u32_count(tokens, "Combine"));
  SB_ASSIGN_OR_RETURN(args.slots, u32_count(slots, "Combine"));
  SB_ASSIGN_OR_RETURN(args.dim, u32_count(dim, "Combine"));
  SB_RETURN_IF_ERROR(u32_count(y.numel(), "Combine").status());
  args.dtype = static_cast<uint32_t>(y.dtype());
  args.has_shared = c.shared.defined();
  args.shared_dtype = c.shared.defined() ? static_cast<uint32_t>(c.shared.dtype()) : 0;
  args.has_gate = c.gate.defined();
  args.gate_dtype = c.gate.defined() ? static_cast<uint32_t>(c.gate.dtype()) : 0;
  const bool by16 = combine_by16(y, by, bo, tokens * dim);
  SB_CHECK_OR_RETURN(!rows || by16, StatusCode::kInternal, "combine_rows needs rows of 16-byte units");
  const uint64_t words = words_of(y.dtype(), tokens * dim);
  if (rows) {
    SB_RETURN_IF_ERROR(
        rt.dispatch("combine_rows", {by, c.bw, c.bs, c.bgate, bo, *rows}, &args, sizeof(args), words / 4));
  } else {
    SB_RETURN_IF_ERROR(rt.dispatch(by16 ? "combine16" : "combine", {by, c.bw, c.bs, c.bgate, bo}, &args, sizeof(args),
                                   by16 ? words / 4 : words));
  }
  return ctx.out(out_tid, std::move(out));
}

Status combine(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsCombineNode();
  Tensor y;
  SB_ASSIGN_OR_RETURN(BufferRef by, bind_in(ctx, n->y.get(), &y));
  SB_ASSIGN_OR_RETURN(CombineOperands c,
                      bind_combine(ctx, n->weights.get(), n->shared.get(), n->shared_gate.get(), y.dim(1)));
  return combine_impl(ctx, y, by, c, n->out.get());
}

// ScatterRows then Combine of its (private) output, as MoE prefill ends: Combine reads
// y's rows through the checked inverse permutation (combine_rows), so the scattered
// copy is never written. Rows not in 16-byte units take the two kernels.
Status scatter_combine(KernelContext& ctx, const std::unique_ptr<fb::InstructionT>* ins) {
  const auto* sc = ins[0]->op.AsScatterRowsNode();
  const auto* cn = ins[1]->op.AsCombineNode();
  SB_ASSIGN_OR_RETURN(Scatter s, invert_scatter(ctx, sc));
  if (s.x.rank() == 2) {
    SB_ASSIGN_OR_RETURN(CombineOperands c,
                        bind_combine(ctx, cn->weights.get(), cn->shared.get(), cn->shared_gate.get(), s.x.dim(1)));
    if (combine_by16(s.x, s.bx, BufferRef{}, c.tokens * s.x.dim(1)))
      return combine_impl(ctx, s.x, s.bx, c, cn->out.get(), &s.inv);
  }
  SB_RETURN_IF_ERROR(gather_rows_impl(ctx, s.x, s.bx, s.inv, s.x.dim(0), sc->out.get()));
  return combine(ctx, ins[1]->op);
}

void register_combine(KernelRegistry& r) { r.add(fb::OpNode::CombineNode, combine); }

}  // namespace switchboard::gpu
