// Gated DeltaNet's ops (schema v7: CausalConv1d, GatedDeltaRule, RmsNorm's gate, Unary Softplus)
// through the op harness: against double-precision references of the schema's formulas, bitwise
// across devices, and batch-invariant: rows split over several calls (a prefill, then decode
// steps) give the bits of one call, on every device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "exact_math.h"
#include "op_harness.h"

namespace switchboard {
namespace {

using optest::Expected;
using optest::Inputs;
using optest::RefTensor;
using optest::Tolerance;

Tensor random(DType t, const Shape& shape, std::mt19937& rng, double lo, double hi) {
  return optest::random_tensor(t, shape, rng, std::uniform_real_distribution<double>(lo, hi));
}

// --- CausalConv1d ------------------------------------------------------------------------

struct Conv {
  DType dt;
  int64_t m, c, k;
};

// pos: an input value "pos" when dynamic, else position 0.
void conv_program(ProgramBuilder& b, const Conv& c, bool dynamic) {
  TensorRef x = dynamic ? b.input("x", c.dt, {Dim::dynamic(1, 16), c.c}) : b.input("x", c.dt, {c.m, c.c});
  TensorRef w = b.input("w", c.dt, {c.c, c.k});
  TensorRef st = b.mutable_buffer("state", c.dt, {c.k - 1, c.c});
  b.output("y", b.causal_conv1d(x, w, st, dynamic ? b.input_value("pos") : IntOrValue(0)));
}

TEST(CausalConv1d, MatchesTheFormulaOnEveryDevice) {
  for (const Conv& c : {Conv{DType::kF32, 6, 5, 4}, Conv{DType::kBF16, 3, 8, 4}, Conv{DType::kF16, 1, 6, 2},
                        Conv{DType::kF32, 4, 3, 1}}) {
    SCOPED_TRACE(::testing::Message() << dtype_name(c.dt) << " m=" << c.m << " C=" << c.c << " K=" << c.k);
    ProgramBuilder b;
    conv_program(b, c, false);
    std::mt19937 rng(static_cast<uint32_t>(c.m * 7 + c.c));
    Inputs in{{"x", random(c.dt, {c.m, c.c}, rng, -2, 2)}, {"w", random(c.dt, {c.c, c.k}, rng, -1, 1)}};
    auto ref = [&](const Inputs& i) {
      const std::vector<double> x = i.at("x").to_doubles(), w = i.at("w").to_doubles();
      RefTensor y{{c.m, c.c}, {}, {}}, st{{c.k - 1, c.c}, {}, {}};
      auto u = [&](int64_t t, int64_t ch) { return t < 0 ? 0.0 : x[static_cast<size_t>(t * c.c + ch)]; };
      for (int64_t t = 0; t < c.m; ++t)
        for (int64_t ch = 0; ch < c.c; ++ch) {
          float acc = 0.0f;
          for (int64_t j = 0; j < c.k; ++j)
            acc = acc +
                  static_cast<float>(w[static_cast<size_t>(ch * c.k + j)]) * static_cast<float>(u(t - c.k + 1 + j, ch));
          const double yv = optest::round_to(c.dt, acc);
          y.values.push_back(optest::round_to(c.dt, exact::silu(static_cast<float>(yv))));
        }
      for (int64_t r = 0; r < c.k - 1; ++r)
        for (int64_t ch = 0; ch < c.c; ++ch) st.values.push_back(u(c.m - c.k + 1 + r, ch));
      return Expected{{"y", y}, {"state", st}};
    };
    optest::check_op(b, in, ref, Tolerance::exact());  // the schema's f32 steps, spelled out above
  }
}

// Rows 0..n-1 in calls of the given sizes; each call's outputs and the state after the last.
std::vector<Tensor> run_split(Session& s, const std::string& in_name, const Tensor& x,
                              const std::vector<int64_t>& sizes,
                              const std::vector<std::pair<std::string, Tensor>>& rows_extra = {}) {
  std::vector<Tensor> outs;
  int64_t pos = 0;
  for (int64_t n : sizes) {
    auto rows = [&](const Tensor& t) {
      const int64_t w = t.numel() / t.dim(0);
      Shape sh = t.shape();
      sh[0] = n;
      Tensor r = Tensor::uninitialized(t.dtype(), sh).value();
      std::memcpy(r.mutable_data(), static_cast<const uint8_t*>(t.data()) + pos * w * dtype_size(t.dtype()),
                  r.nbytes());
      return r;
    };
    EXPECT_TRUE(s.set_input(in_name, rows(x)).is_ok());
    for (const auto& [name, t] : rows_extra) EXPECT_TRUE(s.set_input(name, rows(t)).is_ok());
    EXPECT_TRUE(s.set_input_value("pos", pos).is_ok());
    Status st = s.execute();
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    if (!st.is_ok()) return outs;
    outs.push_back(s.output("y").value());
    pos += n;
  }
  return outs;
}

bool same_rows(const std::vector<Tensor>& parts, const Tensor& whole) {
  size_t off = 0;
  for (const Tensor& p : parts) {
    if (off + p.nbytes() > whole.nbytes() ||
        std::memcmp(p.data(), static_cast<const uint8_t*>(whole.data()) + off, p.nbytes()) != 0)
      return false;
    off += p.nbytes();
  }
  return off == whole.nbytes();
}

TEST(CausalConv1d, RowsSplitOverCallsGiveTheBitsOfOneCall) {
  const Conv c{DType::kBF16, 7, 6, 4};
  ProgramBuilder b;
  conv_program(b, c, true);
  auto program = Program::from_bytes(b.serialize().value(), "conv");
  ASSERT_TRUE(program.is_ok()) << program.status().to_string();
  std::mt19937 rng(5);
  const Tensor x = random(c.dt, {c.m, c.c}, rng, -2, 2), w = random(c.dt, {c.c, c.k}, rng, -1, 1);
  Tensor want;
  for (const std::string& dev : optest::test_devices()) {
    SCOPED_TRACE(dev);
    for (const std::vector<int64_t>& sizes : {std::vector<int64_t>{7}, {1, 1, 1, 1, 1, 1, 1}, {3, 1, 2, 1}, {2, 5}}) {
      auto s = optest::detail::open_session(*program, dev);
      if (!s) break;
      ASSERT_TRUE(s->set_input("w", w).is_ok());
      const std::vector<Tensor> parts = run_split(*s, "x", x, sizes);
      ASSERT_EQ(parts.size(), sizes.size());
      if (!want.defined()) want = parts[0];
      EXPECT_TRUE(same_rows(parts, want)) << "calls of " << sizes.size();
      // A new sequence (pos 0) ignores what the state holds.
      const std::vector<Tensor> again = run_split(*s, "x", x, {7});
      ASSERT_EQ(again.size(), 1u);
      EXPECT_TRUE(same_rows(again, want)) << "restart at position 0";
    }
  }
}

// --- GatedDeltaRule ----------------------------------------------------------------------

struct Delta {
  DType dt;
  int64_t m, hk, hv, dk, dv;
  float scale;
};

int64_t width(const Delta& c) { return 2 * c.hk * c.dk + c.hv * c.dv; }

void delta_program(ProgramBuilder& b, const Delta& c, bool dynamic) {
  const Dim m = dynamic ? Dim::dynamic(1, 16) : Dim(c.m);
  TensorRef qkv = b.input("x", c.dt, {m, width(c)});
  TensorRef a = b.input("a", c.dt, {m, c.hv}), bb = b.input("b", c.dt, {m, c.hv});
  TensorRef al = b.input("a_log", c.dt, {c.hv}), db = b.input("dt_bias", c.dt, {c.hv});
  TensorRef st = b.mutable_buffer("state", DType::kF32, {c.hv, c.dk, c.dv});
  b.output("y", b.gated_delta_rule(qkv, a, bb, al, db, st, dynamic ? b.input_value("pos") : IntOrValue(0), c.scale));
}

Inputs delta_inputs(const Delta& c, uint32_t seed) {
  std::mt19937 rng(seed);
  return {{"x", random(c.dt, {c.m, width(c)}, rng, -1.5, 1.5)},
          {"a", random(c.dt, {c.m, c.hv}, rng, -3, 3)},
          {"b", random(c.dt, {c.m, c.hv}, rng, -3, 3)},
          {"a_log", random(c.dt, {c.hv}, rng, -2, 1)},
          {"dt_bias", random(c.dt, {c.hv}, rng, -1, 1)}};
}

// The schema's formula step by step in f32 (the exact routines; sums in index order).
Expected delta_reference(const Delta& c, const Inputs& in) {
  auto f = [&](const char* name) {
    std::vector<float> v;
    for (double d : in.at(name).to_doubles()) v.push_back(static_cast<float>(d));
    return v;
  };
  const std::vector<float> x = f("x"), a = f("a"), bv = f("b"), al = f("a_log"), db = f("dt_bias");
  const int64_t W = width(c);
  std::vector<float> S(static_cast<size_t>(c.hv * c.dk * c.dv), 0.0f);
  RefTensor y{{c.m, c.hv, c.dv}, {}, {}};
  y.values.resize(static_cast<size_t>(c.m * c.hv * c.dv));
  auto l2 = [](std::vector<float>& v) {
    float ss = 0.0f;
    for (float e : v) ss = ss + e * e;
    const float r = exact::rsqrt(ss + 1e-6f);
    for (float& e : v) e = e * r;
  };
  for (int64_t t = 0; t < c.m; ++t)
    for (int64_t h = 0; h < c.hv; ++h) {
      const int64_t kh = h / (c.hv / c.hk);
      std::vector<float> q(x.begin() + t * W + kh * c.dk, x.begin() + t * W + (kh + 1) * c.dk);
      std::vector<float> k(x.begin() + t * W + (c.hk + kh) * c.dk, x.begin() + t * W + (c.hk + kh + 1) * c.dk);
      l2(q);
      l2(k);
      for (float& e : q) e = e * c.scale;
      const float beta =
          static_cast<float>(optest::round_to(c.dt, exact::sigmoid(bv[static_cast<size_t>(t * c.hv + h)])));
      const float g = -exact::exp(al[static_cast<size_t>(h)]) *
                      exact::softplus(a[static_cast<size_t>(t * c.hv + h)] + db[static_cast<size_t>(h)]);
      const float alpha = exact::exp(g);
      float* s = S.data() + h * c.dk * c.dv;
      for (int64_t j = 0; j < c.dv; ++j) {
        float mj = 0.0f;
        for (int64_t i = 0; i < c.dk; ++i) {
          s[i * c.dv + j] = s[i * c.dv + j] * alpha;
          mj = mj + s[i * c.dv + j] * k[static_cast<size_t>(i)];
        }
        const float d = (x[static_cast<size_t>(t * W + 2 * c.hk * c.dk + h * c.dv + j)] - mj) * beta;
        float o = 0.0f;
        for (int64_t i = 0; i < c.dk; ++i) {
          s[i * c.dv + j] = s[i * c.dv + j] + k[static_cast<size_t>(i)] * d;
          o = o + s[i * c.dv + j] * q[static_cast<size_t>(i)];
        }
        y.values[static_cast<size_t>((t * c.hv + h) * c.dv + j)] = optest::round_to(c.dt, o);
      }
    }
  RefTensor st{{c.hv, c.dk, c.dv}, std::vector<double>(S.begin(), S.end()), {}};
  return Expected{{"y", y}, {"state", st}};
}

TEST(GatedDeltaRule, MatchesTheFormulaOnEveryDevice) {
  for (const Delta& c :
       {Delta{DType::kF32, 5, 2, 4, 16, 8, 0.25f}, Delta{DType::kBF16, 3, 1, 2, 8, 70, 0.35355339f},
        Delta{DType::kF16, 2, 2, 2, 32, 12, 0.5f}, Delta{DType::kF32, 2, 1, 1, 128, 64, 0.088388346f},
        // 8+ rows: the GPU computes every row's normalized q, k and gates first (gated_delta_prep).
        Delta{DType::kBF16, 9, 2, 4, 128, 64, 0.088388346f}, Delta{DType::kF32, 12, 1, 3, 16, 70, 0.25f}}) {
    SCOPED_TRACE(::testing::Message() << dtype_name(c.dt) << " m=" << c.m << " hk=" << c.hk << " hv=" << c.hv
                                      << " dk=" << c.dk << " dv=" << c.dv);
    ProgramBuilder b;
    delta_program(b, c, false);
    optest::check_op(
        b, delta_inputs(c, static_cast<uint32_t>(c.dk + c.dv)),
        [&](const Inputs& in) { return delta_reference(c, in); }, Tolerance::exact());
  }
}

// Calls of 8+ rows take the GPU's two-kernel prefill, shorter ones the one-kernel walk: the bits
// of a row must not depend on which.
void check_split_calls(const Delta& c, const std::vector<std::vector<int64_t>>& splits) {
  ProgramBuilder b;
  delta_program(b, c, true);
  auto program = Program::from_bytes(b.serialize().value(), "delta");
  ASSERT_TRUE(program.is_ok()) << program.status().to_string();
  const Inputs in = delta_inputs(c, 11);
  const std::vector<std::pair<std::string, Tensor>> per_row = {{"a", in.at("a")}, {"b", in.at("b")}};
  Tensor want;
  for (const std::string& dev : optest::test_devices()) {
    SCOPED_TRACE(dev);
    for (const std::vector<int64_t>& sizes : splits) {
      auto s = optest::detail::open_session(*program, dev);
      if (!s) break;
      ASSERT_TRUE(s->set_input("a_log", in.at("a_log")).is_ok());
      ASSERT_TRUE(s->set_input("dt_bias", in.at("dt_bias")).is_ok());
      const std::vector<Tensor> parts = run_split(*s, "x", in.at("x"), sizes, per_row);
      ASSERT_EQ(parts.size(), sizes.size());
      if (!want.defined()) want = parts[0];
      EXPECT_TRUE(same_rows(parts, want)) << "calls of " << sizes.size();
      const std::vector<Tensor> again = run_split(*s, "x", in.at("x"), {c.m}, per_row);
      ASSERT_EQ(again.size(), 1u);
      EXPECT_TRUE(same_rows(again, want)) << "restart at position 0";
    }
  }
}

TEST(GatedDeltaRule, RowsSplitOverCallsGiveTheBitsOfOneCall) {
  check_split_calls({DType::kBF16, 6, 2, 4, 16, 10, 0.25f}, {{6}, {1, 1, 1, 1, 1, 1}, {4, 1, 1}, {2, 3, 1}});
  check_split_calls({DType::kBF16, 14, 2, 4, 128, 10, 0.125f},
                    {{14}, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, {8, 6}, {3, 11}, {5, 9}});
}

// --- gated RMSNorm, Softplus, rules --------------------------------------------------------

// RmsNorm Tree32's rsqrt(dot32(x_r, x_r) / d + 1e-6) of row r, spelled out.
float tree32_rsqrt(const std::vector<double>& xv, int64_t r, int64_t d) {
  float p[32] = {};
  for (int64_t e = 0; e < d; ++e) {
    const float v = static_cast<float>(xv[static_cast<size_t>(r * d + e)]);
    p[e % 32] = p[e % 32] + v * v;
  }
  for (int hh = 16; hh >= 1; hh /= 2)
    for (int l = 0; l < hh; ++l) p[l] = p[l] + p[l + hh];
  return exact::rsqrt(p[0] * static_cast<float>(1.0 / d) + 1e-6f);
}

TEST(GatedRmsNorm, MatchesTheFormulaOnEveryDevice) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(dt));
    const int64_t rows = 6, d = 40;
    ProgramBuilder b;
    TensorRef x = b.input("x", dt, {rows, d}), z = b.input("z", dt, {rows, d}), w = b.input("w", dt, {d});
    b.output("y", b.gated_rms_norm(x, z, w, 1e-6f));
    std::mt19937 rng(3);
    Inputs in{{"x", random(dt, {rows, d}, rng, -3, 3)},
              {"z", random(dt, {rows, d}, rng, -4, 4)},
              {"w", random(dt, {d}, rng, 0.5, 1.5)}};
    auto ref = [&](const Inputs& i) {
      const std::vector<double> xv = i.at("x").to_doubles(), zv = i.at("z").to_doubles(), wv = i.at("w").to_doubles();
      RefTensor y{{rows, d}, {}, {}};
      for (int64_t r = 0; r < rows; ++r) {
        const float inv = tree32_rsqrt(xv, r, d);
        for (int64_t e = 0; e < d; ++e) {
          const float n = (static_cast<float>(xv[static_cast<size_t>(r * d + e)]) * inv) *
                          static_cast<float>(wv[static_cast<size_t>(e)]);
          const float g = exact::silu(static_cast<float>(zv[static_cast<size_t>(r * d + e)]));
          y.values.push_back(optest::round_to(dt, static_cast<float>(optest::round_to(dt, n)) * g));
        }
      }
      return Expected{{"y", y}};
    };
    optest::check_op(b, in, ref, Tolerance::exact());
  }
}

// Zero-centred norms (Qwen3-Next / Qwen3.5) keep 1 + w in f32 beside 16-bit rows: RmsNorm
// (Tree32) multiplies by the f32 weight and rounds once; Rope's per-head norm gives the bits of
// that RmsNorm followed by Rope.
TEST(GatedRmsNorm, F32WeightsBeside16BitRows) {
  for (DType dt : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(dt));
    const int64_t rows = 6, d = 16, half = 4, table = 8;
    ProgramBuilder b;
    TensorRef x = b.input("x", dt, {rows, d}), w = b.input("w", DType::kF32, {d});
    b.output("y", b.add_rms_norm(x, {}, w, 1e-6f).out);
    TensorRef cos = b.input("cos", DType::kF32, {table, half}), sin = b.input("sin", DType::kF32, {table, half});
    TensorRef heads = b.reshape(x, {2, 3, d});
    b.output("fused", b.rope(heads, cos, sin, 1, w, 1e-6f));
    b.output("separate", b.rope(b.reshape(b.add_rms_norm(x, {}, w, 1e-6f).out, {2, 3, d}), cos, sin, 1));
    std::mt19937 rng(9);
    Inputs in{{"x", random(dt, {rows, d}, rng, -3, 3)},
              {"w", random(DType::kF32, {d}, rng, 0.5, 1.5)},
              {"cos", random(DType::kF32, {table, half}, rng, -1, 1)},
              {"sin", random(DType::kF32, {table, half}, rng, -1, 1)}};
    optest::check_same_bits(b, in, {{"fused", "separate"}});
    auto ref = [&](const Inputs& i) {
      const std::vector<double> xv = i.at("x").to_doubles(), wv = i.at("w").to_doubles();
      RefTensor y{{rows, d}, {}, {}};
      for (int64_t r = 0; r < rows; ++r) {
        const float inv = tree32_rsqrt(xv, r, d);
        for (int64_t e = 0; e < d; ++e)
          y.values.push_back(optest::round_to(dt, (static_cast<float>(xv[static_cast<size_t>(r * d + e)]) * inv) *
                                                      static_cast<float>(wv[static_cast<size_t>(e)])));
      }
      Expected want{{"y", y}};
      return want;
    };
    ProgramBuilder only;
    only.output("y",
                only.add_rms_norm(only.input("x", dt, {rows, d}), {}, only.input("w", DType::kF32, {d}), 1e-6f).out);
    optest::check_op(only, {{"x", in.at("x")}, {"w", in.at("w")}}, ref, Tolerance::exact());
  }
}

TEST(Softplus, EdgeValues) {
  const std::vector<double> v = {0.0, -0.0, INFINITY, -INFINITY, NAN, 20.0, 20.5, -100.0, 1e-30, -1e-30};
  ProgramBuilder b;
  b.output("y", b.softplus(b.input("x", DType::kF32, {static_cast<int64_t>(v.size())})));
  auto ref = [&](const Inputs&) {
    // log1p(e^x) = ln 2 at 0; x past the threshold 20 (and +inf) is x; e^x underflows to 0 below -87.
    return Expected{
        {"y", RefTensor{{static_cast<int64_t>(v.size())},
                        {static_cast<double>(exact::softplus(0.0f)), static_cast<double>(exact::softplus(0.0f)),
                         INFINITY, 0.0, NAN, std::log1p(std::exp(20.0)), 20.5, 0.0, std::log(2.0), std::log(2.0)},
                        {}}}};
  };
  EXPECT_NEAR(exact::softplus(0.0f), std::log(2.0), 1e-7);
  optest::check_op(b, {{"x", optest::make(DType::kF32, {static_cast<int64_t>(v.size())}, v)}}, ref,
                   Tolerance::f32_ulps(4));
}

TEST(LinearAttentionRules, BadOperandsNameTheField) {
  {
    ProgramBuilder b;
    TensorRef x = b.input("x", DType::kF32, {2, 4});
    b.causal_conv1d(x, b.input("w", DType::kF32, {4, 0}), b.mutable_buffer("s", DType::kF32, {0, 4}), 0);
    EXPECT_NE(b.status().message().find("weight: has a kernel of width 0"), std::string::npos)
        << b.status().to_string();
  }
  {
    ProgramBuilder b;
    TensorRef x = b.input("x", DType::kF32, {2, 4});
    b.causal_conv1d(x, b.input("w", DType::kF32, {4, 3}), b.mutable_buffer("s", DType::kF32, {3, 4}), 0);
    EXPECT_NE(b.status().message().find("state: dim 0 is 3, the kernel width - 1 is 2"), std::string::npos)
        << b.status().to_string();
  }
  {
    ProgramBuilder b;
    TensorRef x = b.input("x", DType::kF32, {2, 40});
    TensorRef a = b.input("a", DType::kF32, {2, 3});
    b.gated_delta_rule(x, a, a, b.input("l", DType::kF32, {3}), b.input("d", DType::kF32, {3}),
                       b.mutable_buffer("s", DType::kF32, {4, 4, 4}), 0, 0.5f);
    EXPECT_NE(b.status().message().find(".a: dim 1 is 3, the state's head count is 4"), std::string::npos)
        << b.status().to_string();
  }
}

// Shapes past the GPU kernels' register windows are refused when a GPU session opens (not in a
// step whose earlier layers already advanced their states); the CPU runs them.
TEST(LinearAttentionRules, GpuRefusesWideShapesWhenTheSessionOpens) {
  ProgramBuilder b;
  TensorRef x = b.input("x", DType::kF32, {2, 4});
  b.output("y", b.causal_conv1d(x, b.input("w", DType::kF32, {4, 9}), b.mutable_buffer("s", DType::kF32, {8, 4}), 0));
  auto program = Program::from_bytes(b.serialize().value(), "wide");
  ASSERT_TRUE(program.is_ok());
  for (const std::string& dev : optest::test_devices()) {
    auto s = Session::create(*program, SessionOptions{dev});
    if (dev == "cpu") {
      EXPECT_TRUE(s.is_ok()) << s.status().to_string();
      continue;
    }
    ASSERT_FALSE(s.is_ok()) << dev;
    EXPECT_NE(s.status().message().find("CausalConv1d wider than 8 taps"), std::string::npos) << s.status().to_string();
  }
}

TEST(GatedDeltaRule, HeadCountsThatDoNotDivideAreAnError) {
  // width 2 * hk * 4 + 3 * 4 with hk = 2: 3 value heads are not a multiple of 2 key heads.
  ProgramBuilder b;
  TensorRef x = b.input("x", DType::kF32, {1, 28});
  TensorRef a = b.input("a", DType::kF32, {1, 3});
  b.output("y", b.gated_delta_rule(x, a, a, b.input("l", DType::kF32, {3}), b.input("d", DType::kF32, {3}),
                                   b.mutable_buffer("s", DType::kF32, {3, 4, 4}), 0, 0.5f));
  std::mt19937 rng(1);
  Inputs in{{"x", random(DType::kF32, {1, 28}, rng, -1, 1)},
            {"a", random(DType::kF32, {1, 3}, rng, -1, 1)},
            {"l", random(DType::kF32, {3}, rng, -1, 1)},
            {"d", random(DType::kF32, {3}, rng, -1, 1)}};
  optest::check_op_error(b, in, "3 value heads are not a multiple of 2 key heads");
}

}  // namespace
}  // namespace switchboard
