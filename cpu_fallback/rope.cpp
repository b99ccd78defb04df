// Rotary embedding (schema RopeNode) in HF's rotate_half form, each product and sum rounded to
// x's dtype as the Mul, Sub and Add it replaces store them (docs/numerics.md); optionally each
// head RMSNorm'd first (order Tree32) and the result appended to a [S, h, hd] cache. The fused
// q/k/v form (schema v8) runs the same head steps over the queries, the keys and the values.
#include <cstring>

#include "cpu_common.h"
#include "parallel.h"

namespace switchboard::cpu {
namespace {

// A head row of f32 values RMSNorm'd in place with weight wf (RmsNorm Tree32's bits).
void norm_head(float* xr, const std::vector<float>& wf, float eps, const RopeDims& d, DType dt) {
  const float inv = rms_scale(xr, d.hd, inverse_count(d.hd), eps, true);
  for (int64_t e = 0; e < d.hd; ++e) xr[e] = round_to((xr[e] * inv) * wf[static_cast<size_t>(e)], dt);
}

// A head row at position p rotated into dst's elements base .. base + hd - 1.
void rotate_head(const float* xr, const float* ct, const float* st, int64_t p, const RopeDims& d, DType dt, void* dst,
                 int64_t base) {
  for (int64_t e = 0; e < d.half; ++e) {
    const float c = round_to(ct[p * d.half + e], dt), s = round_to(st[p * d.half + e], dt);
    const float x1 = xr[e], x2 = xr[d.half + e];
    store_f32(dst, dt, base + e, round_to(x1 * c, dt) - round_to(x2 * s, dt));
    store_f32(dst, dt, base + d.half + e, round_to(x2 * c, dt) + round_to(x1 * s, dt));
  }
  for (int64_t e = 2 * d.half; e < d.hd; ++e) store_f32(dst, dt, base + e, xr[e]);
}

std::vector<float> widen_weight(const Tensor* w) { return w ? widen_f32(*w) : std::vector<float>(); }

// The fused form: a query head (-> out) or a key head (-> cache) per task, read from x one head row
// at a time; the values' bytes go to v_cache unchanged.
Status rope_qkv(KernelContext& ctx, const fb::RopeNodeT& n, const Tensor& x, const Tensor& cos, const Tensor& sin,
                int64_t pos) {
  Tensor qw, kw, cache, vcache;
  if (n.norm_weight) {
    SB_ASSIGN_OR_RETURN(qw, ctx.in(n.norm_weight.get()));
  }
  if (n.k_norm_weight) {
    SB_ASSIGN_OR_RETURN(kw, ctx.in(n.k_norm_weight.get()));
  }
  SB_ASSIGN_OR_RETURN(cache, ctx.inplace(n.cache.get()));
  SB_ASSIGN_OR_RETURN(vcache, ctx.inplace(n.v_cache.get()));
  SB_ASSIGN_OR_RETURN(RopeDims d, rope_qkv_dims(x, cos, sin, pos, n.norm_weight ? &qw : nullptr,
                                                n.k_norm_weight ? &kw : nullptr, cache, vcache, n.q_heads, n.k_heads));
  const DType dt = x.dtype();
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(dt, {d.m, d.q_heads, d.hd}));
  const std::vector<float> qwf = widen_weight(n.norm_weight ? &qw : nullptr),
                           kwf = widen_weight(n.k_norm_weight ? &kw : nullptr);
  const float *ct = cos.data_as<float>(), *st = sin.data_as<float>();
  const int64_t first_k = d.h - 2 * d.k_heads;
  const size_t row_bytes = static_cast<size_t>(d.hd) * dtype_size(dt);
  // The values are copied as they are: one contiguous run of k_heads rows per token.
  for (int64_t i = 0; i < d.m; ++i)
    std::memcpy(static_cast<uint8_t*>(vcache.mutable_data()) + static_cast<size_t>((pos + i) * d.k_heads) * row_bytes,
                static_cast<const uint8_t*>(x.data()) + static_cast<size_t>(i * d.h + first_k + d.k_heads) * row_bytes,
                static_cast<size_t>(d.k_heads) * row_bytes);
  const int64_t heads = d.q_heads + d.k_heads;  // the rotated ones
  parallel_for(d.m * heads, 16, [&](int64_t r0, int64_t r1) {
    std::vector<float> row(static_cast<size_t>(d.hd));
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t i = r / heads, j = r % heads, kj = j - d.q_heads;  // kj: the key head
      const int64_t src = (i * d.h + (j < d.q_heads ? j : first_k + kj)) * d.hd;
      for (int64_t e = 0; e < d.hd; ++e) row[static_cast<size_t>(e)] = load_f32(x.data(), dt, src + e);
      const std::vector<float>& w = j < d.q_heads ? qwf : kwf;
      if (!w.empty()) norm_head(row.data(), w, n.eps, d, dt);
      if (j < d.q_heads)
        rotate_head(row.data(), ct, st, pos + i, d, dt, out.mutable_data(), (i * d.q_heads + j) * d.hd);
      else
        rotate_head(row.data(), ct, st, pos + i, d, dt, cache.mutable_data(), ((pos + i) * d.k_heads + kj) * d.hd);
    }
  });
  return ctx.out(n.out.get(), std::move(out));
}

Status rope(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsRopeNode();
  SB_ASSIGN_OR_RETURN(Tensor x, ctx.in(n->x.get()));
  SB_ASSIGN_OR_RETURN(Tensor cos, ctx.in(n->cos.get()));
  SB_ASSIGN_OR_RETURN(Tensor sin, ctx.in(n->sin.get()));
  SB_ASSIGN_OR_RETURN(int64_t pos, ctx.resolve(n->pos.get()));
  if (n->k_heads > 0) return rope_qkv(ctx, *n, x, cos, sin, pos);
  Tensor w, cache;
  if (n->norm_weight) {
    SB_ASSIGN_OR_RETURN(w, ctx.in(n->norm_weight.get()));
  }
  if (n->cache) {
    SB_ASSIGN_OR_RETURN(cache, ctx.inplace(n->cache.get()));
  }
  SB_ASSIGN_OR_RETURN(RopeDims d,
                      rope_dims(x, cos, sin, pos, n->norm_weight ? &w : nullptr, n->cache ? &cache : nullptr));
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(x.dtype(), x.shape()));
  const DType dt = x.dtype();
  std::vector<float> xf = widen_f32(x);
  const std::vector<float> wf = widen_weight(n->norm_weight ? &w : nullptr);
  const float *ct = cos.data_as<float>(), *st = sin.data_as<float>();
  parallel_for(d.m * d.h, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* xr = xf.data() + r * d.hd;
      if (!wf.empty()) norm_head(xr, wf, n->eps, d, dt);
      rotate_head(xr, ct, st, pos + r / d.h, d, dt, out.mutable_data(), r * d.hd);
    }
  });
  if (n->cache)  // rows pos .. pos + m - 1 of [S, h, hd] are one contiguous run
    std::memcpy(static_cast<uint8_t*>(cache.mutable_data()) + static_cast<size_t>(pos * d.h * d.hd) * dtype_size(dt),
                out.data(), out.nbytes());
  return ctx.out(n->out.get(), std::move(out));
}

}  // namespace

void register_rope_kernels(KernelRegistry& r) { r.add(fb::OpNode::RopeNode, rope); }

}  // namespace switchboard::cpu
