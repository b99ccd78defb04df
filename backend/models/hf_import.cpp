// Hugging Face checkpoints -> our weight names, kept in float or quantized at export;
// the random weights of the tiny and synthetic models take the same conversion path.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "program_impl.h"
#include "quantize.h"
#include "safetensors.h"
#include "switchboard/model.h"
#include "switchboard/switchboard.h"
#include "materialize.h"

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
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(DType::kF32, t.shape()));
  float* dst = out.mutable_data_as<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    switch (t.dtype()) {
      case DType::kF32: dst[i] = t.data_as<float>()[i]; break;
      case DType::kF16: dst[i] = f16_to_f32(t.data_as<uint16_t>()[i]); break;
      case DType::kBF16: dst[i] = bf16_to_f32(t.data_as<uint16_t>()[i]); break;
      default: return make_error(StatusCode::kInvalidArgument, "dtype %s is not a float", dtype_name(t.dtype()));
    }
  }
  return out;
}

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}
std::string strip(const std::string& s, const char* suffix) { return s.substr(0, s.size() - std::strlen(suffix)); }

// Quantizes x [rows.., K] (f32) per expert with its width; pruned experts get no codes.
Status quantize_into(const Tensor& x, int64_t experts, const std::vector<uint8_t>& bits, const ExportFormat& f,
                     const WeightSpec& wspec, std::vector<std::pair<std::string, Tensor>>* out) {
  const std::string base = strip(wspec.name, ".weight");
  const int64_t k = x.dim(x.rank() - 1), n = x.numel() / k / experts;
  if (bits.empty()) {
    SB_ASSIGN_OR_RETURN(Tensor rows, x.reshaped({experts * n, k}));
    SB_ASSIGN_OR_RETURN(QuantizedRows q, affine_quantize(rows, f.bits, f.group_size, f.scale_dtype));
    SB_ASSIGN_OR_RETURN(Tensor w, q.w.reshaped(wspec.shape));
    SB_ASSIGN_OR_RETURN(Tensor s, q.scales.reshaped({experts, n, k / f.group_size}));
    SB_ASSIGN_OR_RETURN(Tensor b, q.biases.reshaped({experts, n, k / f.group_size}));
    out->emplace_back(wspec.name, w);
    out->emplace_back(base + ".scales", s);
    out->emplace_back(base + ".biases", b);
    return Status::ok();
  }
  SB_ASSIGN_OR_RETURN(Tensor w, Tensor::zeros(DType::kU32, wspec.shape));
  SB_ASSIGN_OR_RETURN(Tensor s, Tensor::zeros(f.scale_dtype, {experts, n, k / f.group_size}));
  SB_ASSIGN_OR_RETURN(Tensor b, Tensor::zeros(f.scale_dtype, {experts, n, k / f.group_size}));
  int64_t word = 0;
  const size_t per_expert_groups = static_cast<size_t>(n * k / f.group_size) * dtype_size(f.scale_dtype);
  for (int64_t e = 0; e < experts; ++e) {
    if (bits[static_cast<size_t>(e)] == 0) continue;
    Tensor rows = Tensor::wrap(DType::kF32, {n, k}, nullptr, x.data_as<float>() + e * n * k);
    SB_ASSIGN_OR_RETURN(QuantizedRows q, affine_quantize(rows, bits[static_cast<size_t>(e)], f.group_size, f.scale_dtype));
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

Result<std::vector<std::pair<std::string, Tensor>>> materialize(const ModelConfig& c, const ExportFormat& f,
                                                                const Fetch& fetch,
                                                                const std::function<void(size_t, size_t)>& progress) {
  const std::vector<WeightSpec> specs = weight_specs(c, f);
  SB_ASSIGN_OR_RETURN(auto out, rope_tables(c));
  std::set<std::string> made;
  for (const auto& [name, t] : out) made.insert(name);
  for (size_t i = 0; i < specs.size(); ++i) {
    const WeightSpec& s = specs[i];
    if (progress) progress(i, specs.size());
    if (made.count(s.name)) continue;
    if (s.dtype == DType::kU32) {  // codes: the logical weight is [E, N, K] or [N, K]
      const std::string base = strip(s.name, ".weight");
      const WeightSpec* scales = &specs[i + 1];  // declared right after the codes
      const int64_t e = scales->shape[0], n = scales->shape[1], k = scales->shape[2] * f.group_size;
      const bool expert = base.find(".experts.") != std::string::npos;
      SB_ASSIGN_OR_RETURN(Tensor x, fetch(base, expert ? Shape{e, n, k} : Shape{n, k}));
      std::vector<uint8_t> bits;
      if (expert) bits = layer_expert_bits(c, f, std::stoll(base.substr(7)));
      SB_RETURN_IF_ERROR(quantize_into(x, e, bits, f, s, &out));
      made.insert(base + ".scales");
      made.insert(base + ".biases");
      continue;
    }
    SB_ASSIGN_OR_RETURN(Tensor x, fetch(ends_with(s.name, ".weight") ? strip(s.name, ".weight") : s.name, s.shape));
    SB_ASSIGN_OR_RETURN(Tensor t, to_dtype(x, s.dtype));
    out.emplace_back(s.name, t);
  }
  if (progress) progress(specs.size(), specs.size());
  return out;
}

namespace {

// --- Hugging Face checkpoints ----------------------------------------------------------

class Checkpoint {
 public:
  static Result<std::unique_ptr<Checkpoint>> open(const std::string& dir) {
    auto ck = std::make_unique<Checkpoint>();
    ck->dir_ = dir;
    std::vector<std::string> paths;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec))
      if (entry.path().extension() == ".safetensors") paths.push_back(entry.path().string());
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
    auto it = where_.find(name);
    if (it == where_.end())
      return make_error(StatusCode::kNotFound, "%s: tensor '%s' is missing", dir_.c_str(), name.c_str());
    used_.insert(name);
    const SafetensorsFile& file = *files_[it->second];
    SB_ASSIGN_OR_RETURN(Tensor t, file.tensor(name));
    auto w = widen(t);
    if (!w) return make_error(StatusCode::kInvalidArgument, "%s: tensor '%s': %s", file.path().c_str(), name.c_str(),
                              w.status().message().c_str());
    return w;
  }
  std::string file_of(const std::string& name) const {
    auto it = where_.find(name);
    return it == where_.end() ? std::string("checkpoint") : files_[it->second]->path();
  }
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

Result<Tensor> get_shaped(Checkpoint& ck, const std::string& name, const Shape& want) {
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

// Our logical name -> the tensor(s) of the checkpoint.
Result<Tensor> hf_fetch(Checkpoint& ck, const ModelConfig& c, const std::string& logical, const Shape& want) {
  if (logical == "embed") return get_shaped(ck, "model.embed_tokens.weight", want);
  if (logical == "final_norm") return get_shaped(ck, "model.norm.weight", want);
  if (logical == "lm_head")
    return get_shaped(ck, c.tie_embeddings && !ck.has("lm_head.weight") ? "model.embed_tokens.weight" : "lm_head.weight",
                      want);
  // layers.<i>.<rest>
  const size_t dot = logical.find('.', 7);
  const std::string p = "model.layers." + logical.substr(7, dot - 7) + ".", rest = logical.substr(dot + 1);
  static const std::map<std::string, std::string> direct = {
      {"attn_norm", "input_layernorm.weight"},       {"ffn_norm", "post_attention_layernorm.weight"},
      {"attn.q", "self_attn.q_proj.weight"},         {"attn.k", "self_attn.k_proj.weight"},
      {"attn.v", "self_attn.v_proj.weight"},         {"attn.o", "self_attn.o_proj.weight"},
      {"attn.q.bias", "self_attn.q_proj.bias"},      {"attn.k.bias", "self_attn.k_proj.bias"},
      {"attn.v.bias", "self_attn.v_proj.bias"},      {"attn.o.bias", "self_attn.o_proj.bias"},
      {"attn.q_norm", "self_attn.q_norm.weight"},    {"attn.k_norm", "self_attn.k_norm.weight"},
      {"attn.sinks", "self_attn.sinks"},             {"router.bias", "mlp.router.bias"},
      {"router.selection_bias", "mlp.gate.e_score_correction_bias"},
      {"shared_gate", "mlp.shared_expert_gate.weight"},
      {"mlp.gate", "mlp.gate_proj.weight"},          {"mlp.up", "mlp.up_proj.weight"},
      {"mlp.down", "mlp.down_proj.weight"}};
  if (auto it = direct.find(rest); it != direct.end()) return get_shaped(ck, p + it->second, want);
  if (rest == "router") {
    for (const char* name : {"mlp.gate.weight", "mlp.router.weight", "block_sparse_moe.gate.weight"})
      if (ck.has(p + name)) return get_shaped(ck, p + name, want);
    return get_shaped(ck, p + "mlp.gate.weight", want);  // names the missing tensor
  }
  if (rest.rfind("shared.", 0) == 0) {
    const std::string proj = rest.substr(7);
    const std::string a = p + "mlp.shared_expert." + proj + "_proj.weight";
    return get_shaped(ck, ck.has(a) ? a : p + "mlp.shared_experts." + proj + "_proj.weight", want);
  }
  if (rest.rfind("experts.", 0) == 0) {
    const std::string proj = rest.substr(8, rest.find('.', 8) - 8);
    if (ends_with(rest, ".bias")) return hf_expert_bias(ck, p, proj, want);
    return hf_experts(ck, c, p, proj, want);
  }
  return make_error(StatusCode::kInternal, "no checkpoint tensor for weight '%s'", logical.c_str());
}

void remove_all_quiet(const fs::path& p) {
  std::error_code ec;
  fs::remove_all(p, ec);
}

}  // namespace

Status read_bit_map(const std::string& path, ExportFormat* f) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(StatusCode::kNotFound, "%s: cannot open", path.c_str());
  std::stringstream ss;
  ss << in.rdbuf();
  const auto j = nlohmann::json::parse(ss.str(), nullptr, false);
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
      f->expert_bits[layer][expert] = bits.get<int>();
    }
  }
  return Status::ok();
}

Status write_model(const std::string& out_dir, const ModelConfig& c, const ExportFormat& f,
                   const std::vector<std::pair<std::string, Tensor>>& weights) {
  ProgramBuilder b;
  SB_RETURN_IF_ERROR(build_decoder(c, f, b));
  const fs::path out(out_dir), tmp = fs::path(out_dir + ".partial");
  std::error_code ec;
  remove_all_quiet(tmp);
  fs::create_directories(tmp, ec);
  if (ec) return make_error(StatusCode::kIoError, "%s: %s", tmp.c_str(), ec.message().c_str());
  Status st = b.save((tmp / "program.sbp").string());
  if (st.is_ok()) st = write_safetensors((tmp / "weights.safetensors").string(), weights);
  if (st.is_ok()) {  // the whole program must load against the weights before anything lands
    auto p = Program::load((tmp / "program.sbp").string(), LoadOptions{{(tmp / "weights.safetensors").string()}});
    if (!p) st = p.status();
  }
  if (!st.is_ok()) {
    remove_all_quiet(tmp);
    return st;
  }
  fs::create_directories(out, ec);
  for (const char* name : {"weights.safetensors", "program.sbp"}) {
    if (!ec) fs::rename(tmp / name, out / name, ec);
  }
  remove_all_quiet(tmp);
  if (ec) return make_error(StatusCode::kIoError, "%s: %s", out_dir.c_str(), ec.message().c_str());
  return Status::ok();
}

Status export_hf(const std::string& hf_dir, const std::string& out_dir, const ExportOptions& o) {
  SB_ASSIGN_OR_RETURN(ModelConfig c, parse_hf_config((fs::path(hf_dir) / "config.json").string()));
  if (o.max_seq > 0) c.max_seq = o.max_seq;
  SB_RETURN_IF_ERROR(check_config(c));
  SB_RETURN_IF_ERROR(check_format(c, o.format));
  SB_ASSIGN_OR_RETURN(auto ck, Checkpoint::open(hf_dir));
  Fetch fetch = [&](const std::string& logical, const Shape& want) { return hf_fetch(*ck, c, logical, want); };
  SB_ASSIGN_OR_RETURN(auto weights, materialize(c, o.format, fetch, o.progress));
  if (auto extra = ck->unused(); !extra.empty())
    return make_error(StatusCode::kInvalidArgument, "%s: tensor '%s' is not used by a %s model (%zu unused in all)",
                      ck->file_of(extra[0]).c_str(), extra[0].c_str(), c.family.c_str(), extra.size());
  return write_model(out_dir, c, o.format, weights);
}

}  // namespace switchboard::models
