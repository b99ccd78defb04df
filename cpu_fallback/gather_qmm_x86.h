// GatherQmm fast path for x86 with AVX-512 VNNI: weights repacked so one 64-byte
// load holds 4 codes for each of 16 output rows, consumed by vpdpbusd (u8 codes
// x s8 activations). It computes exactly the integer contract of
// docs/numerics.md, so its bits equal the portable path's. With AMX
// (gather_qmm_amx.cpp), runs of many token rows on one expert take the same
// tiles through tdpbsud instead: the same exact int32 block sums, the same bits.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "gather_qmm.h"

namespace switchboard::cpu::x86 {

// True when this CPU (and build) can run the AVX-512 VNNI path.
bool available();
// True when it can run the AVX2 path (AVX2 + F16C).
bool avx2_available();
// True when it can run the AMX path: AMX-TILE + AMX-INT8 in CPUID, tile state
// enabled in XCR0, the Linux tile-data permission granted, and available().
bool amx_available();

// One projection's experts in the tile layout: per expert, per 16-row tile, the
// codes chunk by chunk (4-bit: 8 k per 64 bytes, low nibble k..k+3, high k+4..k+7;
// 2-bit: 16 k, crumb i holds k+4i..k+4i+3; 8-bit: 4 k; 3/5/6-bit expand to 8-bit),
// then the scales and biases of each group as 16 contiguous values.
struct Repacked {
  int64_t n = 0, k = 0, groups = 0, group_size = 0, tiles = 0;
  DType scale_dtype = DType::kF32;
  std::vector<int> format;          // per expert: 2, 4 or 8 (0: pruned)
  std::vector<int64_t> code_offset; // bytes into codes
  std::vector<int64_t> sb_offset;   // bytes into sb
  std::shared_ptr<uint8_t> codes, sb;
  std::vector<Tensor> sources;      // keeps the repacked tensors alive (cache keys stay valid)
};

// `sources` (the tensors t points into) are kept alive by the result.
std::shared_ptr<const Repacked> repack(const ExpertTable& t, std::vector<Tensor> sources = {});

// Bytes per code in the repacked layout (for benchmarks' byte counts).
double repacked_bytes_per_weight(int format);

// Same contract as cpu::qmm_rows, over 16-row tiles [tile0, tile1). `xg` holds
// X_g = sum over the group's blocks of Sx_j * d_j, per row of xq: [rows, groups].
void qmm_tiles(const Repacked& r, int e, const Q8Activations& xq, const float* xg, const int64_t* rows, int64_t count,
               int64_t tile0, int64_t tile1, float* out, int64_t out_stride);

// The same with AMX (gather_qmm_amx.cpp): 16 token rows per tdpbsud; a last
// partial group of at least kAmxMinRows rows is zero-padded to 16, fewer rows
// (and every count below kAmxMinRows) go to qmm_tiles.
inline constexpr int64_t kAmxMinRows = 8;
void qmm_tiles_amx(const Repacked& r, int e, const Q8Activations& xq, const float* xg, const int64_t* rows,
                   int64_t count, int64_t tile0, int64_t tile1, float* out, int64_t out_stride);

// The same, with AVX2 (gather_qmm_avx2.cpp).
void qmm_tiles_avx2(const Repacked& r, int e, const Q8Activations& xq, const float* xg, const int64_t* rows,
                    int64_t count, int64_t tile0, int64_t tile1, float* out, int64_t out_stride);

}  // namespace switchboard::cpu::x86
