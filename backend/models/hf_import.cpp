// Hugging Face checkpoints -> our weight names, kept in float or quantized at export;
// the random weights of the tiny and synthetic models take the same conversion path.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <sstream>

#include "element_access.h"
#include "file_io.h"
#include "log.h"
#include "materialize.h"
#include "no_throw.h"
#include "quantize.h"
#include "safetensors.h"
#include "switchboard/model.h"
#include "switchboard/switchboard.h"

namespace switchboard::models {
namespace {

namespace fs = std::filesystem;

Result<Tensor> to_dtype(const Tensor& f32, DType t) {
  if (t == DType::kF32) return f32;
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(t, f32.shape()));
  const float* src = f32.data_as<float>();
  auto* dst = out.mutable_data_as<uint16_t>();
  for (int64_t i = 0; i < f32.numel(); ++i) dst[i] = t == DType::kF16 ? f32_to_f16(src[i]) : f32_to_bf16(src[i]);
  return out;
}

Result<Tensor> widen(const Tensor& t) {
  if (!dtype_is_float(t.dtype()))
    return make_error(StatusCode::kInvalidArgument, "dtype %s is not a float", dtype_name(t.dtype()));
  return Tensor::from_vector(DType::kF32, t.shape(), ops::widen_f32(t));
}

std::string strip(const std::string& s, const char* suffix) { return s.substr(0, s.size() - std::strlen(suffix)); }

// Quantizes x [rows.., K] (f32) per expert with its width; pruned experts get no codes.
Status quantize_into(const Tensor& x, int64_t experts, int width, int group_size, const std::vector<uint8_t>& bits,
                     const ExportFormat& f, const WeightSpec& wspec, std::vector<std::pair<std::string, Tensor>>* out) {
  const std::string base = strip(wspec.name, ".weight");
  const int64_t k = x.dim(x.rank() - 1), n = x.numel() / k / experts;
  if (bits.empty()) {
    SB_ASSIGN_OR_RETURN(Tensor rows, x.reshaped({experts * n, k}));
    SB_ASSIGN_OR_RETURN(QuantizedRows q, affine_quantize(rows, width, group_size, f.scale_dtype));
    SB_ASSIGN_OR_RETURN(Tensor w, q.w.reshaped(wspec.shape));
    SB_ASSIGN_OR_RETURN(Tensor s, q.scales.reshaped({experts, n, k / group_size}));
    SB_ASSIGN_OR_RETURN(Tensor b, q.biases.reshaped({experts, n, k / group_size}));
    out->emplace_back(wspec.name, w);
    out->emplace_back(base + ".scales", s);
    out->emplace_back(base + ".biases", b);
    return Status::ok();
  }
  SB_ASSIGN_OR_RETURN(Tensor w, Tensor::zeros(DType::kU32, wspec.shape));
  SB_ASSIGN_OR_RETURN(Tensor s, Tensor::zeros(f.scale_dtype, {experts, n, k / group_size}));
  SB_ASSIGN_OR_RETURN(Tensor b, Tensor::zeros(f.scale_dtype, {experts, n, k / group_size}));
  int64_t word = 0;
  const size_t per_expert_groups = static_cast<size_t>(n * k / group_size) * dtype_size(f.scale_dtype);
  for (int64_t e = 0; e < experts; ++e) {
    if (bits[static_cast<size_t>(e)] == 0) continue;
    Tensor rows = Tensor::wrap(DType::kF32, {n, k}, nullptr, x.data_as<float>() + e * n * k);
    SB_ASSIGN_OR_RETURN(QuantizedRows q, affine_quantize(rows, bits[static_cast<size_t>(e)], group_size, f.scale_dtype));
    std::memcpy(w.mutable_data_as<uint32_t>() + word, q.w.data(), q.w.nbytes());
    word += q.w.numel();
    std::memcpy(static_cast<uint8_t*>(s.mutable_data()) + e * per_expert_groups, q.scales.data(), per_expert_groups);
    std::memcpy(static_cast<uint8_t*>(b.mutable_data()) + e * per_expert_groups, q.biases.data(), per_expert_groups);
  }
  out->emplace_back(wspec.name, w);
  out->emplace_back(base + ".scales", s);
  out->emplace_back(base + ".biases", b);
  return Status::ok();
}

}  // namespace

Status materialize(const ModelConfig& c, const ExportFormat& f, const Fetch& separate_fetch,
                   const std::function<void(size_t, size_t)>& progress, const WeightSink& sink, const RawFetch& raw) {
  const std::vector<WeightSpec> specs = weight_specs(c, f);
  const Fetch fetch = fused_qkv_fetch(c, separate_fetch);
  SB_ASSIGN_OR_RETURN(auto out, rope_tables(c));
  std::set<std::string> made;
  // Each constant goes to the sink as soon as it is made and is released here, so memory
  // holds one logical weight (and its packed form) at a time.
  auto drain = [&]() -> Status {
    for (const auto& [name, t] : out) {
      made.insert(name);
      SB_RETURN_IF_ERROR(sink(name, t));
    }
    out.clear();
    return Status::ok();
  };
  SB_RETURN_IF_ERROR(drain());
  for (size_t i = 0; i < specs.size(); ++i) {
    const WeightSpec& s = specs[i];
    if (progress) progress(i, specs.size());
    SB_RETURN_IF_ERROR(drain());
    if (made.count(s.name)) continue;
    if (s.dtype == DType::kU32) {  // codes: the logical weight is [E, N, K] or [N, K]
      const std::string base = strip(s.name, ".weight");
      const WeightSpec* scales = &specs[i + 1];  // declared right after the codes
      const auto [width, gs] = f.quant_of(base);
      const int64_t e = scales->shape[0], n = scales->shape[1], k = scales->shape[2] * gs;
      const bool expert = base.find(".experts.") != std::string::npos;
      std::vector<uint8_t> bits;
      if (expert) bits = layer_expert_bits(c, f, std::stoll(base.substr(7)));
      bool taken = false;
      if (raw && bits.empty()) {
        SB_ASSIGN_OR_RETURN(taken, fused_qkv_raw(c, raw, base, s, *scales, &out));
      }
      if (!taken) {
        SB_ASSIGN_OR_RETURN(Tensor x, fetch(base, expert ? Shape{e, n, k} : Shape{n, k}));
        SB_RETURN_IF_ERROR(quantize_into(x, e, width, gs, bits, f, s, &out));
      }
      made.insert(base + ".scales");
      made.insert(base + ".biases");
      continue;
    }
    SB_ASSIGN_OR_RETURN(Tensor x, fetch(ends_with(s.name, ".weight") ? strip(s.name, ".weight") : s.name, s.shape));
    SB_ASSIGN_OR_RETURN(Tensor t, to_dtype(x, s.dtype));
    out.emplace_back(s.name, t);
  }
  SB_RETURN_IF_ERROR(drain());
  if (progress) progress(specs.size(), specs.size());
  return Status::ok();
}

namespace {

// --- Hugging Face checkpoints ----------------------------------------------------------

// Index and bit-map files are a few KB to a few MB of JSON.
constexpr uint64_t kMaxIndexBytes = uint64_t{64} << 20;

// The shard files a model.safetensors.index.json's weight_map names (each once).
Status index_files(const fs::path& index, std::vector<std::string>* paths) {
  SB_ASSIGN_OR_RETURN(std::string text, read_text_file(index.string(), kMaxIndexBytes, "checkpoint index"));
  SB_RETURN_IF_ERROR(check_json_depth(text, kMaxJsonDepth, index.string()));
  const auto j = nlohmann::json::parse(text, nullptr, false);
  const auto bad = [&](const char* what) {
    return make_error(StatusCode::kInvalidArgument, "%s: %s", index.c_str(), what);
  };
  if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    return bad("needs a \"weight_map\" object");
  std::set<std::string> files;
  for (const auto& [tensor, file] : j["weight_map"].items()) {
    if (!file.is_string()) return bad("weight_map values must be file names");
    const fs::path name = file.get<std::string>();
    if (name.has_parent_path() || name.filename() != name || name.extension() != ".safetensors")
      return bad("weight_map names a file outside the model directory");
    files.insert((index.parent_path() / name).string());
  }
  paths->assign(files.begin(), files.end());
  return Status::ok();
}

class Checkpoint {
 public:
  static Result<std::unique_ptr<Checkpoint>> open(const std::string& dir) {
    auto ck = std::make_unique<Checkpoint>();
    ck->dir_ = dir;
    std::vector<std::string> paths;
    std::error_code ec;
    const fs::path index = fs::path(dir) / "model.safetensors.index.json";
    if (fs::exists(index)) {  // sharded: exactly the files its weight_map names
      SB_RETURN_IF_ERROR(index_files(index, &paths));
    } else {
      for (const auto& entry : fs::directory_iterator(dir, ec))
        if (entry.path().extension() == ".safetensors") paths.push_back(entry.path().string());
    }
    if (ec) return make_error(StatusCode::kNotFound, "%s: %s", dir.c_str(), ec.message().c_str());
    if (paths.empty()) return make_error(StatusCode::kNotFound, "%s: no *.safetensors files", dir.c_str());
    std::sort(paths.begin(), paths.end());
    for (const std::string& p : paths) {
      SB_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(p));
      for (const auto& [name, e] : file->entries()) {
        if (ck->where_.count(name))
          return make_error(StatusCode::kInvalidArgument, "%s: tensor '%s' also appears in %s", p.c_str(),
                            name.c_str(), ck->files_[ck->where_[name]]->path().c_str());
        ck->where_[name] = ck->files_.size();
      }
      ck->files_.push_back(std::move(file));
    }
    return ck;
  }
  bool has(const std::string& name) const { return where_.count(name) != 0; }
  // The tensor widened to f32; marks it used.
  Result<Tensor> get(const std::string& name) {
    SB_ASSIGN_OR_RETURN(Tensor t, raw(name));
    auto w = widen(t);
    if (!w) return make_error(StatusCode::kInvalidArgument, "%s: tensor '%s': %s", file_of(name).c_str(), name.c_str(),
                              w.status().message().c_str());
    return w;
  }
  // The tensor as stored (no widening); marks it used.
  Result<Tensor> raw(const std::string& name) {
    auto it = where_.find(name);
    if (it == where_.end())
      return make_error(StatusCode::kNotFound, "%s: tensor '%s' is missing", dir_.c_str(), name.c_str());
    used_.insert(name);
    return files_[it->second]->tensor(name);
  }
  const SafetensorsEntry& entry(const std::string& name) const {
    return files_[where_.at(name)]->entries().at(name);
  }
  std::string file_of(const std::string& name) const {
    auto it = where_.find(name);
    return it == where_.end() ? std::string("checkpoint") : files_[it->second]->path();
  }
  // mlx-lm's conversion of a Qwen3-Next / Qwen3.5 checkpoint: its lm_head's name, and its
  // zero-centred norms already stored as 1 + w (set by adapt_layout).
  std::string lm_head = "lm_head.weight";
  bool norms_shifted = false;
  // Tensors no weight came from (rotary caches excepted).
  std::vector<std::string> unused() const {
    std::vector<std::string> names;
    for (const auto& [name, idx] : where_)
      if (!used_.count(name) && !ends_with(name, "rotary_emb.inv_freq")) names.push_back(name);
    return names;
  }

 private:
  std::string dir_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;
  std::set<std::string> used_;
};

Status shape_error(const Checkpoint& ck, const std::string& name, const Shape& got, const Shape& want) {
  return make_error(StatusCode::kInvalidArgument, "%s: tensor '%s': shape %s, expected %s", ck.file_of(name).c_str(),
                    name.c_str(), shape_str(got).c_str(), shape_str(want).c_str());
}

Result<std::pair<int, int>> mlx_quant(const Checkpoint& ck, const std::string& weight, int64_t k);

// The tensor in f32 with the wanted shape; MLX codes (a .weight with .scales beside it)
// are dequantized, e.g. an 8-bit router read into a float program.
Result<Tensor> get_shaped(Checkpoint& ck, const std::string& name, const Shape& want) {
  if (ck.has(name) && ck.entry(name).dtype == DType::kU32 && !want.empty() && ends_with(name, ".weight")) {
    SB_ASSIGN_OR_RETURN(auto q, mlx_quant(ck, name, want.back()));
    const std::string stem = strip(name, ".weight");
    SB_ASSIGN_OR_RETURN(Tensor w, ck.raw(name));
    SB_ASSIGN_OR_RETURN(Tensor sc, ck.raw(stem + ".scales"));
    SB_ASSIGN_OR_RETURN(Tensor bi, ck.raw(stem + ".biases"));
    if (!dtype_is_float(sc.dtype()) || !dtype_is_float(bi.dtype()))
      return make_error(StatusCode::kInvalidArgument, "%s: tensor '%s.scales' / '.biases': must be float, are %s / %s",
                        ck.file_of(name).c_str(), stem.c_str(), dtype_name(sc.dtype()), dtype_name(bi.dtype()));
    const int64_t k = want.back(), rows = k > 0 ? shape_numel(want).value() / k : 0;
    auto fit = [&](const Tensor& t, int64_t cols) { return t.reshaped({rows, cols}); };
    auto w2 = fit(w, k * q.first / 32), s2 = fit(sc, k / q.second), b2 = fit(bi, k / q.second);
    if (!w2 || !s2 || !b2) return shape_error(ck, name, w.shape(), want);
    SB_ASSIGN_OR_RETURN(Tensor x, affine_dequantize(*w2, *s2, *b2, q.first, q.second, k));
    return x.reshaped(want);
  }
  SB_ASSIGN_OR_RETURN(Tensor t, ck.get(name));
  if (t.shape() != want) return shape_error(ck, name, t.shape(), want);
  return t;
}

// out[e][n][k] = src(e, n, k) for experts [E, N, K].
template <typename Fn>
Result<Tensor> build_experts(const Shape& shape, Fn src) {
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(DType::kF32, shape));
  float* o = out.mutable_data_as<float>();
  for (int64_t e = 0; e < shape[0]; ++e)
    for (int64_t n = 0; n < shape[1]; ++n)
      for (int64_t k = 0; k < shape[2]; ++k) *o++ = src(e, n, k);
  return out;
}

// Experts of one projection (gate, up, down) in our [E, N, K] layout, from any of the
// layouts transformers writes: fused gate_up_proj [E, 2I, D] (5.x), gpt-oss's
// [E, D, 2I] with gate/up interleaved, or one tensor per expert (4.x, Mixtral's w1/w3/w2).
Result<Tensor> hf_experts(Checkpoint& ck, const ModelConfig& c, const std::string& p, const std::string& proj,
                          const Shape& want) {
  const int64_t e = want[0], n = want[1], k = want[2];
  const bool down = proj == "down";
  if (ck.has(p + "mlp.experts.gate_up_proj") || ck.has(p + "mlp.experts.down_proj")) {
    if (c.family == "gpt_oss") {  // [E, in, out]; gate = even columns, up = odd
      if (down) {
        SB_ASSIGN_OR_RETURN(Tensor w, get_shaped(ck, p + "mlp.experts.down_proj", {e, k, n}));
        const float* s = w.data_as<float>();
        return build_experts(want, [&](int64_t x, int64_t r, int64_t j) { return s[(x * k + j) * n + r]; });
      }
      SB_ASSIGN_OR_RETURN(Tensor w, get_shaped(ck, p + "mlp.experts.gate_up_proj", {e, k, 2 * n}));
      const float* s = w.data_as<float>();
      const int64_t odd = proj == "up";
      return build_experts(want, [&](int64_t x, int64_t r, int64_t j) { return s[(x * k + j) * 2 * n + 2 * r + odd]; });
    }
    if (down) return get_shaped(ck, p + "mlp.experts.down_proj", want);
    SB_ASSIGN_OR_RETURN(Tensor w, get_shaped(ck, p + "mlp.experts.gate_up_proj", {e, 2 * n, k}));
    const float* s = w.data_as<float>();
    const int64_t off = proj == "up" ? n : 0;
    return build_experts(want, [&](int64_t x, int64_t r, int64_t j) { return s[(x * 2 * n + off + r) * k + j]; });
  }
  // One tensor per expert, stacked.
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(DType::kF32, want));
  const bool mixtral = ck.has(p + "block_sparse_moe.experts.0.w1.weight");
  const char* w_name = proj == "gate" ? "w1" : proj == "up" ? "w3" : "w2";
  for (int64_t x = 0; x < e; ++x) {
    const std::string name = mixtral ? p + "block_sparse_moe.experts." + std::to_string(x) + "." + w_name + ".weight"
                                     : p + "mlp.experts." + std::to_string(x) + "." + proj + "_proj.weight";
    SB_ASSIGN_OR_RETURN(Tensor w, get_shaped(ck, name, {n, k}));
    std::memcpy(out.mutable_data_as<float>() + x * n * k, w.data(), w.nbytes());
  }
  return out;
}

// gpt-oss expert biases: gate_up_proj_bias [E, 2I] interleaved, down_proj_bias [E, D].
Result<Tensor> hf_expert_bias(Checkpoint& ck, const std::string& p, const std::string& proj, const Shape& want) {
  if (proj == "down") return get_shaped(ck, p + "mlp.experts.down_proj_bias", want);
  const int64_t e = want[0], n = want[1], odd = proj == "up";
  SB_ASSIGN_OR_RETURN(Tensor b, get_shaped(ck, p + "mlp.experts.gate_up_proj_bias", {e, 2 * n}));
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(DType::kF32, want));
  for (int64_t x = 0; x < e; ++x)
    for (int64_t r = 0; r < n; ++r) out.mutable_data_as<float>()[x * n + r] = b.data_as<float>()[x * 2 * n + 2 * r + odd];
  return out;
}

// The one checkpoint tensor holding a logical weight, or "" when it is assembled from
// several (HF's per-expert or fused gate_up experts). MLX's stacked switch_mlp experts
// are one tensor each.
std::string tensor_name(const Checkpoint& ck, const ModelConfig& c, const std::string& logical) {
  const std::string& m = c.weight_prefix;
  if (logical == "embed") return m + "embed_tokens.weight";
  if (logical == "final_norm") return m + "norm.weight";
  if (logical == "lm_head") return c.tie_embeddings && !ck.has(ck.lm_head) ? m + "embed_tokens.weight" : ck.lm_head;
  // layers.<i>.<rest>
  const size_t dot = logical.find('.', 7);
  const std::string p = m + "layers." + logical.substr(7, dot - 7) + ".", rest = logical.substr(dot + 1);
  static const std::map<std::string, std::string> direct = {
      {"attn_norm", "input_layernorm.weight"},
      {"ffn_norm", "post_attention_layernorm.weight"},
      {"attn.q", "self_attn.q_proj.weight"},
      {"attn.k", "self_attn.k_proj.weight"},
      {"attn.v", "self_attn.v_proj.weight"},
      {"attn.o", "self_attn.o_proj.weight"},
      {"attn.q.bias", "self_attn.q_proj.bias"},
      {"attn.k.bias", "self_attn.k_proj.bias"},
      {"attn.v.bias", "self_attn.v_proj.bias"},
      {"attn.o.bias", "self_attn.o_proj.bias"},
      {"attn.q_norm", "self_attn.q_norm.weight"},
      {"attn.k_norm", "self_attn.k_norm.weight"},
      {"attn.sinks", "self_attn.sinks"},
      {"router.bias", "mlp.router.bias"},
      {"router.selection_bias", "mlp.gate.e_score_correction_bias"},
      {"shared_gate", "mlp.shared_expert_gate.weight"},
      {"mlp.gate", "mlp.gate_proj.weight"},
      {"mlp.up", "mlp.up_proj.weight"},
      {"mlp.down", "mlp.down_proj.weight"},
      {"lin.a_log", "linear_attn.A_log"},
      {"lin.dt_bias", "linear_attn.dt_bias"},
      {"lin.norm", "linear_attn.norm.weight"},
      {"lin.out", "linear_attn.out_proj.weight"}};
  if (auto it = direct.find(rest); it != direct.end()) return p + it->second;
  // Qwen3.5's separate projections; Qwen3-Next's grouped ones are assembled (hf_linear_attn).
  static const std::map<std::string, std::string> lin = {{"lin.qkv", "linear_attn.in_proj_qkv.weight"},
                                                         {"lin.z", "linear_attn.in_proj_z.weight"},
                                                         {"lin.b", "linear_attn.in_proj_b.weight"},
                                                         {"lin.a", "linear_attn.in_proj_a.weight"}};
  if (auto it = lin.find(rest); it != lin.end()) return c.lin_grouped ? "" : p + it->second;
  if (rest == "router") {
    for (const char* name : {"mlp.gate.weight", "mlp.router.weight", "block_sparse_moe.gate.weight"})
      if (ck.has(p + name)) return p + name;
    return p + "mlp.gate.weight";  // names the missing tensor
  }
  if (rest.rfind("shared.", 0) == 0) {
    const std::string a = p + "mlp.shared_expert." + rest.substr(7) + "_proj.weight";
    return ck.has(a) ? a : p + "mlp.shared_experts." + rest.substr(7) + "_proj.weight";
  }
  if (rest.rfind("experts.", 0) == 0 && !ends_with(rest, ".bias")) {
    const std::string proj = rest.substr(8) + "_proj.weight";
    for (const char* block : {"mlp.switch_mlp.", "block_sparse_moe.switch_mlp."})
      if (ck.has(p + block + proj)) return p + block + proj;
  }
  return "";
}

// Qwen3-Next's in_proj_qkvz rows come in key-head groups [q_g | k_g | v of its r value heads |
// z of them], in_proj_ba's in groups [b of the r heads | a of them]: our [q | k | v], z, b and a
// are rows of them (value head h = g r + j reads key head g).
struct GroupedRows {
  std::string source;  // the checkpoint tensor
  int64_t n = 0;       // its rows
  std::vector<int64_t> rows;
};
std::optional<GroupedRows> grouped_rows(const ModelConfig& c, const std::string& logical) {
  if (!c.lin_grouped || logical.rfind("layers.", 0) != 0) return std::nullopt;
  const size_t dot = logical.find('.', 7);
  const std::string p = c.weight_prefix + "layers." + logical.substr(7, dot - 7) + ".", rest = logical.substr(dot + 1);
  const int64_t hk = c.lin_k_heads, dk = c.lin_k_dim, dv = c.lin_v_dim, r = c.lin_v_heads / hk;
  const int64_t group = 2 * dk + 2 * r * dv;
  GroupedRows g;
  auto run = [&](int64_t start, int64_t len) {
    for (int64_t i = 0; i < len; ++i) g.rows.push_back(start + i);
  };
  if (rest == "lin.b" || rest == "lin.a") {
    for (int64_t k = 0; k < hk; ++k) run(k * 2 * r + (rest == "lin.a" ? r : 0), r);
    g.source = p + "linear_attn.in_proj_ba.weight";
    g.n = hk * 2 * r;
    return g;
  }
  if (rest == "lin.qkv") {
    for (int64_t part = 0; part < 2; ++part)  // all q heads, then all k heads
      for (int64_t k = 0; k < hk; ++k) run(k * group + part * dk, dk);
    for (int64_t k = 0; k < hk; ++k) run(k * group + 2 * dk, r * dv);
  } else if (rest == "lin.z") {
    for (int64_t k = 0; k < hk; ++k) run(k * group + 2 * dk + r * dv, r * dv);
  } else {
    return std::nullopt;
  }
  g.source = p + "linear_attn.in_proj_qkvz.weight";
  g.n = hk * group;
  return g;
}

bool is_norm(const std::string& logical) {
  for (const char* n : {"attn_norm", "ffn_norm", "attn.q_norm", "attn.k_norm"})
    if (ends_with(logical, n)) return true;
  return logical == "final_norm";
}

Result<Tensor> hf_fetch_layout(Checkpoint& ck, const ModelConfig& c, const std::string& logical, const Shape& want);

// Where a hybrid checkpoint keeps its text model: transformers' model. / model.language_model.,
// or mlx-lm's language_model.model. (its lm_head inside, its norms stored as 1 + w and its
// convs as [C, K, 1], as mlx-lm's sanitize leaves them).
void adapt_layout(Checkpoint& ck, ModelConfig& c) {
  if (c.linear_layer.empty()) return;
  for (const char* prefix : {"model.", "model.language_model.", "language_model.model."})
    if (!ck.has(c.weight_prefix + "embed_tokens.weight") && ck.has(std::string(prefix) + "embed_tokens.weight"))
      c.weight_prefix = prefix;
  if (!ck.has(ck.lm_head) && ck.has("language_model.lm_head.weight")) ck.lm_head = "language_model.lm_head.weight";
  for (int64_t i = 0; i < c.layers; ++i) {
    if (!c.linear_layer[static_cast<size_t>(i)]) continue;
    const std::string conv = c.weight_prefix + "layers." + std::to_string(i) + ".linear_attn.conv1d.weight";
    ck.norms_shifted = c.lin_conv > 1 && ck.has(conv) && ck.entry(conv).shape == Shape{c.lin_conv_dim(), c.lin_conv, 1};
    break;
  }
}

// Our logical name -> the tensor(s) of the checkpoint, as f32 in our layout; zero-centred
// norms (Qwen3-Next, Qwen3.5) become 1 + w here, in f32 as HF computes it.
Result<Tensor> hf_fetch(Checkpoint& ck, const ModelConfig& c, const std::string& logical, const Shape& want) {
  SB_ASSIGN_OR_RETURN(Tensor t, hf_fetch_layout(ck, c, logical, want));
  if (!c.norm_plus_one || ck.norms_shifted || !is_norm(logical)) return t;
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(DType::kF32, t.shape()));  // t may be the mapped file
  for (int64_t i = 0; i < t.numel(); ++i) out.mutable_data_as<float>()[i] = 1.0f + t.data_as<float>()[i];
  return out;
}

Result<Tensor> hf_fetch_layout(Checkpoint& ck, const ModelConfig& c, const std::string& logical, const Shape& want) {
  if (std::string name = tensor_name(ck, c, logical); !name.empty()) return get_shaped(ck, name, want);
  const size_t dot = logical.find('.', 7);
  const std::string p = c.weight_prefix + "layers." + logical.substr(7, dot - 7) + ".", rest = logical.substr(dot + 1);
  if (rest == "lin.conv") {  // conv1d.weight: HF's [C, 1, K] or mlx-lm's [C, K, 1] (the same order)
    const std::string name = p + "linear_attn.conv1d.weight";
    const bool mlx = ck.has(name) && ck.entry(name).shape == Shape{want[0], want[1], 1};
    SB_ASSIGN_OR_RETURN(Tensor w, get_shaped(ck, name, mlx ? Shape{want[0], want[1], 1} : Shape{want[0], 1, want[1]}));
    return w.reshaped(want);
  }
  if (auto g = grouped_rows(c, logical)) {  // the rows of the dequantized or widened tensor
    SB_ASSIGN_OR_RETURN(Tensor w, get_shaped(ck, g->source, {g->n, c.hidden}));
    return take_rows(w, g->n, g->rows);
  }
  if (rest.rfind("experts.", 0) == 0) {
    const std::string proj = rest.substr(8, rest.find('.', 8) - 8);
    if (ends_with(rest, ".bias")) return hf_expert_bias(ck, p, proj, want);
    return hf_experts(ck, c, p, proj, want);
  }
  return make_error(StatusCode::kInternal, "no checkpoint tensor for weight '%s'", logical.c_str());
}

// {bits, group_size} of an MLX-quantized linear from its tensors' shapes (K known),
// or {0, 0} when the checkpoint keeps it in float.
Result<std::pair<int, int>> mlx_quant(const Checkpoint& ck, const std::string& weight, int64_t k) {
  const std::string stem = strip(weight, ".weight");
  if (!ck.has(stem + ".scales")) return std::pair<int, int>{0, 0};
  const SafetensorsEntry &w = ck.entry(weight), &s = ck.entry(stem + ".scales");
  if (w.dtype != DType::kU32 || w.shape.empty() || s.shape.empty() || s.shape.back() <= 0 || k % s.shape.back() != 0)
    return make_error(StatusCode::kInvalidArgument, "%s: tensor '%s': not MLX-quantized codes for width %lld",
                      ck.file_of(weight).c_str(), weight.c_str(), (long long)k);
  if (w.shape.back() > k)  // more than 32 bits per value: refused before any product can overflow
    return make_error(StatusCode::kInvalidArgument, "%s: tensor '%s': %lld words for width %lld", ck.file_of(weight).c_str(),
                      weight.c_str(), (long long)w.shape.back(), (long long)k);
  const int64_t bits = w.shape.back() * 32 / k, gs = k / s.shape.back();
  if (!quant_bits_allowed(static_cast<int>(bits)) || !quant_group_allowed(static_cast<int>(gs)) || w.shape.back() * 32 != bits * k)
    return make_error(StatusCode::kInvalidArgument, "%s: tensor '%s': %lld-bit groups of %lld are not supported",
                      ck.file_of(weight).c_str(), weight.c_str(), (long long)bits, (long long)gs);
  return std::pair<int, int>{static_cast<int>(bits), static_cast<int>(gs)};
}

// An MLX checkpoint's own format: the widths and groups of every quantized linear (read
// from its tensors' shapes), its scale dtype, float where it kept float.
Status mlx_format(const Checkpoint& ck, const ModelConfig& c, ExportFormat* f) {
  f->bits = c.mlx_bits;
  f->group_size = c.mlx_group_size;
  f->quant_origin = c.origin;
  bool first = true;
  for (const WeightSpec& s : weight_specs(c, *f)) {
    if (s.dtype != DType::kU32) continue;
    const std::string base = strip(s.name, ".weight");
    const auto grouped = grouped_rows(c, base);
    // The fused q/k/v projection has its parts' width (mlx_qkv_widths checked that they agree).
    const std::string part = ends_with(base, ".attn.qkv") ? base.substr(0, base.size() - 2) : base;
    const std::string name = grouped ? grouped->source : tensor_name(ck, c, part);
    if (name.empty() || !ck.has(name)) continue;  // fused HF experts etc.: quantized at export
    const int64_t width = input_width(c, base);
    SB_ASSIGN_OR_RETURN(auto q, mlx_quant(ck, name, width));
    if (q != std::pair<int, int>{f->bits, f->group_size}) {
      f->linear_quant[base] = q;
      if (part != base)  // the fused projection's parts share its width (the decoder checks they do)
        for (const char* p : {"q", "k", "v"}) f->linear_quant[part.substr(0, part.size() - 1) + p] = q;
    }
    if (q.first != 0 && first) {
      f->scale_dtype = ck.entry(strip(name, ".weight") + ".scales").dtype;
      first = false;
    }
  }
  if (!dtype_is_float(f->scale_dtype)) f->scale_dtype = DType::kBF16;
  f->dtype = f->scale_dtype;  // the embedding (dequantized) in the checkpoint's float width
  return Status::ok();
}

// An MLX checkpoint whose q, k and v projections have different widths keeps them apart.
Status mlx_qkv_widths(const Checkpoint& ck, ModelConfig* c) {
  for (int64_t i = 0; i < c->layers && c->qkv_fused(); ++i) {
    std::vector<std::pair<int, int>> widths;
    for (const char* p : {"attn.q", "attn.k", "attn.v"}) {
      const std::string name = tensor_name(ck, *c, "layers." + std::to_string(i) + "." + p);
      if (name.empty() || !ck.has(name)) break;  // a linear-attention layer, or named later as missing
      SB_ASSIGN_OR_RETURN(auto q, mlx_quant(ck, name, c->hidden));
      widths.push_back(q);
    }
    if (widths.size() == 3 && (widths[0] != widths[1] || widths[0] != widths[2])) c->fuse_qkv = false;
  }
  return Status::ok();
}

void remove_all_quiet(const fs::path& p) {
  std::error_code ec;
  fs::remove_all(p, ec);
}

}  // namespace

Status read_bit_map(const std::string& path, ExportFormat* f) {
  SB_ASSIGN_OR_RETURN(std::string text, read_text_file(path, kMaxIndexBytes, "bit map"));
  return parse_bit_map(text, path, f);
}

Status parse_bit_map(const std::string& text, const std::string& path, ExportFormat* f) {
  SB_RETURN_IF_ERROR(check_json_depth(text, kMaxJsonDepth, path));
  const auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return make_error(StatusCode::kInvalidArgument, "%s: must be a JSON object {\"layer\": {\"expert\": bits}}",
                      path.c_str());
  auto index = [&](const std::string& key, const char* what, int64_t* out) {
    char* end = nullptr;
    const long long v = std::strtoll(key.c_str(), &end, 10);
    if (key.empty() || *end != '\0' || v < 0)
      return make_error(StatusCode::kInvalidArgument, "%s: %s key '%s' is not a non-negative integer", path.c_str(),
                        what, key.c_str());
    *out = v;
    return Status::ok();
  };
  for (const auto& [lk, experts] : j.items()) {
    int64_t layer = 0;
    SB_RETURN_IF_ERROR(index(lk, "layer", &layer));
    if (!experts.is_object())
      return make_error(StatusCode::kInvalidArgument, "%s: layer %s: must map expert -> bits", path.c_str(), lk.c_str());
    for (const auto& [ek, bits] : experts.items()) {
      int64_t expert = 0;
      SB_RETURN_IF_ERROR(index(ek, "expert", &expert));
      if (!bits.is_number_integer())
        return make_error(StatusCode::kInvalidArgument, "%s: layer %s expert %s: bits must be an integer", path.c_str(),
                          lk.c_str(), ek.c_str());
      if (layer > 1 << 20 || expert > 1 << 20)
        return make_error(StatusCode::kInvalidArgument, "%s: layer %s expert %s: index too large", path.c_str(),
                          lk.c_str(), ek.c_str());
      const int64_t b = bits.get<int64_t>();
      f->expert_bits[layer][expert] = b < -1 || b > 64 ? -1 : static_cast<int>(b);  // out of range: refused later
    }
  }
  return Status::ok();
}

namespace {

constexpr const char* kModelFiles[] = {"weights.safetensors", "program.sbp"};  // placed in this order

// Before anything is written: OUT, where it exists, is a directory whose model files are
// regular files or absent, so placing them cannot fail half way for a reason known now.
Status check_out_dir(const fs::path& out) {
  std::error_code ec;
  if (!fs::exists(out, ec)) {
    const fs::path parent = out.parent_path().empty() ? fs::path(".") : out.parent_path();
    if (!fs::is_directory(parent, ec))
      return make_error(StatusCode::kNotFound, "%s: its parent directory %s does not exist", out.c_str(),
                        parent.c_str());
    return Status::ok();
  }
  if (!fs::is_directory(out, ec)) return make_error(StatusCode::kInvalidArgument, "%s: not a directory", out.c_str());
  for (const char* name : kModelFiles) {
    const fs::path f = out / name;
    if (fs::exists(fs::symlink_status(f, ec)) && !fs::is_regular_file(fs::symlink_status(f, ec)))
      return make_error(StatusCode::kInvalidArgument, "%s: exists and is not a regular file (nothing was written)",
                        f.c_str());
  }
  return Status::ok();
}

// This run's own staging directory: beside OUT (OUT.partial-XXXXXX) when OUT does not exist,
// inside it (OUT/.partial-XXXXXX, same filesystem) when it is a directory already. A directory
// another run or the user left there is never touched.
Result<fs::path> private_dir(const fs::path& out) {
  std::error_code ec;
  std::string tmpl = (out / ".partial-XXXXXX").string();
  if (!fs::is_directory(out, ec))  // beside OUT, or in its parent when OUT's name leaves no room
    tmpl = out.filename().string().size() + 15 > NAME_MAX ? (out.parent_path() / ".partial-XXXXXX").string()
                                                           : out.string() + ".partial-XXXXXX";
  if (!::mkdtemp(tmpl.data()))
    return make_error(StatusCode::kIoError, "%s: cannot create a staging directory for it: %s", out.c_str(),
                      std::strerror(errno));
  return fs::path(tmpl);
}

// Puts the staged files in place as one unit. OUT absent: one rename of the staging
// directory. OUT present: its model files are replaced while this run holds OUT's lock, so
// of concurrent exports one replaces both files and the others fail without touching them.
Status place(const fs::path& tmp, const fs::path& out) {
  std::error_code ec;
  if (!fs::is_directory(out, ec)) {
    if (::rename(tmp.c_str(), out.c_str()) == 0) return Status::ok();
    if (errno != EEXIST && errno != ENOTEMPTY && errno != EISDIR)  // not: another run made OUT meanwhile
      return make_error(StatusCode::kIoError, "%s: cannot put the export in place: %s", out.c_str(),
                        std::strerror(errno));
  }
  const int fd = ::open(out.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return make_error(StatusCode::kIoError, "%s: cannot open: %s", out.c_str(), std::strerror(errno));
  Status st;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    st = make_error(StatusCode::kFailedPrecondition, "%s: another export to it is in progress; nothing was replaced",
                    out.c_str());
  } else {
    st = check_out_dir(out);
    for (const char* name : kModelFiles)
      if (st.is_ok() && ::rename((tmp / name).c_str(), (out / name).c_str()) != 0)
        st = make_error(StatusCode::kIoError, "%s: cannot replace: %s", (out / name).c_str(), std::strerror(errno));
  }
  ::close(fd);  // releases the lock
  return st;
}

Status write_model_impl(const std::string& out_dir, const ModelConfig& c, const ExportFormat& f,
                        const WeightSource& weights) {
  if (out_dir.empty()) return make_error(StatusCode::kInvalidArgument, "output directory: empty path");
  ProgramBuilder b;
  SB_RETURN_IF_ERROR(build_decoder(c, f, b));
  std::vector<TensorSpec> specs;
  for (const WeightSpec& s : weight_specs(c, f)) specs.push_back({s.name, s.dtype, s.shape});
  std::error_code ec;
  fs::path out = fs::absolute(fs::path(out_dir), ec).lexically_normal();
  if (ec) return make_error(StatusCode::kIoError, "%s: %s", out_dir.c_str(), ec.message().c_str());
  if (!out.has_filename()) out = out.parent_path();  // "dir/" and "." name the directory itself
  SB_RETURN_IF_ERROR(check_out_dir(out));
  SB_ASSIGN_OR_RETURN(fs::path tmp, private_dir(out));
  const std::string program = (tmp / "program.sbp").string(), weights_file = (tmp / "weights.safetensors").string();
  Status st = [&]() -> Status {
    // Tensor by tensor into place: a model larger than memory converts.
    // A random id in the header makes each export's fingerprint its own, so the program of
    // one export refuses the weights of another even when both have the same shapes.
    std::random_device rd;
    const uint64_t id = (uint64_t{rd()} << 32) ^ rd();
    SB_ASSIGN_OR_RETURN(auto writer, SafetensorsWriter::create(weights_file, specs,
                                                               {{"switchboard_export_id", strformat("%016llx", (unsigned long long)id)}}));
    SB_RETURN_IF_ERROR(weights([&](const std::string& name, const Tensor& t) { return writer->write(name, t); }));
    SB_RETURN_IF_ERROR(writer->finish());
    // The program records the weights (size, header and content hashes), then must load
    // against them before anything lands.
    SB_RETURN_IF_ERROR(b.save(program, weights_file));
    return Program::load(program, LoadOptions{{weights_file}}).status();
  }();
  if (st.is_ok()) st = place(tmp, out);
  remove_all_quiet(tmp);  // ours alone; gone already when it became OUT
  return st;
}

}  // namespace

Status write_model(const std::string& out_dir, const ModelConfig& c, const ExportFormat& f,
                   const WeightSource& weights) {
  return no_throw(out_dir, [&] { return write_model_impl(out_dir, c, f, weights); });
}

Status write_model(const std::string& out_dir, const ModelConfig& c, const ExportFormat& f,
                   const std::vector<std::pair<std::string, Tensor>>& weights) {
  return write_model(out_dir, c, f, [&](const WeightSink& sink) {
    for (const auto& [name, t] : weights) SB_RETURN_IF_ERROR(sink(name, t));
    return Status::ok();
  });
}

Result<std::vector<std::pair<std::string, Tensor>>> collect_weights(const WeightSource& source) {
  std::vector<std::pair<std::string, Tensor>> out;
  SB_RETURN_IF_ERROR(source([&](const std::string& name, const Tensor& t) {
    out.emplace_back(name, t);
    return Status::ok();
  }));
  return out;
}

static Status export_hf_impl(const std::string& hf_dir, const std::string& out_dir, const ExportOptions& o) {
  SB_ASSIGN_OR_RETURN(ModelConfig c, parse_hf_config((fs::path(hf_dir) / "config.json").string()));
  if (o.max_seq > 0) c.max_seq = o.max_seq;
  SB_RETURN_IF_ERROR(check_config(c));
  if (c.mlx_quantized && o.format.bits != 0)
    return make_error(StatusCode::kInvalidArgument,
                      "%s: already quantized (MLX \"quantization\"); export it without --bits to keep its codes",
                      hf_dir.c_str());
  SB_RETURN_IF_ERROR(check_format(c, o.format));
  SB_ASSIGN_OR_RETURN(auto ck, Checkpoint::open(hf_dir));
  adapt_layout(*ck, c);
  ExportFormat f = o.format;
  if (c.mlx_quantized) {
    SB_RETURN_IF_ERROR(mlx_qkv_widths(*ck, &c));
    SB_RETURN_IF_ERROR(mlx_format(*ck, c, &f));
    SB_RETURN_IF_ERROR(check_format(c, f));
  }
  Fetch fetch = [&](const std::string& logical, const Shape& want) { return hf_fetch(*ck, c, logical, want); };
  RawFetch raw = [&](const std::string& base, const WeightSpec& w, const WeightSpec& s,
                     std::vector<std::pair<std::string, Tensor>>* out) -> Result<bool> {
    // Qwen3-Next's grouped projections: our rows of its codes, scales and biases, moved as they are.
    const auto grouped = grouped_rows(c, base);
    const std::string name = grouped ? grouped->source : tensor_name(*ck, c, base);
    if (!c.mlx_quantized || name.empty() || !ck->has(strip(name, ".weight") + ".scales")) return false;
    const std::string stem = strip(name, ".weight");
    SB_ASSIGN_OR_RETURN(Tensor codes, ck->raw(name));
    if (grouped) {
      SB_ASSIGN_OR_RETURN(codes, take_rows(codes, grouped->n, grouped->rows));
    }
    auto shaped = codes.reshaped(w.shape);
    if (!shaped) return shape_error(*ck, name, codes.shape(), w.shape);
    out->emplace_back(w.name, *shaped);
    for (const char* part : {".scales", ".biases"}) {
      SB_ASSIGN_OR_RETURN(Tensor t, ck->raw(stem + part));
      if (grouped) {
        SB_ASSIGN_OR_RETURN(t, take_rows(t, grouped->n, grouped->rows));
      }
      if (t.dtype() != f.scale_dtype) {
        SB_ASSIGN_OR_RETURN(Tensor wide, widen(t));
        SB_ASSIGN_OR_RETURN(t, to_dtype(wide, f.scale_dtype));
      }
      auto r = t.reshaped(s.shape);
      if (!r) return shape_error(*ck, stem + part, t.shape(), s.shape);
      out->emplace_back(strip(w.name, ".weight") + part, *r);
    }
    return true;
  };
  return write_model(out_dir, c, f, [&](const WeightSink& sink) -> Status {
    SB_RETURN_IF_ERROR(materialize(c, f, fetch, o.progress, sink, raw));
    std::vector<std::string> extra = ck->unused();
    // A text-only export leaves Qwen3.5's vision model and the multi-token-prediction head out.
    const auto skipped = std::remove_if(extra.begin(), extra.end(), [](const std::string& n) {
      return n.rfind("model.visual.", 0) == 0 || n.rfind("vision_tower.", 0) == 0 || n.rfind("mtp.", 0) == 0;
    });
    if (const auto n = extra.end() - skipped; n > 0)
      log::warn("{}: {} tensors of the vision model / multi-token prediction skipped (text only)", hf_dir, n);
    extra.erase(skipped, extra.end());
    if (!extra.empty())
      return make_error(StatusCode::kInvalidArgument, "%s: tensor '%s' is not used by a %s model (%zu unused in all)",
                        ck->file_of(extra[0]).c_str(), extra[0].c_str(), c.family.c_str(), extra.size());
    return Status::ok();
  });
}

Status export_hf(const std::string& hf_dir, const std::string& out_dir, const ExportOptions& o) {
  return no_throw(hf_dir, [&] { return export_hf_impl(hf_dir, out_dir, o); });
}

}  // namespace switchboard::models
