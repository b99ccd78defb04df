// The fused routers on the GPU (metal_shaders/router.comp): one workgroup per token.
#include <algorithm>

#include "gpu_gather_qmm.h"
#include "gpu_ops.h"

namespace switchboard::gpu {
namespace {

// `done`, `wait`: the logits' matmul counts its workgroups at `done`, recorded just before
// with no barrier; the router waits until `wait` have (0: no wait).
Status router_run(KernelContext& ctx, const fb::OpNodeUnion& op, BufferRef done, uint32_t wait) {
  const auto* n = op.AsRouterNode();
  Runtime& rt = rt_of(ctx);
  Tensor logits, bias, scale;
  SB_ASSIGN_OR_RETURN(BufferRef bl, bind_in(ctx, n->logits.get(), &logits));
  BufferRef bb = bl, bs = bl;  // stand-ins when absent
  if (n->selection_bias) {
    SB_ASSIGN_OR_RETURN(bb, bind_in(ctx, n->selection_bias.get(), &bias));
  }
  if (n->expert_scale) {
    SB_ASSIGN_OR_RETURN(bs, bind_in(ctx, n->expert_scale.get(), &scale));
  }
  const int64_t tokens = logits.dim(0), e = logits.dim(1);
  std::vector<uint32_t> live(static_cast<size_t>(e), 1);
  for (int32_t p : n->pruned_experts) live[static_cast<size_t>(p)] = 0;
  SB_ASSIGN_OR_RETURN(Tensor live_t, Tensor::from_vector(DType::kU32, {e}, live));
  SB_ASSIGN_OR_RETURN(BufferRef blive, rt.bind(live_t, false));
  SB_ASSIGN_OR_RETURN(Tensor weights, rt.alloc(DType::kF32, {tokens, n->k}));
  // Host-written when the hand-off below fills it.
  SB_ASSIGN_OR_RETURN(Tensor indices, rt.cross_dispatch_handoff() ? rt.alloc_host_written(DType::kI32, {tokens, n->k})
                                                                  : rt.alloc(DType::kI32, {tokens, n->k}));
  SB_ASSIGN_OR_RETURN(BufferRef bw, rt.bind(weights, false));
  SB_ASSIGN_OR_RETURN(BufferRef bi, rt.bind(indices, false));
  if (rt.cross_dispatch_handoff()) {  // -1 until the router writes: see qmm_row_glu_2k_dot4's wait
    SB_RETURN_IF_ERROR(rt.fill(indices, 0xffffffffu));  // refilled before every replay too
    moe_handoff(ctx) = {bi, bw, {}, {}, 0};
  }
  SB_CHECK_OR_RETURN(e <= 1024 && n->k <= 64, StatusCode::kUnimplemented,
                     "Router on the GPU: %lld experts / k = %d exceed 1024 / 64", (long long)e, n->k);
  k::RouterArgs args{};
  args.tokens = static_cast<uint32_t>(tokens);
  args.experts = static_cast<uint32_t>(e);
  args.k = static_cast<uint32_t>(n->k);
  args.kind = static_cast<uint32_t>(n->kind);
  args.dtype = static_cast<uint32_t>(logits.dtype());
  args.renormalize = n->renormalize;
  args.n_group = static_cast<uint32_t>(n->n_group);
  args.topk_group = static_cast<uint32_t>(n->topk_group);
  args.routed_scaling_factor = n->routed_scaling_factor;
  args.has_bias = bias.defined();
  args.has_scale = scale.defined();
  args.wait_count = wait;
  // One workgroup of 256 threads per token (router.comp); the router_e256_* variants have
  // a quarter of the shared memory and only their kind's code.
  static constexpr const char* kE256[] = {"router_e256_softmax", "router_e256_topk_softmax", "router_e256_sigmoid"};
  SB_CHECK_OR_RETURN(args.kind < 3, StatusCode::kInvalidArgument, "Router kind %u is not known", args.kind);
  const std::vector<BufferRef> bindings = {bl, bb, bs, blive, bw, bi, rt.error_word(), wait ? done : rt.error_word()};
  SB_RETURN_IF_ERROR(rt.dispatch(e <= 256 ? kE256[args.kind] : "router", bindings, &args, sizeof(args),
                                 256 * static_cast<uint64_t>(tokens), {},
                                 wait ? handoff_mask(bindings, {bl, done}) : 0u));
  SB_RETURN_IF_ERROR(ctx.out(n->weights.get(), std::move(weights)));
  return ctx.out(n->indices.get(), std::move(indices));
}

Status router(KernelContext& ctx, const fb::OpNodeUnion& op) { return router_run(ctx, op, {}, 0); }

}  // namespace

// Decode's router logits and the Router (GpuDevice::fuse): no barrier between the two where
// dispatches hand off; the router polls the GEMV's count of workgroups done.
Status matmul_router(KernelContext& ctx, const std::unique_ptr<fb::InstructionT>* ins) {
  Runtime& rt = rt_of(ctx);
  const bool handoff = rt.cross_dispatch_handoff();
  BufferRef done;
  uint32_t counted = 0;
  if (handoff) {
    SB_ASSIGN_OR_RETURN(done, rt.scratch(4, 0));
  }
  SB_RETURN_IF_ERROR(matmul_run(ctx, ins[0]->op, handoff ? &done : nullptr, &counted));
  return router_run(ctx, ins[1]->op, done, counted);
}

namespace {

// RmsNorm (Tree32), the router's Matmul and the Router on rows the fused GEMV does not take: the
// norm as rms_norm_tree_q8, its Q8 blocks (qmm_mma4's order on int8 tensor cores) held in the
// hand-off for the experts' gate/up (x_q8), one quantize_q8 fewer. false: nothing recorded.
Result<bool> norm_q8_router(KernelContext& ctx, const std::unique_ptr<fb::InstructionT>* ins) {
  const auto& nn = *ins[0]->op.AsRmsNormNode();
  NormOperands in;
  SB_ASSIGN_OR_RETURN(in.bx, bind_in(ctx, nn.x.get(), &in.x));
  SB_ASSIGN_OR_RETURN(in.bw, bind_in(ctx, nn.weight.get(), &in.w));
  in.br = in.bx;  // never read without a residual
  if (nn.residual) {
    SB_ASSIGN_OR_RETURN(in.br, bind_in(ctx, nn.residual.get(), &in.res));
  }
  if (!norm_q8_fits(nn, in) || in.x.dim(0) < kPrefillQ8MinRows) return false;
  Tensor normed;
  BufferRef bn;
  SB_ASSIGN_OR_RETURN(Q8Blocks q8, norm_q8_run(ctx, nn, in, true, rt_of(ctx).int8_mma(), &normed, &bn));
  SB_RETURN_IF_ERROR(matmul_router(ctx, ins + 1));
  hold_x_q8(ctx, std::move(normed), bn, std::move(q8));  // after the router's record, which resets the hand-off
  return true;
}

}  // namespace

Status norm_matmul_router(KernelContext& ctx, const std::unique_ptr<fb::InstructionT>* ins) {
  Runtime& rt = rt_of(ctx);
  if (rt.cross_dispatch_handoff()) {
    SB_ASSIGN_OR_RETURN(BufferRef done, rt.scratch(4, 0));
    uint32_t counted = 0;
    BufferRef out, sum;
    std::vector<Tensor> keep;
    SB_ASSIGN_OR_RETURN(bool fused, norm_matmul_run(ctx, *ins[0]->op.AsRmsNormNode(), ins[1]->op, done, &counted,
                                                    &out, &sum, &keep));
    if (fused) {
      SB_RETURN_IF_ERROR(router_run(ctx, ins[2]->op, done, counted));
      MoeHandoff& h = moe_handoff(ctx);  // for the experts' gate/up (x) and the next norm (sum)
      h.norm_out = out, h.norm_sum = sum, h.norm_done = done, h.norm_count = counted;
      h.norm_keep = std::move(keep);
      return Status::ok();
    }
  }
  SB_ASSIGN_OR_RETURN(bool with_q8, norm_q8_router(ctx, ins));
  if (with_q8) return Status::ok();
  SB_RETURN_IF_ERROR(rms_norm(ctx, ins[0]->op));
  return matmul_router(ctx, ins + 1);
}

void register_router(KernelRegistry& r) { r.add(fb::OpNode::RouterNode, router); }

}  // namespace switchboard::gpu
