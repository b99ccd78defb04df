// The Attention op (schema AttentionNode). Order Blocked32: every device gives the CPU's bits,
// near attention in double precision, and a row's bits do not depend on how many rows came
// with it (prefill vs decode, GPU chunks). Order Decomposed: the bits of the decomposed ops
// (BatchMatmul, Mul, mask Add, [Concat sink,] Softmax, BatchMatmul). Every dtype, grouped
// heads, prefill and decode rows, windows and sinks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "gather_qmm.h"
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
  return optest::random_tensor(t, shape, rng, std::normal_distribution<double>(0.0, scale));
}

void check(const Case& c) {
  SCOPED_TRACE(::testing::Message() << dtype_name(c.dt) << " m=" << c.m << " pos=" << c.pos << " hq=" << c.hq << " hk="
                                    << c.hk << " hd=" << c.hd << " window=" << c.window << " sinks=" << c.sinks);
  ProgramBuilder b;
  TensorRef q = b.input("q", c.dt, {c.m, c.hq, c.hd});
  TensorRef kc = b.input("k", c.dt, {c.hk, c.cache, c.hd});
  TensorRef vc = b.input("v", c.dt, {c.hk, c.cache, c.hd});
  TensorRef positions = b.input("positions", DType::kF32, {c.cache});
  TensorRef sinks = c.sinks ? b.input("sinks", c.dt, {c.hq}) : TensorRef{};
  const double big = c.dt == DType::kF16 ? 65504.0 : 1e30;
  const float scale = as_dtype(1.0 / std::sqrt(static_cast<double>(c.hd)), c.dt);
  const float mask_value = as_dtype(static_cast<float>(-big), c.dt);
  b.output("fused", b.attention_decomposed_order(q, kc, vc, c.pos, scale, mask_value, c.window, sinks));
  b.output("reference", decomposed(b, c, q, kc, vc, positions, sinks, scale, big));
  std::mt19937 rng(static_cast<uint32_t>(c.m * 131 + c.pos * 17 + c.hd + c.window));
  Inputs in{{"q", random(c.dt, {c.m, c.hq, c.hd}, rng, 1.0)},
            {"k", random(c.dt, {c.hk, c.cache, c.hd}, rng, 1.0)},
            {"v", random(c.dt, {c.hk, c.cache, c.hd}, rng, 1.0)}};
  std::vector<double> p(static_cast<size_t>(c.cache));
  for (int64_t i = 0; i < c.cache; ++i) p[static_cast<size_t>(i)] = static_cast<double>(i);
  in["positions"] = optest::make(DType::kF32, {c.cache}, p);
  if (c.sinks) in["sinks"] = random(c.dt, {c.hq}, rng, 1.0);
  optest::check_same_bits(b, in, {{"fused", "reference"}});
}

// Softmax attention in double precision over the operands as stored: visible keys only, the
// sink as one more score without a value. Out [m, hq * hd].
std::vector<double> exact_attention(const Case& c, const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor* sinks, double scale) {
  const std::vector<double> qd = q.to_doubles(), kd = k.to_doubles(), vd = v.to_doubles();
  const std::vector<double> sd = sinks ? sinks->to_doubles() : std::vector<double>{};
  std::vector<double> out(static_cast<size_t>(c.m * c.hq * c.hd));
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t h = 0; h < c.hq; ++h) {
      const int64_t kh = h / (c.hq / c.hk), at = c.pos + i,
                    lo = c.window > 0 ? std::max<int64_t>(0, at + 1 - c.window) : 0;
      std::vector<double> s;
      for (int64_t j = lo; j <= at; ++j) {
        double x = 0;
        for (int64_t e = 0; e < c.hd; ++e)
          x += qd[static_cast<size_t>((i * c.hq + h) * c.hd + e)] *
               kd[static_cast<size_t>((kh * c.cache + j) * c.hd + e)];
        s.push_back(x * scale);
      }
      double mx = *std::max_element(s.begin(), s.end()), sum = 0;
      if (sinks) mx = std::max(mx, sd[static_cast<size_t>(h)]);
      for (double& x : s) sum += (x = std::exp(x - mx));
      if (sinks) sum += std::exp(sd[static_cast<size_t>(h)] - mx);
      for (int64_t e = 0; e < c.hd; ++e) {
        double o = 0;
        for (int64_t j = lo; j <= at; ++j)
          o += s[static_cast<size_t>(j - lo)] * vd[static_cast<size_t>((kh * c.cache + j) * c.hd + e)];
        out[static_cast<size_t>((i * c.hq + h) * c.hd + e)] = o / sum;
      }
    }
  return out;
}

// Order Blocked32: CPU bits on every device, within `tol` (absolute, outputs are means of
// unit-normal values) of exact_attention, and row i's bits equal a one-row call at pos + i.
void check_blocked(const Case& c, double tol) {
  SCOPED_TRACE(::testing::Message() << "blocked " << dtype_name(c.dt) << " m=" << c.m << " pos=" << c.pos
                                    << " hq=" << c.hq << " hk=" << c.hk << " hd=" << c.hd << " window=" << c.window
                                    << " sinks=" << c.sinks);
  ProgramBuilder b;
  TensorRef q = b.input("q", c.dt, {c.m, c.hq, c.hd});
  TensorRef q1 = b.input("q1", c.dt, {1, c.hq, c.hd});
  TensorRef kc = b.input("k", c.dt, {c.hk, c.cache, c.hd});
  TensorRef vc = b.input("v", c.dt, {c.hk, c.cache, c.hd});
  TensorRef sinks = c.sinks ? b.input("sinks", c.dt, {c.hq}) : TensorRef{};
  const float scale = as_dtype(1.0 / std::sqrt(static_cast<double>(c.hd)), c.dt);
  b.output("rows", b.attention(q, kc, vc, c.pos, scale, c.window, sinks));
  // The last row alone, as a decode step would compute it; the caches seq-major.
  b.output("last", b.attention(q1, kc, vc, c.pos + c.m - 1, scale, c.window, sinks));
  // ... and at a position given as an input value (the GPU reads it on the device, its grid sized
  // by the cache: a row's blocks split over at most 64 workgroups).
  b.output("last_input_pos", b.attention(q1, kc, vc, b.input_value("p"), scale, c.window, sinks));
  TensorRef ks = b.input("ks", c.dt, {c.cache, c.hk, c.hd}), vs = b.input("vs", c.dt, {c.cache, c.hk, c.hd});
  b.output("seq_major", b.attention(q, ks, vs, c.pos, scale, c.window, sinks, true));
  std::mt19937 rng(static_cast<uint32_t>(c.m * 131 + c.pos * 17 + c.hd + c.window + 7));
  Inputs in{{"q", random(c.dt, {c.m, c.hq, c.hd}, rng, 1.0)},
            {"k", random(c.dt, {c.hk, c.cache, c.hd}, rng, 1.0)},
            {"v", random(c.dt, {c.hk, c.cache, c.hd}, rng, 1.0)}};
  const size_t row_bytes = static_cast<size_t>(c.hq * c.hd) * dtype_size(c.dt);
  Tensor q1v = optest::make(c.dt, {1, c.hq, c.hd}, std::vector<double>(static_cast<size_t>(c.hq * c.hd), 0.0));
  std::memcpy(q1v.mutable_data(), static_cast<const uint8_t*>(in["q"].data()) + (c.m - 1) * row_bytes, row_bytes);
  in["q1"] = q1v;
  // [hk, S, hd] -> [S, hk, hd], element by element.
  const size_t el = dtype_size(c.dt);
  for (const char* name : {"k", "v"}) {
    Tensor t =
        optest::make(c.dt, {c.cache, c.hk, c.hd}, std::vector<double>(static_cast<size_t>(c.cache * c.hk * c.hd), 0.0));
    for (int64_t h = 0; h < c.hk; ++h)
      for (int64_t j = 0; j < c.cache; ++j)
        std::memcpy(static_cast<uint8_t*>(t.mutable_data()) + static_cast<size_t>((j * c.hk + h) * c.hd) * el,
                    static_cast<const uint8_t*>(in[name].data()) + static_cast<size_t>((h * c.cache + j) * c.hd) * el,
                    static_cast<size_t>(c.hd) * el);
    in[std::string(name) + "s"] = t;
  }
  if (c.sinks) in["sinks"] = random(c.dt, {c.hq}, rng, 1.0);
  const std::vector<double> want =
      exact_attention(c, in["q"], in["k"], in["v"], c.sinks ? &in["sinks"] : nullptr, scale);
  Tensor first;
  bool have_first = false;
  optest::detail::for_each_device(b, in, [&](const Program&, Session& s, const std::string& dev) {
    ASSERT_TRUE(s.set_input_value("p", c.pos + c.m - 1).is_ok());
    Status st = s.execute();
    ASSERT_TRUE(st.is_ok()) << dev << ": " << st.to_string();
    auto rows = s.output("rows"), last = s.output("last"), seq_major = s.output("seq_major");
    auto last_input_pos = s.output("last_input_pos");
    ASSERT_TRUE(rows.is_ok() && last.is_ok() && seq_major.is_ok() && last_input_pos.is_ok());
    EXPECT_EQ(std::memcmp(last->data(), last_input_pos->data(), row_bytes), 0) << dev << ": position as an input";
    EXPECT_EQ(std::memcmp(rows->data(), seq_major->data(), rows->nbytes()), 0) << dev << ": seq-major caches differ";
    const std::vector<double> got = rows->to_doubles();
    double worst = 0;
    for (size_t e = 0; e < got.size(); ++e) worst = std::max(worst, std::fabs(got[e] - want[e]));
    EXPECT_LE(worst, tol) << dev << ": farthest output from attention in double precision";
    EXPECT_EQ(std::memcmp(static_cast<const uint8_t*>(rows->data()) + (c.m - 1) * row_bytes, last->data(), row_bytes),
              0)
        << dev << ": the last row differs from the same row computed alone";
    if (!have_first) {
      first = *rows;
      have_first = true;
    } else {
      EXPECT_EQ(std::memcmp(rows->data(), first.data(), first.nbytes()), 0) << dev << ": differs from the CPU";
    }
  });
}

TEST(Attention, BlockedOrderIsExactAcrossDevicesAndBatchInvariant) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    // f32: the exps and rcp of docs/numerics.md (a few ulps); 16-bit: the scores and the output
    // rounded to the dtype (bf16 keeps 8 bits: scores of ~4 carry 2^-6 errors into the exps).
    const double tol = dt == DType::kF32 ? 1e-5 : (dt == DType::kBF16 ? 6e-2 : 8e-3);
    check_blocked({dt, 1, 5, 4, 2, 8, 12, 0, false}, tol);       // decode, grouped heads
    check_blocked({dt, 4, 0, 4, 4, 8, 12, 0, false}, tol);       // prefill from 0
    check_blocked({dt, 3, 30, 6, 2, 16, 40, 0, false}, tol);     // prefill across a block edge
    check_blocked({dt, 5, 40, 4, 1, 8, 48, 3, false}, tol);      // sliding window inside one block
    check_blocked({dt, 9, 60, 4, 1, 8, 72, 40, true}, tol);      // window across blocks, sinks
    check_blocked({dt, 2, 3, 4, 2, 8, 12, 0, true}, tol);        // attention sinks
    check_blocked({dt, 1, 100, 2, 1, 160, 128, 16, true}, tol);  // head dims past 128
    check_blocked({dt, 1, 90, 16, 2, 128, 100, 0, false}, tol);  // 8 heads a cache head
    check_blocked({dt, 6, 40, 8, 2, 8, 48, 3, true}, tol);       // grouped, window and sinks
  }
  check_blocked({DType::kBF16, 70, 200, 8, 2, 128, 320, 0, false}, 6e-2);  // many rows, many blocks
  check_blocked({DType::kF32, 1, 4200, 2, 1, 32, 4224, 0, true}, 1e-5);    // a long decode row
  check_blocked({DType::kBF16, 1, 4000, 8, 2, 64, 4224, 0, false}, 6e-2);  // ... grouped, 2 blocks a split
  // Past 1,024 blocks the GPU's merge walks the blocks without staging their factors.
  check_blocked({DType::kF32, 1, 33000, 2, 1, 32, 33024, 0, true}, 1e-5);
}

// Prefills of 64+ query vectors a cache head with head dims 32k <= 128 take the GPU's tiles
// kernel (64 vectors a workgroup, the softmax state on chip): the same bits as the CPU and as
// each row's decode step, which takes the block kernels.
TEST(Attention, TiledPrefillKeepsTheBlockedBits) {
  check_blocked({DType::kBF16, 64, 0, 8, 1, 128, 64, 0, false}, 6e-2);    // from 0, 8 heads a cache head
  check_blocked({DType::kF32, 40, 37, 16, 2, 64, 96, 0, true}, 1e-5);     // after a prompt, sinks
  check_blocked({DType::kF16, 70, 100, 4, 4, 32, 200, 50, false}, 8e-3);  // window across blocks, a part tile
  check_blocked({DType::kBF16, 33, 5, 8, 4, 96, 40, 0, true}, 6e-2);      // head dims 96, sinks
  check_blocked({DType::kF32, 100, 0, 2, 1, 128, 100, 17, false}, 1e-5);  // cache not a multiple of 32
  check_blocked({DType::kF16, 130, 300, 8, 2, 128, 448, 0, false}, 8e-3);
  // 32..63 query vectors a cache head: one part tile (the smallest prefill the tiles take).
  check_blocked({DType::kBF16, 5, 10, 8, 1, 128, 64, 0, false}, 6e-2);
  check_blocked({DType::kF32, 9, 3, 4, 1, 64, 40, 0, true}, 1e-5);
  // 64 cache heads of 2,100 rows pass the tiles' 64 MiB of query scratch: two chunks of rows.
  check_blocked({DType::kBF16, 2100, 0, 64, 64, 32, 2100, 64, false}, 6e-2);
}

// A decode step's Rope (q/k/v form) and the attention of its queries at a position read on the
// device: the GPU computes the rope inside the attention's blocks kernel (attention_blocks_rope)
// where the rope's queries feed only the attention; the same bits as the two ops (the reference's
// queries are an output too, so it runs them apart) and as the CPU, caches included.
void check_rope_attention(DType dt, int64_t prompt, int64_t hq, int64_t hk, int64_t hd, int64_t half, int64_t cache,
                          int64_t window, bool with_sinks, bool norm) {
  SCOPED_TRACE(::testing::Message() << "rope + attention " << dtype_name(dt) << " prompt=" << prompt << " hq=" << hq
                                    << " hk=" << hk << " hd=" << hd << " half=" << half << " cache=" << cache
                                    << " window=" << window << " sinks=" << with_sinks << " norm=" << norm);
  const int64_t heads = hq + 2 * hk;
  ProgramBuilder b;
  TensorRef xp = b.input("xp", dt, {prompt, heads, hd}), x = b.input("x", dt, {1, heads, hd});
  TensorRef cos_t = b.input("cos", DType::kF32, {cache, half}), sin_t = b.input("sin", DType::kF32, {cache, half});
  TensorRef qw = norm ? b.input("qw", dt, {hd}) : TensorRef{},
            kw = norm ? b.input("kw", DType::kF32, {hd}) : TensorRef{};
  TensorRef sinks = with_sinks ? b.input("sinks", dt, {hq}) : TensorRef{};
  TensorRef kc = b.mutable_buffer("kc", dt, {cache, hk, hd}), vc = b.mutable_buffer("vc", dt, {cache, hk, hd});
  TensorRef rk = b.mutable_buffer("rk", dt, {cache, hk, hd}), rv = b.mutable_buffer("rv", dt, {cache, hk, hd});
  b.rope_qkv(xp, cos_t, sin_t, 0, hq, hk, kc, vc, qw, kw, 1e-5f);  // the prompt, into both caches
  b.rope_qkv(xp, cos_t, sin_t, 0, hq, hk, rk, rv, qw, kw, 1e-5f);
  const IntOrValue p = b.input_value("p");
  const float scale = as_dtype(1.0 / std::sqrt(static_cast<double>(hd)), dt);
  TensorRef q = b.rope_qkv(x, cos_t, sin_t, p, hq, hk, kc, vc, qw, kw, 1e-5f);
  b.output("fused", b.attention(q, kc, vc, p, scale, window, sinks, true));
  TensorRef qr = b.rope_qkv(x, cos_t, sin_t, p, hq, hk, rk, rv, qw, kw, 1e-5f);
  b.output("queries", qr);
  b.output("reference", b.attention(qr, rk, rv, p, scale, window, sinks, true));
  std::mt19937 rng(static_cast<uint32_t>(prompt * 7 + hq * 5 + hk * 3 + hd + half + window + norm));
  Inputs in{{"xp", random(dt, {prompt, heads, hd}, rng, 1.0)},
            {"x", random(dt, {1, heads, hd}, rng, 1.0)},
            {"cos", random(DType::kF32, {cache, half}, rng, 0.7)},
            {"sin", random(DType::kF32, {cache, half}, rng, 0.7)}};
  if (norm) {
    in["qw"] = random(dt, {hd}, rng, 1.0);
    in["kw"] = random(DType::kF32, {hd}, rng, 1.0);
  }
  if (with_sinks) in["sinks"] = random(dt, {hq}, rng, 1.0);
  std::map<std::string, Tensor> first;
  optest::detail::for_each_device(b, in, [&](const Program&, Session& s, const std::string& dev) {
    ASSERT_TRUE(s.set_input_value("p", prompt).is_ok());
    Status st = s.execute();
    ASSERT_TRUE(st.is_ok()) << dev << ": " << st.to_string();
    for (const auto& [a, r] : {std::pair<std::string, std::string>{"fused", "reference"}, {"kc", "rk"}, {"vc", "rv"}}) {
      auto x_a = a == "fused" ? s.output(a) : s.mutable_buffer(a);
      auto x_r = r == "reference" ? s.output(r) : s.mutable_buffer(r);
      ASSERT_TRUE(x_a.is_ok() && x_r.is_ok()) << dev << ": " << a;
      EXPECT_EQ(std::memcmp(x_a->data(), x_r->data(), x_r->nbytes()), 0)
          << dev << ": '" << a << "' differs from '" << r << "'";
      auto [it, fresh] = first.emplace(a, *x_a);
      if (!fresh) {
        EXPECT_EQ(std::memcmp(x_a->data(), it->second.data(), x_a->nbytes()), 0)
            << dev << ": '" << a << "' differs from the CPU";
      }
    }
  });
}

// Each case opens sessions whose pipelines lavapipe compiles (minutes with a cold shader cache under
// ASan), so the cases are three tests: the decoders' bf16 in full, the other dtypes on two shapes.
void check_rope_attention_bf16(bool norm) {
  check_rope_attention(DType::kBF16, 9, 4, 2, 16, 8, 12, 0, false, norm);     // grouped heads
  check_rope_attention(DType::kBF16, 64, 8, 2, 128, 64, 80, 0, false, norm);  // the new key first in its block
  check_rope_attention(DType::kBF16, 40, 16, 2, 64, 16, 48, 3, true, norm);   // window inside a block, sinks
}

TEST(Attention, DecodeRopeInTheBlocksKernelKeepsTheSeparateOpsBits) { check_rope_attention_bf16(false); }

TEST(Attention, DecodeRopeWithHeadNormsKeepsTheSeparateOpsBits) { check_rope_attention_bf16(true); }

TEST(Attention, DecodeRopeInOtherDtypesKeepsTheSeparateOpsBits) {
  for (DType dt : {DType::kF32, DType::kF16}) {
    check_rope_attention(dt, 9, 4, 2, 16, 8, 12, 0, false, true);
    check_rope_attention(dt, 40, 16, 2, 64, 16, 48, 3, true, true);
  }
  check_rope_attention(DType::kBF16, 100, 4, 4, 32, 16, 128, 40, true, true);  // window across blocks
}

// More blocks than a row's 64 splits: the new key's block is not its split's first.
TEST(Attention, DecodeRopeInTheBlocksKernelPastTheSplits) {
  check_rope_attention(DType::kBF16, 2100, 4, 1, 32, 16, 2200, 0, false, true);
  check_rope_attention(DType::kF32, 2112, 2, 1, 32, 8, 2200, 0, true, false);
}

// Past the GPU's 64 MiB of block scratch a prefill runs in chunks of rows; a row's bits stay.
TEST(Attention, BlockedOrderChunkedPrefillKeepsEachRowsBits) {
  check_blocked({DType::kBF16, 40, 4040, 16, 2, 256, 4096, 0, false}, 6e-2);
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
  b.output("o", b.attention(q, kc, kc, 5, 0.5f));
  optest::check_op_error(b,
                         {{"q", optest::make(DType::kF32, {2, 2, 4}, std::vector<double>(16, 0.5))},
                          {"k", optest::make(DType::kF32, {1, 6, 4}, std::vector<double>(24, 0.25))}},
                         "pos 5 + 2 queries exceeds the cache length 6");
}

// A program may declare q with no heads: a prefill of it is an empty output on every device (the
// CPU groups a row's heads by cache head; zero heads must not divide by zero).
TEST(Attention, NoHeadsGiveAnEmptyOutput) {
  ProgramBuilder b;
  TensorRef q = b.input("q", DType::kF32, {4, 0, 8});
  TensorRef kc = b.input("k", DType::kF32, {1, 8, 8});
  b.output("o", b.attention(q, kc, kc, 0, 0.5f));
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  int devices = 0;
  optest::detail::for_each_device(b,
                                  {{"q", optest::make(DType::kF32, {4, 0, 8}, {})},
                                   {"k", optest::make(DType::kF32, {1, 8, 8}, std::vector<double>(64, 0.5))}},
                                  [&](const Program&, Session& s, const std::string& dev) {
                                    ASSERT_TRUE(s.execute().is_ok()) << dev;
                                    auto o = s.output("o");
                                    ASSERT_TRUE(o.is_ok()) << dev;
                                    EXPECT_EQ(o->shape(), (Shape{4, 0})) << dev;
                                    ++devices;
                                  });
  EXPECT_GE(devices, 1);
}

TEST(Attention, RulesNameTheField) {
  ProgramBuilder b;
  TensorRef q = b.input("q", DType::kF32, {2, 3, 4});
  TensorRef kc = b.input("k", DType::kF32, {2, 6, 4});
  b.output("o", b.attention(q, kc, kc, 0, 0.5f));
  EXPECT_NE(b.status().message().find("3 heads are not a multiple of the cache's 2"), std::string::npos)
      << b.status().to_string();
  ProgramBuilder b2;
  TensorRef q2 = b2.input("q", DType::kF32, {2, 2, 4});
  TensorRef k2 = b2.input("k", DType::kBF16, {1, 6, 4});
  b2.output("o", b2.attention(q2, k2, k2, 0, 0.5f));
  EXPECT_NE(b2.status().message().find("dtype of q (f32) differs from k_cache (bf16)"), std::string::npos)
      << b2.status().to_string();
  ProgramBuilder b3;
  TensorRef q3 = b3.input("q", DType::kF32, {2, 2, 4});
  TensorRef k3 = b3.input("k", DType::kF32, {6, 1, 4});
  b3.output("o", b3.attention(q3, k3, k3, 0, 0.5f, 0, {}, true));
  EXPECT_TRUE(b3.status().is_ok()) << b3.status().to_string();
}

// The CPU's SIMD paths (dot32 four keys at a time, the value rows' axpy) give the portable
// path's bits: f32 and bf16 caches, heads of 40 (masked tails) and 128, a window.
TEST(Attention, BlockedOrderSameBitsOnEveryCpuPath) {
  for (DType dt : {DType::kF32, DType::kBF16})
    for (int64_t hd : {int64_t{40}, int64_t{128}}) {
      ProgramBuilder b;
      TensorRef q = b.input("q", dt, {6, 4, hd});
      TensorRef kc = b.input("k", dt, {70, 2, hd}), vc = b.input("v", dt, {70, 2, hd});
      b.output("y", b.attention(q, kc, vc, 57, 0.125f, 45, {}, true));
      std::mt19937 rng(static_cast<uint32_t>(hd) + (dt == DType::kF32 ? 1u : 2u));
      const Inputs in{{"q", random(dt, {6, 4, hd}, rng, 1.0)},
                      {"k", random(dt, {70, 2, hd}, rng, 1.0)},
                      {"v", random(dt, {70, 2, hd}, rng, 1.0)}};
      auto program = Program::from_bytes(b.serialize().value(), "attention_paths");
      ASSERT_TRUE(program.is_ok()) << program.status().to_string();
      std::vector<Tensor> got;
      for (cpu::CpuPath p : {cpu::CpuPath::kPortable, cpu::CpuPath::kAvx2, cpu::CpuPath::kAvx512Vnni}) {
        if (cpu::best_cpu_path() < p) {
          std::printf("[ SKIPPED-PATH ] %s: this CPU cannot run it\n", cpu::cpu_path_name(p));
          continue;
        }
        cpu::set_cpu_path_limit(p);
        auto s = Session::create(*program, SessionOptions{"cpu"});
        ASSERT_TRUE(s.is_ok());
        for (const auto& [name, t] : in) ASSERT_TRUE((*s)->set_input(name, t).is_ok());
        Status st = (*s)->execute();
        cpu::set_cpu_path_limit(cpu::CpuPath::kAmx);
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        got.push_back((*s)->output("y").value().clone());
        EXPECT_EQ(std::memcmp(got.back().data(), got[0].data(), got[0].nbytes()), 0)
            << cpu::cpu_path_name(p) << " differs from the portable path, hd " << hd;
      }
    }
}

// A prefill's attention into its o-projection (64 and more rows): the tiles kernel also writes
// the output's Q8 blocks (attention_tiles_q8) and the projection reads them. The same bits as
// the projection of a copy of the output (two Negs, quantized by the projection itself) and as
// the CPU, and three dispatches fewer than that form (its Negs and quantizer).
TEST(Attention, TiledPrefillQuantizesForItsProjection) {
  const int64_t m = 64, hq = 8, hk = 2, hd = 128, cache = 96, n = 96, k = hq * hd, group = 64;
  for (DType dt : {DType::kBF16, DType::kF32, DType::kF16}) {
    SCOPED_TRACE(dtype_name(dt));
    std::mt19937 rng(static_cast<uint32_t>(dt) + 5u);
    std::vector<double> codes(static_cast<size_t>(n * k / 8));
    for (double& c : codes) c = rng();  // any bit pattern is a valid code stream
    Inputs in{{"q", random(dt, {m, hq, hd}, rng, 1.0)},
              {"k", random(dt, {hk, cache, hd}, rng, 1.0)},
              {"v", random(dt, {hk, cache, hd}, rng, 1.0)},
              {"codes", optest::make(DType::kU32, {1, n, k / 8}, codes)},
              {"scales", random(DType::kF16, {1, n, k / group}, rng, 0.02)},
              {"biases", random(DType::kF16, {1, n, k / group}, rng, 0.1)}};
    const float scale = as_dtype(1.0 / std::sqrt(static_cast<double>(hd)), dt);
    struct Refs {
      TensorRef q, kc, vc;
      QuantizedExperts w;
    };
    auto inputs = [&](ProgramBuilder& b) {
      return Refs{b.input("q", dt, {m, hq, hd}), b.input("k", dt, {hk, cache, hd}), b.input("v", dt, {hk, cache, hd}),
                  QuantizedExperts{b.input("codes", DType::kU32, {1, n, k / 8}),
                                   b.input("scales", DType::kF16, {1, n, k / group}),
                                   b.input("biases", DType::kF16, {1, n, k / group}),
                                   4,
                                   static_cast<int>(group),
                                   {}}};
    };
    auto layer = [&](ProgramBuilder& b, const Refs& r, const std::string& tag, bool apart) {
      TensorRef a = b.attention(r.q, r.kc, r.vc, 20, scale, 0, {});
      b.output("y" + tag, b.gather_qmm(apart ? b.neg(b.neg(a)) : a, r.w));
    };
    ProgramBuilder both;
    const Refs refs = inputs(both);
    layer(both, refs, "", false);
    layer(both, refs, "_apart", true);
    optest::check_same_bits(both, in, {{"y", "y_apart"}});
    std::map<std::string, int64_t> extra;  // per device: the apart form's dispatches less the fused one's
    for (bool apart : {false, true}) {
      ProgramBuilder one;
      layer(one, inputs(one), "", apart);
      optest::detail::for_each_device(one, in, [&](const Program&, Session& s, const std::string& dev) {
        const uint64_t before = s.device_dispatches();
        ASSERT_TRUE(s.execute().is_ok()) << dev;
        const auto ran = static_cast<int64_t>(s.device_dispatches() - before);
        extra[dev] += apart ? ran : -ran;
      });
    }
    for (const auto& [dev, e] : extra) {
      if (dev != "cpu") {
        EXPECT_EQ(e, 3) << dev << ": the apart form's Negs and quantizer";
      }
    }
  }
}

}  // namespace
}  // namespace switchboard
