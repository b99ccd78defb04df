// RouterNode through the op harness: exact selection, weights against the f32 order (bitwise) and against
// float64 math (within a derived bound), ties, renormalize, grouped routing, expert_scale, pruning and the
// validator's errors (from the builder and from Program::from_bytes).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "exact_math.h"
#include "op_harness.h"
#include "program_impl.h"

namespace switchboard::optest {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kU = 0x1p-24;  // one f32 rounding, relative
constexpr DType kF32 = DType::kF32, kBF16 = DType::kBF16;
constexpr RouterKind kSoftmax = RouterKind::kSoftmaxTopK, kTopKSoftmax = RouterKind::kTopKSoftmax,
                     kSigmoid = RouterKind::kSigmoidGroupedTopK;
const std::vector<RouterKind> kKinds = {kSoftmax, kTopKSoftmax, kSigmoid};
constexpr int kTokens = 37;
constexpr double kLogitRange = 8;  // random logits lie in [-4, 4)

// mt19937's output is fixed by the standard (its distributions are not): values on a 2^-24 grid.
class Rng {
 public:
  explicit Rng(uint32_t seed) : g_(seed) {}
  double uniform(double lo, double hi) { return lo + (hi - lo) * static_cast<double>(g_() >> 8) * 0x1p-24; }

 private:
  std::mt19937 g_;
};

// One router configuration: a RouterSpec without tensor refs, plus which optional inputs exist.
struct Case {
  RouterKind kind;
  int e, k;
  bool renormalize = false;
  int n_group = 1, topk_group = 1;
  float scaling = 1.0f;
  bool bias = false, scale = false;
  std::vector<int32_t> pruned;
  DType logits_dtype = kF32;

  Case(RouterKind kind_, int e_, int k_) : kind(kind_), e(e_), k(k_) {}
  Case& renorm(bool on = true) { return renormalize = on, *this; }
  Case& groups(int n, int top) { return n_group = n, topk_group = top, *this; }
  Case& scaled(float f) { return scaling = f, *this; }
  Case& with_bias(bool on = true) { return bias = on, *this; }
  Case& with_scale() { return scale = true, *this; }
  Case& prune(std::vector<int32_t> ids) { return pruned = std::move(ids), *this; }
  Case& logits(DType t) { return logits_dtype = t, *this; }
};

// DeepSeek-V3 style: 64 experts in 8 groups, 4 kept, top-8, bias, renormalize, x2.5.
Case deepseek() { return Case(kSigmoid, 64, 8).renorm().groups(8, 4).scaled(2.5f).with_bias(); }

std::string describe(const Case& c) {
  const char* kinds[] = {"SoftmaxTopK", "TopKSoftmax", "SigmoidGroupedTopK"};
  return std::string(kinds[static_cast<int>(c.kind)]) + " E=" + std::to_string(c.e) + " k=" + std::to_string(c.k) +
         " renorm=" + std::to_string(c.renormalize) + " groups=" + std::to_string(c.n_group) + "/" +
         std::to_string(c.topk_group) + " bias=" + std::to_string(c.bias) + " scale=" + std::to_string(c.scale) +
         " pruned=" + std::to_string(c.pruned.size()) + " " + dtype_name(c.logits_dtype);
}

// Inputs "logits" [T, E] (dynamic T), "bias" and "scale" [E] when the case has them.
void build_router(ProgramBuilder& b, const Case& c) {
  RouterSpec s;
  s.kind = c.kind;
  s.k = c.k;
  s.renormalize = c.renormalize;
  s.n_group = c.n_group;
  s.topk_group = c.topk_group;
  s.routed_scaling_factor = c.scaling;
  s.pruned_experts = c.pruned;
  TensorRef logits = b.input("logits", c.logits_dtype, {Dim::dynamic(1, 64), c.e});
  if (c.bias) s.selection_bias = b.input("bias", kF32, {c.e});
  if (c.scale) s.expert_scale = b.input("scale", kF32, {c.e});
  RouterOut r = b.router(logits, s);
  b.output("weights", r.weights);
  b.output("indices", r.indices);
}

// Logits in [-4, 4), bias in [-0.25, 0.25) (enough to reorder sigmoids), scale in [0.5, 2).
Inputs random_inputs(const Case& c, uint32_t seed, int tokens = kTokens) {
  Rng rng(seed);
  std::vector<double> logits, bias, scale;
  for (int i = 0; i < tokens * c.e; ++i) logits.push_back(rng.uniform(-4, 4));
  for (int i = 0; i < c.e; ++i) bias.push_back(rng.uniform(-0.25, 0.25));
  for (int i = 0; i < c.e; ++i) scale.push_back(rng.uniform(0.5, 2));
  Inputs in{{"logits", make(c.logits_dtype, {tokens, c.e}, logits)}};
  if (c.bias) in["bias"] = make(kF32, {c.e}, bias);
  if (c.scale) in["scale"] = make(kF32, {c.e}, scale);
  return in;
}

// --- references ----------------------------------------------------------------------------------

// Selection order: NaN above every number, then the larger value, then the lower id (a strict total order).
template <class F>
bool ranks_above(F va, int ia, F vb, int ib) {
  const bool na = std::isnan(va), nb = std::isnan(vb);
  if (na != nb) return na;
  if (!na && va != vb) return va > vb;
  return ia < ib;
}

// The k best allowed ids: a plain sort, independent of the kernel's repeated scan.
template <class F>
std::vector<int> select_top(const std::vector<F>& v, const std::vector<bool>& allowed, int k) {
  std::vector<int> ids;
  for (int i = 0; i < static_cast<int>(v.size()); ++i)
    if (allowed[static_cast<size_t>(i)]) ids.push_back(i);
  std::sort(ids.begin(), ids.end(), [&](int a, int b) { return ranks_above(v[size_t(a)], a, v[size_t(b)], b); });
  ids.resize(std::min(ids.size(), static_cast<size_t>(k)));
  return ids;
}

// DeepSeek-V3 group limit: a group scores the sum of its two best live scores (one: that score; none: -inf);
// the topk_group best groups stay (ties: lower group). F = float sums in f32, F = double in double.
template <class F>
std::vector<bool> group_limit(const std::vector<F>& c, const std::vector<bool>& live, int n_group, int topk_group) {
  const int per = static_cast<int>(c.size()) / n_group;
  std::vector<F> score;
  for (int g = 0; g < n_group; ++g) {
    std::vector<bool> in_group(c.size(), false);
    for (int i = g * per; i < (g + 1) * per; ++i) in_group[size_t(i)] = live[size_t(i)];
    std::vector<int> two = select_top(c, in_group, 2);
    score.push_back(two.empty()       ? -std::numeric_limits<F>::infinity()
                    : two.size() == 1 ? c[size_t(two[0])]
                                      : F(c[size_t(two[0])] + c[size_t(two[1])]));
  }
  std::vector<int> kept = select_top(score, std::vector<bool>(size_t(n_group), true), topk_group);
  std::vector<bool> allowed(c.size(), false);
  for (int g : kept)
    for (int i = g * per; i < (g + 1) * per; ++i) allowed[size_t(i)] = live[size_t(i)];
  return allowed;
}

std::vector<bool> live_mask(const Case& c) {
  std::vector<bool> live(size_t(c.e), true);
  for (int32_t p : c.pruned) live[size_t(p)] = false;
  return live;
}

// One token's routing: ids in slot order and their weights.
struct Routed {
  std::vector<int> ids;
  std::vector<double> w;
};

// max as the kernels take it (cpu_common.h max_f32): NaN propagates, max(+0, -0) = +0.
float max32(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) ? a : b;
  if (a == b) return std::signbit(a) ? b : a;
  return a > b ? a : b;
}

// The documented f32 order: max, exp(v - max), sum in index order, one rcp, products.
std::vector<float> softmax32(const std::vector<float>& v) {
  float m = v[0];
  for (float x : v) m = max32(m, x);
  std::vector<float> e;
  float sum = 0.0f;
  for (float x : v) {
    e.push_back(exact::exp(x - m));
    sum = sum + e.back();
  }
  const float r = exact::rcp(sum);
  for (float& x : e) x = x * r;
  return e;
}

void renormalize32(std::vector<float>& w) {
  float sum = 0.0f;
  for (float x : w) sum = sum + x;
  const float r = exact::rcp(sum);
  for (float& x : w) x = x * r;
}

// The f32 reference (docs/numerics.md, Router rows). Selection ranks the very floats the kernel ranks:
// probabilities of distinct logits can round to equal floats (exp is only within 3 ulp) and the tie rule
// then decides, so ranking exact probabilities (or logits) would disagree with a correct kernel.
Routed route32(const Case& c, const std::vector<float>& v, const std::vector<float>& bias,
               const std::vector<float>& scale) {
  std::vector<bool> live = live_mask(c);
  std::vector<int> ids;
  std::vector<float> w;
  if (c.kind == kSoftmax) {
    std::vector<float> p = softmax32(v);
    ids = select_top(p, live, c.k);
    for (int id : ids) w.push_back(p[size_t(id)]);
    if (c.renormalize) renormalize32(w);
  } else if (c.kind == kTopKSoftmax) {
    ids = select_top(v, live, c.k);
    for (int id : ids) w.push_back(v[size_t(id)]);
    w = softmax32(w);
  } else {
    std::vector<float> s, corrected;
    for (size_t i = 0; i < v.size(); ++i) {
      s.push_back(exact::sigmoid(v[i]));
      corrected.push_back(c.bias ? s[i] + bias[i] : s[i]);
    }
    std::vector<bool> allowed = c.n_group > 1 ? group_limit(corrected, live, c.n_group, c.topk_group) : live;
    ids = select_top(corrected, allowed, c.k);
    for (int id : ids) w.push_back(s[size_t(id)]);
    if (c.renormalize) renormalize32(w);
    for (float& x : w) x = x * c.scaling;
  }
  if (c.scale)
    for (size_t j = 0; j < w.size(); ++j) w[j] = w[j] * scale[size_t(ids[j])];
  return {ids, std::vector<double>(w.begin(), w.end())};
}

// The float64 reference (std::exp, true division). Softmax kinds reuse the f32 selection `ids32` (only the
// weights are compared); the sigmoid kind selects on its own, group limit included, in double.
Routed route64(const Case& c, const std::vector<float>& v, const std::vector<float>& bias,
               const std::vector<float>& scale, const std::vector<int>& ids32) {
  std::vector<int> ids = ids32;
  std::vector<double> w;
  auto softmax = [](const std::vector<double>& x) {
    double m = *std::max_element(x.begin(), x.end()), sum = 0;
    for (double a : x) sum += std::exp(a - m);
    std::vector<double> out;
    for (double a : x) out.push_back(std::exp(a - m) / sum);
    return out;
  };
  auto renormalize = [](std::vector<double>& x) {
    double sum = 0;
    for (double a : x) sum += a;
    for (double& a : x) a /= sum;
  };
  if (c.kind == kSoftmax) {
    std::vector<double> p = softmax(std::vector<double>(v.begin(), v.end()));
    for (int id : ids) w.push_back(p[size_t(id)]);
    if (c.renormalize) renormalize(w);
  } else if (c.kind == kTopKSoftmax) {
    for (int id : ids) w.push_back(v[size_t(id)]);
    w = softmax(w);
  } else {
    std::vector<double> s, corrected;
    for (size_t i = 0; i < v.size(); ++i) {
      s.push_back(1.0 / (1.0 + std::exp(-double(v[i]))));
      corrected.push_back(c.bias ? s[i] + double(bias[i]) : s[i]);
    }
    std::vector<bool> live = live_mask(c);
    std::vector<bool> allowed = c.n_group > 1 ? group_limit(corrected, live, c.n_group, c.topk_group) : live;
    ids = select_top(corrected, allowed, c.k);
    for (int id : ids) w.push_back(s[size_t(id)]);
    if (c.renormalize) renormalize(w);
    for (double& x : w) x *= double(c.scaling);
  }
  if (c.scale)
    for (size_t j = 0; j < w.size(); ++j) w[j] *= double(scale[size_t(ids[j])]);
  return {ids, w};
}

std::vector<float> floats_of(const Inputs& in, const char* name) {
  std::vector<float> out;
  if (in.count(name))
    for (double d : in.at(name).to_doubles()) out.push_back(static_cast<float>(d));
  return out;
}

// Expected "weights" and "indices" of every token from route32, or route64 when f64.
Expected routed_ref(const Case& c, const Inputs& in, bool f64) {
  const Tensor& logits = in.at("logits");
  std::vector<float> all = floats_of(in, "logits"), bias = floats_of(in, "bias"), scale = floats_of(in, "scale");
  const int64_t tokens = logits.dim(0);
  RefTensor w{{tokens, c.k}, {}, {}}, idx{{tokens, c.k}, {}, {}};
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<float> row(all.begin() + t * c.e, all.begin() + (t + 1) * c.e);
    Routed r = route32(c, row, bias, scale);
    if (f64) r = route64(c, row, bias, scale, r.ids);
    for (size_t j = 0; j < size_t(c.k); ++j) {
      idx.ints.push_back(j < r.ids.size() ? r.ids[j] : -1);
      w.values.push_back(j < r.w.size() ? r.w[j] : kNaN);
    }
  }
  return {{"weights", w}, {"indices", idx}};
}

// Worst-case relative error of a weight against exact math, in units of u = 2^-24 (1 ulp <= 2u relative).
// docs/numerics.md bounds exp by 3.02 ulp (kExpU) and rcp by 1.99 ulp (kRcpU); the rest is f32 rounding:
//  e = exp(fl(v - max)): v - max rounds by <= R u, which e^d turns into a relative R u: R + kExpU.
//  s = rcp(1 + e^-x): kExpU, u for the add, kRcpU.
//  w = t * rcp(sum of n terms t): t's error twice (alone and in the sum), (n - 1) u for the sum, kRcpU + u.
//    SoftmaxTopK's renormalize divides p = e * r by the sum of p: r's error is common and cancels, so
//    there t = e plus one rounding (the product).
//  routed_scaling_factor and expert_scale: one product each.
// Relative 1e-6 (~17u) covers the ulp bounds alone but not the (E - 1) u of an E-term softmax sum or the
// R u from v - max, so the bound is computed per case (at most 162u = 9.7e-6: SoftmaxTopK, E = 128).
constexpr double kExpU = 6.04, kRcpU = 4;
double weight_bound(const Case& c) {
  const double e = kLogitRange + kExpU, s = kExpU + 1 + kRcpU;
  auto divided = [](double t, int n) { return 2 * t + (n - 1) + kRcpU + 1; };
  double x = s;
  if (c.kind == kSoftmax) x = c.renormalize ? divided(e + 1, c.k) : divided(e, c.e);
  if (c.kind == kTopKSoftmax) x = divided(e, c.k);
  if (c.kind == kSigmoid && c.renormalize) x = divided(s, c.k);
  return (x + 2) * kU;
}

// Indices exactly and weights bitwise against route32, then weights within weight_bound of route64.
void check_router(const Case& c, const Inputs& in) {
  SCOPED_TRACE(describe(c));
  ProgramBuilder b;
  build_router(b, c);
  auto f32_order = [&](const Inputs& x) { return routed_ref(c, x, false); };
  auto float64 = [&](const Inputs& x) { return routed_ref(c, x, true); };
  check_op(b, in, f32_order, Tolerance::exact());
  check_op(b, in, float64, Tolerance::rel(weight_bound(c)));
}

// The reference's ids of every token.
std::vector<std::vector<int>> selections(const Case& c, const Inputs& in) {
  std::vector<float> all = floats_of(in, "logits"), bias = floats_of(in, "bias"), scale = floats_of(in, "scale");
  std::vector<std::vector<int>> out;
  for (size_t t = 0; t * size_t(c.e) < all.size(); ++t) {
    std::vector<float> row(all.begin() + long(t) * c.e, all.begin() + long(t + 1) * c.e);
    out.push_back(route32(c, row, bias, scale).ids);
  }
  return out;
}

// Runs the router on cpu: {weights, indices}.
std::pair<Tensor, Tensor> run_router(const Case& c, const Inputs& in) {
  ProgramBuilder b;
  build_router(b, c);
  auto program = Program::from_bytes(b.serialize().value(), "router_test");
  EXPECT_TRUE(program.is_ok()) << program.status().to_string();
  auto s = Session::create(program.value(), SessionOptions{"cpu"}).value();
  for (const auto& [name, t] : in) EXPECT_TRUE(s->set_input(name, t).is_ok()) << name;
  Status st = s->execute();
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  if (!st.is_ok()) return {};
  return {s->output("weights").value(), s->output("indices").value()};
}

// Per-token sums of a [T, k] f32 tensor, in double (no rounding of its own at these sizes).
std::vector<double> row_sums(const Tensor& w) {
  std::vector<double> v = w.to_doubles(), sums(size_t(w.dim(0)), 0.0);
  for (size_t i = 0; i < v.size(); ++i) sums[i / size_t(w.dim(1))] += v[i];
  return sums;
}

// --- selection and weights over sizes --------------------------------------------------------------

TEST(Router, RandomLogitsAllKindsAndSizes) {
  uint32_t seed = 1;
  for (int e : {4, 8, 60, 128, 256, 300, 1024}) {  // the GPU's shared arrays: <= 256, <= 1024 experts
    for (int k : {1, 2, 8}) {
      if (k > e) continue;
      check_router(Case(kSoftmax, e, k), random_inputs(Case(kSoftmax, e, k), seed++));
      check_router(Case(kSoftmax, e, k).renorm(), random_inputs(Case(kSoftmax, e, k), seed++));
      check_router(Case(kTopKSoftmax, e, k), random_inputs(Case(kTopKSoftmax, e, k), seed++));
      Case sig = Case(kSigmoid, e, k).renorm().scaled(2.5f).with_bias();
      check_router(sig, random_inputs(sig, seed++));
    }
  }
}

TEST(Router, Bf16LogitsAreWidenedExactly) {
  for (RouterKind kind : kKinds) {
    Case c = Case(kind, 60, 8).renorm().logits(kBF16);
    check_router(c, random_inputs(c, 77));
  }
}

// Decode's router logits straight into the Router: on GPUs whose dispatches hand off, the router
// waits for the GEMV's count of workgroups instead of a barrier (matmul_rows16_count). The same
// program also runs the pair apart (an op between them): every output holds the same bits as
// there, on every device, as on the CPU; a wrong count would stall the wait and fail the run.
TEST(Router, RightAfterItsLogitsMatmul) {
  for (RouterKind kind : kKinds)
    for (int64_t rows : {1, 3}) {
      // 128 experts: the router_e256_* kernels; 300 (softmax, one row): the generic router.
      const int64_t e = kind == kSoftmax && rows == 1 ? 300 : 128, d = 2048;
      SCOPED_TRACE(std::to_string(static_cast<int>(kind)) + " rows=" + std::to_string(rows) + " e=" + std::to_string(e));
      std::mt19937 rng(static_cast<uint32_t>(rows) * 7 + static_cast<uint32_t>(kind));
      Inputs in{{"x", random_tensor(kBF16, {rows, d}, rng, std::normal_distribution<double>(0, 1))},
                {"w", random_tensor(kBF16, {e, d}, rng, std::normal_distribution<double>(0, 0.05))}};
      ProgramBuilder b;
      TensorRef x = b.input("x", kBF16, {rows, d}), w = b.input("w", kBF16, {e, d});
      RouterSpec spec;
      spec.kind = kind;
      spec.k = 8;
      spec.renormalize = kind != kTopKSoftmax;
      for (const std::string tag : {"", "_apart"}) {
        TensorRef logits = b.matmul(x, w, true);
        if (!tag.empty()) b.output("between", b.neg(x));
        RouterOut r = b.router(logits, spec);
        b.output("logits" + tag, logits);
        b.output("weights" + tag, r.weights);
        b.output("indices" + tag, r.indices);
      }
      check_same_bits(b, in, {{"logits", "logits_apart"}, {"weights", "weights_apart"}, {"indices", "indices_apart"}});
    }
}

// --- ties ----------------------------------------------------------------------------------------

// Rows of equal values, equal maxima and +0 / -0; every kind ranks equal scores by the lower id.
TEST(RouterTies, LowerIdWinsInEveryKind) {
  const std::vector<double> logits = {0,    0,   0,    0,   0,  0,  0,  0,    // all equal
                                      0,    2,   1,    2,   0,  2,  -1, 2,    // four equal maxima
                                      -0.0, 0.0, -0.0, 0.0, -1, -1, -1, -1,   // +0 / -0 tie
                                      -1,   0.0, -0.0, -1,  -2, -2, -2, -2};  // +0 before -0, then -1 tie
  const std::vector<int64_t> want = {0, 1, 2, 1, 3, 5, 0, 1, 2, 1, 2, 0};
  for (RouterKind kind : kKinds) {
    Case c(kind, 8, 3);
    SCOPED_TRACE(describe(c));
    ProgramBuilder b;
    build_router(b, c);
    auto ref = [&](const Inputs& in) {
      Expected e = routed_ref(c, in, false);
      e["indices"].ints = want;
      return e;
    };
    check_op(b, {{"logits", make(kF32, {4, 8}, logits)}}, ref, Tolerance::exact());
  }
}

// Tied groups keep the lower group: groups 1 and 2 tie (row 0), groups 0 and 3 tie (row 1), all tie (row 2).
TEST(RouterTies, LowerGroupWins) {
  const std::vector<double> logits = {0, 0, 1, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0};
  Case c = Case(kSigmoid, 8, 2).renorm().groups(4, 1);
  ProgramBuilder b;
  build_router(b, c);
  auto ref = [&](const Inputs& in) {
    Expected e = routed_ref(c, in, false);
    e["indices"].ints = {2, 3, 0, 1, 0, 1};
    return e;
  };
  check_op(b, {{"logits", make(kF32, {3, 8}, logits)}}, ref, Tolerance::exact());
}

// Logit -2^-26 < 0, but both exp to 1.0f: SoftmaxTopK and the sigmoid see a tie (lower id 0 wins) where
// TopKSoftmax, ranking logits, picks id 1. This is why the reference ranks the kernel's floats.
TEST(RouterTies, SoftmaxRanksRoundedProbabilitiesNotLogits) {
  ASSERT_EQ(exact::exp(-0x1p-26f), 1.0f);
  ASSERT_EQ(exact::exp(0x1p-26f), 1.0f);
  const std::vector<int64_t> want = {0, 1, 0};
  for (RouterKind kind : kKinds) {
    Case c(kind, 4, 1);
    SCOPED_TRACE(describe(c));
    ProgramBuilder b;
    build_router(b, c);
    auto ref = [&](const Inputs& in) {
      Expected e = routed_ref(c, in, false);
      e["indices"].ints = {want[static_cast<size_t>(kind)]};
      return e;
    };
    check_op(b, {{"logits", make(kF32, {1, 4}, {-0x1p-26, 0, -1, -1})}}, ref, Tolerance::exact());
  }
}

// NaN ranks above every number. Softmax spreads a NaN to every probability, so all tie: ids 0, 1, 2.
TEST(RouterTies, NaNRanksFirst) {
  const std::vector<std::vector<int64_t>> want = {{0, 1, 2}, {1, 3, 2}, {1, 3, 2}};
  for (RouterKind kind : kKinds) {
    Case c(kind, 6, 3);
    SCOPED_TRACE(describe(c));
    ProgramBuilder b;
    build_router(b, c);
    auto ref = [&](const Inputs& in) {
      Expected e = routed_ref(c, in, false);
      e["indices"].ints = want[static_cast<size_t>(kind)];
      return e;
    };
    check_op(b, {{"logits", make(kF32, {1, 6}, {1, kNaN, 2, kNaN, 0, 2})}}, ref, Tolerance::exact());
  }
}

// --- renormalize and weight sums ----------------------------------------------------------------------

// w_j = p_j * rcp(sum of p in slot order): the sum is off by (k - 1)u, rcp by 4u, each product by u.
double sum_bound(int k) { return (k + 4) * kU; }

TEST(RouterWeights, SoftmaxTopKRenormalizeOnAndOff) {
  Case on = Case(kSoftmax, 60, 8).renorm(), off(kSoftmax, 60, 8);
  Inputs in = random_inputs(on, 11);
  check_router(on, in);
  check_router(off, in);
  for (double s : row_sums(run_router(on, in).first)) EXPECT_NEAR(s, 1.0, sum_bound(8));
  // Without renormalize the weights are the plain probabilities: 8 of 60 never hold all the mass.
  for (double s : row_sums(run_router(off, in).first)) EXPECT_LT(s, 0.999);
}

TEST(RouterWeights, TopKSoftmaxSumsToOne) {
  for (int k : {2, 8}) {
    Case c(kTopKSoftmax, 60, k);
    for (double s : row_sums(run_router(c, random_inputs(c, 12)).first)) EXPECT_NEAR(s, 1.0, sum_bound(k));
  }
}

// routed_scaling_factor multiplies after renormalize: each token's weights sum to 2.5.
TEST(RouterWeights, SigmoidScalingAppliesAfterRenormalize) {
  Case c = deepseek();
  for (double s : row_sums(run_router(c, random_inputs(c, 13)).first)) EXPECT_NEAR(s, 2.5, 2.5 * sum_bound(9));
}

TEST(RouterWeights, ExpertScaleMultipliesEachSelectedWeight) {
  for (RouterKind kind : kKinds) {
    Case c = Case(kind, 8, 2).renorm().with_scale();
    check_router(c, random_inputs(c, 14));
  }
  Case grouped = deepseek().with_scale();
  check_router(grouped, random_inputs(grouped, 15));
}

// --- grouped routing (DeepSeek-V3) ------------------------------------------------------------------

// Bias steers selection only (weights are the unbiased sigmoids), groups score their top-2 corrected
// scores, 4 of 8 groups stay, then top-8; route64 re-derives the whole selection in double.
TEST(RouterGrouped, DeepSeekV3GroupLimitedSelection) {
  Case grouped = deepseek(), flat = deepseek().groups(1, 1), unbiased = deepseek().with_bias(false);
  Inputs in = random_inputs(grouped, 21);
  check_router(grouped, in);
  check_router(flat, in);
  // The data must make the group limit and the bias change selections, or the checks could not tell.
  int by_groups = 0, by_bias = 0;
  std::vector<std::vector<int>> g = selections(grouped, in), f = selections(flat, in), u = selections(unbiased, in);
  for (size_t t = 0; t < g.size(); ++t) {
    by_groups += g[t] != f[t];
    by_bias += g[t] != u[t];
  }
  EXPECT_GT(by_groups, 0);
  EXPECT_GT(by_bias, 0);
}

// --- pruned experts --------------------------------------------------------------------------------

// Experts 0 and 3 get the largest logits, yet never appear.
void check_pruned(Case c, uint32_t seed) {
  c.prune({0, 3});
  Inputs in = random_inputs(c, seed);
  std::vector<double> logits = in.at("logits").to_doubles();
  for (int t = 0; t < kTokens; ++t) logits[size_t(t * c.e)] = logits[size_t(t * c.e + 3)] = 10;
  in["logits"] = make(kF32, {kTokens, c.e}, logits);
  check_router(c, in);
  for (int64_t id : ints_of(run_router(c, in).second)) EXPECT_TRUE(id != 0 && id != 3) << describe(c) << ": " << id;
}

TEST(RouterPruned, NeverSelected) {
  for (RouterKind kind : kKinds) check_pruned(Case(kind, 8, 2).renorm(), 31);
  check_pruned(deepseek(), 32);
}

// Whichever groups win must hold k live experts, pruned ones not counted.
TEST(RouterPruned, KeptGroupsWithTooFewLiveExpertsAreRejected) {
  ProgramBuilder b;
  build_router(b, Case(kSigmoid, 16, 4).renorm().groups(4, 1).prune({0}));
  auto bytes = b.serialize();
  ASSERT_FALSE(bytes.is_ok());
  EXPECT_NE(bytes.status().message().find("kept groups may hold only 3 live experts, fewer than k = 4"), std::string::npos);
}

// --- validation errors -------------------------------------------------------------------------------

struct BadCase {
  Case c;
  std::string needle;
};

const std::vector<BadCase>& bad_cases() {
  static const std::vector<BadCase> cases = [] {
    std::vector<BadCase> v;
    v.push_back({Case(kSoftmax, 4, 5), "Router.k: 5 not in [1, 4] (4 experts, 0 pruned)"});
    v.push_back({Case(kTopKSoftmax, 4, 3).prune({1, 2}), "Router.k: 3 not in [1, 2] (4 experts, 2 pruned)"});
    v.push_back({Case(kSigmoid, 6, 1).groups(4, 1), "Router.n_group: 4 does not divide 6 experts"});
    v.push_back({Case(kSigmoid, 8, 1).groups(2, 3), "Router.topk_group: 3 not in [1, n_group = 2]"});
    v.push_back({Case(kSoftmax, 8, 2).with_bias(), "Router.selection_bias: only SigmoidGroupedTopK uses it"});
    v.push_back({Case(kSoftmax, 4, 1).prune({1, 4}), "Router.pruned_experts[1]: 4 out of range (4 experts)"});
    v.push_back({Case(kSigmoid, 4, 1).prune({-1}), "Router.pruned_experts[0]: -1 out of range (4 experts)"});
    return v;
  }();
  return cases;
}

// The builder applies the loader's op rules (ops::check_op_rules) as it emits: the bad
// router fails there, with the validator's words, and serialize() reports it.
TEST(RouterErrors, BuilderReportsTheLoadersRuleMessage) {
  for (const BadCase& bad : bad_cases()) {
    SCOPED_TRACE(describe(bad.c));
    ProgramBuilder b;
    build_router(b, bad.c);
    auto bytes = b.serialize();
    ASSERT_FALSE(bytes.is_ok());
    EXPECT_EQ(bytes.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(bytes.status().message().find("builder: Router."), std::string::npos) << bytes.status().to_string();
    EXPECT_NE(bytes.status().message().find(bad.needle), std::string::npos) << bytes.status().to_string();
  }
}

// A valid program (k = 1, no groups, no pruning) whose RouterNode is then edited into the bad case.
std::vector<uint8_t> edited_program(const Case& bad) {
  Case good = bad;
  good.k = 1;
  good.n_group = good.topk_group = 1;
  good.pruned.clear();
  if (good.bias) good.kind = kSigmoid;
  ProgramBuilder b;
  build_router(b, good);
  std::vector<uint8_t> bytes = b.serialize().value();
  std::unique_ptr<fb::ProgramT> p = parse_program(bytes).value();
  for (auto& ins : p->chains[p->main_chain]->instructions) {
    if (ins->op.type != fb::OpNode::RouterNode) continue;
    fb::RouterNodeT& n = *ins->op.AsRouterNode();
    n.kind = static_cast<fb::RouterKind>(bad.kind);
    n.k = bad.k;
    n.n_group = bad.n_group;
    n.topk_group = bad.topk_group;
    n.pruned_experts = bad.pruned;
  }
  return serialize_program(*p);
}

TEST(RouterErrors, LoaderRejectsEditedPrograms) {
  for (const BadCase& bad : bad_cases()) {
    SCOPED_TRACE(describe(bad.c));
    auto program = Program::from_bytes(edited_program(bad.c), "edited.sbp");
    ASSERT_FALSE(program.is_ok());
    EXPECT_EQ(program.status().code(), StatusCode::kInvalidProgram);
    EXPECT_NE(program.status().message().find(bad.needle), std::string::npos) << program.status().to_string();
  }
}

}  // namespace
}  // namespace switchboard::optest
