// Softmax and RMSNorm on the GPU (metal_shaders/norm.comp).
#include "gpu_ops.h"
#include "op_shapes.h"

namespace switchboard::gpu {
namespace {

Status norm_rows(KernelContext& ctx, const char* kernel, const fb::Tid* x_tid, const fb::Tid* w_tid, float eps,
                 const fb::Tid* out_tid) {
  Runtime& rt = rt_of(ctx);
  Tensor x, w;
  SB_ASSIGN_OR_RETURN(BufferRef bx, bind_in(ctx, x_tid, &x));
  BufferRef bw;
  const int64_t d = x.dim(x.rank() - 1), rows = d ? x.numel() / d : 0;
  if (w_tid) {
    SB_ASSIGN_OR_RETURN(bw, bind_in(ctx, w_tid, &w));
    SB_CHECK_OR_RETURN(w.numel() == d, StatusCode::kInvalidArgument, "weight %s does not match the last dim %lld",
                       shape_str(w.shape()).c_str(), (long long)d);
  }
  SB_RETURN_IF_ERROR(u32_count(x.numel(), kernel).status());
  const bool via_f32 = dtype_size(x.dtype()) == 2 && d % 2 != 0;
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(via_f32 ? DType::kF32 : x.dtype(), x.shape()));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  k::NormArgs args{static_cast<uint32_t>(rows),
                   static_cast<uint32_t>(d),
                   static_cast<uint32_t>(x.dtype()),
                   ops::inverse_count(d),
                   eps,
                   static_cast<uint32_t>(out.dtype()),
                   0,
                   0,
                   static_cast<uint32_t>(w_tid ? w.dtype() : x.dtype())};
  const std::vector<BufferRef> binds = w_tid ? std::vector<BufferRef>{bx, bw, bo} : std::vector<BufferRef>{bx, bo};
  // Rows that fit in shared memory: a workgroup each (terms staged, one thread adds them).
  const bool per_row = d > 0 && d <= SB_NORM_ROW_MAX;
  const char* name = !per_row ? kernel : w_tid ? "rms_norm_row" : "softmax_row";
  SB_RETURN_IF_ERROR(rt.dispatch(name, binds, &args, sizeof(args), static_cast<uint64_t>(rows) * (per_row ? 256 : 1)));
  if (via_f32) {
    SB_ASSIGN_OR_RETURN(Tensor narrow, rt.alloc(x.dtype(), x.shape()));
    SB_ASSIGN_OR_RETURN(BufferRef bn, rt.bind(narrow, false));
    k::CastArgs ca{static_cast<uint32_t>(x.numel()), static_cast<uint32_t>(DType::kF32),
                   static_cast<uint32_t>(x.dtype()), 0};
    SB_RETURN_IF_ERROR(rt.dispatch("cast", {bo, bn}, &ca, sizeof(ca), words_of(x.dtype(), x.numel())));
    out = narrow;
  }
  return ctx.out(out_tid, std::move(out));
}

Status softmax(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsSoftmaxNode();
  return norm_rows(ctx, "softmax", n->x.get(), nullptr, 0.0f, n->out.get());
}

// RmsNorm order Tree32, with or without a residual: one workgroup a row (rms_norm_tree).
Status rms_norm_tree(KernelContext& ctx, const fb::RmsNormNodeT& n) {
  Runtime& rt = rt_of(ctx);
  Tensor x, w, res;
  SB_ASSIGN_OR_RETURN(BufferRef bx, bind_in(ctx, n.x.get(), &x));
  SB_ASSIGN_OR_RETURN(BufferRef bw, bind_in(ctx, n.weight.get(), &w));
  BufferRef br = bx;  // never read without a residual or a gate
  if (n.gate) {
    SB_ASSIGN_OR_RETURN(br, bind_in(ctx, n.gate.get(), &res));
    SB_CHECK_OR_RETURN(res.shape() == x.shape() && !n.residual, StatusCode::kInvalidArgument,
                       "gate %s does not match x %s", shape_str(res.shape()).c_str(), shape_str(x.shape()).c_str());
  }
  if (n.residual) {
    SB_ASSIGN_OR_RETURN(br, bind_in(ctx, n.residual.get(), &res));
    SB_CHECK_OR_RETURN(res.shape() == x.shape(), StatusCode::kInvalidArgument, "residual %s does not match x %s",
                       shape_str(res.shape()).c_str(), shape_str(x.shape()).c_str());
  }
  const int64_t d = x.dim(x.rank() - 1), rows = d ? x.numel() / d : 0;
  SB_CHECK_OR_RETURN(w.numel() == d, StatusCode::kInvalidArgument, "weight %s does not match the last dim %lld",
                     shape_str(w.shape()).c_str(), (long long)d);
  SB_CHECK_OR_RETURN(dtype_size(x.dtype()) == 4 || d % 2 == 0, StatusCode::kUnimplemented,
                     "RmsNorm Tree32 on the GPU: 16-bit rows of odd length %lld", (long long)d);
  SB_RETURN_IF_ERROR(u32_count(x.numel(), "rms_norm_tree").status());
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(x.dtype(), x.shape()));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  Tensor sum;
  BufferRef bs = bo;  // never written without a residual
  if (n.residual) {
    SB_ASSIGN_OR_RETURN(sum, rt.alloc(x.dtype(), x.shape()));
    SB_ASSIGN_OR_RETURN(bs, rt.bind(sum, false));
  }
  k::NormArgs args{static_cast<uint32_t>(rows),
                   static_cast<uint32_t>(d),
                   static_cast<uint32_t>(x.dtype()),
                   ops::inverse_count(d),
                   n.eps,
                   static_cast<uint32_t>(x.dtype()),
                   n.residual ? 1u : 0u,
                   n.gate ? 1u : 0u,
                   static_cast<uint32_t>(w.dtype())};
  if (rows > 0)
    SB_RETURN_IF_ERROR(rt.dispatch("rms_norm_tree", {bx, br, bw, bo, bs}, &args, sizeof(args),
                                   static_cast<uint64_t>(rows) * 256, dtype_spec({x.dtype(), w.dtype()}, {d})));
  if (n.residual) SB_RETURN_IF_ERROR(ctx.out(n.sum.get(), std::move(sum)));
  return ctx.out(n.out.get(), std::move(out));
}

}  // namespace

Status rms_norm(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsRmsNormNode();
  if (n->order == fb::NormOrder::Tree32) return rms_norm_tree(ctx, *n);
  return norm_rows(ctx, "rms_norm", n->x.get(), n->weight.get(), n->eps, n->out.get());
}

void register_norm(KernelRegistry& r) {
  r.add(fb::OpNode::SoftmaxNode, softmax);
  r.add(fb::OpNode::RmsNormNode, rms_norm);
}

}  // namespace switchboard::gpu
