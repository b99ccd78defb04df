// GatherMm (float experts): bitwise against the dot32 order of docs/numerics.md,
// within a stated bound of fp64, f16/bf16 rounding once, and index errors.
#include <cmath>
#include <random>

#include "cpu_common.h"
#include "gather_qmm.h"
#include "test_util.h"

namespace switchboard {
namespace {
using namespace switchboard::testing;

Tensor random_t(DType dt, Shape shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  Tensor t = Tensor::zeros(dt, shape).value();
  for (int64_t i = 0; i < t.numel(); ++i) {
    float v = dist(rng);
    if (dt == DType::kF32) t.mutable_data_as<float>()[i] = v;
    else if (dt == DType::kF16) t.mutable_data_as<uint16_t>()[i] = f32_to_f16(v);
    else t.mutable_data_as<uint16_t>()[i] = f32_to_bf16(v);
  }
  return t;
}

// The documented order: 32 strided partial sums, then a halving tree.
float dot32_ref(const std::vector<double>& x, const std::vector<double>& w, int64_t xo, int64_t wo, int64_t k) {
  float part[32] = {};
  for (int64_t i = 0; i < k; ++i) {
    float prod = static_cast<float>(x[xo + i]) * static_cast<float>(w[wo + i]);
    part[i % 32] = part[i % 32] + prod;
  }
  for (int s = 16; s >= 1; s /= 2)
    for (int i = 0; i < s; ++i) part[i] = part[i] + part[i + s];
  return part[0];
}

struct Case {
  std::vector<uint8_t> program;
  Tensor x, w;
};

Case build(DType dt, int64_t e, int64_t n, int64_t k, int64_t t, bool with_lhs) {
  ProgramBuilder b;
  TensorRef x = b.input("x", dt, {Dim::dynamic(1, 64), k});
  TensorRef w = b.input("w", dt, {e, n, k});
  GatherOptions o;
  o.rhs_indices = b.input("rhs", DType::kI32, {Dim::dynamic(1, 256)});
  if (with_lhs) o.lhs_indices = b.input("lhs", DType::kI32, {Dim::dynamic(1, 256)});
  b.output("y", b.gather_mm(x, w, o));
  return Case{b.serialize().value(), random_t(dt, {t, k}, 1), random_t(dt, {e, n, k}, 2)};
}

Result<Tensor> execute(const Case& r, std::vector<int32_t> rhs, std::vector<int32_t> lhs = {}) {
  SB_ASSIGN_OR_RETURN(auto p, Program::from_bytes(r.program, "gather_mm"));
  SB_ASSIGN_OR_RETURN(auto s, Session::create(p));
  SB_RETURN_IF_ERROR(s->set_input("x", r.x));
  SB_RETURN_IF_ERROR(s->set_input("w", r.w));
  SB_RETURN_IF_ERROR(s->set_input("rhs", Tensor::from_vector<int32_t>(DType::kI32, {(int64_t)rhs.size()}, rhs).value()));
  if (!lhs.empty())
    SB_RETURN_IF_ERROR(s->set_input("lhs", Tensor::from_vector<int32_t>(DType::kI32, {(int64_t)lhs.size()}, lhs).value()));
  SB_RETURN_IF_ERROR(s->execute());
  return s->output("y");
}

// Every SIMD dot32 keeps the contract's order: bitwise equal to the portable loop for every
// length (full blocks and tails), with -0, subnormal, huge and infinite operands mixed in.
TEST(Dot32, EverySimdPathMatchesThePortableOrder) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  const float specials[] = {-0.0f, 1e-40f, -3e38f, 3e38f, 1e-30f, 0.0f};
  for (int64_t k : {0, 1, 5, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 100, 128, 257, 2048}) {
    std::vector<float> x(static_cast<size_t>(k)), w(static_cast<size_t>(k));
    for (int64_t i = 0; i < k; ++i) {
      x[i] = i % 7 == 3 ? specials[i % 6] : u(rng);
      w[i] = i % 11 == 5 ? specials[(i / 11) % 6] : u(rng);
    }
    cpu::set_cpu_path_limit(cpu::CpuPath::kPortable);
    const float want = cpu::dot32(x.data(), w.data(), k);
    for (cpu::CpuPath p : {cpu::CpuPath::kAvx2, cpu::CpuPath::kAvx512Vnni}) {
      cpu::set_cpu_path_limit(p);
      const float got = cpu::dot32(x.data(), w.data(), k);
      EXPECT_TRUE(f32_bits(got) == f32_bits(want) || (std::isnan(got) && std::isnan(want)))
          << "k " << k << " path " << cpu::cpu_path_name(cpu::active_cpu_path()) << ": " << got << " vs " << want;
    }
  }
  cpu::set_cpu_path_limit(cpu::CpuPath::kAmx);
}

TEST(GatherMm, BitwiseDot32AndWithinTheFp64Bound) {
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(dt));
    const int64_t e = 4, n = 12, k = 100, t = 3;  // K not a multiple of 32: partials get unequal counts
    Case r = build(dt, e, n, k, t, false);
    std::vector<int32_t> rhs = {3, 0, 1, 1, 2, 3};  // 2 pairs per row of x
    Tensor y = execute(r, rhs).value();
    ASSERT_EQ(y.shape(), (Shape{6, n}));
    const std::vector<double> xv = r.x.to_doubles(), wv = r.w.to_doubles(), yv = y.to_doubles();
    for (int64_t p = 0; p < 6; ++p)
      for (int64_t j = 0; j < n; ++j) {
        const int64_t xo = (p / 2) * k, wo = (rhs[p] * n + j) * k;
        float want = dot32_ref(xv, wv, xo, wo, k);
        float got = static_cast<float>(yv[p * n + j]);
        double stored = dt == DType::kF32 ? want : dt == DType::kF16 ? f16_to_f32(f32_to_f16(want)) : bf16_to_f32(f32_to_bf16(want));
        ASSERT_EQ(got, stored) << "pair " << p << " row " << j;
        // fp64 bound: each of the <= k/32 + 5 additions on a path adds at most one f32 rounding of sum |x w|.
        double exact = 0, mag = 0;
        for (int64_t i = 0; i < k; ++i) exact += xv[xo + i] * wv[wo + i], mag += std::fabs(xv[xo + i] * wv[wo + i]);
        EXPECT_LE(std::fabs(want - exact), (k / 32 + 7) * 0x1p-24 * mag) << "pair " << p << " row " << j;
      }
  }
}

TEST(GatherMm, LhsIndicesPickRowsAndIndexErrorsAreReported) {
  Case r = build(DType::kF32, 2, 4, 32, 3, true);
  Tensor a = execute(r, {1, 0}, {2, 0}).value();
  Tensor b = execute(r, {0, 1, 1}, {0, 1, 2}).value();
  // Pair (row 2, expert 1) appears in both runs at different positions.
  for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(a.data_as<float>()[j], b.data_as<float>()[2 * 4 + j]);
  EXPECT_NE(execute(r, {2, 0}, {0, 0}).status().message().find("rhs_indices[0] = 2 out of range [0, 2)"), std::string::npos);
  EXPECT_NE(execute(r, {0, 0}, {0, 3}).status().message().find("lhs_indices[1] = 3 out of range [0, 3)"), std::string::npos);
}

}  // namespace
}  // namespace switchboard
