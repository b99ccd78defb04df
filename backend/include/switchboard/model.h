// MoE decoder language models: a config (parsed from a Hugging Face config.json or
// made in code) becomes one program that serves prefill (M tokens) and decode (M = 1).
//
//   auto cfg = models::parse_hf_config("model/config.json");
//   models::ExportFormat fmt;            // f32 weights; or fmt.bits = 4 for 4-bit linears
//   ProgramBuilder b;
//   models::build_decoder(*cfg, fmt, b); // constants named as models::WeightNames says
//
// Program interface: input "tokens" i32 [M] (1 <= M <= max_seq), input value "pos" (the
// position of tokens[0]; the KV cache holds positions < pos); outputs "logits" f32
// [1, vocab] (the last position only) and "next_token" i32 [1] (its argmax, first on
// ties). The caller keeps pos + M <= max_seq; SliceUpdate refuses anything beyond.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "switchboard/builder.h"
#include "switchboard/dtype.h"
#include "switchboard/status.h"
#include "switchboard/switchboard.h"
#include "switchboard/tensor.h"

namespace switchboard::models {

enum class QkNorm { kNone, kPerHead, kWhole };  // whole: over the full q/k projection (olmoe)

struct ModelConfig {
  std::string origin;  // where it was read (config.json's path), named by check_config's errors
  std::string family;  // HF model_type: qwen3_moe, qwen2_moe, mixtral, olmoe, glm4_moe, gpt_oss, qwen3_next,
                       // qwen3_5_moe_text (qwen3_5_moe's text model)
  int64_t vocab = 0, hidden = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0;
  float rms_eps = 1e-6f;
  int64_t max_seq = 4096;  // KV cache length

  // Attention.
  double rope_theta = 10000.0;
  double partial_rotary = 1.0;  // rotary dims = head_dim * partial_rotary (the rest pass through)
  bool yarn = false;            // YaRN frequencies (gpt-oss)
  double yarn_factor = 1.0, yarn_beta_fast = 32.0, yarn_beta_slow = 1.0, yarn_attention_factor = 1.0;
  int64_t yarn_original_max = 4096;
  bool yarn_truncate = true;
  QkNorm qk_norm = QkNorm::kNone;
  bool qkv_bias = false, o_bias = false;
  bool attn_sinks = false;               // a learned per-head logit joins each softmax (gpt-oss)
  std::vector<int64_t> sliding_window;   // per layer; 0 = full causal attention

  // Feed-forward.
  std::vector<bool> moe_layer;           // per layer: routed experts, else a dense SwiGLU FFN
  int64_t dense_ffn = 0;                 // intermediate size of the dense layers
  int64_t experts = 0, top_k = 0, expert_ffn = 0;
  RouterKind router = RouterKind::kSoftmaxTopK;
  bool renormalize = false;
  int n_group = 1, topk_group = 1;
  float routed_scaling_factor = 1.0f;
  bool selection_bias = false;  // DeepSeek-V3 e_score_correction_bias
  bool router_bias = false;     // gpt-oss
  int64_t shared_ffn = 0;       // shared expert intermediate size (0: none)
  bool shared_gate = false;     // sigmoid(x . w) scales the shared expert (qwen2_moe)
  GluKind activation = GluKind::kSwiGLU;
  float glu_alpha = 1.702f, glu_limit = 7.0f;
  bool expert_bias = false;     // gpt-oss
  bool tie_embeddings = false;

  // Hybrid models (qwen3_next, qwen3_5_moe): per layer, Gated DeltaNet linear attention
  // (lin_*: key/value heads and their sizes, the conv width) instead of softmax attention.
  std::vector<bool> linear_layer;
  int64_t lin_k_heads = 0, lin_v_heads = 0, lin_k_dim = 0, lin_v_dim = 0, lin_conv = 0;
  bool lin_grouped = false;              // qwen3_next: in_proj_qkvz / in_proj_ba rows grouped by key head
  bool norm_plus_one = false;            // RMSNorm weights are zero-centred: x-hat * (1 + w)
  bool attn_output_gate = false;         // q_proj also yields a per-head gate: o * sigmoid(gate)
  std::string weight_prefix = "model.";  // the text model's tensors (qwen3_5_moe: model.language_model.)
  int64_t sort_cutoff = 4;               // prefills of more rows take the sorted expert path
  int64_t lin_conv_dim() const { return 2 * lin_k_heads * lin_k_dim + lin_v_heads * lin_v_dim; }

  // An MLX-quantized checkpoint (config "quantization"): its default width and group.
  bool mlx_quantized = false;
  int mlx_bits = 0, mlx_group_size = 0;

  // One projection for q, k and v ("layers.<i>.attn.qkv": rows [q | gate | k | v], the gated q's
  // query rows of every head before its gate rows) and one Rope op for all three; off for whole-
  // width q/k norms (OLMoE), MLX checkpoints whose q, k and v widths differ and layers whose
  // ExportFormat::linear_quant widths differ.
  bool fuse_qkv = true;
  bool qkv_fused() const { return fuse_qkv && qk_norm != QkNorm::kWhole; }

  int64_t rotary_dims() const;
};

// Reads a Hugging Face config.json (transformers 4.x and 5.x spellings). Errors name
// the file and the key, e.g. "cfg.json: num_attention_heads: missing".
Result<ModelConfig> parse_hf_config(const std::string& path);
Result<ModelConfig> parse_hf_config_text(const std::string& text, const std::string& origin);
// Checks sizes and combinations the builder needs (heads divide, experts >= top_k, ...).
Status check_config(const ModelConfig& c);

// How the linear weights are stored.
struct ExportFormat {
  DType dtype = DType::kF32;  // float weights, embeddings and norms
  int bits = 0;               // 0: float linears; else MLX affine, every linear
  int group_size = 64;
  // Where bits and group_size came from, for errors: empty, the export flags (--bits,
  // --group-size); else a config.json whose "quantization" set them.
  std::string quant_origin;
  DType scale_dtype = DType::kBF16;
  // layer -> expert -> bits (0 = pruned); experts not named use `bits`.
  std::map<int64_t, std::map<int64_t, int>> expert_bits;
  // Per linear (logical name, e.g. "layers.3.attn.q", "layers.3.experts.down", "lm_head"):
  // {bits, group_size}, bits 0 = kept in float. MLX checkpoints mix widths this way.
  std::map<std::string, std::pair<int, int>> linear_quant;
  bool quantized() const { return bits != 0; }
  // {bits, group_size} of one linear (bits 0: float).
  std::pair<int, int> quant_of(const std::string& linear) const {
    auto it = linear_quant.find(linear);
    return it != linear_quant.end() ? it->second : std::pair<int, int>{bits, group_size};
  }
  DType activation_dtype() const { return bits != 0 ? DType::kF32 : dtype; }
};
Status check_format(const ModelConfig& c, const ExportFormat& f);

// Per-expert bit widths of a layer's experts (empty: all use f.bits).
std::vector<uint8_t> layer_expert_bits(const ModelConfig& c, const ExportFormat& f, int64_t layer);

// Emits the whole decoder into `b` (inputs, mutable KV caches, constants, outputs).
Status build_decoder(const ModelConfig& c, const ExportFormat& f, ProgramBuilder& b);

// A named constant the program reads, with the dtype and shape it must have.
struct WeightSpec {
  std::string name;
  DType dtype;
  Shape shape;
};
// Every constant build_decoder declares, in declaration order.
std::vector<WeightSpec> weight_specs(const ModelConfig& c, const ExportFormat& f);

// The RoPE tables the program reads: "rope.cos" / "rope.sin" f32 [max_seq, rotary/2]
// (HF's frequencies, incl. YaRN).
Result<std::vector<std::pair<std::string, Tensor>>> rope_tables(const ModelConfig& c);

// --- export ---------------------------------------------------------------------------
struct ExportOptions {
  ExportFormat format;
  int64_t max_seq = 0;  // 0: the config's (max_position_embeddings, at most 4096)
  // Called as weights are converted (done <= total); e.g. a progress bar.
  std::function<void(size_t done, size_t total)> progress;
};

// Reads a bit map JSON {"layer": {"expert": bits}} (0 = pruned) into f.expert_bits.
Status read_bit_map(const std::string& path, ExportFormat* f);
Status parse_bit_map(const std::string& text, const std::string& origin, ExportFormat* f);

// A Hugging Face checkpoint directory (config.json + *.safetensors, f32/f16/bf16, or
// MLX-quantized with a "quantization" entry) -> out_dir/program.sbp +
// out_dir/weights.safetensors. Errors name the file and the tensor; on any error
// nothing is left in out_dir.
Status export_hf(const std::string& hf_dir, const std::string& out_dir, const ExportOptions& o);

// Receives each constant of a program once, in any order; the tensor may be released as
// soon as the call returns.
using WeightSink = std::function<Status(const std::string& name, const Tensor& t)>;
// Produces every constant of a model through the sink it is given, one at a time.
using WeightSource = std::function<Status(const WeightSink& sink)>;
// All of a source's constants in memory (small models and tests).
Result<std::vector<std::pair<std::string, Tensor>>> collect_weights(const WeightSource& source);

// Writes a built decoder and its weights to out_dir (program.sbp, weights.safetensors)
// through this run's own staging directory beside it, checked to load before anything
// lands: out_dir never holds a partial model, and of concurrent exports to one out_dir one
// places both files and the others fail (kFailedPrecondition) without touching them.
// Weights are written as the source makes them (memory holds one at a time); the program
// header records the weights file's size and hashes (LoadOptions, `inspect --verify`).
Status write_model(const std::string& out_dir, const ModelConfig& c, const ExportFormat& f,
                   const WeightSource& weights);
Status write_model(const std::string& out_dir, const ModelConfig& c, const ExportFormat& f,
                   const std::vector<std::pair<std::string, Tensor>>& weights);

// The deterministic random model of `switchboard export --tiny-test`: vocab 256, hidden
// 128, 4 layers, 8 experts top-2, expert FFN 128, a sigmoid-gated shared expert of 128.
// family "qwen3_5_moe": the tiny Qwen3.5 hybrid instead (3 Gated DeltaNet layers and one
// gated full-attention layer; prompts of more than 3 tokens take the sorted expert path).
ModelConfig tiny_test_config();
Result<ModelConfig> tiny_test_config(const std::string& family);
// Random weights for any config (seeded; scaled so logits are O(1)): the tiny test
// model and the synthetic benchmark models.
Status random_weights(const ModelConfig& c, const ExportFormat& f, uint64_t seed, const WeightSink& sink);
Result<std::vector<std::pair<std::string, Tensor>>> random_weights(const ModelConfig& c, const ExportFormat& f,
                                                                  uint64_t seed);

// Benchmark-scale shapes made without a download: "qwen3-30b-a3b" (48 layers, 128
// experts top-8; max_seq 1024), "qwen3.5-35b-a3b" (40 layers, 3 of 4 Gated DeltaNet, 256
// experts top-8, shared expert; vocab 248,320). synthetic_weights writes random codes and plausible
// scales directly (seconds, not hours), for speed measurements only.
Result<ModelConfig> synthetic_config(const std::string& shape);
Status synthetic_weights(const ModelConfig& c, const ExportFormat& f, uint64_t seed,
                         const std::function<void(size_t, size_t)>& progress, const WeightSink& sink);

// --- generation ---------------------------------------------------------------------
struct Generation {
  std::vector<int32_t> tokens;  // greedy tokens, one per step
  std::vector<Tensor> logits;   // f32 [1, vocab] per step, when asked for
  double prefill_seconds = 0, decode_seconds = 0;  // wall time of the prefill and of all decode steps
  double prefill_device_us = 0, decode_device_us = 0;  // GPU time (device timestamps); -1 on the CPU
  double decode_record_us = 0;                         // host time recording the decode steps' GPU work; -1 on the CPU
  double prefill_record_us = 0;                        // ... and the prefill's
  uint64_t decode_allocations = 0;                     // tensor buffers the decode steps took from the system allocator
  double decode_kernel_us = 0;  // host time inside the decode steps' op kernels (Session::last_kernel_time_us)
  uint64_t prefill_dispatches = 0, decode_dispatches = 0;  // GPU kernel dispatches (0 on the CPU)
  int64_t decode_replays = 0;  // decode steps that replayed recorded work (SessionOptions::gpu_replay)
};
// Greedy decoding from `prompt` on a session of a build_decoder program: one prefill
// execute, then one execute per further token. With `forced`, step i feeds forced[i]
// instead of its own choice (teacher forcing, so a comparison never cascades). The
// session is reset first.
Result<Generation> generate(Session& session, const std::vector<int32_t>& prompt, int64_t new_tokens,
                            bool keep_logits, const std::vector<int32_t>* forced = nullptr);

}  // namespace switchboard::models
