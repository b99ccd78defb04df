// ProgramBuilder: the attention layer's coarse ops: Attention (both orders) and Rope, also in its
// q/k/v form (schema v8).
#include "builder_state.h"
#include "switchboard/builder.h"

namespace switchboard {

using namespace builder_detail;

namespace {

TensorRef emit_attention(BuilderState& s, TensorRef q, TensorRef k_cache, TensorRef v_cache, IntOrValue pos,
                                float scale, float mask_value, int64_t window, TensorRef sinks,
                                fb::AttentionOrder order, bool seq_major) {
  for (TensorRef t : {q, k_cache, v_cache})
    if (!s.ok(t, "attention")) return {};
  if (sinks.valid() && !s.ok(sinks, "attention")) return {};
  const std::vector<Dim>& qd = s.slots[q.id].shape;
  Dim width = qd.size() == 3 && qd[1].is_static() && qd[2].is_static() ? Dim(qd[1].size * qd[2].size) : Dim::dynamic();
  TensorRef o = s.new_slot(SlotRole::kTemp, s.slots[q.id].dtype, {qd.empty() ? Dim::dynamic() : qd[0], width});
  auto n = std::make_unique<fb::AttentionNodeT>();
  n->q = tid(q);
  n->k_cache = tid(k_cache);
  n->v_cache = tid(v_cache);
  n->pos = iov(pos);
  if (sinks.valid()) n->sinks = tid(sinks);
  n->out = tid(o);
  n->scale = scale;
  n->mask_value = mask_value;
  n->window = window;
  n->order = order;
  n->seq_major = seq_major;
  s.emit(make_op(std::move(n)));
  return o;
}

}  // namespace

TensorRef ProgramBuilder::attention(TensorRef q, TensorRef k_cache, TensorRef v_cache, IntOrValue pos, float scale,
                                    int64_t window, TensorRef sinks, bool seq_major) {
  return emit_attention(*s_, q, k_cache, v_cache, pos, scale, 0.0f, window, sinks, fb::AttentionOrder::Blocked32,
                        seq_major);
}

TensorRef ProgramBuilder::attention_decomposed_order(TensorRef q, TensorRef k_cache, TensorRef v_cache, IntOrValue pos,
                                                     float scale, float mask_value, int64_t window, TensorRef sinks) {
  return emit_attention(*s_, q, k_cache, v_cache, pos, scale, mask_value, window, sinks, fb::AttentionOrder::Decomposed,
                        false);
}

namespace {

// A Rope node over x writing a new slot of `shape`; the caller sets the optional fields.
std::unique_ptr<fb::RopeNodeT> rope_node(BuilderState& s, TensorRef x, TensorRef cos, TensorRef sin, IntOrValue pos,
                                         TensorRef norm_weight, float eps, std::vector<Dim> shape, TensorRef* out) {
  *out = s.new_slot(SlotRole::kTemp, s.slots[x.id].dtype, std::move(shape));
  auto n = std::make_unique<fb::RopeNodeT>();
  n->x = tid(x);
  n->cos = tid(cos);
  n->sin = tid(sin);
  n->pos = iov(pos);
  n->out = tid(*out);
  if (norm_weight.valid()) n->norm_weight = tid(norm_weight);
  n->eps = eps;
  return n;
}

}  // namespace

TensorRef ProgramBuilder::rope(TensorRef x, TensorRef cos, TensorRef sin, IntOrValue pos, TensorRef norm_weight,
                               float eps, TensorRef cache) {
  if (!required_ok(*s_, {x, cos, sin}, "rope") || !all_ok(*s_, {norm_weight, cache}, "rope")) return {};
  TensorRef o;
  auto n = rope_node(*s_, x, cos, sin, pos, norm_weight, eps, s_->slots[x.id].shape, &o);
  if (cache.valid()) n->cache = tid(cache);
  s_->emit(make_op(std::move(n)));
  return o;
}

TensorRef ProgramBuilder::rope_qkv(TensorRef x, TensorRef cos, TensorRef sin, IntOrValue pos, int64_t q_heads,
                                   int64_t k_heads, TensorRef k_cache, TensorRef v_cache, TensorRef q_norm,
                                   TensorRef k_norm, float eps) {
  if (!required_ok(*s_, {x, cos, sin, k_cache, v_cache}, "rope_qkv") || !all_ok(*s_, {q_norm, k_norm}, "rope_qkv"))
    return {};
  std::vector<Dim> shape = s_->slots[x.id].shape;
  if (shape.size() == 3) shape[1] = Dim(q_heads);  // else the rules name x's rank
  TensorRef o;
  auto n = rope_node(*s_, x, cos, sin, pos, q_norm, eps, std::move(shape), &o);
  if (k_norm.valid()) n->k_norm_weight = tid(k_norm);
  n->cache = tid(k_cache);
  n->v_cache = tid(v_cache);
  n->q_heads = q_heads;
  n->k_heads = k_heads;
  s_->emit(make_op(std::move(n)));
  return o;
}

}  // namespace switchboard
