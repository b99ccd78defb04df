// Every CPU op through the op harness (tests/op_harness.h): values, edge cases, and run-time shape
// errors. References compute in double and round the way schema/program.fbs states for each op.
#include <gtest/gtest-spi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <tuple>

#include "op_harness.h"

namespace switchboard::optest {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr DType kF32 = DType::kF32, kF16 = DType::kF16, kBF16 = DType::kBF16, kI32 = DType::kI32, kI64 = DType::kI64,
                kU8 = DType::kU8, kU32 = DType::kU32, kBool = DType::kBool;
const std::vector<DType> kFloats = {kF32, kF16, kBF16};
const std::vector<DType> kAllTypes = {kF32, kF16, kBF16, kI32, kI64, kU8, kU32, kBool};

// --- helpers -------------------------------------------------------------------------------------

std::vector<Dim> dims(const Shape& s) { return std::vector<Dim>(s.begin(), s.end()); }
int64_t numel(const Shape& s) { return std::accumulate(s.begin(), s.end(), int64_t{1}, std::multiplies<>()); }

// A tensor holding the low bits of each value (two's complement), or (v != 0) for bool.
Tensor make_ints(DType t, const Shape& shape, const std::vector<int64_t>& v) {
  Tensor out = Tensor::zeros(t, shape).value();
  auto* p = static_cast<uint8_t*>(out.mutable_data());
  for (size_t i = 0; i < v.size(); ++i) {
    auto put = [&](auto x) { std::memcpy(p + i * sizeof(x), &x, sizeof(x)); };
    switch (t) {
      case kI32: put(static_cast<int32_t>(v[i])); break;
      case kI64: put(v[i]); break;
      case kU32: put(static_cast<uint32_t>(v[i])); break;
      case kBool: put(static_cast<uint8_t>(v[i] != 0)); break;
      default: put(static_cast<uint8_t>(v[i])); break;
    }
  }
  return out;
}

// Reference of `shape` whose element i is element src(i) of x: every data-movement op.
RefTensor gather(const Tensor& x, const Shape& shape, const std::function<int64_t(int64_t)>& src) {
  RefTensor r{shape, {}, {}};
  std::vector<double> v = x.to_doubles();
  std::vector<int64_t> vi = dtype_is_float(x.dtype()) ? std::vector<int64_t>{} : ints_of(x);
  for (int64_t i = 0; i < numel(shape); ++i) {
    auto k = static_cast<size_t>(src(i));
    vi.empty() ? r.values.push_back(v[k]) : r.ints.push_back(vi[k]);
  }
  return r;
}
RefTensor same(const Tensor& x) {
  return gather(x, x.shape(), [](int64_t i) { return i; });
}

std::vector<int64_t> unravel(const Shape& s, int64_t flat) {
  std::vector<int64_t> idx(s.size());
  for (size_t k = s.size(); k-- > 0; flat /= s[k]) idx[k] = flat % s[k];
  return idx;
}
int64_t ravel(const Shape& s, const std::vector<int64_t>& idx) {
  int64_t flat = 0;
  for (size_t k = 0; k < s.size(); ++k) flat = flat * s[k] + idx[k];
  return flat;
}

// Values 0.5 .. 1.5 (positive: matmul tolerances below rely on it), a deterministic pattern.
std::vector<double> positive(int64_t n, int seed) {
  std::vector<double> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(0.5 + static_cast<double>((i * 37 + seed * 11) % 101) / 101.0);
  return v;
}

// --- Binary --------------------------------------------------------------------------------------

struct BinOp {
  const char* name;
  TensorRef (ProgramBuilder::*emit)(TensorRef, TensorRef);
  double (*f)(double, double);        // exact for f32 operands, so one rounding to f32 gives the f32 result
  uint64_t (*i)(uint64_t, uint64_t);  // two's complement: wraps like the kernels (schema leaves overflow open)
  bool ints_ok;
};
double nan_or(double a, double b, double r) { return std::isnan(a) || std::isnan(b) ? kNaN : r; }
const BinOp kAdd{"add", &ProgramBuilder::add, [](double a, double b) { return a + b; },
                 [](uint64_t a, uint64_t b) { return a + b; }, true};
const BinOp kSub{"sub", &ProgramBuilder::sub, [](double a, double b) { return a - b; },
                 [](uint64_t a, uint64_t b) { return a - b; }, true};
const BinOp kMul{"mul", &ProgramBuilder::mul, [](double a, double b) { return a * b; },
                 [](uint64_t a, uint64_t b) { return a * b; }, true};
const BinOp kDiv{"div", &ProgramBuilder::div, [](double a, double b) { return a / b; }, nullptr, false};
// Equal operands (+0, -0): max picks +0 and min picks -0, whatever the order.
double ref_max(double a, double b) { return a == b ? (std::signbit(a) ? b : a) : std::max(a, b); }
double ref_min(double a, double b) { return a == b ? (std::signbit(a) ? a : b) : std::min(a, b); }
const BinOp kMax{"maximum", &ProgramBuilder::maximum, [](double a, double b) { return nan_or(a, b, ref_max(a, b)); },
                 [](uint64_t a, uint64_t b) { return uint64_t(std::max(int64_t(a), int64_t(b))); }, true};
const BinOp kMin{"minimum", &ProgramBuilder::minimum, [](double a, double b) { return nan_or(a, b, ref_min(a, b)); },
                 [](uint64_t a, uint64_t b) { return uint64_t(std::min(int64_t(a), int64_t(b))); }, true};
const std::vector<BinOp> kBinOps = {kAdd, kSub, kMul, kDiv, kMax, kMin};

Shape broadcast(const Shape& a, const Shape& b) {
  Shape out(std::max(a.size(), b.size()), 1);
  for (size_t k = 0; k < out.size(); ++k) {
    int64_t da = k < a.size() ? a[a.size() - 1 - k] : 1, db = k < b.size() ? b[b.size() - 1 - k] : 1;
    out[out.size() - 1 - k] = da == 1 ? db : da;
  }
  return out;
}
// Flat index into `s` of output element `i` (numpy broadcasting: right-aligned, size-1 dims repeat).
int64_t bcast_index(const Shape& s, const Shape& out, int64_t i) {
  std::vector<int64_t> idx = unravel(out, i);
  std::vector<int64_t> src(idx.end() - static_cast<int64_t>(s.size()), idx.end());
  for (size_t k = 0; k < s.size(); ++k) src[k] = s[k] == 1 ? 0 : src[k];
  return ravel(s, src);
}
int64_t wrap_int(DType t, uint64_t v) { return t == kI32 ? int64_t{static_cast<int32_t>(v)} : int64_t(v); }

RefTensor binary_ref(const BinOp& op, const Tensor& a, const Tensor& b) {
  RefTensor r{broadcast(a.shape(), b.shape()), {}, {}};
  const DType t = a.dtype();
  std::vector<double> va = a.to_doubles(), vb = b.to_doubles();
  std::vector<int64_t> ia, ib;
  if (!dtype_is_float(t)) ia = ints_of(a), ib = ints_of(b);
  for (int64_t i = 0; i < numel(r.shape); ++i) {
    auto ka = static_cast<size_t>(bcast_index(a.shape(), r.shape, i));
    auto kb = static_cast<size_t>(bcast_index(b.shape(), r.shape, i));
    // f16/bf16: computed in f32, then rounded once more to the 16-bit format.
    if (dtype_is_float(t))
      r.values.push_back(round_to(t, op.f(va[ka], vb[kb])));
    else
      r.ints.push_back(wrap_int(t, op.i(uint64_t(ia[ka]), uint64_t(ib[kb]))));
  }
  return r;
}

void check_binary(const BinOp& op, DType t, const Tensor& a, const Tensor& b) {
  SCOPED_TRACE(std::string(op.name) + " " + dtype_name(t) + " " + shape_str(a.shape()) + " x " + shape_str(b.shape()));
  ProgramBuilder pb;
  TensorRef ra = pb.input("a", t, dims(a.shape())), rb = pb.input("b", t, dims(b.shape()));
  pb.output("y", (pb.*op.emit)(ra, rb));
  auto ref = [&](const Inputs& in) { return Expected{{"y", binary_ref(op, in.at("a"), in.at("b"))}}; };
  // f32 ops are correctly rounded and the reference rounds the exact double result once: exact.
  check_op(pb, {{"a", a}, {"b", b}}, ref, Tolerance::exact());
}

void check_binary(const BinOp& op, DType t, const Shape& sa, const std::vector<double>& va, const Shape& sb,
                  const std::vector<double>& vb) {
  check_binary(op, t, make(t, sa, va), make(t, sb, vb));
}

// Operand pairs with mixed signs and magnitudes; some round in f16/bf16, some overflow, some tie.
const std::vector<double> kFloatA = {1.5, -2.25, 3, 1e-3, 0.1, 7, -0.0, 65504, 1, 1e30, 300, 1 + 0x1p-8};
const std::vector<double> kFloatB = {0.5, 4, -3, 3e-3, 0.2, 3, 2, 32, 0x1p-11, 1e10, 300, 0x1p-9};
const std::vector<double> kIntA = {1, -2, 3, 100, 0, 7, -9, 2147483647, 65536, -5, -2147483648, 12};
const std::vector<double> kIntB = {5, 4, -3, 7, 0, 3, 2, 1, 65536, -5, -1, -12};

TEST(Binary, AllOpsAllDtypesSameShape) {
  for (const BinOp& op : kBinOps) {
    for (DType t : kFloats) check_binary(op, t, {2, 6}, kFloatA, {2, 6}, kFloatB);
    if (!op.ints_ok) continue;
    for (DType t : {kI32, kI64}) check_binary(op, t, {2, 6}, kIntA, {2, 6}, kIntB);
  }
}

TEST(Binary, Broadcast3x1By1x4) {
  for (const BinOp& op : kBinOps)
    for (DType t : {kF32, kBF16, kI32, kI64})
      if (op.ints_ok || dtype_is_float(t)) check_binary(op, t, {3, 1}, {1, -2, 3}, {1, 4}, {10, 20, -30, 40});
}

TEST(Binary, BroadcastScalarLikeOnEitherSide) {
  std::vector<double> six = {1, -2, 3, 4.5, -5, 6};
  for (const BinOp& op : kBinOps) {
    check_binary(op, kF32, {2, 3}, six, {1}, {2.5});
    check_binary(op, kF16, {1}, {-3}, {2, 3}, six);
  }
}

TEST(Binary, BroadcastRankMismatch) {
  std::vector<double> v24(24);
  std::iota(v24.begin(), v24.end(), -11);
  for (const BinOp& op : kBinOps) {
    check_binary(op, kF32, {2, 3, 4}, v24, {4}, {0.5, -1, 2, 0.1});
    check_binary(op, kF32, {3, 1}, {1, 2, -3}, {2, 1, 4}, std::vector<double>(v24.begin(), v24.begin() + 8));
    if (op.ints_ok) check_binary(op, kI64, {4}, {7, -7, 0, 1}, {2, 3, 4}, v24);
  }
}

TEST(Binary, MaxMinPropagateNaNFromEitherSide) {
  std::vector<double> a = {kNaN, 1, kNaN, -kInf, kInf, 2}, b = {1, kNaN, kNaN, kNaN, 3, -kInf};
  for (DType t : kFloats) {
    check_binary(kMax, t, {6}, a, {6}, b);
    check_binary(kMin, t, {6}, a, {6}, b);
  }
}

TEST(Binary, MaxMinOfSignedZerosIgnoreOperandOrder) {
  for (DType t : kFloats) {
    check_binary(kMax, t, {2}, {-0.0, 0.0}, {2}, {0.0, -0.0});
    check_binary(kMin, t, {2}, {-0.0, 0.0}, {2}, {0.0, -0.0});
  }
}

TEST(Binary, DivisionByZeroGivesInfAndNaN) {
  for (DType t : kFloats) check_binary(kDiv, t, {5}, {1, -1, 0, 6, 1}, {5}, {0, 0, 0, -0.0, 3});
}

TEST(Binary, IntegerOverflowWraps) {
  int64_t big = std::numeric_limits<int64_t>::max(), small = std::numeric_limits<int64_t>::min();
  for (const BinOp& op : {kAdd, kSub, kMul, kMax, kMin})
    check_binary(op, kI64, make_ints(kI64, {4}, {big, small, big, 1LL << 62}), make_ints(kI64, {4}, {1, 1, big, 4}));
}

TEST(Binary, RuntimeShapesThatDoNotBroadcastFail) {
  ProgramBuilder b;
  TensorRef x = b.input("x", kF32, {Dim::dynamic(1, 8)}), y = b.input("y", kF32, {Dim::dynamic(1, 8)});
  b.output("z", b.add(x, y));
  check_op_error(b, {{"x", make(kF32, {3}, {1, 2, 3})}, {"y", make(kF32, {4}, {1, 2, 3, 4})}}, "broadcast");
}

// --- Unary ---------------------------------------------------------------------------------------

struct UnOp {
  const char* name;
  TensorRef (ProgramBuilder::*emit)(TensorRef);
  double (*f)(double);
  uint64_t (*i)(uint64_t);
};
const std::vector<UnOp> kUnOps = {
    {"neg", &ProgramBuilder::neg, [](double v) { return -v; }, [](uint64_t v) { return 0 - v; }},
    {"abs", &ProgramBuilder::abs, [](double v) { return std::fabs(v); },
     [](uint64_t v) { return int64_t(v) < 0 ? 0 - v : v; }},
    {"square", &ProgramBuilder::square, [](double v) { return v * v; }, [](uint64_t v) { return v * v; }},
    // relu is x < 0 ? 0 : x, so -0 and NaN pass through unchanged (pinned: every device must agree).
    {"relu", &ProgramBuilder::relu, [](double v) { return v < 0 ? 0.0 : v; },
     [](uint64_t v) { return int64_t(v) < 0 ? 0 : v; }},
};

void check_unary(const UnOp& op, const Tensor& x) {
  SCOPED_TRACE(std::string(op.name) + " " + dtype_name(x.dtype()));
  const DType t = x.dtype();
  ProgramBuilder b;
  b.output("y", (b.*op.emit)(b.input("x", t, dims(x.shape()))));
  auto ref = [&](const Inputs& in) {
    RefTensor r{in.at("x").shape(), {}, {}};
    if (dtype_is_float(t))
      for (double v : in.at("x").to_doubles()) r.values.push_back(round_to(t, op.f(v)));
    else
      for (int64_t v : ints_of(in.at("x"))) r.ints.push_back(wrap_int(t, op.i(uint64_t(v))));
    return Expected{{"y", r}};
  };
  check_op(b, {{"x", x}}, ref, Tolerance::exact());
}

TEST(Unary, FloatEdgeValues) {
  std::vector<double> v = {-0.0, 0.0, kNaN, -kInf, kInf, -2.5, 3, 300, 1e-30, 65504, -1.7, 1e20, 1 + 0x1p-6};
  for (const UnOp& op : kUnOps)
    for (DType t : kFloats) check_unary(op, make(t, {static_cast<int64_t>(v.size())}, v));
}

TEST(Unary, IntegersWrap) {
  std::vector<int64_t> v = {0, 5, -7, 46341, INT32_MIN, INT32_MAX, -1};
  for (const UnOp& op : kUnOps) {
    check_unary(op, make_ints(kI32, {7}, v));
    check_unary(op, make_ints(kI64, {8}, {0, 5, -7, 46341, INT32_MIN, 3037000500, INT64_MIN, INT64_MAX}));
  }
}

// --- Cast ----------------------------------------------------------------------------------------

// |v| rounded to `bits` significant bits, ties to even, in exact integer arithmetic (no detour via f32).
double round_int(int64_t v, int bits) {
  uint64_t m = v < 0 ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  int shift = std::max((m ? 64 - __builtin_clzll(m) : 0) - bits, 0);
  if (shift == 0) return static_cast<double>(v);
  uint64_t q = m >> shift, rem = m & ((uint64_t{1} << shift) - 1), half = uint64_t{1} << (shift - 1);
  if (rem > half || (rem == half && (q & 1))) ++q;
  return (v < 0 ? -1.0 : 1.0) * std::ldexp(static_cast<double>(q), shift);
}

// CastNode into a float dtype: float -> float RNE; int -> float RNE (straight to the target format).
double cast_to_float(DType from, double x, int64_t xi, DType to) {
  if (dtype_is_float(from)) return round_to(to, x);  // x is exactly an f32, so this is a single RNE step
  if (to == kF32) return round_int(xi, 24);
  if (to == kBF16) return round_int(xi, 8);
  double r = round_int(xi, 11);
  return std::fabs(r) > 65504 ? std::copysign(kInf, r) : r;  // beyond the largest f16 after rounding: inf
}

// CastNode into an integer dtype: float -> int truncates, saturates, NaN -> 0; anything -> bool is
// (x != 0); int -> int is the C++ conversion (low bits; the schema does not say, the kernel wraps).
int64_t cast_to_int(DType from, double x, int64_t xi, DType to) {
  if (to == kBool) return dtype_is_float(from) ? x != 0 : xi != 0;
  if (!dtype_is_float(from)) return to == kU8 ? uint8_t(xi) : to == kU32 ? int64_t{uint32_t(xi)} : wrap_int(to, xi);
  if (std::isnan(x)) return 0;
  double t = std::trunc(x);
  if (to == kI64) return t >= 0x1p63 ? INT64_MAX : t <= -0x1p63 ? INT64_MIN : static_cast<int64_t>(t);
  double hi = to == kI32 ? INT32_MAX : to == kU32 ? UINT32_MAX : 255, lo = to == kI32 ? INT32_MIN : 0;
  return static_cast<int64_t>(std::clamp(t, lo, hi));
}

// clang-format off
// Float sources (NaN: CastNaN below).
const std::vector<double> kCastFloats = {
    0, -0.0, 0.5, -0.5, 1.5, 2.5, -1.7, 255.5, 256, 300, -1,              // truncation toward zero, RNE ties
    65504, 65519, 65520, 3.3895313892515355e38, kInf, -kInf,            // f16 max/to max/to inf; bf16 max
    3e9, -3e9, 1e10, 1e20, -1e20, 0x1p63, -0x1p63, 0x1p62,               // saturation of each int type
    4294967296.0, 2147483648.0, -2147483904.0,                           // just past u32 / i32 limits
    0x1p-24, 0x1p-25, 0x3p-25, 0x1p-14 - 0x1p-24, 0x1p-15, -0x1p-26, 1e-30,  // f16 subnormals and ties
    1 + 0x1p-8, 1 + 0x3p-8, 1 + 0x1p-8 + 0x1p-20, 1 + 0x1p-11, 1 + 0x3p-11};  // bf16 and f16 ties
// Integer sources, stored as each dtype's low bits (16842753: bf16 must round once, see CastInt).
const std::vector<int64_t> kCastInts = {
    0, 1, -1, 2, 127, 128, 255, 256, -256, 300,                          // u8 wrap, bool
    2049, 2051, 65504, 65519, 65520, 16777217, 16777219,                 // f16 / f32 ties, f16 overflow
    INT32_MAX, INT32_MIN, 4294967295LL, 4294967296LL, 4294967297LL,      // i32 / u32 wrap
    (1LL << 53) + 1, (1LL << 60) + (1LL << 36) + 1, INT64_MAX, INT64_MIN};  // f32 RNE from i64 (not via double)
// clang-format on

// Casts x to each target in one program; every output checked against the CastNode rules.
void check_cast(const Tensor& x, const std::vector<DType>& targets) {
  const DType from = x.dtype();
  SCOPED_TRACE(std::string("cast from ") + dtype_name(from));
  ProgramBuilder b;
  TensorRef in = b.input("x", from, dims(x.shape()));
  for (DType to : targets) b.output(std::string("to_") + dtype_name(to), b.cast(in, to));
  auto ref = [&](const Inputs& inputs) {
    const Tensor& t = inputs.at("x");
    std::vector<double> xf = t.to_doubles();
    std::vector<int64_t> xi = dtype_is_float(from) ? std::vector<int64_t>(xf.size()) : ints_of(t);
    Expected e;
    for (DType to : targets) {
      RefTensor& r = e[std::string("to_") + dtype_name(to)] = {t.shape(), {}, {}};
      for (size_t i = 0; i < xf.size(); ++i) {
        if (dtype_is_float(to))
          r.values.push_back(cast_to_float(from, xf[i], xi[i], to));
        else
          r.ints.push_back(cast_to_int(from, xf[i], xi[i], to));
      }
    }
    return e;
  };
  check_op(b, {{"x", x}}, ref, Tolerance::exact());
}

class Cast : public ::testing::TestWithParam<DType> {};

TEST_P(Cast, FromEdgeValuesToEveryDtype) {
  const DType from = GetParam();
  check_cast(dtype_is_float(from) ? make(from, {int64_t(kCastFloats.size())}, kCastFloats)
                                  : make_ints(from, {int64_t(kCastInts.size())}, kCastInts),
             kAllTypes);
}

INSTANTIATE_TEST_SUITE_P(AllSources, Cast, ::testing::ValuesIn(kAllTypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// NaN stays NaN in a float dtype and becomes 0 in an integer dtype.
TEST(CastNaN, ToFloatsAndInts) {
  for (DType t : kFloats) check_cast(make(t, {2}, {kNaN, -kNaN}), {kF32, kF16, kBF16, kI32, kI64, kU8, kU32});
}

// "anything->bool is (x != 0)": NaN != 0, so NaN casts to true.
TEST(CastNaN, ToBoolIsTrue) {
  for (DType t : kFloats) check_cast(make(t, {2}, {kNaN, -kNaN}), {kBool});
}

// 16842753 = 2^24 + 2^16 + 1 rounds straight to bf16 as 2^24 + 2^17; via f32 it would round twice to 2^24.
TEST(CastInt, ToBF16RoundsOnce) {
  for (DType t : {kI32, kI64, kU32}) check_cast(make_ints(t, {2}, {16842753, 1}), {kBF16, kF16, kF32});
}

// --- Reshape -------------------------------------------------------------------------------------

TEST(Reshape, StaticWithInferredDim) {
  ProgramBuilder b;
  TensorRef x = b.input("x", kI64, {2, 6});
  b.output("a", b.reshape(x, {3, -1}));
  b.output("b", b.reshape(x, {-1}));
  b.output("c", b.reshape(x, {2, 1, 3, 2}));
  Tensor v = make_ints(kI64, {2, 6}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, INT64_MAX, INT64_MIN});
  auto ref = [](const Inputs& in) {
    const Tensor& x = in.at("x");
    auto view = [&](Shape s) { return gather(x, s, [](int64_t i) { return i; }); };
    return Expected{{"a", view({3, 4})}, {"b", view({12})}, {"c", view({2, 1, 3, 2})}};
  };
  check_op(b, {{"x", v}}, ref, Tolerance::exact());
}

TEST(Reshape, DynamicDimFromSize) {
  ProgramBuilder b;
  TensorRef x = b.input("x", kBF16, {Dim::dynamic(1, 16), 6});
  b.output("a", b.reshape(x, {b.size(x, 0), 3, 2}));
  b.output("b", b.reshape(x, {-1, 3}));
  b.output("c", b.reshape(x, {b.mul_int(b.size(x, 0), 2), 3, -1}));
  std::vector<double> v(24);
  std::iota(v.begin(), v.end(), -3.5);
  auto ref = [](const Inputs& in) {
    const Tensor& x = in.at("x");
    auto view = [&](Shape s) { return gather(x, s, [](int64_t i) { return i; }); };
    return Expected{{"a", view({4, 3, 2})}, {"b", view({8, 3})}, {"c", view({8, 3, 1})}};
  };
  check_op(b, {{"x", make(kBF16, {4, 6}, v)}}, ref, Tolerance::exact());
}

TEST(Reshape, RuntimeElementCountMismatchFails) {
  ProgramBuilder b;
  TensorRef x = b.input("x", kF32, {Dim::dynamic(1, 8), 6});
  b.output("y", b.reshape(x, {-1, 5}));
  check_op_error(b, {{"x", make(kF32, {2, 6}, std::vector<double>(12, 1.0))}}, "cannot infer");
}

// --- Slice ---------------------------------------------------------------------------------------

// x[..., start:stop, ...] along axis with the schema's clamping; the reference of SliceNode.
RefTensor slice_ref(const Tensor& x, int axis, int64_t start, int64_t stop) {
  const Shape& s = x.shape();
  const auto ax = static_cast<size_t>(axis < 0 ? axis + static_cast<int>(s.size()) : axis);
  const int64_t d = s[ax];
  auto clamp = [d](int64_t v) { return std::min(std::max(v < 0 ? v + d : v, int64_t{0}), d); };
  const int64_t lo = clamp(start), hi = std::max(lo, clamp(stop));
  Shape out = s;
  out[ax] = hi - lo;
  return gather(x, out, [&](int64_t i) {
    std::vector<int64_t> idx = unravel(out, i);
    idx[ax] += lo;
    return ravel(s, idx);
  });
}

TEST(Slice, NegativeAndClampedBounds) {
  ProgramBuilder b;
  TensorRef x = b.input("x", kF32, {3, 5});
  const std::vector<std::tuple<int, int64_t, int64_t>> cases = {{1, -3, 100}, {1, -100, 2}, {-1, 4, 2}, {0, 1, -1},
                                                                {0, -1, 3},   {1, 0, 5},    {1, 5, 9},  {0, -4, -2}};
  for (size_t i = 0; i < cases.size(); ++i) {
    auto [axis, start, stop] = cases[i];
    b.output("y" + std::to_string(i), b.slice(x, axis, start, stop));
  }
  std::vector<double> v(15);
  std::iota(v.begin(), v.end(), 0.25);
  auto ref = [&](const Inputs& in) {
    Expected e;
    for (size_t i = 0; i < cases.size(); ++i) {
      auto [axis, start, stop] = cases[i];
      e["y" + std::to_string(i)] = slice_ref(in.at("x"), axis, start, stop);
    }
    return e;
  };
  check_op(b, {{"x", make(kF32, {3, 5}, v)}}, ref, Tolerance::exact());
}

TEST(Slice, DynamicStartFromSize) {
  ProgramBuilder b;
  TensorRef x = b.input("x", kI64, {Dim::dynamic(1, 10), 2, 2});
  IntOrValue n = b.size(x, 0);
  b.output("last2", b.slice(x, 0, b.sub_int(n, 2), n));
  b.output("neg", b.slice(x, 0, b.sub_int(1, n), 100));  // start 1 - n = -4 counts from the end: rows 1..4
  b.output("mid", b.slice(x, 1, 1, b.sub_int(n, 3)));    // stop n - 3 = 2
  std::vector<int64_t> v(20);
  std::iota(v.begin(), v.end(), (1LL << 60) - 7);
  auto ref = [](const Inputs& in) {
    const Tensor& x = in.at("x");
    return Expected{
        {"last2", slice_ref(x, 0, 3, 5)}, {"neg", slice_ref(x, 0, -4, 100)}, {"mid", slice_ref(x, 1, 1, 2)}};
  };
  check_op(b, {{"x", make_ints(kI64, {5, 2, 2}, v)}}, ref, Tolerance::exact());
}

// --- Concat --------------------------------------------------------------------------------------

RefTensor concat_ref(const std::vector<Tensor>& xs, int axis) {
  const auto ax = static_cast<size_t>(axis < 0 ? axis + static_cast<int>(xs[0].rank()) : axis);
  Shape out = xs[0].shape();
  out[ax] = 0;
  for (const Tensor& x : xs) out[ax] += x.dim(static_cast<int64_t>(ax));
  RefTensor r{out, {}, {}};
  for (int64_t i = 0; i < numel(out); ++i) {
    std::vector<int64_t> idx = unravel(out, i);
    size_t k = 0;
    while (idx[ax] >= xs[k].dim(static_cast<int64_t>(ax))) idx[ax] -= xs[k++].dim(static_cast<int64_t>(ax));
    RefTensor one = gather(xs[k], {1}, [&](int64_t) { return ravel(xs[k].shape(), idx); });
    r.values.insert(r.values.end(), one.values.begin(), one.values.end());
    r.ints.insert(r.ints.end(), one.ints.begin(), one.ints.end());
  }
  return r;
}

void check_concat(DType t, const std::vector<Shape>& shapes, int axis) {
  SCOPED_TRACE(std::string("concat ") + dtype_name(t) + " axis " + std::to_string(axis));
  ProgramBuilder b;
  std::vector<TensorRef> refs;
  Inputs in;
  for (size_t i = 0; i < shapes.size(); ++i) {
    std::string name = "x" + std::to_string(i);
    refs.push_back(b.input(name, t, dims(shapes[i])));
    std::vector<int64_t> v(static_cast<size_t>(numel(shapes[i])));
    std::iota(v.begin(), v.end(), static_cast<int64_t>(100 * i) - 3);
    in[name] =
        dtype_is_float(t) ? make(t, shapes[i], std::vector<double>(v.begin(), v.end())) : make_ints(t, shapes[i], v);
  }
  b.output("y", b.concat(refs, axis));
  auto ref = [&](const Inputs& in) {
    std::vector<Tensor> xs;
    for (size_t i = 0; i < shapes.size(); ++i) xs.push_back(in.at("x" + std::to_string(i)));
    return Expected{{"y", concat_ref(xs, axis)}};
  };
  check_op(b, in, ref, Tolerance::exact());
}

TEST(Concat, ThreeInputsOnAxis0) { check_concat(kF32, {{1, 3}, {2, 3}, {3, 3}}, 0); }
TEST(Concat, ThreeInputsOnAxis1) { check_concat(kF16, {{2, 1}, {2, 3}, {2, 2}}, 1); }
TEST(Concat, ThreeInputsOnLastAxis) { check_concat(kI64, {{2, 2, 1}, {2, 2, 2}, {2, 2, 3}}, -1); }
TEST(Concat, EmptyInputAndNarrowDtype) { check_concat(kU8, {{2, 2}, {2, 0}, {2, 1}}, 1); }

// out[i] = x[j] with j[perm[a]] = i[a], walked index by index.
void check_transpose(DType t, const Shape& shape, const std::vector<int>& perm) {
  SCOPED_TRACE(std::string("transpose ") + dtype_name(t) + " " + shape_str(shape));
  ProgramBuilder b;
  b.output("y", b.transpose(b.input("x", t, dims(shape)), perm));
  std::vector<int64_t> v(static_cast<size_t>(numel(shape)));
  std::iota(v.begin(), v.end(), t == kU8 || t == kU32 ? int64_t{0} : int64_t{-7});
  Inputs in = {{"x", dtype_is_float(t) ? make(t, shape, std::vector<double>(v.begin(), v.end())) : make_ints(t, shape, v)}};
  auto ref = [&](const Inputs&) {
    const size_t r = shape.size();
    Shape out_shape;
    for (int p : perm) out_shape.push_back(shape[static_cast<size_t>(p)]);
    RefTensor out{out_shape, {}, {}};
    std::vector<int64_t> idx(r, 0);
    for (int64_t e = 0; e < numel(out_shape); ++e) {
      int64_t rest = e, src = 0, stride = 1;
      for (size_t a = r; a-- > 0;) {
        idx[a] = rest % out_shape[a];
        rest /= out_shape[a];
      }
      for (size_t a = r; a-- > 0;) {  // x's row-major offset of the permuted index
        size_t out_axis = static_cast<size_t>(std::find(perm.begin(), perm.end(), static_cast<int>(a)) - perm.begin());
        src += idx[out_axis] * stride;
        stride *= shape[a];
      }
      if (dtype_is_float(t)) out.values.push_back(static_cast<double>(v[static_cast<size_t>(src)]));
      else out.ints.push_back(v[static_cast<size_t>(src)]);
    }
    return Expected{{"y", out}};
  };
  check_op(b, in, ref, Tolerance::exact());
}

TEST(Transpose, AttentionHeadSwap) {
  check_transpose(kF32, {5, 4, 8}, {1, 0, 2});   // [M, H, hd] -> [H, M, hd]: contiguous runs
  check_transpose(kBF16, {3, 2, 6}, {1, 0, 2});  // 16-bit elements packed two per word
  check_transpose(kF16, {1, 4, 2}, {1, 0, 2});   // a size-1 axis
}
TEST(Transpose, GeneralPermutations) {
  check_transpose(kF32, {3, 5}, {1, 0});
  check_transpose(kU8, {2, 3, 5}, {2, 0, 1});    // four elements per word, odd sizes
  check_transpose(kI64, {2, 3, 2, 2}, {3, 1, 0, 2});
  check_transpose(kI32, {4}, {0});
  check_transpose(kF16, {2, 0, 3}, {2, 1, 0});  // empty
}
TEST(Transpose, NotAPermutationFailsToBuild) {
  ProgramBuilder b;
  b.output("y", b.transpose(b.input("x", kF32, {2, 3}), {0, 0}));
  EXPECT_FALSE(b.status().is_ok());
}

TEST(Concat, RuntimeShapeMismatchFails) {
  ProgramBuilder b;
  TensorRef x = b.input("x", kF32, {Dim::dynamic(1, 4), 2}), y = b.input("y", kF32, {Dim::dynamic(1, 4), 3});
  b.output("z", b.concat({x, y}, 1));
  check_op_error(b, {{"x", make(kF32, {2, 2}, {1, 2, 3, 4})}, {"y", make(kF32, {3, 3}, std::vector<double>(9, 1))}},
                 "does not match");
}

// --- Matmul --------------------------------------------------------------------------------------

// out[r, n] = sum_k a[r, k] * B[k, n] + bias[n], exactly in double.
RefTensor matmul_ref(const Tensor& a, const Tensor& b, bool transpose_b, const Tensor* bias) {
  const int64_t k = a.shape().back(), cols = transpose_b ? b.dim(0) : b.dim(1);
  RefTensor r{a.shape(), {}, {}};
  r.shape.back() = cols;
  const int64_t rows = cols ? numel(r.shape) / cols : 0;
  std::vector<double> va = a.to_doubles(), vb = b.to_doubles(), vc = bias ? bias->to_doubles() : std::vector<double>{};
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t n = 0; n < cols; ++n) {
      double s = bias ? vc[size_t(n)] : 0.0;
      for (int64_t j = 0; j < k; ++j) s += va[size_t(i * k + j)] * vb[size_t(transpose_b ? n * k + j : j * cols + n)];
      r.values.push_back(s);
    }
  return r;
}

void check_matmul(DType t, const Shape& sa, const Shape& sb, bool transpose_b, bool with_bias, Tolerance tol,
                  bool small_ints = false) {
  SCOPED_TRACE(std::string("matmul ") + dtype_name(t) + " a " + shape_str(sa) + " b " + shape_str(sb) +
               (transpose_b ? " transpose_b" : "") + (with_bias ? " bias" : ""));
  const int64_t cols = transpose_b ? sb[0] : sb[1];
  ProgramBuilder b;
  TensorRef a = b.input("a", t, dims(sa)), w = b.input("b", t, dims(sb));
  TensorRef bias = with_bias ? b.input("bias", t, {cols}) : TensorRef{};
  b.output("y", b.matmul(a, w, transpose_b, bias));
  auto values = [&](const Shape& s, int seed) {
    if (!small_ints) return positive(numel(s), seed);
    std::vector<double> v;
    for (int64_t i = 0; i < numel(s); ++i) v.push_back(static_cast<double>((i * 7 + seed * 3) % 17 - 8));
    return v;
  };
  Inputs in = {{"a", make(t, sa, values(sa, 1))}, {"b", make(t, sb, values(sb, 2))}};
  if (with_bias) in["bias"] = make(t, {cols}, values({cols}, 3));
  auto ref = [&](const Inputs& in) {
    return Expected{{"y", matmul_ref(in.at("a"), in.at("b"), transpose_b, with_bias ? &in.at("bias") : nullptr)}};
  };
  check_op(b, in, ref, tol);
}

// dot32 (docs/numerics.md) rounds each product and each add once. With positive operands every order is
// within (K+1) * 2^-24 of the exact sum relative to it: 65 * 6e-8 = 3.9e-6 < 1e-5 for K <= 64.
const Tolerance kF32Matmul = Tolerance::rel(1e-5);
// Plus one rounding to the 16-bit format: 2^-11 = 4.9e-4 for f16, 2^-8 = 3.9e-3 for bf16.
const Tolerance kF16Matmul = Tolerance::rel(5e-4 + 1e-5), kBF16Matmul = Tolerance::rel(3.91e-3 + 1e-5);

// a [Ba, M, K] against b [Bb, N, K] (or [Bb, K, N]) with a's batch i using b's batch i / (Ba / Bb).
void check_batch_matmul(DType t, const Shape& sa, const Shape& sb, bool transpose_b, Tolerance tol) {
  SCOPED_TRACE(std::string("batch_matmul ") + dtype_name(t) + " a " + shape_str(sa) + " b " + shape_str(sb) +
               (transpose_b ? " transpose_b" : ""));
  ProgramBuilder b;
  b.output("y", b.batch_matmul(b.input("a", t, dims(sa)), b.input("b", t, dims(sb)), transpose_b));
  Inputs in = {{"a", make(t, sa, positive(numel(sa), 4))}, {"b", make(t, sb, positive(numel(sb), 5))}};
  auto ref = [&](const Inputs& in) {
    const std::vector<double> va = in.at("a").to_doubles(), vb = in.at("b").to_doubles();
    const int64_t ba = sa[0], m = sa[1], k = sa[2], g = ba / sb[0], cols = transpose_b ? sb[1] : sb[2];
    RefTensor r{{ba, m, cols}, {}, {}};
    for (int64_t i = 0; i < ba; ++i)
      for (int64_t row = 0; row < m; ++row)
        for (int64_t n = 0; n < cols; ++n) {
          double acc = 0;
          for (int64_t j = 0; j < k; ++j) {
            const int64_t q = i / g;
            acc += va[size_t((i * m + row) * k + j)] *
                   vb[size_t(transpose_b ? (q * cols + n) * k + j : (q * k + j) * cols + n)];
          }
          r.values.push_back(acc);
        }
    return Expected{{"y", r}};
  };
  check_op(b, in, ref, tol);
}

TEST(BatchMatmul, GroupedHeadsTransposedAndNot) {
  check_batch_matmul(kF32, {4, 3, 16}, {2, 5, 16}, true, kF32Matmul);   // 2 query heads per kv head
  check_batch_matmul(kF32, {2, 4, 8}, {2, 8, 3}, false, kF32Matmul);
  check_batch_matmul(kF16, {3, 1, 33}, {1, 7, 33}, true, kF16Matmul);   // one shared b, odd widths
  check_batch_matmul(kBF16, {2, 2, 40}, {1, 40, 5}, false, kBF16Matmul);
}

// Long rows with b transposed take matmul_rows16 in batches too: 16-bit outputs two to a word,
// the pair split across rows and batches where widths are odd; grouped heads share b.
TEST(BatchMatmul, LongRowsPairOutputsAcrossRowsAndBatches) {
  check_batch_matmul(kBF16, {4, 1, 1024}, {2, 3, 1024}, true, kBF16Matmul);  // 2 heads a group, odd width
  check_batch_matmul(kBF16, {2, 3, 1040}, {2, 5, 1040}, true, kBF16Matmul);
  check_batch_matmul(kF16, {3, 1, 1024}, {1, 4, 1024}, true, kF16Matmul);  // one shared b, even width
  check_batch_matmul(kF32, {2, 2, 1028}, {1, 3, 1028}, true, kF32Matmul);
}

TEST(BatchMatmul, BatchNotAMultipleFails) {
  ProgramBuilder b;
  b.output("y", b.batch_matmul(b.input("a", kF32, {3, 1, 4}), b.input("b", kF32, {Dim::dynamic(0, 8), 2, 4})));
  check_op_error(b, {{"a", make(kF32, {3, 1, 4}, std::vector<double>(12, 1.0))}, {"b", make(kF32, {2, 2, 4}, std::vector<double>(16, 1.0))}},
                 "not a multiple of b's batch");
}

TEST(Matmul, F32TransposeB) { check_matmul(kF32, {3, 8}, {5, 8}, true, false, kF32Matmul); }
TEST(Matmul, F32NoTransposeWithBias) { check_matmul(kF32, {4, 64}, {64, 6}, false, true, kF32Matmul); }
TEST(Matmul, F32BatchedLeadingDims) { check_matmul(kF32, {2, 3, 32}, {7, 32}, true, true, kF32Matmul); }
TEST(Matmul, F32VectorInput) { check_matmul(kF32, {16}, {16, 3}, false, true, kF32Matmul); }
TEST(Matmul, F16WithBias) {
  check_matmul(kF16, {3, 16}, {4, 16}, true, true, kF16Matmul);
  check_matmul(kF16, {2, 2, 8}, {8, 5}, false, true, kF16Matmul);
}
TEST(Matmul, BF16WithBias) {
  check_matmul(kBF16, {3, 16}, {4, 16}, true, true, kBF16Matmul);
  check_matmul(kBF16, {2, 2, 8}, {8, 5}, false, false, kBF16Matmul);
}
// Small integers: every partial sum is an integer below 2^24, exact in f32 in any order, so exact.
// Long rows: each GPU lane loads its terms in several batches; rows of >= 1024 elements in
// whole 16-byte units with b transposed are copied in passes of 2048 words (one pass at
// k = 1536 and at 2056 bf16, two at 2500 f32 and 4200 bf16); 16-bit outputs two to a
// workgroup, both of one row of a (a router's logits) or of two rows (odd widths).
TEST(Matmul, LongRowsTakeSeveralLoadBatches) {
  check_matmul(kF32, {2, 600}, {3, 600}, true, true, kF32Matmul);
  check_matmul(kBF16, {1, 777}, {777, 4}, false, false, kBF16Matmul);
  check_matmul(kF32, {1, 1536}, {4, 1536}, true, false, kF32Matmul);
  check_matmul(kF32, {1, 2500}, {5, 2500}, true, true, kF32Matmul);
  check_matmul(kBF16, {2, 2056}, {3, 2056}, true, false, kBF16Matmul);
  check_matmul(kBF16, {1, 4200}, {3, 4200}, true, true, kBF16Matmul);
  check_matmul(kBF16, {1, 2048}, {128, 2048}, true, false, kBF16Matmul);
  check_matmul(kF16, {1, 130}, {3, 130}, true, false, kF16Matmul);  // 130 % 8 != 0: word loads
}

TEST(Matmul, SmallIntegersAreExactInAnyOrder) {
  check_matmul(kF32, {3, 16}, {5, 16}, true, true, Tolerance::exact(), true);
  check_matmul(kF32, {2, 3, 16}, {16, 5}, false, true, Tolerance::exact(), true);
}
// 16 and more rows and columns: the GPU's tiled kernel (16 x 16 outputs per workgroup, 32
// partial sums per thread, chunks of 128 k); partial tiles, k not a multiple of 32 nor of 128, 16-bit outputs of even
// width (odd widths keep the per-output kernel), grouped batches.
TEST(Matmul, TiledShapes) {
  check_matmul(kF32, {40, 70}, {36, 70}, true, true, kF32Matmul);
  check_matmul(kF32, {2, 17, 64}, {64, 17}, false, false, kF32Matmul);
  check_matmul(kBF16, {2, 20, 50}, {50, 18}, false, true, kBF16Matmul);
  check_matmul(kF16, {20, 40}, {17, 40}, true, true, kF16Matmul);
  check_matmul(kF32, {18, 45}, {45, 20}, false, true, Tolerance::exact(), true);
  check_batch_matmul(kF32, {4, 20, 40}, {2, 24, 40}, true, kF32Matmul);
  check_batch_matmul(kBF16, {2, 17, 33}, {1, 33, 18}, false, kBF16Matmul);
  // Long k: many staged chunks and a part one, bits equal to the CPU's (values whose sums round).
  check_matmul(kBF16, {20, 300}, {18, 300}, true, true, kBF16Matmul);
  check_matmul(kF32, {17, 300}, {300, 16}, false, false, Tolerance::rel(4e-5));
  check_matmul(kF32, {16, 256}, {20, 256}, true, true, Tolerance::rel(4e-5));  // whole chunks only
  check_matmul(kF16, {33, 128}, {128, 32}, false, false, kF16Matmul);
}

// K = 0: the sum is empty, so out = zeros (+ bias) exactly.
TEST(Matmul, EmptyInnerDimGivesZeros) {
  check_matmul(kF32, {2, 0}, {0, 3}, false, false, Tolerance::exact());
  check_matmul(kF16, {2, 2, 0}, {3, 0}, true, false, Tolerance::exact());
}

// K = 0 with a bias: every row is the bias.
TEST(Matmul, EmptyInnerDimGivesBias) {
  check_matmul(kF32, {2, 0}, {3, 0}, true, true, Tolerance::exact());
  check_matmul(kF16, {2, 2, 0}, {3, 0}, true, true, Tolerance::exact());
}

TEST(Matmul, RuntimeInnerDimMismatchFails) {
  ProgramBuilder b;
  TensorRef a = b.input("a", kF32, {2, Dim::dynamic(1, 8)}), w = b.input("w", kF32, {3, Dim::dynamic(1, 8)});
  b.output("y", b.matmul(a, w));
  check_op_error(
      b, {{"a", make(kF32, {2, 4}, std::vector<double>(8, 1))}, {"w", make(kF32, {3, 5}, std::vector<double>(15, 1))}},
      "inner dims differ");
}

// --- Reduce --------------------------------------------------------------------------------------

enum class Red { kSum, kMean, kMax, kMin };
const char* const kRedNames[] = {"sum", "mean", "max", "min"};

// The kernel's contract: accumulate in f32 in index order 0..d-1, round to the dtype once at the end.
// A double-precision sum differs on the test data, so the reference repeats the f32 sequence
// (each double add of two floats, rounded to f32, is exactly the f32 add). f32_acc=false: double sums.
RefTensor reduce_ref(const Tensor& x, Red op, int axis, bool keepdims, bool f32_acc = true) {
  const Shape& s = x.shape();
  const auto ax = static_cast<size_t>(axis < 0 ? axis + static_cast<int>(s.size()) : axis);
  RefTensor r{s, {}, {}};
  r.shape[ax] = 1;
  std::vector<double> v = x.to_doubles();
  auto acc_round = [&](double a) { return f32_acc ? double(float(a)) : a; };
  for (int64_t i = 0; i < numel(r.shape); ++i) {
    std::vector<int64_t> idx = unravel(r.shape, i);
    double acc = op == Red::kSum || op == Red::kMean ? 0.0 : v[size_t(ravel(s, idx))];
    for (idx[ax] = 0; idx[ax] < s[ax]; ++idx[ax]) {
      double e = v[size_t(ravel(s, idx))];
      if (op == Red::kSum || op == Red::kMean)
        acc = acc_round(acc + e);
      else if (std::isnan(acc) || std::isnan(e))
        acc = kNaN;  // max/min propagate NaN, like Binary max/min
      else
        acc = op == Red::kMax ? ref_max(acc, e) : ref_min(acc, e);
    }
    if (op == Red::kMean) acc = acc_round(acc / static_cast<double>(s[ax]));
    r.values.push_back(round_to(x.dtype(), acc));
  }
  if (!keepdims) r.shape.erase(r.shape.begin() + static_cast<int64_t>(ax));
  return r;
}

TensorRef emit_reduce(ProgramBuilder& b, Red op, TensorRef x, int axis, bool keepdims) {
  switch (op) {
    case Red::kSum: return b.sum(x, axis, keepdims);
    case Red::kMean: return b.mean(x, axis, keepdims);
    case Red::kMax: return b.max(x, axis, keepdims);
    case Red::kMin: return b.min(x, axis, keepdims);
  }
  return {};
}

void check_reduce(Red op, const Tensor& x) {
  SCOPED_TRACE(std::string(kRedNames[static_cast<int>(op)]) + " " + dtype_name(x.dtype()));
  ProgramBuilder b;
  TensorRef in = b.input("x", x.dtype(), dims(x.shape()));
  const std::vector<std::pair<int, bool>> cases = {{0, false}, {1, false}, {-1, false},
                                                   {0, true},  {1, true},  {-1, true}};
  auto name = [](int axis, bool keep) { return "axis" + std::to_string(axis) + (keep ? "_keep" : ""); };
  for (auto [axis, keep] : cases) b.output(name(axis, keep), emit_reduce(b, op, in, axis, keep));
  auto ref = [&](const Inputs& in) {
    Expected e;
    for (auto [axis, keep] : cases) e[name(axis, keep)] = reduce_ref(in.at("x"), op, axis, keep);
    return e;
  };
  check_op(b, {{"x", x}}, ref, Tolerance::exact());
}

// Mixed signs and magnitudes (1e-1 .. 1e7): f32 sums depend on order and differ from double sums.
std::vector<double> reduce_data(int64_t n) {
  std::vector<double> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(((i * 37) % 11 - 5) * std::pow(10.0, (i % 3) * 3 - 1) + 0.013 * i);
  return v;
}

TEST(Reduce, AllOpsAxesAndKeepdimsF32) {
  Tensor x = make(kF32, {3, 4, 5}, reduce_data(60));
  for (Red op : {Red::kSum, Red::kMean, Red::kMax, Red::kMin}) check_reduce(op, x);
  // The data must make the f32 sequence matter, or the sum test could not tell it from a double sum.
  int differ = 0;
  for (int axis : {0, 1, 2})
    differ += reduce_ref(x, Red::kSum, axis, false).values != reduce_ref(x, Red::kSum, axis, false, false).values;
  EXPECT_GT(differ, 0);
}

TEST(Reduce, HalfDtypesAccumulateInF32) {
  for (DType t : {kF16, kBF16})
    for (Red op : {Red::kSum, Red::kMean, Red::kMax, Red::kMin}) check_reduce(op, make(t, {3, 4, 5}, positive(60, 4)));
}

TEST(Reduce, MaxMinPropagateNaN) {
  std::vector<double> v = positive(12, 5);
  v[1] = kNaN;
  v[8] = -kInf;
  v[11] = kNaN;
  for (Red op : {Red::kMax, Red::kMin, Red::kSum}) check_reduce(op, make(kF32, {2, 2, 3}, v));
}

TEST(Reduce, SumOverEmptyAxisIsZeroAndMaxFails) {
  ProgramBuilder b;
  TensorRef x = b.input("x", kF32, {2, Dim::dynamic(0, 4)});
  b.output("s", b.sum(x, 1));
  auto zeros = [](const Inputs&) { return Expected{{"s", RefTensor{{2}, {0, 0}, {}}}}; };
  check_op(b, {{"x", make(kF32, {2, 0}, {})}}, zeros, Tolerance::exact());
  ProgramBuilder b2;
  b2.output("m", b2.max(b2.input("x", kF32, {2, Dim::dynamic(0, 4)}), 1));
  check_op_error(b2, {{"x", make(kF32, {2, 0}, {})}}, "empty axis");
}

// --- Argmax --------------------------------------------------------------------------------------

// Index of the maximum; the first NaN if there is one (NaN counts as largest); ties: lowest index.
RefTensor argmax_ref(const Tensor& x, int axis, bool keepdims) {
  const Shape& s = x.shape();
  const auto ax = static_cast<size_t>(axis < 0 ? axis + static_cast<int>(s.size()) : axis);
  Shape out = s;
  out[ax] = 1;
  std::vector<double> v = x.to_doubles();
  std::vector<int64_t> vi = dtype_is_float(x.dtype()) ? std::vector<int64_t>{} : ints_of(x);
  RefTensor r{out, {}, {}};
  for (int64_t i = 0; i < numel(out); ++i) {
    std::vector<int64_t> idx = unravel(out, i);
    std::vector<int64_t> order(static_cast<size_t>(s[ax]));
    std::iota(order.begin(), order.end(), 0);
    auto at = [&](int64_t j) {
      idx[ax] = j;
      return size_t(ravel(s, idx));
    };
    auto greater = [&](int64_t p, int64_t q) {  // strict "p ranks above q"
      if (!vi.empty()) return vi[at(p)] > vi[at(q)];
      double a = v[at(p)], c = v[at(q)];
      return std::isnan(c) ? false : std::isnan(a) || a > c;
    };
    r.ints.push_back(*std::min_element(order.begin(), order.end(), greater));  // first of the top rank
  }
  if (!keepdims) r.shape.erase(r.shape.begin() + static_cast<int64_t>(ax));
  return r;
}

void check_argmax(const Tensor& x) {
  SCOPED_TRACE(std::string("argmax ") + dtype_name(x.dtype()) + " " + shape_str(x.shape()));
  ProgramBuilder b;
  TensorRef in = b.input("x", x.dtype(), dims(x.shape()));
  b.output("a0", b.argmax(in, 0));
  b.output("a1k", b.argmax(in, -1, true));
  b.output("a1", b.argmax(in, 1));
  auto ref = [](const Inputs& in) {
    const Tensor& x = in.at("x");
    return Expected{{"a0", argmax_ref(x, 0, false)}, {"a1k", argmax_ref(x, -1, true)}, {"a1", argmax_ref(x, 1, false)}};
  };
  check_op(b, {{"x", x}}, ref, Tolerance::exact());
}

TEST(Argmax, TiesTakeLowestIndexAndNaNIsLargest) {
  std::vector<double> v = {1,     3,     3,     2,     0,      // tie -> 1
                           1,     kNaN,  5,     kNaN,  0,      // first NaN -> 1
                           -kInf, -kInf, -kInf, -kInf, -kInf,  // all equal -> 0
                           kNaN,  9,     1,     2,     3,      // NaN first -> 0
                           -0.0,  0.0,   -1,    -0.0,  -2};    // -0 == +0: tie -> 0
  for (DType t : kFloats) check_argmax(make(t, {5, 5}, v));
  // 1 + 2^-9 and 1 round to the same bf16, so bf16 sees a tie where f32 does not.
  check_argmax(make(kBF16, {1, 3}, {1, 1 + 0x1p-9, 0.5}));
  check_argmax(make(kF32, {1, 3}, {1, 1 + 0x1p-9, 0.5}));
}

// Rows of >= 1024 take the GPU's workgroup-per-row kernel: the same rule at every position
// of the 256-thread grouping (a tie across threads, NaN late, -0 vs +0, the max last).
// Rows of 8192 and more (logits) are also split into parts of 4096 over workgroups and merged:
// the same cases with the tie, the NaNs and the max in different parts (d = 20,000: 5 parts).
TEST(Argmax, LongRowsCombineAcrossThreads) {
  for (const int64_t d : {int64_t{3000}, int64_t{20000}}) {
    SCOPED_TRACE(d);
    const int64_t far = d - 100;  // in the last part when the row is split
    std::vector<double> v(static_cast<size_t>(5 * d));
    for (int64_t i = 0; i < 5 * d; ++i) v[size_t(i)] = std::sin(0.37 * double(i)) * 100.0;
    v[size_t(0 * d + 700)] = 500, v[size_t(0 * d + far)] = 500, v[size_t(0 * d + 300)] = 499;  // tie: 700
    v[size_t(1 * d + far)] = kNaN, v[size_t(1 * d + 1234)] = kNaN;                             // first NaN: 1234
    for (int64_t i = 0; i < d; ++i) v[size_t(2 * d + i)] = i % 2 ? -0.0 : 0.0;                 // all zero: 0
    v[size_t(3 * d + d - 1)] = 1e6;                                                            // last: d - 1
    for (int64_t i = 0; i < d; ++i) v[size_t(4 * d + i)] = -kInf;                              // all equal: 0
    for (DType t : kFloats) {
      SCOPED_TRACE(dtype_name(t));
      ProgramBuilder b;
      b.output("a", b.argmax(b.input("x", t, {5, d}), 1));
      check_op(
          b, {{"x", make(t, {5, d}, v)}},
          [&](const Inputs& in) {
            return Expected{{"a", argmax_ref(in.at("x"), 1, false)}};
          },
          Tolerance::exact());
    }
  }
}

TEST(Argmax, IntegerInputs) {
  check_argmax(make_ints(kI32, {2, 4}, {-5, 7, 7, -9, INT32_MIN, INT32_MIN, INT32_MAX, 0}));
  // Adjacent values above 2^53 differ by 1: a detour through f32 or double would tie them.
  int64_t big = (1LL << 60) + 1;
  check_argmax(make_ints(kI64, {2, 3}, {big, big + 1, big + 1, INT64_MIN, INT64_MAX - 1, INT64_MAX}));
  check_argmax(make_ints(kU8, {2, 3}, {0, 255, 128, 3, 3, 2}));
}

// --- Copy ----------------------------------------------------------------------------------------

TEST(Copy, PreservesValuesOfEveryDtype) {
  for (DType t : kAllTypes) {
    SCOPED_TRACE(dtype_name(t));
    ProgramBuilder b;
    b.output("y", b.copy(b.input("x", t, {2, 3})));
    Tensor x = dtype_is_float(t) ? make(t, {2, 3}, {-0.0, kNaN, kInf, 1.5, -1e-30, 65504})
                                 : make_ints(t, {2, 3}, {0, 1, -1, 255, INT64_MAX, INT64_MIN});
    auto ref = [](const Inputs& in) { return Expected{{"y", same(in.at("x"))}}; };
    check_op(b, {{"x", x}}, ref, Tolerance::exact());
  }
}

// --- SliceUpdate ---------------------------------------------------------------------------------

// dst with dst[..., start:start+u, ...] = update along axis (float dst).
RefTensor slice_update_ref(const Tensor& dst, const Tensor& u, int axis, int64_t start) {
  RefTensor r = same(dst);
  std::vector<double> uv = u.to_doubles();
  for (int64_t i = 0; i < u.numel(); ++i) {
    std::vector<int64_t> idx = unravel(u.shape(), i);
    idx[size_t(axis)] += start;
    r.values[size_t(ravel(dst.shape(), idx))] = uv[size_t(i)];
  }
  return r;
}

TEST(SliceUpdate, WritesRowsIntoMutableBuffer) {
  ProgramBuilder b;
  TensorRef cache = b.mutable_buffer("cache", kF32, {4, 3});
  b.slice_update(cache, b.input("u", kF32, {2, 3}), 0, 1);
  auto ref = [](const Inputs& in) {
    return Expected{{"cache", slice_update_ref(make(kF32, {4, 3}, std::vector<double>(12, 0)), in.at("u"), 0, 1)}};
  };
  check_op(b, {{"u", make(kF32, {2, 3}, {1, -2, 3, kNaN, -0.0, 6})}}, ref, Tolerance::exact());
}

TEST(SliceUpdate, DynamicStartOnInnerAxis) {
  ProgramBuilder b;
  TensorRef cache = b.mutable_buffer("cache", kBF16, {2, 6});
  TensorRef u = b.input("u", kBF16, {2, Dim::dynamic(1, 3)});
  b.slice_update(cache, u, 1, b.size(u, 1));  // start = width of the update: 2 here
  b.output("snapshot", b.copy(cache));
  auto ref = [](const Inputs& in) {
    RefTensor r = slice_update_ref(make(kBF16, {2, 6}, std::vector<double>(12, 0)), in.at("u"), 1, 2);
    return Expected{{"cache", r}, {"snapshot", r}};
  };
  check_op(b, {{"u", make(kBF16, {2, 2}, {1.5, 2.5, -3.5, 1e-3})}}, ref, Tolerance::exact());
}

// In place on every device (no copy per step), yet tensors a caller holds never change:
// earlier outputs that share the buffer's storage, and a snapshot from mutable_buffer().
TEST(SliceUpdate, CallersTensorsNeverChangeOnAnyDevice) {
  ProgramBuilder b;
  TensorRef row = b.input("row", kF32, {1, 2});
  IntOrValue pos = b.input_value("pos");
  TensorRef cache = b.mutable_buffer("cache", kF32, {3, 2});
  b.slice_update(cache, row, 0, pos);
  b.output("cache_out", b.copy(cache));
  detail::for_each_device(b, {}, [&](const Program&, Session& s, const std::string& dev) {
    std::vector<Tensor> seen;
    Tensor snapshot;
    for (int64_t p = 0; p < 3; ++p) {
      ASSERT_TRUE(s.set_input("row", make(kF32, {1, 2}, {double(p + 1), double(-p - 1)})).is_ok());
      ASSERT_TRUE(s.set_input_value("pos", p).is_ok());
      ASSERT_TRUE(s.execute().is_ok()) << dev;
      seen.push_back(*s.output("cache_out"));
      if (p == 0) snapshot = *s.mutable_buffer("cache");
    }
    EXPECT_EQ(seen[0].to_doubles(), (std::vector<double>{1, -1, 0, 0, 0, 0})) << dev;
    EXPECT_EQ(seen[1].to_doubles(), (std::vector<double>{1, -1, 2, -2, 0, 0})) << dev;
    EXPECT_EQ(seen[2].to_doubles(), (std::vector<double>{1, -1, 2, -2, 3, -3})) << dev;
    EXPECT_EQ(snapshot.to_doubles(), (std::vector<double>{1, -1, 0, 0, 0, 0})) << dev;
  });
}

TEST(SliceUpdate, OutOfRangeStartFails) {
  for (int64_t start : {3, -1, 100}) {
    SCOPED_TRACE("start " + std::to_string(start));
    ProgramBuilder b;
    TensorRef cache = b.mutable_buffer("cache", kF32, {4, 3});
    b.slice_update(cache, b.input("u", kF32, {2, 3}), 0, start);
    check_op_error(b, {{"u", make(kF32, {2, 3}, std::vector<double>(6, 1))}}, "exceeds");
  }
}

// --- the harness itself --------------------------------------------------------------------------

TEST(OpHarness, ToleranceKinds) {
  EXPECT_TRUE(Tolerance::exact().accepts(kNaN, -kNaN));
  EXPECT_FALSE(Tolerance::exact().accepts(0.0, -0.0));
  EXPECT_FALSE(Tolerance::exact().accepts(kNaN, 1));
  EXPECT_TRUE(Tolerance::f32_ulps(1).accepts(std::nextafter(1.0f, 2.0f), 1));
  EXPECT_FALSE(Tolerance::f32_ulps(1).accepts(std::nextafter(std::nextafter(1.0f, 2.0f), 2.0f), 1));
  EXPECT_TRUE(Tolerance::f32_ulps(2).accepts(std::nextafter(0.0f, 1.0f), -std::nextafter(0.0f, 1.0f)));
  EXPECT_TRUE(Tolerance::rel(1e-3).accepts(1000.9, 1000));
  EXPECT_FALSE(Tolerance::rel(1e-3).accepts(1001.1, 1000));
  EXPECT_TRUE(Tolerance::rel(1e-3).accepts(kInf, kInf));
}

TEST(OpHarness, ReportsFirstMismatch) {
  // One device only, so exactly one failure is reported.
  const char* old = std::getenv("SWITCHBOARD_TEST_DEVICES");
  std::string saved = old ? old : "";
  setenv("SWITCHBOARD_TEST_DEVICES", "", 1);
  ProgramBuilder b;
  b.output("y", b.neg(b.input("x", kF32, {2, 2})));
  auto wrong = [](const Inputs&) { return Expected{{"y", RefTensor{{2, 2}, {-1, -2, 4, 5}, {}}}}; };
  EXPECT_NONFATAL_FAILURE(check_op(b, {{"x", make(kF32, {2, 2}, {1, 2, 3, 4})}}, wrong, Tolerance::exact()),
                          "2 of 4 elements differ (exact); first at index 2 [1, 0]: got -3, expected 4");
  setenv("SWITCHBOARD_TEST_DEVICES", saved.c_str(), 1);
}

TEST(OpHarness, DevicesMustAgreeBitwiseUpToNaNPayload) {
  Tensor a = make(kF32, {3}, {1, kNaN, 0}), b = make(kF32, {3}, {1, -kNaN, 0}), c = make(kF32, {3}, {1, kNaN, -0.0});
  detail::expect_bitwise_equal("nan payloads", a, b);
  EXPECT_NONFATAL_FAILURE(detail::expect_bitwise_equal("signed zero", a, c), "first at index 2 [2]: got 0");
}

TEST(OpHarness, SkipsDevicesThatAreMissing) {
  const char* old = std::getenv("SWITCHBOARD_TEST_DEVICES");
  std::string saved = old ? old : "";
  setenv("SWITCHBOARD_TEST_DEVICES", " nosuch_device ,cpu,", 1);
  EXPECT_EQ(test_devices(), (std::vector<std::string>{"cpu", "nosuch_device"}));
  ProgramBuilder b;
  b.output("y", b.abs(b.input("x", kF32, {1})));
  ::testing::internal::CaptureStdout();
  auto ref = [](const Inputs&) { return Expected{{"y", RefTensor{{1}, {2}, {}}}}; };
  check_op(b, {{"x", make(kF32, {1}, {-2})}}, ref, Tolerance::exact());
  std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("[ DEVICE SKIPPED ] nosuch_device: NotFound"), std::string::npos) << out;
  old ? setenv("SWITCHBOARD_TEST_DEVICES", saved.c_str(), 1) : unsetenv("SWITCHBOARD_TEST_DEVICES");
}

}  // namespace
}  // namespace switchboard::optest
