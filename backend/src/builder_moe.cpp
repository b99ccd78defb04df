// ProgramBuilder: the mixture-of-experts ops and the moe_experts lowering.
#include "builder_state.h"
#include "switchboard/builder.h"

namespace switchboard {

using namespace builder_detail;

namespace {

std::unique_ptr<fb::Tid> opt(TensorRef t) { return t.valid() ? tid(t) : nullptr; }

// Rows (dim 0) of a slot's shape.
Dim rows_of(const BuilderState& s, TensorRef t) { return s.slots[t.id].shape.empty() ? Dim(1) : s.slots[t.id].shape[0]; }

}  // namespace

TensorRef ProgramBuilder::floordiv(TensorRef a, TensorRef b) {
  if (!s_->ok(a, "floordiv") || !s_->ok(b, "floordiv")) return {};
  DType t = s_->slots[a.id].dtype;
  if (t != DType::kI32 && t != DType::kI64) {
    s_->fail("floordiv: needs i32 or i64 tensors");
    return {};
  }
  // Same shape rules as the other binary ops.
  TensorRef o = add(a, b);
  if (!o.valid()) return {};
  s_->chains[s_->current]->instructions.back()->op.AsBinaryNode()->op = fb::BinaryOp::FloorDiv;
  return o;
}

TensorRef ProgramBuilder::full(const std::vector<IntOrValue>& shape, DType dtype, double value) {
  if (!s_->status.is_ok()) return {};
  std::vector<Dim> dims;
  for (const IntOrValue& v : shape) dims.push_back(v.is_literal() ? Dim(v.literal()) : Dim::dynamic());
  TensorRef o = s_->new_slot(SlotRole::kTemp, dtype, dims);
  auto n = std::make_unique<fb::FullNodeT>();
  n->out = tid(o);
  for (const IntOrValue& v : shape) n->shape.push_back(iov(v));
  n->value = value;
  n->dtype = static_cast<fb::DType>(dtype);
  s_->emit(make_op(std::move(n)));
  return o;
}

RouterOut ProgramBuilder::router(TensorRef logits, const RouterSpec& spec) {
  if (!all_ok(*s_, {logits, spec.selection_bias, spec.expert_scale}, "router")) return {};
  Dim t = rows_of(*s_, logits);
  RouterOut r{s_->new_slot(SlotRole::kTemp, DType::kF32, {t, spec.k}),
              s_->new_slot(SlotRole::kTemp, DType::kI32, {t, spec.k})};
  auto n = std::make_unique<fb::RouterNodeT>();
  n->logits = tid(logits);
  n->selection_bias = opt(spec.selection_bias);
  n->expert_scale = opt(spec.expert_scale);
  n->weights = tid(r.weights);
  n->indices = tid(r.indices);
  n->kind = static_cast<fb::RouterKind>(spec.kind);
  n->k = spec.k;
  n->renormalize = spec.renormalize;
  n->n_group = spec.n_group;
  n->topk_group = spec.topk_group;
  n->routed_scaling_factor = spec.routed_scaling_factor;
  n->pruned_experts = spec.pruned_experts;
  s_->emit(make_op(std::move(n)));
  return r;
}

TensorRef ProgramBuilder::gather_qmm(TensorRef x, const QuantizedExperts& w, const GatherOptions& o) {
  if (!all_ok(*s_, {x, w.w, w.scales, w.biases, o.lhs_indices, o.rhs_indices, o.combine_weights, o.shared, o.shared_gate},
              "gather_qmm"))
    return {};
  const auto& sc = s_->slots[w.scales.id].shape;
  if (sc.size() != 3) {
    s_->fail("gather_qmm: scales must be [E, N, K/group_size]");
    return {};
  }
  // Output rows: tokens with a fused combine, else one per pair.
  Dim rows = o.combine_weights.valid() ? rows_of(*s_, o.combine_weights)
             : o.rhs_indices.valid()   ? rows_of(*s_, o.rhs_indices)
             : o.lhs_indices.valid()   ? rows_of(*s_, o.lhs_indices)
                                       : rows_of(*s_, x);
  TensorRef out = s_->new_slot(SlotRole::kTemp, s_->slots[x.id].dtype, {rows, sc[1]});
  auto n = std::make_unique<fb::GatherQmmNodeT>();
  n->x = tid(x);
  n->w = tid(w.w);
  n->scales = tid(w.scales);
  n->biases = tid(w.biases);
  n->lhs_indices = opt(o.lhs_indices);
  n->rhs_indices = opt(o.rhs_indices);
  n->out = tid(out);
  n->bits = w.bits;
  n->group_size = w.group_size;
  n->expert_bits = w.expert_bits;
  n->sorted_indices = iov(o.sorted_indices);
  n->combine_weights = opt(o.combine_weights);
  n->shared = opt(o.shared);
  n->shared_gate = opt(o.shared_gate);
  s_->emit(make_op(std::move(n)));
  return out;
}

TensorRef ProgramBuilder::gather_mm(TensorRef x, TensorRef w, const GatherOptions& o) {
  if (!all_ok(*s_, {x, w, o.lhs_indices, o.rhs_indices}, "gather_mm")) return {};
  const auto& ws = s_->slots[w.id].shape;
  if (ws.size() != 3) {
    s_->fail("gather_mm: w must be [E, N, K]");
    return {};
  }
  Dim rows = o.rhs_indices.valid() ? rows_of(*s_, o.rhs_indices)
             : o.lhs_indices.valid() ? rows_of(*s_, o.lhs_indices)
                                     : rows_of(*s_, x);
  TensorRef out = s_->new_slot(SlotRole::kTemp, s_->slots[x.id].dtype, {rows, ws[1]});
  auto n = std::make_unique<fb::GatherMmNodeT>();
  n->x = tid(x);
  n->w = tid(w);
  n->lhs_indices = opt(o.lhs_indices);
  n->rhs_indices = opt(o.rhs_indices);
  n->out = tid(out);
  n->sorted_indices = iov(o.sorted_indices);
  s_->emit(make_op(std::move(n)));
  return out;
}

TensorRef ProgramBuilder::argsort(TensorRef x) {
  if (!s_->ok(x, "argsort")) return {};
  TensorRef out = s_->new_slot(SlotRole::kTemp, DType::kI32, s_->slots[x.id].shape);
  auto n = std::make_unique<fb::ArgsortNodeT>();
  n->x = tid(x);
  n->out = tid(out);
  s_->emit(make_op(std::move(n)));
  return out;
}

TensorRef ProgramBuilder::gather_rows(TensorRef x, TensorRef indices) {
  if (!all_ok(*s_, {x, indices}, "gather_rows")) return {};
  std::vector<Dim> dims = s_->slots[x.id].shape;
  if (dims.empty()) {
    s_->fail("gather_rows: x must have rank >= 1");
    return {};
  }
  dims[0] = rows_of(*s_, indices);
  TensorRef out = s_->new_slot(SlotRole::kTemp, s_->slots[x.id].dtype, dims);
  auto n = std::make_unique<fb::GatherRowsNodeT>();
  n->x = tid(x);
  n->indices = tid(indices);
  n->out = tid(out);
  s_->emit(make_op(std::move(n)));
  return out;
}

TensorRef ProgramBuilder::scatter_rows(TensorRef x, TensorRef indices) {
  if (!all_ok(*s_, {x, indices}, "scatter_rows")) return {};
  TensorRef out = s_->new_slot(SlotRole::kTemp, s_->slots[x.id].dtype, s_->slots[x.id].shape);
  auto n = std::make_unique<fb::ScatterRowsNodeT>();
  n->x = tid(x);
  n->indices = tid(indices);
  n->out = tid(out);
  s_->emit(make_op(std::move(n)));
  return out;
}

TensorRef ProgramBuilder::glu(TensorRef gate, TensorRef up, GluKind kind, float alpha, float limit) {
  if (!all_ok(*s_, {gate, up}, "glu")) return {};
  TensorRef out = s_->new_slot(SlotRole::kTemp, s_->slots[gate.id].dtype, s_->slots[gate.id].shape);
  auto n = std::make_unique<fb::GluNodeT>();
  n->gate = tid(gate);
  n->up = tid(up);
  n->out = tid(out);
  n->kind = static_cast<fb::GluKind>(kind);
  n->alpha = alpha;
  n->limit = limit;
  s_->emit(make_op(std::move(n)));
  return out;
}

TensorRef ProgramBuilder::combine(TensorRef y, TensorRef weights, TensorRef shared, TensorRef shared_gate) {
  if (!all_ok(*s_, {y, weights, shared, shared_gate}, "combine")) return {};
  const auto& ys = s_->slots[y.id].shape;
  if (ys.size() != 2) {
    s_->fail("combine: y must be [T*k, D]");
    return {};
  }
  TensorRef out = s_->new_slot(SlotRole::kTemp, s_->slots[y.id].dtype, {rows_of(*s_, weights), ys[1]});
  auto n = std::make_unique<fb::CombineNodeT>();
  n->y = tid(y);
  n->weights = tid(weights);
  n->shared = opt(shared);
  n->shared_gate = opt(shared_gate);
  n->out = tid(out);
  s_->emit(make_op(std::move(n)));
  return out;
}

namespace {

// One expert projection of every pair: quantized (GatherQmm) or float (GatherMm), plus
// the pair's expert bias when given. A fused combine only happens on the quantized path
// without a bias; otherwise the caller combines.
TensorRef project(ProgramBuilder& b, TensorRef x, const QuantizedExperts& w, TensorRef bias, TensorRef pair_experts,
                  const GatherOptions& o) {
  TensorRef y = w.scales.valid() ? b.gather_qmm(x, w, o) : b.gather_mm(x, w.w, o);
  return bias.valid() ? b.add(y, b.gather_rows(bias, pair_experts)) : y;
}

}  // namespace

// Both paths compute every (token, slot) product with the same arithmetic and
// add the slots in order 0..k-1, so they return identical bits.
TensorRef ProgramBuilder::moe_experts(TensorRef x, TensorRef weights, TensorRef indices, const MoeExperts& e,
                                      TensorRef shared, TensorRef shared_gate) {
  if (!all_ok(*s_, {x, weights, indices, shared, shared_gate, e.gate_bias, e.up_bias, e.down_bias}, "moe_experts"))
    return {};
  const auto& ws = s_->slots[weights.id].shape;
  if (ws.size() != 2 || !ws[1].is_static()) {
    s_->fail("moe_experts: weights must be [T, k] with a static k");
    return {};
  }
  const int64_t k = ws[1].size;
  set_attribute("moe.sort_cutoff", e.sort_cutoff);
  // Nonzero exactly when M > sort_cutoff (a cutoff <= 0 always sorts).
  IntOrValue cond = e.sort_cutoff <= 0 ? IntOrValue(1) : floordiv_int(sub_int(size(x, 0), 1), e.sort_cutoff);
  auto hidden = [&](TensorRef experts, const GatherOptions& in) {
    return glu(project(*this, x, e.gate, e.gate_bias, experts, in), project(*this, x, e.up, e.up_bias, experts, in),
               e.activation, e.alpha, e.limit);
  };
  auto sorted_path = [&] {
    auto scope = tmp_scope();
    TensorRef flat = reshape(indices, {-1});
    TensorRef order = argsort(flat);
    TensorRef experts = gather_rows(flat, order);
    TensorRef token = floordiv(order, full({1}, DType::kI32, static_cast<double>(k)));
    TensorRef h = hidden(experts, GatherOptions{token, experts, 1});
    TensorRef y = project(*this, h, e.down, e.down_bias, experts, GatherOptions{{}, experts, 1});
    return std::vector<TensorRef>{scope.keep(combine(scatter_rows(y, order), weights, shared, shared_gate))};
  };
  auto unsorted_path = [&] {
    auto scope = tmp_scope();
    TensorRef flat = reshape(indices, {-1});
    TensorRef h = hidden(flat, GatherOptions{{}, flat, 0});
    if (e.down.scales.valid() && !e.down_bias.valid()) {
      GatherOptions down{{}, flat, 0, weights, shared, shared_gate};
      return std::vector<TensorRef>{scope.keep(gather_qmm(h, e.down, down))};
    }
    TensorRef y = project(*this, h, e.down, e.down_bias, flat, GatherOptions{{}, flat, 0});
    return std::vector<TensorRef>{scope.keep(combine(y, weights, shared, shared_gate))};
  };
  auto r = emit_if_else(cond, sorted_path, unsorted_path);
  return r.empty() ? TensorRef{} : r[0];
}

}  // namespace switchboard
