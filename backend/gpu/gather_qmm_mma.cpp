// GatherQmm on int8 tensor cores (metal_shaders/gather_qmm_mma.comp; Vulkan with
// VK_NV_cooperative_matrix): the tiles' kernel choice, and the sorted MoE FFN whose gate/up
// kernel writes h's Q8 blocks directly.
#include "gpu_gather_qmm.h"

namespace switchboard::gpu {

const char* qmm_tile_kernel(Runtime& rt, const QmmSetup& q) {
  return rt.int8_mma() ? (q.all_4bit ? "qmm_mma4" : "qmm_mma") : "qmm_tile";
}

SpecConstants qmm_tile_spec(const char* kernel, const k::QmmArgs& a, uint32_t glu_kind) {
  if (std::strncmp(kernel, "qmm_mma", 7) != 0) return {};
  SpecConstants s{{a.scale_dtype, a.out_dtype, glu_kind}, 3};
  add_extents(s, {a.k, a.n, a.group_size});
  return s;
}

// Whether a GatherQmm's Q8 blocks are made in qmm_mma4's order.
bool q8_permuted(Runtime& rt, const QmmSetup& q) {
  return qmm_tiled(q) && std::strcmp(qmm_tile_kernel(rt, q), "qmm_mma4") == 0;
}

// A sorted MoE FFN (GpuDevice::fuse): ins[0..2] as gate_up_glu, ins[3] the down
// GatherQmm of the Glu's private output with the same experts. On int8 tensor cores with
// every expert 4-bit: x quantized once, one work list for all three projections, and
// qmm_mma4_glu writes the Q8 blocks of h = Glu(gate, up) directly, so h is never stored
// nor quantized again. Anything else runs gate_up_glu, then the down projection.
Status moe_ffn(KernelContext& ctx, const std::unique_ptr<fb::InstructionT>* ins) {
  const auto* glu_node = ins[2]->op.AsGluNode();
  const bool gate_first = ins[0]->op.AsGatherQmmNode()->out->idx() == glu_node->gate->idx();
  const auto* gate = ins[gate_first ? 0 : 1]->op.AsGatherQmmNode();
  const auto* up = ins[gate_first ? 1 : 0]->op.AsGatherQmmNode();
  const auto* down = ins[3]->op.AsGatherQmmNode();
  Runtime& rt = rt_of(ctx);
  SB_ASSIGN_OR_RETURN(QmmSetup g, qmm_setup(ctx, gate));
  SB_ASSIGN_OR_RETURN(QmmSetup u, qmm_setup(ctx, up));
  const bool fast = rt.int8_mma() && g.all_4bit && u.all_4bit && qmm_tiled(g) && g.scales.shape() == u.scales.shape() &&
                    g.scales.dtype() == u.scales.dtype() && g.w.numel() == u.w.numel() && g.nout % 32 == 0;
  Tensor h_shape = Tensor::wrap(g.x.dtype(), {g.pairs, g.nout}, nullptr, nullptr);
  QmmSetup d;
  if (fast) {
    SB_ASSIGN_OR_RETURN(d, qmm_setup(ctx, down, &h_shape));
  }
  if (!fast || !d.all_4bit || d.kdim != g.nout || d.pairs != g.pairs || d.experts != g.experts || !qmm_tiled(d)) {
    SB_RETURN_IF_ERROR(gate_up_glu(ctx, ins));
    return gather_qmm(ctx, ins[3]->op);
  }
  SB_ASSIGN_OR_RETURN(Q8Blocks q8, x_q8(ctx, g, true));
  SB_ASSIGN_OR_RETURN(QmmTileList tiles, qmm_tile_list(rt, g));
  SB_ASSIGN_OR_RETURN(Q8Blocks h, alloc_q8(rt, g.pairs, g.nout, true));  // h's, in qmm_mma4's K order
  k::QmmGluArgs args = glu_args(g.args, glu_node);
  args.tiles = static_cast<uint32_t>(g.nout / 32);  // column blocks of 32 (gate and up: 64 weight rows)
  args.per_wg = tiles.tile_pairs;
  SB_RETURN_IF_ERROR(rt.dispatch("qmm_mma4_glu",
                                 {q8.bq, q8.bd, q8.bsum, g.bw, g.bs, g.bb, g.bl, tiles.bt, g.bi, h.bq, rt.error_word(),
                                  u.bw, u.bs, u.bb, h.bd, h.bsum},
                                 &args, sizeof(args), 256 * static_cast<uint64_t>(tiles.max_tiles) * args.tiles,
                                 qmm_tile_spec("qmm_mma4_glu", g.args, args.glu_kind)));
  return gather_qmm_run(ctx, down, d, &h, &tiles);
}

}  // namespace switchboard::gpu
