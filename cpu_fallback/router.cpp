// Fused MoE routers: softmax -> top-k, top-k -> softmax, and DeepSeek-style
// sigmoid + selection bias + group-limited top-k. Selection order: higher score
// first, NaN above everything, ties to the lower expert id.
#include <vector>

#include "cpu_common.h"
#include "exact_math.h"

namespace switchboard::cpu {
namespace {

bool better(float va, int ia, float vb, int ib) {
  const bool na = va != va, nb = vb != vb;
  if (na != nb) return na;
  if (!na && va != vb) return va > vb;
  return ia < ib;
}

// The k best ids among those with allowed[id], in selection order.
std::vector<int> top_k(const std::vector<float>& v, const std::vector<uint8_t>& allowed, int k) {
  std::vector<int> ids;
  std::vector<uint8_t> taken(v.size(), 0);
  for (int s = 0; s < k; ++s) {
    int best = -1;
    for (int i = 0; i < static_cast<int>(v.size()); ++i)
      if (allowed[i] && !taken[i] && (best < 0 || better(v[i], i, v[best], best))) best = i;
    if (best < 0) break;
    taken[best] = 1;
    ids.push_back(best);
  }
  return ids;
}

// max, exp(v - max), sum in index order, one reciprocal, products.
std::vector<float> softmax(const std::vector<float>& v) {
  float m = v[0];
  for (float x : v) m = max_f32(m, x);
  std::vector<float> e(v.size());
  float sum = 0.0f;
  for (size_t i = 0; i < v.size(); ++i) {
    e[i] = exact::exp(v[i] - m);
    sum = sum + e[i];
  }
  const float r = exact::rcp(sum);
  for (float& x : e) x = x * r;
  return e;
}

// w[j] * (1 / sum over slots in order).
void renormalize(std::vector<float>& w) {
  float sum = 0.0f;
  for (float x : w) sum = sum + x;
  const float r = exact::rcp(sum);
  for (float& x : w) x = x * r;
}

// DeepSeek-V3: groups ranked by the sum of their two best corrected scores.
std::vector<uint8_t> keep_groups(const std::vector<float>& c, const std::vector<uint8_t>& live, int n_group,
                                 int topk_group) {
  const int per = static_cast<int>(c.size()) / n_group;
  std::vector<float> score(static_cast<size_t>(n_group));
  for (int g = 0; g < n_group; ++g) {
    std::vector<float> members(c.begin() + g * per, c.begin() + (g + 1) * per);
    std::vector<uint8_t> ok(live.begin() + g * per, live.begin() + (g + 1) * per);
    std::vector<int> two = top_k(members, ok, 2);
    score[g] = two.empty() ? -exact::kInf : two.size() == 1 ? members[two[0]] : members[two[0]] + members[two[1]];
  }
  std::vector<int> kept = top_k(score, std::vector<uint8_t>(static_cast<size_t>(n_group), 1), topk_group);
  std::vector<uint8_t> allowed(c.size(), 0);
  for (int g : kept)
    for (int i = g * per; i < (g + 1) * per; ++i) allowed[i] = live[i];
  return allowed;
}

Status router(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsRouterNode();
  SB_ASSIGN_OR_RETURN(Tensor logits, ctx.in(n->logits.get()));
  Tensor bias, scale;
  if (n->selection_bias) {
    SB_ASSIGN_OR_RETURN(bias, ctx.in(n->selection_bias.get()));
  }
  if (n->expert_scale) {
    SB_ASSIGN_OR_RETURN(scale, ctx.in(n->expert_scale.get()));
  }
  const int64_t tokens = logits.dim(0);
  const int e = static_cast<int>(logits.dim(1)), k = n->k;
  std::vector<uint8_t> live(static_cast<size_t>(e), 1);
  for (int32_t p : n->pruned_experts) live[p] = 0;
  SB_ASSIGN_OR_RETURN(Tensor weights, Tensor::zeros(DType::kF32, {tokens, k}));
  SB_ASSIGN_OR_RETURN(Tensor indices, Tensor::zeros(DType::kI32, {tokens, k}));
  std::vector<float> v(static_cast<size_t>(e));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int i = 0; i < e; ++i) v[i] = load_f32(logits.data(), logits.dtype(), t * e + i);
    std::vector<int> ids;
    std::vector<float> w;
    switch (n->kind) {
      case fb::RouterKind::SoftmaxTopK: {
        std::vector<float> p = softmax(v);
        ids = top_k(p, live, k);
        for (int id : ids) w.push_back(p[id]);
        if (n->renormalize) renormalize(w);
        break;
      }
      case fb::RouterKind::TopKSoftmax: {
        ids = top_k(v, live, k);
        for (int id : ids) w.push_back(v[id]);
        w = softmax(w);
        break;
      }
      case fb::RouterKind::SigmoidGroupedTopK: {
        std::vector<float> s(v.size()), c(v.size());
        for (int i = 0; i < e; ++i) {
          s[i] = exact::sigmoid(v[i]);
          c[i] = bias.defined() ? s[i] + bias.data_as<float>()[i] : s[i];
        }
        std::vector<uint8_t> allowed = n->n_group > 1 ? keep_groups(c, live, n->n_group, n->topk_group) : live;
        ids = top_k(c, allowed, k);
        for (int id : ids) w.push_back(s[id]);
        if (n->renormalize) renormalize(w);
        for (float& x : w) x = x * n->routed_scaling_factor;
        break;
      }
    }
    SB_CHECK_OR_RETURN(static_cast<int>(ids.size()) == k, StatusCode::kInternal, "router selected %zu of %d experts",
                       ids.size(), k);
    for (int j = 0; j < k; ++j) {
      float wj = scale.defined() ? w[j] * scale.data_as<float>()[ids[j]] : w[j];
      weights.mutable_data_as<float>()[t * k + j] = wj;
      indices.mutable_data_as<int32_t>()[t * k + j] = ids[j];
    }
  }
  SB_RETURN_IF_ERROR(ctx.out(n->weights.get(), std::move(weights)));
  return ctx.out(n->indices.get(), std::move(indices));
}

}  // namespace

void register_router_kernels(KernelRegistry& r) { r.add(fb::OpNode::RouterNode, router); }

}  // namespace switchboard::cpu
