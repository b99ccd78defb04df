// MLX's affine quantization format: per group of `group_size` consecutive values
// along a row, w ~= scale * q + bias with q in [0, 2^bits - 1]; each row's codes
// form one little-endian bit stream packed into uint32 words (element j at bits
// [j*bits, (j+1)*bits)), so mlx-community checkpoints load unchanged.
#pragma once

#include <cstdint>

#include "switchboard/status.h"
#include "switchboard/tensor.h"

namespace switchboard {

// Bits a GatherQmm expert may use; 0 marks a pruned expert.
inline bool quant_bits_allowed(int bits) { return bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8; }
inline bool quant_group_allowed(int gs) { return gs == 32 || gs == 64 || gs == 128; }

// Code j of a packed row (a little-endian bit stream of `bits`-wide codes).
inline uint32_t unpack_code(const uint32_t* row, int64_t j, int bits) {
  const uint64_t bit = static_cast<uint64_t>(j) * static_cast<uint64_t>(bits);
  const uint64_t word = bit >> 5;
  const unsigned shift = static_cast<unsigned>(bit & 31);
  uint64_t v = row[word] >> shift;
  if (shift + static_cast<unsigned>(bits) > 32) v |= static_cast<uint64_t>(row[word + 1]) << (32 - shift);
  return static_cast<uint32_t>(v) & ((1u << bits) - 1u);
}

struct QuantizedRows {
  Tensor w;       // u32 [rows, k * bits / 32]
  Tensor scales;  // scale_dtype [rows, k / group_size]
  Tensor biases;  // scale_dtype [rows, k / group_size]
};

// Quantizes `w` [rows, k] (f32, f16 or bf16) exactly as MLX's affine quantizer:
// per group, scale = max((max(0, w_max) - w_min) / (2^bits - 1), 1e-7), the edge
// with the larger magnitude chooses the scale's sign, and the scale is adjusted
// so 0.0 is exactly representable; codes are round-half-away((w - bias) / scale)
// clipped to 2^bits - 1, computed in f32; scales and biases are then rounded to
// `scale_dtype`.
Result<QuantizedRows> affine_quantize(const Tensor& w, int bits, int group_size, DType scale_dtype);

// The f32 values the codes stand for: scale * q + bias per element (scale and
// bias widened from their dtype), for tests and the dequantize reference.
Result<Tensor> affine_dequantize(const Tensor& wq, const Tensor& scales, const Tensor& biases, int bits, int group_size,
                                 int64_t k);

}  // namespace switchboard
