// The MoE helper ops through the op harness: Argsort, GatherRows, ScatterRows, Glu, Combine, Full and
// Binary FloorDiv. Exact ops are checked bitwise; Glu also against float64 math within a derived bound.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "exact_math.h"
#include "op_harness.h"

namespace switchboard::optest {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kU = 0x1p-24;  // one f32 rounding, relative
constexpr DType kF32 = DType::kF32, kF16 = DType::kF16, kBF16 = DType::kBF16, kI32 = DType::kI32, kI64 = DType::kI64,
                kBool = DType::kBool;

// mt19937's output is fixed by the standard (its distributions are not): values on a 2^-24 grid.
class Rng {
 public:
  explicit Rng(uint32_t seed) : g_(seed) {}
  double uniform(double lo, double hi) { return lo + (hi - lo) * static_cast<double>(g_() >> 8) * 0x1p-24; }
  int64_t int_in(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(g_() % uint32_t(hi - lo + 1)); }

 private:
  std::mt19937 g_;
};

std::vector<Dim> dims(const Shape& s) { return std::vector<Dim>(s.begin(), s.end()); }

// Dim 0 dynamic (so runtime sizes, including 0 and mismatches, reach the kernels), the rest static.
std::vector<Dim> rows_dynamic(const Shape& s) {
  std::vector<Dim> d = dims(s);
  d[0] = Dim::dynamic(0, 256);
  return d;
}

// A tensor holding the low bits of each value (two's complement).
Tensor make_ints(DType t, const Shape& shape, const std::vector<int64_t>& v) {
  Tensor out = Tensor::zeros(t, shape).value();
  EXPECT_EQ(static_cast<int64_t>(v.size()), out.numel());
  auto* p = static_cast<uint8_t*>(out.mutable_data());
  for (size_t i = 0; i < v.size(); ++i) {
    auto put = [&](auto x) { std::memcpy(p + i * sizeof(x), &x, sizeof(x)); };
    if (t == kI64)
      put(v[i]);
    else
      put(static_cast<int32_t>(v[i]));
  }
  return out;
}

RefTensor ints_ref(const Shape& shape, const std::vector<int64_t>& v) { return {shape, {}, v}; }

// --- Argsort -------------------------------------------------------------------------------------------

// Sorting (value, index) pairs orders equal values by index: the stable ascending permutation.
RefTensor argsort_ref(const Tensor& x) {
  std::vector<int64_t> v = ints_of(x);
  std::vector<std::pair<int64_t, int64_t>> pairs;
  for (size_t i = 0; i < v.size(); ++i) pairs.emplace_back(v[i], static_cast<int64_t>(i));
  std::sort(pairs.begin(), pairs.end());
  RefTensor r{x.shape(), {}, {}};
  for (const auto& p : pairs) r.ints.push_back(p.second);
  return r;
}

void check_argsort(const std::vector<int64_t>& v) {
  SCOPED_TRACE("argsort of " + std::to_string(v.size()));
  ProgramBuilder b;
  b.output("order", b.argsort(b.input("x", kI32, {Dim::dynamic(0, 8192)})));
  auto ref = [](const Inputs& in) { return Expected{{"order", argsort_ref(in.at("x"))}}; };
  check_op(b, {{"x", make_ints(kI32, {int64_t(v.size())}, v)}}, ref, Tolerance::exact());
}

TEST(Argsort, EqualKeysKeepIndexOrder) {
  ProgramBuilder b;
  b.output("order", b.argsort(b.input("x", kI32, {9})));
  auto ref = [](const Inputs&) { return Expected{{"order", ints_ref({9}, {7, 8, 1, 3, 6, 4, 0, 2, 5})}}; };
  check_op(b, {{"x", make_ints(kI32, {9}, {3, 1, 3, 1, 2, 3, 1, 0, 0})}}, ref, Tolerance::exact());
}

// Expert ids of a router (few distinct keys, long runs of ties) and wide values with negatives and limits.
TEST(Argsort, RandomKeysWithNegatives) {
  Rng rng(5);
  std::vector<int64_t> experts, wide = {INT32_MIN, INT32_MAX, 0, -1, INT32_MIN, INT32_MAX};
  for (int i = 0; i < 37 * 8; ++i) experts.push_back(rng.int_in(0, 15));
  for (int i = 0; i < 200; ++i) wide.push_back(rng.int_in(-50, 50) * (i % 3 == 0 ? 40000000 : 1));
  check_argsort(experts);
  check_argsort(wide);
}

// More keys than the GPU kernel stages at once (4,096): ranks summed over two chunks, a partial one.
TEST(Argsort, KeysPastOneChunk) {
  Rng rng(11);
  std::vector<int64_t> experts;
  for (int i = 0; i < 4096 + 999; ++i) experts.push_back(rng.int_in(0, 127));
  check_argsort(experts);
}

TEST(Argsort, EmptyAndSingle) {
  check_argsort({});
  check_argsort({-7});
}

// --- GatherRows and ScatterRows --------------------------------------------------------------------

// Rows `rows` of x (viewed as [R, ...]): shape [rows.size(), ...], values or exact ints.
RefTensor rows_ref(const Tensor& x, const std::vector<int64_t>& rows) {
  Shape shape = x.shape();
  shape[0] = static_cast<int64_t>(rows.size());
  const size_t row = x.dim(0) ? static_cast<size_t>(x.numel() / x.dim(0)) : 0;
  std::vector<double> v = x.to_doubles();
  std::vector<int64_t> vi = dtype_is_float(x.dtype()) ? std::vector<int64_t>{} : ints_of(x);
  RefTensor r{shape, {}, {}};
  for (int64_t src : rows)
    for (size_t i = 0; i < row; ++i) {
      const size_t k = static_cast<size_t>(src) * row + i;
      vi.empty() ? r.values.push_back(v[k]) : r.ints.push_back(vi[k]);
    }
  return r;
}

// Distinct values per element (so a wrong row shows), with -0, NaN and limits where the dtype has them.
Tensor row_data(DType t, const Shape& shape) {
  const int64_t n = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
  std::vector<double> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(static_cast<double>(i) * 1.25 - 7);
  if (n == 0) return make(t, shape, v);
  if (!dtype_is_float(t)) {
    std::vector<int64_t> vi(v.begin(), v.end());
    vi[0] = INT32_MIN;
    vi[size_t(n - 1)] = INT32_MAX;
    return make_ints(t, shape, vi);
  }
  v[0] = -0.0;
  v[size_t(n - 1)] = kNaN;
  return make(t, shape, v);
}

void check_gather_rows(const Tensor& x, const std::vector<int64_t>& idx) {
  SCOPED_TRACE(std::string("gather_rows ") + dtype_name(x.dtype()) + shape_str(x.shape()));
  ProgramBuilder b;
  b.output("y", b.gather_rows(b.input("x", x.dtype(), dims(x.shape())), b.input("idx", kI32, {Dim::dynamic(0, 64)})));
  auto ref = [&](const Inputs& in) { return Expected{{"y", rows_ref(in.at("x"), idx)}}; };
  check_op(b, {{"x", x}, {"idx", make_ints(kI32, {int64_t(idx.size())}, idx)}}, ref, Tolerance::exact());
}

TEST(GatherRows, RowsOfEachDtypeWithRepeats) {
  const std::vector<int64_t> idx = {4, 0, 0, 2, 4, 1, 3};  // more pairs than rows, repeats, every row
  for (DType t : {kF32, kBF16, kI32}) check_gather_rows(row_data(t, {5, 3}), idx);
  check_gather_rows(row_data(kF32, {5, 2, 3}), idx);
  check_gather_rows(row_data(kI32, {6}), {5, 0, 3});
  check_gather_rows(row_data(kF32, {5, 3}), {});
  // Rows of whole 16-byte units (the GPU's 16-byte copy): 16, 48 and 32 bytes.
  check_gather_rows(row_data(kI32, {5, 4}), idx);
  check_gather_rows(row_data(kBF16, {5, 24}), idx);
  check_gather_rows(row_data(kF32, {5, 2, 4}), idx);
}

TEST(GatherRows, OutOfRangeIndexFails) {
  for (const std::vector<int64_t>& idx : {std::vector<int64_t>{0, 5}, std::vector<int64_t>{-1}})
    for (int64_t width : {3, 4}) {  // 4: rows of one 16-byte unit
      ProgramBuilder b;
      b.output("y", b.gather_rows(b.input("x", kF32, {5, width}), b.input("idx", kI32, {Dim::dynamic(0, 64)})));
      check_op_error(b, {{"x", row_data(kF32, {5, width})}, {"idx", make_ints(kI32, {int64_t(idx.size())}, idx)}},
                     "out of range");
    }
}

std::vector<int64_t> inverse(const std::vector<int64_t>& perm) {
  std::vector<int64_t> inv(perm.size());
  for (size_t p = 0; p < perm.size(); ++p) inv[size_t(perm[p])] = static_cast<int64_t>(p);
  return inv;
}

// g = gather_rows(x, perm) and y = scatter_rows(g, perm) == x; scatter on its own is x's rows by perm^-1.
void check_round_trip(const Tensor& x, const std::vector<int64_t>& perm) {
  SCOPED_TRACE(std::string("scatter_rows ") + dtype_name(x.dtype()) + shape_str(x.shape()));
  ProgramBuilder b;
  TensorRef in = b.input("x", x.dtype(), rows_dynamic(x.shape())), p = b.input("perm", kI32, {Dim::dynamic(0, 64)});
  TensorRef g = b.gather_rows(in, p);
  b.output("g", g);
  b.output("y", b.scatter_rows(g, p));
  b.output("s", b.scatter_rows(in, p));
  auto ref = [&](const Inputs& i) {
    const Tensor& t = i.at("x");
    std::vector<int64_t> all(size_t(t.dim(0)));
    std::iota(all.begin(), all.end(), 0);
    return Expected{{"g", rows_ref(t, perm)}, {"y", rows_ref(t, all)}, {"s", rows_ref(t, inverse(perm))}};
  };
  check_op(b, {{"x", x}, {"perm", make_ints(kI32, {int64_t(perm.size())}, perm)}}, ref, Tolerance::exact());
}

TEST(ScatterRows, InvertsGatherRowsBySamePermutation) {
  const std::vector<int64_t> perm = {3, 0, 5, 1, 4, 2}, reversed = {5, 4, 3, 2, 1, 0};
  for (DType t : {kF32, kBF16, kI32}) check_round_trip(row_data(t, {6, 4}), perm);
  check_round_trip(row_data(kF32, {6, 2, 2}), reversed);
  check_round_trip(row_data(kBF16, {6, 16}), perm);  // 32-byte rows
  check_round_trip(row_data(kI32, {6}), perm);
  check_round_trip(row_data(kF32, {1, 3}), {0});
  check_round_trip(row_data(kF32, {0, 3}), {});
}

TEST(ScatterRows, NonPermutationFails) {
  for (const std::vector<int64_t>& idx :
       {std::vector<int64_t>{0, 1, 1, 3}, std::vector<int64_t>{0, 1, 2, 4}, std::vector<int64_t>{-1, 0, 1, 2}}) {
    ProgramBuilder b;
    b.output("y", b.scatter_rows(b.input("x", kF32, {4, 2}), b.input("idx", kI32, {Dim::dynamic(0, 64)})));
    check_op_error(b, {{"x", row_data(kF32, {4, 2})}, {"idx", make_ints(kI32, {4}, idx)}}, "not a permutation");
  }
}

TEST(ScatterRows, IndexCountMustMatchRows) {
  ProgramBuilder b;
  b.output("y", b.scatter_rows(b.input("x", kF32, {4, 2}), b.input("idx", kI32, {Dim::dynamic(0, 64)})));
  check_op_error(b, {{"x", row_data(kF32, {4, 2})}, {"idx", make_ints(kI32, {3}, {0, 1, 2})}}, "3 indices for 4 rows");
}

// --- Glu ---------------------------------------------------------------------------------------------

constexpr float kAlpha = 1.702f, kLimit = 7.0f;
const std::vector<GluKind> kGluKinds = {GluKind::kSwiGLU, GluKind::kGEGLU, GluKind::kClampedSwiGLU};
const char* const kGluNames[] = {"SwiGLU", "GEGLU", "ClampedSwiGLU"};

// min / max as the kernels take them (Binary Min/Max): NaN propagates; signed zeros do not occur here.
float min32(float a, float b) { return std::isnan(a) || std::isnan(b) ? (std::isnan(a) ? a : b) : a < b ? a : b; }
float max32(float a, float b) { return std::isnan(a) || std::isnan(b) ? (std::isnan(a) ? a : b) : a > b ? a : b; }

// The schema formula in f32, left to right, with the exact:: routines the kernels use.
float glu32(GluKind kind, float g, float u) {
  switch (kind) {
    case GluKind::kSwiGLU: return exact::silu(g) * u;
    case GluKind::kGEGLU: return exact::gelu_tanh(g) * u;
    case GluKind::kClampedSwiGLU: {
      const float gc = min32(g, kLimit), uc = max32(min32(u, kLimit), -kLimit);
      return (gc * exact::sigmoid(kAlpha * gc)) * (uc + 1.0f);
    }
  }
  return 0;
}

// The same formulas in double with std::exp / std::tanh and the true GELU constants.
double glu64(GluKind kind, double g, double u) {
  auto sigmoid = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
  const double c = std::sqrt(2 / std::numbers::pi);
  switch (kind) {
    case GluKind::kSwiGLU: return g * sigmoid(g) * u;
    case GluKind::kGEGLU: return 0.5 * g * (1 + std::tanh(c * (g + 0.044715 * g * g * g))) * u;
    case GluKind::kClampedSwiGLU: {
      const double gc = std::min(g, double(kLimit)), uc = std::clamp(u, -double(kLimit), double(kLimit));
      return gc * sigmoid(double(kAlpha) * gc) * (uc + 1);
    }
  }
  return 0;
}

// Relative error bound of glu32 against glu64 at gate g, in u = 2^-24 (1 ulp <= 2u). docs/numerics.md:
// exp <= 3.02 ulp (6.04u), rcp <= 1.99 ulp (4u), tanh <= 3.4e-7 absolute (5.71u).
//  sigmoid: exp, 1 + e (u), rcp: 11.04u; silu adds g * s (u), SwiGLU * up (u): 13.04u.
//  ClampedSwiGLU: fl(alpha gc) errs by |alpha gc| u, which e^-z passes on as a relative |alpha gc| u;
//    then the sigmoid, * gc, uc + 1, the product: |alpha gc| + 14.04.
//  GEGLU: 1 + tanh(a) turns tanh's absolute error into a relative 5.71u / (1 + tanh(a)), which grows as g
//    goes negative, plus its own rounding u; the argument a (x^3, the f32 constants, the sums: about 4u
//    relative) moves 1 + tanh by (1 - tanh(a)) |a| 4u; then 0.5 x (exact), * (1 + tanh), * up: 2u.
double glu_bound(GluKind kind, double g) {
  switch (kind) {
    case GluKind::kSwiGLU: return 13.04 * kU;
    case GluKind::kClampedSwiGLU: return (std::fabs(kAlpha * std::min(g, double(kLimit))) + 14.04) * kU;
    case GluKind::kGEGLU: {
      const double a = std::sqrt(2 / std::numbers::pi) * (g + 0.044715 * g * g * g), th = std::tanh(a);
      return (5.71 / (1 + th) + 1 + (1 - th) * std::fabs(a) * 4 + 2) * kU;
    }
  }
  return 0;
}

// Rounding the f32 result to the output dtype adds half an ulp: 2^-11 (f16), 2^-8 (bf16), relative.
double half_ulp(DType t) { return t == kF16 ? 0x1p-11 : t == kBF16 ? 0x1p-8 : 0; }

void build_glu(ProgramBuilder& b, GluKind kind, DType t, int64_t n) {
  b.output("y", b.glu(b.input("gate", t, {n}), b.input("up", t, {n}), kind, kAlpha, kLimit));
}

// Bitwise: glu32 on the stored inputs, rounded once to the output dtype.
void check_glu_bits(GluKind kind, DType t, const std::vector<double>& gate, const std::vector<double>& up) {
  SCOPED_TRACE(std::string(kGluNames[int(kind)]) + " bitwise " + dtype_name(t));
  const auto n = static_cast<int64_t>(gate.size());
  ProgramBuilder b;
  build_glu(b, kind, t, n);
  auto ref = [&](const Inputs& in) {
    std::vector<double> g = in.at("gate").to_doubles(), u = in.at("up").to_doubles();
    RefTensor r{{n}, {}, {}};
    for (size_t i = 0; i < g.size(); ++i) r.values.push_back(round_to(t, glu32(kind, float(g[i]), float(u[i]))));
    return Expected{{"y", r}};
  };
  check_op(b, {{"gate", make(t, {n}, gate)}, {"up", make(t, {n}, up)}}, ref, Tolerance::exact());
}

// Within the bound of glu64; the tolerance is the largest bound over the gates used.
void check_glu_f64(GluKind kind, DType t, const std::vector<double>& gate, const std::vector<double>& up) {
  SCOPED_TRACE(std::string(kGluNames[int(kind)]) + " float64 " + dtype_name(t));
  const auto n = static_cast<int64_t>(gate.size());
  Inputs inputs = {{"gate", make(t, {n}, gate)}, {"up", make(t, {n}, up)}};
  double bound = 0;
  for (double g : inputs.at("gate").to_doubles()) bound = std::max(bound, glu_bound(kind, g));
  ProgramBuilder b;
  build_glu(b, kind, t, n);
  auto ref = [&](const Inputs& in) {
    std::vector<double> g = in.at("gate").to_doubles(), u = in.at("up").to_doubles();
    RefTensor r{{n}, {}, {}};
    for (size_t i = 0; i < g.size(); ++i) r.values.push_back(glu64(kind, g[i], u[i]));
    return Expected{{"y", r}};
  };
  check_op(b, inputs, ref, Tolerance::rel(bound * (1 + half_ulp(t)) + half_ulp(t)));
}

// Random operands whose results stay normal in every dtype (f16 has the narrow range): gates with
// |g| >= 0.1; GEGLU gates >= -1, where its bound is 1.6e-6 (1 + tanh cancels below: 8.6e-6 at -2, 1.4e-4
// at -3); ClampedSwiGLU up values off [-1.5, 0.25) so u' + 1 does not cancel, and some beyond +-limit.
void random_glu(GluKind kind, DType t, uint32_t seed, std::vector<double>& gate, std::vector<double>& up) {
  Rng rng(seed);
  const double lo = kind == GluKind::kGEGLU ? -1 : t == kF16 ? -5 : -20, hi = kind == GluKind::kGEGLU ? 6 : 12;
  for (int i = 0; i < 256; ++i) {
    double g = rng.uniform(lo, hi);
    gate.push_back(std::fabs(g) < 0.1 ? 0.1 + std::fabs(g) : g);
    const bool neg = rng.uniform(0, 1) < 0.5;
    if (kind == GluKind::kClampedSwiGLU)
      up.push_back(neg ? rng.uniform(-12, -1.5) : rng.uniform(0.25, 12));
    else
      up.push_back((neg ? -1 : 1) * rng.uniform(0.25, 4));
  }
}

TEST(Glu, RandomOperandsBitwiseAndWithinFloat64Bound) {
  uint32_t seed = 40;
  for (GluKind kind : kGluKinds)
    for (DType t : {kF32, kF16, kBF16}) {
      std::vector<double> gate, up;
      random_glu(kind, t, seed++, gate, up);
      check_glu_bits(kind, t, gate, up);
      check_glu_f64(kind, t, gate, up);
    }
}

// Non-finite, signed-zero, tiny and huge operands, and gates / up values past +-limit: bitwise only.
TEST(Glu, EdgeOperandsBitwise) {
  const std::vector<double> gate = {kNaN, kInf, -kInf, -0.0, 0.0, 100, -100, 7, 7.5, -7.5, 1e-3, 30, 12, -90, 2, -3};
  const std::vector<double> up = {1, 2, -2, 3, -0.0, 0.5, 1, kNaN, 9, -9, 7.25, -12, kInf, 1, -1, -7.5};
  for (GluKind kind : kGluKinds)
    for (DType t : {kF32, kF16, kBF16}) check_glu_bits(kind, t, gate, up);
}

// The clamp itself: gate min(g, 7), up clamp(u, -7, 7); 1 / (1 + e^-11.914) is 1 - 7e-6, so g' = 7 gives
// about 7 * (u' + 1).
TEST(Glu, ClampedSwiGLUClampsGateAboveAndUpBothSides) {
  const std::vector<double> gate = {8, 100, 7, 8, 8}, up = {0, 0, 0, 100, -100};
  check_glu_f64(GluKind::kClampedSwiGLU, kF32, gate, up);
  check_glu_bits(GluKind::kClampedSwiGLU, kF32, gate, up);
}

// --- Combine -------------------------------------------------------------------------------------------

enum class Shared { kNone, kPlain, kGated };

// acc = base; acc = acc + w_j * y_j for j = 0..k-1, in f32; base = sigmoid(gate) * shared (exact::sigmoid),
// shared, or +0. `reverse` adds the slots k-1..0 instead (used only to show the data depends on the order).
RefTensor combine_ref(const Inputs& in, int64_t k, Shared sh, DType out, bool reverse = false) {
  const Tensor& yt = in.at("y");
  std::vector<double> y = yt.to_doubles(), w = in.at("w").to_doubles(), s, g;
  if (sh != Shared::kNone) s = in.at("shared").to_doubles();
  if (sh == Shared::kGated) g = in.at("gate").to_doubles();
  const int64_t d = yt.dim(1), tokens = yt.dim(0) / k;
  RefTensor r{{tokens, d}, {}, {}};
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t c = 0; c < d; ++c) {
      float acc = 0.0f;
      if (sh != Shared::kNone) acc = float(s[size_t(t * d + c)]);
      if (sh == Shared::kGated) acc = exact::sigmoid(float(g[size_t(t)])) * acc;
      for (int64_t i = 0; i < k; ++i) {
        const int64_t j = reverse ? k - 1 - i : i;
        acc = acc + float(w[size_t(t * k + j)]) * float(y[size_t((t * k + j) * d + c)]);
      }
      r.values.push_back(round_to(out, acc));
    }
  return r;
}

Inputs combine_inputs(DType t, int64_t tokens, int64_t k, int64_t d, uint32_t seed) {
  Rng rng(seed);
  std::vector<double> y, w, s, g;
  for (int64_t i = 0; i < tokens * k * d; ++i) y.push_back(rng.uniform(-2, 2));
  for (int64_t i = 0; i < tokens * k; ++i) w.push_back(rng.uniform(0, 1));
  for (int64_t i = 0; i < tokens * d; ++i) s.push_back(rng.uniform(-2, 2));
  for (int64_t i = 0; i < tokens; ++i) g.push_back(rng.uniform(-4, 4));
  return {{"y", make(t, {tokens * k, d}, y)},
          {"w", make(kF32, {tokens, k}, w)},
          {"shared", make(t, {tokens, d}, s)},
          {"gate", make(t, {tokens, 1}, g)}};
}

void check_combine(DType t, int64_t k, Shared sh, int64_t d, int64_t tokens = 5) {
  SCOPED_TRACE(std::string("combine ") + dtype_name(t) + " k=" + std::to_string(k) +
               " shared=" + std::to_string(int(sh)) + " d=" + std::to_string(d) + " tokens=" + std::to_string(tokens));
  Inputs in = combine_inputs(t, tokens, k, d, static_cast<uint32_t>(100 + k * 3 + int(sh)));
  if (sh != Shared::kGated) in.erase("gate");
  if (sh == Shared::kNone) in.erase("shared");
  ProgramBuilder b;
  TensorRef y = b.input("y", t, {Dim::dynamic(1, 4096), d}), w = b.input("w", kF32, {Dim::dynamic(1, 4096), k});
  TensorRef shared = sh == Shared::kNone ? TensorRef{} : b.input("shared", t, {Dim::dynamic(1, 4096), d});
  TensorRef gate = sh == Shared::kGated ? b.input("gate", t, {Dim::dynamic(1, 4096), 1}) : TensorRef{};
  b.output("out", b.combine(y, w, shared, gate));
  auto ref = [&](const Inputs& x) { return Expected{{"out", combine_ref(x, k, sh, t)}}; };
  check_op(b, in, ref, Tolerance::exact());
}

TEST(Combine, SlotOrderSumWithAndWithoutSharedExpert) {
  for (DType t : {kF32, kBF16})
    for (int64_t k : {1, 2, 8})
      for (Shared sh : {Shared::kNone, Shared::kPlain, Shared::kGated})
        for (int64_t d : {5, 6, 16}) check_combine(t, k, sh, d);  // odd rows; 16: whole 16-byte units
  // 65,536 outputs of whole 16-byte units: the GPU's 16-byte kernel (fewer outputs keep the word kernel).
  // k = 10: more slots than a top-8 router gives.
  for (DType t : {kF32, kBF16})
    for (Shared sh : {Shared::kNone, Shared::kGated})
      for (int64_t k : {3, 10}) check_combine(t, k, sh, 1024, 64);
  // The f32 data must make the slot order matter, or the checks above could not tell the orders apart.
  Inputs in = combine_inputs(kF32, 5, 8, 6, 100 + 8 * 3 + int(Shared::kGated));
  EXPECT_NE(combine_ref(in, 8, Shared::kGated, kF32).values, combine_ref(in, 8, Shared::kGated, kF32, true).values);
}

// ScatterRows straight into Combine (MoE prefill's end; a GPU reads y through the inverse
// permutation instead of writing the scattered copy): the same bits as the two ops, and a
// bad permutation still fails.
TEST(Combine, OfScatteredRows) {
  const int64_t tokens = 64;  // 64 x 1024 outputs: the GPU's fused kernel (fewer: the two kernels)
  for (int64_t k : {2, 9})    // 9: more slots than a top-8 router gives
    for (DType t : {kF32, kBF16})
      for (int64_t d : {6, 1024}) {
        std::vector<int64_t> perm(tokens * k);
        for (size_t p = 0; p < perm.size(); ++p) perm[p] = static_cast<int64_t>((p * 37 + 5) % perm.size());
        SCOPED_TRACE(std::string("scatter + combine ") + dtype_name(t) + " k=" + std::to_string(k) +
                     " d=" + std::to_string(d));
        Inputs in = combine_inputs(t, tokens, k, d, 300 + uint32_t(d));
        in.erase("shared");
        in.erase("gate");
        Inputs unsorted = in;  // the combine's y: row perm[p] of the scattered copy is row p of y
        std::vector<double> y = in.at("y").to_doubles(), ys(y.size());
        for (size_t p = 0; p < perm.size(); ++p)
          for (int64_t c = 0; c < d; ++c) ys[size_t(perm[p] * d + c)] = y[size_t(int64_t(p) * d + c)];
        unsorted["y"] = make(t, {tokens * k, d}, ys);
        ProgramBuilder b;
        TensorRef yin = b.input("y", t, {Dim::dynamic(1, 4096), d}),
                  pin = b.input("perm", kI32, {Dim::dynamic(0, 4096)});
        b.output("out", b.combine(b.scatter_rows(yin, pin), b.input("w", kF32, {Dim::dynamic(1, 4096), k})));
        in["perm"] = make_ints(kI32, {int64_t(perm.size())}, perm);
        auto ref = [&](const Inputs&) { return Expected{{"out", combine_ref(unsorted, k, Shared::kNone, t)}}; };
        check_op(b, in, ref, Tolerance::exact());
        std::vector<int64_t> bad = perm;
        bad[4] = bad[0];
        in["perm"] = make_ints(kI32, {int64_t(bad.size())}, bad);
        check_op_error(b, in, "not a permutation");
      }
}

TEST(Combine, RowsThatAreNotTokensTimesKFail) {
  ProgramBuilder b;
  b.output("out", b.combine(b.input("y", kF32, {Dim::dynamic(1, 64), 2}), b.input("w", kF32, {3, 2})));
  check_op_error(b,
                 {{"y", make(kF32, {5, 2}, std::vector<double>(10, 1))}, {"w", make(kF32, {3, 2}, {1, 1, 1, 1, 1, 1})}},
                 "does not hold");
}

TEST(Combine, SharedGateWithoutSharedIsRejected) {
  ProgramBuilder b;
  b.output("out", b.combine(b.input("y", kF32, {4, 2}), b.input("w", kF32, {2, 2}), {}, b.input("g", kF32, {2, 1})));
  auto bytes = b.serialize();
  ASSERT_FALSE(bytes.is_ok());
  EXPECT_NE(bytes.status().message().find("Combine.shared_gate: must be float and needs shared"), std::string::npos)
      << bytes.status().to_string();
}

// --- Full ----------------------------------------------------------------------------------------------

TEST(Full, StaticShapesOfEachDtype) {
  ProgramBuilder b;
  b.output("f32", b.full({2, 3}, kF32, 0.1));
  // Float dtypes take the f32 nearest to value first: 1 + 2^-11 + 2^-30 is 1 + 2^-11 in f32, a tie that
  // f16 rounds to even (1); rounded directly it would go up to 1 + 2^-10.
  b.output("f16", b.full({2}, kF16, 1 + 0x1p-11 + 0x1p-30));
  b.output("bf16", b.full({1, 1}, kBF16, -3.3));
  b.output("scalar", b.full({}, kF32, -2.5));
  b.output("empty", b.full({0, 3}, kF32, 1));
  b.output("i32", b.full({3}, kI32, -2.7));  // truncated toward zero
  b.output("i64", b.full({2}, kI64, 1e15 + 0.5));
  b.output("bool_t", b.full({2}, kBool, 2.5));
  b.output("bool_f", b.full({2}, kBool, -0.0));
  auto ref = [](const Inputs&) {
    const double tenth = round_to(kF32, 0.1), b16 = round_to(kBF16, -3.3);
    return Expected{{"f32", {{2, 3}, std::vector<double>(6, tenth), {}}},
                    {"f16", {{2}, {1, 1}, {}}},
                    {"bf16", {{1, 1}, {b16}, {}}},
                    {"scalar", {{}, {-2.5}, {}}},
                    {"empty", {{0, 3}, {}, {}}},
                    {"i32", ints_ref({3}, {-2, -2, -2})},
                    {"i64", ints_ref({2}, {1000000000000000, 1000000000000000})},
                    {"bool_t", ints_ref({2}, {1, 1})},
                    {"bool_f", ints_ref({2}, {0, 0})}};
  };
  check_op(b, {}, ref, Tolerance::exact());
}

// -0.0 equals the field default 0.0 by ==; the serializer must still keep its sign.
TEST(Full, NegativeZeroKeepsItsSign) {
  ProgramBuilder b;
  b.output("z", b.full({2}, kF32, -0.0));
  auto ref = [](const Inputs&) { return Expected{{"z", {{2}, {-0.0, -0.0}, {}}}}; };
  check_op(b, {}, ref, Tolerance::exact());
}

TEST(Full, DynamicShapeFromValue) {
  ProgramBuilder b;
  TensorRef x = b.input("x", kF32, {Dim::dynamic(1, 16), 2});
  IntOrValue rows = b.size(x, 0);
  b.output("ids", b.full({rows, 3}, kI32, 7));
  b.output("flat", b.full({b.mul_int(rows, 2)}, kF32, -1.5));
  auto ref = [](const Inputs&) {
    return Expected{{"ids", ints_ref({5, 3}, std::vector<int64_t>(15, 7))},
                    {"flat", {{10}, std::vector<double>(10, -1.5), {}}}};
  };
  check_op(b, {{"x", make(kF32, {5, 2}, std::vector<double>(10, 0))}}, ref, Tolerance::exact());
}

// --- FloorDiv --------------------------------------------------------------------------------------------

void check_floordiv(DType t, const Shape& sa, const std::vector<int64_t>& a, const Shape& sb,
                    const std::vector<int64_t>& b_vals, const Shape& so, const std::vector<int64_t>& want) {
  SCOPED_TRACE(std::string("floordiv ") + dtype_name(t));
  ProgramBuilder b;
  b.output("q", b.floordiv(b.input("a", t, dims(sa)), b.input("b", t, dims(sb))));
  auto ref = [&](const Inputs&) { return Expected{{"q", ints_ref(so, want)}}; };
  check_op(b, {{"a", make_ints(t, sa, a)}, {"b", make_ints(t, sb, b_vals)}}, ref, Tolerance::exact());
}

// Quotients worked by hand: floor toward -inf, so a negative inexact quotient moves down.
TEST(FloorDiv, RoundsTowardNegativeInfinity) {
  const std::vector<int64_t> a = {7, -7, 7, -7, 6, -6, 0, 1, -1, INT32_MAX, INT32_MIN, INT32_MIN + 1};
  const std::vector<int64_t> b = {2, 2, -2, -2, 3, 3, 5, -3, 3, -1, 2, -2};
  const std::vector<int64_t> q = {3, -4, -4, 3, 2, -2, 0, -1, -1, -INT32_MAX, -1073741824, 1073741823};
  for (DType t : {kI32, kI64}) check_floordiv(t, {12}, a, {12}, b, {12}, q);
  check_floordiv(kI64, {3}, {INT64_MAX, INT64_MIN, (1LL << 40) + 1}, {3}, {2, 3, -(1LL << 20)}, {3},
                 {4611686018427387903LL, -3074457345618258603LL, -(1LL << 20) - 1});
  // Broadcast: [2, 3] by [1].
  check_floordiv(kI32, {2, 3}, {-9, -8, -1, 0, 5, 8}, {1}, {-4}, {2, 3}, {2, 2, 0, 0, -2, -2});
}

TEST(FloorDiv, DivisionByZeroFails) {
  for (DType t : {kI32, kI64}) {
    ProgramBuilder b;
    b.output("q", b.floordiv(b.input("a", t, {3}), b.input("b", t, {3})));
    check_op_error(b, {{"a", make_ints(t, {3}, {1, 2, 3})}, {"b", make_ints(t, {3}, {1, 0, 1})}}, "FloorDiv by zero");
  }
}

TEST(FloorDiv, FloatOperandsAreRejected) {
  ProgramBuilder b;
  b.output("q", b.floordiv(b.input("a", kF32, {3}), b.input("b", kF32, {3})));
  auto bytes = b.serialize();
  ASSERT_FALSE(bytes.is_ok());
  EXPECT_NE(bytes.status().message().find("floordiv: needs i32 or i64 tensors"), std::string::npos);
}

// MIN // -1 overflows; like the other integer ops it wraps (to MIN).
TEST(FloorDiv, MinByMinusOneWraps) {
  for (DType t : {kI32, kI64}) {
    SCOPED_TRACE(dtype_name(t));
    const int64_t min = t == kI32 ? INT32_MIN : INT64_MIN;
    ProgramBuilder b;
    b.output("q", b.floordiv(b.input("a", t, {1}), b.input("bb", t, {1})));
    auto program = Program::from_bytes(b.serialize().value(), "floordiv").value();
    auto s = Session::create(program, SessionOptions{"cpu"}).value();
    ASSERT_TRUE(s->set_input("a", make_ints(t, {1}, {min})).is_ok());
    ASSERT_TRUE(s->set_input("bb", make_ints(t, {1}, {-1})).is_ok());
    ASSERT_TRUE(s->execute().is_ok());
    EXPECT_EQ(ints_of(s->output("q").value())[0], min);
  }
}

}  // namespace
}  // namespace switchboard::optest
