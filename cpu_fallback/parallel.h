// A persistent worker pool for CPU kernels. Work is split into index ranges;
// which thread computes a range never changes the result (kernels write
// disjoint outputs), so results are identical for any thread count.
#pragma once

#include <cstdint>
#include <functional>

namespace switchboard::cpu {

// Threads used by kernels: $SWITCHBOARD_THREADS, else the hardware count.
int num_threads();
void set_num_threads(int n);

// Calls fn(begin, end) over [0, n) in chunks of at least `grain`, in parallel.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace switchboard::cpu
