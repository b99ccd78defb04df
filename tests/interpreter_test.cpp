// Interpreter behaviour: round trip through files, If on a host condition,
// dynamic shapes, mutable buffers, init chain, value inputs and outputs.
#include <filesystem>

#include "op_harness.h"
#include "safetensors.h"
#include "test_util.h"

namespace switchboard {
namespace {
using namespace switchboard::testing;

// A temp path of this process's own (two tests writing one file from parallel ctest processes
// raced: a write failed in CI).
std::filesystem::path temp_path(const std::string& name) { return process_scratch("sb_interpreter_test", name); }

// y = x @ w^T + b, with x [M dynamic, 3].
void build_linear(ProgramBuilder& b) {
  TensorRef x = b.input("x", DType::kF32, {Dim::dynamic(1, 16), 3});
  TensorRef w = b.constant("w", DType::kF32, {2, 3});
  TensorRef bias = b.constant("b", DType::kF32, {2});
  b.output("y", b.matmul(x, w, true, bias));
}

TEST(Interpreter, RoundTripThroughFiles) {
  namespace fs = std::filesystem;
  fs::path dir = temp_path("sb_roundtrip");
  fs::create_directories(dir);
  ProgramBuilder b;
  build_linear(b);
  SB_ASSERT_OK(b.save((dir / "p.sbp").string()));
  SB_ASSERT_OK(write_safetensors((dir / "w.safetensors").string(),
                                 {{"w", f32({2, 3}, {1, 2, 3, 4, 5, 6})}, {"b", f32({2}, {0.5f, -1})}}));
  auto program = Program::load((dir / "p.sbp").string(), LoadOptions{{(dir / "w.safetensors").string()}});
  ASSERT_TRUE(program.is_ok()) << program.status().to_string();
  ASSERT_EQ((*program)->inputs().size(), 1u);
  EXPECT_EQ((*program)->inputs()[0].shape[0].size, -1);
  EXPECT_EQ((*program)->inputs()[0].shape[0].max, 16);
  auto session = Session::create(*program);
  ASSERT_TRUE(session.is_ok()) << session.status().to_string();
  SB_ASSERT_OK((*session)->set_input("x", f32({2, 3}, {1, 0, 0, 1, 1, 1})));
  SB_ASSERT_OK((*session)->execute());
  Tensor y = (*session)->output("y").value();
  EXPECT_EQ(y.shape(), (Shape{2, 2}));
  EXPECT_EQ(floats(y), (std::vector<float>{1.5f, 3.f, 6.5f, 14.f}));
}

TEST(Interpreter, DynamicShapesServeOneAndManyTokens) {
  ProgramBuilder b;
  TensorRef x = b.input("x", DType::kF32, {Dim::dynamic(1, 8), 2});
  b.output("s", b.sum(b.mul(x, x), 1));
  auto program = load(b.serialize().value());
  auto session = Session::create(program).value();
  for (int64_t m : {1, 5, 8}) {
    std::vector<float> v(static_cast<size_t>(m * 2), 2.f);
    SB_ASSERT_OK(session->set_input("x", f32({m, 2}, v)));
    SB_ASSERT_OK(session->execute());
    EXPECT_EQ(session->output("s")->shape(), (Shape{m}));
    EXPECT_EQ(floats(*session->output("s")), std::vector<float>(static_cast<size_t>(m), 8.f));
  }
  Status st = session->set_input("x", f32({9, 2}, std::vector<float>(18, 1.f)));
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("does not fit"), std::string::npos) << st.message();
  st = session->set_input("x", Tensor::zeros(DType::kF16, {2, 2}).value());
  EXPECT_NE(st.message().find("dtype f16, expected f32"), std::string::npos) << st.message();
}

// cond = (M - 1) // cutoff: nonzero exactly when M > cutoff.
std::vector<uint8_t> build_branchy(std::vector<Dim> shape, int64_t cutoff) {
  ProgramBuilder b;
  TensorRef x = b.input("x", DType::kF32, shape);
  TensorRef two = b.constant("two", DType::kF32, {1});
  IntOrValue m = b.size(x, 0);
  IntOrValue cond = b.floordiv_int(b.sub_int(m, 1), cutoff);
  auto r = b.emit_if_else(
      cond, [&] { return std::vector<TensorRef>{b.mul(x, two)}; },  // "sorted" path stand-in
      [&] { return std::vector<TensorRef>{b.add(x, two)}; });
  b.output("y", r[0]);
  return b.serialize().value();
}

std::shared_ptr<const Program> load_with_two(const std::vector<uint8_t>& bytes) {
  auto file = temp_path("sb_two.safetensors");
  EXPECT_TRUE(write_safetensors(file.string(), {{"two", f32({1}, {2.f})}}).is_ok());
  auto p = Program::from_bytes(bytes, "branchy", LoadOptions{{file.string()}});
  EXPECT_TRUE(p.is_ok()) << p.status().to_string();
  return *p;
}

// Each temp is dropped after the last instruction that reads it, so its memory serves the
// ops after it: a chain of 24 ops allocates a few buffers, not one a step (a prefill holds a
// layer's temporaries, not the whole model's). The size is this test's own (the host pool is
// the process's).
TEST(Interpreter, DeadTempsServeLaterOps) {
  ProgramBuilder b;
  TensorRef x = b.input("x", DType::kF32, {4099});
  TensorRef t = x;
  for (int i = 0; i < 24; ++i) t = b.mul(t, x);
  b.output("y", t);
  auto session = Session::create(load(b.serialize().value()), SessionOptions{"cpu"}).value();
  SB_ASSERT_OK(session->set_input("x", f32({4099}, std::vector<float>(4099, 1.f))));
  const uint64_t before = buffer_allocations();
  SB_ASSERT_OK(session->execute());
  EXPECT_LE(buffer_allocations() - before, 4u);
  EXPECT_EQ(floats(*session->output("y")), std::vector<float>(4099, 1.f));
}

TEST(Interpreter, StaticShapeFoldsTheIfAway) {
  for (int64_t m : {1, 8}) {
    auto bytes = build_branchy({m, 4}, 4);
    auto counts = op_counts(bytes);
    EXPECT_EQ(counts["If"], 0);
    EXPECT_EQ(counts["SymSize"] + counts["IntArith"], 0) << "static shapes need no runtime scalar ops";
    EXPECT_EQ(counts[m > 4 ? "Binary" : "Binary"], 1) << "only the chosen branch is emitted";
    auto session = Session::create(load_with_two(bytes)).value();
    SB_ASSERT_OK(session->set_input("x", f32({m, 4}, std::vector<float>(static_cast<size_t>(m * 4), 3.f))));
    SB_ASSERT_OK(session->execute());
    EXPECT_EQ(floats(*session->output("y"))[0], m > 4 ? 6.f : 5.f);
  }
}

TEST(Interpreter, DynamicShapeTakesEachBranchOfOneIf) {
  auto bytes = build_branchy({Dim::dynamic(1, 64), 4}, 4);
  auto counts = op_counts(bytes);
  EXPECT_EQ(counts["If"], 1);
  EXPECT_EQ(unpack(bytes)->chains.size(), 3u);
  auto session = Session::create(load_with_two(bytes)).value();
  for (int64_t m : {1, 4, 5, 64}) {
    SB_ASSERT_OK(session->set_input("x", f32({m, 4}, std::vector<float>(static_cast<size_t>(m * 4), 3.f))));
    SB_ASSERT_OK(session->execute());
    Tensor y = *session->output("y");
    EXPECT_EQ(y.shape(), (Shape{m, 4}));
    EXPECT_EQ(floats(y)[0], m > 4 ? 6.f : 5.f) << "M=" << m;
  }
}

// acc += x on every execution; each session owns its own accumulator.
std::shared_ptr<const Program> accumulator() {
  ProgramBuilder b;
  TensorRef x = b.input("x", DType::kF32, {2});
  TensorRef acc = b.mutable_buffer("acc", DType::kF32, {2});
  TensorRef sum = b.add(acc, x);
  b.assign(acc, sum);
  b.output("sum", sum);
  return load(b.serialize().value());
}

TEST(Interpreter, MutableBuffersPersistPerSession) {
  auto program = accumulator();
  auto s1 = Session::create(program).value();
  auto s2 = Session::create(program).value();
  SB_ASSERT_OK(s1->set_input("x", f32({2}, {1, 2})));
  SB_ASSERT_OK(s2->set_input("x", f32({2}, {10, 20})));
  for (int i = 0; i < 3; ++i) SB_ASSERT_OK(s1->execute());
  SB_ASSERT_OK(s2->execute());
  EXPECT_EQ(floats(*s1->mutable_buffer("acc")), (std::vector<float>{3, 6}));
  EXPECT_EQ(floats(*s2->mutable_buffer("acc")), (std::vector<float>{10, 20}));
  Tensor before = *s1->output("sum");
  SB_ASSERT_OK(s1->execute());
  EXPECT_EQ(floats(before), (std::vector<float>{3, 6})) << "outputs handed out stay valid";
  SB_ASSERT_OK(s1->reset());
  EXPECT_EQ(floats(*s1->mutable_buffer("acc")), (std::vector<float>{0, 0}));
}

// Every device zeroes the mutable buffers on reset (a GPU on the device, with queued work), also
// when the memory it takes back is what an earlier prompt wrote.
TEST(Interpreter, ResetZeroesMutableBuffersOnEveryDevice) {
  auto program = accumulator();
  for (const std::string& dev : optest::test_devices()) {
    SCOPED_TRACE(dev);
    auto s = optest::detail::open_session(program, dev);
    if (!s) continue;
    SB_ASSERT_OK(s->set_input("x", f32({2}, {1, 2})));
    for (int round = 0; round < 3; ++round) {
      SB_ASSERT_OK(s->execute());
      SB_ASSERT_OK(s->execute());
      EXPECT_EQ(floats(*s->mutable_buffer("acc")), (std::vector<float>{2, 4})) << "round " << round;
      SB_ASSERT_OK(s->reset());
      EXPECT_EQ(floats(*s->mutable_buffer("acc")), (std::vector<float>{0, 0})) << "round " << round;
    }
  }
}

TEST(Interpreter, SliceUpdateCopiesOnWriteSoCallersTensorsNeverChange) {
  ProgramBuilder b;
  TensorRef row = b.input("row", DType::kF32, {1, 2});
  IntOrValue pos = b.input_value("pos");
  TensorRef cache = b.mutable_buffer("cache", DType::kF32, {3, 2});
  b.slice_update(cache, row, 0, pos);
  b.output("cache_out", b.copy(cache));
  auto session = Session::create(load(b.serialize().value())).value();
  std::vector<Tensor> seen;
  for (int64_t p = 0; p < 3; ++p) {
    SB_ASSERT_OK(session->set_input("row", f32({1, 2}, {float(p + 1), float(-p - 1)})));
    SB_ASSERT_OK(session->set_input_value("pos", p));
    SB_ASSERT_OK(session->execute());
    seen.push_back(*session->output("cache_out"));
  }
  EXPECT_EQ(floats(seen[0]), (std::vector<float>{1, -1, 0, 0, 0, 0}));
  EXPECT_EQ(floats(seen[2]), (std::vector<float>{1, -1, 2, -2, 3, -3}));
  SB_ASSERT_OK(session->set_input_value("pos", 3));
  Status st = session->execute();
  EXPECT_NE(st.message().find("exceeds dst dim 3"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("chains[0].instructions[0].SliceUpdate"), std::string::npos) << st.message();
}

TEST(Interpreter, InitChainFillsBuffersAtCreateAndReset) {
  ProgramBuilder b;
  TensorRef x = b.input("x", DType::kF32, {2});
  TensorRef table = b.mutable_buffer("table", DType::kF32, {2});
  TensorRef base = b.constant("base", DType::kF32, {2});
  b.emit_init([&] { b.assign(table, b.mul(base, base)); });
  b.assign(table, b.add(table, x));
  b.output("t", b.copy(table));
  auto file = temp_path("sb_base.safetensors");
  SB_ASSERT_OK(write_safetensors(file.string(), {{"base", f32({2}, {3, 4})}}));
  auto program = Program::from_bytes(b.serialize().value(), "init", LoadOptions{{file.string()}}).value();
  EXPECT_GE(program->impl().ir->init_chain, 1);
  auto session = Session::create(program).value();
  EXPECT_EQ(floats(*session->mutable_buffer("table")), (std::vector<float>{9, 16}));
  SB_ASSERT_OK(session->set_input("x", f32({2}, {1, 1})));
  SB_ASSERT_OK(session->execute());
  EXPECT_EQ(floats(*session->output("t")), (std::vector<float>{10, 17}));
  SB_ASSERT_OK(session->reset());
  EXPECT_EQ(floats(*session->mutable_buffer("table")), (std::vector<float>{9, 16}));
}

TEST(Interpreter, ValueInputsAndOutputs) {
  ProgramBuilder b;
  TensorRef x = b.input("x", DType::kF32, {Dim::dynamic(1, 100)});
  IntOrValue start = b.input_value("start");
  TensorRef tail = b.slice(x, 0, start, b.size(x, 0));
  b.output("tail", tail);
  b.output_value("n", b.mul_int(b.size(tail, 0), 10));
  auto session = Session::create(load(b.serialize().value())).value();
  SB_ASSERT_OK(session->set_input("x", f32({5}, {1, 2, 3, 4, 5})));
  SB_ASSERT_OK(session->set_input_value("start", 3));
  SB_ASSERT_OK(session->execute());
  EXPECT_EQ(floats(*session->output("tail")), (std::vector<float>{4, 5}));
  EXPECT_EQ(*session->output_value("n"), 20);
  EXPECT_EQ(session->output_value("tail").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(session->output("nope").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(session->set_input_value("x", 1).code(), StatusCode::kInvalidArgument);
}

TEST(Interpreter, ExecuteWithoutInputsIsAnError) {
  auto session = Session::create(accumulator()).value();
  Status st = session->execute();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("input 'x' was not set"), std::string::npos);
}

TEST(Interpreter, UnknownDeviceIsAClearError) {
  for (const char* spec : {"tpu", "cpu:1", "metal:0", "vulkanx"}) {
    auto s = Session::create(accumulator(), SessionOptions{spec});
    ASSERT_FALSE(s.is_ok()) << spec;
    EXPECT_EQ(s.status().code(), StatusCode::kNotFound) << spec;
    EXPECT_NE(s.status().message().find(std::string("unknown device '") + spec + "' (known: cpu, vulkan, vulkan:N, metal)"),
              std::string::npos)
        << s.status().to_string();
  }
  // A malformed index is a typo, never silently the CPU; an unknown name with the fallback is.
  SessionOptions typo{"vulkan:x"};
  typo.cpu_fallback = true;
  EXPECT_EQ(Session::create(accumulator(), typo).status().code(), StatusCode::kInvalidArgument);
  SessionOptions unknown{"tpu"};
  unknown.cpu_fallback = true;
  auto s = Session::create(accumulator(), unknown);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ((*s)->device_name(), "cpu");
}

TEST(Interpreter, SessionNeedsResolvedConstants) {
  ProgramBuilder b;
  build_linear(b);
  auto p = Program::from_bytes(b.serialize().value(), "lin", LoadOptions{{}, false});
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  auto s = Session::create(*p);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.status().message().find("not resolved"), std::string::npos);
}

}  // namespace
}  // namespace switchboard
