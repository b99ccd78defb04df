// Matmul and BatchMatmul on the GPU (metal_shaders/matmul.comp).
#include <cstring>

#include "gpu_ops.h"
#include "op_shapes.h"

namespace switchboard::gpu {
namespace {

// Rows from which matmul_rows16 takes a GEMV (below, attention heads keep `matmul`).
constexpr uint32_t kMatmulRows16MinK = 1024;

// MatmulArgs of one [rows, k] x [k, cols] product: no bias, batch and group 1.
k::MatmulArgs matmul_args(int64_t rows, int64_t cols, int64_t kdim, DType a, DType b, bool transpose_b) {
  k::MatmulArgs args{};
  args.rows = static_cast<uint32_t>(rows);
  args.cols = static_cast<uint32_t>(cols);
  args.k = static_cast<uint32_t>(kdim);
  args.dtype = static_cast<uint32_t>(a);
  args.b_dtype = static_cast<uint32_t>(b);
  args.transpose_b = transpose_b;
  args.batch = 1;
  args.group = 1;
  return args;
}

// Long rows of a and (transposed) b in whole 16-byte units at 16-byte aligned offsets:
// matmul_rows16 copies them with 16-byte loads (decode GEMVs such as the router logits
// are latency-bound). Short rows (attention heads) keep `matmul`: the copy's shared
// memory costs occupancy there (whole-model decode was slower with head rows: RESULTS).
bool rows16_gemv(const k::MatmulArgs& args, DType a, const BufferRef& ba, const BufferRef& bb) {
  return args.transpose_b != 0 && args.k >= kMatmulRows16MinK && args.k % (16 / dtype_size(a)) == 0 &&
         args.k % (16 / dtype_size(static_cast<DType>(args.b_dtype))) == 0 && ba.offset % 16 == 0 &&
         bb.offset % 16 == 0;
}

// Matmul / BatchMatmul: 16 x 16 output tiles per workgroup (matmul_tile) when rows and
// columns both fill tiles (prefill), else one output word per workgroup (decode GEMVs: 32
// lanes split k for each of the word's outputs; matmul_rows16 has 64, both outputs side by
// side). 16-bit outputs of odd width share words across rows, which only the per-output
// kernels handle.
// `done` (decode's router logits): the GEMV kernel counts its workgroups there
// (matmul_rows16_count) and *counted gets their number; 0 where another kernel ran.
Status dispatch_matmul(Runtime& rt, const k::MatmulArgs& args, DType dtype, const std::vector<BufferRef>& binds,
                       const BufferRef* done = nullptr, uint32_t* counted = nullptr) {
  if (counted) *counted = 0;
  const SpecConstants spec = dtype_spec(
      {static_cast<DType>(args.dtype), static_cast<DType>(args.b_dtype), static_cast<DType>(args.bias_dtype)});
  const uint64_t batch = args.batch, rows = args.rows, cols = args.cols;
  if (rows >= 16 && cols >= 16 && (dtype == DType::kF32 || cols % 2 == 0))
    return rt.dispatch("matmul_tile", binds, &args, sizeof(args), 256 * batch * ((rows + 15) / 16) * ((cols + 15) / 16),
                       spec);
  const bool rows16 = rows16_gemv(args, dtype, binds[0], binds[1]);
  const uint64_t words = words_of(dtype, static_cast<int64_t>(batch * rows * cols));
  if (rows16 && done && words <= UINT32_MAX) {
    std::vector<BufferRef> counted_binds = binds;
    counted_binds.push_back(*done);
    *counted = static_cast<uint32_t>(words);
    return rt.dispatch("matmul_rows16_count", counted_binds, &args, sizeof(args), 64 * words, spec);
  }
  return rt.dispatch(rows16 ? "matmul_rows16" : "matmul", binds, &args, sizeof(args), (rows16 ? 64 : 32) * words, spec);
}

}  // namespace

Status matmul_run(KernelContext& ctx, const fb::OpNodeUnion& op, const BufferRef* done, uint32_t* counted) {
  const auto* n = op.AsMatmulNode();
  Runtime& rt = rt_of(ctx);
  Tensor a, b, bias;
  SB_ASSIGN_OR_RETURN(BufferRef ba, bind_in(ctx, n->a.get(), &a));
  SB_ASSIGN_OR_RETURN(BufferRef bb, bind_in(ctx, n->b.get(), &b));
  BufferRef bbias = ba;  // stand-in when absent
  if (n->bias) {
    SB_ASSIGN_OR_RETURN(bbias, bind_in(ctx, n->bias.get(), &bias));
  }
  SB_ASSIGN_OR_RETURN(ops::MatmulDims dims, ops::matmul_dims(a, b, n->transpose_b, bias));
  const int64_t kdim = dims.k, rows = dims.rows, cols = dims.cols;
  SB_RETURN_IF_ERROR(u32_count(std::max({a.numel(), b.numel(), rows * cols}), "Matmul").status());
  Shape shape = a.shape();
  shape.back() = cols;
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(a.dtype(), shape));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  k::MatmulArgs args = matmul_args(rows, cols, kdim, a.dtype(), b.dtype(), n->transpose_b);
  args.has_bias = bias.defined();
  args.bias_dtype = bias.defined() ? static_cast<uint32_t>(bias.dtype()) : 0;
  SB_RETURN_IF_ERROR(dispatch_matmul(rt, args, a.dtype(), {ba, bb, bbias, bo}, done, counted));
  return ctx.out(n->out.get(), std::move(out));
}

Status matmul(KernelContext& ctx, const fb::OpNodeUnion& op) { return matmul_run(ctx, op, nullptr, nullptr); }

Result<bool> norm_matmul_run(KernelContext& ctx, const fb::RmsNormNodeT& nn, const fb::OpNodeUnion& op,
                             const BufferRef& done, uint32_t* counted, BufferRef* out, BufferRef* sum,
                             std::vector<Tensor>* keep) {
  const auto* n = op.AsMatmulNode();
  Runtime& rt = rt_of(ctx);
  Tensor x, res, w, b, bias;
  SB_ASSIGN_OR_RETURN(BufferRef bx, bind_in(ctx, nn.x.get(), &x));
  SB_ASSIGN_OR_RETURN(BufferRef bw, bind_in(ctx, nn.weight.get(), &w));
  BufferRef br = bx;  // never read without a residual
  if (nn.residual) {
    SB_ASSIGN_OR_RETURN(br, bind_in(ctx, nn.residual.get(), &res));
  }
  SB_ASSIGN_OR_RETURN(BufferRef bb, bind_in(ctx, n->b.get(), &b));
  BufferRef bbias = bx;  // stand-in when absent
  if (n->bias) {
    SB_ASSIGN_OR_RETURN(bbias, bind_in(ctx, n->bias.get(), &bias));
  }
  auto dims = ops::matmul_dims(x, b, n->transpose_b, bias);
  if (!dims.is_ok() || x.rank() < 1) return false;
  const int64_t d = x.dim(x.rank() - 1), rows = dims->rows, cols = dims->cols;
  const DType dt = x.dtype();
  const k::MatmulArgs base = matmul_args(rows, cols, d, dt, b.dtype(), n->transpose_b);
  // matmul_rows16's GEMV (one pass: k within a chunk) of a row the kernel stages whole.
  const bool fits = dims->k == d && d <= 2048 && d % 8 == 0 && w.numel() == d && rows < 16 && dtype_is_float(dt) &&
                    (!nn.residual || res.shape() == x.shape()) && rows16_gemv(base, dt, bx, bb) &&
                    br.offset % 16 == 0 && words_of(dt, rows * cols) <= UINT32_MAX &&
                    (dt == DType::kF32 || cols % 2 == 0);
  if (!fits) return false;
  SB_RETURN_IF_ERROR(u32_count(std::max({x.numel(), b.numel(), rows * cols}), "Matmul").status());
  SB_ASSIGN_OR_RETURN(Tensor normed, rt.alloc(dt, x.shape()));
  SB_ASSIGN_OR_RETURN(BufferRef bn, rt.bind(normed, false));
  Tensor summed;
  BufferRef bs = bn;  // a stand-in, never written without a residual
  if (nn.residual) {
    SB_ASSIGN_OR_RETURN(summed, rt.alloc(dt, x.shape()));
    SB_ASSIGN_OR_RETURN(bs, rt.bind(summed, false));
  }
  Shape shape = x.shape();
  shape.back() = cols;
  SB_ASSIGN_OR_RETURN(Tensor logits, rt.alloc(dt, shape));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(logits, false));
  k::MatmulNormArgs args{};
  std::memcpy(&args, &base, sizeof(base));  // the same fields first (gpu_kernel_table.h)
  args.has_bias = bias.defined();
  args.bias_dtype = bias.defined() ? static_cast<uint32_t>(bias.dtype()) : 0;
  args.has_residual = nn.residual ? 1u : 0u;
  args.inv_d = ops::inverse_count(d);
  args.eps = nn.eps;
  args.w_dtype = static_cast<uint32_t>(w.dtype());
  const uint64_t words = words_of(dt, rows * cols);
  const SpecConstants spec =
      dtype_spec({dt, b.dtype(), static_cast<DType>(args.bias_dtype)}, {static_cast<int64_t>(args.w_dtype)});
  SB_RETURN_IF_ERROR(rt.dispatch("matmul_rows16_norm_count", {bx, bb, bbias, bo, done, br, bw, bn, bs}, &args,
                                 sizeof(args), 64 * words, spec));
  *counted = static_cast<uint32_t>(words);
  *out = bn;
  *sum = nn.residual ? bs : BufferRef{};
  *keep = {normed, logits};
  if (nn.residual) SB_RETURN_IF_ERROR(ctx.out(nn.sum.get(), std::move(summed)));
  SB_RETURN_IF_ERROR(ctx.out(nn.out.get(), std::move(normed)));
  SB_RETURN_IF_ERROR(ctx.out(n->out.get(), std::move(logits)));
  return true;
}

namespace {

// Softmax / RmsNorm along the last axis (norm.comp), one thread per row. 16-bit rows of
// odd length would share output words between threads, so they go through f32 and a
// Cast (the same single rounding as a direct store).
Status batch_matmul(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsBatchMatmulNode();
  Runtime& rt = rt_of(ctx);
  Tensor a, b;
  SB_ASSIGN_OR_RETURN(BufferRef ba, bind_in(ctx, n->a.get(), &a));
  SB_ASSIGN_OR_RETURN(BufferRef bb, bind_in(ctx, n->b.get(), &b));
  SB_ASSIGN_OR_RETURN(ops::MatmulDims dims, ops::batch_matmul_dims(a, b, n->transpose_b));
  const int64_t batch = dims.batch, m = dims.rows, kdim = dims.k, cols = dims.cols;
  SB_RETURN_IF_ERROR(u32_count(std::max({a.numel(), b.numel(), batch * m * cols}), "BatchMatmul").status());
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(a.dtype(), {batch, m, cols}));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  k::MatmulArgs args = matmul_args(m, cols, kdim, a.dtype(), b.dtype(), n->transpose_b);
  args.batch = static_cast<uint32_t>(batch);
  args.group = static_cast<uint32_t>(dims.group);
  SB_RETURN_IF_ERROR(dispatch_matmul(rt, args, a.dtype(), {ba, bb, ba, bo}));
  return ctx.out(n->out.get(), std::move(out));
}

// x viewed as [outer, d, inner] around `axis`; out drops the axis (1 with keepdims).

}  // namespace

void register_matmul(KernelRegistry& r) {
  r.add(fb::OpNode::MatmulNode, matmul);
  r.add(fb::OpNode::BatchMatmulNode, batch_matmul);
}

}  // namespace switchboard::gpu
