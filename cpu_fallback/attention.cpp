// Attention over a KV cache in one op (schema AttentionNode), in either order of
// docs/numerics.md: Blocked32 (key blocks of 32, merged with a running max: the order every
// device splits the same way) or Decomposed (the bits of BatchMatmul, Mul, mask Add,
// Softmax, BatchMatmul, schema v5's only order).
#include <algorithm>
#include <array>

#include "cpu_common.h"
#include "exact_math.h"
#include "parallel.h"

namespace switchboard::cpu {
namespace {

// Rows 0..len-1 of each cache head, widened to f32: [hk, len, hd].
std::vector<float> widen_rows(const Tensor& cache, const AttentionDims& d) {
  std::vector<float> out(static_cast<size_t>(d.hk * d.len * d.hd));
  for (int64_t h = 0; h < d.hk; ++h)
    for (int64_t j = 0; j < d.len; ++j)
      for (int64_t e = 0; e < d.hd; ++e)
        out[static_cast<size_t>((h * d.len + j) * d.hd + e)] =
            load_f32(cache.data(), cache.dtype(), h * d.head_stride + j * d.key_stride + e);
  return out;
}

struct Step {
  const AttentionDims& d;
  const fb::AttentionNodeT& n;
  DType dt;
  const float *q, *k, *v, *sinks;
};

// One query row of one head: scores, softmax, then out[0..hd) (each dot32 column keeps its
// 32 partials over the keys, key j feeding partial j % 32).
void attend(const Step& st, int64_t i, int64_t h, std::vector<float>& s, std::vector<float>& acc, float* out) {
  const AttentionDims& d = st.d;
  const int64_t kh = h / (d.hq / d.hk), at = d.pos + i;
  const float* qv = st.q + (i * d.hq + h) * d.hd;
  for (int64_t j = 0; j < d.len; ++j) {
    float x = round_to(dot32(qv, st.k + (kh * d.len + j) * d.hd, d.hd), st.dt);
    x = round_to(x * st.n.scale, st.dt);
    if (j > at || (st.n.window > 0 && j <= at - st.n.window)) x = round_to(x + st.n.mask_value, st.dt);
    s[static_cast<size_t>(j)] = x;
  }
  const int64_t cols = d.len + (st.sinks ? 1 : 0);
  if (st.sinks) s[static_cast<size_t>(d.len)] = round_to(st.sinks[h] + 0.0f, st.dt);
  float m = s[0];
  for (int64_t j = 0; j < cols; ++j) m = max_f32(m, s[static_cast<size_t>(j)]);
  float sum = 0.0f;
  for (int64_t j = 0; j < cols; ++j) {
    s[static_cast<size_t>(j)] = exact::exp(s[static_cast<size_t>(j)] - m);
    sum = sum + s[static_cast<size_t>(j)];
  }
  const float r = exact::rcp(sum);
  std::fill(acc.begin(), acc.end(), 0.0f);
  for (int64_t j = 0; j < d.len; ++j) {
    const float p = round_to(s[static_cast<size_t>(j)] * r, st.dt);
    const float* vr = st.v + (kh * d.len + j) * d.hd;
    float* a = acc.data() + (j % 32) * d.hd;
    for (int64_t c = 0; c < d.hd; ++c) a[c] = a[c] + p * vr[c];
  }
  for (int64_t half = 16; half >= 1; half /= 2)
    for (int64_t l = 0; l < half; ++l)
      for (int64_t c = 0; c < d.hd; ++c) acc[l * d.hd + c] = acc[l * d.hd + c] + acc[(l + half) * d.hd + c];
  for (int64_t c = 0; c < d.hd; ++c) out[c] = round_to(acc[c], st.dt);
}

// Blocked32's caches as f32 rows: the cache itself when it is f32, else its first len rows
// of each head widened.
struct Rows {
  std::vector<float> widened;
  const float* base = nullptr;
  int64_t head_stride = 0, key_stride = 0;
  const float* row(int64_t kh, int64_t j) const { return base + kh * head_stride + j * key_stride; }
};
Rows f32_rows(const Tensor& cache, const AttentionDims& d) {
  Rows r;
  if (cache.dtype() == DType::kF32) {
    r.base = cache.data_as<float>();
    r.head_stride = d.head_stride;
    r.key_stride = d.key_stride;
  } else {
    r.widened = widen_rows(cache, d);
    r.base = r.widened.data();
    r.head_stride = d.len * d.hd;
    r.key_stride = d.hd;
  }
  return r;
}

struct BlockedStep {
  const AttentionDims& d;
  const fb::AttentionNodeT& n;
  DType dt;
  const float *q, *sinks;
  const Rows &k, &v;
};

// The running state (m, l, o) takes in one more block (mb, lb, ob): exps against the new max.
void merge(float& m, float& l, float* o, float mb, float lb, const float* ob, int64_t hd) {
  const float mn = max_f32(m, mb), a = exact::exp(m - mn), c = exact::exp(mb - mn);
  l = l * a + lb * c;
  for (int64_t x = 0; x < hd; ++x) o[x] = o[x] * a + ob[x] * c;
  m = mn;
}

// Per-task buffers of attend_heads for up to g heads.
struct HeadScratch {
  std::vector<float> o, ob, s, m, l, mb, lb;
  explicit HeadScratch(int64_t g, int64_t hd)
      : o(static_cast<size_t>(g * hd)),
        ob(static_cast<size_t>(g * hd)),
        s(static_cast<size_t>(g * kAttentionBlock)),
        m(static_cast<size_t>(g)),
        l(static_cast<size_t>(g)),
        mb(static_cast<size_t>(g)),
        lb(static_cast<size_t>(g)) {}
};

// Block [j0, j1)'s scores s[u * 32 + j - b0] and maxima mb[u] of heads h0 .. h0 + g - 1 (one cache
// head's). Four or more heads: each key row against four query rows at once (dot32(q, k) =
// dot32(k, q): the same products); fewer: each query row against four key rows at once.
void block_scores(const BlockedStep& st, int64_t i, int64_t h0, int64_t g, int64_t j0, int64_t j1, int64_t b0,
                  HeadScratch& w) {
  const AttentionDims& d = st.d;
  const int64_t kh = h0 / (d.hq / d.hk), hd = d.hd;
  auto take = [&](int64_t u, int64_t j, float dot) {
    float x = round_to(dot, st.dt);
    x = round_to(x * st.n.scale, st.dt);
    w.s[static_cast<size_t>(u * kAttentionBlock + j - b0)] = x;
    w.mb[static_cast<size_t>(u)] = j == j0 ? x : max_f32(w.mb[static_cast<size_t>(u)], x);
  };
  float dots[4];
  const float* rows[4];
  if (g >= 4) {
    for (int64_t j = j0; j < j1; ++j)
      for (int64_t u0 = 0; u0 < g; u0 += 4) {
        for (int64_t u = 0; u < 4; ++u) rows[u] = st.q + (i * d.hq + h0 + std::min(u0 + u, g - 1)) * hd;
        dot32_x4(st.k.row(kh, j), rows, hd, dots);
        for (int64_t u = 0; u < 4 && u0 + u < g; ++u) take(u0 + u, j, dots[u]);
      }
    return;
  }
  for (int64_t u = 0; u < g; ++u)
    for (int64_t j = j0; j < j1; j += 4) {
      for (int64_t t = 0; t < 4; ++t) rows[t] = st.k.row(kh, std::min(j + t, j1 - 1));  // a repeat past j1: unused
      dot32_x4(st.q + (i * d.hq + h0 + u) * hd, rows, hd, dots);
      for (int64_t t = 0; t < 4 && j + t < j1; ++t) take(u, j + t, dots[t]);
    }
}

// Query row i of heads h0 .. h0 + g - 1 (one cache head's) in Blocked32 order into out[u * hd ..]:
// each block's key and value rows are read once for all g heads.
void attend_heads(const BlockedStep& st, int64_t i, int64_t h0, int64_t g, HeadScratch& w, float* out) {
  const AttentionDims& d = st.d;
  const int64_t kh = h0 / (d.hq / d.hk), hd = d.hd;
  const KeyRange keys = visible_keys(d.pos + i, st.n.window);
  for (int64_t b0 = keys.lo - keys.lo % kAttentionBlock; b0 < keys.hi; b0 += kAttentionBlock) {
    const int64_t j0 = std::max(keys.lo, b0), j1 = std::min(keys.hi, b0 + kAttentionBlock), n = j1 - j0;
    block_scores(st, i, h0, g, j0, j1, b0, w);
    for (int64_t u = 0; u < g; ++u) {
      float* es = w.s.data() + u * kAttentionBlock + (j0 - b0);
      for (int64_t j = 0; j < n; ++j) es[j] = es[j] - w.mb[static_cast<size_t>(u)];
      exp_inplace(es, static_cast<int>(n));
      float lb = 0.0f;
      for (int64_t j = 0; j < n; ++j) lb = lb + es[j];
      w.lb[static_cast<size_t>(u)] = lb;
      std::fill_n(w.ob.data() + u * hd, hd, 0.0f);
      axpy_rows(w.ob.data() + u * hd, es, st.v.row(kh, j0), st.v.key_stride, n, hd);
    }
    for (int64_t u = 0; u < g; ++u) {
      const size_t su = static_cast<size_t>(u);
      if (j0 == keys.lo) {
        w.m[su] = w.mb[su], w.l[su] = w.lb[su];
        std::copy_n(w.ob.data() + u * hd, hd, w.o.data() + u * hd);
      } else {
        merge(w.m[su], w.l[su], w.o.data() + u * hd, w.mb[su], w.lb[su], w.ob.data() + u * hd, hd);
      }
    }
  }
  for (int64_t u = 0; u < g; ++u) {
    float &m = w.m[static_cast<size_t>(u)], &l = w.l[static_cast<size_t>(u)], *o = w.o.data() + u * hd;
    if (st.sinks) {  // a block of one key with l = 1 and no values
      const float sv = round_to(st.sinks[h0 + u] + 0.0f, st.dt);
      const float mn = max_f32(m, sv), a = exact::exp(m - mn), c = exact::exp(sv - mn);
      l = l * a + c;
      for (int64_t x = 0; x < hd; ++x) o[x] = o[x] * a;
      m = mn;
    }
    const float r = exact::rcp(l);
    for (int64_t x = 0; x < hd; ++x) out[u * hd + x] = round_to(o[x] * r, st.dt);
  }
}

Status attention(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsAttentionNode();
  SB_ASSIGN_OR_RETURN(Tensor q, ctx.in(n->q.get()));
  SB_ASSIGN_OR_RETURN(Tensor k, ctx.in(n->k_cache.get()));
  SB_ASSIGN_OR_RETURN(Tensor v, ctx.in(n->v_cache.get()));
  Tensor sinks;
  if (n->sinks) {
    SB_ASSIGN_OR_RETURN(sinks, ctx.in(n->sinks.get()));
  }
  SB_ASSIGN_OR_RETURN(int64_t pos, ctx.resolve(n->pos.get()));
  SB_ASSIGN_OR_RETURN(AttentionDims d, attention_dims(q, k, v, n->sinks ? &sinks : nullptr, pos, n->seq_major));
  const std::vector<float> qf = widen_f32(q);
  const std::vector<float> sf = n->sinks ? widen_f32(sinks) : std::vector<float>{};
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(q.dtype(), {d.m, d.hq * d.hd}));
  if (n->order == fb::AttentionOrder::Blocked32) {
    const Rows kr = f32_rows(k, d), vr = f32_rows(v, d);
    const BlockedStep st{d, *n, q.dtype(), qf.data(), n->sinks ? sf.data() : nullptr, kr, vr};
    // Prefill rows: a task per (row, cache head), its query heads together; decode: a task per head
    // (more tasks for the threads). The same bits either way.
    const int64_t g = d.m >= 4 && d.hq > 0 ? d.hq / d.hk : 1;
    parallel_for(d.m * (d.hq / g), 1, [&](int64_t r0, int64_t r1) {
      HeadScratch w(g, d.hd);
      std::vector<float> res(static_cast<size_t>(g * d.hd));
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t i = r / (d.hq / g), h0 = (r % (d.hq / g)) * g;
        attend_heads(st, i, h0, g, w, res.data());
        for (int64_t c = 0; c < g * d.hd; ++c)
          store_f32(out.mutable_data(), out.dtype(), (i * d.hq + h0) * d.hd + c, res[static_cast<size_t>(c)]);
      }
    });
    return ctx.out(n->out.get(), std::move(out));
  }
  const std::vector<float> kf = widen_rows(k, d), vf = widen_rows(v, d);
  const Step st{d, *n, q.dtype(), qf.data(), kf.data(), vf.data(), n->sinks ? sf.data() : nullptr};
  parallel_for(d.m * d.hq, 1, [&](int64_t r0, int64_t r1) {
    std::vector<float> s(static_cast<size_t>(d.len + 1)), acc(static_cast<size_t>(32 * d.hd)), o(static_cast<size_t>(d.hd));
    for (int64_t r = r0; r < r1; ++r) {
      attend(st, r / d.hq, r % d.hq, s, acc, o.data());
      for (int64_t c = 0; c < d.hd; ++c) store_f32(out.mutable_data(), out.dtype(), r * d.hd + c, o[c]);
    }
  });
  return ctx.out(n->out.get(), std::move(out));
}

}  // namespace

void register_attention_kernels(KernelRegistry& r) { r.add(fb::OpNode::AttentionNode, attention); }

}  // namespace switchboard::cpu
