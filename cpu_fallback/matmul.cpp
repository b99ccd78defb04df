// Dense matmul / linear, exact: each output is dot32 (docs/numerics.md) over
// f32-widened operands, plus the bias (one add), rounded once to the output dtype.

#include <algorithm>
#include <vector>

#include "cpu_common.h"
#include "parallel.h"

namespace switchboard::cpu {
namespace {

Status matmul(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsMatmulNode();
  SB_ASSIGN_OR_RETURN(Tensor a, ctx.in(n->a.get()));
  SB_ASSIGN_OR_RETURN(Tensor b, ctx.in(n->b.get()));
  Tensor bias;
  if (n->bias) {
    SB_ASSIGN_OR_RETURN(bias, ctx.in(n->bias.get()));
  }
  SB_ASSIGN_OR_RETURN(MatmulDims dims, matmul_dims(a, b, n->transpose_b, bias));
  const int64_t k = dims.k, rows = dims.rows, cols = dims.cols;
  Shape shape = a.shape();
  shape.back() = cols;
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::zeros(a.dtype(), shape));
  // Operands widened to f32, B as rows of k (transposed when stored [K, N]).
  std::vector<float> a_store, b_store, bt;
  const float *ap = f32_data(a, &a_store), *braw = f32_data(b, &b_store);
  if (!n->transpose_b) {
    bt.resize(static_cast<size_t>(b.numel()));
    for (int64_t i = 0; i < k; ++i)
      for (int64_t j = 0; j < cols; ++j) bt[j * k + i] = braw[i * cols + j];
  }
  const float* bp = n->transpose_b ? braw : bt.data();
  // Split over outputs, not rows: a decode step has one row (e.g. a router's logits).
  parallel_for(rows * cols, std::max<int64_t>(1, 4096 / std::max<int64_t>(k, 1)), [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      const int64_t r = o / cols, j = o % cols;
      float v = dot32(ap + r * k, bp + j * k, k);
      if (n->bias) v = v + load_f32(bias.data(), bias.dtype(), j);
      store_f32(out.mutable_data(), out.dtype(), o, v);
    }
  });
  return ctx.out(n->out.get(), std::move(out));
}

// Batch i of a against batch i / g of b (g = Ba / Bb), each output a dot32.
Status batch_matmul(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsBatchMatmulNode();
  SB_ASSIGN_OR_RETURN(Tensor a, ctx.in(n->a.get()));
  SB_ASSIGN_OR_RETURN(Tensor b, ctx.in(n->b.get()));
  SB_ASSIGN_OR_RETURN(MatmulDims dims, batch_matmul_dims(a, b, n->transpose_b));
  const int64_t ba = dims.batch, m = dims.rows, k = dims.k, bb = b.dim(0), cols = dims.cols, g = dims.group;
  std::vector<float> a_store, b_store, bt;
  const float *ap = f32_data(a, &a_store), *braw = f32_data(b, &b_store);
  if (!n->transpose_b) {  // rows of k per output column
    bt.resize(static_cast<size_t>(b.numel()));
    for (int64_t q = 0; q < bb; ++q)
      for (int64_t i = 0; i < k; ++i)
        for (int64_t j = 0; j < cols; ++j) bt[(q * cols + j) * k + i] = braw[(q * k + i) * cols + j];
  }
  const float* bp = n->transpose_b ? braw : bt.data();
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(a.dtype(), {ba, m, cols}));
  parallel_for(ba * m, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t i = r / m;
      for (int64_t j = 0; j < cols; ++j)
        store_f32(out.mutable_data(), out.dtype(), r * cols + j, dot32(ap + r * k, bp + ((i / g) * cols + j) * k, k));
    }
  });
  return ctx.out(n->out.get(), std::move(out));
}

}  // namespace

void register_matmul_kernels(KernelRegistry& r) {
  r.add(fb::OpNode::MatmulNode, matmul);
  r.add(fb::OpNode::BatchMatmulNode, batch_matmul);
}

}  // namespace switchboard::cpu
