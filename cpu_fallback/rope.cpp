// Rotary embedding (schema RopeNode) in HF's rotate_half form, each product and sum rounded to
// x's dtype as the Mul, Sub and Add it replaces store them (docs/numerics.md); optionally each
// head RMSNorm'd first (order Tree32) and the result appended to a [S, h, hd] cache.
#include <cstring>

#include "cpu_common.h"
#include "parallel.h"

namespace switchboard::cpu {
namespace {

// x's heads as f32, RMSNorm'd in place when a weight is given (RmsNorm Tree32's bits).
std::vector<float> rope_input(const Tensor& x, const Tensor* w, float eps, const RopeDims& d) {
  std::vector<float> xf = widen_f32(x);
  if (!w) return xf;
  const std::vector<float> wf = widen_f32(*w);
  const float inv_d = inverse_count(d.hd);
  parallel_for(d.m * d.h, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* xr = xf.data() + r * d.hd;
      const float inv = rms_scale(xr, d.hd, inv_d, eps, true);
      for (int64_t e = 0; e < d.hd; ++e) xr[e] = round_to((xr[e] * inv) * wf[static_cast<size_t>(e)], x.dtype());
    }
  });
  return xf;
}

Status rope(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsRopeNode();
  SB_ASSIGN_OR_RETURN(Tensor x, ctx.in(n->x.get()));
  SB_ASSIGN_OR_RETURN(Tensor cos, ctx.in(n->cos.get()));
  SB_ASSIGN_OR_RETURN(Tensor sin, ctx.in(n->sin.get()));
  SB_ASSIGN_OR_RETURN(int64_t pos, ctx.resolve(n->pos.get()));
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
  const std::vector<float> xf = rope_input(x, n->norm_weight ? &w : nullptr, n->eps, d);
  const float *ct = cos.data_as<float>(), *st = sin.data_as<float>();
  parallel_for(d.m * d.h, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t p = pos + r / d.h, base = r * d.hd;
      for (int64_t e = 0; e < d.half; ++e) {
        const float c = round_to(ct[p * d.half + e], dt), s = round_to(st[p * d.half + e], dt);
        const float x1 = xf[static_cast<size_t>(base + e)], x2 = xf[static_cast<size_t>(base + d.half + e)];
        store_f32(out.mutable_data(), dt, base + e, round_to(x1 * c, dt) - round_to(x2 * s, dt));
        store_f32(out.mutable_data(), dt, base + d.half + e, round_to(x2 * c, dt) + round_to(x1 * s, dt));
      }
      for (int64_t e = 2 * d.half; e < d.hd; ++e)
        store_f32(out.mutable_data(), dt, base + e, xf[static_cast<size_t>(base + e)]);
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
