#include "gather_qmm_plan.h"

namespace switchboard::ops {

Result<GatherQmmPlan> plan_gather_qmm(const fb::GatherQmmNodeT& n, const Tensor& x, const Tensor& scales,
                                      int64_t w_words, int64_t lhs_count, int64_t rhs_count) {
  GatherQmmPlan p;
  p.rows = x.dim(0);
  p.k = x.dim(1);
  p.experts = scales.dim(0);
  p.nout = scales.dim(1);
  p.groups = scales.dim(2);
  p.pairs = rhs_count >= 0 ? rhs_count : lhs_count >= 0 ? lhs_count : p.rows;
  SB_CHECK_OR_RETURN(lhs_count < 0 || lhs_count == p.pairs, StatusCode::kInvalidArgument,
                     "lhs_indices has %lld entries, rhs_indices %lld", (long long)lhs_count, (long long)p.pairs);
  SB_CHECK_OR_RETURN(lhs_count >= 0 || p.rows == 0 || p.pairs % p.rows == 0, StatusCode::kInvalidArgument,
                     "%lld pairs are not a multiple of %lld rows of x", (long long)p.pairs, (long long)p.rows);
  p.all_4bit = true;
  for (int64_t e = 0; e < p.experts; ++e) {
    const int b = n.expert_bits.empty() ? n.bits : n.expert_bits[static_cast<size_t>(e)];
    p.bits.push_back(b);
    p.word_offset.push_back(p.words);
    p.words += p.nout * p.k * b / 32;
    p.all_4bit &= b == 4;
  }
  SB_CHECK_OR_RETURN(p.words == w_words, StatusCode::kInvalidArgument, "w holds %lld words, the experts need %lld",
                     (long long)w_words, (long long)p.words);
  return p;
}

Status check_gather_qmm_pairs(const GatherQmmPlan& plan, const std::vector<int64_t>& rhs, bool sorted) {
  for (size_t p = 0; p < rhs.size(); ++p)
    SB_CHECK_OR_RETURN(plan.bits[static_cast<size_t>(rhs[p])] != 0, StatusCode::kInvalidArgument,
                       "pair %lld selects expert %lld, which is pruned (0 bits)", (long long)p, (long long)rhs[p]);
  for (size_t p = 1; sorted && p < rhs.size(); ++p)
    SB_CHECK_OR_RETURN(rhs[p - 1] <= rhs[p], StatusCode::kInvalidArgument,
                       "sorted_indices is set but rhs_indices[%lld] = %lld follows %lld", (long long)p,
                       (long long)rhs[p], (long long)rhs[p - 1]);
  return Status::ok();
}

}  // namespace switchboard::ops
