// GatherQmm on the GPU: its setup from the shared plan (ops::plan_gather_qmm), x's Q8
// activation blocks and the generic per-pair kernel (metal_shaders/gather_qmm.comp), and
// the choice among the schedules of gather_qmm_row.cpp, gather_qmm_tile.cpp and
// gather_qmm_mma.cpp. Every schedule gives the bits of the integer contract.
#include <algorithm>

#include "gpu_gather_qmm.h"

namespace switchboard::gpu {

Result<QmmSetup> qmm_setup(KernelContext& ctx, const fb::GatherQmmNodeT* n, const Tensor* x_shape) {
  QmmSetup q;
  SB_ASSIGN_OR_RETURN(q.bw, bind_in(ctx, n->w.get(), &q.w));
  if (x_shape) {
    q.x = *x_shape;
    q.bx = q.bw;
  } else {
    SB_ASSIGN_OR_RETURN(q.bx, bind_in(ctx, n->x.get(), &q.x));
  }
  SB_ASSIGN_OR_RETURN(q.bs, bind_in(ctx, n->scales.get(), &q.scales));
  SB_ASSIGN_OR_RETURN(q.bb, bind_in(ctx, n->biases.get(), &q.biases));
  SB_RETURN_IF_ERROR(bind_indices(ctx, n->lhs_indices, n->rhs_indices, q.bx, q.lhs, q.rhs, q.bl, q.br));
  SB_ASSIGN_OR_RETURN(ops::GatherQmmPlan plan,
                      ops::plan_gather_qmm(*n, q.x, q.scales, q.w.numel(), q.lhs.defined() ? q.lhs.numel() : -1,
                                           q.rhs.defined() ? q.rhs.numel() : -1));
  // Per-expert widths, then where each expert's codes start (the kernels' expert table).
  std::vector<uint32_t> info(static_cast<size_t>(2 * plan.experts));
  for (int64_t e = 0; e < plan.experts; ++e) {
    info[static_cast<size_t>(e)] = static_cast<uint32_t>(plan.bits[static_cast<size_t>(e)]);
    info[static_cast<size_t>(plan.experts + e)] = static_cast<uint32_t>(plan.word_offset[static_cast<size_t>(e)]);
  }
  q.all_4bit = plan.all_4bit;
  q.mma = rt_of(ctx).int8_mma();
  const int64_t rows = plan.rows, kdim = plan.k, pairs = plan.pairs;
  SB_RETURN_IF_ERROR(u32_count(plan.words, "GatherQmm weights").status());
  SB_RETURN_IF_ERROR(u32_count(pairs * plan.nout, "GatherQmm").status());
  SB_RETURN_IF_ERROR(u32_count(pairs * rows, "GatherQmm pairs x rows").status());
  if (n->sorted_indices) {
    SB_ASSIGN_OR_RETURN(q.sorted, ctx.resolve(n->sorted_indices.get()));
  }
  SB_ASSIGN_OR_RETURN(q.bi, node_table(ctx, n, info));
  SB_RETURN_IF_ERROR(u32_count(rows * kdim, "GatherQmm x").status());
  k::QmmArgs& args = q.args;
  args.pairs = static_cast<uint32_t>(pairs);
  args.n = static_cast<uint32_t>(plan.nout);
  args.k = static_cast<uint32_t>(kdim);
  args.groups = static_cast<uint32_t>(plan.groups);
  args.group_size = static_cast<uint32_t>(n->group_size);
  args.rows = static_cast<uint32_t>(rows);
  args.experts = static_cast<uint32_t>(plan.experts);
  args.scale_dtype = static_cast<uint32_t>(q.scales.dtype());
  args.out_dtype = static_cast<uint32_t>(q.x.dtype());
  args.x_dtype = static_cast<uint32_t>(q.x.dtype());
  args.has_lhs = q.lhs.defined();
  args.has_rhs = q.rhs.defined();
  args.sorted = q.sorted != 0;
  q.rows = rows, q.kdim = kdim, q.experts = plan.experts, q.nout = plan.nout, q.pairs = pairs, q.groups = plan.groups;
  return q;
}

Result<Q8Blocks> alloc_q8(Runtime& rt, int64_t rows, int64_t k, bool permuted) {
  Q8Blocks b;
  const int64_t blocks = rows * (k / 32);
  SB_ASSIGN_OR_RETURN(b.xq, rt.alloc(DType::kI32, {blocks * 8}));
  SB_ASSIGN_OR_RETURN(b.d, rt.alloc(DType::kF32, {blocks}));
  SB_ASSIGN_OR_RETURN(b.s, rt.alloc(DType::kI32, {blocks}));
  SB_ASSIGN_OR_RETURN(b.bq, rt.bind(b.xq, false));
  SB_ASSIGN_OR_RETURN(b.bd, rt.bind(b.d, false));
  SB_ASSIGN_OR_RETURN(b.bsum, rt.bind(b.s, false));
  // The int8 MMA kernels read the codes 16 bytes at a time.
  SB_CHECK_OR_RETURN(!rt.int8_mma() || b.bq.offset % 16 == 0, StatusCode::kInternal,
                     "GatherQmm: Q8 codes at offset %llu, not 16-byte aligned for qmm_mma's loads",
                     (unsigned long long)b.bq.offset);
  b.permuted = permuted;
  return b;
}

Result<Q8Blocks> quantize_rows(Runtime& rt, const QmmSetup& q, bool permute) {
  const int64_t blocks = q.rows * (q.kdim / 32);
  SB_ASSIGN_OR_RETURN(Q8Blocks b, alloc_q8(rt, q.rows, q.kdim, permute));
  k::Q8Args qa{static_cast<uint32_t>(q.rows), static_cast<uint32_t>(q.kdim), static_cast<uint32_t>(q.x.dtype()),
               permute ? 1u : 0u};
  const bool by16 = q.bx.offset % 16 == 0 && b.bq.offset % 16 == 0;  // 16-byte loads and stores
  SB_RETURN_IF_ERROR(rt.dispatch(by16 ? "quantize_q8_16" : "quantize_q8", {q.bx, b.bq, b.bd, b.bsum}, &qa, sizeof(qa),
                                 static_cast<uint64_t>(blocks)));
  return b;
}

Status qmm_from_q8(Runtime& rt, QmmSetup& q, const Q8Blocks& q8, const QmmTileList* tiles, BufferRef bo) {
  SB_CHECK_OR_RETURN(q8.permuted == (tiles && q8_permuted(rt, q)), StatusCode::kInternal,
                     "GatherQmm: Q8 blocks in the wrong K order for its kernel");
  k::QmmArgs& args = q.args;
  if (tiles) {
    args.tiles = static_cast<uint32_t>((q.nout + 63) / 64);
    args.per_wg = tiles->tile_pairs;  // without rhs: the pairs a tile (qmm_tile_list)
    const char* kernel = qmm_tile_kernel(rt, q);
    return rt.dispatch(kernel, {q8.bq, q8.bd, q8.bsum, q.bw, q.bs, q.bb, q.bl, tiles->bt, q.bi, bo, rt.error_word()},
                       &args, sizeof(args), 256 * static_cast<uint64_t>(tiles->max_tiles) * args.tiles,
                       qmm_tile_spec(kernel, args));
  }
  // Outputs per workgroup: enough (output, group) tasks for its 64 threads, even so
  // f16/bf16 words are whole, within the shader's shared arrays (gather_qmm.comp).
  int64_t per_wg = std::clamp<int64_t>(64 / std::max<int64_t>(q.groups, 1), 2, 64) & ~int64_t{1};
  SB_CHECK_OR_RETURN(per_wg * q.groups <= 1024, StatusCode::kUnimplemented,
                     "GatherQmm on Vulkan: %lld groups per row exceed 512", (long long)q.groups);
  args.per_wg = static_cast<uint32_t>(per_wg);
  const uint64_t workgroups = static_cast<uint64_t>((q.pairs * q.nout + per_wg - 1) / per_wg);
  return rt.dispatch("qmm", {q8.bq, q8.bd, q8.bsum, q.bw, q.bs, q.bb, q.bl, q.br, q.bi, bo, rt.error_word()}, &args,
                     sizeof(args), 64 * workgroups);
}

Status gather_qmm_run(KernelContext& ctx, const fb::GatherQmmNodeT* n, QmmSetup& q, const Q8Blocks* pre,
                      const QmmTileList* pre_tiles) {
  Runtime& rt = rt_of(ctx);
  CombineOperands c;
  if (n->combine_weights) {
    SB_ASSIGN_OR_RETURN(c, bind_combine(ctx, n->combine_weights.get(), n->shared.get(), n->shared_gate.get(), q.nout));
    SB_CHECK_OR_RETURN(c.tokens * c.slots == q.pairs, StatusCode::kInvalidArgument,
                       "combine_weights %s does not match %lld pairs", shape_str(c.w.shape()).c_str(),
                       (long long)q.pairs);
  }
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(q.x.dtype(), {q.pairs, q.nout}));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  if (pre) {
    SB_RETURN_IF_ERROR(qmm_from_q8(rt, q, *pre, pre_tiles, bo));
  } else if (qmm_row_plan(q, 1)) {
    // One workgroup per (pair, tile of outputs) quantizes its row itself: no Q8 dispatch.
    if (n->combine_weights && q.kdim <= SB_QMM_ROW_SMALL_K && rt.cross_workgroup_handoff())
      return qmm_row_combine(ctx, n, q, c, out, bo);
    const char* kernel = qmm_row_kernel(rt, q, false, q.all_4bit);
    SB_RETURN_IF_ERROR(rt.dispatch(kernel, {q.bx, q.bw, q.bs, q.bb, q.bl, q.br, q.bi, bo, rt.error_word()}, &q.args,
                                   sizeof(q.args), 256 * static_cast<uint64_t>(q.pairs) * q.args.tiles,
                                   row_spec(rt, q.all_4bit, q.args)));
  } else {
    SB_ASSIGN_OR_RETURN(Q8Blocks q8, x_q8(ctx, q, q8_permuted(rt, q)));
    QmmTileList tiles;
    if (qmm_tiled(q)) {
      SB_ASSIGN_OR_RETURN(tiles, qmm_tile_list(rt, q));
    }
    SB_RETURN_IF_ERROR(qmm_from_q8(rt, q, q8, tiles.max_tiles ? &tiles : nullptr, bo));
  }
  if (!n->combine_weights) return ctx.out(n->out.get(), std::move(out));
  // Fused down-projection + combine: by the contract its bits are those of the stored
  // (rounded) product followed by Combine, which is what the device runs (a one-kernel
  // version that staged every slot's row per workgroup was slower: bench/RESULTS.md).
  return combine_impl(ctx, out, bo, c, n->out.get());
}

Result<NormOutputs> alloc_norm_outputs(Runtime& rt, const Tensor& x, bool store_out, bool residual, BufferRef stand_in) {
  NormOutputs o;
  o.bn = o.bs = stand_in;
  if (store_out) {
    SB_ASSIGN_OR_RETURN(o.normed, rt.alloc(x.dtype(), x.shape()));
    SB_ASSIGN_OR_RETURN(o.bn, rt.bind(o.normed, false));
  }
  if (residual) {
    SB_ASSIGN_OR_RETURN(o.sum, rt.alloc(x.dtype(), x.shape()));
    SB_ASSIGN_OR_RETURN(o.bs, rt.bind(o.sum, false));
  }
  return o;
}

bool norm_q8_fits(const fb::RmsNormNodeT& nn, const NormOperands& in) {
  const Tensor& x = in.x;
  const int64_t d = x.rank() == 2 ? x.dim(1) : 0;
  return x.rank() == 2 && x.dim(0) > 0 && d % 32 == 0 && d > 0 && d <= SB_NORM_ROW_MAX && in.w.numel() == d &&
         dtype_is_float(x.dtype()) && !nn.gate && (!nn.residual || in.res.shape() == x.shape());
}

Result<Q8Blocks> norm_q8_run(KernelContext& ctx, const fb::RmsNormNodeT& nn, const NormOperands& in, bool store_out,
                             bool permute, Tensor* normed_out, BufferRef* normed_ref) {
  Runtime& rt = rt_of(ctx);
  const Tensor& x = in.x;
  const int64_t rows = x.dim(0), d = x.dim(1);
  SB_RETURN_IF_ERROR(u32_count(x.numel(), "rms_norm_tree_q8").status());
  SB_ASSIGN_OR_RETURN(Q8Blocks q8, alloc_q8(rt, rows, d, permute));
  SB_ASSIGN_OR_RETURN(NormOutputs no, alloc_norm_outputs(rt, x, store_out, nn.residual != nullptr, q8.bq));
  k::NormQ8Args args{};
  args.rows = static_cast<uint32_t>(rows);
  args.d = static_cast<uint32_t>(d);
  args.dtype = args.out_dtype = static_cast<uint32_t>(x.dtype());
  args.inv_d = ops::inverse_count(d);
  args.eps = nn.eps;
  args.pad0 = nn.residual ? 1u : 0u;
  args.w_dtype = static_cast<uint32_t>(in.w.dtype());
  args.permute = permute ? 1u : 0u;
  args.store_out = store_out ? 1u : 0u;
  SB_RETURN_IF_ERROR(rt.dispatch("rms_norm_tree_q8", {in.bx, in.br, in.bw, no.bn, no.bs, q8.bq, q8.bd, q8.bsum}, &args,
                                 sizeof(args), static_cast<uint64_t>(rows) * 256,
                                 dtype_spec({x.dtype(), in.w.dtype()}, {d})));
  if (nn.residual) SB_RETURN_IF_ERROR(ctx.out(nn.sum.get(), std::move(no.sum)));
  if (store_out) {
    if (normed_out) *normed_out = no.normed;
    if (normed_ref) *normed_ref = no.bn;
    SB_RETURN_IF_ERROR(ctx.out(nn.out.get(), std::move(no.normed)));
  }
  return q8;
}

Result<bool> norm_q8_qmm(KernelContext& ctx, const fb::RmsNormNodeT& nn, const fb::GatherQmmNodeT* qn, QmmSetup& q,
                         const NormOperands& in, bool store_out) {
  if (!norm_q8_fits(nn, in)) return false;
  const int64_t rows = in.x.dim(0);
  if (in.x.dim(1) != q.kdim || q.args.has_lhs || q.args.has_rhs || qn->combine_weights || q.pairs != rows ||
      q.rows != rows || qmm_row_plan(q, 1))
    return false;
  Runtime& rt = rt_of(ctx);
  SB_ASSIGN_OR_RETURN(Q8Blocks q8, norm_q8_run(ctx, nn, in, store_out, q8_permuted(rt, q)));
  QmmTileList tiles;
  if (qmm_tiled(q)) {
    SB_ASSIGN_OR_RETURN(tiles, qmm_tile_list(rt, q));
  }
  SB_RETURN_IF_ERROR(gather_qmm_run(ctx, qn, q, &q8, tiles.max_tiles ? &tiles : nullptr));
  return true;
}

void hold_x_q8(KernelContext& ctx, Tensor of, BufferRef bx, Q8Blocks q8) {
  MoeHandoff& h = moe_handoff(ctx);
  h.x_q8 = std::move(q8);
  h.x_q8_of = std::move(of);
  h.x_q8_bx = bx;
}

Result<Q8Blocks> x_q8(KernelContext& ctx, const QmmSetup& q, bool permute) {
  MoeHandoff& h = moe_handoff(ctx);
  if (h.x_q8_of.defined() && same_ref(q.bx, h.x_q8_bx) && h.x_q8.permuted == permute && h.x_q8_of.dtype() == q.x.dtype() &&
      h.x_q8_of.numel() == q.rows * q.kdim) {
    // One reader (the experts' gate/up: the router fusion's condition; the o-projection): let go
    // of them here, or they would stay pinned through the decode steps after a prefill.
    Q8Blocks q8 = std::move(h.x_q8);
    h.x_q8 = {};
    h.x_q8_of = {};
    h.x_q8_bx = {};
    return q8;
  }
  return quantize_rows(rt_of(ctx), q, permute);
}

Status gather_qmm(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsGatherQmmNode();
  SB_ASSIGN_OR_RETURN(QmmSetup q, qmm_setup(ctx, n));
  return gather_qmm_run(ctx, n, q);
}

k::QmmGluArgs glu_args(const k::QmmArgs& qa, const fb::GluNodeT* glu_node) {
  auto args = extend_qmm_args<k::QmmGluArgs>(qa);
  args.glu_kind = static_cast<uint32_t>(glu_node->kind);
  args.glu_alpha = glu_node->alpha;
  args.glu_limit = glu_node->limit;
  return args;
}

void register_gather_qmm(KernelRegistry& r) { r.add(fb::OpNode::GatherQmmNode, gather_qmm); }

}  // namespace switchboard::gpu
