// Helpers shared by the CPU fallback kernels, which read the device-neutral element
// access and shape rules (backend/ops/) unqualified. Float math is done in f32 with
// round to nearest even on store (docs/numerics.md).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "device.h"
#include "element_access.h"
#include "op_shapes.h"
#include "switchboard/tensor.h"

namespace switchboard::cpu {

using namespace ::switchboard::ops;

// dot32 of docs/numerics.md: 32 strided partial sums (product, then add), then the
// halving tree 16, 8, 4, 2, 1 (dot32.cpp).
float dot32(const float* x, const float* w, int64_t k);
// out[q] = dot32(x, w[q], k) for q < 4, in one pass over x (the same bits).
void dot32_x4(const float* x, const float* const* w, int64_t k, float* out);
// y[i] = y[i] + a * v[i] for i < n (product rounded, then the add: the same bits at any width).
void axpy(float* y, float a, const float* v, int64_t n);
// axpy(y, a[r], v + r * stride, n) for r = 0 .. rows - 1 in order (the same bits; y kept in registers).
void axpy_rows(float* y, const float* a, const float* v, int64_t stride, int64_t rows, int64_t n);
// x[i] = exact::exp(x[i]) for i < n, 16 lanes at a time where the CPU has AVX-512 (the same bits).
void exp_inplace(float* x, int n);
// RmsNorm's rsqrt(sum of squares * inv_d + eps): the sum in index order, or (tree) as dot32.
float rms_scale(const float* x, int64_t d, float inv_d, float eps, bool tree);

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
void register_attention_kernels(KernelRegistry& r);
void register_rope_kernels(KernelRegistry& r);
void register_linear_attention_kernels(KernelRegistry& r);

// out[t, d] = base + sum_{j < slots} weights[t, j] * y[t * slots + j, d], slot order;
// base = sigmoid(gate[t]) * shared[t, d] | shared[t, d] | 0 (undefined tensors: absent).
// `y` holds f32 values already rounded to out's dtype.
Status combine_rows(const float* y, const Tensor& weights, const Tensor& shared, const Tensor& gate, int64_t tokens,
                    int64_t slots, int64_t dim, Tensor& out);

}  // namespace switchboard::cpu
