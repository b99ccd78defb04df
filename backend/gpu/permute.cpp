// Argsort, GatherRows and ScatterRows on the GPU (metal_shaders/permute.comp).
#include "gpu_ops.h"

namespace switchboard::gpu {
namespace {

// Argsort's order, and with div (moe_order) the keys and the indices / div at each rank too:
// outs are order, then sorted keys and quotients.
Status argsort_run(KernelContext& ctx, const fb::ArgsortNodeT& n, uint32_t div, std::vector<Tensor>& outs) {
  Runtime& rt = rt_of(ctx);
  Tensor x;
  SB_ASSIGN_OR_RETURN(BufferRef bx, bind_in(ctx, n.x.get(), &x));
  std::vector<BufferRef> binds = {bx};
  for (int o = 0; o < (div ? 3 : 1); ++o) {
    SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(DType::kI32, x.shape()));
    SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
    binds.push_back(bo);
    outs.push_back(std::move(out));
  }
  k::ArgsortArgs args{};
  SB_ASSIGN_OR_RETURN(args.n, u32_count(x.numel(), "Argsort"));
  args.div = div;
  // 16 threads per key (permute.comp), workgroups of 256 for 16 keys.
  return rt.dispatch(div ? "argsort_moe" : "argsort", binds, &args, sizeof(args), 256 * ((uint64_t{args.n} + 15) / 16));
}

Status argsort(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsArgsortNode();
  std::vector<Tensor> outs;
  SB_RETURN_IF_ERROR(argsort_run(ctx, *n, 0, outs));
  return ctx.out(n->out.get(), std::move(outs[0]));
}

// Rows of x as units of 1, 2 or 4 bytes (8-byte dtypes: two 4-byte units).
void row_units(const Tensor& x, int64_t rows, uint32_t& units, uint32_t& unit_bytes) {
  const size_t es = dtype_size(x.dtype());
  unit_bytes = static_cast<uint32_t>(es == 8 ? 4 : es);
  const int64_t per_row = rows ? x.numel() / x.dim(0) : 0;
  units = static_cast<uint32_t>(per_row * (es == 8 ? 2 : 1));
}

}  // namespace

Status gather_rows_impl(KernelContext& ctx, const Tensor& x, BufferRef bx, BufferRef bidx, int64_t out_rows,
                        const fb::Tid* out_tid) {
  Runtime& rt = rt_of(ctx);
  Shape shape = x.shape();
  shape[0] = out_rows;
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(x.dtype(), shape));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  k::PermuteArgs args{};
  SB_ASSIGN_OR_RETURN(args.rows, u32_count(out_rows, "rows"));
  SB_ASSIGN_OR_RETURN(args.src_rows, u32_count(x.dim(0), "rows"));
  row_units(x, x.dim(0), args.row_units, args.unit_bytes);
  SB_RETURN_IF_ERROR(u32_count(out_rows * static_cast<int64_t>(args.row_units), "GatherRows").status());
  const uint64_t words = words_of(x.dtype(), out.numel());
  args.out_words = static_cast<uint32_t>(words);
  // Rows of whole 16-byte units at aligned offsets: gather_rows16 (16 bytes per thread).
  const bool by16 =
      args.row_units * args.unit_bytes % 16 == 0 && args.row_units > 0 && bx.offset % 16 == 0 && bo.offset % 16 == 0;
  SB_RETURN_IF_ERROR(rt.dispatch(by16 ? "gather_rows16" : "gather_rows", {bx, bidx, bo, rt.error_word()}, &args,
                                 sizeof(args), by16 ? words / 4 : words));
  return ctx.out(out_tid, std::move(out));
}

Status gather_rows(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsGatherRowsNode();
  Tensor x, idx;
  SB_ASSIGN_OR_RETURN(BufferRef bx, bind_in(ctx, n->x.get(), &x));
  SB_ASSIGN_OR_RETURN(BufferRef bi, bind_in(ctx, n->indices.get(), &idx));
  return gather_rows_impl(ctx, x, bx, bi, idx.numel(), n->out.get());
}

Result<Scatter> invert_scatter(KernelContext& ctx, const fb::ScatterRowsNodeT* n) {
  Runtime& rt = rt_of(ctx);
  Scatter s;
  SB_ASSIGN_OR_RETURN(s.bx, bind_in(ctx, n->x.get(), &s.x));
  SB_ASSIGN_OR_RETURN(BufferRef bi, bind_in(ctx, n->indices.get(), &s.idx));
  SB_CHECK_OR_RETURN(s.idx.numel() == s.x.dim(0), StatusCode::kInvalidArgument, "%lld indices for %lld rows",
                     (long long)s.idx.numel(), (long long)s.x.dim(0));
  SB_ASSIGN_OR_RETURN(s.inv, rt.scratch(static_cast<size_t>(s.idx.numel()) * 4, 0xffffffffu));
  k::PermuteArgs args{};
  SB_ASSIGN_OR_RETURN(args.rows, u32_count(s.idx.numel(), "ScatterRows"));
  SB_RETURN_IF_ERROR(rt.dispatch("invert_permutation", {bi, s.inv, rt.error_word()}, &args, sizeof(args),
                                 static_cast<uint64_t>(args.rows)));
  return s;
}

// out[idx[p]] = x[p]: the device inverts the permutation (checking it), then gathers.
Status scatter_rows(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsScatterRowsNode();
  SB_ASSIGN_OR_RETURN(Scatter s, invert_scatter(ctx, n));
  return gather_rows_impl(ctx, s.x, s.bx, s.inv, s.x.dim(0), n->out.get());
}

// GpuDevice::fuse checked the four ops' slots, Full's shape [1], i32 and value (a k in
// [1, 2^31)); Full's output is private and never written. The keys of Argsort are i32, so the
// GatherRows and FloorDiv outputs are i32 [P] like the order.
Status moe_order(KernelContext& ctx, const std::unique_ptr<fb::InstructionT>* ins) {
  const auto* as = ins[0]->op.AsArgsortNode();
  std::vector<Tensor> outs;
  SB_RETURN_IF_ERROR(argsort_run(ctx, *as, static_cast<uint32_t>(ins[2]->op.AsFullNode()->value), outs));
  SB_RETURN_IF_ERROR(ctx.out(as->out.get(), std::move(outs[0])));
  SB_RETURN_IF_ERROR(ctx.out(ins[1]->op.AsGatherRowsNode()->out.get(), std::move(outs[1])));
  return ctx.out(ins[3]->op.AsBinaryNode()->out.get(), std::move(outs[2]));
}

void register_permute(KernelRegistry& r) {
  r.add(fb::OpNode::ArgsortNode, argsort);
  r.add(fb::OpNode::GatherRowsNode, gather_rows);
  r.add(fb::OpNode::ScatterRowsNode, scatter_rows);
}

}  // namespace switchboard::gpu
