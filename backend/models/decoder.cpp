// The MoE decoder as one program (prefill and decode): embedding, pre-norm attention
// with RoPE and a KV cache in mutable buffers, routed experts or a dense FFN, final
// norm, lm_head on the last position. Hugging Face's formulas in docs/numerics.md's orders
// (dot32 products, Tree32 norms, Blocked32 attention: the same on every device).
#include <cmath>
#include <string>

#include "switchboard/model.h"

namespace switchboard::models {
namespace {

std::string layer_name(int64_t i, const char* rest) { return "layers." + std::to_string(i) + "." + rest; }

// Declares constants on the builder and records their specs; sums the bytes a decode
// step reads (`read` = the fraction of a constant one token touches).
struct Emit {
  const ModelConfig& c;
  const ExportFormat& f;
  ProgramBuilder& b;
  std::vector<WeightSpec>* specs;
  DType act;
  double decode_bytes = 0;

  TensorRef constant(const std::string& name, DType t, const Shape& shape, double read = 1.0) {
    if (specs) specs->push_back({name, t, shape});
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    decode_bytes += read * static_cast<double>(n) * static_cast<double>(dtype_size(t));
    return b.constant(name, t, shape);
  }

  // A linear layer [n, k]: float weight, or MLX affine codes as a single-expert GatherQmm.
  struct Linear {
    QuantizedExperts q;  // no scales: float weight [n, k] in q.w
    TensorRef bias;
  };
  Linear linear(const std::string& name, int64_t n, int64_t k, bool bias) {
    Linear l;
    const auto [bits, gs] = f.quant_of(name);
    if (bits != 0) {
      l.q = QuantizedExperts{constant(name + ".weight", DType::kU32, {1, n, k * bits / 32}),
                             constant(name + ".scales", f.scale_dtype, {1, n, k / gs}),
                             constant(name + ".biases", f.scale_dtype, {1, n, k / gs}), bits, gs, {}};
    } else {
      l.q.w = constant(name + ".weight", act, {n, k});
    }
    if (bias) l.bias = constant(name + ".bias", act, {n});
    return l;
  }
  TensorRef apply(const Linear& l, TensorRef x) {
    if (!l.q.scales.valid()) return b.matmul(x, l.q.w, true, l.bias);
    TensorRef y = b.gather_qmm(x, l.q);
    return l.bias.valid() ? b.add(y, l.bias) : y;
  }

  // Routed experts [E, n, k] (per-expert bits from the format's bit map).
  QuantizedExperts experts(int64_t layer, const char* proj, int64_t n, int64_t k) {
    const std::string name = layer_name(layer, "experts.") + proj;
    const double read = static_cast<double>(c.top_k) / static_cast<double>(c.experts);
    const auto [width, gs] = f.quant_of(name);
    if (width == 0) return QuantizedExperts{constant(name + ".weight", act, {c.experts, n, k}, read)};
    std::vector<uint8_t> bits = layer_expert_bits(c, f, layer);
    int64_t words = c.experts * n * k * width / 32;
    if (!bits.empty()) {
      words = 0;
      for (uint8_t e : bits) words += n * k * e / 32;
    }
    Shape wshape = bits.empty() ? Shape{c.experts, n, k * width / 32} : Shape{words};
    return QuantizedExperts{constant(name + ".weight", DType::kU32, wshape, read),
                            constant(name + ".scales", f.scale_dtype, {c.experts, n, k / gs}, read),
                            constant(name + ".biases", f.scale_dtype, {c.experts, n, k / gs}, read), width, gs, bits};
  }

  // Zero-centred norms keep 1 + w in f32 (HF multiplies by the f32 1 + w); others the dtype's w.
  DType norm_dtype() const { return c.norm_plus_one ? DType::kF32 : act; }
  // RMSNorm (order Tree32) of x, or of x + residual: {the sum, the normalized sum}.
  ProgramBuilder::AddNorm add_norm(TensorRef x, TensorRef residual, const std::string& name, int64_t d) {
    return b.add_rms_norm(x, residual, constant(name, norm_dtype(), {d}), c.rms_eps);
  }
  TensorRef norm(TensorRef x, const std::string& name, int64_t d) { return add_norm(x, {}, name, d).out; }
};

struct Step {
  TensorRef tokens;
  IntOrValue m = 0, pos = 0;  // rows this step, position of the first
  TensorRef cos, sin;         // f32 [max_seq, rotary/2]: the exporter's RoPE tables (rope_tables)
};

// v as a Full of dtype t stores it: the f32 nearest, then rounded to t (the decoder's former
// scale operand, kept so the scores' bits stay).
float as_dtype(double v, DType t) {
  const float f = static_cast<float>(v);
  if (t == DType::kBF16) return bf16_to_f32(f32_to_bf16(f));
  if (t == DType::kF16) return f16_to_f32(f32_to_f16(f));
  return f;
}

TensorRef attention_out(Emit& e, const Step& s, int64_t layer, TensorRef q, TensorRef gate, TensorRef kc,
                        TensorRef vc) {
  const ModelConfig& c = e.c;
  ProgramBuilder& b = e.b;
  const int64_t hq = c.heads, hd = c.head_dim;
  // One op: causal (and sliding-window) masking, sinks, softmax and the weighted values, in
  // key blocks of 32 (order Blocked32, docs/numerics.md).
  const int64_t window = c.sliding_window.empty() ? 0 : c.sliding_window[static_cast<size_t>(layer)];
  TensorRef sinks = c.attn_sinks ? e.constant(layer_name(layer, "attn.sinks"), e.act, {hq}) : TensorRef{};
  TensorRef o =
      b.attention(q, kc, vc, s.pos, as_dtype(1.0 / std::sqrt(static_cast<double>(hd)), e.act), window, sinks, true);
  if (gate.valid()) o = b.mul(o, b.sigmoid(gate));
  return e.apply(e.linear(layer_name(layer, "attn.o"), c.hidden, hq * hd, c.o_bias), o);
}

// A layer's KV caches [max_seq, kv_heads, head_dim] (a step's keys and values append as one slice
// each) and its per-head q/k norm weights (when the model has them).
struct KvCaches {
  TensorRef k, v, q_norm, k_norm;
};
KvCaches kv_caches(Emit& e, int64_t layer) {
  const ModelConfig& c = e.c;
  KvCaches kv;
  kv.k = e.b.mutable_buffer(layer_name(layer, "k_cache"), e.act, {c.max_seq, c.kv_heads, c.head_dim});
  kv.v = e.b.mutable_buffer(layer_name(layer, "v_cache"), e.act, {c.max_seq, c.kv_heads, c.head_dim});
  if (c.qk_norm == QkNorm::kPerHead) {
    kv.q_norm = e.constant(layer_name(layer, "attn.q_norm"), e.norm_dtype(), {c.head_dim});
    kv.k_norm = e.constant(layer_name(layer, "attn.k_norm"), e.norm_dtype(), {c.head_dim});
  }
  return kv;
}

// q, k and v from one projection [q heads | gate heads | k heads | v heads], then one Rope op:
// per-head norms, RoPE, the key and value appends.
TensorRef fused_attention(Emit& e, const Step& s, int64_t layer, TensorRef h) {
  const ModelConfig& c = e.c;
  ProgramBuilder& b = e.b;
  const int64_t hq = c.heads, hk = c.kv_heads, hd = c.head_dim, heads = (c.attn_output_gate ? 2 : 1) * hq + 2 * hk;
  TensorRef x = e.apply(e.linear(layer_name(layer, "attn.qkv"), heads * hd, c.hidden, c.qkv_bias), h);
  x = b.reshape(x, {s.m, heads, hd});
  TensorRef gate = c.attn_output_gate ? b.reshape(b.slice(x, 1, hq, 2 * hq), {s.m, hq * hd}) : TensorRef{};
  const KvCaches kv = kv_caches(e, layer);
  TensorRef q = b.rope_qkv(x, s.cos, s.sin, s.pos, hq, hk, kv.k, kv.v, kv.q_norm, kv.k_norm, c.rms_eps);
  return attention_out(e, s, layer, q, gate, kv.k, kv.v);
}

// The fused projection needs one width for q, k, v and itself (a format's per-linear widths may
// set them apart).
bool fuses_qkv(const Emit& e, int64_t layer) {
  const auto q = e.f.quant_of(layer_name(layer, "attn.q"));
  return e.c.qkv_fused() && q == e.f.quant_of(layer_name(layer, "attn.k")) &&
         q == e.f.quant_of(layer_name(layer, "attn.v")) && q == e.f.quant_of(layer_name(layer, "attn.qkv"));
}

TensorRef attention(Emit& e, const Step& s, int64_t layer, TensorRef h) {
  if (fuses_qkv(e, layer)) return fused_attention(e, s, layer, h);
  const ModelConfig& c = e.c;
  ProgramBuilder& b = e.b;
  const int64_t hq = c.heads, hk = c.kv_heads, hd = c.head_dim;
  // With an output gate, q_proj gives per head [query hd | gate hd] (HF's view [m, hq, 2 hd]).
  const int64_t gated = c.attn_output_gate ? 2 : 1;
  Emit::Linear wq = e.linear(layer_name(layer, "attn.q"), gated * hq * hd, c.hidden, c.qkv_bias);
  Emit::Linear wk = e.linear(layer_name(layer, "attn.k"), hk * hd, c.hidden, c.qkv_bias);
  Emit::Linear wv = e.linear(layer_name(layer, "attn.v"), hk * hd, c.hidden, c.qkv_bias);
  TensorRef q = e.apply(wq, h), k = e.apply(wk, h), v = e.apply(wv, h);
  if (c.qk_norm == QkNorm::kWhole) {
    q = e.norm(q, layer_name(layer, "attn.q_norm"), hq * hd);
    k = e.norm(k, layer_name(layer, "attn.k_norm"), hk * hd);
  }
  TensorRef gate;
  if (c.attn_output_gate) {
    q = b.reshape(q, {s.m, hq, 2 * hd});
    gate = b.reshape(b.slice(q, 2, hd, 2 * hd), {s.m, hq * hd});
    q = b.slice(q, 2, 0, hd);
  }
  q = b.reshape(q, {s.m, hq, hd});
  k = b.reshape(k, {s.m, hk, hd});
  v = b.reshape(v, {s.m, hk, hd});
  // Per-head q/k norms, RoPE (HF's rotate_half) and the key append are one Rope op each.
  const KvCaches kv = kv_caches(e, layer);
  q = b.rope(q, s.cos, s.sin, s.pos, kv.q_norm, c.rms_eps);
  b.rope(k, s.cos, s.sin, s.pos, kv.k_norm, c.rms_eps, kv.k);
  b.slice_update(kv.v, v, 0, s.pos);
  return attention_out(e, s, layer, q, gate, kv.k, kv.v);
}

// Gated DeltaNet (Qwen3-Next / Qwen3.5 linear attention): projections to [q | k | v], z, b, a;
// the causal conv (+ SiLU) with its state; the gated delta rule with its state (token by token:
// a prefill gives decode's bits); the gated RMSNorm with z; out_proj.
TensorRef linear_attention(Emit& e, const Step& s, int64_t layer, TensorRef h) {
  const ModelConfig& c = e.c;
  ProgramBuilder& b = e.b;
  const int64_t hv = c.lin_v_heads, dv = c.lin_v_dim, width = c.lin_conv_dim();
  auto name = [&](const char* rest) { return layer_name(layer, rest); };
  TensorRef mixed = e.apply(e.linear(name("lin.qkv"), width, c.hidden, false), h);
  TensorRef z = e.apply(e.linear(name("lin.z"), hv * dv, c.hidden, false), h);
  TensorRef beta_in = e.apply(e.linear(name("lin.b"), hv, c.hidden, false), h);
  TensorRef a = e.apply(e.linear(name("lin.a"), hv, c.hidden, false), h);
  TensorRef conv_w = e.constant(name("lin.conv"), e.act, {width, c.lin_conv});
  TensorRef conv_state = b.mutable_buffer(name("lin.conv_state"), e.act, {c.lin_conv - 1, width});
  TensorRef conv = b.causal_conv1d(mixed, conv_w, conv_state, s.pos);
  // A_log and dt_bias in f32: HF adds and exponentiates them in f32.
  TensorRef a_log = e.constant(name("lin.a_log"), DType::kF32, {hv});
  TensorRef dt_bias = e.constant(name("lin.dt_bias"), DType::kF32, {hv});
  TensorRef state = b.mutable_buffer(name("lin.state"), DType::kF32, {hv, c.lin_k_dim, dv});
  e.decode_bytes += 2.0 * static_cast<double>(hv * c.lin_k_dim * dv * 4);  // the state, read and written a token
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.lin_k_dim)));
  TensorRef o = b.gated_delta_rule(conv, a, beta_in, a_log, dt_bias, state, s.pos, scale);
  o = b.gated_rms_norm(o, b.reshape(z, {s.m, hv, dv}), e.constant(name("lin.norm"), e.act, {dv}), c.rms_eps);
  return e.apply(e.linear(name("lin.out"), c.hidden, hv * dv, false), b.reshape(o, {s.m, hv * dv}));
}

// gate/up/down SwiGLU (or the config's GLU) with float or quantized linears.
TensorRef dense_ffn(Emit& e, const std::string& prefix, int64_t ffn, TensorRef h) {
  GluKind kind = e.c.activation == GluKind::kClampedSwiGLU ? GluKind::kSwiGLU : e.c.activation;
  TensorRef g = e.apply(e.linear(prefix + ".gate", ffn, e.c.hidden, false), h);
  TensorRef u = e.apply(e.linear(prefix + ".up", ffn, e.c.hidden, false), h);
  return e.apply(e.linear(prefix + ".down", e.c.hidden, ffn, false), e.b.glu(g, u, kind));
}

TensorRef moe_ffn(Emit& e, int64_t layer, TensorRef h) {
  const ModelConfig& c = e.c;
  ProgramBuilder& b = e.b;
  TensorRef rw = e.constant(layer_name(layer, "router.weight"), e.act, {c.experts, c.hidden});
  TensorRef rb = c.router_bias ? e.constant(layer_name(layer, "router.bias"), e.act, {c.experts}) : TensorRef{};
  RouterSpec spec;
  spec.kind = c.router;
  spec.k = static_cast<int>(c.top_k);
  spec.renormalize = c.renormalize;
  spec.n_group = c.n_group;
  spec.topk_group = c.topk_group;
  spec.routed_scaling_factor = c.routed_scaling_factor;
  const std::vector<uint8_t> bits = layer_expert_bits(c, e.f, layer);
  for (size_t i = 0; i < bits.size(); ++i)
    if (bits[i] == 0) spec.pruned_experts.push_back(static_cast<int32_t>(i));
  if (c.selection_bias)
    spec.selection_bias = e.constant(layer_name(layer, "router.selection_bias"), DType::kF32, {c.experts});
  RouterOut r = b.router(b.matmul(h, rw, true, rb), spec);
  TensorRef shared, shared_gate;
  if (c.shared_ffn > 0) shared = dense_ffn(e, layer_name(layer, "shared"), c.shared_ffn, h);
  if (c.shared_gate) shared_gate = b.matmul(h, e.constant(layer_name(layer, "shared_gate.weight"), e.act, {1, c.hidden}));
  MoeExperts x{e.experts(layer, "gate", c.expert_ffn, c.hidden), e.experts(layer, "up", c.expert_ffn, c.hidden),
               e.experts(layer, "down", c.hidden, c.expert_ffn)};
  x.sort_cutoff = c.sort_cutoff;
  x.activation = c.activation;
  x.alpha = c.glu_alpha;
  x.limit = c.glu_limit;
  if (c.expert_bias) {
    const double read = static_cast<double>(c.top_k) / static_cast<double>(c.experts);
    x.gate_bias = e.constant(layer_name(layer, "experts.gate.bias"), e.act, {c.experts, c.expert_ffn}, read);
    x.up_bias = e.constant(layer_name(layer, "experts.up.bias"), e.act, {c.experts, c.expert_ffn}, read);
    x.down_bias = e.constant(layer_name(layer, "experts.down.bias"), e.act, {c.experts, c.hidden}, read);
  }
  return b.moe_experts(h, r.weights, r.indices, x, shared, shared_gate);
}

Status emit_decoder(const ModelConfig& c, const ExportFormat& f, ProgramBuilder& b, std::vector<WeightSpec>* specs) {
  SB_RETURN_IF_ERROR(check_config(c));
  SB_RETURN_IF_ERROR(check_format(c, f));
  Emit e{c, f, b, specs, f.activation_dtype()};
  Step s;
  s.tokens = b.input("tokens", DType::kI32, {Dim::dynamic(1, c.max_seq)});
  s.m = b.size(s.tokens, 0);
  s.pos = b.input_value("pos");
  const int64_t half = c.rotary_dims() / 2;
  s.cos = e.constant("rope.cos", DType::kF32, {c.max_seq, half}, 0.0);
  s.sin = e.constant("rope.sin", DType::kF32, {c.max_seq, half}, 0.0);

  TensorRef embed = e.constant("embed", f.dtype, {c.vocab, c.hidden}, 0.0);
  e.decode_bytes += static_cast<double>(c.hidden * static_cast<int64_t>(dtype_size(f.dtype)));  // one row
  TensorRef x = b.gather_rows(embed, s.tokens);
  if (f.dtype != e.act) x = b.cast(x, e.act);
  // Each residual add is fused with the norm after it (the next layer's, or the final norm,
  // which normalizes every row: a row's bits do not depend on the others).
  TensorRef h = e.norm(x, layer_name(0, "attn_norm"), c.hidden);
  for (int64_t i = 0; i < c.layers; ++i) {
    auto scope = b.tmp_scope();
    const bool linear = !c.linear_layer.empty() && c.linear_layer[static_cast<size_t>(i)];
    TensorRef mixed = linear ? linear_attention(e, s, i, h) : attention(e, s, i, h);
    ProgramBuilder::AddNorm an = e.add_norm(x, mixed, layer_name(i, "ffn_norm"), c.hidden);
    TensorRef y = c.moe_layer[static_cast<size_t>(i)] ? moe_ffn(e, i, an.out)
                                                      : dense_ffn(e, layer_name(i, "mlp"), c.dense_ffn, an.out);
    an = e.add_norm(an.sum, y, i + 1 < c.layers ? layer_name(i + 1, "attn_norm") : "final_norm", c.hidden);
    x = scope.keep(an.sum);
    h = scope.keep(an.out);
  }
  TensorRef last = b.slice(h, 0, b.sub_int(s.m, 1), s.m);
  TensorRef logits;
  if (c.tie_embeddings && !f.quantized() && f.dtype == e.act) {
    logits = b.matmul(last, embed);
    e.decode_bytes += static_cast<double>(c.vocab * c.hidden * static_cast<int64_t>(dtype_size(f.dtype)));
  } else {
    logits = e.apply(e.linear("lm_head", c.vocab, c.hidden, false), last);
  }
  if (e.act != DType::kF32) logits = b.cast(logits, DType::kF32);
  b.output("logits", logits);
  b.output("next_token", b.argmax(logits, 1));
  b.set_attribute("model.max_seq", c.max_seq);
  b.set_attribute("model.vocab", c.vocab);
  b.set_attribute("model.layers", c.layers);
  b.set_attribute("model.decode_weight_bytes", static_cast<int64_t>(e.decode_bytes));
  // KV-cache bytes one decode step reads per cached position (keys and values, all layers).
  int64_t attention_layers = 0;
  for (int64_t i = 0; i < c.layers; ++i)
    attention_layers += c.linear_layer.empty() || !c.linear_layer[static_cast<size_t>(i)];
  b.set_attribute("model.kv_bytes_per_position",
                  2 * attention_layers * c.kv_heads * c.head_dim * static_cast<int64_t>(dtype_size(e.act)));
  return b.status();
}

}  // namespace

int64_t ModelConfig::rotary_dims() const {
  int64_t r = static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary);
  return r - r % 2;
}

Status build_decoder(const ModelConfig& c, const ExportFormat& f, ProgramBuilder& b) {
  return emit_decoder(c, f, b, nullptr);
}

std::vector<WeightSpec> weight_specs(const ModelConfig& c, const ExportFormat& f) {
  std::vector<WeightSpec> specs;
  ProgramBuilder scratch;
  (void)emit_decoder(c, f, scratch, &specs);
  return specs;
}

std::vector<uint8_t> layer_expert_bits(const ModelConfig& c, const ExportFormat& f, int64_t layer) {
  auto it = f.expert_bits.find(layer);
  if (it == f.expert_bits.end() || it->second.empty()) return {};
  std::vector<uint8_t> bits(static_cast<size_t>(c.experts), static_cast<uint8_t>(f.bits));
  for (const auto& [expert, b] : it->second)
    if (expert >= 0 && expert < c.experts) bits[static_cast<size_t>(expert)] = static_cast<uint8_t>(b);
  return bits;
}

}  // namespace switchboard::models
