// Gated DeltaNet's ops on the GPU (metal_shaders/linear_attention.comp): the causal conv1d (a
// thread per channel word walking the rows) and the gated delta rule (a workgroup per value head
// and 64 columns, the state in registers through the rows). Both update their state buffer in
// place and read the position on the device, so a recorded decode step replays at any position.
#include <limits>

#include "gpu_ops.h"
#include "op_shapes.h"

namespace switchboard::gpu {
namespace {

// The position only decides whether the state is read (pos > 0) or zeros (pos == 0), on the
// device: any position replays.
void guard_any_position(KernelContext& ctx, const fb::IntOrVidT* pos) {
  ctx.guard_dynamic(pos, 0, std::numeric_limits<int32_t>::max());
}

Status causal_conv1d(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsCausalConv1dNode();
  Runtime& rt = rt_of(ctx);
  Tensor x, w;
  SB_ASSIGN_OR_RETURN(BufferRef bx, bind_in(ctx, n->x.get(), &x));
  SB_ASSIGN_OR_RETURN(BufferRef bw, bind_in(ctx, n->weight.get(), &w));
  SB_ASSIGN_OR_RETURN(InPlace st, inplace_on_device(ctx, n->state.get()));
  SB_ASSIGN_OR_RETURN(BufferRef bst, rt.bind(st.dev, false));
  SB_ASSIGN_OR_RETURN(DynamicArg pos, dynamic_arg(ctx, n->pos.get()));
  SB_ASSIGN_OR_RETURN(ops::ConvDims d, ops::causal_conv1d_dims(x, w, st.dev, pos.value));
  guard_any_position(ctx, n->pos.get());
  SB_CHECK_OR_RETURN(d.k <= 8, StatusCode::kUnimplemented, "CausalConv1d on the GPU: kernel width %lld (up to 8)",
                     (long long)d.k);
  SB_CHECK_OR_RETURN(dtype_size(x.dtype()) == 4 || d.c % 2 == 0, StatusCode::kUnimplemented,
                     "CausalConv1d on the GPU: 16-bit rows of odd width %lld", (long long)d.c);
  SB_RETURN_IF_ERROR(u32_count(x.numel(), "causal_conv1d").status());
  SB_RETURN_IF_ERROR(u32_count(w.numel(), "causal_conv1d weight").status());
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(x.dtype(), x.shape()));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  k::ConvArgs args{};
  args.m = static_cast<uint32_t>(d.m);
  args.c = static_cast<uint32_t>(d.c);
  args.k = static_cast<uint32_t>(d.k);
  args.dtype = static_cast<uint32_t>(x.dtype());
  args.pos = pos.word ? 0u : static_cast<uint32_t>(pos.value > 0 ? 1 : 0);
  args.pos_word = pos.word;
  args.silu = n->silu ? 1u : 0u;
  if (d.c > 0)
    SB_RETURN_IF_ERROR(
        rt.dispatch("causal_conv1d", {bx, bw, bst, bo, pos.words}, &args, sizeof(args), words_of(x.dtype(), d.c)));
  SB_RETURN_IF_ERROR(keep_on_device(ctx, n->state.get(), st));
  return ctx.out(n->out.get(), std::move(out));
}

// Prefills from this many rows compute every row's normalized q, k and gates in a kernel of
// their own, so the row-by-row recurrence waits on no single thread's sums (decode keeps one
// dispatch).
constexpr int64_t kDeltaPrepRows = 8;

Status gated_delta_rule(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsGatedDeltaRuleNode();
  Runtime& rt = rt_of(ctx);
  Tensor qkv, a, b, a_log, dt_bias;
  SB_ASSIGN_OR_RETURN(BufferRef bq, bind_in(ctx, n->qkv.get(), &qkv));
  SB_ASSIGN_OR_RETURN(BufferRef ba, bind_in(ctx, n->a.get(), &a));
  SB_ASSIGN_OR_RETURN(BufferRef bb, bind_in(ctx, n->b.get(), &b));
  SB_ASSIGN_OR_RETURN(BufferRef bl, bind_in(ctx, n->a_log.get(), &a_log));
  SB_ASSIGN_OR_RETURN(BufferRef bd, bind_in(ctx, n->dt_bias.get(), &dt_bias));
  SB_ASSIGN_OR_RETURN(InPlace st, inplace_on_device(ctx, n->state.get()));
  SB_ASSIGN_OR_RETURN(BufferRef bst, rt.bind(st.dev, false));
  SB_ASSIGN_OR_RETURN(DynamicArg pos, dynamic_arg(ctx, n->pos.get()));
  SB_ASSIGN_OR_RETURN(ops::DeltaDims d, ops::gated_delta_rule_dims(qkv, a, b, a_log, dt_bias, st.dev, pos.value));
  guard_any_position(ctx, n->pos.get());
  SB_CHECK_OR_RETURN(d.dk <= 128, StatusCode::kUnimplemented,
                     "GatedDeltaRule on the GPU: key heads of %lld (up to 128)", (long long)d.dk);
  SB_CHECK_OR_RETURN(a_log.dtype() == dt_bias.dtype(), StatusCode::kUnimplemented,
                     "GatedDeltaRule on the GPU: a_log (%s) and dt_bias (%s) of different dtypes",
                     dtype_name(a_log.dtype()), dtype_name(dt_bias.dtype()));
  SB_CHECK_OR_RETURN(dtype_size(qkv.dtype()) == 4 || d.dv % 2 == 0, StatusCode::kUnimplemented,
                     "GatedDeltaRule on the GPU: 16-bit value heads of odd size %lld", (long long)d.dv);
  SB_RETURN_IF_ERROR(u32_count(qkv.numel(), "gated_delta_rule").status());
  SB_RETURN_IF_ERROR(u32_count(st.dev.numel(), "gated_delta_rule state").status());
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(qkv.dtype(), {d.m, d.hv, d.dv}));
  SB_RETURN_IF_ERROR(u32_count(out.numel(), "gated_delta_rule out").status());
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  k::DeltaArgs args{};
  args.m = static_cast<uint32_t>(d.m);
  args.hk = static_cast<uint32_t>(d.hk);
  args.hv = static_cast<uint32_t>(d.hv);
  args.dk = static_cast<uint32_t>(d.dk);
  args.dv = static_cast<uint32_t>(d.dv);
  args.width = static_cast<uint32_t>(d.width);
  args.dtype = static_cast<uint32_t>(qkv.dtype());
  args.ab_dtype = static_cast<uint32_t>(a_log.dtype());
  args.pos = pos.word ? 0u : static_cast<uint32_t>(pos.value > 0 ? 1 : 0);
  args.pos_word = pos.word;
  args.l2norm = n->l2norm ? 1u : 0u;
  args.scale = n->scale;
  const uint64_t groups = static_cast<uint64_t>(d.hv) * static_cast<uint64_t>((d.dv + 63) / 64);
  // Key heads of 128 (the released models'): the variants whose unrolled loops need no guards.
  const bool k128 = d.dk == 128;
  if (d.m < kDeltaPrepRows) {
    SB_RETURN_IF_ERROR(rt.dispatch(k128 ? "gated_delta_rule_128" : "gated_delta_rule",
                                   {bq, ba, bb, bl, bd, bst, bo, pos.words}, &args, sizeof(args), groups * 64));
  } else {
    // Every row's normalized q, k and gates first, all rows at once; the recurrence reads them.
    const int64_t prep_floats = d.m * d.hk * 2 * d.dk + d.m * d.hv * 2;
    SB_RETURN_IF_ERROR(u32_count(prep_floats, "gated_delta_rule prep").status());
    SB_ASSIGN_OR_RETURN(Tensor prep, rt.alloc(DType::kF32, {prep_floats}));
    SB_ASSIGN_OR_RETURN(BufferRef bp, rt.bind(prep, false));
    SB_RETURN_IF_ERROR(rt.dispatch("gated_delta_prep", {bq, ba, bb, bl, bd, bp}, &args, sizeof(args),
                                   static_cast<uint64_t>(d.m * d.hk) * 64));
    SB_RETURN_IF_ERROR(rt.dispatch(k128 ? "gated_delta_rule_128_prepped" : "gated_delta_rule_prepped",
                                   {bq, bp, bst, bo, pos.words}, &args, sizeof(args), groups * 64));
  }
  SB_RETURN_IF_ERROR(keep_on_device(ctx, n->state.get(), st));
  return ctx.out(n->out.get(), std::move(out));
}

}  // namespace

void register_linear_attention(KernelRegistry& r) {
  r.add(fb::OpNode::CausalConv1dNode, causal_conv1d);
  r.add(fb::OpNode::GatedDeltaRuleNode, gated_delta_rule);
}

}  // namespace switchboard::gpu
