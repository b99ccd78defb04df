// ProgramBuilder: the linear-attention ops (Gated DeltaNet): the short causal convolution,
// the gated delta rule and the gated RMSNorm of its output.
#include "builder_state.h"
#include "switchboard/builder.h"

namespace switchboard {

using namespace builder_detail;

TensorRef ProgramBuilder::gated_rms_norm(TensorRef x, TensorRef gate, TensorRef weight, float eps) {
  if (!required_ok(*s_, {x, gate, weight}, "gated_rms_norm")) return {};
  TensorRef o = s_->new_slot(SlotRole::kTemp, s_->slots[x.id].dtype, s_->slots[x.id].shape);
  auto n = std::make_unique<fb::RmsNormNodeT>();
  n->x = tid(x);
  n->weight = tid(weight);
  n->out = tid(o);
  n->eps = eps;
  n->order = fb::NormOrder::Tree32;
  n->gate = tid(gate);
  s_->emit(make_op(std::move(n)));
  return o;
}

TensorRef ProgramBuilder::causal_conv1d(TensorRef x, TensorRef weight, TensorRef state, IntOrValue pos, bool silu) {
  if (!required_ok(*s_, {x, weight, state}, "causal_conv1d")) return {};
  TensorRef o = s_->new_slot(SlotRole::kTemp, s_->slots[x.id].dtype, s_->slots[x.id].shape);
  auto n = std::make_unique<fb::CausalConv1dNodeT>();
  n->x = tid(x);
  n->weight = tid(weight);
  n->state = tid(state);
  n->pos = iov(pos);
  n->out = tid(o);
  n->silu = silu;
  s_->emit(make_op(std::move(n)));
  return o;
}

TensorRef ProgramBuilder::gated_delta_rule(TensorRef qkv, TensorRef a, TensorRef b, TensorRef a_log, TensorRef dt_bias,
                                           TensorRef state, IntOrValue pos, float scale, bool l2norm) {
  if (!required_ok(*s_, {qkv, a, b, a_log, dt_bias, state}, "gated_delta_rule")) return {};
  const std::vector<Dim>&xd = s_->slots[qkv.id].shape, &sd = s_->slots[state.id].shape;
  if (xd.size() != 2 || sd.size() != 3) {
    s_->fail("gated_delta_rule: needs qkv [m, C] and state [hv, dk, dv]");
    return {};
  }
  TensorRef o = s_->new_slot(SlotRole::kTemp, s_->slots[qkv.id].dtype, {xd[0], sd[0], sd[2]});
  auto n = std::make_unique<fb::GatedDeltaRuleNodeT>();
  n->qkv = tid(qkv);
  n->a = tid(a);
  n->b = tid(b);
  n->a_log = tid(a_log);
  n->dt_bias = tid(dt_bias);
  n->state = tid(state);
  n->pos = iov(pos);
  n->out = tid(o);
  n->scale = scale;
  n->l2norm = l2norm;
  s_->emit(make_op(std::move(n)));
  return o;
}

}  // namespace switchboard
