// Cast between any two dtypes (rules stated at CastNode in schema/program.fbs).
#include <cmath>
#include <limits>

#include "cpu_common.h"

namespace switchboard::cpu {
namespace {

// int -> float with one rounding to nearest even into `to`. Through f32 alone
// would round twice for bf16 when |v| >= 2^24 (f16 overflows long before).
float int_to_float(int64_t v, DType to) {
  uint64_t mag = v < 0 ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  if (to != DType::kBF16 || mag < (1u << 24)) return static_cast<float>(v);
  int shift = 64 - __builtin_clzll(mag) - 8;  // keep bf16's 8 significant bits
  uint64_t q = mag >> shift, rem = mag & ((uint64_t{1} << shift) - 1), half = uint64_t{1} << (shift - 1);
  if (rem > half || (rem == half && (q & 1))) ++q;
  float f = std::ldexp(static_cast<float>(q), shift);  // exact: q has at most 9 bits
  return v < 0 ? -f : f;
}

// Truncates toward zero and saturates at the range of `t`; NaN becomes 0.
int64_t float_to_int(float v, DType t) {
  if (t == DType::kBool) return v != 0.f;  // NaN != 0, so NaN -> true
  if (v != v) return 0;
  double lo, hi;
  switch (t) {
    case DType::kI32: lo = -2147483648.0; hi = 2147483647.0; break;
    case DType::kU32: lo = 0; hi = 4294967295.0; break;
    case DType::kU8: lo = 0; hi = 255; break;
    default: lo = -9223372036854775808.0; hi = 9223372036854775807.0; break;
  }
  double d = std::trunc(static_cast<double>(v));
  if (d <= lo) return t == DType::kI64 ? std::numeric_limits<int64_t>::min() : static_cast<int64_t>(lo);
  if (d >= hi) return t == DType::kI64 ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(hi);
  return static_cast<int64_t>(d);
}

Status cast(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsCastNode();
  SB_ASSIGN_OR_RETURN(Tensor x, ctx.in(n->x.get()));
  const auto to = static_cast<DType>(n->dtype);
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::zeros(to, x.shape()));
  const int64_t count = x.numel();
  const bool from_float = dtype_is_float(x.dtype()), to_float = dtype_is_float(to);
  for (int64_t i = 0; i < count; ++i) {
    if (from_float) {
      float v = load_f32(x.data(), x.dtype(), i);
      if (to_float) store_f32(out.mutable_data(), to, i, v);
      else store_i64(out.mutable_data(), to, i, float_to_int(v, to));
    } else {
      int64_t v = load_i64(x.data(), x.dtype(), i);
      if (to_float) store_f32(out.mutable_data(), to, i, int_to_float(v, to));
      else store_i64(out.mutable_data(), to, i, v);
    }
  }
  return ctx.out(n->out.get(), std::move(out));
}

}  // namespace

void register_cast_kernels(KernelRegistry& r) { r.add(fb::OpNode::CastNode, cast); }

}  // namespace switchboard::cpu
