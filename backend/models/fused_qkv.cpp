// The fused attention projection "layers.<i>.attn.qkv" (where the decoder emits it) assembled from a
// checkpoint's separate q, k and v projections: rows [q | k | v], a gated q (Qwen3.5, Qwen3-Next)
// reordered from HF's per-head [query hd | gate hd] to [every head's query | every head's gate].
#include <cstring>

#include "materialize.h"

namespace switchboard::models {
namespace {

// The layer prefix ("layers.3.") of a fused weight's base or bias name, or "" for any other.
std::string fused_prefix(const std::string& logical) {
  for (const char* tail : {"attn.qkv", "attn.qkv.bias"})
    if (logical.rfind("layers.", 0) == 0 && ends_with(logical, tail))
      return logical.substr(0, logical.size() - std::strlen(tail));
  return "";
}

struct Part {
  std::string name;  // "layers.3.attn.q"
  int64_t rows = 0;
};
std::vector<Part> parts(const ModelConfig& c, const std::string& prefix) {
  const int64_t kv = c.kv_heads * c.head_dim;
  return {{prefix + "attn.q", (c.attn_output_gate ? 2 : 1) * c.heads * c.head_dim},
          {prefix + "attn.k", kv},
          {prefix + "attn.v", kv}};
}

// HF's rows of a gated q ([query | gate] per head) in our order (queries, then gates).
std::vector<int64_t> gated_q_rows(const ModelConfig& c) {
  std::vector<int64_t> rows;
  for (int64_t half = 0; half < 2; ++half)
    for (int64_t h = 0; h < c.heads; ++h)
      for (int64_t d = 0; d < c.head_dim; ++d) rows.push_back(h * 2 * c.head_dim + half * c.head_dim + d);
  return rows;
}

// Rows of tensors of one dtype and row width (each viewed as [rows, *]) one after another.
Result<Tensor> stack_rows(const std::vector<Tensor>& ts, const Shape& shape) {
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(ts.at(0).dtype(), shape));
  size_t at = 0;
  for (const Tensor& t : ts) {
    SB_CHECK_OR_RETURN(t.dtype() == out.dtype() && at + t.nbytes() <= out.nbytes(), StatusCode::kInvalidArgument,
                       "%s parts of the fused q/k/v projection do not fit %s", dtype_name(t.dtype()),
                       shape_str(shape).c_str());
    std::memcpy(static_cast<uint8_t*>(out.mutable_data()) + at, t.data(), t.nbytes());
    at += t.nbytes();
  }
  SB_CHECK_OR_RETURN(at == out.nbytes(), StatusCode::kInvalidArgument,
                     "the parts of the fused q/k/v projection do not fill %s", shape_str(shape).c_str());
  return out;
}

// t with q's rows reordered when the q is gated (part 0).
Result<Tensor> in_our_order(const ModelConfig& c, size_t part, const Tensor& t, int64_t rows) {
  if (part != 0 || !c.attn_output_gate) return t;
  return take_rows(t, rows, gated_q_rows(c));
}

}  // namespace

Fetch fused_qkv_fetch(const ModelConfig& c, const Fetch& fetch) {
  // The separate projections were fetched q, its bias, k, its bias, ...: the fused weight's fetch
  // keeps that order (a random model draws the same values either way) and holds the bias.
  struct Held {
    std::string prefix;  // the layer whose biases these are
    std::vector<Tensor> biases;
  };
  auto held = std::make_shared<Held>();
  return [&c, fetch, held](const std::string& logical, const Shape& shape) -> Result<Tensor> {
    const std::string prefix = fused_prefix(logical);
    if (prefix.empty()) return fetch(logical, shape);
    const bool bias = ends_with(logical, ".bias");
    std::vector<Tensor>& biases = held->biases;
    if (bias && !biases.empty() && held->prefix == prefix) {
      SB_ASSIGN_OR_RETURN(Tensor b, stack_rows(biases, shape));
      biases.clear();
      return b;
    }
    biases.clear();
    held->prefix = prefix;
    std::vector<Tensor> ws;
    const std::vector<Part> ps = parts(c, prefix);
    for (size_t i = 0; i < ps.size(); ++i) {
      if (!bias) {
        SB_ASSIGN_OR_RETURN(Tensor w, fetch(ps[i].name, {ps[i].rows, shape.back()}));
        SB_ASSIGN_OR_RETURN(w, in_our_order(c, i, w, ps[i].rows));
        ws.push_back(std::move(w));
      }
      if (c.qkv_bias) {
        SB_ASSIGN_OR_RETURN(Tensor b, fetch(ps[i].name + ".bias", {ps[i].rows}));
        SB_ASSIGN_OR_RETURN(b, in_our_order(c, i, b, ps[i].rows));
        (bias ? ws : biases).push_back(std::move(b));
      }
    }
    return stack_rows(ws, shape);
  };
}

Result<bool> fused_qkv_raw(const ModelConfig& c, const RawFetch& raw, const std::string& base, const WeightSpec& w,
                           const WeightSpec& s, std::vector<std::pair<std::string, Tensor>>* out) {
  const std::string prefix = fused_prefix(base);
  if (prefix.empty()) return raw(base, w, s, out);
  std::vector<Tensor> codes, scales, biases;
  const std::vector<Part> ps = parts(c, prefix);
  for (size_t i = 0; i < ps.size(); ++i) {
    std::vector<std::pair<std::string, Tensor>> got;
    const WeightSpec pw{ps[i].name + ".weight", w.dtype, {1, ps[i].rows, w.shape.back()}};
    const WeightSpec psc{ps[i].name + ".scales", s.dtype, {1, ps[i].rows, s.shape.back()}};
    SB_ASSIGN_OR_RETURN(bool taken, raw(ps[i].name, pw, psc, &got));
    if (!taken) {
      SB_CHECK_OR_RETURN(i == 0, StatusCode::kInvalidArgument, "%s: quantized in the checkpoint, but not %s",
                         ps[0].name.c_str(), ps[i].name.c_str());
      return false;
    }
    SB_CHECK_OR_RETURN(got.size() == 3, StatusCode::kInternal, "%s: %zu raw tensors", ps[i].name.c_str(), got.size());
    for (auto [dst, t] : {std::pair{&codes, got[0].second}, {&scales, got[1].second}, {&biases, got[2].second}}) {
      SB_ASSIGN_OR_RETURN(Tensor r, in_our_order(c, i, t, ps[i].rows));
      dst->push_back(std::move(r));
    }
  }
  SB_ASSIGN_OR_RETURN(Tensor cw, stack_rows(codes, w.shape));
  SB_ASSIGN_OR_RETURN(Tensor cs, stack_rows(scales, s.shape));
  SB_ASSIGN_OR_RETURN(Tensor cb, stack_rows(biases, s.shape));
  out->emplace_back(w.name, std::move(cw));
  out->emplace_back(base + ".scales", std::move(cs));
  out->emplace_back(base + ".biases", std::move(cb));
  return true;
}

Result<Tensor> take_rows(const Tensor& t, int64_t n, const std::vector<int64_t>& rows) {
  const int64_t cols = n > 0 ? t.numel() / n : 0;
  SB_CHECK_OR_RETURN(n > 0 && cols * n == t.numel(), StatusCode::kInvalidArgument, "tensor %s does not have %lld rows",
                     shape_str(t.shape()).c_str(), (long long)n);
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(t.dtype(), {static_cast<int64_t>(rows.size()), cols}));
  const size_t row_bytes = static_cast<size_t>(cols) * dtype_size(t.dtype());
  for (size_t r = 0; r < rows.size(); ++r) {
    SB_CHECK_OR_RETURN(rows[r] >= 0 && rows[r] < n, StatusCode::kInvalidArgument, "row %lld of %lld",
                       (long long)rows[r], (long long)n);
    std::memcpy(static_cast<uint8_t*>(out.mutable_data()) + r * row_bytes,
                static_cast<const uint8_t*>(t.data()) + static_cast<size_t>(rows[r]) * row_bytes, row_bytes);
  }
  return out;
}

}  // namespace switchboard::models
