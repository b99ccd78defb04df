// The exact elementwise routines (Unary Exp..GeluTanh), Softmax and RmsNorm through the
// op harness: against float64 math within stated tolerances, and bitwise across devices.
#include <algorithm>
#include <cmath>
#include <optional>
#include <random>

#include "op_harness.h"

namespace switchboard::optest {
namespace {

constexpr DType kF32 = DType::kF32, kF16 = DType::kF16, kBF16 = DType::kBF16;

std::vector<double> uniform(size_t n, double lo, double hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<double> v(n);
  for (auto& x : v) x = lo + (hi - lo) * static_cast<double>(rng() >> 8) * 0x1p-24;
  return v;
}

struct UnaryCase {
  const char* name;
  TensorRef (ProgramBuilder::*build)(TensorRef);
  double (*ref)(double);
  double lo, hi;
  int ulps;  // measured bound of the routine (docs/numerics.md), f32 outputs
};

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
const UnaryCase kUnary[] = {
    {"exp", &ProgramBuilder::exp, [](double x) { return std::exp(x); }, -80, 80, 4},
    {"rcp", &ProgramBuilder::rcp, [](double x) { return 1.0 / x; }, 1e-30, 1e30, 2},
    {"rsqrt", &ProgramBuilder::rsqrt, [](double x) { return 1.0 / std::sqrt(x); }, 1e-38, 1e38, 3},
    {"sigmoid", &ProgramBuilder::sigmoid, sigmoid, -20, 20, 5},
    {"silu", &ProgramBuilder::silu, [](double x) { return x * sigmoid(x); }, -20, 20, 6},
    // tanh and GELU lose relative accuracy near 0 (1 - 2/(e^2u + 1)): tested away from it.
    {"tanh", &ProgramBuilder::tanh, [](double x) { return std::tanh(x); }, 0.5, 9, 8},
    {"gelu_tanh", &ProgramBuilder::gelu_tanh,
     [](double x) { return 0.5 * x * (1 + std::tanh(0.7978845608 * (x + 0.044715 * x * x * x))); }, 0.5, 9, 8},
    {"softplus", &ProgramBuilder::softplus, [](double x) { return x > 20 ? x : std::log1p(std::exp(x)); }, -30, 30, 6},
};

TEST(ExactUnary, EveryRoutineWithinItsUlpBoundAndBitwise) {
  for (const UnaryCase& c : kUnary)
    for (DType dt : {kF32, kF16, kBF16}) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt));
      std::vector<double> v = uniform(301, c.lo, c.hi, 7);
      if (c.lo < 0) v.push_back(0.0);
      ProgramBuilder b;
      b.output("y", (b.*c.build)(b.input("x", dt, {static_cast<int64_t>(v.size())})));
      Tensor x = make(dt, {static_cast<int64_t>(v.size())}, v);
      auto ref = [&](const Inputs& in) {
        RefTensor r{in.at("x").shape(), {}, {}};
        for (double xv : in.at("x").to_doubles()) r.values.push_back(round_to(dt, c.ref(xv)));
        return Expected{{"y", r}};
      };
      // 16-bit outputs: the f32 result rounds once more, so one unit of the format (plus the f32 error).
      const Tolerance tol = dt == kF32 ? Tolerance::f32_ulps(c.ulps) : Tolerance::rel(dt == kF16 ? 0x1p-10 : 0x1p-7);
      check_op(b, {{"x", x}}, ref, tol);
    }
}

TEST(ExactUnary, EdgeValues) {
  const double inf = INFINITY, nan = NAN;
  const std::vector<double> v = {0.0, -0.0, inf, -inf, nan, 1e-45, 3e-39, -1.0, 100.0, -100.0};
  ProgramBuilder b;
  TensorRef x = b.input("x", kF32, {static_cast<int64_t>(v.size())});
  b.output("exp", b.exp(x));
  b.output("rsqrt", b.rsqrt(x));
  b.output("rcp", b.rcp(x));
  b.output("sigmoid", b.sigmoid(x));
  // Subnormal operands of comparisons (NVIDIA compares them as zero unless kernels compare bits).
  b.output("relu", b.relu(b.neg(x)));
  b.output("max0", b.maximum(x, b.full({static_cast<int64_t>(v.size())}, kF32, 0.0)));
  auto ref = [&](const Inputs&) {
    auto r = [&](std::vector<double> vals) { return RefTensor{{static_cast<int64_t>(v.size())}, vals, {}}; };
    return Expected{
        // exp: > 88 -> inf, < -87 -> +0 (docs/numerics.md)
        {"exp", r({1, 1, inf, 0, nan, 1, 1, std::exp(-1.0), inf, 0})},
        // rsqrt: +-0 -> +-inf, +inf -> +0, negatives and NaN -> NaN, subnormals scaled first
        {"rsqrt", r({inf, -inf, 0, nan, nan, 1 / std::sqrt(double(1e-45f)), 1 / std::sqrt(double(3e-39f)), nan, 0.1, nan})},
        // rcp: +-0 -> +-inf, beyond 2^125 (and inf) -> +-0, tiny inputs scaled (1/1e-45 overflows)
        {"rcp", r({inf, -inf, 0, -0.0, nan, inf, 1 / double(3e-39f), -1, 0.01, -0.01})},
        {"sigmoid", r({0.5, 0.5, 1, 0, nan, 0.5, 0.5, sigmoid(-1), 1, 0})},
        {"relu", r({-0.0, 0, 0, inf, nan, 0, 0, 1, 0, 100})},
        {"max0", r({0, 0, inf, 0, nan, double(1e-45f), double(3e-39f), 0, 100, 0})},
    };
  };
  // Edge values where the routines are exact or saturate are checked against the documented
  // results with a small ulp allowance; everything is bitwise across devices.
  check_op(b, {{"x", make(kF32, {static_cast<int64_t>(v.size())}, v)}}, ref, Tolerance::f32_ulps(4));
}

double softmax_ref(const std::vector<double>& x, size_t row, size_t d, size_t i) {
  double m = -INFINITY, s = 0;
  for (size_t j = 0; j < d; ++j) m = std::max(m, x[row * d + j]);
  for (size_t j = 0; j < d; ++j) s += std::exp(x[row * d + j] - m);
  return std::exp(x[row * d + i] - m) / s;
}

TEST(Softmax, RowsOfEveryLengthAndDtype) {
  for (DType dt : {kF32, kF16, kBF16})
    for (int64_t d : {1, 5, 64, 257, 4096, 4099}) {  // 4099: past the workgroup-per-row kernel
      SCOPED_TRACE(std::string(dtype_name(dt)) + " d=" + std::to_string(d));
      const int64_t rows = 3;
      ProgramBuilder b;
      b.output("y", b.softmax(b.input("x", dt, {rows, d})));
      // Long rows in a narrow range, so no 16-bit output is subnormal (rel tolerance).
      const double span = d > 4096 ? 0.5 : 12;
      Tensor x = make(dt, {rows, d}, uniform(static_cast<size_t>(rows * d), -span, span, static_cast<uint32_t>(d)));
      auto ref = [&](const Inputs& in) {
        const std::vector<double> xv = in.at("x").to_doubles();
        RefTensor r{{rows, d}, {}, {}};
        for (int64_t i = 0; i < rows * d; ++i) r.values.push_back(round_to(dt, softmax_ref(xv, i / d, d, i % d)));
        return Expected{{"y", r}};
      };
      // exp (<= 3.02 ulp) of an exactly rounded difference, a d-term sum and rcp (<= 1.99 ulp): well
      // within 1e-5 relative in f32 for these rows; 16-bit outputs add one unit of the format.
      const Tolerance tol = dt == kF32 ? Tolerance::rel(1e-5) : Tolerance::rel(dt == kF16 ? 0x1p-10 : 0x1p-7);
      check_op(b, {{"x", x}}, ref, tol);
    }
}

// Rows where the running max's details decide the bits: -0 or +0 as the max (equal zeros
// AND their bits), NaN anywhere (it sticks: every output NaN), all -inf (inf - inf: NaN),
// subnormals, and a row long enough for every thread to hold several elements.
TEST(Softmax, EdgeRowsFollowTheSequentialMax) {
  const double inf = INFINITY, nan = NAN;
  const int64_t d = 6;
  std::vector<double> v = {-0.0, -0.0, -1, -2, -3, -4,    -1, 0.0, -0.0, -2, -3, -4,
                           1,    nan,  3,  -inf, 0, 2,    -inf, -inf, -inf, -inf, -inf, -inf,
                           1e-45, -1e-45, 0.0, -0.0, 3e-39, -3e-39,  2, 1, nan, 2, nan, -inf};
  const int64_t rows = static_cast<int64_t>(v.size()) / d;
  ProgramBuilder b;
  b.output("y", b.softmax(b.input("x", kF32, {rows, d})));
  auto ref = [&](const Inputs& in) {
    const std::vector<double> xv = in.at("x").to_doubles();
    RefTensor r{{rows, d}, {}, {}};
    for (int64_t row = 0; row < rows; ++row) {
      bool any_nan = false, all_ninf = true;
      for (int64_t j = 0; j < d; ++j) {
        any_nan |= std::isnan(xv[row * d + j]);
        all_ninf &= xv[row * d + j] == -inf;
      }
      for (int64_t j = 0; j < d; ++j)
        r.values.push_back(any_nan || all_ninf ? nan : softmax_ref(xv, static_cast<size_t>(row), d, j));
    }
    return Expected{{"y", r}};
  };
  check_op(b, {{"x", make(kF32, {rows, d}, v)}}, ref, Tolerance::rel(1e-5));
}

// RMSNorm of rows [rows, d] in double precision, each output rounded to dt.
std::vector<double> rms_reference(const std::vector<double>& x, const std::vector<double>& w, int64_t rows, int64_t d,
                                  float eps, DType dt) {
  std::vector<double> y;
  for (int64_t row = 0; row < rows; ++row) {
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += x[row * d + i] * x[row * d + i];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(d) + static_cast<double>(eps));
    for (int64_t i = 0; i < d; ++i) y.push_back(round_to(dt, x[row * d + i] * inv * w[i]));
  }
  return y;
}

TEST(RmsNorm, RowsOfEveryLengthAndDtype) {
  for (DType dt : {kF32, kF16, kBF16})
    for (int64_t d : {1, 3, 128, 255, 2048, 4100}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " d=" + std::to_string(d));
      const int64_t rows = 4;
      const float eps = 1e-6f;
      ProgramBuilder b;
      b.output("y", b.rms_norm(b.input("x", dt, {rows, d}), b.input("w", dt, {d}), eps));
      Tensor x = make(dt, {rows, d}, uniform(static_cast<size_t>(rows * d), -3, 3, static_cast<uint32_t>(d) + 1));
      Tensor w = make(dt, {d}, uniform(static_cast<size_t>(d), 0.5, 1.5, static_cast<uint32_t>(d) + 2));
      auto ref = [&](const Inputs& in) {
        return Expected{
            {"y",
             RefTensor{
                 {rows, d}, rms_reference(in.at("x").to_doubles(), in.at("w").to_doubles(), rows, d, eps, dt), {}}}};
      };
      // d-term f32 sum of squares (relative error <= d * 2^-24), rsqrt (<= 2.2 ulp), two products.
      const Tolerance tol = dt == kF32 ? Tolerance::rel(4e-5) : Tolerance::rel(dt == kF16 ? 0x1p-10 : 0x1p-7);
      check_op(b, {{"x", x}, {"w", w}}, ref, tol);
    }
}

// Order Tree32 (the sum of squares as dot32), with and without a residual added first: the
// sum is Binary Add's bits exactly, the output within the same bounds as the sequential order.
TEST(RmsNorm, Tree32WithAndWithoutAResidual) {
  for (DType dt : {kF32, kF16, kBF16})
    for (int64_t d : {2, 30, 128, 254, 2048, 2050, 4096, 4100, 8200})  // registers, shared memory, memory
      for (bool with_residual : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " d=" + std::to_string(d) + (with_residual ? " residual" : ""));
        const int64_t rows = 3;
        const float eps = 1e-6f;
        ProgramBuilder b;
        TensorRef x = b.input("x", dt, {rows, d}), w = b.input("w", dt, {d});
        TensorRef res = with_residual ? b.input("r", dt, {rows, d}) : TensorRef{};
        ProgramBuilder::AddNorm an = b.add_rms_norm(x, res, w, eps);
        b.output("y", an.out);
        if (with_residual) b.output("sum", an.sum);
        Inputs in{
            {"x", make(dt, {rows, d}, uniform(static_cast<size_t>(rows * d), -3, 3, static_cast<uint32_t>(d) + 5))},
            {"w", make(dt, {d}, uniform(static_cast<size_t>(d), 0.5, 1.5, static_cast<uint32_t>(d) + 6))}};
        if (with_residual)
          in["r"] = make(dt, {rows, d}, uniform(static_cast<size_t>(rows * d), -2, 2, static_cast<uint32_t>(d) + 7));
        auto ref = [&](const Inputs& in) {
          std::vector<double> sv = in.at("x").to_doubles();
          const std::vector<double> wv = in.at("w").to_doubles();
          RefTensor y{{rows, d}, {}, {}}, sum{{rows, d}, {}, {}};
          if (with_residual) {
            const std::vector<double> rv = in.at("r").to_doubles();
            for (size_t i = 0; i < sv.size(); ++i) sum.values.push_back(sv[i] = round_to(dt, sv[i] + rv[i]));
          }
          y.values = rms_reference(sv, wv, rows, d, eps, dt);
          Expected e{{"y", y}};
          if (with_residual) e["sum"] = sum;
          return e;
        };
        const Tolerance tol = dt == kF32 ? Tolerance::rel(4e-5) : Tolerance::rel(dt == kF16 ? 0x1p-10 : 0x1p-7);
        check_op(b, in, ref, tol);
      }
}

// One execution of s, which must succeed: the device dispatches it took.
uint64_t dispatches_of_run(Session& s, const std::string& dev) {
  const uint64_t before = s.device_dispatches();
  const Status st = s.execute();
  EXPECT_TRUE(st.is_ok()) << dev << ": " << st.to_string();
  return s.device_dispatches() - before;
}

// RmsNorm (Tree32) straight into a GatherQmm of its output: the GPU normalizes the row inside
// the projection's workgroups (qmm_row_norm_2k) where the rows suit it, else runs the two ops
// (and always before a Matmul).
// The same program also runs the pair apart (an op between them): projection, sum and the
// normalized row hold the same bits either way, on every device, as on the CPU; where the
// fused kernel applies, it is the one dispatch the pair costs.
struct NormQmmCase {
  DType dt = kBF16, w_dtype = kBF16;
  int64_t rows = 1, k = 2048, n = 96;
  int bits = 4;
  bool residual = true, store_out = false;
  int dispatches = 1;        // the fused form's on a GPU (0: the two ops, not counted)
  bool matmul = false;       // a Matmul (b [n, k] of dt, with a bias): not fused
};

void run_norm_qmm(const NormQmmCase& c) {
  SCOPED_TRACE(std::string(c.matmul ? "matmul " : "") + dtype_name(c.dt) + " rows=" + std::to_string(c.rows) +
               " k=" + std::to_string(c.k) + " bits=" + std::to_string(c.bits) + (c.residual ? " residual" : "") +
               (c.store_out ? " out" : ""));
  const int group = 64;
  std::mt19937 rng(static_cast<uint32_t>(c.k + c.rows + c.bits));
  std::vector<double> codes(static_cast<size_t>(c.n * c.k * c.bits / 32));
  for (double& v : codes) v = rng();  // any bit pattern is a valid code stream
  Inputs in{{"x", random_tensor(c.dt, {c.rows, c.k}, rng, std::uniform_real_distribution<double>(-3, 3))},
            {"w", random_tensor(c.w_dtype, {c.k}, rng, std::uniform_real_distribution<double>(0.5, 1.5))},
            {"codes", make(DType::kU32, {1, c.n, c.k * c.bits / 32}, codes)},
            {"scales", random_tensor(kF16, {1, c.n, c.k / group}, rng, std::normal_distribution<double>(0, 0.02))},
            {"biases", random_tensor(kF16, {1, c.n, c.k / group}, rng, std::normal_distribution<double>(0, 0.1))}};
  if (c.residual) in["r"] = random_tensor(c.dt, {c.rows, c.k}, rng, std::uniform_real_distribution<double>(-2, 2));
  in["b"] = random_tensor(c.dt, {c.n, c.k}, rng, std::normal_distribution<double>(0, 0.05));
  in["bias"] = random_tensor(c.dt, {c.n}, rng, std::normal_distribution<double>(0, 0.1));
  struct Refs {
    TensorRef x, w, r;
    QuantizedExperts q;
    TensorRef b, bias;
  };
  auto inputs = [&](ProgramBuilder& b) {
    return Refs{b.input("x", c.dt, {c.rows, c.k}),
                b.input("w", c.w_dtype, {c.k}),
                c.residual ? b.input("r", c.dt, {c.rows, c.k}) : TensorRef{},
                QuantizedExperts{b.input("codes", DType::kU32, {1, c.n, c.k * c.bits / 32}),
                                 b.input("scales", kF16, {1, c.n, c.k / group}),
                                 b.input("biases", kF16, {1, c.n, c.k / group}),
                                 c.bits,
                                 group,
                                 {}},
                b.input("b", c.dt, {c.n, c.k}),
                b.input("bias", c.dt, {c.n})};
  };
  auto pair = [&](ProgramBuilder& b, const Refs& in, const std::string& tag, bool apart) {
    ProgramBuilder::AddNorm an = b.add_rms_norm(in.x, in.r, in.w, 1e-6f);
    if (apart) b.output("between" + tag, b.neg(in.x));
    b.output("y" + tag, c.matmul ? b.matmul(an.out, in.b, true, in.bias) : b.gather_qmm(an.out, in.q));
    if (c.residual) b.output("sum" + tag, an.sum);
    if (c.store_out) b.output("h" + tag, an.out);
  };
  ProgramBuilder both;
  const Refs refs = inputs(both);
  pair(both, refs, "", false);
  pair(both, refs, "_apart", true);
  std::vector<std::pair<std::string, std::string>> same{{"y", "y_apart"}};
  if (c.residual) same.emplace_back("sum", "sum_apart");
  if (c.store_out) same.emplace_back("h", "h_apart");
  check_same_bits(both, in, same);

  ProgramBuilder fused;
  pair(fused, inputs(fused), "", false);
  detail::for_each_device(fused, in, [&](const Program&, Session& s, const std::string& dev) {
    const uint64_t ran = dispatches_of_run(s, dev);
    if (dev != "cpu" && c.dispatches) {
      EXPECT_EQ(ran, static_cast<uint64_t>(c.dispatches)) << dev;
    }
  });
}

TEST(RmsNorm, Tree32FusedIntoTheNextProjection) {
  NormQmmCase decode;  // Qwen3-30B's decode shape: one bf16 row of 2048, 4-bit
  run_norm_qmm(decode);
  NormQmmCase rows = decode;  // three rows of six tiles each: each row's first tile stores it
  rows.rows = 3;
  rows.store_out = true;
  run_norm_qmm(rows);
  NormQmmCase out = decode;  // the normalized row also read later; f32 weights (1 + w)
  out.store_out = true;
  out.w_dtype = kF32;
  run_norm_qmm(out);
  NormQmmCase f16 = decode;  // f16, three rows, no residual, 3-bit codes (the portable kernel)
  f16.dt = f16.w_dtype = kF16;
  f16.rows = 3;
  f16.residual = false;
  f16.bits = 3;
  f16.k = 256;
  f16.store_out = true;
  run_norm_qmm(f16);
  NormQmmCase f32 = decode;  // f32, K below a workgroup's units
  f32.dt = f32.w_dtype = kF32;
  f32.k = 128;
  f32.rows = 2;
  run_norm_qmm(f32);
  NormQmmCase wide = decode;  // K past the fused kernel's 2048: the two ops one by one
  wide.k = 4096;
  wide.store_out = true;
  wide.dispatches = 0;
  run_norm_qmm(wide);
  NormQmmCase router = decode;  // the router logits' Matmul: the two ops one by one
  router.matmul = true;
  router.n = 128;
  router.dispatches = 0;
  run_norm_qmm(router);
  // Prefill rows, quantized before their projection: the norm writes the Q8 blocks itself
  // (rms_norm_tree_q8), then the projection's kernel (tiles from 64 rows, or 16 on int8
  // tensor cores; else the generic kernel) — two dispatches, not three.
  NormQmmCase prefill = decode;
  prefill.rows = 64;
  prefill.dispatches = 2;
  run_norm_qmm(prefill);
  NormQmmCase prefill_out = prefill;  // the normalized rows also read later, f32 weights, K 4096
  prefill_out.rows = 80;
  prefill_out.k = 4096;
  prefill_out.w_dtype = kF32;
  prefill_out.store_out = true;
  run_norm_qmm(prefill_out);
  NormQmmCase prefill_f16 = prefill;  // f16 rows and weights, 96 of 1,024
  prefill_f16.dt = prefill_f16.w_dtype = kF16;
  prefill_f16.rows = 96;
  prefill_f16.k = 1024;
  run_norm_qmm(prefill_f16);
  NormQmmCase prefill_f32 = prefill;  // f32 without a residual, 3-bit codes (the portable kernels)
  prefill_f32.dt = prefill_f32.w_dtype = kF32;
  prefill_f32.residual = false;
  prefill_f32.bits = 3;
  prefill_f32.k = 256;
  run_norm_qmm(prefill_f32);
}

// Decode's MoE entry: RmsNorm (Tree32, with a residual) into the router logits' Matmul and the
// Router, the experts of the norm's output, then the next RmsNorm of their output with the sum as
// residual into a projection. Where dispatches hand off (NVIDIA, lavapipe) the GEMV's workgroups
// normalize the row themselves (matmul_rows16_norm_count), the experts' gate/up waits for its
// count before reading the norm's output and the next norm reads the sum it stored with no
// barrier. The same program with the norm apart from the Matmul (an op between) gives the same
// bits on every device, as the CPU; fused, the pair costs one dispatch less (a prefill's rows:
// the norm writes the experts' Q8 blocks, their quantizer the dispatch saved).
void run_norm_router(DType dt, int64_t d, bool residual, bool shared = false, int64_t rows = 1) {
  SCOPED_TRACE(std::string(dtype_name(dt)) + " d=" + std::to_string(d) + " rows=" + std::to_string(rows) +
               (residual ? " residual" : "") + (shared ? " shared expert" : ""));
  const int64_t experts = 8, f = 64, n = 96, group = 64;
  std::mt19937 rng(static_cast<uint32_t>(d));
  Inputs in{{"x", random_tensor(dt, {rows, d}, rng, std::uniform_real_distribution<double>(-3, 3))},
            {"w", random_tensor(dt, {d}, rng, std::uniform_real_distribution<double>(0.5, 1.5))},
            {"w2", random_tensor(dt, {d}, rng, std::uniform_real_distribution<double>(0.5, 1.5))},
            {"b", random_tensor(dt, {experts, d}, rng, std::normal_distribution<double>(0, 0.05))}};
  if (residual) in["r"] = random_tensor(dt, {rows, d}, rng, std::uniform_real_distribution<double>(-2, 2));
  auto quantized = [&](ProgramBuilder& b, const std::string& name, int64_t e, int64_t rows, int64_t k) {
    if (!in.count(name + ".w")) {
      std::vector<double> codes(static_cast<size_t>(e * rows * k / 8));
      for (double& v : codes) v = rng();  // any bit pattern is a valid code stream
      in[name + ".w"] = make(DType::kU32, {e, rows, k / 8}, codes);
      in[name + ".s"] = random_tensor(kBF16, {e, rows, k / group}, rng, std::normal_distribution<double>(0, 0.02));
      in[name + ".b"] = random_tensor(kBF16, {e, rows, k / group}, rng, std::normal_distribution<double>(0, 0.1));
    }
    return QuantizedExperts{b.input(name + ".w", DType::kU32, {e, rows, k / 8}),
                            b.input(name + ".s", kBF16, {e, rows, k / group}),
                            b.input(name + ".b", kBF16, {e, rows, k / group}),
                            4,
                            static_cast<int>(group),
                            {}};
  };
  struct Refs {
    TensorRef x, r, w, w2, b;
    MoeExperts e;
    QuantizedExperts proj, shared;
  };
  auto inputs = [&](ProgramBuilder& b) {
    MoeExperts e{quantized(b, "gate", experts, f, d), quantized(b, "up", experts, f, d),
                 quantized(b, "down", experts, d, f)};
    // Rows of a dynamic count, as a decoder's: the experts then sit in an If's branches.
    const int64_t most = std::max<int64_t>(rows, 4);
    return Refs{b.input("x", dt, {Dim::dynamic(0, most), d}),
                residual ? b.input("r", dt, {Dim::dynamic(0, most), d}) : TensorRef{}, b.input("w", dt, {d}),
                b.input("w2", dt, {d}), b.input("b", dt, {experts, d}), e, quantized(b, "proj", 1, n, d),
                shared ? quantized(b, "shared", 1, d, d) : QuantizedExperts{}};
  };
  // full: every intermediate an output; else a decoder's layer, its temps' slots free for the next.
  auto layer = [&](ProgramBuilder& b, const Refs& in, const std::string& tag, bool apart, bool full = true) {
    std::optional<ProgramBuilder::TmpScope> scope;
    if (!full) scope.emplace(b.tmp_scope());
    auto out = [&](const std::string& name, TensorRef t) { b.output(name, scope ? scope->keep(t) : t); };
    ProgramBuilder::AddNorm an = b.add_rms_norm(in.x, in.r, in.w, 1e-6f);
    if (!residual) an.sum = in.x;  // the norm of x alone (Tree32); the next norm adds x back
    if (apart) out("between" + tag, b.neg(in.x));
    TensorRef logits = b.matmul(an.out, in.b, true);
    RouterOut r = b.router(logits, RouterSpec{RouterKind::kSoftmaxTopK, 2});
    // A shared expert reads the norm's output outside the experts' branches: not fused.
    TensorRef y = b.moe_experts(an.out, r.weights, r.indices, in.e, shared ? b.gather_qmm(an.out, in.shared) : TensorRef{});
    ProgramBuilder::AddNorm next = b.add_rms_norm(y, an.sum, in.w2, 1e-6f);
    out("z" + tag, b.gather_qmm(next.out, in.proj));
    if (!full) return;
    b.output("logits" + tag, logits);
    b.output("indices" + tag, r.indices);
    b.output("y" + tag, y);
    if (residual) b.output("sum" + tag, an.sum);
    b.output("h" + tag, an.out);
    b.output("sum2" + tag, next.sum);
  };
  ProgramBuilder both;
  const Refs refs = inputs(both);
  layer(both, refs, "", false);
  layer(both, refs, "_apart", true);
  std::vector<std::pair<std::string, std::string>> same;
  for (const char* o : {"z", "logits", "indices", "y", "sum", "h", "sum2"})
    if (residual || std::string(o) != "sum") same.emplace_back(o, std::string(o) + "_apart");
  check_same_bits(both, in, same);

  // Two layers, as a decoder's: the second reuses the first's slots (its norm output's too).
  std::map<std::string, int64_t> dispatches;  // per device: apart's less fused's
  for (bool apart : {false, true}) {
    ProgramBuilder one;
    const Refs refs1 = inputs(one);
    layer(one, refs1, "", apart, false);
    layer(one, refs1, "_2", apart, false);
    detail::for_each_device(one, in, [&](const Program&, Session& s, const std::string& dev) {
      const auto ran = static_cast<int64_t>(dispatches_of_run(s, dev));
      dispatches[dev] += apart ? ran : -ran;
    });
  }
  for (const auto& [dev, extra] : dispatches) {
    if (dev != "cpu") {
      EXPECT_EQ(extra, shared ? 2 : 4) << dev << ": the apart form's negs (and norms, where fused)";
    }
  }
}

TEST(RmsNorm, Tree32FusedIntoTheRouterLogits) {
  run_norm_router(kBF16, 1024, true);   // Qwen3-30B's decode step at a smaller width
  run_norm_router(kF32, 2048, false);   // the widest row the kernel stages, f32, no residual
  run_norm_router(kBF16, 1024, true, true);
  // A prefill's (sorted experts on tiles): the norm writes the Q8 blocks the experts' gate/up
  // reads (rms_norm_tree_q8), so their quantizer is the dispatch the fused form saves.
  run_norm_router(kBF16, 1024, true, false, 64);
  run_norm_router(kF32, 256, false, false, 96);
}

TEST(RmsNorm, Tree32RulesNameTheField) {
  ProgramBuilder b;
  TensorRef x = b.input("x", kF32, {2, 4});
  b.add_rms_norm(x, b.input("r", kBF16, {2, 4}), b.input("w", kF32, {4}), 1e-6f);
  EXPECT_NE(b.status().message().find("dtype of x (f32) differs from residual (bf16)"), std::string::npos)
      << b.status().to_string();
}

TEST(RmsNorm, WeightOfTheWrongLengthFails) {
  ProgramBuilder b;
  b.output("y", b.rms_norm(b.input("x", kF32, {2, 4}), b.input("w", kF32, {Dim::dynamic(0, 8)})));
  check_op_error(b, {{"x", make(kF32, {2, 4}, std::vector<double>(8, 1.0))}, {"w", make(kF32, {3}, {1, 1, 1})}},
                 "does not match the last dim 4");
}

}  // namespace
}  // namespace switchboard::optest
