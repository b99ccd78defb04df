// Internal to backend/models: the one conversion path from logical f32 weights to a
// program's constants, shared by the importers and the random models.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "switchboard/model.h"

namespace switchboard::models {

inline bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::char_traits<char>::length(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// K (the input width) of a linear by its logical name ("layers.3.attn.o", "lm_head", ...).
int64_t input_width(const ModelConfig& c, const std::string& linear);

// A logical weight in f32 and our layout ([N, K] linears, [E, N, K] experts, [d] vectors).
using Fetch = std::function<Result<Tensor>(const std::string& logical, const Shape& shape)>;

// Codes already quantized in the checkpoint (MLX): appends weight/scales/biases for the
// linear `base` with the specs' shapes and returns true, or returns false to quantize.
using RawFetch = std::function<Result<bool>(const std::string& base, const WeightSpec& weight,
                                            const WeightSpec& scales, std::vector<std::pair<std::string, Tensor>>* out)>;

// Rows `rows` of t viewed as [n, *] (any dtype: codes, scales and biases are moved as bytes).
Result<Tensor> take_rows(const Tensor& t, int64_t n, const std::vector<int64_t>& rows);

// The fused q/k/v projection (fused_qkv.cpp): a Fetch, and a RawFetch call, that assemble
// "layers.<i>.attn.qkv" and its bias from the separate projections (other names pass through).
Fetch fused_qkv_fetch(const ModelConfig& c, const Fetch& fetch);
Result<bool> fused_qkv_raw(const ModelConfig& c, const RawFetch& raw, const std::string& base, const WeightSpec& w,
                           const WeightSpec& s, std::vector<std::pair<std::string, Tensor>>* out);

// Every constant of the program, each handed to `sink` as soon as it is made: RoPE tables
// computed, floats converted to their dtype, quantized linears and experts packed
// (per-expert widths from the format's bit map).
Status materialize(const ModelConfig& c, const ExportFormat& f, const Fetch& fetch,
                   const std::function<void(size_t, size_t)>& progress, const WeightSink& sink,
                   const RawFetch& raw = nullptr);

}  // namespace switchboard::models
