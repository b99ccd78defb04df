// GatherQmm building blocks shared by the kernel, its fast paths and the
// benchmarks: int8 activation blocks and the per-expert weight table.
#pragma once

#include <cstdint>
#include <vector>

#include "switchboard/tensor.h"

namespace switchboard::cpu {

inline constexpr int kQ8Block = 32;

// Activations quantized in blocks of 32 (docs/numerics.md, "Q8 activations"):
// x ~= d * q with d a power of two, |q| <= 127.
struct Q8Activations {
  int64_t rows = 0, k = 0;
  std::vector<int8_t> q;     // [rows, k]
  std::vector<float> d;      // [rows, k / 32]
  std::vector<int32_t> sum;  // [rows, k / 32]: sum of q over the block
};
void quantize_q8_row(const float* x, int64_t k, int8_t* q, float* d, int32_t* sum);
Q8Activations quantize_q8(const Tensor& x);

// Where each expert's packed codes start and how wide they are.
struct ExpertTable {
  int64_t n = 0, k = 0, groups = 0, group_size = 0;
  std::vector<int> bits;              // per expert; 0 = pruned
  std::vector<int64_t> word_offset;   // per expert, into the u32 code buffer
  const uint32_t* codes = nullptr;
  const void* scales = nullptr;       // [E, N, groups]
  const void* biases = nullptr;
  DType scale_dtype = DType::kF32;
};

// SIMD paths, chosen at run time from the CPU's features; every path gives the
// same bits. SWITCHBOARD_CPU_PATH=portable|avx2|avx512|amx (or set_cpu_path_limit)
// caps the choice, e.g. to test a slower path on a faster machine. Each path is a
// superset of the one below it: kAmx runs the AVX-512 VNNI kernels too, and uses
// AMX tiles only for runs of >= x86::kAmxMinRows token rows on one expert.
enum class CpuPath { kPortable = 0, kAvx2 = 1, kAvx512Vnni = 2, kAmx = 3 };
const char* cpu_path_name(CpuPath p);
CpuPath best_cpu_path();  // what this CPU supports
void set_cpu_path_limit(CpuPath limit);
CpuPath active_cpu_path();  // min(limit, best)
// The AVX-512 kernels (GatherQmm VNNI tiles, the f32 SwiGLU) may run.
inline bool fast_paths_enabled() { return active_cpu_path() >= CpuPath::kAvx512Vnni; }

// out[i * out_stride + (n - n0)] for the token rows `rows[0..count)` of `xq`, all
// against expert e, output rows n in [n0, n1); f32 results before rounding.
void qmm_rows(const ExpertTable& t, int e, const Q8Activations& xq, const int64_t* rows, int64_t count, int64_t n0,
              int64_t n1, float* out, int64_t out_stride);

}  // namespace switchboard::cpu
