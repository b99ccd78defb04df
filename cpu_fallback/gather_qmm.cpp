// GatherQmm: quantized expert matmul on the integer contract of docs/numerics.md.
// Each output is sum over groups g of (s_g * P_g + b_g * X_g), where
// P_g = sum over the group's 32-blocks j of Iq_j * d_j (Iq_j: exact integer dot of
// weight codes and int8 activations) and X_g the same over the activation sums.
#include "gather_qmm.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "cpu_common.h"
#include "env.h"
#include "mapped_file.h"
#include "exact_math.h"
#include "gather_qmm_plan.h"
#include "gather_qmm_x86.h"
#include "parallel.h"
#include "quantize.h"

namespace switchboard::cpu {

void quantize_q8_row(const float* x, int64_t k, int8_t* q, float* d, int32_t* sum) {
  for (int64_t b = 0; b < k / kQ8Block; ++b) {
    const float* xb = x + b * kQ8Block;
    int8_t* qb = q + b * kQ8Block;
    float amax = 0.0f;
    bool finite = true;
    for (int i = 0; i < kQ8Block; ++i) {
      float a = std::fabs(xb[i]);
      finite &= a <= 3.4028235e38f;  // false for inf and NaN
      amax = a > amax ? a : amax;
    }
    int32_t s = 0;
    if (!finite || amax < 0x1p-100f) {
      for (int i = 0; i < kQ8Block; ++i) qb[i] = 0;
      d[b] = finite ? 0.0f : __builtin_nanf("");
    } else {
      // amax * 2^sh lands in [64, 128); one less shift if it would round to 128.
      int sh = 6 - (static_cast<int>((f32_bits(amax) >> 23) & 0xff) - 127);
      if (exact::round_even(amax * exact::pow2i(sh)) > 127.0f) --sh;
      const float scale = exact::pow2i(sh);
      for (int i = 0; i < kQ8Block; ++i) {
        qb[i] = static_cast<int8_t>(exact::round_even(xb[i] * scale));
        s += qb[i];
      }
      d[b] = exact::pow2i(-sh);
    }
    sum[b] = s;
  }
}

Q8Activations quantize_q8(const Tensor& x) {
  Q8Activations a;
  a.rows = x.dim(0);
  a.k = x.dim(1);
  const int64_t blocks = a.k / kQ8Block;
  a.q.resize(static_cast<size_t>(a.rows * a.k));
  a.d.resize(static_cast<size_t>(a.rows * blocks));
  a.sum.resize(static_cast<size_t>(a.rows * blocks));
  std::vector<float> row(static_cast<size_t>(a.k));
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* xr = x.data_as<float>() + r * a.k;
    if (x.dtype() != DType::kF32) {
      for (int64_t i = 0; i < a.k; ++i) row[i] = load_f32(x.data(), x.dtype(), r * a.k + i);
      xr = row.data();
    }
    quantize_q8_row(xr, a.k, a.q.data() + r * a.k, a.d.data() + r * blocks, a.sum.data() + r * blocks);
  }
  return a;
}

namespace {
static_assert(parse_cpu_path("portable") == static_cast<int>(CpuPath::kPortable) &&
              parse_cpu_path("avx2") == static_cast<int>(CpuPath::kAvx2) &&
              parse_cpu_path("avx512") == static_cast<int>(CpuPath::kAvx512Vnni) &&
              parse_cpu_path("amx") == static_cast<int>(CpuPath::kAmx));
// The cap set_cpu_path_limit gave; -1 until then, meaning $SWITCHBOARD_CPU_PATH's, read on
// first use rather than at load time.
std::atomic<int> g_limit{-1};
CpuPath path_limit() {
  const int l = g_limit.load(std::memory_order_relaxed);
  return static_cast<CpuPath>(l >= 0 ? l : env_defaults().cpu_path_limit);
}
}  // namespace

const char* cpu_path_name(CpuPath p) {
  return p == CpuPath::kAmx ? "amx" : p == CpuPath::kAvx512Vnni ? "avx512-vnni" : p == CpuPath::kAvx2 ? "avx2" : "portable";
}
CpuPath best_cpu_path() {
  // amx_available() implies available(): the AMX path runs the VNNI kernels for short runs.
  return x86::amx_available() ? CpuPath::kAmx
         : x86::available()   ? CpuPath::kAvx512Vnni
         : x86::avx2_available() ? CpuPath::kAvx2
                                 : CpuPath::kPortable;
}
void set_cpu_path_limit(CpuPath limit) { g_limit.store(static_cast<int>(limit), std::memory_order_relaxed); }
CpuPath active_cpu_path() { return std::min(path_limit(), best_cpu_path()); }

namespace {

// The contract, element by element: the portable path every fast path must match.
float qdot_portable(const ExpertTable& t, int e, int64_t n, const int8_t* xq, const float* d, const int32_t* xs) {
  const int bits = t.bits[e];
  const uint32_t* row = t.codes + t.word_offset[e] + n * (t.k * bits / 32);
  const int64_t sidx = (static_cast<int64_t>(e) * t.n + n) * t.groups;
  const int64_t blocks_per_group = t.group_size / kQ8Block;
  float acc = 0.0f;
  for (int64_t g = 0; g < t.groups; ++g) {
    float p = 0.0f, x = 0.0f;
    for (int64_t j = g * blocks_per_group; j < (g + 1) * blocks_per_group; ++j) {
      int32_t iq = 0;
      for (int i = 0; i < kQ8Block; ++i)
        iq += static_cast<int32_t>(unpack_code(row, j * kQ8Block + i, bits)) * xq[j * kQ8Block + i];
      p = p + static_cast<float>(iq) * d[j];
      x = x + static_cast<float>(xs[j]) * d[j];
    }
    const float s = load_f32(t.scales, t.scale_dtype, sidx + g), b = load_f32(t.biases, t.scale_dtype, sidx + g);
    acc = acc + (s * p + b * x);
  }
  return acc;
}

}  // namespace

void qmm_rows(const ExpertTable& t, int e, const Q8Activations& xq, const int64_t* rows, int64_t count, int64_t n0,
              int64_t n1, float* out, int64_t out_stride) {
  const int64_t blocks = xq.k / kQ8Block;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t r = rows[i];
    for (int64_t n = n0; n < n1; ++n)
      out[i * out_stride + (n - n0)] = qdot_portable(t, e, n, xq.q.data() + r * xq.k, xq.d.data() + r * blocks,
                                                     xq.sum.data() + r * blocks);
  }
}

namespace {

// The weight table of the plan's experts over this node's operands.
ExpertTable expert_table(const ops::GatherQmmPlan& plan, int group_size, const Tensor& w, const Tensor& scales,
                         const Tensor& biases) {
  ExpertTable t;
  t.n = plan.nout;
  t.groups = plan.groups;
  t.k = plan.k;
  t.group_size = group_size;
  t.codes = w.data_as<uint32_t>();
  t.scales = scales.data();
  t.biases = biases.data();
  t.scale_dtype = scales.dtype();
  t.bits = plan.bits;
  t.word_offset = plan.word_offset;
  return t;
}

// X_g per row of xq and weight group: sum over the group's blocks of Sx_j * d_j, in order.
std::vector<float> group_sums(const Q8Activations& xq, int64_t group_size) {
  const int64_t blocks = xq.k / kQ8Block, per = group_size / kQ8Block, groups = xq.k / group_size;
  std::vector<float> xg(static_cast<size_t>(xq.rows * groups));
  for (int64_t r = 0; r < xq.rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      float x = 0.0f;
      for (int64_t j = g * per; j < (g + 1) * per; ++j)
        x = x + static_cast<float>(xq.sum[r * blocks + j]) * xq.d[r * blocks + j];
      xg[r * groups + g] = x;
    }
  return xg;
}

// Repacked constant weights are shared by every session of a program: keyed by
// the source pointers, which stay valid because the entry holds the sources.
std::shared_ptr<const x86::Repacked> repacked_cached(const ExpertTable& t, std::vector<Tensor> sources) {
  using Key = std::tuple<const void*, const void*, const void*, int64_t, std::vector<int>>;
  static std::mutex mu;
  static std::map<Key, std::weak_ptr<const x86::Repacked>> cache;
  const Key key{t.codes, t.scales, t.biases, t.group_size, t.bits};
  std::lock_guard<std::mutex> lock(mu);
  if (auto hit = cache[key].lock()) return hit;
  for (auto it = cache.begin(); it != cache.end();)  // drop entries of unloaded programs
    it = it->second.expired() ? cache.erase(it) : std::next(it);
  auto fresh = x86::repack(t, std::move(sources));
  if (!fresh) return fresh;
  cache[key] = fresh;
  // The kernels read only the repacked copy: weights mapped from a file leave memory (the
  // copy would otherwise double their resident size; a GPU session re-reads them from disk).
  for (const Tensor& s : fresh->sources) MappedFile::release_pages(s.data(), s.nbytes());
  return fresh;
}

}  // namespace

// Pairs are scheduled by expert runs when sorted (each run reuses the expert's
// weights across its tokens), else one pair at a time; the bits are the same.
Status gather_qmm(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsGatherQmmNode();
  SB_ASSIGN_OR_RETURN(Tensor x, ctx.in(n->x.get()));
  SB_ASSIGN_OR_RETURN(Tensor w, ctx.in(n->w.get()));
  SB_ASSIGN_OR_RETURN(Tensor scales, ctx.in(n->scales.get()));
  SB_ASSIGN_OR_RETURN(Tensor biases, ctx.in(n->biases.get()));
  const int64_t rows = x.dim(0), experts = scales.dim(0);
  SB_ASSIGN_OR_RETURN(std::vector<int64_t> rhs, read_indices(ctx, n->rhs_indices, "rhs_indices", experts));
  SB_ASSIGN_OR_RETURN(std::vector<int64_t> lhs, read_indices(ctx, n->lhs_indices, "lhs_indices", rows));
  const auto count = [](const std::unique_ptr<fb::Tid>& t, const std::vector<int64_t>& v) {
    return t ? static_cast<int64_t>(v.size()) : int64_t{-1};
  };
  SB_ASSIGN_OR_RETURN(ops::GatherQmmPlan plan,
                      ops::plan_gather_qmm(*n, x, scales, w.numel(), count(n->lhs_indices, lhs), count(n->rhs_indices, rhs)));
  const ExpertTable table = expert_table(plan, n->group_size, w, scales, biases);
  const int64_t pairs = plan.pairs;
  if (rhs.empty() && pairs > 0) rhs.assign(static_cast<size_t>(pairs), 0);
  if (lhs.empty())
    for (int64_t p = 0; p < pairs; ++p) lhs.push_back(rows ? p * rows / pairs : 0);
  int64_t sorted = 0;
  if (n->sorted_indices) {
    SB_ASSIGN_OR_RETURN(sorted, ctx.resolve(n->sorted_indices.get()));
  }
  SB_RETURN_IF_ERROR(ops::check_gather_qmm_pairs(plan, rhs, sorted != 0));

  const Q8Activations xq = quantize_q8(x);
  const int64_t nout = table.n;
  SB_ASSIGN_OR_RETURN(Tensor g_buf, Tensor::uninitialized(DType::kF32, {pairs, nout}));
  float* g = g_buf.mutable_data_as<float>();
  // Work items: runs of pairs sharing an expert (sorted) or single pairs, times tiles of 64 output rows.
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (int64_t p = 0; p < pairs;) {
    int64_t q = p + 1;
    while (sorted && q < pairs && rhs[q] == rhs[p]) ++q;
    runs.emplace_back(p, q);
    p = q;
  }
  std::shared_ptr<const x86::Repacked> fast;
  const CpuPath path = active_cpu_path();
  if (path != CpuPath::kPortable) {
    const bool cached = ctx.is_constant(n->w.get()) && ctx.is_constant(n->scales.get()) && ctx.is_constant(n->biases.get());
    fast = cached ? repacked_cached(table, {w, scales, biases}) : x86::repack(table);
    if (fast && cached) ctx.retain(fast);
  }
  const std::vector<float> xg = fast ? group_sums(xq, table.group_size) : std::vector<float>{};
  const int64_t tiles = (nout + 63) / 64;
  // Contiguous halves per thread keep each thread's weight reads one sequential stream.
  const int64_t items = static_cast<int64_t>(runs.size()) * tiles;
  parallel_for(items, (items + num_threads() - 1) / num_threads(), [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      auto [p0, p1] = runs[static_cast<size_t>(item / tiles)];
      const int64_t n0 = (item % tiles) * 64, n1 = std::min(nout, n0 + 64);
      const int e = static_cast<int>(rhs[p0]);
      if (fast && path == CpuPath::kAmx)  // AMX for runs of >= kAmxMinRows rows, VNNI for the rest
        x86::qmm_tiles_amx(*fast, e, xq, xg.data(), lhs.data() + p0, p1 - p0, n0 / 16, (n1 + 15) / 16, g + p0 * nout + n0,
                           nout);
      else if (fast && path == CpuPath::kAvx512Vnni)
        x86::qmm_tiles(*fast, e, xq, xg.data(), lhs.data() + p0, p1 - p0, n0 / 16, (n1 + 15) / 16, g + p0 * nout + n0, nout);
      else if (fast)
        x86::qmm_tiles_avx2(*fast, e, xq, xg.data(), lhs.data() + p0, p1 - p0, n0 / 16, (n1 + 15) / 16, g + p0 * nout + n0,
                            nout);
      else qmm_rows(table, e, xq, lhs.data() + p0, p1 - p0, n0, n1, g + p0 * nout + n0, nout);
    }
  });

  const DType dt = x.dtype();
  if (!n->combine_weights) {
    SB_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(dt, {pairs, nout}));
    for (int64_t i = 0; i < pairs * nout; ++i) store_f32(out.mutable_data(), dt, i, g[i]);
    return ctx.out(n->out.get(), std::move(out));
  }
  // Fused combine: each product is rounded to the output dtype first, exactly as
  // if GatherQmm had stored it and Combine had read it back.
  SB_ASSIGN_OR_RETURN(Tensor cw, ctx.in(n->combine_weights.get()));
  const int64_t tokens = cw.dim(0), slots = cw.dim(1);
  SB_CHECK_OR_RETURN(tokens * slots == pairs, StatusCode::kInvalidArgument,
                     "combine_weights %s does not match %lld pairs", shape_str(cw.shape()).c_str(), (long long)pairs);
  for (int64_t i = 0; i < pairs * nout; ++i) g[i] = round_to(g[i], dt);
  Tensor shared, gate;
  if (n->shared) {
    SB_ASSIGN_OR_RETURN(shared, ctx.in(n->shared.get()));
  }
  if (n->shared_gate) {
    SB_ASSIGN_OR_RETURN(gate, ctx.in(n->shared_gate.get()));
  }
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(dt, {tokens, nout}));
  SB_RETURN_IF_ERROR(combine_rows(g, cw, shared, gate, tokens, slots, nout, out));
  return ctx.out(n->out.get(), std::move(out));
}

void register_gather_qmm_kernels(KernelRegistry& r) { r.add(fb::OpNode::GatherQmmNode, gather_qmm); }

}  // namespace switchboard::cpu
