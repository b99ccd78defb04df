// Dense matmul / linear, exact: each output is dot32 (docs/numerics.md) over
// f32-widened operands, plus the bias (one add), rounded once to the output dtype.

#include <vector>

#include "cpu_common.h"
#include "parallel.h"

namespace switchboard::cpu {
namespace {

Status matmul(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsMatmulNode();
  SB_ASSIGN_OR_RETURN(Tensor a, ctx.in(n->a.get()));
  SB_ASSIGN_OR_RETURN(Tensor b, ctx.in(n->b.get()));
  SB_CHECK_OR_RETURN(a.rank() >= 1 && b.rank() == 2, StatusCode::kInvalidArgument, "a %s, b %s: need a [..., K], b 2-D",
                     shape_str(a.shape()).c_str(), shape_str(b.shape()).c_str());
  const int64_t k = a.dim(a.rank() - 1);
  int64_t rows = 1;  // product of a's leading dims (K may be 0)
  for (int64_t d = 0; d + 1 < a.rank(); ++d) rows *= a.dim(d);
  const int64_t bk = n->transpose_b ? b.dim(1) : b.dim(0), cols = n->transpose_b ? b.dim(0) : b.dim(1);
  SB_CHECK_OR_RETURN(bk == k, StatusCode::kInvalidArgument, "inner dims differ: a %s, b %s (transpose_b=%d)",
                     shape_str(a.shape()).c_str(), shape_str(b.shape()).c_str(), n->transpose_b ? 1 : 0);
  Tensor bias;
  if (n->bias) {
    SB_ASSIGN_OR_RETURN(bias, ctx.in(n->bias.get()));
    SB_CHECK_OR_RETURN(bias.rank() == 1 && bias.dim(0) == cols, StatusCode::kInvalidArgument,
                       "bias %s, expected [%lld]", shape_str(bias.shape()).c_str(), (long long)cols);
  }
  Shape shape = a.shape();
  shape.back() = cols;
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::zeros(a.dtype(), shape));
  // Operands widened to f32, B as rows of k (transposed when stored [K, N]).
  const std::vector<float> av = widen_f32(a), braw = widen_f32(b);
  std::vector<float> bt;
  if (!n->transpose_b) {
    bt.resize(braw.size());
    for (int64_t i = 0; i < k; ++i)
      for (int64_t j = 0; j < cols; ++j) bt[j * k + i] = braw[i * cols + j];
  }
  const float* bp = n->transpose_b ? braw.data() : bt.data();
  parallel_for(rows, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t j = 0; j < cols; ++j) {
        float v = dot32(av.data() + r * k, bp + j * k, k);
        if (n->bias) v = v + load_f32(bias.data(), bias.dtype(), j);
        store_f32(out.mutable_data(), out.dtype(), r * cols + j, v);
      }
  });
  return ctx.out(n->out.get(), std::move(out));
}

// Batch i of a against batch i / g of b (g = Ba / Bb), each output a dot32.
Status batch_matmul(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsBatchMatmulNode();
  SB_ASSIGN_OR_RETURN(Tensor a, ctx.in(n->a.get()));
  SB_ASSIGN_OR_RETURN(Tensor b, ctx.in(n->b.get()));
  const int64_t ba = a.dim(0), m = a.dim(1), k = a.dim(2), bb = b.dim(0);
  const int64_t bk = n->transpose_b ? b.dim(2) : b.dim(1), cols = n->transpose_b ? b.dim(1) : b.dim(2);
  SB_CHECK_OR_RETURN(bk == k, StatusCode::kInvalidArgument, "inner dims differ: a %s, b %s (transpose_b=%d)",
                     shape_str(a.shape()).c_str(), shape_str(b.shape()).c_str(), n->transpose_b ? 1 : 0);
  SB_CHECK_OR_RETURN(bb > 0 ? ba % bb == 0 : ba == 0, StatusCode::kInvalidArgument,
                     "a's batch %lld is not a multiple of b's batch %lld", (long long)ba, (long long)bb);
  const int64_t g = bb ? ba / bb : 1;
  const std::vector<float> av = widen_f32(a), braw = widen_f32(b);
  std::vector<float> bt;
  if (!n->transpose_b) {  // rows of k per output column
    bt.resize(braw.size());
    for (int64_t q = 0; q < bb; ++q)
      for (int64_t i = 0; i < k; ++i)
        for (int64_t j = 0; j < cols; ++j) bt[(q * cols + j) * k + i] = braw[(q * k + i) * cols + j];
  }
  const float* bp = n->transpose_b ? braw.data() : bt.data();
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(a.dtype(), {ba, m, cols}));
  parallel_for(ba * m, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t i = r / m;
      for (int64_t j = 0; j < cols; ++j)
        store_f32(out.mutable_data(), out.dtype(), r * cols + j, dot32(av.data() + r * k, bp + ((i / g) * cols + j) * k, k));
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
