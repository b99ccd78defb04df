// GatherMm: float experts. Each output is dot32 (docs/numerics.md): 32 strided
// partial sums (product, then add) combined by a fixed halving tree.
#include <vector>

#include "cpu_common.h"
#include "gather_qmm.h"
#include "parallel.h"

namespace switchboard::cpu {

namespace {

Status gather_mm(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsGatherMmNode();
  SB_ASSIGN_OR_RETURN(Tensor x, ctx.in(n->x.get()));
  SB_ASSIGN_OR_RETURN(Tensor w, ctx.in(n->w.get()));
  const int64_t rows = x.dim(0), k = x.dim(1), experts = w.dim(0), nout = w.dim(1);
  SB_CHECK_OR_RETURN(w.dim(2) == k, StatusCode::kInvalidArgument, "w %s does not match K = %lld",
                     shape_str(w.shape()).c_str(), (long long)k);
  SB_ASSIGN_OR_RETURN(std::vector<int64_t> rhs, read_indices(ctx, n->rhs_indices, "rhs_indices", experts));
  SB_ASSIGN_OR_RETURN(std::vector<int64_t> lhs, read_indices(ctx, n->lhs_indices, "lhs_indices", rows));
  const int64_t pairs = n->rhs_indices ? static_cast<int64_t>(rhs.size()) : n->lhs_indices ? static_cast<int64_t>(lhs.size()) : rows;
  SB_CHECK_OR_RETURN((!n->lhs_indices || static_cast<int64_t>(lhs.size()) == pairs) &&
                         (n->lhs_indices || rows == 0 || pairs % rows == 0),
                     StatusCode::kInvalidArgument, "index lengths do not match (%lld pairs, %lld rows)",
                     (long long)pairs, (long long)rows);
  std::vector<float> x_store, w_store;
  const float *xf = f32_data(x, &x_store), *wf = f32_data(w, &w_store);
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::zeros(x.dtype(), {pairs, nout}));
  parallel_for(pairs, 1, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      const int64_t r = n->lhs_indices ? lhs[p] : (rows ? p * rows / pairs : 0), ex = n->rhs_indices ? rhs[p] : 0;
      for (int64_t j = 0; j < nout; ++j)
        store_f32(out.mutable_data(), out.dtype(), p * nout + j, dot32(xf + r * k, wf + (ex * nout + j) * k, k));
    }
  });
  return ctx.out(n->out.get(), std::move(out));
}

}  // namespace

void register_gather_mm_kernels(KernelRegistry& r) { r.add(fb::OpNode::GatherMmNode, gather_mm); }

}  // namespace switchboard::cpu
