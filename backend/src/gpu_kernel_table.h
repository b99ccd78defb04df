// Every GPU kernel's interface as the hosts (Vulkan, Metal) bind it: bindings in
// order with their access, the argument struct, the workgroup size. The structural
// test (tests/shader_structure_test.cpp) checks each entry against the SPIR-V
// reflection of the compiled shader; binding n is Metal buffer n, the arguments are
// Metal buffer kMetalArgsBuffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernel_args.h"

namespace switchboard::kernels {

enum class Access : uint8_t { kRead, kWrite, kReadWrite };

inline constexpr uint32_t kMetalArgsBuffer = 30;
inline constexpr int kMaxBindings = 16;  // within Vulkan's guaranteed 32 push descriptors

struct KernelInfo {
  const char* name;        // kernel variant (sb_<name> is its MSL entry point)
  const char* source;      // metal_shaders/<source>.comp
  int num_bindings;
  Access access[kMaxBindings];
  uint32_t args_size;      // bytes of the push-constant block
  const char* args_fields; // the SB_*_ARGS field list, as text
  uint32_t local_size_x;
  bool exact;              // on an exact path: the lint applies
  // Uses IEEE division (OpFDiv), exact only where the start-up probe finds the device's
  // division correctly rounded; elsewhere the ops that need it are refused.
  bool divides = false;
  // Uses 64-bit integers (shaderInt64); refused on devices without them.
  bool int64 = false;
  // Vulkan only: int8 cooperative matrices (VK_NV_cooperative_matrix, 16x16x32 int8 ->
  // int32). No MSL is built; the host dispatches it only where GpuRuntime::int8_mma().
  bool int8_mma = false;
  // Vulkan only: packed int8 dot products (OpSDot of SPV_KHR_integer_dot_product). No MSL
  // is built; the host dispatches it only where GpuRuntime::int_dot().
  bool int_dot = false;
  // SPIR-V that SPIRV-Cross cannot translate: no MSL, no reflection JSON.
  constexpr bool vulkan_only() const { return int8_mma || int_dot; }
};

#define SB_STR_(...) #__VA_ARGS__
#define SB_STR(x) SB_STR_(x)

using A = Access;
// The bindings of qmm, qmm_tile, qmm_mma and qmm_mma4: 9 inputs, out, the error word.
#define SB_QMM_ACCESS \
  {A::kRead, A::kRead, A::kRead, A::kRead, A::kRead, A::kRead, A::kRead, A::kRead, A::kRead, A::kWrite, A::kReadWrite}
#define SB_QMM_ROW_ACCESS \
  {A::kRead, A::kRead, A::kRead, A::kRead, A::kRead, A::kRead, A::kRead, A::kWrite, A::kReadWrite}
#define SB_QMM_ROW_GLU_ACCESS                                                                                      \
  {A::kRead, A::kRead, A::kRead, A::kRead, A::kRead, A::kRead, A::kRead, A::kWrite, A::kReadWrite, A::kRead, A::kRead, \
   A::kRead}
inline constexpr KernelInfo kKernels[] = {
    {"binary", "elementwise", 4, {A::kRead, A::kRead, A::kWrite, A::kReadWrite}, sizeof(BinaryArgs),
     SB_STR(SB_BINARY_ARGS), 256, true},
    {"binary_div", "elementwise", 4, {A::kRead, A::kRead, A::kWrite, A::kReadWrite}, sizeof(BinaryArgs),
     SB_STR(SB_BINARY_ARGS), 256, true, true},
    {"binary_int", "elementwise", 4, {A::kRead, A::kRead, A::kWrite, A::kReadWrite}, sizeof(BinaryArgs),
     SB_STR(SB_BINARY_ARGS), 256, true, false, true},
    {"unary_int", "elementwise", 2, {A::kRead, A::kWrite}, sizeof(UnaryArgs), SB_STR(SB_UNARY_ARGS), 256, true, false,
     true},
    {"cast_i64", "cast", 2, {A::kRead, A::kWrite}, sizeof(CastArgs), SB_STR(SB_CAST_ARGS), 256, true, false, true},
    {"argmax_int", "reduce", 2, {A::kRead, A::kWrite}, sizeof(ReduceArgs), SB_STR(SB_REDUCE_ARGS), 256, true, false,
     true},
    {"unary", "elementwise", 2, {A::kRead, A::kWrite}, sizeof(UnaryArgs), SB_STR(SB_UNARY_ARGS), 256, true},
    {"cast", "cast", 2, {A::kRead, A::kWrite}, sizeof(CastArgs), SB_STR(SB_CAST_ARGS), 256, true},
    {"fill", "shape_ops", 1, {A::kWrite}, sizeof(FillArgs), SB_STR(SB_FILL_ARGS), 256, true},
    {"glu", "glu", 3, {A::kRead, A::kRead, A::kWrite}, sizeof(GluArgs), SB_STR(SB_GLU_ARGS), 256, true},
    {"combine", "combine", 5, {A::kRead, A::kRead, A::kRead, A::kRead, A::kWrite}, sizeof(CombineArgs),
     SB_STR(SB_COMBINE_ARGS), 256, true},
    {"combine16", "combine", 5, {A::kRead, A::kRead, A::kRead, A::kRead, A::kWrite}, sizeof(CombineArgs),
     SB_STR(SB_COMBINE_ARGS), 256, true},
    {"combine_rows", "combine", 6, {A::kRead, A::kRead, A::kRead, A::kRead, A::kWrite, A::kRead}, sizeof(CombineArgs),
     SB_STR(SB_COMBINE_ARGS), 256, true},
    {"gather_rows", "permute", 4, {A::kRead, A::kRead, A::kWrite, A::kReadWrite}, sizeof(PermuteArgs),
     SB_STR(SB_PERMUTE_ARGS), 256, true},
    {"gather_rows16", "permute", 4, {A::kRead, A::kRead, A::kWrite, A::kReadWrite}, sizeof(PermuteArgs),
     SB_STR(SB_PERMUTE_ARGS), 256, true},
    {"invert_permutation", "permute", 3, {A::kRead, A::kReadWrite, A::kReadWrite}, sizeof(PermuteArgs),
     SB_STR(SB_PERMUTE_ARGS), 256, true},
    {"quantize_q8", "gather_qmm", 4, {A::kRead, A::kWrite, A::kWrite, A::kWrite}, sizeof(Q8Args), SB_STR(SB_Q8_ARGS),
     64, true},
    {"quantize_q8_16", "gather_qmm", 4, {A::kRead, A::kWrite, A::kWrite, A::kWrite}, sizeof(Q8Args),
     SB_STR(SB_Q8_ARGS), 64, true},
    {"qmm", "gather_qmm", 11, SB_QMM_ACCESS,
     sizeof(QmmArgs), SB_STR(SB_QMM_ARGS), 64, true},
    {"qmm_row", "gather_qmm", 9, SB_QMM_ROW_ACCESS, sizeof(QmmArgs), SB_STR(SB_QMM_ARGS), 256, true},
    {"qmm_row_2k", "gather_qmm", 9, SB_QMM_ROW_ACCESS, sizeof(QmmArgs), SB_STR(SB_QMM_ARGS), 256, true},
    {"qmm_row_glu", "gather_qmm", 12, SB_QMM_ROW_GLU_ACCESS, sizeof(QmmGluArgs), SB_STR(SB_QMM_GLU_ARGS), 256, true},
    {"qmm_row_glu_2k", "gather_qmm", 12, SB_QMM_ROW_GLU_ACCESS, sizeof(QmmGluArgs), SB_STR(SB_QMM_GLU_ARGS), 256, true},
    // qmm_row_2k's bindings (y read back: read-write), then combine_weights, shared,
    // shared_gate, the per-(token, tile) counters and the combined output.
    {"qmm_row_combine_2k", "gather_qmm", 14,
     {A::kRead, A::kRead, A::kRead, A::kRead, A::kRead, A::kRead, A::kRead, A::kReadWrite, A::kReadWrite, A::kRead,
      A::kRead, A::kRead, A::kReadWrite, A::kWrite},
     sizeof(QmmCombineArgs), SB_STR(SB_QMM_COMBINE_ARGS), 256, true},
    // The row kernels above for all-4-bit experts on packed int8 dot products.
    {"qmm_row_dot4", "gather_qmm", 9, SB_QMM_ROW_ACCESS, sizeof(QmmArgs), SB_STR(SB_QMM_ARGS), 256, true, false, false,
     false, true},
    {"qmm_row_2k_dot4", "gather_qmm", 9, SB_QMM_ROW_ACCESS, sizeof(QmmArgs), SB_STR(SB_QMM_ARGS), 256, true, false,
     false, false, true},
    {"qmm_row_glu_dot4", "gather_qmm", 12, SB_QMM_ROW_GLU_ACCESS, sizeof(QmmGluArgs), SB_STR(SB_QMM_GLU_ARGS), 256,
     true, false, false, false, true},
    // qmm_row_glu's bindings, then the per-pair count of workgroups whose h is stored.
    {"qmm_row_glu_2k_dot4", "gather_qmm", 13,
     {A::kRead, A::kRead, A::kRead, A::kRead, A::kRead, A::kRead, A::kRead, A::kWrite, A::kReadWrite, A::kRead, A::kRead,
      A::kRead, A::kReadWrite},
     sizeof(QmmGluArgs), SB_STR(SB_QMM_GLU_ARGS), 256, true, false, false, false, true},
    // qmm_row_combine_2k's bindings, then qmm_row_glu_2k_dot4's counts (its wait_tiles).
    {"qmm_row_combine_2k_dot4", "gather_qmm", 15,
     {A::kRead, A::kRead, A::kRead, A::kRead, A::kRead, A::kRead, A::kRead, A::kReadWrite, A::kReadWrite, A::kRead,
      A::kRead, A::kRead, A::kReadWrite, A::kWrite, A::kRead},
     sizeof(QmmCombineArgs), SB_STR(SB_QMM_COMBINE_ARGS), 256, true, false, false, false, true},
    {"qmm_tiles", "gather_qmm", 4, {A::kRead, A::kRead, A::kWrite, A::kReadWrite}, sizeof(QmmArgs), SB_STR(SB_QMM_ARGS),
     256, true},
    {"qmm_tile", "gather_qmm", 11, SB_QMM_ACCESS,
     sizeof(QmmArgs), SB_STR(SB_QMM_ARGS), 256, true},
    {"qmm_mma", "gather_qmm", 11, SB_QMM_ACCESS,
     sizeof(QmmArgs), SB_STR(SB_QMM_ARGS), 256, true, false, false, true},
    {"qmm_mma4", "gather_qmm", 11, SB_QMM_ACCESS,
     sizeof(QmmArgs), SB_STR(SB_QMM_ARGS), 256, true, false, false, true},
    // qmm_mma4's bindings (out: h's Q8 codes), then the up projection's codes, scales and
    // biases, h's block scales d and code sums.
    {"qmm_mma4_glu", "gather_qmm", 16,
     {A::kRead, A::kRead, A::kRead, A::kRead, A::kRead, A::kRead, A::kRead, A::kRead, A::kRead, A::kWrite, A::kReadWrite,
      A::kRead, A::kRead, A::kRead, A::kWrite, A::kWrite},
     sizeof(QmmGluArgs), SB_STR(SB_QMM_GLU_ARGS), 256, true, false, false, true},
    {"qmm_mma_probe", "gather_qmm", 1, {A::kWrite}, sizeof(ProbeArgs), SB_STR(SB_PROBE_ARGS), 32, true, false, false,
     true},
    {"argsort", "permute", 2, {A::kRead, A::kWrite}, sizeof(ArgsortArgs), SB_STR(SB_ARGSORT_ARGS), 256, true},
    {"router", "router", 7, {A::kRead, A::kRead, A::kRead, A::kRead, A::kWrite, A::kWrite, A::kReadWrite},
     sizeof(RouterArgs), SB_STR(SB_ROUTER_ARGS), 256, true},
    // router for <= 256 experts of one kind (RouterKind 0, 1, 2).
    {"router_e256_softmax", "router", 7, {A::kRead, A::kRead, A::kRead, A::kRead, A::kWrite, A::kWrite, A::kReadWrite},
     sizeof(RouterArgs), SB_STR(SB_ROUTER_ARGS), 256, true},
    {"router_e256_topk_softmax", "router", 7, {A::kRead, A::kRead, A::kRead, A::kRead, A::kWrite, A::kWrite, A::kReadWrite},
     sizeof(RouterArgs), SB_STR(SB_ROUTER_ARGS), 256, true},
    {"router_e256_sigmoid", "router", 7, {A::kRead, A::kRead, A::kRead, A::kRead, A::kWrite, A::kWrite, A::kReadWrite},
     sizeof(RouterArgs), SB_STR(SB_ROUTER_ARGS), 256, true},
    {"gather_mm", "gather_mm", 6, {A::kRead, A::kRead, A::kRead, A::kRead, A::kWrite, A::kReadWrite},
     sizeof(GatherMmArgs), SB_STR(SB_GATHER_MM_ARGS), 32, true},
    {"reduce", "reduce", 2, {A::kRead, A::kWrite}, sizeof(ReduceArgs), SB_STR(SB_REDUCE_ARGS), 256, true},
    {"reduce_mean", "reduce", 2, {A::kRead, A::kWrite}, sizeof(ReduceArgs), SB_STR(SB_REDUCE_ARGS), 256, true, true},
    {"argmax", "reduce", 2, {A::kRead, A::kWrite}, sizeof(ReduceArgs), SB_STR(SB_REDUCE_ARGS), 256, true},
    {"argmax_row", "reduce", 2, {A::kRead, A::kWrite}, sizeof(ReduceArgs), SB_STR(SB_REDUCE_ARGS), 256, true},
    {"region", "shape_ops", 2, {A::kRead, A::kReadWrite}, sizeof(RegionArgs), SB_STR(SB_REGION_ARGS), 256, true},
    {"transpose", "shape_ops", 2, {A::kRead, A::kWrite}, sizeof(TransposeArgs), SB_STR(SB_TRANSPOSE_ARGS), 256,
     true},
    {"matmul", "matmul", 4, {A::kRead, A::kRead, A::kRead, A::kWrite}, sizeof(MatmulArgs), SB_STR(SB_MATMUL_ARGS), 32,
     true},
    {"matmul_rows16", "matmul", 4, {A::kRead, A::kRead, A::kRead, A::kWrite}, sizeof(MatmulArgs), SB_STR(SB_MATMUL_ARGS),
     32, true},
    {"matmul_tile", "matmul", 4, {A::kRead, A::kRead, A::kRead, A::kWrite}, sizeof(MatmulArgs),
     SB_STR(SB_MATMUL_ARGS), 256, true},
    {"softmax", "norm", 2, {A::kRead, A::kReadWrite}, sizeof(NormArgs), SB_STR(SB_NORM_ARGS), 64, true},
    {"rms_norm", "norm", 3, {A::kRead, A::kRead, A::kReadWrite}, sizeof(NormArgs), SB_STR(SB_NORM_ARGS), 64, true},
    {"softmax_row", "norm", 2, {A::kRead, A::kReadWrite}, sizeof(NormArgs), SB_STR(SB_NORM_ARGS), 256, true},
    {"rms_norm_row", "norm", 3, {A::kRead, A::kRead, A::kReadWrite}, sizeof(NormArgs), SB_STR(SB_NORM_ARGS), 256,
     true},
    {"numerics_probe", "probe", 2, {A::kRead, A::kWrite}, sizeof(ProbeArgs), SB_STR(SB_PROBE_ARGS), 64, true, true},
    {"stream_read", "probe", 2, {A::kRead, A::kWrite}, sizeof(StreamArgs), SB_STR(SB_STREAM_ARGS), 256, true},
};
inline constexpr size_t kNumKernels = sizeof(kKernels) / sizeof(kKernels[0]);

// The layouts are plain 32-bit fields: no padding, and offsets that match std430.
static_assert(sizeof(BinaryArgs) == 4 * (4 + 3 * SB_MAX_RANK));
static_assert(offsetof(BinaryArgs, shape) == 16 && offsetof(BinaryArgs, sb) == 16 + 8 * SB_MAX_RANK);
static_assert(sizeof(UnaryArgs) == 16 && sizeof(CastArgs) == 16 && sizeof(FillArgs) == 16);
static_assert(sizeof(GluArgs) == 32 && offsetof(GluArgs, alpha) == 12 && offsetof(GluArgs, limit) == 16);
static_assert(sizeof(CombineArgs) == 32 && sizeof(Q8Args) == 16);
static_assert(sizeof(QmmArgs) == 64 && offsetof(QmmArgs, out_dtype) == 32 && offsetof(QmmArgs, per_wg) == 48);
static_assert(sizeof(QmmGluArgs) == 80 && offsetof(QmmGluArgs, glu_kind) == 64 && offsetof(QmmGluArgs, glu_limit) == 72);
static_assert(sizeof(QmmCombineArgs) == 96 && offsetof(QmmCombineArgs, slots) == 64 &&
              offsetof(QmmCombineArgs, gate_dtype) == 80);
static_assert(sizeof(PermuteArgs) == 32 && offsetof(PermuteArgs, out_words) == 16);
static_assert(sizeof(ProbeArgs) == 16 && sizeof(StreamArgs) == 16 && sizeof(ArgsortArgs) == 16);
static_assert(sizeof(GatherMmArgs) == 32 && sizeof(ReduceArgs) == 32 && sizeof(RegionArgs) == 48);
static_assert(sizeof(TransposeArgs) == 80 && offsetof(TransposeArgs, rank) == 64);
static_assert(sizeof(MatmulArgs) == 48 && sizeof(NormArgs) == 32 && offsetof(NormArgs, eps) == 16);
static_assert(sizeof(RouterArgs) == 48 && offsetof(RouterArgs, routed_scaling_factor) == 32);
// 128 bytes is the smallest push-constant space Vulkan guarantees (lavapipe's limit).
static_assert(sizeof(BinaryArgs) <= 128 && sizeof(QmmGluArgs) <= 128);

inline const KernelInfo* find_kernel(const char* name) {
  for (const KernelInfo& k : kKernels)
    if (std::strcmp(k.name, name) == 0) return &k;
  return nullptr;
}

}  // namespace switchboard::kernels
