// Rotary embedding (schema RopeNode) in HF's rotate_half form, each product and sum rounded to
// x's dtype as the Mul, Sub and Add it replaces store them (docs/numerics.md).
#include "cpu_common.h"
#include "parallel.h"

namespace switchboard::cpu {
namespace {

Status rope(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsRopeNode();
  SB_ASSIGN_OR_RETURN(Tensor x, ctx.in(n->x.get()));
  SB_ASSIGN_OR_RETURN(Tensor cos, ctx.in(n->cos.get()));
  SB_ASSIGN_OR_RETURN(Tensor sin, ctx.in(n->sin.get()));
  SB_ASSIGN_OR_RETURN(int64_t pos, ctx.resolve(n->pos.get()));
  SB_ASSIGN_OR_RETURN(RopeDims d, rope_dims(x, cos, sin, pos));
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(x.dtype(), x.shape()));
  const DType dt = x.dtype();
  const float *ct = cos.data_as<float>(), *st = sin.data_as<float>();
  parallel_for(d.m * d.h, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t p = pos + r / d.h, base = r * d.hd;
      for (int64_t e = 0; e < d.half; ++e) {
        const float c = round_to(ct[p * d.half + e], dt), s = round_to(st[p * d.half + e], dt);
        const float x1 = load_f32(x.data(), dt, base + e), x2 = load_f32(x.data(), dt, base + d.half + e);
        store_f32(out.mutable_data(), dt, base + e, round_to(x1 * c, dt) - round_to(x2 * s, dt));
        store_f32(out.mutable_data(), dt, base + d.half + e, round_to(x2 * c, dt) + round_to(x1 * s, dt));
      }
      for (int64_t e = 2 * d.half; e < d.hd; ++e) store_f32(out.mutable_data(), dt, base + e, load_f32(x.data(), dt, base + e));
    }
  });
  return ctx.out(n->out.get(), std::move(out));
}

}  // namespace

void register_rope_kernels(KernelRegistry& r) { r.add(fb::OpNode::RopeNode, rope); }

}  // namespace switchboard::cpu
