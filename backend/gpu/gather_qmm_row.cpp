// GatherQmm's decode schedule on the GPU (metal_shaders/gather_qmm_row.comp): one
// workgroup per (pair, tile of outputs) quantizes its row of x itself; the fused gate/up/Glu
// and down + combine kernels, and their barrier-free hand-off after the router.
#include <algorithm>

#include "gpu_gather_qmm.h"
#include "op_shapes.h"

namespace switchboard::gpu {
namespace {

// GatherQmm takes the one-dispatch row kernel (qmm_row) up to this many (pair) rows
// where the tiles do not (each of its workgroups quantizes a row of x): below the tiles'
// pairs per expert the row kernels beat quantize + qmm several times (bench/RESULTS.md).
constexpr int64_t kQmmRowMaxPairs = 512;
// qmm_row widens its tiles while more workgroups than this would run.
constexpr int64_t kQmmRowWorkgroups = 1056;

bool row_dot4(const Runtime& rt, bool all_4bit) { return all_4bit && rt.int_dot(); }
bool row_2k(const QmmSetup& q) { return q.kdim <= SB_QMM_ROW_SMALL_K; }

}  // namespace

// Whether qmm_row (and qmm_row_glu) take these rows (not where the tiles do); then its
// outputs per workgroup and tiles per pair: about two (output, group) tasks per thread,
// widening while more than kQmmRowWorkgroups workgroups would run (each workgroup
// quantizes its row); two tasks a thread beat one or four (bench/RESULTS.md).
// `projections` (1 or 2) share SB_QMM_ROW_TERMS.
bool qmm_row_plan(QmmSetup& q, int64_t projections) {
  const int64_t groups = q.groups, nout = q.nout, pairs = q.pairs;
  // x is read 16 bytes at a time (whole 8-element units).
  if (pairs > kQmmRowMaxPairs || q.kdim > SB_QMM_STAGE_K || 2 * projections * groups > SB_QMM_ROW_TERMS ||
      (q.x.dtype() != DType::kF32 && nout % 2 != 0) || q.bx.offset % 16 != 0 || qmm_tiled(q))
    return false;
  int64_t per_wg = std::clamp<int64_t>(2 * 256 / (projections * groups), 2, 256) & ~int64_t{1};
  auto tiles = [&](int64_t t) { return (nout + t - 1) / t; };
  while (2 * per_wg * groups * projections <= SB_QMM_ROW_TERMS && 2 * per_wg <= 256 &&
         pairs * tiles(per_wg) > kQmmRowWorkgroups)
    per_wg *= 2;
  q.args.per_wg = static_cast<uint32_t>(per_wg);
  q.args.tiles = static_cast<uint32_t>(tiles(per_wg));
  return true;
}

// The row kernel for these rows: the *_2k twin (less shared memory) where K allows; the
// *_dot4 twin (packed int8 dot products, faster: bench/RESULTS.md) where the device
// has them and every expert of every projection it computes is 4-bit.

const char* qmm_row_kernel(const Runtime& rt, const QmmSetup& q, bool glu, bool all_4bit) {
  const bool dot4 = row_dot4(rt, all_4bit);
  if (row_2k(q))
    return glu ? (dot4 ? "qmm_row_glu_2k_dot4" : "qmm_row_glu_2k") : (dot4 ? "qmm_row_2k_dot4" : "qmm_row_2k");
  return glu ? (dot4 ? "qmm_row_glu_dot4" : "qmm_row_glu") : (dot4 ? "qmm_row_dot4" : "qmm_row");
}

// The specialization constants of the row kernel row_dot4 picks (gather_qmm_row_dot4.glsl:
// only the *_dot4 twins declare them): x, out and scale dtypes, the Glu kind and the group
// size, so the driver builds only the path this dispatch takes.
SpecConstants row_spec(const Runtime& rt, bool all_4bit, const k::QmmArgs& a, uint32_t glu_kind,
                       uint32_t norm_w_dtype) {
  if (!row_dot4(rt, all_4bit)) return {};
  if (norm_w_dtype != ~0u) return SpecConstants{{a.x_dtype, a.out_dtype, a.scale_dtype, glu_kind, a.group_size, norm_w_dtype}, 6};
  return SpecConstants{{a.x_dtype, a.out_dtype, a.scale_dtype, glu_kind, a.group_size}, 5};
}

// Decode's down projection with combine_weights in one dispatch (qmm_row_combine_2k):
// the row kernel stores y, and the last workgroup of each (token, tile) combines the
// token's slots from the stored y, so the bits are those of GatherQmm then Combine
// without a separate combine dispatch.
Status qmm_row_combine(KernelContext& ctx, const fb::GatherQmmNodeT* n, const QmmSetup& q, const CombineOperands& c,
                       const Tensor& y, BufferRef by) {
  Runtime& rt = rt_of(ctx);
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(y.dtype(), {c.tokens, q.nout}));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  // [token][tile] slots stored, then [token] tiles combined (qmm_row_norm_2k_dot4 waits on it).
  SB_ASSIGN_OR_RETURN(uint32_t counters, u32_count(c.tokens * q.args.tiles + c.tokens, "GatherQmm combine tiles"));
  SB_ASSIGN_OR_RETURN(BufferRef bn, rt.scratch(static_cast<size_t>(counters) * 4, 0));
  auto args = extend_qmm_args<k::QmmCombineArgs>(q.args);
  args.slots = static_cast<uint32_t>(c.slots);
  args.has_shared = c.shared.defined();
  args.shared_dtype = c.shared.defined() ? static_cast<uint32_t>(c.shared.dtype()) : 0;
  args.has_gate = c.gate.defined();
  args.gate_dtype = c.gate.defined() ? static_cast<uint32_t>(c.gate.dtype()) : 0;
  const bool dot4 = row_dot4(rt, q.all_4bit);
  const char* kernel = dot4 ? "qmm_row_combine_2k_dot4" : "qmm_row_combine_2k";
  std::vector<BufferRef> bindings = {q.bx, q.bw, q.bs,    q.bb, q.bl, q.br, q.bi, by, rt.error_word(),
                                     c.bw, c.bs, c.bgate, bn,   bo};
  // Straight after the decode gate/up that stores x (h) and counts its rows: no barrier;
  // each workgroup waits for its row's count. What the wait covers (h, the counts, the
  // router's indices and weights, read after it) takes no barrier; anything else still does.
  const MoeHandoff& h = moe_handoff(ctx);
  const bool wait = dot4 && same_ref(q.bx, h.rows) && same_ref(q.br, h.indices) && !q.args.sorted;
  args.wait_tiles = wait ? h.tiles : 0;
  if (dot4) bindings.push_back(wait ? h.done : bn);  // bn: a stand-in, not read
  SB_RETURN_IF_ERROR(rt.dispatch(kernel, bindings, &args, sizeof(args),
                                 256 * static_cast<uint64_t>(q.pairs) * q.args.tiles, row_spec(rt, q.all_4bit, q.args),
                                 wait ? handoff_mask(bindings, {h.rows, h.done, h.indices, h.weights}) : 0u));
  if (dot4 && rt.cross_dispatch_handoff()) {  // the combined rows, counted per token
    const uint64_t at = static_cast<uint64_t>(c.tokens) * q.args.tiles * 4;
    row_handoff(ctx) = {bo, BufferRef{bn.buffer, bn.offset + at, static_cast<uint64_t>(c.tokens) * 4}, q.args.tiles,
                        rt.dispatches()};
  }
  return ctx.out(n->out.get(), std::move(out));
}

// The fused gate/up/Glu of decode (GpuDevice::fuse): ins[0..1] are GatherQmm of the
// same x, indices and widths, ins[2] the Glu of their outputs. One qmm_row_glu dispatch
// when the rows suit it; otherwise the three kernels one by one.
Status gate_up_glu(KernelContext& ctx, const std::unique_ptr<fb::InstructionT>* ins) {
  const auto* glu_node = ins[2]->op.AsGluNode();
  const bool gate_first = ins[0]->op.AsGatherQmmNode()->out->idx() == glu_node->gate->idx();
  const auto* gate = ins[gate_first ? 0 : 1]->op.AsGatherQmmNode();
  const auto* up = ins[gate_first ? 1 : 0]->op.AsGatherQmmNode();
  Runtime& rt = rt_of(ctx);
  SB_ASSIGN_OR_RETURN(QmmSetup g, qmm_setup(ctx, gate));
  SB_ASSIGN_OR_RETURN(QmmSetup u, qmm_setup(ctx, up));
  const bool same =
      g.scales.shape() == u.scales.shape() && g.scales.dtype() == u.scales.dtype() && g.w.numel() == u.w.numel();
  const bool one_row_kernel = same && qmm_row_plan(g, 2);  // sets g.args for qmm_row_glu
  if (!same || (!one_row_kernel && qmm_row_plan(g, 1))) {
    // Different shapes, or rows too many for one qmm_row_glu but few enough for qmm_row:
    // the three kernels one by one.
    for (int i = 0; i < 2; ++i) SB_RETURN_IF_ERROR(gather_qmm(ctx, ins[i]->op));
    return glu(ctx, ins[2]->op);
  }
  if (!one_row_kernel) {
    // Many rows (prefill): x quantized once and one tile list for both projections (same
    // x and indices: GpuDevice::fuse checks), then the two matmuls and the Glu.
    // Both projections read the one Q8 pass: in qmm_mma4's order only if both run it.
    if (q8_permuted(rt, g) != q8_permuted(rt, u)) g.all_4bit = u.all_4bit = false;
    SB_ASSIGN_OR_RETURN(Q8Blocks q8, x_q8(ctx, g, q8_permuted(rt, g)));
    QmmTileList tiles;
    if (qmm_tiled(g)) {
      SB_ASSIGN_OR_RETURN(tiles, qmm_tile_list(rt, g));
    }
    for (QmmSetup* q : {&g, &u}) {
      SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(q->x.dtype(), {q->pairs, q->nout}));
      SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
      SB_RETURN_IF_ERROR(qmm_from_q8(rt, *q, q8, tiles.max_tiles ? &tiles : nullptr, bo));
      SB_RETURN_IF_ERROR(ctx.out((q == &g ? gate : up)->out.get(), std::move(out)));
    }
    return glu(ctx, ins[2]->op);
  }
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(g.x.dtype(), {g.pairs, g.nout}));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  k::QmmGluArgs args = glu_args(g.args, glu_node);
  const bool all_4bit = g.all_4bit && u.all_4bit;
  const char* kernel = qmm_row_kernel(rt, g, true, all_4bit);
  // Straight after the router (decode): no barrier, each workgroup stages x and then waits
  // for its pair's expert (rhs), and counts itself per pair once its h is stored, so the
  // down projection need not wait for a barrier either (bench/RESULTS.md).
  const bool dot4_2k = row_dot4(rt, all_4bit) && row_2k(g);  // qmm_row_glu_2k_dot4: binding 12 = the counts
  MoeHandoff& h = moe_handoff(ctx);
  const bool wait = dot4_2k && g.args.has_rhs && !g.args.sorted && same_ref(g.br, h.indices);
  // x the norm output the router's GEMV stores (norm_matmul_router): waited on too.
  const bool wait_x = wait && h.norm_count && same_ref(g.bx, h.norm_out);
  args.wait_rhs = wait;
  args.wait_x = wait_x ? h.norm_count : 0;
  std::vector<BufferRef> bindings = {g.bx, g.bw, g.bs, g.bb, g.bl, g.br, g.bi, bo, rt.error_word(), u.bw, u.bs, u.bb};
  if (wait) {
    SB_ASSIGN_OR_RETURN(BufferRef done, rt.scratch(static_cast<size_t>(g.pairs) * 4, 0));
    bindings.push_back(done);
    h.rows = bo, h.done = done, h.tiles = args.tiles;
  } else if (dot4_2k) {
    bindings.push_back(rt.error_word());  // a stand-in, not touched without wait_rhs
  }
  if (dot4_2k) bindings.push_back(wait_x ? h.norm_done : rt.error_word());  // the error word: not read
  const uint32_t handed = !wait ? 0u : wait_x ? handoff_mask(bindings, {h.indices, h.norm_out, h.norm_done})
                                              : handoff_mask(bindings, {h.indices});
  SB_RETURN_IF_ERROR(rt.dispatch(kernel, bindings, &args, sizeof(args),
                                 256 * static_cast<uint64_t>(g.pairs) * args.tiles,
                                 row_spec(rt, all_4bit, g.args, args.glu_kind), handed));
  return ctx.out(glu_node->out.get(), std::move(out));
}

namespace {

// RmsNorm (order Tree32, no gate) and the GatherQmm of its output (GpuDevice::fuse): where the
// rows suit qmm_row_norm_2k, every workgroup normalizes its row itself just before quantizing
// it, and the first tile of a row stores its sum (and its normalized values when `store_out`)
// — the bits of the two ops, one dispatch instead of two dependent ones. Rows that GatherQmm
// quantizes first (prefill) take norm_q8_qmm; otherwise the two ops one by one.
Status norm_then_qmm(KernelContext& ctx, const std::unique_ptr<fb::InstructionT>* ins, bool store_out) {
  const auto& nn = *ins[0]->op.AsRmsNormNode();
  const auto* qn = ins[1]->op.AsGatherQmmNode();
  Runtime& rt = rt_of(ctx);
  Tensor x, res, w;
  SB_ASSIGN_OR_RETURN(BufferRef bx, bind_in(ctx, nn.x.get(), &x));
  SB_ASSIGN_OR_RETURN(BufferRef bw, bind_in(ctx, nn.weight.get(), &w));
  BufferRef br = bx;  // never read without a residual
  if (nn.residual) {
    SB_ASSIGN_OR_RETURN(br, bind_in(ctx, nn.residual.get(), &res));
  }
  const int64_t d = x.rank() ? x.dim(x.rank() - 1) : 0;
  SB_ASSIGN_OR_RETURN(QmmSetup q, qmm_setup(ctx, qn, &x));
  q.bx = bx;
  const bool fits = x.rank() == 2 && d == q.kdim && w.numel() == d && q.kdim <= SB_QMM_ROW_SMALL_K && !q.args.has_lhs &&
                    !q.args.has_rhs && q.pairs == q.rows && q.rows == x.dim(0) &&
                    (!nn.residual || (res.shape() == x.shape() && br.offset % 16 == 0)) && qmm_row_plan(q, 1);
  if (!fits) {
    SB_ASSIGN_OR_RETURN(bool done, norm_q8_qmm(ctx, nn, qn, q, NormOperands{x, res, w, bx, br, bw}, store_out));
    if (done) return Status::ok();
    SB_RETURN_IF_ERROR(rms_norm(ctx, ins[0]->op));
    return gather_qmm(ctx, ins[1]->op);
  }
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(x.dtype(), {q.pairs, q.nout}));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  SB_ASSIGN_OR_RETURN(NormOutputs no, alloc_norm_outputs(rt, x, store_out, nn.residual != nullptr, bo));
  auto args = extend_qmm_args<k::QmmNormArgs>(q.args);
  args.has_residual = nn.residual ? 1u : 0u;
  args.inv_d = ops::inverse_count(d);
  args.eps = nn.eps;
  args.w_dtype = static_cast<uint32_t>(w.dtype());
  args.store_out = store_out ? 1u : 0u;
  const bool dot4 = row_dot4(rt, q.all_4bit);
  std::vector<BufferRef> bindings = {bx, q.bw, q.bs, q.bb, q.bl, q.br, q.bi, bo, rt.error_word(), br, bw, no.bn, no.bs};
  uint32_t handed = 0;
  if (dot4) {
    // Straight after the down projection that combines x or the residual (a decoder's MoE
    // output) and counts its tiles per row (qmm_row_combine): no barrier; each workgroup
    // waits for its row's count.
    const RowHandoff* h = handed_to(ctx, bx);
    if (!h && nn.residual) h = handed_to(ctx, br);
    args.wait_tiles = h ? h->count : 0;
    bindings.push_back(h ? h->done : rt.error_word());  // the error word: a stand-in, not read
    // The other operand, where it is the sum the router's GEMV stored (norm_matmul_router), is
    // older than the combined rows this waits for: every dispatch between waited on the one before.
    const MoeHandoff& mh = moe_handoff(ctx);
    const BufferRef other = h && same_ref(bx, h->out) ? br : bx;
    const bool sum_handed = h && nn.residual && mh.norm_count && same_ref(other, mh.norm_sum);
    if (h) handed = sum_handed ? handoff_mask(bindings, {h->out, h->done, other}) : handoff_mask(bindings, {h->out, h->done});
  }
  const char* kernel = dot4 ? "qmm_row_norm_2k_dot4" : "qmm_row_norm_2k";
  SB_RETURN_IF_ERROR(rt.dispatch(kernel, bindings, &args, sizeof(args),
                                 256 * static_cast<uint64_t>(q.pairs) * q.args.tiles,
                                 row_spec(rt, q.all_4bit, q.args, 0, args.w_dtype), handed));
  if (nn.residual) SB_RETURN_IF_ERROR(ctx.out(nn.sum.get(), std::move(no.sum)));
  if (store_out) SB_RETURN_IF_ERROR(ctx.out(nn.out.get(), std::move(no.normed)));
  return ctx.out(qn->out.get(), std::move(out));
}

}  // namespace

Status norm_qmm(KernelContext& ctx, const std::unique_ptr<fb::InstructionT>* ins) {
  return norm_then_qmm(ctx, ins, true);
}
Status norm_qmm_private(KernelContext& ctx, const std::unique_ptr<fb::InstructionT>* ins) {
  return norm_then_qmm(ctx, ins, false);
}

}  // namespace switchboard::gpu
