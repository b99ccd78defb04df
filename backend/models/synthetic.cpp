// Models made without a checkpoint: the tiny test model (random floats through the normal
// conversion path) and benchmark-scale shapes (random codes written directly, since
// quantizing billions of random floats would take far longer than the benchmark).
#include <cmath>
#include <cstring>
#include <random>

#include "materialize.h"

namespace switchboard::models {
ModelConfig tiny_test_config() {
  ModelConfig c;
  c.family = "qwen2_moe";
  c.vocab = 256;
  c.hidden = 128;
  c.layers = 4;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 32;
  c.max_seq = 512;
  c.qk_norm = QkNorm::kPerHead;
  c.moe_layer.assign(4, true);
  c.experts = 8;
  c.top_k = 2;
  c.expert_ffn = 128;
  c.renormalize = true;
  c.shared_ffn = 128;
  c.shared_gate = true;
  return c;
}

// The Qwen3.5 hybrid's settings on top of a config's sizes.
void make_hybrid(ModelConfig& c, int64_t k_heads, int64_t v_heads, int64_t head, int64_t interval) {
  c.family = "qwen3_5_moe_text";
  c.qk_norm = QkNorm::kPerHead;
  c.attn_output_gate = c.norm_plus_one = true;
  c.partial_rotary = 0.25;
  c.renormalize = true;
  c.shared_gate = true;
  c.lin_k_heads = k_heads;
  c.lin_v_heads = v_heads;
  c.lin_k_dim = c.lin_v_dim = head;
  c.lin_conv = 4;
  c.linear_layer.assign(static_cast<size_t>(c.layers), false);
  for (int64_t i = 0; i < c.layers; ++i) c.linear_layer[static_cast<size_t>(i)] = (i + 1) % interval != 0;
}

Result<ModelConfig> tiny_test_config(const std::string& family) {
  if (family.empty() || family == "qwen2_moe") return tiny_test_config();
  if (family != "qwen3_5_moe")
    return make_error(StatusCode::kInvalidArgument, "--tiny-test %s: known are qwen2_moe (the default), qwen3_5_moe",
                      family.c_str());
  ModelConfig c = tiny_test_config();
  c.head_dim = 32;
  c.expert_ffn = 64;
  c.shared_ffn = 64;
  c.sort_cutoff = 3;  // the seed's gate: a 4-token prompt sorts, decode steps do not
  make_hybrid(c, 2, 4, 32, 4);
  return c;
}

Result<ModelConfig> synthetic_config(const std::string& shape) {
  if (shape == "qwen3.5-35b-a3b") {
    ModelConfig c;  // Qwen3.5-35B-A3B's text_config
    c.vocab = 248320;
    c.hidden = 2048;
    c.layers = 40;
    c.heads = 16;
    c.kv_heads = 2;
    c.head_dim = 256;
    c.rope_theta = 10000000.0;
    c.moe_layer.assign(40, true);
    c.experts = 256;
    c.top_k = 8;
    c.expert_ffn = 512;
    c.shared_ffn = 512;
    c.max_seq = 1024;
    make_hybrid(c, 16, 32, 128, 4);
    return c;
  }
  if (shape != "qwen3-30b-a3b")
    return make_error(StatusCode::kInvalidArgument, "synthetic model '%s': known are qwen3-30b-a3b, qwen3.5-35b-a3b",
                      shape.c_str());
  ModelConfig c;  // Qwen3-30B-A3B's config.json
  c.family = "qwen3_moe";
  c.vocab = 151936;
  c.hidden = 2048;
  c.layers = 48;
  c.heads = 32;
  c.kv_heads = 4;
  c.head_dim = 128;
  c.rope_theta = 1000000.0;
  c.qk_norm = QkNorm::kPerHead;
  c.moe_layer.assign(48, true);
  c.experts = 128;
  c.top_k = 8;
  c.expert_ffn = 768;
  c.renormalize = true;
  c.max_seq = 1024;
  return c;
}

Status random_weights(const ModelConfig& c, const ExportFormat& f, uint64_t seed, const WeightSink& sink) {
  std::mt19937_64 rng(seed);
  Fetch fetch = [&](const std::string& logical, const Shape& shape) -> Result<Tensor> {
    SB_ASSIGN_OR_RETURN(Tensor t, Tensor::uninitialized(DType::kF32, shape));
    const bool vector = shape.size() == 1, norm = ends_with(logical, "norm");
    const double scale = logical == "embed" ? 1.0 : vector ? 0.2 : 1.0 / std::sqrt(static_cast<double>(shape.back()));
    std::normal_distribution<float> dist(0.f, static_cast<float>(scale));
    for (int64_t i = 0; i < t.numel(); ++i) t.mutable_data_as<float>()[i] = (norm ? 1.0f : 0.0f) + dist(rng);
    return t;
  };
  return materialize(c, f, fetch, nullptr, sink);
}

Result<std::vector<std::pair<std::string, Tensor>>> random_weights(const ModelConfig& c, const ExportFormat& f,
                                                                  uint64_t seed) {
  return collect_weights([&](const WeightSink& sink) { return random_weights(c, f, seed, sink); });
}

Status synthetic_weights(const ModelConfig& c, const ExportFormat& f, uint64_t seed,
                         const std::function<void(size_t, size_t)>& progress, const WeightSink& sink) {
  const std::vector<WeightSpec> specs = weight_specs(c, f);
  SB_ASSIGN_OR_RETURN(auto rope, rope_tables(c));
  for (const auto& [name, t] : rope) SB_RETURN_IF_ERROR(sink(name, t));
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&] { return x ^= x << 13, x ^= x >> 7, x ^= x << 17; };
  for (size_t i = 0; i < specs.size(); ++i) {
    const WeightSpec& s = specs[i];
    if (progress) progress(i, specs.size());
    if (s.name.rfind("rope.", 0) == 0) continue;
    SB_ASSIGN_OR_RETURN(Tensor t, Tensor::uninitialized(s.dtype, s.shape));
    const int64_t n = t.numel();
    if (s.dtype == DType::kU32) {  // codes: uniform random bits
      auto* p = t.mutable_data_as<uint32_t>();
      for (int64_t j = 0; j < n; ++j) p[j] = static_cast<uint32_t>(next() >> 17);
    } else {
      // Scales about 0.25/sqrt(K) with biases centring the codes (weights of std ~1/sqrt(K));
      // floats: norms 1, the rest small.
      const bool scales = ends_with(s.name, ".scales"), biases = ends_with(s.name, ".biases");
      const auto [width, gs] = f.quant_of(s.name.substr(0, s.name.rfind('.')));
      const double k = static_cast<double>(scales || biases ? s.shape.back() * gs : s.shape.back());
      const double mid = (std::ldexp(1.0, width) - 1) / 2;
      for (int64_t j = 0; j < n; ++j) {
        const double u = static_cast<double>(next() >> 11) * 0x1.0p-53;
        const double sc = 0.25 / std::sqrt(k) * (0.75 + 0.5 * u);
        double v = scales ? sc : biases ? -mid * sc : ends_with(s.name, "norm") ? 1.0 : (u - 0.5) * 0.2;
        const float fv = static_cast<float>(v);
        if (s.dtype == DType::kF32) t.mutable_data_as<float>()[j] = fv;
        else t.mutable_data_as<uint16_t>()[j] = s.dtype == DType::kF16 ? f32_to_f16(fv) : f32_to_bf16(fv);
      }
    }
    SB_RETURN_IF_ERROR(sink(s.name, t));
  }
  if (progress) progress(specs.size(), specs.size());
  return Status::ok();
}

}  // namespace switchboard::models
