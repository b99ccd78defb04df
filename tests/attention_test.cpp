// The Attention op (schema AttentionNode) against the decomposed ops the decoder used before
// (BatchMatmul, Mul, mask Add, [Concat sink,] Softmax, BatchMatmul): the same bits on every
// device, for every dtype, with grouped heads, prefill and decode rows, windows and sinks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "op_harness.h"

namespace switchboard {
namespace {

using optest::Inputs;

struct Case {
  DType dt;
  int64_t m, pos, hq, hk, hd, cache, window;
  bool sinks;
};

// v as the f32 nearest, then rounded to t: what Full stores.
float as_dtype(double v, DType t) { return static_cast<float>(optest::round_to(t, static_cast<float>(v))); }

// The decoder's former attention over the same operands (decoder.cpp before schema v5).
TensorRef decomposed(ProgramBuilder& b, const Case& c, TensorRef q, TensorRef kc, TensorRef vc, TensorRef positions,
                     TensorRef sinks, float scale, double big) {
  const DType f32 = DType::kF32;
  const int64_t len = c.pos + c.m;
  TensorRef qp = b.reshape(b.slice(positions, 0, c.pos, len), {c.m, 1});
  TensorRef kp = b.reshape(b.slice(positions, 0, 0, len), {1, len});
  TensorRef d = b.sub(kp, qp);
  TensorRef zero = b.full({1}, f32, 0.0), one = b.full({1}, f32, 1.0);
  TensorRef blocked = b.minimum(b.maximum(d, zero), one);
  if (c.window > 0)
    blocked = b.add(blocked, b.minimum(b.maximum(b.sub(b.full({1}, f32, 1.0 - c.window), d), zero), one));
  TensorRef mask = b.mul(blocked, b.full({1}, f32, -big));
  if (c.dt != f32) mask = b.cast(mask, c.dt);
  TensorRef keys = b.slice(kc, 1, 0, len), values = b.slice(vc, 1, 0, len);
  TensorRef scores = b.batch_matmul(b.transpose(q, {1, 0, 2}), keys);
  scores = b.add(b.mul(scores, b.full({1}, c.dt, scale)), mask);
  TensorRef probs;
  if (c.sinks) {
    TensorRef column = b.add(b.reshape(sinks, {c.hq, 1, 1}), b.full({1, c.m, 1}, c.dt, 0.0));
    probs = b.slice(b.softmax(b.concat({scores, column}, 2)), 2, 0, len);
  } else {
    probs = b.softmax(scores);
  }
  TensorRef o = b.batch_matmul(probs, values, false);
  return b.reshape(b.transpose(o, {1, 0, 2}), {c.m, c.hq * c.hd});
}

Tensor random(DType t, const Shape& shape, std::mt19937& rng, double scale) {
  std::normal_distribution<double> dist(0.0, scale);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = dist(rng);
  return optest::make(t, shape, v);
}

void check(const Case& c) {
  SCOPED_TRACE(::testing::Message() << dtype_name(c.dt) << " m=" << c.m << " pos=" << c.pos << " hq=" << c.hq
                                    << " hk=" << c.hk << " hd=" << c.hd << " window=" << c.window
                                    << " sinks=" << c.sinks);
  ProgramBuilder b;
  TensorRef q = b.input("q", c.dt, {c.m, c.hq, c.hd});
  TensorRef kc = b.input("k", c.dt, {c.hk, c.cache, c.hd});
  TensorRef vc = b.input("v", c.dt, {c.hk, c.cache, c.hd});
  TensorRef positions = b.input("positions", DType::kF32, {c.cache});
  TensorRef sinks = c.sinks ? b.input("sinks", c.dt, {c.hq}) : TensorRef{};
  const double big = c.dt == DType::kF16 ? 65504.0 : 1e30;
  const float scale = as_dtype(1.0 / std::sqrt(static_cast<double>(c.hd)), c.dt);
  const float mask_value = as_dtype(static_cast<float>(-big), c.dt);
  b.output("fused", b.attention(q, kc, vc, c.pos, scale, mask_value, c.window, sinks));
  b.output("reference", decomposed(b, c, q, kc, vc, positions, sinks, scale, big));
  std::mt19937 rng(static_cast<uint32_t>(c.m * 131 + c.pos * 17 + c.hd + c.window));
  Inputs in{{"q", random(c.dt, {c.m, c.hq, c.hd}, rng, 1.0)},
            {"k", random(c.dt, {c.hk, c.cache, c.hd}, rng, 1.0)},
            {"v", random(c.dt, {c.hk, c.cache, c.hd}, rng, 1.0)}};
  std::vector<double> p(static_cast<size_t>(c.cache));
  for (int64_t i = 0; i < c.cache; ++i) p[static_cast<size_t>(i)] = static_cast<double>(i);
  in["positions"] = optest::make(DType::kF32, {c.cache}, p);
  if (c.sinks) in["sinks"] = random(c.dt, {c.hq}, rng, 1.0);
  Tensor first;
  bool have_first = false;
  optest::detail::for_each_device(b, in, [&](const Program&, Session& s, const std::string& dev) {
    Status st = s.execute();
    ASSERT_TRUE(st.is_ok()) << dev << ": " << st.to_string();
    auto fused = s.output("fused"), ref = s.output("reference");
    ASSERT_TRUE(fused.is_ok() && ref.is_ok());
    ASSERT_EQ(fused->shape(), ref->shape()) << dev;
    EXPECT_EQ(std::memcmp(fused->data(), ref->data(), ref->nbytes()), 0) << dev << ": not the decomposed ops' bits";
    if (!have_first) {
      first = *fused;
      have_first = true;
    } else {
      EXPECT_EQ(std::memcmp(fused->data(), first.data(), first.nbytes()), 0) << dev << ": differs from the CPU";
    }
  });
}

TEST(Attention, SameBitsAsTheDecomposedOps) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    check({dt, 1, 5, 4, 2, 8, 12, 0, false});    // decode, grouped heads
    check({dt, 4, 0, 4, 4, 8, 12, 0, false});    // prefill from 0
    check({dt, 3, 6, 6, 2, 16, 12, 0, false});   // prefill after a prompt
    check({dt, 5, 2, 4, 1, 8, 12, 3, false});    // sliding window
    check({dt, 2, 3, 4, 2, 8, 12, 0, true});     // attention sinks
    check({dt, 1, 40, 2, 1, 64, 64, 16, true});  // long row, window and sinks
  }
  // Rows of more than 128 keys and head dims beyond 32 and 128 (the GPU's strides).
  check({DType::kBF16, 2, 200, 2, 1, 160, 256, 0, false});
  check({DType::kF32, 1, 300, 2, 2, 40, 320, 100, true});
  // Past 4,096 scores a row leaves the GPU's shared memory for a scratch buffer.
  check({DType::kBF16, 2, 4200, 2, 1, 32, 4224, 0, true});
}

TEST(Attention, PositionPastTheCacheIsAnError) {
  ProgramBuilder b;
  TensorRef q = b.input("q", DType::kF32, {2, 2, 4});
  TensorRef kc = b.input("k", DType::kF32, {1, 6, 4});
  b.output("o", b.attention(q, kc, kc, 5, 0.5f, -1e30f));
  optest::check_op_error(b,
                         {{"q", optest::make(DType::kF32, {2, 2, 4}, std::vector<double>(16, 0.5))},
                          {"k", optest::make(DType::kF32, {1, 6, 4}, std::vector<double>(24, 0.25))}},
                         "pos 5 + 2 queries exceeds the cache length 6");
}

TEST(Attention, RulesNameTheField) {
  ProgramBuilder b;
  TensorRef q = b.input("q", DType::kF32, {2, 3, 4});
  TensorRef kc = b.input("k", DType::kF32, {2, 6, 4});
  b.output("o", b.attention(q, kc, kc, 0, 0.5f, -1e30f));
  EXPECT_NE(b.status().message().find("3 heads are not a multiple of the cache's 2"), std::string::npos)
      << b.status().to_string();
  ProgramBuilder b2;
  TensorRef q2 = b2.input("q", DType::kF32, {2, 2, 4});
  TensorRef k2 = b2.input("k", DType::kBF16, {1, 6, 4});
  b2.output("o", b2.attention(q2, k2, k2, 0, 0.5f, -1e30f));
  EXPECT_NE(b2.status().message().find("dtype of q (f32) differs from k_cache (bf16)"), std::string::npos)
      << b2.status().to_string();
}

}  // namespace
}  // namespace switchboard
