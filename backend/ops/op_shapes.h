// Run-time shape rules of the op families (schema/program.fbs states each op's semantics):
// the one place the CPU and GPU devices compute an op's output shape and check its operands,
// so the same program fails with the same message on every device. Where the builder infers
// the same shape, both come from one template of dim_rules.h.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "device.h"
#include "switchboard/tensor.h"

namespace switchboard::ops {

// Maps a possibly negative axis into [0, rank); error when out of range.
Result<int64_t> normalize_axis(int64_t axis, int64_t rank);

// Splits a shape around `axis` into outer * dim * inner element counts.
struct AxisSplit {
  int64_t outer = 1, dim = 1, inner = 1;
};
AxisSplit split_at(const Shape& s, int64_t axis);

// Full: its resolved shape (an error names a negative dim), and `count` elements of
// dtype t set to `value` as Full converts it (schema/program.fbs, FullNode).
Result<Shape> full_shape(KernelContext& ctx, const fb::FullNodeT& n);
void fill_value(void* data, DType t, int64_t count, double value);

// Slice's [start, stop) on `axis` of x: negatives count from the end, both clamped
// to [0, d], stop >= start.
Result<std::pair<int64_t, int64_t>> slice_range(KernelContext& ctx, const fb::SliceNodeT& n, const Tensor& x,
                                                int64_t axis);
// Concat's output shape (inputs equal except at `axis`).
Result<Shape> concat_shape(const std::vector<Tensor>& xs, int64_t axis);

// Matmul / BatchMatmul dimensions after their shape checks. Matmul: rows = product of
// a's leading dims; BatchMatmul: batch = Ba, group = Ba / Bb, rows = M.
struct MatmulDims {
  int64_t batch = 1, group = 1, rows = 0, k = 0, cols = 0;
};
Result<MatmulDims> matmul_dims(const Tensor& a, const Tensor& b, bool transpose_b, const Tensor& bias);
Result<MatmulDims> batch_matmul_dims(const Tensor& a, const Tensor& b, bool transpose_b);

// Transpose as a strided copy: out's shape, and out viewed as dims (row-major, axes of
// size 1 dropped, neighbours merged where x keeps them adjacent) with x's element
// stride for each; an empty dims means a single element.
struct TransposePlan {
  Shape out_shape;
  std::vector<int64_t> dims, src_strides;
};
Result<TransposePlan> transpose_plan(const Tensor& x, const std::vector<int32_t>& perm);

// Attention's run-time sizes after its checks: q [m, hq, hd], caches [hk, S, hd], keys
// 0..len-1 with len = pos + m <= S, sinks [hq] when given.
struct AttentionDims {
  int64_t m = 0, hq = 0, hk = 0, hd = 0, cache = 0, pos = 0, len = 0;
  // Elements between a head's consecutive keys and between heads: [hk, S, hd] or (seq_major) [S, hk, hd].
  int64_t key_stride = 0, head_stride = 0;
};
Result<AttentionDims> attention_dims(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* sinks,
                                     int64_t pos, bool seq_major = false);
// Rope's sizes: x [m, h, hd], tables [S, half]; checks pos + m <= S and 2 * half <= hd.
struct RopeDims {
  int64_t m = 0, h = 0, hd = 0, half = 0, table_rows = 0, pos = 0;
  int64_t q_heads = 0, k_heads = 0;  // the fused q/k/v form (k_heads > 0): x's heads read
};
// With norm_weight, it is [hd]; with a cache, it is [S, h, hd] with pos + m <= S.
Result<RopeDims> rope_dims(const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t pos,
                           const Tensor* norm_weight = nullptr, const Tensor* cache = nullptr);
// The fused q/k/v form (schema v8): x [m, H, hd] with H >= q_heads + 2 k_heads; k_norm_weight
// [hd] when given; cache and v_cache [S, k_heads, hd] with pos + m <= S.
Result<RopeDims> rope_qkv_dims(const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t pos,
                               const Tensor* norm_weight, const Tensor* k_norm_weight, const Tensor& cache,
                               const Tensor& v_cache, int64_t q_heads, int64_t k_heads);

// CausalConv1d: x [m, C], weight [C, K] (K >= 1), state [K - 1, C]; 0 <= pos < 2^31 (the GPUs read it as
// a 32-bit word).
struct ConvDims {
  int64_t m = 0, c = 0, k = 0;
};
Result<ConvDims> causal_conv1d_dims(const Tensor& x, const Tensor& weight, const Tensor& state, int64_t pos);

// GatedDeltaRule: qkv [m, 2 hk dk + hv dv], a / b [m, hv], a_log / dt_bias [hv], state [hv, dk, dv]
// f32, hv a multiple of hk; 0 <= pos < 2^31.
struct DeltaDims {
  int64_t m = 0, hk = 0, hv = 0, dk = 0, dv = 0, width = 0;
};
Result<DeltaDims> gated_delta_rule_dims(const Tensor& qkv, const Tensor& a, const Tensor& b, const Tensor& a_log,
                                        const Tensor& dt_bias, const Tensor& state, int64_t pos);

// RmsNorm's inv_d: the f32 nearest 1/d (computed once by the host; every device gets these bits).
inline float inverse_count(int64_t d) { return d ? static_cast<float>(1.0 / static_cast<double>(d)) : 0.0f; }

// AttentionOrder Blocked32's key blocks: keys [32 b, 32 b + 32) by position.
inline constexpr int64_t kAttentionBlock = 32;
// The keys query position `at` sees, [lo, hi): causal, and with window > 0 the last `window`.
struct KeyRange {
  int64_t lo = 0, hi = 0;
};
inline KeyRange visible_keys(int64_t at, int64_t window) {
  return {window > 0 && at + 1 > window ? at + 1 - window : 0, at + 1};
}

// SliceUpdate's shape rules: update matches dst outside `axis`, and fits at `start`.
Status check_slice_update(const Tensor& u, const Tensor& dst, int64_t axis, int64_t start);

// numpy broadcasting: align right; each pair of dims equal or one of them 1.
Result<Shape> broadcast_shape(const Shape& a, const Shape& b);
// Element strides of `s` seen through the broadcast shape `out` (0 on broadcast dims).
std::vector<int64_t> broadcast_strides(const Shape& s, const Shape& out);

// Reshape's resolved shape (one -1 inferred from x's element count).
Result<Shape> reshape_shape(KernelContext& ctx, const fb::ReshapeNodeT& n, const Tensor& x);

// An optional i32 index tensor read into int64, every entry checked to lie in
// [0, limit); empty when the slot is absent. Errors name `field` and the entry.
Result<std::vector<int64_t>> read_indices(KernelContext& ctx, const std::unique_ptr<fb::Tid>& tid, const char* field,
                                          int64_t limit);

}  // namespace switchboard::ops
