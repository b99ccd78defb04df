// Hugging Face config.json -> ModelConfig, the checks the builder relies on, and the
// RoPE tables the exporter writes next to the weights.
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "file_io.h"
#include "materialize.h"
#include "quantize.h"
#include "switchboard/model.h"
#include "switchboard/tensor.h"

namespace switchboard::models {
namespace {

using Json = nlohmann::json;

constexpr int64_t kMaxLayers = 1024;
// config.json, index and bit-map files are a few KB; anything near this is not one.
constexpr uint64_t kMaxJsonBytes = uint64_t{64} << 20;

// Typed reads of one config key with errors that name the file and the key.
class Reader {
 public:
  Reader(const Json& j, std::string origin) : j_(j), origin_(std::move(origin)) {}

  const Json* find(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  Status error(const char* key, const std::string& what) const {
    return make_error(StatusCode::kInvalidArgument, "%s: %s: %s", origin_.c_str(), key, what.c_str());
  }
  Status integer(const char* key, int64_t* out, bool required = true) const {
    const Json* v = find(key);
    if (!v) return required ? error(key, "missing") : Status::ok();
    if (!v->is_number_integer()) return error(key, "must be an integer, is " + clip(v->dump()));
    *out = v->get<int64_t>();
    return Status::ok();
  }
  Status number(const char* key, double* out, bool required = false) const {
    const Json* v = find(key);
    if (!v) return required ? error(key, "missing") : Status::ok();
    if (!v->is_number()) return error(key, "must be a number, is " + clip(v->dump()));
    *out = v->get<double>();
    return Status::ok();
  }
  Status number(const char* key, float* out) const {
    double d = *out;
    SB_RETURN_IF_ERROR(number(key, &d));
    *out = static_cast<float>(d);
    return Status::ok();
  }
  Status boolean(const char* key, bool* out) const {
    const Json* v = find(key);
    if (!v) return Status::ok();
    if (!v->is_boolean()) return error(key, "must be true or false, is " + clip(v->dump()));
    *out = v->get<bool>();
    return Status::ok();
  }
  Status string(const char* key, std::string* out, bool required = false) const {
    const Json* v = find(key);
    if (!v) return required ? error(key, "missing") : Status::ok();
    if (!v->is_string()) return error(key, "must be a string, is " + clip(v->dump()));
    *out = v->get<std::string>();
    return Status::ok();
  }
  const std::string& origin() const { return origin_; }

 private:
  const Json& j_;
  std::string origin_;
};

Status parse_rope(const Reader& r, int64_t max_pos, ModelConfig* c) {
  // transformers 5 nests the RoPE settings in rope_parameters; 4.x has rope_theta and rope_scaling.
  const Json* nested = r.find("rope_parameters");
  if (!nested) nested = r.find("rope_scaling");
  SB_RETURN_IF_ERROR(r.number("rope_theta", &c->rope_theta));
  SB_RETURN_IF_ERROR(r.number("partial_rotary_factor", &c->partial_rotary));
  if (!nested) return Status::ok();
  if (!nested->is_object()) return r.error("rope_parameters", "must be an object");
  Reader rp(*nested, r.origin() + ": rope_parameters");
  std::string type = "default";
  SB_RETURN_IF_ERROR(rp.string("rope_type", &type));
  if (type == "default" && rp.find("type")) SB_RETURN_IF_ERROR(rp.string("type", &type));
  SB_RETURN_IF_ERROR(rp.number("rope_theta", &c->rope_theta));
  SB_RETURN_IF_ERROR(rp.number("partial_rotary_factor", &c->partial_rotary));
  if (type == "default") return Status::ok();
  if (type != "yarn") return rp.error("rope_type", "'" + clip(type) + "' is not supported (default, yarn)");
  c->yarn = true;
  SB_RETURN_IF_ERROR(rp.number("factor", &c->yarn_factor, true));
  SB_RETURN_IF_ERROR(rp.number("beta_fast", &c->yarn_beta_fast));
  SB_RETURN_IF_ERROR(rp.number("beta_slow", &c->yarn_beta_slow));
  c->yarn_original_max = max_pos;  // HF's default: the unclamped max_position_embeddings
  SB_RETURN_IF_ERROR(rp.integer("original_max_position_embeddings", &c->yarn_original_max, false));
  SB_RETURN_IF_ERROR(rp.boolean("truncate", &c->yarn_truncate));
  double mscale = 0, mscale_all = 0;
  SB_RETURN_IF_ERROR(rp.number("mscale", &mscale));
  SB_RETURN_IF_ERROR(rp.number("mscale_all_dim", &mscale_all));
  auto get_mscale = [&](double m) { return c->yarn_factor <= 1 ? 1.0 : 0.1 * m * std::log(c->yarn_factor) + 1.0; };
  c->yarn_attention_factor = mscale != 0 && mscale_all != 0 ? get_mscale(mscale) / get_mscale(mscale_all) : get_mscale(1);
  SB_RETURN_IF_ERROR(rp.number("attention_factor", &c->yarn_attention_factor));
  return Status::ok();
}

Status parse_activation(const Reader& r, ModelConfig* c) {
  std::string act = "silu";
  SB_RETURN_IF_ERROR(r.string("hidden_act", &act));
  if (act == "silu" || act == "swish") c->activation = GluKind::kSwiGLU;
  else if (act == "gelu_pytorch_tanh" || act == "gelu_new" || act == "gelu_tanh") c->activation = GluKind::kGEGLU;
  else return r.error("hidden_act", "'" + clip(act) + "' is not supported (silu, gelu_pytorch_tanh)");
  return Status::ok();
}

// Which layers route to experts: qwen's decoder_sparse_step / mlp_only_layers, or
// DeepSeek's first_k_dense_replace.
Status parse_moe_layers(const Reader& r, ModelConfig* c) {
  int64_t step = 1, first_dense = 0;
  SB_RETURN_IF_ERROR(r.integer("decoder_sparse_step", &step, false));
  SB_RETURN_IF_ERROR(r.integer("first_k_dense_replace", &first_dense, false));
  if (step < 1) return r.error("decoder_sparse_step", "must be >= 1");
  c->moe_layer.assign(static_cast<size_t>(std::max<int64_t>(c->layers, 0)), true);
  for (int64_t i = 0; i < c->layers; ++i) c->moe_layer[static_cast<size_t>(i)] = (i + 1) % step == 0 && i >= first_dense;
  if (const Json* only = r.find("mlp_only_layers")) {
    if (!only->is_array()) return r.error("mlp_only_layers", "must be a list of layer indices");
    for (const Json& v : *only) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= c->layers)
        return r.error("mlp_only_layers", "entry " + clip(v.dump()) + " is not a layer index");
      c->moe_layer[v.get<size_t>()] = false;
    }
  }
  return Status::ok();
}

// Qwen3-Next / Qwen3.5: which layers are linear attention (layer_types, else every
// full_attention_interval-th layer is full attention), the Gated DeltaNet sizes, the gated
// attention output, zero-centred norms and the sigmoid-gated shared expert.
Status parse_hybrid(const Reader& r, ModelConfig* c) {
  c->qk_norm = QkNorm::kPerHead;
  c->attn_output_gate = c->norm_plus_one = true;
  c->lin_grouped = c->family == "qwen3_next";
  if (c->family != "qwen3_next") c->renormalize = true;  // Qwen3.5's router always renormalizes
  SB_RETURN_IF_ERROR(r.integer("shared_expert_intermediate_size", &c->shared_ffn, false));
  c->shared_gate = c->shared_ffn > 0;
  SB_RETURN_IF_ERROR(r.integer("linear_num_key_heads", &c->lin_k_heads));
  SB_RETURN_IF_ERROR(r.integer("linear_num_value_heads", &c->lin_v_heads));
  SB_RETURN_IF_ERROR(r.integer("linear_key_head_dim", &c->lin_k_dim));
  SB_RETURN_IF_ERROR(r.integer("linear_value_head_dim", &c->lin_v_dim));
  SB_RETURN_IF_ERROR(r.integer("linear_conv_kernel_dim", &c->lin_conv));
  if (c->lin_k_heads <= 0 || c->lin_k_heads > 1024 || c->lin_v_heads <= 0 || c->lin_v_heads > 1024 ||
      c->lin_v_heads % c->lin_k_heads != 0)
    return r.error("linear_num_value_heads",
                   strformat("%lld must be a positive multiple of linear_num_key_heads (%lld)",
                             (long long)c->lin_v_heads, (long long)c->lin_k_heads));
  if (c->lin_k_dim <= 0 || c->lin_k_dim > 1024) return r.error("linear_key_head_dim", "must lie in [1, 1024]");
  if (c->lin_v_dim <= 0 || c->lin_v_dim > 1024) return r.error("linear_value_head_dim", "must lie in [1, 1024]");
  if (c->lin_conv < 1 || c->lin_conv > 64)
    return r.error("linear_conv_kernel_dim", strformat("%lld is outside [1, 64]", (long long)c->lin_conv));
  int64_t interval = 4;
  SB_RETURN_IF_ERROR(r.integer("full_attention_interval", &interval, false));
  if (interval < 1) return r.error("full_attention_interval", "must be >= 1");
  c->linear_layer.assign(static_cast<size_t>(c->layers), false);
  for (int64_t i = 0; i < c->layers; ++i) c->linear_layer[static_cast<size_t>(i)] = (i + 1) % interval != 0;
  if (const Json* types = r.find("layer_types")) {
    if (!types->is_array() || static_cast<int64_t>(types->size()) != c->layers)
      return r.error("layer_types", strformat("must list one type per layer (%lld), has %s", (long long)c->layers,
                                              types->is_array() ? std::to_string(types->size()).c_str() : "no list"));
    for (size_t i = 0; i < types->size(); ++i) {
      const Json& t = (*types)[i];
      if (t != "linear_attention" && t != "full_attention")
        return r.error("layer_types",
                       strformat("entry %zu is %s (linear_attention, full_attention)", i, clip(t.dump()).c_str()));
      c->linear_layer[i] = t == "linear_attention";
    }
  }
  return Status::ok();
}

Status parse_family(const Reader& r, ModelConfig* c) {
  const std::string& f = c->family;
  bool attention_bias = false;
  SB_RETURN_IF_ERROR(r.boolean("attention_bias", &attention_bias));
  SB_RETURN_IF_ERROR(r.boolean("norm_topk_prob", &c->renormalize));
  if (f == "qwen3_moe") {
    c->qk_norm = QkNorm::kPerHead;
    c->qkv_bias = attention_bias;
  } else if (f == "qwen2_moe") {
    c->qkv_bias = true;
    SB_RETURN_IF_ERROR(r.boolean("qkv_bias", &c->qkv_bias));
    SB_RETURN_IF_ERROR(r.integer("shared_expert_intermediate_size", &c->shared_ffn, false));
    c->shared_gate = c->shared_ffn > 0;
    bool sliding = false;
    SB_RETURN_IF_ERROR(r.boolean("use_sliding_window", &sliding));
    if (sliding) return r.error("use_sliding_window", "true is not supported");
  } else if (f == "mixtral") {
    c->renormalize = true;  // top-k, then softmax over the chosen: a renormalized softmax
    int64_t window = 0;
    SB_RETURN_IF_ERROR(r.integer("sliding_window", &window, false));
    c->sliding_window.assign(static_cast<size_t>(c->layers), window);
  } else if (f == "olmoe") {
    c->qk_norm = QkNorm::kWhole;
    c->qkv_bias = attention_bias;
    if (r.find("clip_qkv")) return r.error("clip_qkv", "is not supported (only null)");
  } else if (f == "glm4_moe") {
    c->qkv_bias = attention_bias;
    bool qk = false;
    SB_RETURN_IF_ERROR(r.boolean("use_qk_norm", &qk));
    if (qk) c->qk_norm = QkNorm::kPerHead;
    c->router = RouterKind::kSigmoidGroupedTopK;
    c->selection_bias = true;
    int64_t n_group = 1, topk_group = 1, n_shared = 0;
    SB_RETURN_IF_ERROR(r.integer("n_group", &n_group, false));
    SB_RETURN_IF_ERROR(r.integer("topk_group", &topk_group, false));
    SB_RETURN_IF_ERROR(r.number("routed_scaling_factor", &c->routed_scaling_factor));
    SB_RETURN_IF_ERROR(r.integer("n_shared_experts", &n_shared, false));
    if (n_group < 1 || n_group > 4096) return r.error("n_group", strformat("%lld is outside [1, 4096]", (long long)n_group));
    if (topk_group < 1 || topk_group > n_group)
      return r.error("topk_group", strformat("%lld is outside [1, n_group]", (long long)topk_group));
    if (n_shared < 0 || n_shared > 64) return r.error("n_shared_experts", strformat("%lld is outside [0, 64]", (long long)n_shared));
    if (c->expert_ffn < 0 || c->expert_ffn > (int64_t{1} << 18))
      return r.error("moe_intermediate_size", strformat("%lld is outside [0, 2^18]", (long long)c->expert_ffn));
    c->n_group = static_cast<int>(n_group);
    c->topk_group = static_cast<int>(topk_group);
    c->shared_ffn = n_shared * c->expert_ffn;
  } else if (f == "gpt_oss") {
    c->qkv_bias = c->o_bias = true;
    c->attn_sinks = true;
    c->router = RouterKind::kTopKSoftmax;
    c->router_bias = c->expert_bias = true;
    c->activation = GluKind::kClampedSwiGLU;
    SB_RETURN_IF_ERROR(r.number("swiglu_limit", &c->glu_limit));
    int64_t window = 0;
    SB_RETURN_IF_ERROR(r.integer("sliding_window", &window, false));
    c->sliding_window.assign(static_cast<size_t>(c->layers), 0);
    if (const Json* types = r.find("layer_types")) {
      if (!types->is_array() || static_cast<int64_t>(types->size()) != c->layers)
        return r.error("layer_types", "must list one type per layer");
      for (size_t i = 0; i < types->size(); ++i)
        if ((*types)[i] == "sliding_attention") c->sliding_window[i] = window;
    }
  } else if (f == "qwen3_next" || f == "qwen3_5_moe_text") {
    SB_RETURN_IF_ERROR(parse_hybrid(r, c));
  } else if (f == "deepseek_v3" || f == "deepseek_v2") {
    return r.error("model_type", "'" + clip(f) +
                                     "': multi-head latent attention is not supported (its router is: see glm4_moe)");
  } else {
    return r.error("model_type", "'" + clip(f) +
                                     "' is not supported (qwen3_moe, qwen2_moe, mixtral, olmoe, glm4_moe, gpt_oss, "
                                     "qwen3_next, qwen3_5_moe)");
  }
  return Status::ok();
}

}  // namespace

Result<ModelConfig> parse_hf_config_text(const std::string& text, const std::string& origin) {
  SB_RETURN_IF_ERROR(check_json_depth(text, kMaxJsonDepth, origin));
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return make_error(StatusCode::kInvalidArgument, "%s: not a JSON object", origin.c_str());
  Reader top(j, origin);
  ModelConfig c;
  c.origin = origin;
  SB_RETURN_IF_ERROR(top.string("model_type", &c.family, true));
  // Qwen3.5's checkpoints wrap the text model (model.language_model.*) beside a vision model.
  const Json* nested = c.family == "qwen3_5_moe" ? top.find("text_config") : nullptr;
  if (c.family == "qwen3_5_moe" && (!nested || !nested->is_object())) return top.error("text_config", "missing");
  Reader r(nested ? *nested : j, nested ? origin + ": text_config" : origin);
  if (nested) {
    c.family = "qwen3_5_moe_text";
    c.weight_prefix = "model.language_model.";
  }
  SB_RETURN_IF_ERROR(r.integer("vocab_size", &c.vocab));
  SB_RETURN_IF_ERROR(r.integer("hidden_size", &c.hidden));
  SB_RETURN_IF_ERROR(r.integer("num_hidden_layers", &c.layers));
  if (c.layers <= 0 || c.layers > kMaxLayers)  // before any per-layer table is sized by it
    return r.error("num_hidden_layers", strformat("%lld is outside [1, %lld]", (long long)c.layers, (long long)kMaxLayers));
  SB_RETURN_IF_ERROR(r.integer("num_attention_heads", &c.heads));
  c.kv_heads = c.heads;
  SB_RETURN_IF_ERROR(r.integer("num_key_value_heads", &c.kv_heads, false));
  c.head_dim = c.heads > 0 ? c.hidden / c.heads : 0;
  SB_RETURN_IF_ERROR(r.integer("head_dim", &c.head_dim, false));
  SB_RETURN_IF_ERROR(r.number("rms_norm_eps", &c.rms_eps));
  int64_t max_pos = 4096;
  SB_RETURN_IF_ERROR(r.integer("max_position_embeddings", &max_pos, false));
  c.max_seq = std::min<int64_t>(max_pos, 4096);
  SB_RETURN_IF_ERROR(top.boolean("tie_word_embeddings", &c.tie_embeddings));
  if (nested) SB_RETURN_IF_ERROR(r.boolean("tie_word_embeddings", &c.tie_embeddings));
  for (const char* key : {"num_experts", "num_local_experts", "n_routed_experts"})
    SB_RETURN_IF_ERROR(r.integer(key, &c.experts, false));
  SB_RETURN_IF_ERROR(r.integer("num_experts_per_tok", &c.top_k, false));
  SB_RETURN_IF_ERROR(r.integer("intermediate_size", &c.dense_ffn, false));
  c.expert_ffn = c.dense_ffn;
  SB_RETURN_IF_ERROR(r.integer("moe_intermediate_size", &c.expert_ffn, false));
  SB_RETURN_IF_ERROR(parse_rope(r, max_pos, &c));
  SB_RETURN_IF_ERROR(parse_activation(r, &c));
  SB_RETURN_IF_ERROR(parse_moe_layers(r, &c));
  SB_RETURN_IF_ERROR(parse_family(r, &c));
  if (const Json* q = top.find("quantization")) {  // mlx-lm's: {"group_size": G, "bits": B, per-path overrides}
    if (!q->is_object()) return r.error("quantization", "must be an object");
    Reader rq(*q, origin + ": quantization");  // mlx-lm writes it beside text_config
    int64_t bits = 0, gs = 0;
    SB_RETURN_IF_ERROR(rq.integer("bits", &bits));
    SB_RETURN_IF_ERROR(rq.integer("group_size", &gs));
    if (bits < 0 || bits > 64 || gs < 0 || gs > 4096 || !quant_bits_allowed(static_cast<int>(bits)) ||
        !quant_group_allowed(static_cast<int>(gs)))
      return rq.error("bits", strformat("%lld-bit groups of %lld are not supported", (long long)bits, (long long)gs));
    c.mlx_quantized = true;
    c.mlx_bits = static_cast<int>(bits);
    c.mlx_group_size = static_cast<int>(gs);
  }
  if (c.experts <= 0) return r.error("num_experts", "missing or not positive (this is not an MoE model)");
  SB_RETURN_IF_ERROR(check_config(c));
  return c;
}

Result<ModelConfig> parse_hf_config(const std::string& path) {
  SB_ASSIGN_OR_RETURN(std::string text, read_text_file(path, kMaxJsonBytes, "config"));
  return parse_hf_config_text(text, path);
}

Status check_config(const ModelConfig& c) {
  auto bad = [&](const char* what, int64_t v) {
    return make_error(StatusCode::kInvalidArgument, "%s: %s (%lld)", c.origin.empty() ? "model config" : c.origin.c_str(),
                      what, (long long)v);
  };
  // Bounds far above any released model, so hostile sizes fail here instead of in an allocation.
  if (c.layers > kMaxLayers) return bad("num_hidden_layers is too large", c.layers);
  if (c.vocab > (int64_t{1} << 22) || c.hidden > (int64_t{1} << 16) || c.heads > 1024 || c.head_dim > 1024 ||
      c.experts > 4096 || c.expert_ffn > (int64_t{1} << 18) || c.dense_ffn > (int64_t{1} << 18) ||
      c.shared_ffn > (int64_t{1} << 18))
    return bad("a size exceeds the supported bounds (vocab 2^22, hidden 2^16, heads 1024, head_dim 1024, "
               "experts 4096, ffn 2^18)", 0);
  if (c.shared_ffn < 0 || c.dense_ffn < 0 || c.expert_ffn < 0) return bad("an FFN size is negative", 0);
  if (c.vocab <= 0) return bad("vocab_size must be positive", c.vocab);
  if (c.hidden <= 0) return bad("hidden_size must be positive", c.hidden);
  if (c.layers <= 0) return bad("num_hidden_layers must be positive", c.layers);
  if (c.heads <= 0 || c.kv_heads <= 0 || c.heads % c.kv_heads != 0)
    return bad("num_attention_heads must be a positive multiple of num_key_value_heads", c.heads);
  if (c.head_dim <= 0 || c.head_dim % 2 != 0) return bad("head_dim must be positive and even", c.head_dim);
  if (!(c.partial_rotary > 0.0 && c.partial_rotary <= 1.0) || c.rotary_dims() <= 0)
    return bad("partial_rotary_factor must lie in (0, 1] and leave rotary dims", 0);
  if (!(c.rope_theta > 1.0 && c.rope_theta < 1e30)) return bad("rope_theta must be a finite number > 1", 0);
  if (!(c.rms_eps >= 0.0f && c.rms_eps < 1.0f)) return bad("rms_norm_eps must lie in [0, 1)", 0);
  if (c.yarn && !(c.yarn_factor > 0 && c.yarn_factor < 1e6 && c.yarn_beta_fast > 0 && c.yarn_beta_slow > 0 &&
                  c.yarn_original_max > 0 && c.yarn_attention_factor > 0 && c.yarn_attention_factor < 1e6))
    return bad("YaRN factor, betas, original_max_position_embeddings and attention_factor must be positive", 0);
  if (c.max_seq <= 0 || c.max_seq > (int64_t{1} << 24)) return bad("max_seq must be in [1, 2^24]", c.max_seq);
  if (static_cast<int64_t>(c.moe_layer.size()) != c.layers) return bad("moe_layer needs one entry per layer", c.layers);
  if (!c.sliding_window.empty() && static_cast<int64_t>(c.sliding_window.size()) != c.layers)
    return bad("sliding_window needs one entry per layer", c.layers);
  if (!c.linear_layer.empty()) {
    if (static_cast<int64_t>(c.linear_layer.size()) != c.layers)
      return bad("layer_types needs one entry per layer", c.layers);
    if (c.lin_k_heads <= 0 || c.lin_v_heads <= 0 || c.lin_v_heads % c.lin_k_heads != 0 || c.lin_k_heads > 1024 ||
        c.lin_v_heads > 1024)
      return bad("linear_num_value_heads must be a positive multiple of linear_num_key_heads", c.lin_v_heads);
    if (c.lin_k_dim <= 0 || c.lin_v_dim <= 0 || c.lin_k_dim > 1024 || c.lin_v_dim > 1024)
      return bad("linear key and value head dims must lie in [1, 1024]", c.lin_k_dim);
    if (c.lin_conv < 1 || c.lin_conv > 64) return bad("linear_conv_kernel_dim must lie in [1, 64]", c.lin_conv);
  }
  bool any_moe = false, any_dense = false;
  for (bool m : c.moe_layer) (m ? any_moe : any_dense) = true;
  if (any_moe && (c.experts <= 0 || c.top_k <= 0 || c.top_k > c.experts))
    return bad("num_experts_per_tok must be in [1, num_experts]", c.top_k);
  if (any_moe && c.expert_ffn <= 0) return bad("moe_intermediate_size must be positive", c.expert_ffn);
  if (any_dense && c.dense_ffn <= 0) return bad("intermediate_size must be positive for dense layers", c.dense_ffn);
  if (c.router == RouterKind::kSigmoidGroupedTopK &&
      (c.n_group < 1 || c.experts % c.n_group != 0 || c.topk_group < 1 || c.topk_group > c.n_group))
    return bad("n_group must divide the experts and topk_group lie in [1, n_group]", c.n_group);
  return Status::ok();
}

int64_t input_width(const ModelConfig& c, const std::string& linear) {
  auto ends = [&](const char* x) { return ends_with(linear, x); };
  if (ends("attn.o")) return c.heads * c.head_dim;
  if (ends("lin.out")) return c.lin_v_heads * c.lin_v_dim;
  if (!ends(".down")) return c.hidden;
  return linear.find(".experts.") != std::string::npos ? c.expert_ffn
         : linear.find(".shared.") != std::string::npos ? c.shared_ffn
                                                        : c.dense_ffn;
}

Status check_format(const ModelConfig& c, const ExportFormat& f) {
  if (!dtype_is_float(f.dtype))
    return make_error(StatusCode::kInvalidArgument, "--dtype %s: must be f32, f16 or bf16", dtype_name(f.dtype));
  if (!f.quantized()) {
    if (!f.expert_bits.empty()) return make_error(StatusCode::kInvalidArgument, "a bit map needs --bits");
    return Status::ok();
  }
  // Errors name what set the value: the flag, or the config's "quantization" entry.
  const std::string bits_name = f.quant_origin.empty() ? "--bits" : f.quant_origin + ": quantization.bits";
  const std::string group_name =
      f.quant_origin.empty() ? "--group-size" : f.quant_origin + ": quantization.group_size";
  if (!quant_bits_allowed(f.bits))
    return make_error(StatusCode::kInvalidArgument, "%s %d: allowed are 2, 3, 4, 5, 6, 8", bits_name.c_str(), f.bits);
  if (!quant_group_allowed(f.group_size))
    return make_error(StatusCode::kInvalidArgument, "%s %d: allowed are 32, 64, 128", group_name.c_str(),
                      f.group_size);
  for (int64_t k :
       {c.hidden, c.heads * c.head_dim, c.expert_ffn, c.dense_ffn, c.shared_ffn, c.lin_v_heads * c.lin_v_dim})
    if (k > 0 && k % f.group_size != 0)
      return make_error(StatusCode::kInvalidArgument, "%s %d does not divide the input width %lld",
                        group_name.c_str(), f.group_size, (long long)k);
  for (const auto& [linear, q] : f.linear_quant) {
    const int64_t k = input_width(c, linear);
    if (q.first != 0 && (!quant_bits_allowed(q.first) || !quant_group_allowed(q.second) || k % q.second != 0))
      return make_error(StatusCode::kInvalidArgument, "%s: %d-bit groups of %d do not fit its input width %lld",
                        linear.c_str(), q.first, q.second, (long long)k);
  }
  for (const auto& [layer, experts] : f.expert_bits) {
    if (layer < 0 || layer >= c.layers)
      return make_error(StatusCode::kInvalidArgument, "bit map: layer %lld does not exist (the model has %lld)",
                        (long long)layer, (long long)c.layers);
    if (!c.moe_layer[static_cast<size_t>(layer)])
      return make_error(StatusCode::kInvalidArgument, "bit map: layer %lld has no experts (a dense layer)",
                        (long long)layer);
    int live = 0;
    for (const auto& [expert, bits] : experts) {
      if (expert < 0 || expert >= c.experts)
        return make_error(StatusCode::kInvalidArgument, "bit map: layer %lld expert %lld does not exist (%lld experts)",
                          (long long)layer, (long long)expert, (long long)c.experts);
      if (bits != 0 && !quant_bits_allowed(bits))
        return make_error(StatusCode::kInvalidArgument, "bit map: layer %lld expert %lld: bits %d not allowed",
                          (long long)layer, (long long)expert, bits);
    }
    for (int64_t e = 0; e < c.experts; ++e) {
      auto it = experts.find(e);
      live += (it == experts.end() ? f.bits : it->second) != 0;
    }
    if (live < c.top_k)
      return make_error(StatusCode::kInvalidArgument, "bit map: layer %lld keeps %d experts, fewer than top-k %lld",
                        (long long)layer, live, (long long)c.top_k);
  }
  return Status::ok();
}

Result<std::vector<std::pair<std::string, Tensor>>> rope_tables(const ModelConfig& c) {
  const int64_t dim = c.rotary_dims(), half = dim / 2;
  // HF: inv_freq = 1 / base^(2i / dim) in f32; YaRN blends interpolated and extrapolated frequencies.
  std::vector<float> inv(static_cast<size_t>(half));
  double low = 0, high = 0;
  if (c.yarn) {
    auto corr = [&](double rot) {
      return dim * std::log(static_cast<double>(c.yarn_original_max) / (rot * 2 * M_PI)) / (2 * std::log(c.rope_theta));
    };
    low = corr(c.yarn_beta_fast);
    high = corr(c.yarn_beta_slow);
    if (c.yarn_truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(dim - 1));
    if (low == high) high += 0.001;
  }
  for (int64_t i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(dim);
    const float p = static_cast<float>(std::pow(c.rope_theta, static_cast<double>(e)));
    float f = 1.0f / p;
    if (c.yarn) {
      const float interp = 1.0f / (static_cast<float>(c.yarn_factor) * p);
      const float ramp = static_cast<float>(std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0));
      const float extrap_w = 1.0f - ramp;
      f = interp * (1.0f - extrap_w) + f * extrap_w;
    }
    inv[static_cast<size_t>(i)] = f;
  }
  SB_ASSIGN_OR_RETURN(Tensor cos, Tensor::zeros(DType::kF32, {c.max_seq, half}));
  SB_ASSIGN_OR_RETURN(Tensor sin, Tensor::zeros(DType::kF32, {c.max_seq, half}));
  const float scale = c.yarn ? static_cast<float>(c.yarn_attention_factor) : 1.0f;
  for (int64_t p = 0; p < c.max_seq; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const float freq = inv[static_cast<size_t>(i)] * static_cast<float>(p);
      cos.mutable_data_as<float>()[p * half + i] = static_cast<float>(std::cos(static_cast<double>(freq))) * scale;
      sin.mutable_data_as<float>()[p * half + i] = static_cast<float>(std::sin(static_cast<double>(freq))) * scale;
    }
  }
  return std::vector<std::pair<std::string, Tensor>>{{"rope.cos", cos}, {"rope.sin", sin}};
}

}  // namespace switchboard::models
