// GatherQmm's plan, built once per execution from the node and its operands' shapes and
// used by every device: the (x row, expert) pairs, each expert's width and where its codes
// start in w. Its errors are the op's shape errors on every device.
#pragma once

#include <cstdint>
#include <vector>

#include "program_generated.h"
#include "switchboard/status.h"
#include "switchboard/tensor.h"

namespace switchboard::ops {

struct GatherQmmPlan {
  int64_t rows = 0, k = 0, experts = 0, nout = 0, groups = 0, pairs = 0;
  std::vector<int> bits;             // per expert; 0 = pruned
  std::vector<int64_t> word_offset;  // per expert, into w's u32 words
  int64_t words = 0;                 // w's words all experts need
  bool all_4bit = false;             // every expert 4-bit (none pruned)
};

// x [rows, k], scales [E, N, groups], w of `w_words` u32 words; lhs_count / rhs_count: the
// entries of lhs_indices / rhs_indices, -1 when absent. Pairs: rhs's count, else lhs's,
// else one per row; without lhs, pair p reads x row p * rows / pairs.
Result<GatherQmmPlan> plan_gather_qmm(const fb::GatherQmmNodeT& n, const Tensor& x, const Tensor& scales,
                                      int64_t w_words, int64_t lhs_count, int64_t rhs_count);

// The checks of the pairs' expert ids that need their values (devices that read indices on
// the host; a GPU raises the same conditions from its kernels): no pair selects a pruned
// expert, and with `sorted` the ids never decrease. `rhs`: one entry per pair, in range.
Status check_gather_qmm_pairs(const GatherQmmPlan& plan, const std::vector<int64_t>& rhs, bool sorted);

}  // namespace switchboard::ops
