// ProgramBuilder: emits ops into instruction chains and serializes a program.
//
//   ProgramBuilder b;
//   auto x = b.input("x", DType::kF32, {Dim::dynamic(1, 512), 64});
//   auto w = b.constant("w", DType::kF32, {128, 64});
//   b.output("y", b.matmul(x, w));                 // y = x @ w^T
//   auto bytes = b.serialize();                      // validated program file
//
// Errors are sticky: the first misuse is recorded, later calls return invalid
// refs, and serialize()/status() report it. Nothing throws.
//
// Integer helpers (size, add_int, ..., product) fold literals at build time,
// so a static shape produces no runtime scalar ops; emit_if_else with a
// literal condition emits only the chosen branch, inline, with no If node.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "switchboard/dtype.h"
#include "switchboard/status.h"
#include "switchboard/tensor.h"

namespace switchboard {

// One dimension of a declared shape: static, or dynamic within [min, max].
struct Dim {
  int64_t size = -1;  // -1: dynamic
  int64_t min = 0;
  int64_t max = -1;   // -1: unbounded
  Dim(int64_t s) : size(s) {}  // NOLINT: static dims read naturally as ints
  static Dim dynamic(int64_t min = 0, int64_t max = -1) {
    Dim d(-1);
    d.min = min;
    d.max = max;
    return d;
  }
  bool is_static() const { return size >= 0; }
};

struct TensorRef {
  uint32_t id = UINT32_MAX;
  bool valid() const { return id != UINT32_MAX; }
};

// An integer known at build time, or a runtime host value.
class IntOrValue {
 public:
  IntOrValue(int64_t literal) : literal_(literal) {}  // NOLINT: literals convert implicitly
  static IntOrValue value(uint32_t vid) {
    IntOrValue v(0);
    v.vid_ = vid;
    v.is_literal_ = false;
    return v;
  }
  bool is_literal() const { return is_literal_; }
  int64_t literal() const { return literal_; }
  uint32_t vid() const { return vid_; }

 private:
  int64_t literal_ = 0;
  uint32_t vid_ = UINT32_MAX;
  bool is_literal_ = true;
};

struct BuilderState;

// --- mixture-of-experts descriptions (semantics: schema/program.fbs) ---------

enum class RouterKind { kSoftmaxTopK, kTopKSoftmax, kSigmoidGroupedTopK };
struct RouterSpec {
  RouterKind kind = RouterKind::kSoftmaxTopK;
  int k = 1;
  bool renormalize = false;
  int n_group = 1, topk_group = 1;      // kSigmoidGroupedTopK
  float routed_scaling_factor = 1.0f;   // kSigmoidGroupedTopK
  TensorRef selection_bias;             // [E] f32, kSigmoidGroupedTopK
  TensorRef expert_scale;               // [E] f32, optional
  std::vector<int32_t> pruned_experts;  // never selected
};
struct RouterOut {
  TensorRef weights;  // [T, k] f32
  TensorRef indices;  // [T, k] i32
};

enum class GluKind { kSwiGLU, kGEGLU, kClampedSwiGLU };

// One projection of quantized experts in MLX's affine format. With no scales, `w` holds
// float experts [E, N, K] instead (GatherMm).
struct QuantizedExperts {
  TensorRef w, scales, biases;
  int bits = 4;                      // when every expert shares a width
  int group_size = 64;
  std::vector<uint8_t> expert_bits;  // per expert (0 = pruned); overrides bits
};

struct GatherOptions {
  TensorRef lhs_indices, rhs_indices;
  IntOrValue sorted_indices = 0;
  TensorRef combine_weights, shared, shared_gate;  // fused down-projection + combine
};

// A routed-experts FFN: out = combine(down(act(gate(x), up(x)))).
struct MoeExperts {
  QuantizedExperts gate, up, down;
  GluKind activation = GluKind::kSwiGLU;
  float alpha = 1.702f, limit = 7.0f;  // kClampedSwiGLU
  TensorRef gate_bias, up_bias, down_bias;  // optional [E, N] per-expert biases (gpt-oss)
  // M > sort_cutoff tokens take the sorted path (<= 0: always); see bench/RESULTS.md.
  int64_t sort_cutoff = 4;
};

class ProgramBuilder {
 public:
  ProgramBuilder();
  ~ProgramBuilder();
  ProgramBuilder(const ProgramBuilder&) = delete;
  ProgramBuilder& operator=(const ProgramBuilder&) = delete;

  // --- declarations ---------------------------------------------------------
  TensorRef input(const std::string& name, DType dtype, const std::vector<Dim>& shape);
  IntOrValue input_value(const std::string& name);
  TensorRef constant(const std::string& name, DType dtype, const Shape& shape);
  TensorRef mutable_buffer(const std::string& name, DType dtype, const Shape& shape);
  void output(const std::string& name, TensorRef t);
  void output_value(const std::string& name, IntOrValue v);
  void set_attribute(const std::string& name, int64_t value);

  // --- tensor ops (semantics: schema/program.fbs) ---------------------------
  TensorRef add(TensorRef a, TensorRef b);
  TensorRef sub(TensorRef a, TensorRef b);
  TensorRef mul(TensorRef a, TensorRef b);
  TensorRef div(TensorRef a, TensorRef b);
  TensorRef maximum(TensorRef a, TensorRef b);
  TensorRef minimum(TensorRef a, TensorRef b);
  TensorRef neg(TensorRef x);
  TensorRef abs(TensorRef x);
  TensorRef square(TensorRef x);
  TensorRef relu(TensorRef x);
  // The exact routines of docs/numerics.md, elementwise (float tensors).
  TensorRef exp(TensorRef x);
  TensorRef rcp(TensorRef x);
  TensorRef rsqrt(TensorRef x);
  TensorRef sigmoid(TensorRef x);
  TensorRef silu(TensorRef x);
  TensorRef tanh(TensorRef x);
  TensorRef gelu_tanh(TensorRef x);
  // x > 20 ? x : log1p(exp(x)) (PyTorch's softplus).
  TensorRef softplus(TensorRef x);
  // Along the last axis.
  TensorRef softmax(TensorRef x);
  // x * rsqrt(mean(x^2) + eps) * weight along the last axis (weight: [d]).
  TensorRef rms_norm(TensorRef x, TensorRef weight, float eps = 1e-6f);
  // RMSNorm in order Tree32 (the sum of squares as dot32) of s = x + residual, or of x when
  // residual is not given: {s, normalized s}. One kernel for a residual add and the next norm.
  struct AddNorm {
    TensorRef sum, out;
  };
  AddNorm add_rms_norm(TensorRef x, TensorRef residual, TensorRef weight, float eps);
  // Attention over a KV cache (schema AttentionNode, order Blocked32): q [m, hq, hd] against
  // keys 0..pos+m-1 of k_cache / v_cache [hk, S, hd] -> [m, hq * hd]; query i sees keys up to
  // pos + i (and, window > 0, the last `window` of them); sinks [hq] optional; seq_major:
  // caches [S, hk, hd] (a step's keys are one contiguous slice).
  TensorRef attention(TensorRef q, TensorRef k_cache, TensorRef v_cache, IntOrValue pos, float scale,
                      int64_t window = 0, TensorRef sinks = {}, bool seq_major = false);
  // The same in the decomposed ops' order (schema v5's only order): scale and mask_value as
  // given (rounded to q's dtype they give the bits of BatchMatmul, Mul, Add, Softmax, ...).
  TensorRef attention_decomposed_order(TensorRef q, TensorRef k_cache, TensorRef v_cache, IntOrValue pos, float scale,
                                       float mask_value, int64_t window = 0, TensorRef sinks = {});
  // Rotary embedding (schema RopeNode) of x [m, h, hd] at positions pos .. pos + m - 1 from f32
  // tables cos / sin [S, half]: the first 2 * half dims of each head rotated, the rest kept.
  // norm_weight [hd]: each head RMSNorm'd (order Tree32, eps) first; cache [S, h, hd]: the
  // result also written to its rows pos .. pos + m - 1.
  TensorRef rope(TensorRef x, TensorRef cos, TensorRef sin, IntOrValue pos, TensorRef norm_weight = {},
                 float eps = 1e-6f, TensorRef cache = {});
  // The fused q/k/v form (schema v8): x [m, H, hd] holds [q_heads queries | H - q_heads - 2 k_heads
  // not read | k_heads keys | k_heads values] (one projection's output); returns the queries as
  // rope() does (q_norm), writes the keys (k_norm, rotated) to k_cache and the values to v_cache,
  // both [S, k_heads, hd], rows pos .. pos + m - 1.
  TensorRef rope_qkv(TensorRef x, TensorRef cos, TensorRef sin, IntOrValue pos, int64_t q_heads, int64_t k_heads,
                     TensorRef k_cache, TensorRef v_cache, TensorRef q_norm = {}, TensorRef k_norm = {},
                     float eps = 1e-6f);
  // --- linear attention (Gated DeltaNet; schema v7) ---------------------------
  // RMSNorm (order Tree32) of x [..., d] times weight [d], times silu(gate) (gate: x's shape).
  TensorRef gated_rms_norm(TensorRef x, TensorRef gate, TensorRef weight, float eps);
  // Causal depthwise conv1d of x [m, C] with weight [C, K] over the rows, the K - 1 rows
  // before row 0 kept in state [K - 1, C] (a mutable buffer; pos == 0: zeros), then SiLU.
  TensorRef causal_conv1d(TensorRef x, TensorRef weight, TensorRef state, IntOrValue pos, bool silu = true);
  // The gated delta rule (schema GatedDeltaRuleNode) of qkv [m, 2 hk dk + hv dv] with gates
  // a, b [m, hv], a_log, dt_bias [hv] and state [hv, dk, dv] f32 (a mutable buffer; pos == 0:
  // zeros) -> [m, hv, dv], token by token.
  TensorRef gated_delta_rule(TensorRef qkv, TensorRef a, TensorRef b, TensorRef a_log, TensorRef dt_bias,
                             TensorRef state, IntOrValue pos, float scale, bool l2norm = true);
  TensorRef cast(TensorRef x, DType dtype);
  TensorRef reshape(TensorRef x, const std::vector<IntOrValue>& shape);
  TensorRef slice(TensorRef x, int axis, IntOrValue start, IntOrValue stop);
  TensorRef concat(const std::vector<TensorRef>& xs, int axis);
  // out = a @ b^T (+ bias) when transpose_b, else a @ b (+ bias).
  TensorRef matmul(TensorRef a, TensorRef b, bool transpose_b = true, TensorRef bias = {});
  // a [Ba, M, K] @ b [Bb, N, K]^T (or b [Bb, K, N]) -> [Ba, M, N]; Ba a multiple of Bb
  // (grouped-query attention: a's batch i uses b's batch i / (Ba / Bb)).
  TensorRef batch_matmul(TensorRef a, TensorRef b, bool transpose_b = true);
  // out's axis a is x's axis perm[a].
  TensorRef transpose(TensorRef x, const std::vector<int>& perm);
  TensorRef sum(TensorRef x, int axis, bool keepdims = false);
  TensorRef mean(TensorRef x, int axis, bool keepdims = false);
  TensorRef max(TensorRef x, int axis, bool keepdims = false);
  TensorRef min(TensorRef x, int axis, bool keepdims = false);
  TensorRef argmax(TensorRef x, int axis, bool keepdims = false);
  TensorRef copy(TensorRef x);
  // dst = src (dst: a mutable buffer, or a temp); persists when dst is a buffer.
  void assign(TensorRef dst, TensorRef src);
  // dst[..., start:start+len, ...] = update, in place.
  void slice_update(TensorRef dst, TensorRef update, int axis, IntOrValue start);

  TensorRef floordiv(TensorRef a, TensorRef b);  // integer tensors
  TensorRef full(const std::vector<IntOrValue>& shape, DType dtype, double value);

  // --- mixture of experts -----------------------------------------------------
  RouterOut router(TensorRef logits, const RouterSpec& spec);
  TensorRef gather_qmm(TensorRef x, const QuantizedExperts& w, const GatherOptions& options = {});
  TensorRef gather_mm(TensorRef x, TensorRef w, const GatherOptions& options = {});
  TensorRef argsort(TensorRef x);
  TensorRef gather_rows(TensorRef x, TensorRef indices);
  TensorRef scatter_rows(TensorRef x, TensorRef indices);
  TensorRef glu(TensorRef gate, TensorRef up, GluKind kind, float alpha = 1.702f, float limit = 7.0f);
  TensorRef combine(TensorRef y, TensorRef weights, TensorRef shared = {}, TensorRef shared_gate = {});
  // x: [T, D]; weights, indices: a router's [T, k] outputs -> [T, D]. Emits
  // If(M > sort_cutoff) -> sorted path (argsort, grouped GatherQmm over expert
  // runs, scatter, combine) else unsorted path (direct GatherQmm, fused
  // down-projection + combine); a static M folds to one path, no If node.
  TensorRef moe_experts(TensorRef x, TensorRef weights, TensorRef indices, const MoeExperts& experts,
                        TensorRef shared = {}, TensorRef shared_gate = {});

  // --- fold-aware integer helpers ---------------------------------------------
  IntOrValue size(TensorRef x, int axis);  // literal when the dim is static
  IntOrValue add_int(IntOrValue a, IntOrValue b);
  IntOrValue sub_int(IntOrValue a, IntOrValue b);
  IntOrValue mul_int(IntOrValue a, IntOrValue b);
  IntOrValue floordiv_int(IntOrValue a, IntOrValue b);
  IntOrValue max_int(IntOrValue a, IntOrValue b);
  IntOrValue product(const std::vector<IntOrValue>& xs);

  // --- control flow -----------------------------------------------------------
  using Branch = std::function<std::vector<TensorRef>()>;
  // cond literal: runs the chosen branch inline (no If node). Otherwise emits
  // each branch into its own chain plus an If node; both branches' results are
  // placed in the same slots, which are returned.
  std::vector<TensorRef> emit_if_else(IntOrValue cond, const Branch& then_branch, const Branch& else_branch);

  // Runs `fn` with emission redirected to the init chain, which a session runs
  // once at creation and on reset(), e.g. to fill tables into mutable buffers.
  void emit_init(const std::function<void()>& fn);

  // --- temporaries ------------------------------------------------------------
  // Temps created while a scope is open return their slot to a free pool when
  // it closes; keep() hands one to the enclosing scope instead.
  class TmpScope {
   public:
    ~TmpScope();
    TmpScope(TmpScope&& o) noexcept : b_(o.b_), level_(o.level_) { o.b_ = nullptr; }
    TensorRef keep(TensorRef t);
    TmpScope(const TmpScope&) = delete;
    TmpScope& operator=(const TmpScope&) = delete;
    TmpScope& operator=(TmpScope&&) = delete;

   private:
    friend class ProgramBuilder;
    TmpScope(ProgramBuilder* b, size_t level) : b_(b), level_(level) {}
    ProgramBuilder* b_;
    size_t level_;
  };
  TmpScope tmp_scope();

  // --- introspection and output -------------------------------------------
  DType dtype(TensorRef t) const;
  std::vector<Dim> shape(TensorRef t) const;
  const Status& status() const;
  // Coalesces slot ids, validates, and returns the program file bytes.
  Result<std::vector<uint8_t>> serialize() const;
  // serialize() written to `path` atomically (temp file + rename). With `weights_path`, the
  // header also records that weights file (size, header hash, content hash), so a load
  // with any other file fails and `inspect --verify` can check every byte.
  Status save(const std::string& path, const std::string& weights_path = {}) const;

 private:
  std::unique_ptr<BuilderState> s_;
};

}  // namespace switchboard
