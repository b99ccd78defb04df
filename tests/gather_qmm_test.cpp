// GatherQmm: MLX quantizer, the integer contract (bitwise, against an oracle
// written from docs/numerics.md), accuracy against fp64, mixed bits, pruned
// experts, sorted scheduling and bad inputs.
#include <cmath>
#include <random>

#include "exact_math.h"
#include "gather_qmm.h"
#include "gather_qmm_x86.h"
#include "quantize.h"
#include "safetensors.h"
#include "test_util.h"

namespace switchboard {
namespace {
using namespace switchboard::testing;

const int kAllBits[] = {2, 3, 4, 5, 6, 8};

Tensor random_f32(Shape shape, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, scale);
  Tensor t = Tensor::zeros(DType::kF32, shape).value();
  for (int64_t i = 0; i < t.numel(); ++i) t.mutable_data_as<float>()[i] = dist(rng);
  return t;
}

// --- quantizer ---------------------------------------------------------------

TEST(Quantize, CodesRoundTripThroughThePackedBitStream) {
  for (int bits : kAllBits) {
    Tensor w = random_f32({3, 128}, 1 + bits);
    auto q = affine_quantize(w, bits, 32, DType::kF32);
    ASSERT_TRUE(q.is_ok()) << q.status().to_string();
    EXPECT_EQ(q->w.shape(), (Shape{3, 128 * bits / 32}));
    auto deq = affine_dequantize(q->w, q->scales, q->biases, bits, 32, 128);
    ASSERT_TRUE(deq.is_ok());
    // Codes are nearest values, so within half a step; the top code also takes
    // values the zero-exact scale adjustment pushed past the range (MLX clips them).
    for (int64_t r = 0; r < 3; ++r)
      for (int64_t j = 0; j < 128; ++j) {
        float step = std::fabs(q->scales.data_as<float>()[r * 4 + j / 32]);
        uint32_t code = unpack_code(q->w.data_as<uint32_t>() + r * (128 * bits / 32), j, bits);
        float limit = code == (1u << bits) - 1 ? 2.0f * step : 0.5f * step;
        EXPECT_LE(std::fabs(deq->data_as<float>()[r * 128 + j] - w.data_as<float>()[r * 128 + j]), limit + 1e-6f)
            << bits << "-bit r=" << r << " j=" << j;
      }
  }
}

TEST(Quantize, FollowsMlxEdgeRuleAndKeepsZeroRepresentable) {
  // Group 0 has its larger magnitude at the negative edge (positive scale), group 1
  // at the positive edge (negative scale); both contain 0.
  std::vector<float> v(64);
  for (int i = 0; i < 32; ++i) v[i] = -3.0f + 0.1f * i;   // min -3.0, max 0.1
  for (int i = 32; i < 64; ++i) v[i] = -0.5f + 0.2f * (i - 32);  // min -0.5, max 5.7
  v[5] = 0.0f;
  v[40] = 0.0f;
  Tensor w = f32({1, 64}, v);
  auto q = affine_quantize(w, 4, 32, DType::kF32).value();
  const float* s = q.scales.data_as<float>();
  const float* b = q.biases.data_as<float>();
  EXPECT_GT(s[0], 0.f);
  EXPECT_FLOAT_EQ(b[0], -3.0f) << "bias is the edge";
  EXPECT_LT(s[1], 0.f) << "a larger positive edge makes the scale negative";
  EXPECT_FLOAT_EQ(b[1], 5.7f);
  auto deq = affine_dequantize(q.w, q.scales, q.biases, 4, 32, 64).value();
  EXPECT_NEAR(deq.data_as<float>()[5], 0.0f, 1e-6f);
  EXPECT_NEAR(deq.data_as<float>()[40], 0.0f, 1e-6f);
}

TEST(Quantize, RejectsBadParameters) {
  Tensor w = random_f32({2, 64}, 3);
  EXPECT_FALSE(affine_quantize(w, 7, 32, DType::kF32).is_ok());
  EXPECT_FALSE(affine_quantize(w, 4, 48, DType::kF32).is_ok());
  EXPECT_FALSE(affine_quantize(random_f32({2, 40}, 3), 4, 32, DType::kF32).is_ok());
}

// --- the op --------------------------------------------------------------------

struct Experts {
  int64_t e, n, k;
  int group_size;
  std::vector<int> bits;  // per expert
  Tensor w, scales, biases;
  std::vector<Tensor> dense;  // per expert, f32 [n, k] original weights
};

// Quantizes random experts; each expert's packed block is appended to one u32 buffer.
Experts make_experts(int64_t e, int64_t n, int64_t k, int gs, std::vector<int> bits, DType scale_dtype, uint32_t seed) {
  Experts x{e, n, k, gs, bits, {}, {}, {}, {}};
  std::vector<uint32_t> words;
  std::vector<uint8_t> sb, bb;
  const size_t ssz = dtype_size(scale_dtype);
  for (int64_t i = 0; i < e; ++i) {
    Tensor d = random_f32({n, k}, seed + static_cast<uint32_t>(i), 0.05f);
    x.dense.push_back(d);
    int b = bits[i] ? bits[i] : 4;  // a pruned expert still has (unused) scales and biases
    auto q = affine_quantize(d, b, gs, scale_dtype).value();
    if (bits[i]) words.insert(words.end(), q.w.data_as<uint32_t>(), q.w.data_as<uint32_t>() + q.w.numel());
    sb.insert(sb.end(), (const uint8_t*)q.scales.data(), (const uint8_t*)q.scales.data() + q.scales.numel() * ssz);
    bb.insert(bb.end(), (const uint8_t*)q.biases.data(), (const uint8_t*)q.biases.data() + q.biases.numel() * ssz);
  }
  x.w = Tensor::from_vector<uint32_t>(DType::kU32, {static_cast<int64_t>(words.size())}, words).value();
  x.scales = Tensor::zeros(scale_dtype, {e, n, k / gs}).value();
  x.biases = Tensor::zeros(scale_dtype, {e, n, k / gs}).value();
  std::memcpy(x.scales.mutable_data(), sb.data(), sb.size());
  std::memcpy(x.biases.mutable_data(), bb.data(), bb.size());
  return x;
}

bool uniform(const Experts& x) {
  for (int b : x.bits)
    if (b != x.bits[0] || b == 0) return false;
  return true;
}

// A program computing GatherQmm over runtime indices; weights come in as inputs.
std::vector<uint8_t> build_gqmm(const Experts& x, DType xdt, bool with_lhs, IntOrValue sorted = 0) {
  ProgramBuilder b;
  TensorRef in = b.input("x", xdt, {Dim::dynamic(1, 64), x.k});
  QuantizedExperts q;
  q.w = uniform(x) ? b.input("w", DType::kU32, {x.e, x.n, x.k * x.bits[0] / 32}) : b.input("w", DType::kU32, {x.w.numel()});
  q.scales = b.input("scales", x.scales.dtype(), {x.e, x.n, x.k / x.group_size});
  q.biases = b.input("biases", x.biases.dtype(), {x.e, x.n, x.k / x.group_size});
  q.group_size = x.group_size;
  if (uniform(x)) q.bits = x.bits[0];
  else q.expert_bits.assign(x.bits.begin(), x.bits.end());
  GatherOptions o;
  o.rhs_indices = b.input("rhs", DType::kI32, {Dim::dynamic(1, 256)});
  if (with_lhs) o.lhs_indices = b.input("lhs", DType::kI32, {Dim::dynamic(1, 256)});
  o.sorted_indices = sorted;
  b.output("out", b.gather_qmm(in, q, o));
  auto bytes = b.serialize();
  EXPECT_TRUE(bytes.is_ok()) << bytes.status().to_string();
  return bytes.is_ok() ? *bytes : std::vector<uint8_t>{};
}

Tensor i32(std::vector<int32_t> v) { return Tensor::from_vector<int32_t>(DType::kI32, {(int64_t)v.size()}, v).value(); }

Result<Tensor> run_gqmm(const std::vector<uint8_t>& program, const Experts& x, const Tensor& in, std::vector<int32_t> rhs,
                        std::vector<int32_t> lhs = {}) {
  auto p = Program::from_bytes(program, "gqmm");
  if (!p.is_ok()) return p.status();
  SB_ASSIGN_OR_RETURN(auto s, Session::create(*p));
  Tensor w = uniform(x) ? x.w.reshaped({x.e, x.n, x.k * x.bits[0] / 32}).value() : x.w;
  SB_RETURN_IF_ERROR(s->set_input("x", in));
  SB_RETURN_IF_ERROR(s->set_input("w", w));
  SB_RETURN_IF_ERROR(s->set_input("scales", x.scales));
  SB_RETURN_IF_ERROR(s->set_input("biases", x.biases));
  SB_RETURN_IF_ERROR(s->set_input("rhs", i32(rhs)));
  if (!lhs.empty()) SB_RETURN_IF_ERROR(s->set_input("lhs", i32(lhs)));
  SB_RETURN_IF_ERROR(s->execute());
  return s->output("out");
}

// The contract of docs/numerics.md written out independently of the kernel:
// power-of-two int8 blocks of 32, exact integer dots, then per group
// acc = acc + (s * P + b * X) with P, X summed over the group's blocks in order.
float oracle(const Experts& x, const std::vector<float>& xrow, int e, int64_t n) {
  const int bits = x.bits[e];
  int64_t off = 0;
  for (int i = 0; i < e; ++i) off += x.n * x.k * x.bits[i] / 32;
  const uint32_t* row = x.w.data_as<uint32_t>() + off + n * (x.k * bits / 32);
  float acc = 0.0f;
  for (int64_t g = 0; g < x.k / x.group_size; ++g) {
    float p = 0.0f, s = 0.0f;
    for (int64_t j = g * x.group_size / 32; j < (g + 1) * x.group_size / 32; ++j) {
      float amax = 0.0f;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xrow[j * 32 + i]));
      int sh = 0;
      if (amax >= 0x1p-100f) {
        sh = 6 - std::ilogb(amax);
        if (std::nearbyint(std::ldexp(amax, sh)) > 127) --sh;
      }
      int32_t iq = 0, ix = 0;
      for (int i = 0; i < 32; ++i) {
        int q = amax >= 0x1p-100f ? static_cast<int>(std::nearbyint(std::ldexp(xrow[j * 32 + i], sh))) : 0;
        iq += static_cast<int32_t>(unpack_code(row, j * 32 + i, bits)) * q;
        ix += q;
      }
      const float d = amax >= 0x1p-100f ? std::ldexp(1.0f, -sh) : 0.0f;
      p = p + static_cast<float>(iq) * d;
      s = s + static_cast<float>(ix) * d;
    }
    const int64_t si = (e * x.n + n) * (x.k / x.group_size) + g;
    const float sc = x.scales.to_doubles()[si], bi = x.biases.to_doubles()[si];
    acc = acc + (sc * p + bi * s);
  }
  return acc;
}

TEST(GatherQmm, MatchesTheContractOracleBitwiseForEveryWidthAndGroupSize) {
  for (int bits : kAllBits)
    for (int gs : {32, 64, 128})
      for (DType sdt : {DType::kF32, DType::kF16, DType::kBF16}) {
        SCOPED_TRACE(strformat("bits %d, group %d, scales %s", bits, gs, dtype_name(sdt)));
        Experts x = make_experts(3, 24, 256, gs, {bits, bits, bits}, sdt, 100 + bits);
        Tensor in = random_f32({4, 256}, 7);
        std::vector<int32_t> rhs = {2, 0, 1, 2, 2, 0, 1, 1};
        auto out = run_gqmm(build_gqmm(x, DType::kF32, false), x, in, rhs);
        ASSERT_TRUE(out.is_ok()) << out.status().to_string();
        ASSERT_EQ(out->shape(), (Shape{8, 24}));
        for (int64_t p = 0; p < 8; ++p) {
          std::vector<float> row(in.data_as<float>() + (p / 2) * 256, in.data_as<float>() + (p / 2 + 1) * 256);
          for (int64_t n = 0; n < 24; ++n)
            ASSERT_EQ(f32_bits(out->data_as<float>()[p * 24 + n]), f32_bits(oracle(x, row, rhs[p], n)))
                << "pair " << p << " row " << n;
        }
      }
}

// Accuracy against fp64 math on the dequantized weights and the unquantized
// activations: the only approximation is the int8 activation rounding, at most
// half a block step d/2 per element, so |err| <= sum_k |w_k| * d_k / 2 (+ f32 rounding).
TEST(GatherQmm, AccuracyAgainstFp64IsWithinTheActivationRoundingBound) {
  Experts x = make_experts(2, 32, 512, 64, {4, 4}, DType::kF16, 5);
  Tensor in = random_f32({3, 512}, 11);
  std::vector<int32_t> rhs = {0, 1, 1, 0, 0, 1};
  auto out = run_gqmm(build_gqmm(x, DType::kF32, false), x, in, rhs).value();
  double worst_rel = 0;
  for (int64_t p = 0; p < 6; ++p) {
    Tensor deq = affine_dequantize(x.w.reshaped({2 * 32, 512 * 4 / 32}).value(),
                                   x.scales.reshaped({64, 8}).value(), x.biases.reshaped({64, 8}).value(), 4, 64, 512)
                     .value();
    const float* xr = in.data_as<float>() + (p / 2) * 512;
    for (int64_t n = 0; n < 32; ++n) {
      double ref = 0, bound = 0, mag = 0;
      for (int64_t k = 0; k < 512; ++k) {
        double wv = deq.data_as<float>()[(rhs[p] * 32 + n) * 512 + k];
        ref += wv * xr[k];
        mag += std::fabs(wv * xr[k]);
        float amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xr[(k / 32) * 32 + i]));
        bound += std::fabs(wv) * std::ldexp(1.0, std::ilogb(amax) - 5) * 0.5;  // d <= 2^(ilogb(amax) - 5)
      }
      double err = std::fabs(out.data_as<float>()[p * 32 + n] - ref);
      EXPECT_LE(err, bound + 1e-5 * mag) << "pair " << p << " row " << n;
      worst_rel = std::max(worst_rel, err / (mag + 1e-30));
    }
  }
  std::printf("GatherQmm worst |err| / sum|w x| vs fp64: %.3g\n", worst_rel);
}

TEST(GatherQmm, MixedBitsEqualEachBitGroupRunSeparately) {
  std::vector<int> bits = {8, 4, 2, 0, 4, 3, 6, 5};
  Experts mixed = make_experts(8, 16, 128, 64, bits, DType::kBF16, 21);
  Tensor in = random_f32({5, 128}, 13);
  std::vector<int32_t> rhs = {0, 1, 2, 4, 5, 6, 7, 1, 0, 2};
  auto out = run_gqmm(build_gqmm(mixed, DType::kF32, false), mixed, in, rhs);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  for (size_t p = 0; p < rhs.size(); ++p) {
    // The same expert alone, as a one-expert uniform node.
    int e = rhs[p];
    Experts one = make_experts(1, 16, 128, 64, {bits[e]}, DType::kBF16, 21 + e);
    auto single = run_gqmm(build_gqmm(one, DType::kF32, true), one, in, {0}, {static_cast<int32_t>(p / 2)});
    ASSERT_TRUE(single.is_ok()) << single.status().to_string();
    for (int64_t n = 0; n < 16; ++n)
      ASSERT_EQ(f32_bits(out->data_as<float>()[p * 16 + n]), f32_bits(single->data_as<float>()[n]))
          << "pair " << p << " (expert " << e << ", " << bits[e] << "-bit) row " << n;
  }
}

TEST(GatherQmm, PrunedExpertIsAnError) {
  Experts x = make_experts(3, 8, 64, 32, {4, 0, 2}, DType::kF32, 3);
  auto out = run_gqmm(build_gqmm(x, DType::kF32, false), x, random_f32({1, 64}, 1), {0, 1});
  ASSERT_FALSE(out.is_ok());
  EXPECT_NE(out.status().message().find("selects expert 1, which is pruned"), std::string::npos) << out.status().message();
}

TEST(GatherQmm, OutOfRangeIndicesAreErrors) {
  Experts x = make_experts(2, 8, 64, 32, {4, 4}, DType::kF32, 3);
  auto bytes = build_gqmm(x, DType::kF32, true);
  auto bad_e = run_gqmm(bytes, x, random_f32({2, 64}, 1), {0, 2}, {0, 1});
  EXPECT_NE(bad_e.status().message().find("rhs_indices[1] = 2 out of range [0, 2)"), std::string::npos)
      << bad_e.status().message();
  auto bad_row = run_gqmm(bytes, x, random_f32({2, 64}, 1), {0, 1}, {0, 5});
  EXPECT_NE(bad_row.status().message().find("lhs_indices[1] = 5 out of range [0, 2)"), std::string::npos)
      << bad_row.status().message();
  auto negative = run_gqmm(bytes, x, random_f32({2, 64}, 1), {-1, 1}, {0, 1});
  EXPECT_FALSE(negative.is_ok());
}

TEST(GatherQmm, SortedScheduleGivesTheSameBits) {
  Experts x = make_experts(4, 40, 128, 64, {4, 4, 4, 4}, DType::kF16, 9);
  Tensor in = random_f32({6, 128}, 2);
  std::vector<int32_t> rhs = {3, 0, 2, 0, 1, 3, 2, 2, 1, 0, 3, 1};
  std::vector<int32_t> lhs = {0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5};
  auto unsorted = run_gqmm(build_gqmm(x, DType::kF32, true, 0), x, in, rhs, lhs).value();
  std::vector<int> order(rhs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return rhs[a] < rhs[b]; });
  std::vector<int32_t> srhs, slhs;
  for (int i : order) srhs.push_back(rhs[i]), slhs.push_back(lhs[i]);
  auto sorted = run_gqmm(build_gqmm(x, DType::kF32, true, 1), x, in, srhs, slhs).value();
  for (size_t i = 0; i < order.size(); ++i)
    for (int64_t n = 0; n < 40; ++n)
      ASSERT_EQ(f32_bits(sorted.data_as<float>()[i * 40 + n]), f32_bits(unsorted.data_as<float>()[order[i] * 40 + n]));
  // Claiming sorted indices that are not sorted is refused.
  auto liar = run_gqmm(build_gqmm(x, DType::kF32, true, 1), x, in, rhs, lhs);
  EXPECT_NE(liar.status().message().find("sorted_indices is set"), std::string::npos);
}

TEST(GatherQmm, BitsAndShapesAreValidated) {
  Experts x = make_experts(2, 8, 64, 32, {4, 4}, DType::kF32, 3);
  ProgramBuilder b;
  TensorRef in = b.input("x", DType::kF32, {1, 64});
  QuantizedExperts q{b.input("w", DType::kU32, {2, 8, 64 * 7 / 32}), b.input("s", DType::kF32, {2, 8, 2}),
                     b.input("b", DType::kF32, {2, 8, 2}), 7, 32, {}};
  b.output("y", b.gather_qmm(in, q, {{}, b.input("r", DType::kI32, {1})}));
  auto r = b.serialize();
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("GatherQmm.bits: 7 not in {2,3,4,5,6,8}"), std::string::npos)
      << r.status().message();

  ProgramBuilder c;
  TensorRef cx = c.input("x", DType::kF32, {1, 64});
  QuantizedExperts cq{c.input("w", DType::kU32, {64}), c.input("s", DType::kF32, {2, 8, 2}),
                      c.input("b", DType::kF32, {2, 8, 2}), 4, 32, {4, 9}};
  c.output("y", c.gather_qmm(cx, cq, {{}, c.input("r", DType::kI32, {1})}));
  EXPECT_NE(c.serialize().status().message().find("expert_bits[1]: 9 not in {0,2,3,4,5,6,8}"), std::string::npos);

  ProgramBuilder d;
  TensorRef dx = d.input("x", DType::kF32, {1, 64});
  QuantizedExperts dq{d.input("w", DType::kU32, {2, 8, 8}), d.input("s", DType::kF32, {2, 8, 3}),
                      d.input("b", DType::kF32, {2, 8, 3}), 4, 32, {}};
  d.output("y", d.gather_qmm(dx, dq, {{}, d.input("r", DType::kI32, {1})}));
  EXPECT_NE(d.serialize().status().message().find("GatherQmm.scales: must be [E, N, K/group_size]"), std::string::npos);
}

}  // namespace
}  // namespace switchboard

namespace switchboard {
namespace {

// Caps the CPU path for one scope.
struct PathLimit {
  explicit PathLimit(cpu::CpuPath p) { cpu::set_cpu_path_limit(p); }
  ~PathLimit() { cpu::set_cpu_path_limit(cpu::CpuPath::kAmx); }
};

// The fast paths this CPU can run, each said aloud: ran or skipped, and why.
std::vector<cpu::CpuPath> fast_paths_here() {
  std::vector<cpu::CpuPath> out;
  for (cpu::CpuPath p : {cpu::CpuPath::kAvx2, cpu::CpuPath::kAvx512Vnni, cpu::CpuPath::kAmx}) {
    if (cpu::best_cpu_path() < p) {
      std::printf("[ SKIPPED-PATH ] %s: %s\n", cpu::cpu_path_name(p),
                  p == cpu::CpuPath::kAmx ? "this CPU has no AMX (or the OS did not grant tile data)"
                                          : "this CPU cannot run it");
      continue;
    }
    std::printf("[ RAN-PATH     ] %s\n", cpu::cpu_path_name(p));
    out.push_back(p);
  }
  return out;
}

// Every width (3/5/6 through the 8-bit expansion), row tails (N = 40), 1..7 tokens
// per expert run, sorted and unsorted schedules: fast and portable paths agree bitwise.
TEST(GatherQmm, EverySimdPathMatchesThePortablePathBitwise) {
  std::printf("[   INFO   ] best CPU path here: %s\n", cpu::cpu_path_name(cpu::best_cpu_path()));
  const std::vector<cpu::CpuPath> paths = fast_paths_here();
  std::vector<int> bits = {2, 3, 4, 5, 6, 8, 4, 2};
  for (int gs : {32, 128}) {
    Experts x = make_experts(8, 40, 256, gs, bits, DType::kF16, 31 + gs);
    Tensor in = random_f32({7, 256}, 17);
    std::vector<int32_t> rhs, lhs;
    for (int e = 0; e < 8; ++e)
      for (int t = 0; t <= e % 7; ++t) rhs.push_back(e), lhs.push_back((e + t) % 7);
    auto program = build_gqmm(x, DType::kF32, true, 1);
    Tensor portable;
    {
      PathLimit limit(cpu::CpuPath::kPortable);
      portable = run_gqmm(program, x, in, rhs, lhs).value();
    }
    for (cpu::CpuPath p : paths) {
      PathLimit limit(p);
      ASSERT_EQ(cpu::active_cpu_path(), p);
      Tensor fast = run_gqmm(program, x, in, rhs, lhs).value();
      ASSERT_EQ(std::memcmp(fast.data(), portable.data(), fast.nbytes()), 0)
          << cpu::cpu_path_name(p) << ", group size " << gs;
    }
  }
}

// Long runs on one expert (prefill, the sorted schedule) are where AMX takes
// over: tiles of 16 token rows, a last partial tile of >= kAmxMinRows rows
// zero-padded, fewer rows on the VNNI kernels. Each of 8 experts gets one run
// length around those edges; every width (and mixed), every group size, N = 72 (a 64-row
// work item, then a tail tile of 8 rows), an odd block count (K = 224 at
// group 32), a zero row (d = 0) and a large-magnitude row. All bitwise.
TEST(GatherQmm, LongExpertRunsMatchThePortablePathBitwiseOnEveryPath) {
  std::printf("[   INFO   ] best CPU path here: %s; AMX takes runs of >= %lld rows\n",
              cpu::cpu_path_name(cpu::best_cpu_path()), (long long)cpu::x86::kAmxMinRows);
  const std::vector<cpu::CpuPath> paths = fast_paths_here();
  const std::vector<int> run_lengths = {1, 7, 8, 15, 16, 17, 33, 64};
  const int64_t n = 72, tokens = 64;
  for (int bits : {2, 3, 4, 5, 6, 8, 0})  // 0: mixed, one width per expert
    for (int gs : {32, 64, 128}) {
      const int64_t k = gs == 32 ? 224 : 384;
      const DType sdt = bits % 3 == 0 ? DType::kF32 : bits % 3 == 1 ? DType::kF16 : DType::kBF16;
      SCOPED_TRACE(strformat("bits %d, group %d, K %lld, scales %s", bits, gs, (long long)k, dtype_name(sdt)));
      const std::vector<int> widths = bits ? std::vector<int>(8, bits) : std::vector<int>{8, 2, 4, 3, 6, 5, 2, 4};
      Experts x = make_experts(8, n, k, gs, widths, sdt, 700 + bits * 10 + gs);
      Tensor in = random_f32({tokens, k}, 41 + bits);
      float* xin = in.mutable_data_as<float>();
      for (int64_t i = 0; i < k; ++i) xin[5 * k + i] = 0.0f, xin[9 * k + i] *= 1e4f;
      std::vector<int32_t> rhs, lhs;
      for (int e = 0; e < 8; ++e)
        for (int t = 0; t < run_lengths[e]; ++t) rhs.push_back(e), lhs.push_back((e * 13 + t * 7) % tokens);
      auto program = build_gqmm(x, DType::kF32, true, 1);
      Tensor portable;
      {
        PathLimit limit(cpu::CpuPath::kPortable);
        portable = run_gqmm(program, x, in, rhs, lhs).value();
      }
      for (cpu::CpuPath p : paths) {
        PathLimit limit(p);
        ASSERT_EQ(cpu::active_cpu_path(), p);
        Tensor fast = run_gqmm(program, x, in, rhs, lhs).value();
        ASSERT_EQ(fast.shape(), portable.shape());
        const uint32_t* a = reinterpret_cast<const uint32_t*>(fast.data());
        const uint32_t* b = reinterpret_cast<const uint32_t*>(portable.data());
        for (int64_t i = 0; i < fast.numel(); ++i)
          ASSERT_EQ(a[i], b[i]) << cpu::cpu_path_name(p) << ": pair " << i / n << " (expert " << rhs[i / n] << ", "
                                << widths[rhs[i / n]] << "-bit, run of " << run_lengths[rhs[i / n]]
                                << " rows), output row " << i % n;
      }
    }
}

}  // namespace
}  // namespace switchboard
