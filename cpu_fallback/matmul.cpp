// Dense matmul / linear through OpenBLAS (f32). f16/bf16 operands are widened
// to f32 and the result rounded once. Not on the bit-exact path: OpenBLAS picks
// its own summation order (docs/numerics.md).
#include <cblas.h>

#include <vector>

#include "cpu_common.h"

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
  std::vector<float> c(static_cast<size_t>(rows * cols), 0.f);
  if (rows > 0 && cols > 0 && k > 0) {
    std::vector<float> av, bv;
    const float* ap = a.data_as<float>();
    const float* bp = b.data_as<float>();
    if (a.dtype() != DType::kF32) {
      av = widen_f32(a);
      bv = widen_f32(b);
      ap = av.data();
      bp = bv.data();
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, n->transpose_b ? CblasTrans : CblasNoTrans, static_cast<int>(rows),
                static_cast<int>(cols), static_cast<int>(k), 1.f, ap, static_cast<int>(k), bp,
                static_cast<int>(n->transpose_b ? k : cols), 0.f, c.data(), static_cast<int>(cols));
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) {
      float v = c[r * cols + j];
      if (n->bias) v += load_f32(bias.data(), bias.dtype(), j);
      store_f32(out.mutable_data(), out.dtype(), r * cols + j, v);
    }
  return ctx.out(n->out.get(), std::move(out));
}

}  // namespace

void register_matmul_kernels(KernelRegistry& r) { r.add(fb::OpNode::MatmulNode, matmul); }

}  // namespace switchboard::cpu
