// The Rope op (schema RopeNode) against the decoder's former rotary embedding spelled out in
// Slice, Cast, Mul, Sub, Add and Concat: the same bits on every device, for every float dtype,
// full and partial rotary (odd numbers of frequencies too), one row and many, any position.
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
  int64_t m, pos, h, hd, half, table_rows;
};

TensorRef decomposed(ProgramBuilder& b, const Case& c, TensorRef x, TensorRef cos_t, TensorRef sin_t) {
  TensorRef cos = b.slice(cos_t, 0, c.pos, c.pos + c.m), sin = b.slice(sin_t, 0, c.pos, c.pos + c.m);
  if (c.dt != DType::kF32) cos = b.cast(cos, c.dt), sin = b.cast(sin, c.dt);
  cos = b.reshape(cos, {c.m, 1, c.half});
  sin = b.reshape(sin, {c.m, 1, c.half});
  TensorRef x1 = b.slice(x, 2, 0, c.half), x2 = b.slice(x, 2, c.half, 2 * c.half);
  TensorRef r1 = b.sub(b.mul(x1, cos), b.mul(x2, sin));
  TensorRef r2 = b.add(b.mul(x2, cos), b.mul(x1, sin));
  if (2 * c.half == c.hd) return b.concat({r1, r2}, 2);
  return b.concat({r1, r2, b.slice(x, 2, 2 * c.half, c.hd)}, 2);
}

Tensor random(DType t, const Shape& shape, std::mt19937& rng, double lo, double hi) {
  return optest::random_tensor(t, shape, rng, std::uniform_real_distribution<double>(lo, hi));
}

void check(const Case& c) {
  SCOPED_TRACE(::testing::Message() << dtype_name(c.dt) << " m=" << c.m << " pos=" << c.pos << " h=" << c.h
                                    << " hd=" << c.hd << " half=" << c.half);
  ProgramBuilder b;
  TensorRef x = b.input("x", c.dt, {c.m, c.h, c.hd});
  TensorRef cos_t = b.input("cos", DType::kF32, {c.table_rows, c.half});
  TensorRef sin_t = b.input("sin", DType::kF32, {c.table_rows, c.half});
  b.output("fused", b.rope(x, cos_t, sin_t, c.pos));
  b.output("reference", decomposed(b, c, x, cos_t, sin_t));
  std::mt19937 rng(static_cast<uint32_t>(c.m * 31 + c.pos * 7 + c.hd + c.half));
  Inputs in{{"x", random(c.dt, {c.m, c.h, c.hd}, rng, -4.0, 4.0)},
            {"cos", random(DType::kF32, {c.table_rows, c.half}, rng, -1.0, 1.0)},
            {"sin", random(DType::kF32, {c.table_rows, c.half}, rng, -1.0, 1.0)}};
  optest::check_same_bits(b, in, {{"fused", "reference"}});
}

TEST(Rope, SameBitsAsTheDecomposedOps) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    check({dt, 1, 9, 4, 16, 8, 12});      // decode, full rotary
    check({dt, 5, 0, 3, 16, 8, 8});       // prefill from 0
    check({dt, 3, 4, 2, 16, 4, 10});      // partial rotary
    check({dt, 2, 1, 3, 10, 3, 6});       // an odd number of frequencies
    check({dt, 4, 20, 32, 128, 64, 30});  // Qwen3's heads
  }
}

// With norm_weight and a cache: the bits of RmsNorm (Tree32), Rope, then SliceUpdate into the cache.
void check_fused(const Case& c, bool norm, bool cache) {
  SCOPED_TRACE(::testing::Message() << dtype_name(c.dt) << " m=" << c.m << " pos=" << c.pos << " h=" << c.h
                                    << " hd=" << c.hd << " half=" << c.half << " norm=" << norm << " cache=" << cache);
  ProgramBuilder b;
  TensorRef x = b.input("x", c.dt, {c.m, c.h, c.hd});
  TensorRef cos_t = b.input("cos", DType::kF32, {c.table_rows, c.half});
  TensorRef sin_t = b.input("sin", DType::kF32, {c.table_rows, c.half});
  TensorRef w = norm ? b.input("w", c.dt, {c.hd}) : TensorRef{};
  TensorRef fused_cache = cache ? b.mutable_buffer("fused_cache", c.dt, {c.table_rows, c.h, c.hd}) : TensorRef{};
  TensorRef ref_cache = cache ? b.mutable_buffer("ref_cache", c.dt, {c.table_rows, c.h, c.hd}) : TensorRef{};
  b.output("fused", b.rope(x, cos_t, sin_t, c.pos, w, 1e-5f, fused_cache));
  TensorRef r = b.rope(norm ? b.add_rms_norm(x, {}, w, 1e-5f).out : x, cos_t, sin_t, c.pos);
  if (cache) b.slice_update(ref_cache, r, 0, c.pos);
  b.output("reference", r);
  std::mt19937 rng(static_cast<uint32_t>(c.m * 37 + c.pos * 5 + c.hd + c.half + norm + 2 * cache));
  Inputs in{{"x", random(c.dt, {c.m, c.h, c.hd}, rng, -4.0, 4.0)},
            {"cos", random(DType::kF32, {c.table_rows, c.half}, rng, -1.0, 1.0)},
            {"sin", random(DType::kF32, {c.table_rows, c.half}, rng, -1.0, 1.0)}};
  if (norm) in["w"] = random(c.dt, {c.hd}, rng, 0.5, 1.5);
  std::vector<std::pair<std::string, std::string>> pairs = {{"fused", "reference"}};
  if (cache) pairs.emplace_back("fused_cache", "ref_cache");
  optest::check_same_bits(b, in, pairs);
}

TEST(Rope, NormAndCacheAppendGiveTheSeparateOpsBits) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
    for (bool norm : {false, true})
      for (bool cache : {false, true}) {
        check_fused({dt, 1, 9, 4, 16, 8, 12}, norm, cache);     // decode
        check_fused({dt, 5, 2, 3, 40, 4, 8}, norm, cache);      // prefill, partial rotary, hd past 32
        check_fused({dt, 2, 20, 8, 128, 64, 30}, norm, cache);  // Qwen3's heads
      }
}

// The fused q/k/v form (schema v8): x [m, H, hd] = [q | gap | k | v] heads -> the bits of a Rope of
// the queries, a Rope of the keys with their cache, and a SliceUpdate of the values.
void check_qkv(DType dt, int64_t m, int64_t pos, int64_t hq, int64_t gap, int64_t hk, int64_t hd, int64_t half,
               bool norm) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " m=" << m << " pos=" << pos << " hq=" << hq << " gap=" << gap
                                    << " hk=" << hk << " hd=" << hd << " norm=" << norm);
  const int64_t rows = pos + m + 2, heads = hq + gap + 2 * hk;
  ProgramBuilder b;
  TensorRef x = b.input("x", dt, {m, heads * hd});
  TensorRef cos_t = b.input("cos", DType::kF32, {rows, half});
  TensorRef sin_t = b.input("sin", DType::kF32, {rows, half});
  TensorRef qw = norm ? b.input("qw", dt, {hd}) : TensorRef{},
            kw = norm ? b.input("kw", DType::kF32, {hd}) : TensorRef{};
  TensorRef kc = b.mutable_buffer("kc", dt, {rows, hk, hd}), vc = b.mutable_buffer("vc", dt, {rows, hk, hd});
  TensorRef rk = b.mutable_buffer("rk", dt, {rows, hk, hd}), rv = b.mutable_buffer("rv", dt, {rows, hk, hd});
  b.output("fused", b.rope_qkv(b.reshape(x, {m, heads, hd}), cos_t, sin_t, pos, hq, hk, kc, vc, qw, kw, 1e-5f));
  auto part = [&](int64_t first, int64_t n) {
    return b.reshape(b.slice(x, 1, first * hd, (first + n) * hd), {m, n, hd});
  };
  b.output("reference", b.rope(part(0, hq), cos_t, sin_t, pos, qw, 1e-5f));
  b.rope(part(hq + gap, hk), cos_t, sin_t, pos, kw, 1e-5f, rk);
  b.slice_update(rv, part(hq + gap + hk, hk), 0, pos);
  std::mt19937 rng(static_cast<uint32_t>(m * 41 + pos * 3 + hq + gap + hk + hd + norm));
  Inputs in{{"x", random(dt, {m, heads * hd}, rng, -4.0, 4.0)},
            {"cos", random(DType::kF32, {rows, half}, rng, -1.0, 1.0)},
            {"sin", random(DType::kF32, {rows, half}, rng, -1.0, 1.0)}};
  if (norm) {
    in["qw"] = random(dt, {hd}, rng, 0.5, 1.5);
    in["kw"] = random(DType::kF32, {hd}, rng, 0.5, 1.5);
  }
  optest::check_same_bits(b, in, {{"fused", "reference"}, {"kc", "rk"}, {"vc", "rv"}});
}

TEST(Rope, QkvFormGivesTheSeparateOpsBits) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
    for (bool norm : {false, true}) {
      check_qkv(dt, 1, 9, 4, 0, 2, 16, 8, norm);    // decode
      check_qkv(dt, 5, 0, 3, 3, 1, 40, 4, norm);    // prefill from 0, gate heads between, partial rotary
      check_qkv(dt, 3, 6, 8, 0, 2, 128, 64, norm);  // Qwen3's head size
      check_qkv(dt, 2, 1, 2, 2, 2, 64, 16, norm);   // Qwen3.5's quarter rotary behind its gate heads
    }
}

TEST(Rope, QkvFormRulesNameTheField) {
  auto build = [](int64_t q_heads, int64_t k_heads, int64_t cache_heads) {
    ProgramBuilder b;
    TensorRef x = b.input("x", DType::kF32, {2, 6, 4});
    TensorRef t = b.input("t", DType::kF32, {8, 2});
    TensorRef kc = b.mutable_buffer("kc", DType::kF32, {8, cache_heads, 4});
    TensorRef vc = b.mutable_buffer("vc", DType::kF32, {8, cache_heads, 4});
    b.output("o", b.rope_qkv(x, t, t, 0, q_heads, k_heads, kc, vc));
    return b.status().to_string();
  };
  EXPECT_NE(build(4, 2, 2).find("has 6 heads, fewer than q_heads 4 + 2 * k_heads 2"), std::string::npos);
  EXPECT_NE(build(0, 1, 1).find("q_heads: 0 is outside [1, 2^20]"), std::string::npos) << build(0, 1, 1);
  EXPECT_EQ(build(4, 1, 1), "OK") << build(4, 1, 1);
  // The caches' head count is checked when the op runs.
  ProgramBuilder b;
  TensorRef x = b.input("x", DType::kF32, {1, 4, 2});
  TensorRef t = b.input("t", DType::kF32, {4, 1});
  TensorRef kc = b.mutable_buffer("kc", DType::kF32, {4, 2, 2}), vc = b.mutable_buffer("vc", DType::kF32, {4, 2, 2});
  b.output("o", b.rope_qkv(x, t, t, 0, 2, 1, kc, vc));
  optest::check_op_error(b,
                         {{"x", optest::make(DType::kF32, {1, 4, 2}, std::vector<double>(8, 0.5))},
                          {"t", optest::make(DType::kF32, {4, 1}, std::vector<double>(4, 0.25))}},
                         "does not hold 1 heads of 2");
}

TEST(Rope, PositionPastTheTablesIsAnError) {
  ProgramBuilder b;
  TensorRef x = b.input("x", DType::kF32, {2, 1, 4});
  TensorRef t = b.input("t", DType::kF32, {3, 2});
  b.output("o", b.rope(x, t, t, 2));
  optest::check_op_error(b,
                         {{"x", optest::make(DType::kF32, {2, 1, 4}, std::vector<double>(8, 0.5))},
                          {"t", optest::make(DType::kF32, {3, 2}, std::vector<double>(6, 0.25))}},
                         "pos 2 + 2 rows exceeds the tables' 3 positions");
}

TEST(Rope, RulesNameTheField) {
  ProgramBuilder b;
  TensorRef x = b.input("x", DType::kF32, {2, 1, 4});
  TensorRef t = b.input("t", DType::kF32, {8, 3});
  b.output("o", b.rope(x, t, t, 0));
  EXPECT_NE(b.status().message().find("rotates 2 * 3 dims of a head of 4"), std::string::npos)
      << b.status().to_string();
  ProgramBuilder b2;
  TensorRef x2 = b2.input("x", DType::kF32, {2, 1, 4});
  TensorRef t2 = b2.input("t", DType::kBF16, {8, 2});
  b2.output("o", b2.rope(x2, t2, t2, 0));
  EXPECT_NE(b2.status().message().find("must be a 2-D f32 table"), std::string::npos) << b2.status().to_string();
}

}  // namespace
}  // namespace switchboard
