// The op families' shape rules (op_shapes.h), shared by every device.
#include "op_shapes.h"

#include <algorithm>
#include <climits>

#include "dim_rules.h"
#include "element_access.h"

namespace switchboard::ops {

Result<int64_t> normalize_axis(int64_t axis, int64_t rank) {
  int64_t a = axis < 0 ? axis + rank : axis;
  SB_CHECK_OR_RETURN(a >= 0 && a < rank, StatusCode::kInvalidArgument, "axis %lld out of range for rank %lld",
                     static_cast<long long>(axis), static_cast<long long>(rank));
  return a;
}

Result<std::vector<int64_t>> read_indices(KernelContext& ctx, const std::unique_ptr<fb::Tid>& tid, const char* field,
                                          int64_t limit) {
  std::vector<int64_t> v;
  if (!tid) return v;
  SB_ASSIGN_OR_RETURN(Tensor t, ctx.in(tid.get()));
  const int32_t* p = t.data_as<int32_t>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    SB_CHECK_OR_RETURN(p[i] >= 0 && p[i] < limit, StatusCode::kOutOfRange, "%s[%lld] = %d out of range [0, %lld)",
                       field, (long long)i, p[i], (long long)limit);
    v.push_back(p[i]);
  }
  return v;
}

Result<Shape> full_shape(KernelContext& ctx, const fb::FullNodeT& n) {
  Shape shape;
  for (size_t i = 0; i < n.shape.size(); ++i) {
    SB_ASSIGN_OR_RETURN(int64_t d, ctx.resolve(n.shape[i].get()));
    SB_CHECK_OR_RETURN(d >= 0, StatusCode::kInvalidArgument, "shape[%zu] = %lld is negative", i, (long long)d);
    shape.push_back(d);
  }
  return shape;
}

void fill_value(void* data, DType t, int64_t count, double v) {
  const int64_t iv = v != v                        ? 0
                     : v >= 9.2233720368547758e18  ? INT64_MAX
                     : v <= -9.2233720368547758e18 ? INT64_MIN
                                                   : static_cast<int64_t>(v);
  for (int64_t i = 0; i < count; ++i) {
    if (dtype_is_float(t))
      store_f32(data, t, i, static_cast<float>(v));
    else
      store_i64(data, t, i, t == DType::kBool ? (v != 0) : iv);
  }
}

Result<std::pair<int64_t, int64_t>> slice_range(KernelContext& ctx, const fb::SliceNodeT& n, const Tensor& x,
                                                int64_t axis) {
  SB_ASSIGN_OR_RETURN(int64_t start, ctx.resolve(n.start.get()));
  SB_ASSIGN_OR_RETURN(int64_t stop, ctx.resolve(n.stop.get()));
  const int64_t d = x.dim(axis);
  auto clamp = [d](int64_t v) { return std::clamp(v < 0 ? v + d : v, int64_t{0}, d); };
  start = clamp(start);
  return std::make_pair(start, std::max(start, clamp(stop)));
}

Result<Shape> concat_shape(const std::vector<Tensor>& xs, int64_t axis) {
  std::vector<Shape> shapes;
  for (const Tensor& x : xs) shapes.push_back(x.shape());
  return concat_out(shapes, axis);
}

Result<TransposePlan> transpose_plan(const Tensor& x, const std::vector<int32_t>& perm) {
  TransposePlan p;
  SB_ASSIGN_OR_RETURN(p.out_shape, transpose_out(x.shape(), perm));
  std::vector<int64_t> stride(perm.size(), 1);
  for (int64_t a = x.rank() - 2; a >= 0; --a) stride[a] = stride[a + 1] * x.dim(a + 1);
  for (int32_t ax : perm) {
    const int64_t d = x.dim(ax);
    if (d == 1) continue;
    if (!p.dims.empty() && p.src_strides.back() == stride[ax] * d) {
      p.dims.back() *= d;  // adjacent in x too: one axis
      p.src_strides.back() = stride[ax];
    } else {
      p.dims.push_back(d);
      p.src_strides.push_back(stride[ax]);
    }
  }
  return p;
}

Result<MatmulDims> matmul_dims(const Tensor& a, const Tensor& b, bool transpose_b, const Tensor& bias) {
  SB_RETURN_IF_ERROR(matmul_out(a.shape(), b.shape(), transpose_b).status());
  MatmulDims m;
  m.k = a.dim(a.rank() - 1);
  m.rows = 1;  // product of a's leading dims (K may be 0)
  for (int64_t d = 0; d + 1 < a.rank(); ++d) m.rows *= a.dim(d);
  m.cols = transpose_b ? b.dim(0) : b.dim(1);
  if (bias.defined())
    SB_CHECK_OR_RETURN(bias.rank() == 1 && bias.dim(0) == m.cols, StatusCode::kInvalidArgument,
                       "bias %s, expected [%lld]", shape_str(bias.shape()).c_str(), (long long)m.cols);
  return m;
}

Result<MatmulDims> batch_matmul_dims(const Tensor& a, const Tensor& b, bool transpose_b) {
  SB_RETURN_IF_ERROR(batch_matmul_out(a.shape(), b.shape(), transpose_b).status());
  MatmulDims m;
  m.batch = a.dim(0);
  m.rows = a.dim(1);
  m.k = a.dim(2);
  m.cols = transpose_b ? b.dim(1) : b.dim(2);
  const int64_t bb = b.dim(0);
  m.group = bb ? m.batch / bb : 1;
  return m;
}

Result<AttentionDims> attention_dims(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* sinks,
                                     int64_t pos, bool seq_major) {
  SB_CHECK_OR_RETURN(q.rank() == 3 && k.rank() == 3 && k.shape() == v.shape(), StatusCode::kInvalidArgument,
                     "q %s, k_cache %s, v_cache %s: need q [m, hq, hd] and equal caches [hk, S, hd]",
                     shape_str(q.shape()).c_str(), shape_str(k.shape()).c_str(), shape_str(v.shape()).c_str());
  AttentionDims d{q.dim(0), q.dim(1), k.dim(seq_major ? 1 : 0), q.dim(2), k.dim(seq_major ? 0 : 1), pos, 0};
  d.key_stride = seq_major ? d.hk * d.hd : d.hd;
  d.head_stride = seq_major ? d.hd : d.cache * d.hd;
  SB_CHECK_OR_RETURN(d.hk > 0 && d.hq % d.hk == 0 && k.dim(2) == d.hd, StatusCode::kInvalidArgument,
                     "q %s does not fit caches %s (heads a multiple of the cache's, same head dim)",
                     shape_str(q.shape()).c_str(), shape_str(k.shape()).c_str());
  SB_CHECK_OR_RETURN(pos >= 0 && pos <= d.cache - d.m, StatusCode::kOutOfRange,
                     "pos %lld + %lld queries exceeds the cache length %lld", (long long)pos, (long long)d.m,
                     (long long)d.cache);
  SB_CHECK_OR_RETURN(!sinks || sinks->shape() == Shape{d.hq}, StatusCode::kInvalidArgument,
                     "sinks %s: need [%lld]", shape_str(sinks->shape()).c_str(), (long long)d.hq);
  d.len = pos + d.m;
  return d;
}

Result<RopeDims> rope_dims(const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t pos,
                           const Tensor* norm_weight, const Tensor* cache) {
  SB_CHECK_OR_RETURN(x.rank() == 3 && cos.rank() == 2 && cos.shape() == sin.shape(), StatusCode::kInvalidArgument,
                     "x %s, cos %s, sin %s: need x [m, h, hd] and equal tables [S, half]", shape_str(x.shape()).c_str(),
                     shape_str(cos.shape()).c_str(), shape_str(sin.shape()).c_str());
  RopeDims d{x.dim(0), x.dim(1), x.dim(2), cos.dim(1), cos.dim(0), pos};
  SB_CHECK_OR_RETURN(2 * d.half <= d.hd, StatusCode::kInvalidArgument, "tables of %lld frequencies for a head of %lld",
                     (long long)d.half, (long long)d.hd);
  SB_CHECK_OR_RETURN(pos >= 0 && pos <= d.table_rows - d.m, StatusCode::kOutOfRange,
                     "pos %lld + %lld rows exceeds the tables' %lld positions", (long long)pos, (long long)d.m,
                     (long long)d.table_rows);
  SB_CHECK_OR_RETURN(!norm_weight || norm_weight->shape() == Shape{d.hd}, StatusCode::kInvalidArgument,
                     "norm_weight %s: need [%lld]", shape_str(norm_weight->shape()).c_str(), (long long)d.hd);
  if (cache) {
    SB_CHECK_OR_RETURN(cache->rank() == 3 && cache->dim(1) == d.h && cache->dim(2) == d.hd,
                       StatusCode::kInvalidArgument, "cache %s does not hold rows of x %s",
                       shape_str(cache->shape()).c_str(), shape_str(x.shape()).c_str());
    SB_CHECK_OR_RETURN(pos <= cache->dim(0) - d.m, StatusCode::kOutOfRange,
                       "pos %lld + %lld rows exceeds the cache's %lld", (long long)pos, (long long)d.m,
                       (long long)cache->dim(0));
  }
  return d;
}

Result<RopeDims> rope_qkv_dims(const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t pos,
                               const Tensor* norm_weight, const Tensor* k_norm_weight, const Tensor& cache,
                               const Tensor& v_cache, int64_t q_heads, int64_t k_heads) {
  SB_ASSIGN_OR_RETURN(RopeDims d, rope_dims(x, cos, sin, pos, norm_weight));
  SB_CHECK_OR_RETURN(q_heads > 0 && k_heads > 0 && d.h >= q_heads + 2 * k_heads, StatusCode::kInvalidArgument,
                     "x %s: need q_heads %lld + 2 * k_heads %lld heads", shape_str(x.shape()).c_str(),
                     (long long)q_heads, (long long)k_heads);
  SB_CHECK_OR_RETURN(!k_norm_weight || k_norm_weight->shape() == Shape{d.hd}, StatusCode::kInvalidArgument,
                     "k_norm_weight %s: need [%lld]", shape_str(k_norm_weight->shape()).c_str(), (long long)d.hd);
  for (const Tensor* c : {&cache, &v_cache}) {
    SB_CHECK_OR_RETURN(c->rank() == 3 && c->dim(1) == k_heads && c->dim(2) == d.hd, StatusCode::kInvalidArgument,
                       "cache %s does not hold %lld heads of %lld", shape_str(c->shape()).c_str(), (long long)k_heads,
                       (long long)d.hd);
    SB_CHECK_OR_RETURN(pos <= c->dim(0) - d.m, StatusCode::kOutOfRange, "pos %lld + %lld rows exceeds the cache's %lld",
                       (long long)pos, (long long)d.m, (long long)c->dim(0));
  }
  d.q_heads = q_heads;
  d.k_heads = k_heads;
  return d;
}

Result<ConvDims> causal_conv1d_dims(const Tensor& x, const Tensor& weight, const Tensor& state, int64_t pos) {
  SB_CHECK_OR_RETURN(x.rank() == 2 && weight.rank() == 2 && state.rank() == 2, StatusCode::kInvalidArgument,
                     "x %s, weight %s, state %s: need [m, C], [C, K], [K - 1, C]", shape_str(x.shape()).c_str(),
                     shape_str(weight.shape()).c_str(), shape_str(state.shape()).c_str());
  ConvDims d{x.dim(0), x.dim(1), weight.dim(1)};
  SB_CHECK_OR_RETURN(d.k >= 1 && weight.dim(0) == d.c && state.shape() == (Shape{d.k - 1, d.c}),
                     StatusCode::kInvalidArgument, "x %s, weight %s, state %s: need [m, C], [C, K >= 1], [K - 1, C]",
                     shape_str(x.shape()).c_str(), shape_str(weight.shape()).c_str(), shape_str(state.shape()).c_str());
  SB_CHECK_OR_RETURN(pos >= 0 && pos <= INT32_MAX, StatusCode::kOutOfRange, "pos %lld is outside [0, 2^31)",
                     (long long)pos);
  return d;
}

Result<DeltaDims> gated_delta_rule_dims(const Tensor& qkv, const Tensor& a, const Tensor& b, const Tensor& a_log,
                                        const Tensor& dt_bias, const Tensor& state, int64_t pos) {
  SB_CHECK_OR_RETURN(qkv.rank() == 2 && state.rank() == 3, StatusCode::kInvalidArgument,
                     "qkv %s, state %s: need [m, C] and [hv, dk, dv]", shape_str(qkv.shape()).c_str(),
                     shape_str(state.shape()).c_str());
  DeltaDims d{qkv.dim(0), 0, state.dim(0), state.dim(1), state.dim(2), qkv.dim(1)};
  const Shape heads{d.m, d.hv}, one{d.hv};
  SB_CHECK_OR_RETURN(a.shape() == heads && b.shape() == heads && a_log.shape() == one && dt_bias.shape() == one,
                     StatusCode::kInvalidArgument, "a %s, b %s, a_log %s, dt_bias %s: need [%lld, %lld] and [%lld]",
                     shape_str(a.shape()).c_str(), shape_str(b.shape()).c_str(), shape_str(a_log.shape()).c_str(),
                     shape_str(dt_bias.shape()).c_str(), (long long)d.m, (long long)d.hv, (long long)d.hv);
  const int64_t qk = d.width - d.hv * d.dv;
  SB_CHECK_OR_RETURN(d.hv > 0 && d.dk > 0 && d.dv > 0 && qk > 0 && qk % (2 * d.dk) == 0, StatusCode::kInvalidArgument,
                     "qkv width %lld is not 2 hk * %lld + %lld * %lld", (long long)d.width, (long long)d.dk,
                     (long long)d.hv, (long long)d.dv);
  d.hk = qk / (2 * d.dk);
  SB_CHECK_OR_RETURN(d.hv % d.hk == 0, StatusCode::kInvalidArgument,
                     "%lld value heads are not a multiple of %lld key heads", (long long)d.hv, (long long)d.hk);
  SB_CHECK_OR_RETURN(pos >= 0 && pos <= INT32_MAX, StatusCode::kOutOfRange, "pos %lld is outside [0, 2^31)",
                     (long long)pos);
  return d;
}

Status check_slice_update(const Tensor& u, const Tensor& dst, int64_t axis, int64_t start) {
  SB_CHECK_OR_RETURN(u.rank() == dst.rank(), StatusCode::kInvalidArgument, "update rank differs from dst");
  for (int64_t k = 0; k < dst.rank(); ++k)
    SB_CHECK_OR_RETURN(k == axis || u.dim(k) == dst.dim(k), StatusCode::kInvalidArgument,
                       "update %s does not match dst %s outside axis %lld", shape_str(u.shape()).c_str(),
                       shape_str(dst.shape()).c_str(), (long long)axis);
  const int64_t d = dst.dim(axis), len = u.dim(axis);
  SB_CHECK_OR_RETURN(start >= 0 && start <= d - len, StatusCode::kOutOfRange,
                     "start %lld + length %lld exceeds dst dim %lld", (long long)start, (long long)len, (long long)d);
  return Status::ok();
}

AxisSplit split_at(const Shape& s, int64_t axis) {
  AxisSplit r;
  for (int64_t i = 0; i < static_cast<int64_t>(s.size()); ++i) {
    if (i < axis)
      r.outer *= s[i];
    else if (i == axis)
      r.dim = s[i];
    else
      r.inner *= s[i];
  }
  return r;
}

Result<Shape> broadcast_shape(const Shape& a, const Shape& b) { return broadcast_dims(a, b); }

std::vector<int64_t> broadcast_strides(const Shape& s, const Shape& out) {
  std::vector<int64_t> st(out.size(), 0);
  int64_t stride = 1;
  for (size_t k = 0; k < s.size(); ++k) {
    size_t i = s.size() - 1 - k, o = out.size() - 1 - k;
    st[o] = s[i] == 1 ? 0 : stride;
    stride *= s[i];
  }
  return st;
}

Result<Shape> reshape_shape(KernelContext& ctx, const fb::ReshapeNodeT& n, const Tensor& x) {
  Shape shape;
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < n.shape.size(); ++i) {
    SB_ASSIGN_OR_RETURN(int64_t d, ctx.resolve(n.shape[i].get()));
    if (d == -1) {
      SB_CHECK_OR_RETURN(infer < 0, StatusCode::kInvalidArgument, "shape has more than one -1");
      infer = static_cast<int>(i);
    } else {
      SB_CHECK_OR_RETURN(d >= 0, StatusCode::kInvalidArgument, "shape[%zu] = %lld is negative", i, (long long)d);
      SB_CHECK_OR_RETURN(d == 0 || known <= INT64_MAX / d, StatusCode::kOutOfRange, "shape overflows");
      known *= d;
    }
    shape.push_back(d);
  }
  if (infer >= 0) {
    SB_CHECK_OR_RETURN(known != 0 && x.numel() % known == 0, StatusCode::kInvalidArgument,
                       "cannot infer -1: %lld elements into %s", (long long)x.numel(), shape_str(shape).c_str());
    shape[infer] = x.numel() / known;
  }
  return shape;
}

}  // namespace switchboard::ops
