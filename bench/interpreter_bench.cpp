// Interpreter overhead: time per executed instruction for a chain of small ops,
// and program load time. Run: build/release/bin/interpreter_bench --benchmark_format=json
#include <benchmark/benchmark.h>

#include "switchboard/builder.h"
#include "switchboard/switchboard.h"

using namespace switchboard;

// A chain of `n` adds on a [1, 64] tensor: dominated by dispatch, not math.
static std::vector<uint8_t> add_chain(int n) {
  ProgramBuilder b;
  TensorRef x = b.input("x", DType::kF32, {1, 64});
  TensorRef y = x;
  for (int i = 0; i < n; ++i) {
    auto scope = b.tmp_scope();
    y = scope.keep(b.add(y, x));
  }
  b.output("y", y);
  return b.serialize().value();
}

static void BM_DispatchPerOp(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  auto program = Program::from_bytes(add_chain(n), "bench").value();
  auto session = Session::create(program).value();
  (void)session->set_input("x", Tensor::zeros(DType::kF32, {1, 64}).value());
  for (auto _ : state) benchmark::DoNotOptimize(session->execute());
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_DispatchPerOp)->Arg(64)->Arg(1024);

static void BM_LoadProgram(benchmark::State& state) {
  std::vector<uint8_t> bytes = add_chain(static_cast<int>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(Program::from_bytes(bytes, "bench"));
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes.size()));
}
BENCHMARK(BM_LoadProgram)->Arg(1024);

BENCHMARK_MAIN();
