// Every GPU kernel's interface as the hosts (Vulkan, Metal) bind it: bindings in order
// with their access, the argument struct, the workgroup size. Expanded from the one list
// of variants the shader build also reads: the SB_KERNEL lines at the top of each
// metal_shaders/*.comp, gathered by cmake/shaders.cmake into generated/kernel_list.inc.
// The structural test (tests/shader_structure_test.cpp) checks each entry against the
// SPIR-V reflection of the compiled shader; binding n is Metal buffer n, the arguments are
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

inline constexpr uint32_t F_DIVIDES = 1, F_INT64 = 2, F_MMA = 4, F_DOT = 8;

// One table entry from an SB_KERNEL line (access: r read, w write, b read-write per binding).
constexpr KernelInfo make_kernel(const char* name, const char* source, const char* access, uint32_t args_size,
                                 const char* args_fields, uint32_t local_size_x, uint32_t flags) {
  KernelInfo k{name, source, 0, {}, args_size, args_fields, local_size_x, true};
  for (; access[k.num_bindings]; ++k.num_bindings) {
    const char a = access[k.num_bindings];
    k.access[k.num_bindings] = a == 'r' ? Access::kRead : a == 'w' ? Access::kWrite : Access::kReadWrite;
  }
  k.divides = flags & F_DIVIDES;
  k.int64 = flags & F_INT64;
  k.int8_mma = flags & F_MMA;
  k.int_dot = flags & F_DOT;
  return k;
}

inline constexpr KernelInfo kKernels[] = {
#define SB_KERNEL(name, source, define, access, args, fields, local, flags) \
  make_kernel(#name, #source, access, sizeof(args), SB_STR(fields), local, flags),
#include "kernel_list.inc"
#undef SB_KERNEL
};
inline constexpr size_t kNumKernels = sizeof(kKernels) / sizeof(kKernels[0]);

// The layouts are plain 32-bit fields: no padding, and offsets that match std430.
static_assert(sizeof(BinaryArgs) == 4 * (4 + 3 * SB_MAX_RANK));
static_assert(offsetof(BinaryArgs, shape) == 16 && offsetof(BinaryArgs, sb) == 16 + 8 * SB_MAX_RANK);
static_assert(sizeof(UnaryArgs) == 16 && sizeof(CastArgs) == 16 && sizeof(FillArgs) == 16);
static_assert(sizeof(GluArgs) == 32 && offsetof(GluArgs, alpha) == 12 && offsetof(GluArgs, limit) == 16);
static_assert(sizeof(CombineArgs) == 32 && sizeof(Q8Args) == 16);
static_assert(sizeof(QmmArgs) == 64 && offsetof(QmmArgs, out_dtype) == 32 && offsetof(QmmArgs, per_wg) == 48);
static_assert(sizeof(QmmGluArgs) == 96 && offsetof(QmmGluArgs, glu_kind) == 64 && offsetof(QmmGluArgs, glu_limit) == 72);
static_assert(sizeof(QmmCombineArgs) == 96 && offsetof(QmmCombineArgs, slots) == 64 &&
              offsetof(QmmCombineArgs, gate_dtype) == 80);
static_assert(sizeof(QmmNormArgs) == 96 && offsetof(QmmNormArgs, has_residual) == 64 &&
              offsetof(QmmNormArgs, store_out) == 80);
static_assert(sizeof(PermuteArgs) == 32 && offsetof(PermuteArgs, out_words) == 16);
static_assert(sizeof(ProbeArgs) == 16 && sizeof(StreamArgs) == 16 && sizeof(ArgsortArgs) == 16);
static_assert(sizeof(GatherMmArgs) == 32 && sizeof(ReduceArgs) == 32 && sizeof(RegionArgs) == 48);
static_assert(sizeof(TransposeArgs) == 80 && offsetof(TransposeArgs, rank) == 64);
static_assert(sizeof(MatmulArgs) == 48 && sizeof(MatmulNormArgs) == 64 && offsetof(MatmulNormArgs, has_residual) == 48 && sizeof(NormArgs) == 36 && offsetof(NormArgs, eps) == 16);
static_assert(sizeof(NormQ8Args) == 48 && offsetof(NormQ8Args, permute) == 36 && offsetof(NormQ8Args, store_out) == 40);
static_assert(sizeof(AttentionQ8Args) == 80 && offsetof(AttentionQ8Args, q8_permute) == 72);
static_assert(sizeof(AttentionArgs) == 72 && offsetof(AttentionArgs, scale) == 32 &&
              offsetof(AttentionArgs, row0) == 48 && offsetof(AttentionArgs, pos_word) == 68);
static_assert(sizeof(AttentionRopeArgs) == 96 && offsetof(AttentionRopeArgs, pos_word) == 68 &&
              offsetof(AttentionRopeArgs, half_dims) == 72 && offsetof(AttentionRopeArgs, x_heads) == 88);
static_assert(sizeof(RopeArgs) == 68 && offsetof(RopeArgs, eps) == 32 && offsetof(RopeArgs, q_heads) == 48);
static_assert(sizeof(ConvArgs) == 32 && sizeof(DeltaArgs) == 48 && offsetof(DeltaArgs, scale) == 44);
static_assert(sizeof(RouterArgs) == 48 && offsetof(RouterArgs, routed_scaling_factor) == 32);
// 128 bytes is the smallest push-constant space Vulkan guarantees (lavapipe's limit).
static_assert(sizeof(BinaryArgs) <= 128 && sizeof(QmmGluArgs) <= 128);

inline const KernelInfo* find_kernel(const char* name) {
  for (const KernelInfo& k : kKernels)
    if (std::strcmp(k.name, name) == 0) return &k;
  return nullptr;
}

}  // namespace switchboard::kernels
