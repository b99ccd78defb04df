// Internal to backend/models: the one conversion path from logical f32 weights to a
// program's constants, shared by the importers and the random models.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "switchboard/model.h"

namespace switchboard::models {

// A logical weight in f32 and our layout ([N, K] linears, [E, N, K] experts, [d] vectors).
using Fetch = std::function<Result<Tensor>(const std::string& logical, const Shape& shape)>;

// Every constant of the program: RoPE tables computed, floats converted to their dtype,
// quantized linears and experts packed (per-expert widths from the format's bit map).
Result<std::vector<std::pair<std::string, Tensor>>> materialize(const ModelConfig& c, const ExportFormat& f,
                                                                const Fetch& fetch,
                                                                const std::function<void(size_t, size_t)>& progress);

}  // namespace switchboard::models
