#include "op_rules.h"

#include <algorithm>
#include <set>

#include "quantize.h"

namespace switchboard::ops {
namespace {

Status error(const std::string& path, const std::string& what) {
  return Status(StatusCode::kInvalidProgram, path + ": " + what);
}

template <class E>
bool enum_ok(E v, E max) {
  return static_cast<int>(v) >= 0 && static_cast<int>(v) <= static_cast<int>(max);
}

// One instruction's rules over its slots' declarations.
class Rules {
 public:
  explicit Rules(const SlotDecls& decls) : decls_(decls) {}
  Status check_op(const fb::OpNodeUnion& op, const std::string& path) const;

 private:
  Status check_moe_op(const fb::OpNodeUnion& op, const std::string& path) const;
  Status check_gather_qmm(const fb::GatherQmmNodeT& n, const std::string& path) const;
  Status check_router(const fb::RouterNodeT& n, const std::string& path) const;
  Status check_attention(const fb::AttentionNodeT& n, const std::string& path) const;
  Status check_rope_qkv(const fb::RopeNodeT& n, const std::string& path) const;
  Status check_causal_conv1d(const fb::CausalConv1dNodeT& n, const std::string& path) const;
  Status check_gated_delta_rule(const fb::GatedDeltaRuleNodeT& n, const std::string& path) const;
  // A static dim of `t` equal to `want` (when both are static), else the error names path.
  Status dim_is(const fb::Tid* t, size_t i, int64_t want, const std::string& path, const char* what) const {
    if (dim(t, i) < 0 || want < 0 || dim(t, i) == want) return Status::ok();
    return error(path, strformat("dim %zu is %lld, %s is %lld", i, (long long)dim(t, i), what, (long long)want));
  }

  DType dt(const fb::Tid* t) const { return decls_(t).dtype; }
  size_t rank(const fb::Tid* t) const { return decls_(t).dims.size(); }
  // A static dim's size, or -1 when dynamic.
  int64_t dim(const fb::Tid* t, size_t i) const { return decls_(t).dims[i]; }
  bool is_float(const fb::Tid* t) const { return dtype_is_float(dt(t)); }
  Status same_dtype(const fb::Tid* a, const fb::Tid* b, const std::string& path, const char* fa,
                    const char* fb_) const {
    if (dt(a) != dt(b))
      return error(path,
                   strformat("dtype of %s (%s) differs from %s (%s)", fa, dtype_name(dt(a)), fb_, dtype_name(dt(b))));
    return Status::ok();
  }
  Status expect(bool ok, const std::string& path, const std::string& what) const {
    return ok ? Status::ok() : error(path, what);
  }
  Status index_vector(const fb::Tid* t, const std::string& path) const {
    if (!t) return Status::ok();
    return expect(dt(t) == DType::kI32 && rank(t) == 1, path, "must be a 1-D i32 tensor");
  }

  const SlotDecls& decls_;
};

// Rope's fused q/k/v form (schema v8): k_heads > 0 needs q_heads >= 1, both caches, x holding them all.
Status Rules::check_rope_qkv(const fb::RopeNodeT& n, const std::string& path) const {
  if (n.k_heads == 0) {
    SB_RETURN_IF_ERROR(expect(n.q_heads == 0, path + ".q_heads", "is set only with k_heads"));
    SB_RETURN_IF_ERROR(expect(!n.k_norm_weight, path + ".k_norm_weight", "is given only with k_heads"));
    return expect(!n.v_cache, path + ".v_cache", "is given only with k_heads");
  }
  SB_RETURN_IF_ERROR(expect(n.k_heads > 0 && n.k_heads <= (int64_t{1} << 20), path + ".k_heads",
                            strformat("%lld is outside [0, 2^20]", (long long)n.k_heads)));
  SB_RETURN_IF_ERROR(expect(n.q_heads > 0 && n.q_heads <= (int64_t{1} << 20), path + ".q_heads",
                            strformat("%lld is outside [1, 2^20]", (long long)n.q_heads)));
  SB_RETURN_IF_ERROR(expect(n.cache && n.v_cache, path + ".v_cache", "k_heads needs cache and v_cache"));
  SB_RETURN_IF_ERROR(same_dtype(n.x.get(), n.v_cache.get(), path, "x", "v_cache"));
  SB_RETURN_IF_ERROR(expect(rank(n.v_cache.get()) == 3, path + ".v_cache", "must have rank 3 [S, k_heads, hd]"));
  if (const fb::Tid* w = n.k_norm_weight.get()) {
    if (dt(w) != DType::kF32) SB_RETURN_IF_ERROR(same_dtype(n.x.get(), w, path, "x", "k_norm_weight"));
    SB_RETURN_IF_ERROR(expect(rank(w) == 1, path + ".k_norm_weight", "must be 1-D [hd]"));
  }
  const int64_t h = dim(n.x.get(), 1);
  if (h >= 0 && h < n.q_heads + 2 * n.k_heads)
    return error(path + ".x", strformat("has %lld heads, fewer than q_heads %lld + 2 * k_heads %lld", (long long)h,
                                        (long long)n.q_heads, (long long)n.k_heads));
  return Status::ok();
}

Status Rules::check_causal_conv1d(const fb::CausalConv1dNodeT& n, const std::string& path) const {
  const fb::Tid *x = n.x.get(), *w = n.weight.get(), *st = n.state.get();
  SB_RETURN_IF_ERROR(expect(is_float(x) && rank(x) == 2, path + ".x", "must be a 2-D float tensor [m, C]"));
  SB_RETURN_IF_ERROR(expect(rank(w) == 2, path + ".weight", "must have rank 2 [C, K]"));
  SB_RETURN_IF_ERROR(expect(rank(st) == 2, path + ".state", "must have rank 2 [K - 1, C]"));
  SB_RETURN_IF_ERROR(same_dtype(x, w, path, "x", "weight"));
  SB_RETURN_IF_ERROR(same_dtype(x, st, path, "x", "state"));
  SB_RETURN_IF_ERROR(expect(dim(w, 1) != 0, path + ".weight", "has a kernel of width 0"));
  SB_RETURN_IF_ERROR(dim_is(w, 0, dim(x, 1), path + ".weight", "x's channel count"));
  SB_RETURN_IF_ERROR(dim_is(st, 1, dim(x, 1), path + ".state", "x's channel count"));
  SB_RETURN_IF_ERROR(dim_is(st, 0, dim(w, 1) < 0 ? -1 : dim(w, 1) - 1, path + ".state", "the kernel width - 1"));
  return same_dtype(x, n.out.get(), path, "x", "out");
}

Status Rules::check_gated_delta_rule(const fb::GatedDeltaRuleNodeT& n, const std::string& path) const {
  const fb::Tid *qkv = n.qkv.get(), *st = n.state.get();
  SB_RETURN_IF_ERROR(expect(is_float(qkv) && rank(qkv) == 2, path + ".qkv", "must be a 2-D float tensor [m, C]"));
  SB_RETURN_IF_ERROR(
      expect(dt(st) == DType::kF32 && rank(st) == 3, path + ".state", "must be a 3-D f32 tensor [hv, dk, dv]"));
  for (const auto& [t, name] : {std::pair{n.a.get(), "a"}, {n.b.get(), "b"}}) {
    SB_RETURN_IF_ERROR(same_dtype(qkv, t, path, "qkv", name));
    SB_RETURN_IF_ERROR(expect(rank(t) == 2, path + "." + name, "must have rank 2 [m, hv]"));
    SB_RETURN_IF_ERROR(dim_is(t, 1, dim(st, 0), path + "." + name, "the state's head count"));
  }
  for (const auto& [t, name] : {std::pair{n.a_log.get(), "a_log"}, {n.dt_bias.get(), "dt_bias"}}) {
    SB_RETURN_IF_ERROR(expect(is_float(t) && rank(t) == 1, path + "." + name, "must be a 1-D float tensor [hv]"));
    SB_RETURN_IF_ERROR(dim_is(t, 0, dim(st, 0), path + "." + name, "the state's head count"));
  }
  return same_dtype(qkv, n.out.get(), path, "qkv", "out");
}

// Static dims must agree; a dynamic one is checked when the op runs (ops::attention_dims).
Status Rules::check_attention(const fb::AttentionNodeT& n, const std::string& path) const {
  const fb::Tid *q = n.q.get(), *kc = n.k_cache.get(), *vc = n.v_cache.get();
  SB_RETURN_IF_ERROR(expect(is_float(q) && rank(q) == 3, path + ".q", "must be a 3-D float tensor [m, hq, hd]"));
  SB_RETURN_IF_ERROR(expect(rank(kc) == 3, path + ".k_cache", "must have rank 3 [hk, S, hd]"));
  SB_RETURN_IF_ERROR(expect(rank(vc) == 3, path + ".v_cache", "must have rank 3 [hk, S, hd]"));
  SB_RETURN_IF_ERROR(same_dtype(q, kc, path, "q", "k_cache"));
  SB_RETURN_IF_ERROR(same_dtype(q, vc, path, "q", "v_cache"));
  SB_RETURN_IF_ERROR(same_dtype(q, n.out.get(), path, "q", "out"));
  for (size_t i = 0; i < 3; ++i)
    if (dim(kc, i) >= 0 && dim(vc, i) >= 0 && dim(kc, i) != dim(vc, i))
      return error(path + ".v_cache", strformat("dim %zu is %lld, k_cache's is %lld", i, (long long)dim(vc, i),
                                                (long long)dim(kc, i)));
  const int64_t hq = dim(q, 1), hd = dim(q, 2), hk = dim(kc, n.seq_major ? 1 : 0);
  if (n.seq_major && n.order != fb::AttentionOrder::Blocked32)
    return error(path + ".seq_major", "needs order Blocked32");
  if (hd >= 0 && dim(kc, 2) >= 0 && hd != dim(kc, 2))
    return error(path + ".k_cache", strformat("head dim %lld differs from q's %lld", (long long)dim(kc, 2), (long long)hd));
  if (hq >= 0 && hk > 0 && hq % hk != 0)
    return error(path + ".q", strformat("%lld heads are not a multiple of the cache's %lld", (long long)hq, (long long)hk));
  if (hk == 0) return error(path + ".k_cache", "has no heads");
  if (n.sinks) {
    SB_RETURN_IF_ERROR(same_dtype(q, n.sinks.get(), path, "q", "sinks"));
    SB_RETURN_IF_ERROR(expect(rank(n.sinks.get()) == 1 && (hq < 0 || dim(n.sinks.get(), 0) < 0 || dim(n.sinks.get(), 0) == hq),
                              path + ".sinks", "must be [hq]"));
  }
  if (rank(n.out.get()) != 2) return error(path + ".out", "must have rank 2 [m, hq * hd]");
  SB_RETURN_IF_ERROR(expect(n.order == fb::AttentionOrder::Decomposed || n.order == fb::AttentionOrder::Blocked32,
                            path + ".order", strformat("%d is not an AttentionOrder", static_cast<int>(n.order))));
  return expect(n.window >= 0, path + ".window", strformat("%lld is negative", (long long)n.window));
}

Status Rules::check_op(const fb::OpNodeUnion& op, const std::string& path) const {
  switch (op.type) {
    case fb::OpNode::BinaryNode: {
      const auto* n = op.AsBinaryNode();
      if (!enum_ok(n->op, fb::BinaryOp::MAX)) return error(path + ".op", strformat("%d unknown", (int)n->op));
      SB_RETURN_IF_ERROR(same_dtype(n->a.get(), n->b.get(), path, "a", "b"));
      SB_RETURN_IF_ERROR(same_dtype(n->a.get(), n->out.get(), path, "a", "out"));
      DType t = dt(n->a.get());
      if (!dtype_is_float(t) && t != DType::kI32 && t != DType::kI64)
        return error(path + ".a", strformat("dtype %s is not supported (float, i32, i64)", dtype_name(t)));
      if (n->op == fb::BinaryOp::Div && !dtype_is_float(t)) return error(path + ".op", "Div needs a float dtype");
      if (n->op == fb::BinaryOp::FloorDiv && dtype_is_float(t))
        return error(path + ".op", "FloorDiv needs an integer dtype");
      return Status::ok();
    }
    case fb::OpNode::UnaryNode: {
      const auto* n = op.AsUnaryNode();
      if (!enum_ok(n->op, fb::UnaryOp::MAX)) return error(path + ".op", strformat("%d unknown", (int)n->op));
      if (n->op >= fb::UnaryOp::Exp && !dtype_is_float(dt(n->x.get())))
        return error(path + ".x", strformat("%s needs a float dtype", fb::EnumNameUnaryOp(n->op)));
      return same_dtype(n->x.get(), n->out.get(), path, "x", "out");
    }
    case fb::OpNode::CastNode: {
      const auto* n = op.AsCastNode();
      if (!dtype_is_valid(static_cast<int>(n->dtype)))
        return error(path + ".dtype", strformat("%d unknown", (int)n->dtype));
      if (dt(n->out.get()) != static_cast<DType>(n->dtype))
        return error(path + ".out", "dtype differs from the cast's dtype");
      return Status::ok();
    }
    case fb::OpNode::ReshapeNode: {
      const auto* n = op.AsReshapeNode();
      if (n->shape.size() > kMaxRank)
        return error(path + ".shape", strformat("rank %zu > %zu", n->shape.size(), kMaxRank));
      for (size_t i = 0; i < n->shape.size(); ++i)
        if (!n->shape[i]) return error(strformat("%s.shape[%zu]", path.c_str(), i), "missing");
      return same_dtype(n->x.get(), n->out.get(), path, "x", "out");
    }
    case fb::OpNode::SliceNode: {
      const auto* n = op.AsSliceNode();
      SB_RETURN_IF_ERROR(check_axis(n->axis, rank(n->x.get()), path));
      return same_dtype(n->x.get(), n->out.get(), path, "x", "out");
    }
    case fb::OpNode::ConcatNode: {
      const auto* n = op.AsConcatNode();
      if (n->inputs.empty()) return error(path + ".inputs", "empty");
      const size_t r = rank(&n->inputs[0]);
      SB_RETURN_IF_ERROR(check_axis(n->axis, r, path));
      for (const auto& t : n->inputs) {
        SB_RETURN_IF_ERROR(same_dtype(&t, n->out.get(), path, "inputs", "out"));
        if (rank(&t) != r) return error(path + ".inputs", "inputs differ in rank");
      }
      return Status::ok();
    }
    case fb::OpNode::MatmulNode: {
      const auto* n = op.AsMatmulNode();
      if (!is_float(n->a.get())) return error(path + ".a", "Matmul needs a float dtype");
      SB_RETURN_IF_ERROR(same_dtype(n->a.get(), n->b.get(), path, "a", "b"));
      SB_RETURN_IF_ERROR(same_dtype(n->a.get(), n->out.get(), path, "a", "out"));
      if (rank(n->b.get()) != 2) return error(path + ".b", "must have rank 2");
      if (rank(n->a.get()) == 0) return error(path + ".a", "must have rank >= 1");
      if (n->bias) {
        SB_RETURN_IF_ERROR(same_dtype(n->a.get(), n->bias.get(), path, "a", "bias"));
        if (rank(n->bias.get()) != 1) return error(path + ".bias", "must have rank 1");
      }
      return Status::ok();
    }
    case fb::OpNode::BatchMatmulNode: {
      const auto* n = op.AsBatchMatmulNode();
      if (!is_float(n->a.get())) return error(path + ".a", "BatchMatmul needs a float dtype");
      SB_RETURN_IF_ERROR(same_dtype(n->a.get(), n->b.get(), path, "a", "b"));
      SB_RETURN_IF_ERROR(same_dtype(n->a.get(), n->out.get(), path, "a", "out"));
      if (rank(n->a.get()) != 3) return error(path + ".a", "must have rank 3");
      if (rank(n->b.get()) != 3) return error(path + ".b", "must have rank 3");
      return Status::ok();
    }
    case fb::OpNode::TransposeNode: {
      const auto* n = op.AsTransposeNode();
      SB_RETURN_IF_ERROR(same_dtype(n->x.get(), n->out.get(), path, "x", "out"));
      const size_t r = rank(n->x.get());
      if (n->perm.size() != r)
        return error(path + ".perm", strformat("has %zu entries for x of rank %zu", n->perm.size(), r));
      if (rank(n->out.get()) != r) return error(path + ".out", strformat("must have rank %zu", r));
      std::vector<bool> seen(r, false);
      for (size_t a = 0; a < r; ++a) {
        const int32_t p = n->perm[a];
        if (p < 0 || static_cast<size_t>(p) >= r || seen[static_cast<size_t>(p)])
          return error(strformat("%s.perm[%zu]", path.c_str(), a), strformat("%d is not a permutation entry", p));
        seen[static_cast<size_t>(p)] = true;
      }
      return Status::ok();
    }
    case fb::OpNode::ReduceNode: {
      const auto* n = op.AsReduceNode();
      if (!enum_ok(n->op, fb::ReduceOp::MAX)) return error(path + ".op", strformat("%d unknown", (int)n->op));
      if (!is_float(n->x.get())) return error(path + ".x", "Reduce needs a float dtype");
      SB_RETURN_IF_ERROR(check_axis(n->axis, rank(n->x.get()), path));
      return same_dtype(n->x.get(), n->out.get(), path, "x", "out");
    }
    case fb::OpNode::ArgmaxNode: {
      const auto* n = op.AsArgmaxNode();
      SB_RETURN_IF_ERROR(check_axis(n->axis, rank(n->x.get()), path));
      if (dt(n->out.get()) != DType::kI32) return error(path + ".out", "dtype must be i32");
      return Status::ok();
    }
    case fb::OpNode::CopyNode: {
      const auto* n = op.AsCopyNode();
      return same_dtype(n->x.get(), n->out.get(), path, "x", "out");
    }
    case fb::OpNode::SliceUpdateNode: {
      const auto* n = op.AsSliceUpdateNode();
      SB_RETURN_IF_ERROR(check_axis(n->axis, rank(n->dst.get()), path));
      if (rank(n->dst.get()) != rank(n->update.get())) return error(path + ".update", "rank differs from dst");
      return same_dtype(n->dst.get(), n->update.get(), path, "dst", "update");
    }
    case fb::OpNode::NONE: break;
    default: return check_moe_op(op, path);
  }
  return error(path, "unknown op");
}

Status Rules::check_gather_qmm(const fb::GatherQmmNodeT& n, const std::string& path) const {
  SB_RETURN_IF_ERROR(
      expect(rank(n.x.get()) == 2 && dtype_is_float(dt(n.x.get())), path + ".x", "must be a 2-D float tensor"));
  const int64_t k = dim(n.x.get(), 1);
  SB_RETURN_IF_ERROR(expect(k > 0 && k % 32 == 0, path + ".x", "K must be static and a multiple of 32"));
  SB_RETURN_IF_ERROR(expect(quant_group_allowed(n.group_size), path + ".group_size",
                            strformat("%d not in {32, 64, 128}", n.group_size)));
  SB_RETURN_IF_ERROR(expect(k % n.group_size == 0, path + ".group_size", "does not divide K"));
  const fb::Tid *sc = n.scales.get(), *bi = n.biases.get();
  SB_RETURN_IF_ERROR(expect(rank(sc) == 3 && dtype_is_float(dt(sc)), path + ".scales", "must be a 3-D float tensor"));
  SB_RETURN_IF_ERROR(expect(dt(sc) == dt(bi) && rank(bi) == 3, path + ".biases", "must match scales' dtype and rank"));
  const int64_t e = dim(sc, 0), nn = dim(sc, 1), g = dim(sc, 2);
  SB_RETURN_IF_ERROR(expect(e > 0 && nn > 0 && g == k / n.group_size, path + ".scales",
                            "must be [E, N, K/group_size] with static dims"));
  for (size_t i = 0; i < 3; ++i)
    SB_RETURN_IF_ERROR(expect(dim(bi, i) == dim(sc, i), path + ".biases", "shape differs from scales"));
  SB_RETURN_IF_ERROR(expect(dt(n.w.get()) == DType::kU32, path + ".w", "must be u32"));
  if (n.expert_bits.empty()) {
    SB_RETURN_IF_ERROR(
        expect(quant_bits_allowed(n.bits), path + ".bits", strformat("%d not in {2,3,4,5,6,8}", n.bits)));
    SB_RETURN_IF_ERROR(expect(rank(n.w.get()) == 3 && dim(n.w.get(), 0) == e && dim(n.w.get(), 1) == nn &&
                                  dim(n.w.get(), 2) == k * n.bits / 32,
                              path + ".w",
                              strformat("must be [%lld, %lld, %lld] for %d-bit codes", (long long)e, (long long)nn,
                                        (long long)(k * n.bits / 32), n.bits)));
  } else {
    SB_RETURN_IF_ERROR(expect(static_cast<int64_t>(n.expert_bits.size()) == e, path + ".expert_bits",
                              strformat("%zu entries for %lld experts", n.expert_bits.size(), (long long)e)));
    int64_t words = 0;
    for (size_t i = 0; i < n.expert_bits.size(); ++i) {
      int b = n.expert_bits[i];
      SB_RETURN_IF_ERROR(expect(b == 0 || quant_bits_allowed(b), strformat("%s.expert_bits[%zu]", path.c_str(), i),
                                strformat("%d not in {0,2,3,4,5,6,8}", b)));
      words += nn * k * b / 32;
    }
    SB_RETURN_IF_ERROR(expect(rank(n.w.get()) == 1 && dim(n.w.get(), 0) == words, path + ".w",
                              strformat("must be [%lld]: the experts' packed blocks back to back", (long long)words)));
  }
  SB_RETURN_IF_ERROR(index_vector(n.lhs_indices.get(), path + ".lhs_indices"));
  SB_RETURN_IF_ERROR(index_vector(n.rhs_indices.get(), path + ".rhs_indices"));
  SB_RETURN_IF_ERROR(
      expect(dt(n.out.get()) == dt(n.x.get()) && rank(n.out.get()) == 2, path + ".out", "must be 2-D with x's dtype"));
  if (n.combine_weights) {
    SB_RETURN_IF_ERROR(expect(dt(n.combine_weights.get()) == DType::kF32 && rank(n.combine_weights.get()) == 2,
                              path + ".combine_weights", "must be a 2-D f32 tensor"));
    SB_RETURN_IF_ERROR(expect(!n.lhs_indices, path + ".lhs_indices", "must be absent with combine_weights"));
  } else {
    SB_RETURN_IF_ERROR(expect(!n.shared && !n.shared_gate, path + ".shared", "needs combine_weights"));
  }
  if (n.shared)
    SB_RETURN_IF_ERROR(expect(dt(n.shared.get()) == dt(n.out.get()) && rank(n.shared.get()) == 2, path + ".shared",
                              "must be 2-D with out's dtype"));
  if (n.shared_gate)
    SB_RETURN_IF_ERROR(expect(n.shared && dtype_is_float(dt(n.shared_gate.get())) && rank(n.shared_gate.get()) == 2,
                              path + ".shared_gate", "must be [T, 1] float and needs shared"));
  return Status::ok();
}

Status Rules::check_router(const fb::RouterNodeT& n, const std::string& path) const {
  SB_RETURN_IF_ERROR(
      expect(enum_ok(n.kind, fb::RouterKind::MAX), path + ".kind", strformat("%d unknown", (int)n.kind)));
  SB_RETURN_IF_ERROR(expect(rank(n.logits.get()) == 2 && dtype_is_float(dt(n.logits.get())), path + ".logits",
                            "must be a 2-D float tensor"));
  const int64_t e = dim(n.logits.get(), 1);
  SB_RETURN_IF_ERROR(expect(e > 0, path + ".logits", "expert count (last dim) must be static"));
  std::set<int32_t> pruned;
  for (size_t i = 0; i < n.pruned_experts.size(); ++i) {
    int32_t p = n.pruned_experts[i];
    SB_RETURN_IF_ERROR(expect(p >= 0 && p < e, strformat("%s.pruned_experts[%zu]", path.c_str(), i),
                              strformat("%d out of range (%lld experts)", p, (long long)e)));
    pruned.insert(p);
  }
  const int64_t live = e - static_cast<int64_t>(pruned.size());
  SB_RETURN_IF_ERROR(expect(
      n.k >= 1 && n.k <= live, path + ".k",
      strformat("%d not in [1, %lld] (%lld experts, %zu pruned)", n.k, (long long)live, (long long)e, pruned.size())));
  if (n.kind == fb::RouterKind::SigmoidGroupedTopK) {
    SB_RETURN_IF_ERROR(expect(n.n_group >= 1 && e % n.n_group == 0, path + ".n_group",
                              strformat("%d does not divide %lld experts", n.n_group, (long long)e)));
    SB_RETURN_IF_ERROR(expect(n.topk_group >= 1 && n.topk_group <= n.n_group, path + ".topk_group",
                              strformat("%d not in [1, n_group = %d]", n.topk_group, n.n_group)));
    SB_RETURN_IF_ERROR(expect(n.n_group == 1 || e / n.n_group >= 2, path + ".n_group", "groups need >= 2 experts"));
    // Whichever groups win, they must hold k live experts: check the worst choice.
    std::vector<int64_t> live_per_group(static_cast<size_t>(n.n_group), e / n.n_group);
    for (int32_t p : pruned) --live_per_group[static_cast<size_t>(p / (e / n.n_group))];
    std::sort(live_per_group.begin(), live_per_group.end());
    int64_t worst = 0;
    for (int g = 0; g < n.topk_group; ++g) worst += live_per_group[static_cast<size_t>(g)];
    SB_RETURN_IF_ERROR(expect(worst >= n.k, path + ".topk_group",
                              strformat("%d kept groups may hold only %lld live experts, fewer than k = %d",
                                        n.topk_group, (long long)worst, n.k)));
  } else {
    SB_RETURN_IF_ERROR(expect(!n.selection_bias, path + ".selection_bias", "only SigmoidGroupedTopK uses it"));
  }
  for (const fb::Tid* t : {n.selection_bias.get(), n.expert_scale.get()})
    if (t)
      SB_RETURN_IF_ERROR(expect(dt(t) == DType::kF32 && rank(t) == 1 && dim(t, 0) == e, path,
                                "selection_bias / expert_scale must be [E] f32"));
  SB_RETURN_IF_ERROR(expect(dt(n.weights.get()) == DType::kF32 && rank(n.weights.get()) == 2, path + ".weights",
                            "must be a 2-D f32 tensor"));
  return expect(dt(n.indices.get()) == DType::kI32 && rank(n.indices.get()) == 2, path + ".indices",
                "must be a 2-D i32 tensor");
}

Status Rules::check_moe_op(const fb::OpNodeUnion& op, const std::string& path) const {
  switch (op.type) {
    case fb::OpNode::GatherQmmNode: return check_gather_qmm(*op.AsGatherQmmNode(), path);
    case fb::OpNode::GatherMmNode: {
      const auto& n = *op.AsGatherMmNode();
      SB_RETURN_IF_ERROR(
          expect(rank(n.x.get()) == 2 && dtype_is_float(dt(n.x.get())), path + ".x", "must be 2-D float"));
      SB_RETURN_IF_ERROR(expect(rank(n.w.get()) == 3 && dt(n.w.get()) == dt(n.x.get()), path + ".w",
                                "must be [E, N, K] with x's dtype"));
      SB_RETURN_IF_ERROR(index_vector(n.lhs_indices.get(), path + ".lhs_indices"));
      SB_RETURN_IF_ERROR(index_vector(n.rhs_indices.get(), path + ".rhs_indices"));
      return expect(dt(n.out.get()) == dt(n.x.get()) && rank(n.out.get()) == 2, path + ".out",
                    "must be 2-D, x's dtype");
    }
    case fb::OpNode::RouterNode: return check_router(*op.AsRouterNode(), path);
    case fb::OpNode::ArgsortNode: {
      const auto& n = *op.AsArgsortNode();
      SB_RETURN_IF_ERROR(index_vector(n.x.get(), path + ".x"));
      return index_vector(n.out.get(), path + ".out");
    }
    case fb::OpNode::GatherRowsNode:
    case fb::OpNode::ScatterRowsNode: {
      const fb::Tid* x =
          op.type == fb::OpNode::GatherRowsNode ? op.AsGatherRowsNode()->x.get() : op.AsScatterRowsNode()->x.get();
      const fb::Tid* idx = op.type == fb::OpNode::GatherRowsNode ? op.AsGatherRowsNode()->indices.get()
                                                                 : op.AsScatterRowsNode()->indices.get();
      const fb::Tid* out =
          op.type == fb::OpNode::GatherRowsNode ? op.AsGatherRowsNode()->out.get() : op.AsScatterRowsNode()->out.get();
      SB_RETURN_IF_ERROR(index_vector(idx, path + ".indices"));
      SB_RETURN_IF_ERROR(expect(rank(x) >= 1, path + ".x", "must have rank >= 1"));
      return same_dtype(x, out, path, "x", "out");
    }
    case fb::OpNode::GluNode: {
      const auto& n = *op.AsGluNode();
      SB_RETURN_IF_ERROR(
          expect(enum_ok(n.kind, fb::GluKind::MAX), path + ".kind", strformat("%d unknown", (int)n.kind)));
      SB_RETURN_IF_ERROR(expect(dtype_is_float(dt(n.gate.get())), path + ".gate", "must be float"));
      SB_RETURN_IF_ERROR(same_dtype(n.gate.get(), n.up.get(), path, "gate", "up"));
      return same_dtype(n.gate.get(), n.out.get(), path, "gate", "out");
    }
    case fb::OpNode::FullNode: {
      const auto& n = *op.AsFullNode();
      SB_RETURN_IF_ERROR(expect(dtype_is_valid(static_cast<int>(n.dtype)), path + ".dtype", "unknown dtype"));
      SB_RETURN_IF_ERROR(expect(n.shape.size() <= kMaxRank, path + ".shape", "rank too large"));
      for (size_t i = 0; i < n.shape.size(); ++i)
        if (!n.shape[i]) return error(strformat("%s.shape[%zu]", path.c_str(), i), "missing");
      return expect(dt(n.out.get()) == static_cast<DType>(n.dtype), path + ".out", "dtype differs from the fill dtype");
    }
    case fb::OpNode::CombineNode: {
      const auto& n = *op.AsCombineNode();
      SB_RETURN_IF_ERROR(
          expect(dtype_is_float(dt(n.y.get())) && rank(n.y.get()) == 2, path + ".y", "must be 2-D float"));
      SB_RETURN_IF_ERROR(expect(dt(n.weights.get()) == DType::kF32 && rank(n.weights.get()) == 2, path + ".weights",
                                "must be a 2-D f32 tensor"));
      if (n.shared) SB_RETURN_IF_ERROR(same_dtype(n.y.get(), n.shared.get(), path, "y", "shared"));
      if (n.shared_gate)
        SB_RETURN_IF_ERROR(expect(n.shared && dtype_is_float(dt(n.shared_gate.get())), path + ".shared_gate",
                                  "must be float and needs shared"));
      return same_dtype(n.y.get(), n.out.get(), path, "y", "out");
    }
    case fb::OpNode::SoftmaxNode: {
      const auto& n = *op.AsSoftmaxNode();
      SB_RETURN_IF_ERROR(expect(dtype_is_float(dt(n.x.get())) && rank(n.x.get()) >= 1, path + ".x",
                                "must be a float tensor of rank >= 1"));
      return same_dtype(n.x.get(), n.out.get(), path, "x", "out");
    }
    case fb::OpNode::RmsNormNode: {
      const auto& n = *op.AsRmsNormNode();
      SB_RETURN_IF_ERROR(expect(dtype_is_float(dt(n.x.get())) && rank(n.x.get()) >= 1, path + ".x",
                                "must be a float tensor of rank >= 1"));
      SB_RETURN_IF_ERROR(expect(rank(n.weight.get()) == 1, path + ".weight", "must be 1-D"));
      // (schema v7) f32 weights beside 16-bit rows in order Tree32: zero-centred norms' 1 + w.
      if (!(n.order == fb::NormOrder::Tree32 && dt(n.weight.get()) == DType::kF32))
        SB_RETURN_IF_ERROR(same_dtype(n.x.get(), n.weight.get(), path, "x", "weight"));
      SB_RETURN_IF_ERROR(expect(n.order == fb::NormOrder::Sequential || n.order == fb::NormOrder::Tree32,
                                path + ".order", strformat("%d is not a NormOrder", static_cast<int>(n.order))));
      SB_RETURN_IF_ERROR(expect(!n.residual == !n.sum, path + ".sum", "is given exactly when residual is"));
      if (n.residual) {
        SB_RETURN_IF_ERROR(expect(n.order == fb::NormOrder::Tree32, path + ".residual", "needs order Tree32"));
        SB_RETURN_IF_ERROR(same_dtype(n.x.get(), n.residual.get(), path, "x", "residual"));
        SB_RETURN_IF_ERROR(same_dtype(n.x.get(), n.sum.get(), path, "x", "sum"));
        SB_RETURN_IF_ERROR(expect(rank(n.residual.get()) == rank(n.x.get()), path + ".residual", "must have x's rank"));
      }
      if (n.gate) {
        SB_RETURN_IF_ERROR(same_dtype(n.x.get(), n.gate.get(), path, "x", "gate"));
        SB_RETURN_IF_ERROR(expect(rank(n.gate.get()) == rank(n.x.get()) && !n.residual, path + ".gate",
                                  "must have x's rank (and no residual)"));
        SB_RETURN_IF_ERROR(expect(n.order == fb::NormOrder::Tree32, path + ".gate", "needs order Tree32"));
      }
      return same_dtype(n.x.get(), n.out.get(), path, "x", "out");
    }
    case fb::OpNode::AttentionNode: return check_attention(*op.AsAttentionNode(), path);
    case fb::OpNode::CausalConv1dNode: return check_causal_conv1d(*op.AsCausalConv1dNode(), path);
    case fb::OpNode::GatedDeltaRuleNode: return check_gated_delta_rule(*op.AsGatedDeltaRuleNode(), path);
    case fb::OpNode::RopeNode: {
      const auto& n = *op.AsRopeNode();
      const fb::Tid *x = n.x.get(), *c = n.cos.get(), *s = n.sin.get();
      SB_RETURN_IF_ERROR(expect(is_float(x) && rank(x) == 3, path + ".x", "must be a 3-D float tensor [m, h, hd]"));
      SB_RETURN_IF_ERROR(
          expect(dt(c) == DType::kF32 && rank(c) == 2, path + ".cos", "must be a 2-D f32 table [S, half]"));
      SB_RETURN_IF_ERROR(
          expect(dt(s) == DType::kF32 && rank(s) == 2, path + ".sin", "must be a 2-D f32 table [S, half]"));
      for (size_t i = 0; i < 2; ++i)
        if (dim(c, i) >= 0 && dim(s, i) >= 0 && dim(c, i) != dim(s, i))
          return error(path + ".sin",
                       strformat("dim %zu is %lld, cos's is %lld", i, (long long)dim(s, i), (long long)dim(c, i)));
      if (dim(x, 2) >= 0 && dim(c, 1) >= 0 && 2 * dim(c, 1) > dim(x, 2))
        return error(path + ".cos",
                     strformat("rotates 2 * %lld dims of a head of %lld", (long long)dim(c, 1), (long long)dim(x, 2)));
      if (const fb::Tid* w = n.norm_weight.get()) {
        if (dt(w) != DType::kF32) SB_RETURN_IF_ERROR(same_dtype(x, w, path, "x", "norm_weight"));
        SB_RETURN_IF_ERROR(expect(rank(w) == 1, path + ".norm_weight", "must be 1-D [hd]"));
      }
      if (const fb::Tid* k = n.cache.get()) {
        SB_RETURN_IF_ERROR(same_dtype(x, k, path, "x", "cache"));
        SB_RETURN_IF_ERROR(expect(rank(k) == 3, path + ".cache", "must have rank 3 [S, h, hd]"));
      }
      SB_RETURN_IF_ERROR(check_rope_qkv(n, path));
      return same_dtype(x, n.out.get(), path, "x", "out");
    }
    default: break;
  }
  return error(path, "unknown op");
}

}  // namespace

Status check_axis(int32_t axis, size_t rank, const std::string& path, bool allow_end) {
  int64_t r = static_cast<int64_t>(rank) + (allow_end ? 1 : 0);
  if (axis < -r || axis >= r) return error(path + ".axis", strformat("%d out of range for rank %zu", axis, rank));
  return Status::ok();
}

Status check_op_rules(const fb::OpNodeUnion& op, const SlotDecls& decls, const std::string& path) {
  return Rules(decls).check_op(op, path);
}

}  // namespace switchboard::ops
