// Rotary embedding on the GPU (metal_shaders/rope.comp): one thread per output word, or with a
// per-head RMSNorm one workgroup per head row; optionally appending to a [S, h, hd] cache.
#include <algorithm>

#include "gpu_ops.h"
#include "op_shapes.h"

namespace switchboard::gpu {
namespace {

// The arguments both forms share (sizes, position, dtype, the norm's eps and 1 / hd).
k::RopeArgs rope_args(const ops::RopeDims& d, const DynamicArg& pos, DType dt, float eps) {
  k::RopeArgs args{};
  args.m = static_cast<uint32_t>(d.m);
  args.h = static_cast<uint32_t>(d.h);
  args.hd = static_cast<uint32_t>(d.hd);
  args.half_dims = static_cast<uint32_t>(d.half);
  args.pos = pos.word ? 0u : static_cast<uint32_t>(d.pos);
  args.pos_word = pos.word;
  args.dtype = static_cast<uint32_t>(dt);
  args.eps = eps;
  args.inv_d = ops::inverse_count(d.hd);
  return args;
}

// The fused q/k/v form: one workgroup per four (row, head read) pairs.
Status rope_qkv(KernelContext& ctx, const fb::RopeNodeT& n) {
  SB_ASSIGN_OR_RETURN(RopeQkv r, rope_qkv_bind(ctx, n));
  return rope_qkv_run(ctx, n, r);
}

}  // namespace

Result<RopeQkv> rope_qkv_bind(KernelContext& ctx, const fb::RopeNodeT& n) {
  Runtime& rt = rt_of(ctx);
  RopeQkv r;
  SB_ASSIGN_OR_RETURN(r.bx, bind_in(ctx, n.x.get(), &r.x));
  SB_ASSIGN_OR_RETURN(r.bc, bind_in(ctx, n.cos.get(), &r.cos));
  SB_ASSIGN_OR_RETURN(r.bs, bind_in(ctx, n.sin.get(), &r.sin));
  r.bqw = r.bkw = r.bx;  // never read without their weights
  if (n.norm_weight) {
    SB_ASSIGN_OR_RETURN(r.bqw, bind_in(ctx, n.norm_weight.get(), &r.qw));
  }
  if (n.k_norm_weight) {
    SB_ASSIGN_OR_RETURN(r.bkw, bind_in(ctx, n.k_norm_weight.get(), &r.kw));
  }
  SB_ASSIGN_OR_RETURN(r.kc, inplace_on_device(ctx, n.cache.get()));
  SB_ASSIGN_OR_RETURN(r.vc, inplace_on_device(ctx, n.v_cache.get()));
  SB_ASSIGN_OR_RETURN(r.pos, dynamic_arg(ctx, n.pos.get()));
  SB_ASSIGN_OR_RETURN(r.d,
                      ops::rope_qkv_dims(r.x, r.cos, r.sin, r.pos.value, n.norm_weight ? &r.qw : nullptr,
                                         n.k_norm_weight ? &r.kw : nullptr, r.kc.dev, r.vc.dev, n.q_heads, n.k_heads));
  const ops::RopeDims& d = r.d;
  ctx.guard_dynamic(n.pos.get(), 0, std::min({d.table_rows, r.kc.dev.dim(0), r.vc.dev.dim(0)}) - d.m);
  SB_CHECK_OR_RETURN(dtype_size(r.x.dtype()) != 2 || d.hd % 2 == 0, StatusCode::kUnimplemented,
                     "Rope on the GPU: 16-bit heads of odd size %lld", (long long)d.hd);
  SB_CHECK_OR_RETURN(d.hd <= 256, StatusCode::kUnimplemented, "Rope's q/k/v form on the GPU: heads of %lld (up to 256)",
                     (long long)d.hd);
  SB_RETURN_IF_ERROR(u32_count(d.table_rows * d.half, "rope tables").status());
  SB_RETURN_IF_ERROR(u32_count(r.x.numel(), "rope").status());
  SB_RETURN_IF_ERROR(u32_count(std::max(r.kc.dev.numel(), r.vc.dev.numel()), "rope cache").status());
  SB_ASSIGN_OR_RETURN(r.bk, rt.bind(r.kc.dev, false));
  SB_ASSIGN_OR_RETURN(r.bv, rt.bind(r.vc.dev, false));
  r.args = rope_args(d, r.pos, r.x.dtype(), n.eps);
  r.args.has_cache = 1u;
  r.args.q_heads = static_cast<uint32_t>(d.q_heads);
  r.args.k_heads = static_cast<uint32_t>(d.k_heads);
  r.args.has_norm = n.norm_weight ? 1u : 0u;
  r.args.has_k_norm = n.k_norm_weight ? 1u : 0u;
  r.args.w_dtype = static_cast<uint32_t>(n.norm_weight ? r.qw.dtype() : r.x.dtype());
  r.args.kw_dtype = static_cast<uint32_t>(n.k_norm_weight ? r.kw.dtype() : r.x.dtype());
  return r;
}

SpecConstants rope_qkv_spec(const RopeQkv& r) {
  return dtype_spec({r.x.dtype(), static_cast<DType>(r.args.w_dtype), static_cast<DType>(r.args.kw_dtype)}, {r.d.hd});
}

Status rope_qkv_run(KernelContext& ctx, const fb::RopeNodeT& n, RopeQkv& r) {
  Runtime& rt = rt_of(ctx);
  const ops::RopeDims& d = r.d;
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(r.x.dtype(), {d.m, d.q_heads, d.hd}));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  r.args.n = static_cast<uint32_t>(out.numel());
  const uint64_t heads = static_cast<uint64_t>(d.m * (d.q_heads + 2 * d.k_heads));  // four a workgroup of 256
  if (d.m > 0)
    SB_RETURN_IF_ERROR(rt.dispatch("rope_qkv", {r.bx, r.bc, r.bs, bo, r.bk, r.bqw, r.pos.words, r.bkw, r.bv}, &r.args,
                                   sizeof(r.args), (heads + 3) / 4 * 256, rope_qkv_spec(r)));
  SB_RETURN_IF_ERROR(rope_qkv_keep(ctx, n, r));
  return ctx.out(n.out.get(), std::move(out));
}

Status rope_qkv_keep(KernelContext& ctx, const fb::RopeNodeT& n, RopeQkv& r) {
  SB_RETURN_IF_ERROR(keep_on_device(ctx, n.cache.get(), r.kc));
  return keep_on_device(ctx, n.v_cache.get(), r.vc);
}

namespace {

Status rope(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsRopeNode();
  if (n->k_heads > 0) return rope_qkv(ctx, *n);
  Runtime& rt = rt_of(ctx);
  Tensor x, cos, sin, w;
  InPlace cache;
  SB_ASSIGN_OR_RETURN(BufferRef bx, bind_in(ctx, n->x.get(), &x));
  SB_ASSIGN_OR_RETURN(BufferRef bc, bind_in(ctx, n->cos.get(), &cos));
  SB_ASSIGN_OR_RETURN(BufferRef bs, bind_in(ctx, n->sin.get(), &sin));
  BufferRef bw = bx;  // never read without norm_weight
  if (n->norm_weight) {
    SB_ASSIGN_OR_RETURN(bw, bind_in(ctx, n->norm_weight.get(), &w));
  }
  if (n->cache) {
    SB_ASSIGN_OR_RETURN(cache, inplace_on_device(ctx, n->cache.get()));
  }
  SB_ASSIGN_OR_RETURN(DynamicArg pos, dynamic_arg(ctx, n->pos.get()));
  SB_ASSIGN_OR_RETURN(ops::RopeDims d, ops::rope_dims(x, cos, sin, pos.value, n->norm_weight ? &w : nullptr,
                                                      n->cache ? &cache.dev : nullptr));
  ctx.guard_dynamic(n->pos.get(), 0, std::min(d.table_rows, n->cache ? cache.dev.dim(0) : d.table_rows) - d.m);
  const bool by16 = dtype_size(x.dtype()) == 2;
  SB_CHECK_OR_RETURN(!by16 || !(n->norm_weight || n->cache) || d.hd % 2 == 0, StatusCode::kUnimplemented,
                     "Rope with a norm or a cache on the GPU: 16-bit heads of odd size %lld", (long long)d.hd);
  SB_CHECK_OR_RETURN(!n->norm_weight || d.hd <= 256, StatusCode::kUnimplemented,
                     "Rope with a norm on the GPU: heads of %lld (up to 256)", (long long)d.hd);
  SB_RETURN_IF_ERROR(u32_count(d.table_rows * d.half, "rope tables").status());
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(x.dtype(), x.shape()));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  BufferRef bk = bo;  // never written without a cache
  if (n->cache) {
    SB_RETURN_IF_ERROR(u32_count(cache.dev.numel(), "rope cache").status());
    SB_ASSIGN_OR_RETURN(bk, rt.bind(cache.dev, false));
  }
  k::RopeArgs args = rope_args(d, pos, x.dtype(), n->eps);
  SB_ASSIGN_OR_RETURN(args.n, u32_count(x.numel(), "rope"));
  args.has_cache = n->cache ? 1u : 0u;
  args.w_dtype = static_cast<uint32_t>(n->norm_weight ? w.dtype() : x.dtype());
  if (x.numel() > 0) {
    if (n->norm_weight)
      SB_RETURN_IF_ERROR(rt.dispatch("rope_norm", {bx, bc, bs, bo, bk, bw, pos.words}, &args, sizeof(args),
                                     static_cast<uint64_t>(d.m * d.h) * 64,
                                     dtype_spec({x.dtype(), static_cast<DType>(args.w_dtype)}, {d.hd})));
    else
      SB_RETURN_IF_ERROR(rt.dispatch("rope", {bx, bc, bs, bo, bk, pos.words}, &args, sizeof(args),
                                     words_of(x.dtype(), x.numel()), dtype_spec({x.dtype()}, {d.hd})));
  }
  if (n->cache) SB_RETURN_IF_ERROR(keep_on_device(ctx, n->cache.get(), cache));
  return ctx.out(n->out.get(), std::move(out));
}

}  // namespace

void register_rope(KernelRegistry& r) { r.add(fb::OpNode::RopeNode, rope); }

}  // namespace switchboard::gpu
