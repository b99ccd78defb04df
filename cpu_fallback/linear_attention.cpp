// Gated DeltaNet's ops (schema CausalConv1dNode, GatedDeltaRuleNode): the short causal
// convolution and the gated delta rule, token by token in the order docs/numerics.md states
// (sums in index order, every product and sum rounded to f32, never fused), so a prefill gives
// each token the bits of decoding it alone. The state buffers are updated in place.
#include <algorithm>
#include <cstring>

#include "cpu_common.h"
#include "exact_math.h"
#include "parallel.h"

namespace switchboard::cpu {
namespace {

Status causal_conv1d(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsCausalConv1dNode();
  SB_ASSIGN_OR_RETURN(Tensor x, ctx.in(n->x.get()));
  SB_ASSIGN_OR_RETURN(Tensor wt, ctx.in(n->weight.get()));
  SB_ASSIGN_OR_RETURN(int64_t pos, ctx.resolve(n->pos.get()));
  SB_ASSIGN_OR_RETURN(Tensor state, ctx.inplace(n->state.get()));
  SB_ASSIGN_OR_RETURN(ConvDims d, causal_conv1d_dims(x, wt, state, pos));
  const DType dt = x.dtype();
  const int64_t hist = d.k - 1;
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(dt, x.shape()));
  // Each channel alone: its K - 1 last inputs (zeros when a sequence starts), then its rows in
  // order; the state keeps the last K - 1 afterwards.
  parallel_for(d.c, 256, [&](int64_t c0, int64_t c1) {
    std::vector<float> u(static_cast<size_t>(hist + d.m)), w(static_cast<size_t>(d.k));
    std::vector<float> y(static_cast<size_t>((c1 - c0) * d.m));  // this chunk's outputs, channel-major
    for (int64_t c = c0; c < c1; ++c) {
      for (int64_t j = 0; j < d.k; ++j) w[static_cast<size_t>(j)] = load_f32(wt.data(), dt, c * d.k + j);
      for (int64_t r = 0; r < hist; ++r)
        u[static_cast<size_t>(r)] = pos > 0 ? load_f32(state.data(), dt, r * d.c + c) : 0.0f;
      for (int64_t t = 0; t < d.m; ++t) u[static_cast<size_t>(hist + t)] = load_f32(x.data(), dt, t * d.c + c);
      for (int64_t t = 0; t < d.m; ++t) {
        float acc = 0.0f;
        for (int64_t j = 0; j < d.k; ++j) acc = acc + w[static_cast<size_t>(j)] * u[static_cast<size_t>(t + j)];
        y[static_cast<size_t>((c - c0) * d.m + t)] = round_to(acc, dt);
      }
      for (int64_t r = 0; r < hist; ++r)
        store_f32(state.mutable_data(), dt, r * d.c + c, u[static_cast<size_t>(d.m + r)]);
    }
    if (n->silu) exact::silu_n(y.data(), y.data(), static_cast<int>(y.size()));  // the SiLUs side by side
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t t = 0; t < d.m; ++t)
        store_f32(out.mutable_data(), dt, t * d.c + c, y[static_cast<size_t>((c - c0) * d.m + t)]);
  });
  return ctx.out(n->out.get(), std::move(out));
}

// x * rsqrt(sum x_i^2 + 1e-6) in place (the sum in index order).
void l2_normalize(float* x, int64_t n) {
  float ss = 0.0f;
  for (int64_t i = 0; i < n; ++i) ss = ss + x[i] * x[i];
  const float r = exact::rsqrt(ss + 1e-6f);
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] * r;
}

struct DeltaInputs {
  const DeltaDims& d;
  const std::vector<float>&qkv, &a, &b, &a_log, &dt_bias;
  DType dt;
  float scale;
  bool l2norm;
};

// Value head h through rows 0 .. m - 1: s is its state [dk, dv], out [m, hv, dv].
void delta_head(const DeltaInputs& in, int64_t h, float* s, Tensor& out) {
  const DeltaDims& d = in.d;
  const int64_t kh = h / (d.hv / d.hk), dk = d.dk, dv = d.dv;
  std::vector<float> q(static_cast<size_t>(dk)), k(static_cast<size_t>(dk)), m(static_cast<size_t>(dv)),
      o(static_cast<size_t>(dv));
  for (int64_t t = 0; t < d.m; ++t) {
    const float* row = in.qkv.data() + t * d.width;
    std::copy(row + kh * dk, row + (kh + 1) * dk, q.begin());
    std::copy(row + (d.hk + kh) * dk, row + (d.hk + kh + 1) * dk, k.begin());
    const float* v = row + 2 * d.hk * dk + h * dv;
    if (in.l2norm) {
      l2_normalize(q.data(), dk);
      l2_normalize(k.data(), dk);
    }
    for (float& e : q) e = e * in.scale;
    const float beta = round_to(exact::sigmoid(in.b[static_cast<size_t>(t * d.hv + h)]), in.dt);
    const float g = -exact::exp(in.a_log[static_cast<size_t>(h)]) *
                    exact::softplus(in.a[static_cast<size_t>(t * d.hv + h)] + in.dt_bias[static_cast<size_t>(h)]);
    const float alpha = exact::exp(g);
    // Two passes over the state, rows i in order, the columns j side by side (each column's
    // sums stay in index order): decay and m = S^T k, then the update and o = S^T q.
    float* mj = m.data();
    float* oj = o.data();
    std::fill(m.begin(), m.end(), 0.0f);
    for (int64_t i = 0; i < dk; ++i) {
      float* row = s + i * dv;
      const float ki = k[static_cast<size_t>(i)];
      for (int64_t j = 0; j < dv; ++j) {
        row[j] = row[j] * alpha;
        mj[j] = mj[j] + row[j] * ki;
      }
    }
    for (int64_t j = 0; j < dv; ++j) mj[j] = (v[j] - mj[j]) * beta;  // the delta
    std::fill(o.begin(), o.end(), 0.0f);
    for (int64_t i = 0; i < dk; ++i) {
      float* row = s + i * dv;
      const float ki = k[static_cast<size_t>(i)], qi = q[static_cast<size_t>(i)];
      for (int64_t j = 0; j < dv; ++j) {
        row[j] = row[j] + ki * mj[j];
        oj[j] = oj[j] + row[j] * qi;
      }
    }
    for (int64_t j = 0; j < dv; ++j) store_f32(out.mutable_data(), in.dt, (t * d.hv + h) * dv + j, oj[j]);
  }
}

Status gated_delta_rule(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsGatedDeltaRuleNode();
  SB_ASSIGN_OR_RETURN(Tensor qkv, ctx.in(n->qkv.get()));
  SB_ASSIGN_OR_RETURN(Tensor a, ctx.in(n->a.get()));
  SB_ASSIGN_OR_RETURN(Tensor b, ctx.in(n->b.get()));
  SB_ASSIGN_OR_RETURN(Tensor a_log, ctx.in(n->a_log.get()));
  SB_ASSIGN_OR_RETURN(Tensor dt_bias, ctx.in(n->dt_bias.get()));
  SB_ASSIGN_OR_RETURN(int64_t pos, ctx.resolve(n->pos.get()));
  SB_ASSIGN_OR_RETURN(Tensor state, ctx.inplace(n->state.get()));
  SB_ASSIGN_OR_RETURN(DeltaDims d, gated_delta_rule_dims(qkv, a, b, a_log, dt_bias, state, pos));
  float* s = state.mutable_data_as<float>();
  if (pos == 0) std::fill(s, s + state.numel(), 0.0f);  // a sequence starts
  const std::vector<float> xf = widen_f32(qkv), af = widen_f32(a), bf = widen_f32(b), lf = widen_f32(a_log),
                           df = widen_f32(dt_bias);
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(qkv.dtype(), {d.m, d.hv, d.dv}));
  const DeltaInputs in{d, xf, af, bf, lf, df, qkv.dtype(), n->scale, n->l2norm};
  parallel_for(d.hv, 1, [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h) delta_head(in, h, s + h * d.dk * d.dv, out);
  });
  return ctx.out(n->out.get(), std::move(out));
}

}  // namespace

void register_linear_attention_kernels(KernelRegistry& r) {
  r.add(fb::OpNode::CausalConv1dNode, causal_conv1d);
  r.add(fb::OpNode::GatedDeltaRuleNode, gated_delta_rule);
}

}  // namespace switchboard::cpu
