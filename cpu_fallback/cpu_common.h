// Helpers shared by the CPU fallback kernels: typed element access, axis
// normalisation and broadcasting. Float math is done in f32 with round to
// nearest even on store (docs/numerics.md).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "device.h"
#include "switchboard/tensor.h"

namespace switchboard::cpu {

inline float load_f32(const void* base, DType t, int64_t i) {
  const auto* p = static_cast<const uint8_t*>(base);
  switch (t) {
    case DType::kF32: { float v; std::memcpy(&v, p + i * 4, 4); return v; }
    case DType::kF16: { uint16_t v; std::memcpy(&v, p + i * 2, 2); return f16_to_f32(v); }
    case DType::kBF16: { uint16_t v; std::memcpy(&v, p + i * 2, 2); return bf16_to_f32(v); }
    default: return 0.f;
  }
}

inline void store_f32(void* base, DType t, int64_t i, float v) {
  auto* p = static_cast<uint8_t*>(base);
  switch (t) {
    case DType::kF32: std::memcpy(p + i * 4, &v, 4); break;
    case DType::kF16: { uint16_t h = f32_to_f16(v); std::memcpy(p + i * 2, &h, 2); break; }
    case DType::kBF16: { uint16_t h = f32_to_bf16(v); std::memcpy(p + i * 2, &h, 2); break; }
    default: break;
  }
}

// v rounded to `t` (f32, f16 or bf16) and widened back: what a store and reload gives.
inline float round_to(float v, DType t) {
  if (t == DType::kF16) return f16_to_f32(f32_to_f16(v));
  if (t == DType::kBF16) return bf16_to_f32(f32_to_bf16(v));
  return v;
}

// max/min independent of operand order: NaN from either side propagates, and
// for equal values (+0 vs -0) max picks +0 and min picks -0.
inline float max_f32(float a, float b) {
  if (a != a || b != b) return a != a ? a : b;
  if (a == b) return f32_from_bits(f32_bits(a) & f32_bits(b));
  return a > b ? a : b;
}
inline float min_f32(float a, float b) {
  if (a != a || b != b) return a != a ? a : b;
  if (a == b) return f32_from_bits(f32_bits(a) | f32_bits(b));
  return a < b ? a : b;
}

// Integer dtypes (and bool) widened to int64.
inline int64_t load_i64(const void* base, DType t, int64_t i) {
  const auto* p = static_cast<const uint8_t*>(base);
  switch (t) {
    case DType::kI32: { int32_t v; std::memcpy(&v, p + i * 4, 4); return v; }
    case DType::kI64: { int64_t v; std::memcpy(&v, p + i * 8, 8); return v; }
    case DType::kU32: { uint32_t v; std::memcpy(&v, p + i * 4, 4); return v; }
    case DType::kU8: return p[i];
    case DType::kBool: return p[i] != 0;
    default: return 0;
  }
}

// Stores the low bits (two's-complement wrap), like a C++ integer conversion.
inline void store_i64(void* base, DType t, int64_t i, int64_t v) {
  auto* p = static_cast<uint8_t*>(base);
  switch (t) {
    case DType::kI32: { auto w = static_cast<int32_t>(static_cast<uint32_t>(v)); std::memcpy(p + i * 4, &w, 4); break; }
    case DType::kI64: std::memcpy(p + i * 8, &v, 8); break;
    case DType::kU32: { auto w = static_cast<uint32_t>(v); std::memcpy(p + i * 4, &w, 4); break; }
    case DType::kU8: p[i] = static_cast<uint8_t>(v); break;
    case DType::kBool: p[i] = v != 0; break;
    default: break;
  }
}

// dot32 of docs/numerics.md: 32 strided partial sums (product, then add), then the
// halving tree 16, 8, 4, 2, 1 (gather_mm.cpp).
float dot32(const float* x, const float* w, int64_t k);

// Every element widened to f32 (f32, f16 or bf16 sources).
std::vector<float> widen_f32(const Tensor& t);
// t's elements as f32: its own data when it is f32 (no copy: weights are read every
// step), else widened into *storage.
const float* f32_data(const Tensor& t, std::vector<float>* storage);

// An optional i32 index tensor read into int64, every entry checked to lie in
// [0, limit); empty when the slot is absent. Errors name `field` and the entry.
Result<std::vector<int64_t>> read_indices(KernelContext& ctx, const std::unique_ptr<fb::Tid>& tid, const char* field,
                                          int64_t limit);

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

// SliceUpdate's shape rules: update matches dst outside `axis`, and fits at `start`.
Status check_slice_update(const Tensor& u, const Tensor& dst, int64_t axis, int64_t start);

// numpy broadcasting: align right; each pair of dims equal or one of them 1.
Result<Shape> broadcast_shape(const Shape& a, const Shape& b);
// Element strides of `s` seen through the broadcast shape `out` (0 on broadcast dims).
std::vector<int64_t> broadcast_strides(const Shape& s, const Shape& out);

void register_elementwise_kernels(KernelRegistry& r);
void register_cast_kernels(KernelRegistry& r);
void register_shape_kernels(KernelRegistry& r);
void register_matmul_kernels(KernelRegistry& r);
void register_reduce_kernels(KernelRegistry& r);
void register_gather_qmm_kernels(KernelRegistry& r);
void register_gather_mm_kernels(KernelRegistry& r);
void register_router_kernels(KernelRegistry& r);
void register_permute_kernels(KernelRegistry& r);
void register_glu_kernels(KernelRegistry& r);
void register_combine_kernels(KernelRegistry& r);
void register_norm_kernels(KernelRegistry& r);

// out[t, d] = base + sum_{j < slots} weights[t, j] * y[t * slots + j, d], slot order;
// base = sigmoid(gate[t]) * shared[t, d] | shared[t, d] | 0 (undefined tensors: absent).
// `y` holds f32 values already rounded to out's dtype.
Status combine_rows(const float* y, const Tensor& weights, const Tensor& shared, const Tensor& gate, int64_t tokens,
                    int64_t slots, int64_t dim, Tensor& out);

}  // namespace switchboard::cpu
