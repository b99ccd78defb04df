// GatherQmm through the op harness, on every test device: the portable CPU
// implementation of the integer contract (cpu::qmm_rows) is the oracle, exact to
// the bit; gather_qmm_test.cpp checks that oracle against fp64 math. Covers every
// bit width, group size and scale dtype, odd output widths (f16/bf16 words that
// straddle rows), mixed bits with pruned experts, sorted pairs, absent indices and
// the data errors a device must find by itself. GatherMm (float experts) too, against
// the dot32 order written out from docs/numerics.md.
#include <algorithm>
#include <cmath>
#include <random>

#include "exact_math.h"
#include "gather_qmm.h"
#include "op_harness.h"
#include "quantize.h"

namespace switchboard::optest {
namespace {

struct Case {
  int64_t experts = 4, n = 5, k = 128, tokens = 3;
  int group = 64;
  std::vector<int> bits;  // per expert
  bool uniform = true;    // w as [E, N, K*b/32] (all experts one width) or flat
  DType x_dtype = DType::kF32, scale_dtype = DType::kF16;
  std::vector<int64_t> lhs, rhs;  // empty: absent
  bool sorted = false;
  bool special_x = false;  // blocks of zeros, of values below 2^-100 and near f32's top
  bool extreme = false;    // every code at its top and every activation code at +-127
  uint32_t seed = 1;
};

struct Built {
  Inputs inputs;
  int64_t words = 0;
};

Built make_inputs(const Case& c) {
  std::mt19937 rng(c.seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  Built out;
  for (int b : c.bits) out.words += c.n * c.k * b / 32;
  std::vector<double> w(static_cast<size_t>(out.words)), x(static_cast<size_t>(c.tokens * c.k));
  for (auto& v : w) v = rng();  // any bit pattern is a valid code stream
  for (auto& v : x) v = normal(rng);
  for (size_t i = 0; c.extreme && i < x.size(); ++i) x[i] = (i / c.k % 2 == 0 ? 127.0 : -127.0) / 128;
  for (size_t i = 0; c.extreme && i < w.size(); ++i) w[i] = 4294967295.0;
  for (size_t i = 0; c.special_x && i < x.size(); ++i) {
    const size_t block = i / 32 % 4;
    if (block == 1) x[i] = 0;
    if (block == 2) x[i] *= 1e-31;  // amax < 2^-100: codes and d are 0
    if (block == 3 && i / 128 % 2 == 1) x[i] *= 1e37;
  }
  const int64_t g = c.k / c.group, sn = c.experts * c.n * g;
  std::vector<double> s(static_cast<size_t>(sn)), bi(static_cast<size_t>(sn));
  for (auto& v : s) v = 0.02 * normal(rng);
  for (auto& v : bi) v = 0.1 * normal(rng);
  Shape wshape = c.uniform ? Shape{c.experts, c.n, c.k * c.bits[0] / 32} : Shape{out.words};
  out.inputs["x"] = make(c.x_dtype, {c.tokens, c.k}, x);
  out.inputs["w"] = make(DType::kU32, wshape, w);
  out.inputs["scales"] = make(c.scale_dtype, {c.experts, c.n, g}, s);
  out.inputs["biases"] = make(c.scale_dtype, {c.experts, c.n, g}, bi);
  auto idx = [](const std::vector<int64_t>& v) {
    return make(DType::kI32, {static_cast<int64_t>(v.size())}, std::vector<double>(v.begin(), v.end()));
  };
  if (!c.lhs.empty()) out.inputs["lhs"] = idx(c.lhs);
  if (!c.rhs.empty()) out.inputs["rhs"] = idx(c.rhs);
  return out;
}

// The case's experts as program inputs w<suffix>, scales<suffix>, biases<suffix>.
QuantizedExperts experts_input(ProgramBuilder& b, const Case& c, const Built& in, const std::string& suffix = "") {
  QuantizedExperts q;
  const Shape ws = in.inputs.at("w").shape();
  q.w = b.input("w" + suffix, DType::kU32, std::vector<Dim>(ws.begin(), ws.end()));
  q.scales = b.input("scales" + suffix, c.scale_dtype, {c.experts, c.n, c.k / c.group});
  q.biases = b.input("biases" + suffix, c.scale_dtype, {c.experts, c.n, c.k / c.group});
  q.group_size = c.group;
  if (c.uniform)
    q.bits = c.bits[0];
  else
    q.expert_bits.assign(c.bits.begin(), c.bits.end());
  return q;
}

// The case's lhs / rhs inputs (where given) and sortedness.
GatherOptions index_inputs(ProgramBuilder& b, const Case& c) {
  GatherOptions o;
  if (!c.lhs.empty()) o.lhs_indices = b.input("lhs", DType::kI32, {static_cast<int64_t>(c.lhs.size())});
  if (!c.rhs.empty()) o.rhs_indices = b.input("rhs", DType::kI32, {static_cast<int64_t>(c.rhs.size())});
  o.sorted_indices = c.sorted ? 1 : 0;
  return o;
}

void build(ProgramBuilder& b, const Case& c, const Built& in) {
  b.output("y", b.gather_qmm(b.input("x", c.x_dtype, {c.tokens, c.k}), experts_input(b, c, in), index_inputs(b, c)));
}

// The oracle: the contract's portable implementation, then the store to x's dtype.
Expected oracle(const Case& c, const Inputs& in) {
  cpu::ExpertTable t;
  t.n = c.n;
  t.k = c.k;
  t.groups = c.k / c.group;
  t.group_size = c.group;
  t.bits = c.bits;
  int64_t off = 0;
  for (int b : c.bits) {
    t.word_offset.push_back(off);
    off += c.n * c.k * b / 32;
  }
  t.codes = in.at("w").data_as<uint32_t>();
  t.scales = in.at("scales").data();
  t.biases = in.at("biases").data();
  t.scale_dtype = c.scale_dtype;
  const cpu::Q8Activations xq = cpu::quantize_q8(in.at("x"));
  const int64_t pairs = !c.rhs.empty() ? c.rhs.size() : !c.lhs.empty() ? c.lhs.size() : c.tokens;
  RefTensor r{{pairs, c.n}, {}, {}};
  std::vector<float> row(static_cast<size_t>(c.n));
  for (int64_t p = 0; p < pairs; ++p) {
    const int e = c.rhs.empty() ? 0 : static_cast<int>(c.rhs[p]);
    const int64_t lr = c.lhs.empty() ? p * c.tokens / pairs : c.lhs[p];
    cpu::qmm_rows(t, e, xq, &lr, 1, 0, c.n, row.data(), c.n);
    for (float v : row) r.values.push_back(round_to(c.x_dtype, v));
  }
  return {{"y", r}};
}

void run(const Case& c) {
  Built in = make_inputs(c);
  ProgramBuilder b;
  build(b, c, in);
  check_op(
      b, in.inputs, [&](const Inputs& i) { return oracle(c, i); }, Tolerance::exact());
}

TEST(GatherQmmDevices, EveryWidthGroupAndScaleDtype) {
  const DType dts[] = {DType::kF32, DType::kF16, DType::kBF16};
  uint32_t seed = 10;
  for (int bits : {2, 3, 4, 5, 6, 8})
    for (int group : {32, 64, 128}) {
      Case c;
      c.bits.assign(4, bits);
      c.group = group;
      c.k = 256;
      c.scale_dtype = dts[seed % 3];
      c.x_dtype = dts[(seed / 3) % 3];
      c.lhs = {0, 2, 1, 1, 2, 0};
      c.rhs = {3, 0, 2, 2, 1, 3};
      c.seed = seed++;
      SCOPED_TRACE(std::to_string(bits) + "-bit, group " + std::to_string(group) + ", scales " +
                   dtype_name(c.scale_dtype) + ", x " + dtype_name(c.x_dtype));
      run(c);
    }
}

// GPUs run few pair rows (decode) through one kernel that quantizes each row in its
// workgroup and many (prefill) through a Q8 pass and a second kernel: cover both, the
// longest row the first stages, tile widening and the Q8 edge blocks.
TEST(GatherQmmDevices, RowAndBatchSchedules) {
  std::mt19937 rng(5);
  Case many;  // 600 pairs: past the row kernel's limit
  many.bits.assign(4, 4);
  many.tokens = 5;
  for (int i = 0; i < 600; ++i) {
    many.lhs.push_back(static_cast<int64_t>(rng() % 5));
    many.rhs.push_back(static_cast<int64_t>(rng() % 4));
  }
  Case longest;  // K = 8192: each thread stages four 8-element units
  longest.bits = {4, 3};
  longest.experts = 2;
  longest.uniform = false;
  longest.k = 8192;
  longest.n = 6;
  longest.tokens = 2;
  longest.lhs = {1, 0, 1};
  longest.rhs = {1, 0, 0};
  longest.x_dtype = DType::kBF16;
  Case too_long = longest;  // K past the staging limit: the two-pass schedule
  too_long.k = 8192 + 64;
  Case wide;  // 4224 outputs of 128 groups: the tiles widen
  wide.bits.assign(1, 4);
  wide.experts = 1;
  wide.k = 4096;
  wide.group = 32;
  wide.n = 4224;
  wide.tokens = 1;
  Case special;  // zero, tiny and huge blocks, f16 activations, every width
  special.bits = {2, 4, 8, 5};
  special.uniform = false;
  special.k = 512;
  special.special_x = true;
  special.x_dtype = DType::kF16;
  special.lhs = {0, 1, 2, 0};
  special.rhs = {0, 1, 2, 3};
  Case special_many = special;  // past the row kernel's limit
  for (int i = 0; i < 596; ++i) {
    special_many.lhs.push_back(i % 3);
    special_many.rhs.push_back(i % 4);
  }
  special_many.x_dtype = DType::kF32;
  Case unaligned = longest;  // a 4-bit expert after 603 words of a 3-bit one: rows not in 16-byte units
  unaligned.bits = {3, 4};
  unaligned.n = 67;
  unaligned.k = 96;
  unaligned.group = 32;
  unaligned.x_dtype = DType::kF32;
  for (const Case* c : {&many, &longest, &too_long, &wide, &special, &special_many, &unaligned}) {
    SCOPED_TRACE("k " + std::to_string(c->k) + ", n " + std::to_string(c->n));
    run(*c);
  }
}

TEST(GatherQmmDevices, MixedBitsWithPrunedExpertSortedPairs) {
  Case c;
  c.experts = 5;
  c.bits = {4, 0, 8, 2, 3};
  c.uniform = false;
  c.n = 7;
  c.x_dtype = DType::kBF16;
  c.scale_dtype = DType::kBF16;
  c.lhs = {0, 1, 2, 0, 2, 1, 0};
  c.rhs = {0, 0, 2, 3, 3, 4, 4};
  c.sorted = true;
  run(c);
}

// Sorted pairs, 64 and more (qmm_tile: 4 and more per expert on average, qmm_mma: 1), or 64
// and more rows without rhs (qmm_mma: 16): the tiled schedule (work list of runs of <= 32
// pairs of one expert for qmm_tile, <= 64 for qmm_mma; 64 output columns per workgroup). Runs shorter and longer than a tile and than its half,
// partial column blocks, chunks of one and two blocks, every width, x rows by lhs or
// by pair, zero / tiny / huge activation blocks.
TEST(GatherQmmDevices, TiledScheduleForSortedPairs) {
  // Which tile kernel each GPU runs: qmm_mma where it has int8 cooperative matrices
  // (SWITCHBOARD_GPU_MMA=0 turns them off), qmm_tile elsewhere.
  for (const std::string& dev : test_devices()) {
    if (dev == "cpu") continue;
    ProgramBuilder b;
    b.output("y", b.neg(b.input("x", DType::kF32, {1})));
    auto s = Session::create(Program::from_bytes(b.serialize().value(), "probe").value(), SessionOptions{dev});
    if (!s.is_ok()) continue;  // reported as a skipped device by the cases below
    const bool mma = (*s)->device_description().find("int8 cooperative matrices") != std::string::npos;
    std::printf("[ TILE KERNEL ] %s: %s (%s)\n", dev.c_str(), mma ? "qmm_mma" : "qmm_tile",
                (*s)->device_description().c_str());
  }
  std::mt19937 rng(11);
  auto sorted_pairs = [&](Case& c, const std::vector<int>& run_lengths, bool with_lhs) {
    for (size_t e = 0; e < run_lengths.size(); ++e)
      for (int i = 0; i < run_lengths[e]; ++i) {
        c.rhs.push_back(static_cast<int64_t>(e));
        if (with_lhs) c.lhs.push_back(static_cast<int64_t>(rng() % static_cast<uint32_t>(c.tokens)));
      }
    c.sorted = true;
  };
  Case mixed;  // 7 experts of every width (one pruned, unused), 70 columns of bf16
  mixed.experts = 7;
  mixed.bits = {4, 3, 0, 8, 2, 5, 6};
  mixed.uniform = false;
  mixed.n = 70;
  mixed.k = 192;
  mixed.tokens = 9;
  mixed.x_dtype = DType::kBF16;
  sorted_pairs(mixed, {70, 1, 0, 33, 32, 5, 31}, true);
  Case odd = mixed;  // f32 outputs of an odd width, 3 blocks per row (a one-block chunk), groups of 32
  odd.rhs.clear();
  odd.lhs.clear();
  odd.n = 67;
  odd.k = 96;
  odd.group = 32;
  odd.x_dtype = DType::kF32;
  odd.scale_dtype = DType::kBF16;
  sorted_pairs(odd, {3, 40, 0, 0, 64, 1, 2}, true);
  Case odd4 = odd;  // the same, every expert 4-bit (qmm_mma4: one-block chunk, groups of one block)
  odd4.bits.assign(7, 4);
  Case by_pair;  // no lhs: pair p reads row p (the down projection), groups of 128
  by_pair.bits.assign(3, 4);
  by_pair.experts = 3;
  by_pair.n = 128;
  by_pair.k = 384;
  by_pair.group = 128;
  by_pair.tokens = 96;
  sorted_pairs(by_pair, {10, 50, 36}, false);
  Case special = by_pair;  // zero, tiny and huge blocks in f16
  special.rhs.clear();
  special.k = 512;
  special.group = 64;
  special.special_x = true;
  special.x_dtype = DType::kF16;
  sorted_pairs(special, {64, 0, 32}, false);
  special.tokens = 96;
  Case extreme;  // the largest packed two-column sums: +-16 * 127 * 15 per half block
  extreme.bits = {4, 3, 2};
  extreme.uniform = false;
  extreme.experts = 3;
  extreme.n = 64;
  extreme.k = 128;
  extreme.tokens = 2;
  extreme.extreme = true;
  sorted_pairs(extreme, {40, 30, 20}, true);
  auto four_bit = [](int64_t experts, int64_t n, int64_t k, int64_t tokens) {  // every expert 4-bit
    Case c;
    c.experts = experts;
    c.bits.assign(static_cast<size_t>(experts), 4);
    c.n = n;
    c.k = k;
    c.tokens = tokens;
    return c;
  };
  // 300 experts: the work list scans the pairs once per 256 experts, 2,048 at a time
  Case many_experts = four_bit(300, 6, 64, 20);
  {
    std::vector<int> runs(300, 0);
    runs[1] = 600, runs[255] = 33, runs[256] = 300, runs[299] = 1267;  // 2,200 pairs: two passes of 2,048
    sorted_pairs(many_experts, runs, true);
  }
  Case dense;  // no indices: every row is a pair of expert 0 (a dense projection)
  dense.bits = {4};
  dense.experts = 1;
  dense.n = 130;
  dense.k = 256;
  dense.tokens = 100;
  Case dense_lhs = dense;  // rows picked by lhs, no rhs
  dense_lhs.x_dtype = DType::kBF16;
  for (int i = 0; i < 70; ++i) dense_lhs.lhs.push_back((i * 37) % 100);
  Case dense_short = dense;  // a short prompt's 24 rows: the MMA tiles where they run, qmm_row elsewhere
  dense_short.tokens = 24;
  Case sparse = four_bit(64, 66, 128, 40);  // 78 sorted pairs over 64 experts (one unused): the MMA tiles where they run
  {
    std::vector<int> runs(64, 1);
    runs[0] = 9, runs[5] = 0, runs[63] = 8;
    sorted_pairs(sparse, runs, true);
  }
  Case dense_wide = dense;  // enough columns for the MMA kernels' 64-pair tiles without rhs (3 x 86 workgroups)
  dense_wide.n = 86 * 64;
  dense_wide.k = 64;
  dense_wide.tokens = 130;
  for (const Case* c :
       {&mixed, &odd, &odd4, &by_pair, &special, &extreme, &many_experts, &dense, &dense_lhs, &dense_short, &sparse,
        &dense_wide}) {
    SCOPED_TRACE("k " + std::to_string(c->k) + ", n " + std::to_string(c->n) + ", pairs " +
                 std::to_string(c->rhs.size()));
    run(*c);
  }
}

// The tiled schedule finds bad data by itself too.
TEST(GatherQmmDevices, TiledScheduleDataErrors) {
  Case c;
  c.bits = {4, 0, 4};
  c.experts = 3;
  c.uniform = false;
  c.tokens = 4;
  for (int i = 0; i < 80; ++i) {
    c.lhs.push_back(i % 4);
    c.rhs.push_back(i < 40 ? 0 : 2);
  }
  c.sorted = true;
  auto expect = [&](const char* what) {
    Built in = make_inputs(c);
    ProgramBuilder b;
    build(b, c, in);
    check_op_error(b, in.inputs, what);
  };
  c.rhs[79] = 3;
  expect("out of range");
  c.rhs[79] = 2;
  c.rhs[50] = 1;
  expect("which is pruned (0 bits)");
  c.rhs[50] = 2;
  c.rhs[10] = 2;
  expect("sorted_indices is set but rhs_indices");
  c.rhs.clear();  // no rhs: every pair is expert 0's, here pruned
  c.bits = {0, 4, 4};
  expect("which is pruned (0 bits)");
}

// Gate and up projections of the same pairs and their Glu: the GPU fuses the three
// (qmm_row_glu) when nothing else reads the projections and the rows are few; with
// more rows, or a projection also an output, it runs them one by one. Bits equal the
// CPU's either way, and those of the CPU's Glu kernel on the oracle's rounded projections.
struct GluCase {
  Case c;
  GluKind kind = GluKind::kSwiGLU;
  bool up_first = false, gate_is_output = false;
  bool gate_read_later = false;  // an op after the Glu reads the gate projection: no fusion
};

// The CPU's own Glu kernel on the oracle's (rounded) gate and up projections.
std::vector<double> glu_ref(GluKind kind, DType dtype, const RefTensor& g, const RefTensor& u) {
  ProgramBuilder b;
  const std::vector<Dim> dims(g.shape.begin(), g.shape.end());
  b.output("y", b.glu(b.input("g", dtype, dims), b.input("u", dtype, dims), kind));
  auto program = Program::from_bytes(b.serialize().value(), "glu reference");
  auto session = Session::create(program.value(), SessionOptions{"cpu", false});
  EXPECT_TRUE(session.is_ok());
  (void)(*session)->set_input("g", make(dtype, g.shape, g.values));
  (void)(*session)->set_input("u", make(dtype, u.shape, u.values));
  EXPECT_TRUE((*session)->execute().is_ok());
  return (*session)->output("y")->to_doubles();
}

void run_glu(const GluCase& gc) {
  Case up = gc.c;
  up.seed += 100;
  Built in = make_inputs(gc.c), in_up = make_inputs(up);
  for (const char* k : {"w", "scales", "biases"}) in.inputs[std::string(k) + "_up"] = in_up.inputs.at(k);
  ProgramBuilder b;
  const Case& c = gc.c;
  auto experts = [&](const std::string& suffix) { return experts_input(b, c, in, suffix); };
  GatherOptions o = index_inputs(b, c);
  TensorRef x = b.input("x", c.x_dtype, {c.tokens, c.k});
  TensorRef g, u;
  if (gc.up_first) {
    u = b.gather_qmm(x, experts("_up"), o);
    g = b.gather_qmm(x, experts(""), o);
  } else {
    g = b.gather_qmm(x, experts(""), o);
    u = b.gather_qmm(x, experts("_up"), o);
  }
  TensorRef y = b.glu(g, u, gc.kind);
  b.output("y", gc.gate_read_later ? b.add(y, g) : y);
  if (gc.gate_is_output) b.output("gate", g);
  auto ref = [&](const Inputs& i) {
    Inputs iu = i;
    for (const char* k : {"w", "scales", "biases"}) iu[k] = i.at(std::string(k) + "_up");
    Expected eg = oracle(c, i), eu = oracle(c, iu), out;
    RefTensor y = eg.at("y");
    y.values = glu_ref(gc.kind, c.x_dtype, eg.at("y"), eu.at("y"));
    for (size_t j = 0; gc.gate_read_later && j < y.values.size(); ++j)
      y.values[j] = round_to(c.x_dtype, static_cast<float>(y.values[j]) + static_cast<float>(eg.at("y").values[j]));
    out["y"] = y;
    if (gc.gate_is_output) out["gate"] = eg.at("y");
    return out;
  };
  check_op(b, in.inputs, ref, Tolerance::exact());
}

TEST(GatherQmmDevices, FusedGateUpGlu) {
  GluCase decode;  // one token, 8 experts of mixed widths, f32
  decode.c.experts = 8;
  decode.c.bits = {4, 2, 8, 3, 4, 5, 6, 4};
  decode.c.uniform = false;
  decode.c.n = 96;
  decode.c.k = 256;
  decode.c.tokens = 1;
  decode.c.rhs = {3, 0, 7, 1, 2, 6, 4, 5};
  GluCase geglu = decode;  // bf16, two tokens by lhs, up emitted first
  geglu.kind = GluKind::kGEGLU;
  geglu.up_first = true;
  geglu.c.x_dtype = DType::kBF16;
  geglu.c.tokens = 2;
  geglu.c.lhs = {0, 0, 0, 1, 1, 1};
  geglu.c.rhs = {1, 4, 6, 0, 2, 7};
  GluCase clamped = decode;  // f16 with zero / tiny / huge blocks, groups of 32
  clamped.kind = GluKind::kClampedSwiGLU;
  clamped.c.x_dtype = DType::kF16;
  clamped.c.special_x = true;
  clamped.c.group = 32;
  GluCase wide = decode;  // K past qmm_row_glu_2k: the kernel with room for K = 8192
  wide.c.k = 4096;
  wide.c.n = 24;
  GluCase many = decode;  // 600 pairs: past the row kernel, one Q8 pass for both projections
  many.c.tokens = 75;
  many.c.rhs.clear();
  for (int i = 0; i < 600; ++i) {
    many.c.lhs.push_back(i / 8);
    many.c.rhs.push_back(i % 8);
  }
  GluCase tiled = decode;  // 96 sorted pairs (12 per expert): one Q8 pass and tile list, two tiled matmuls
  tiled.c.tokens = 24;
  tiled.c.x_dtype = DType::kBF16;
  tiled.c.rhs.clear();
  for (int i = 0; i < 96; ++i) {
    tiled.c.lhs.push_back((i * 7) % 24);
    tiled.c.rhs.push_back(i / 12);
  }
  tiled.c.sorted = true;
  GluCase decode4 = decode;  // every expert 4-bit: the *_dot4 row kernels where the device has them
  decode4.c.bits.assign(8, 4);
  decode4.c.x_dtype = DType::kBF16;
  GluCase wide4 = wide;
  wide4.c.bits.assign(8, 4);
  GluCase shared = decode;  // the gate projection is also an output: no fusion
  shared.gate_is_output = true;
  GluCase later = decode;  // ... or read after the Glu
  later.gate_read_later = true;
  for (const GluCase* gc : {&decode, &geglu, &clamped, &wide, &decode4, &wide4, &many, &tiled, &shared, &later}) {
    SCOPED_TRACE("kind " + std::to_string(static_cast<int>(gc->kind)) + ", pairs " + std::to_string(gc->c.rhs.size()));
    run_glu(*gc);
  }
}

// The down projection with combine_weights: out[t] = base[t] + sum over slots s of
// w[t, s] * y[t*k + s] (each product stored, i.e. rounded to x's dtype, first; slot
// order), base = sigmoid(gate) * shared, shared, or +0. GPUs run the projection, then
// combine.comp over the stored products.
struct CombineCase {
  Case c;  // pairs = tokens * slots, pair p reads row p (no lhs)
  int64_t slots = 8;
  bool shared = false, gate = false;
};

void run_combine(const CombineCase& cc) {
  const Case& c = cc.c;
  Built in = make_inputs(c);
  const int64_t tokens = c.tokens / cc.slots;
  std::mt19937 rng(c.seed + 99);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> w(static_cast<size_t>(c.tokens)), sh(static_cast<size_t>(tokens * c.n)),
      g(static_cast<size_t>(tokens));
  for (double& v : w) v = u(rng);
  for (double& v : sh) v = 4 * u(rng);
  for (double& v : g) v = 3 * u(rng);
  in.inputs["cw"] = make(DType::kF32, {tokens, cc.slots}, w);
  if (cc.shared) in.inputs["shared"] = make(c.x_dtype, {tokens, c.n}, sh);
  if (cc.gate) in.inputs["gate"] = make(c.x_dtype, {tokens, 1}, g);
  ProgramBuilder b;
  GatherOptions o = index_inputs(b, c);  // rhs only: pair p reads row p
  o.combine_weights = b.input("cw", DType::kF32, {tokens, cc.slots});
  if (cc.shared) o.shared = b.input("shared", c.x_dtype, {tokens, c.n});
  if (cc.gate) o.shared_gate = b.input("gate", c.x_dtype, {tokens, 1});
  b.output("y", b.gather_qmm(b.input("x", c.x_dtype, {c.tokens, c.k}), experts_input(b, c, in), o));
  auto ref = [&](const Inputs& i) {
    const std::vector<double> y = oracle(c, i).at("y").values, cw = i.at("cw").to_doubles();
    std::vector<double> shv = cc.shared ? i.at("shared").to_doubles() : std::vector<double>{};
    std::vector<double> gv = cc.gate ? i.at("gate").to_doubles() : std::vector<double>{};
    RefTensor r{{tokens, c.n}, {}, {}};
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t n = 0; n < c.n; ++n) {
        float acc = 0.0f;
        if (cc.shared) {
          const float s = static_cast<float>(shv[static_cast<size_t>(t * c.n + n)]);
          acc = cc.gate ? exact::sigmoid(static_cast<float>(gv[static_cast<size_t>(t)])) * s : s;
        }
        for (int64_t j = 0; j < cc.slots; ++j)
          acc = acc + static_cast<float>(cw[static_cast<size_t>(t * cc.slots + j)]) *
                          static_cast<float>(y[static_cast<size_t>((t * cc.slots + j) * c.n + n)]);
        r.values.push_back(round_to(c.x_dtype, acc));
      }
    return Expected{{"y", r}};
  };
  check_op(b, in.inputs, ref, Tolerance::exact());
}

TEST(GatherQmmDevices, DownProjectionWithCombine) {
  CombineCase decode;  // one token, 8 slots of 4-bit experts, K = 768 (Qwen3's down projection shape)
  decode.c.experts = 16;
  decode.c.bits.assign(16, 4);
  decode.c.n = 96;
  decode.c.k = 768;
  decode.c.tokens = 8;
  decode.c.rhs = {3, 15, 0, 7, 9, 2, 11, 5};
  CombineCase shared = decode;  // three tokens, bf16, a plain shared expert, groups of 32
  shared.c.k = 256;
  shared.c.n = 40;
  shared.c.group = 32;
  shared.c.x_dtype = DType::kBF16;
  shared.c.tokens = 24;
  shared.c.rhs.clear();
  for (int i = 0; i < 24; ++i) shared.c.rhs.push_back((i * 5) % 16);
  shared.shared = true;
  CombineCase gated;  // two tokens of 4 slots, mixed widths, f16, a sigmoid-gated shared expert
  gated.c.experts = 6;
  gated.c.bits = {4, 3, 8, 2, 4, 6};
  gated.c.uniform = false;
  gated.c.n = 34;
  gated.c.k = 192;
  gated.c.x_dtype = DType::kF16;
  gated.c.special_x = true;
  gated.c.tokens = 8;
  gated.c.rhs = {1, 0, 5, 2, 3, 4, 0, 1};
  gated.slots = 4;
  gated.shared = gated.gate = true;
  CombineCase wide = decode;  // K = 2048, a gated shared expert
  wide.c.k = 2048;
  wide.c.n = 20;
  wide.shared = wide.gate = true;
  CombineCase many = decode;  // one token of 10 slots: the combine loads slots 8 at a time, then the last 2
  many.slots = 10;
  many.c.tokens = 10;
  many.c.rhs = {3, 15, 0, 7, 9, 2, 11, 5, 12, 1};
  for (const CombineCase* cc : {&decode, &shared, &gated, &wide, &many}) {
    SCOPED_TRACE("k " + std::to_string(cc->c.k) + ", slots " + std::to_string(cc->slots) + ", pairs " +
                 std::to_string(cc->c.tokens));
    run_combine(*cc);
  }
}

// The whole MoE FFN (router, gate/up GatherQmm, Glu, down GatherQmm, combine). Sorted as
// prefill runs it (argsort first): on a GPU with int8 tensor cores and 4-bit experts, one
// kernel makes the Q8 blocks of h = Glu(gate, up) (qmm_mma4_glu) and h is never stored.
// Unsorted as decode runs it: the row kernels (gate/up/Glu in one dispatch, then the down
// projection with combine). Every device must give the CPU's bits, the router's outputs
// included (the CPU's GatherQmm is checked against the oracle above).
struct FfnCase {
  DType dt;
  GluKind kind;
  int64_t f;  // the experts' hidden width (gate/up rows, down's K)
  int group;
  bool shared_gate;
};

TEST(GatherQmmDevices, MoeFfnSortedAndDecode) {
  const int64_t d = 256, k = 2;
  const FfnCase cases[] = {{DType::kBF16, GluKind::kSwiGLU, 96, 32, true},
                           {DType::kF32, GluKind::kGEGLU, 128, 64, false},
                           {DType::kF16, GluKind::kClampedSwiGLU, 128, 128, false}};
  // Sorted: 48 tokens (96 pairs) and 256 (512: experts with more pairs than half an MMA
  // tile and than a whole one): the tiled schedule; 7 (14 pairs, < 4 per expert): the
  // row kernels; 40 over 64 experts (80 pairs, 1.25 a expert): tiled on the MMA kernels, rows
  // elsewhere. Unsorted (decode): 1 and 3 tokens.
  struct Run {
    int64_t m;
    bool sorted;
    FfnCase fc;
  };
  std::vector<Run> runs;
  for (const auto& [m, sorted] : {std::pair<int64_t, bool>{48, true}, {256, true}, {7, true}, {40, true}, {1, false}, {3, false}})
    for (const FfnCase& fc : cases) runs.push_back({m, sorted, fc});
  for (const auto& [m, sorted, fc] : runs) {
    SCOPED_TRACE(std::string(dtype_name(fc.dt)) + " glu " + std::to_string(static_cast<int>(fc.kind)) + " f " +
                 std::to_string(fc.f) + " tokens " + std::to_string(m) + (sorted ? " sorted" : " unsorted"));
    const int64_t experts = m == 40 ? 64 : 8;
    std::mt19937 rng(static_cast<uint32_t>(fc.f));
    std::normal_distribution<double> normal(0.0, 1.0);
    auto values = [&](int64_t n, double scale) {
      std::vector<double> v(static_cast<size_t>(n));
      for (double& x : v) x = scale * normal(rng);
      return v;
    };
    Inputs in;
    ProgramBuilder b;
    auto proj = [&](const std::string& name, int64_t n, int64_t kk) {
      Tensor w = make(DType::kF32, {experts * n, kk}, values(experts * n * kk, 0.1));
      auto q = affine_quantize(w, 4, fc.group, DType::kBF16);
      EXPECT_TRUE(q.is_ok()) << q.status().to_string();
      auto put = [&](const std::string& key, const Tensor& t, Shape shape) {
        auto v = t.reshaped(shape);
        EXPECT_TRUE(v.is_ok()) << key << ": " << v.status().to_string();
        if (v.is_ok()) in[key] = *v;
      };
      if (q.is_ok()) {
        put(name + ".w", q->w, {experts, n, kk / 8});
        put(name + ".s", q->scales, {experts, n, kk / fc.group});
        put(name + ".b", q->biases, {experts, n, kk / fc.group});
      }
      QuantizedExperts e;
      e.w = b.input(name + ".w", DType::kU32, {experts, n, kk / 8});
      e.scales = b.input(name + ".s", DType::kBF16, {experts, n, kk / fc.group});
      e.biases = b.input(name + ".b", DType::kBF16, {experts, n, kk / fc.group});
      e.group_size = fc.group;
      return e;
    };
    MoeExperts e{proj("gate", fc.f, d), proj("up", fc.f, d), proj("down", d, fc.f)};
    e.activation = fc.kind;
    e.sort_cutoff = sorted ? 0 : 64;
    in["x"] = make(fc.dt, {m, d}, values(m * d, 1.0));
    in["logits"] = make(DType::kF32, {m, experts}, values(m * experts, 2.0));
    TensorRef x = b.input("x", fc.dt, {m, d});
    RouterOut r = b.router(b.input("logits", DType::kF32, {m, experts}), RouterSpec{RouterKind::kSoftmaxTopK, int(k)});
    TensorRef shared, gate;
    if (fc.shared_gate) {
      in["shared"] = make(fc.dt, {m, d}, values(m * d, 0.5));
      in["sgate"] = make(fc.dt, {m, 1}, values(m, 1.0));
      shared = b.input("shared", fc.dt, {m, d});
      gate = b.input("sgate", fc.dt, {m, 1});
    }
    b.output("y", b.moe_experts(x, r.weights, r.indices, e, shared, gate));
    b.output("indices", r.indices);
    b.output("weights", r.weights);
    // The reference: the CPU's result of the same program.
    Expected want;
    detail::for_each_device(b, in, [&](const Program&, Session& s, const std::string& dev) {
      if (dev != "cpu") return;
      ASSERT_TRUE(s.execute().is_ok());
      for (const char* name : {"y", "indices", "weights"}) {
        Tensor t = *s.output(name);
        want[name] = RefTensor{t.shape(), t.to_doubles(), {}};
      }
    });
    if (m == 256) {  // the case covers what it claims: a tile's second half, and a second tile
      std::vector<int> per_expert(experts, 0);
      for (double i : want["indices"].values) ++per_expert[static_cast<size_t>(i)];
      EXPECT_GT(*std::max_element(per_expert.begin(), per_expert.end()), 64);
      EXPECT_TRUE(std::any_of(per_expert.begin(), per_expert.end(), [](int n) { return n > 32 && n < 64; }));
    }
    check_op(
        b, in, [&](const Inputs&) { return want; }, Tolerance::exact());
  }
}

TEST(GatherQmmDevices, AbsentIndicesUseExpertZeroAndRowOrder) {
  Case c;
  c.bits.assign(2, 4);
  c.experts = 2;
  c.tokens = 4;
  run(c);
}

TEST(GatherQmmDevices, DataErrorsAreFoundOnEveryDevice) {
  Case c;
  c.bits = {4, 0, 4};
  c.experts = 3;
  c.uniform = false;
  c.lhs = {0, 1};
  c.rhs = {2, 7};
  {
    Built in = make_inputs(c);
    ProgramBuilder b;
    build(b, c, in);
    check_op_error(b, in.inputs, "out of range");
  }
  c.rhs = {0, 1};
  {
    Built in = make_inputs(c);
    ProgramBuilder b;
    build(b, c, in);
    check_op_error(b, in.inputs, "which is pruned (0 bits)");
  }
  c.rhs = {2, 0};
  c.sorted = true;
  {
    Built in = make_inputs(c);
    ProgramBuilder b;
    build(b, c, in);
    check_op_error(b, in.inputs, "sorted_indices is set but rhs_indices");
  }
}

// dot32: 32 strided partial sums (product rounded, then the add), then the halving tree.
float dot32(const std::vector<float>& x, const std::vector<float>& w) {
  float part[32] = {};
  for (size_t i = 0; i < x.size(); ++i) {
    const float prod = x[i] * w[i];
    part[i % 32] = part[i % 32] + prod;
  }
  for (int s = 16; s >= 1; s /= 2)
    for (int i = 0; i < s; ++i) part[i] = part[i] + part[i + s];
  return part[0];
}

TEST(GatherMmDevices, Dot32OrderEveryFloatDtype) {
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16})
    for (int64_t k : {1, 31, 32, 100, 257}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " k=" + std::to_string(k));
      const int64_t e = 3, n = 5, t = 2;
      std::mt19937 rng(static_cast<uint32_t>(k) * 7 + static_cast<uint32_t>(dt));
      std::normal_distribution<float> normal(0.f, 1.f);
      std::vector<double> xv(static_cast<size_t>(t * k)), wv(static_cast<size_t>(e * n * k));
      for (auto& v : xv) v = normal(rng);
      for (auto& v : wv) v = normal(rng);
      const std::vector<int64_t> lhs = {1, 0, 1, 0}, rhs = {2, 0, 1, 2};
      Inputs in{{"x", make(dt, {t, k}, xv)},
                {"w", make(dt, {e, n, k}, wv)},
                {"lhs", make(DType::kI32, {4}, {1, 0, 1, 0})},
                {"rhs", make(DType::kI32, {4}, {2, 0, 1, 2})}};
      ProgramBuilder b;
      GatherOptions o;
      o.lhs_indices = b.input("lhs", DType::kI32, {4});
      o.rhs_indices = b.input("rhs", DType::kI32, {4});
      b.output("y", b.gather_mm(b.input("x", dt, {t, k}), b.input("w", dt, {e, n, k}), o));
      auto ref = [&](const Inputs& i) {
        const std::vector<double> xs = i.at("x").to_doubles(), ws = i.at("w").to_doubles();
        RefTensor r{{4, n}, {}, {}};
        for (size_t p = 0; p < lhs.size(); ++p)
          for (int64_t j = 0; j < n; ++j) {
            std::vector<float> xr(static_cast<size_t>(k)), wr(static_cast<size_t>(k));
            for (int64_t q = 0; q < k; ++q) {
              xr[q] = static_cast<float>(xs[lhs[p] * k + q]);
              wr[q] = static_cast<float>(ws[(rhs[p] * n + j) * k + q]);
            }
            r.values.push_back(round_to(dt, dot32(xr, wr)));
          }
        return Expected{{"y", r}};
      };
      check_op(b, in, ref, Tolerance::exact());
    }
}

}  // namespace
}  // namespace switchboard::optest
