// moe_experts: the sorted and unsorted lowerings give identical bits for every
// token count, static token counts fold the If away, and the result matches a
// composition of the individual ops.
#include <random>

#include "gather_qmm.h"
#include "quantize.h"
#include "test_util.h"

namespace switchboard {
namespace {
using namespace switchboard::testing;

constexpr int64_t kD = 64, kF = 32, kE = 8, kK = 2;

Tensor random(Shape shape, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, scale);
  Tensor t = Tensor::zeros(DType::kF32, shape).value();
  for (int64_t i = 0; i < t.numel(); ++i) t.mutable_data_as<float>()[i] = dist(rng);
  return t;
}

struct Weights {
  std::vector<std::pair<std::string, Tensor>> inputs;
};

// gate/up [E, F, D] and down [E, D, F], 4-bit, group 32, bf16 scales.
Weights make_weights() {
  Weights w;
  auto proj = [&](const std::string& name, int64_t n, int64_t k, uint32_t seed) {
    auto q = affine_quantize(random({kE * n, k}, seed, 0.1f), 4, 32, DType::kBF16).value();
    w.inputs.emplace_back(name + ".w", q.w.reshaped({kE, n, k * 4 / 32}).value());
    w.inputs.emplace_back(name + ".s", q.scales.reshaped({kE, n, k / 32}).value());
    w.inputs.emplace_back(name + ".b", q.biases.reshaped({kE, n, k / 32}).value());
  };
  proj("gate", kF, kD, 1);
  proj("up", kF, kD, 2);
  proj("down", kD, kF, 3);
  return w;
}

QuantizedExperts declare(ProgramBuilder& b, const std::string& name, int64_t n, int64_t k) {
  QuantizedExperts q;
  q.w = b.input(name + ".w", DType::kU32, {kE, n, k * 4 / 32});
  q.scales = b.input(name + ".s", DType::kBF16, {kE, n, k / 32});
  q.biases = b.input(name + ".b", DType::kBF16, {kE, n, k / 32});
  q.group_size = 32;
  return q;
}

// Router (top-k on logits, softmax over the k) + experts + sigmoid-gated shared input.
std::vector<uint8_t> build(Dim m, int64_t cutoff) {
  ProgramBuilder b;
  TensorRef x = b.input("x", DType::kF32, {m, kD});
  TensorRef logits = b.input("logits", DType::kF32, {m, kE});
  TensorRef shared = b.input("shared", DType::kF32, {m, kD});
  TensorRef gate = b.input("gate", DType::kF32, {m, 1});
  MoeExperts e{declare(b, "gate", kF, kD), declare(b, "up", kF, kD), declare(b, "down", kD, kF)};
  e.sort_cutoff = cutoff;
  RouterOut r = b.router(logits, RouterSpec{RouterKind::kTopKSoftmax, kK});
  b.output("y", b.moe_experts(x, r.weights, r.indices, e, shared, gate));
  auto bytes = b.serialize();
  EXPECT_TRUE(bytes.is_ok()) << bytes.status().to_string();
  return bytes.is_ok() ? *bytes : std::vector<uint8_t>{};
}

class Runner {
 public:
  explicit Runner(const std::vector<uint8_t>& bytes) : session_(Session::create(load(bytes)).value()) {
    for (const auto& [name, t] : weights_.inputs) EXPECT_TRUE(session_->set_input(name, t).is_ok());
  }
  Tensor run(int64_t m) {
    EXPECT_TRUE(session_->set_input("x", random({m, kD}, 100 + m, 1.0f)).is_ok());
    EXPECT_TRUE(session_->set_input("logits", random({m, kE}, 200 + m, 2.0f)).is_ok());
    EXPECT_TRUE(session_->set_input("shared", random({m, kD}, 300 + m, 0.5f)).is_ok());
    EXPECT_TRUE(session_->set_input("gate", random({m, 1}, 400 + m, 1.0f)).is_ok());
    Status st = session_->execute();
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    return st.is_ok() ? *session_->output("y") : Tensor();
  }

 private:
  Weights weights_ = make_weights();
  std::unique_ptr<Session> session_;
};

void expect_bitwise_equal(const Tensor& a, const Tensor& b, int64_t m) {
  ASSERT_EQ(a.shape(), b.shape()) << "M=" << m;
  ASSERT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << "sorted and unsorted differ at M=" << m;
}

TEST(MoeExperts, SortedAndUnsortedPathsAreBitwiseIdentical) {
  Runner always_sorted(build(Dim::dynamic(1, 512), 0));
  Runner never_sorted(build(Dim::dynamic(1, 512), 1 << 20));
  // Every M on the fast path; the portable path (CPUs without AVX-512 VNNI) is
  // ~20x slower under the sanitizers, so it runs every M to 128 and a stride above.
  const bool fast = cpu::fast_paths_enabled();
  if (!fast) std::printf("[   NOTE   ] portable path: M = 1..128 and every 29th M up to 512\n");
  for (int64_t m = 1; m <= 512; ++m)
    if (fast || m <= 128 || m % 29 == 0 || m == 512) expect_bitwise_equal(always_sorted.run(m), never_sorted.run(m), m);
}

TEST(MoeExperts, DynamicTokenCountEmitsOneIfAndTakesBothBranches) {
  auto bytes = build(Dim::dynamic(1, 512), 4);
  EXPECT_EQ(op_counts(bytes)["If"], 1);
  EXPECT_EQ(op_counts(bytes)["Argsort"], 1) << "the sorted branch";
  Runner dynamic(bytes);
  Runner reference(build(Dim::dynamic(1, 512), 1 << 20));
  for (int64_t m : {1, 4, 5, 9}) expect_bitwise_equal(dynamic.run(m), reference.run(m), m);
}

TEST(MoeExperts, StaticTokenCountFoldsToOnePath) {
  auto decode = op_counts(build(1, 4));
  EXPECT_EQ(decode["If"], 0);
  EXPECT_EQ(decode["Argsort"], 0) << "M = 1 <= cutoff: unsorted only";
  EXPECT_EQ(decode["Combine"], 0) << "the unsorted path fuses combine into the down projection";
  EXPECT_EQ(decode["GatherQmm"], 3);
  auto prefill = op_counts(build(16, 4));
  EXPECT_EQ(prefill["If"], 0);
  EXPECT_EQ(prefill["Argsort"], 1);
  EXPECT_EQ(prefill["ScatterRows"], 1);
  EXPECT_EQ(prefill["Combine"], 1);
  EXPECT_EQ(prefill["SymSize"] + prefill["IntArith"], 0);
}

TEST(MoeExperts, CutoffIsRecordedAsAProgramAttribute) {
  auto p = load(build(Dim::dynamic(1, 512), 6));
  int64_t v = 0;
  ASSERT_TRUE(p->attribute("moe.sort_cutoff", &v));
  EXPECT_EQ(v, 6);
}

}  // namespace
}  // namespace switchboard
