// GatherQmm kernel throughput, apart from the rest of a layer.
//   Hot: one expert's weights reused every call (in cache) -> compute rate.
//   Cold: 8 fresh experts per call out of a >= 512 MiB pool -> memory rate.
//   Prefill: 512 tokens x top-8 of 128 experts, sorted by expert (runs of ~32
//   rows per expert: the AMX path where the CPU has it).
// The context line "cpu_path" names the path (SWITCHBOARD_CPU_PATH caps it).
// Run: build/release/bin/gather_qmm_bench --benchmark_format=json
#include <benchmark/benchmark.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "gather_qmm.h"
#include "bench_util.h"
#include "switchboard/builder.h"
#include "switchboard/switchboard.h"

using namespace switchboard;

namespace {

using bench::random_words;

Tensor small_f16(Shape s, float v) {
  Tensor t = Tensor::zeros(DType::kF16, s).value();
  for (int64_t i = 0; i < t.numel(); ++i) t.mutable_data_as<uint16_t>()[i] = f32_to_f16(v);
  return t;
}

struct Setup {
  std::unique_ptr<Session> session;
  int64_t experts, n, k, tokens;
  bool sorted;
};

// out = GatherQmm(x [T, K], 4-bit experts [E, N, K], group 64), pairs = T * 8;
// sorted: pairs ordered by expert, lhs_indices naming their tokens.
Setup make(int64_t experts, int64_t n, int64_t k, int64_t tokens, bool sorted = false) {
  ProgramBuilder b;
  TensorRef x = b.input("x", DType::kF32, {tokens, k});
  TensorRef rhs = b.input("rhs", DType::kI32, {tokens * 8});
  TensorRef lhs = sorted ? b.input("lhs", DType::kI32, {tokens * 8}) : TensorRef{};
  QuantizedExperts q{b.constant("w", DType::kU32, {experts, n, k / 8}), b.constant("s", DType::kF16, {experts, n, k / 64}),
                     b.constant("b", DType::kF16, {experts, n, k / 64}), 4, 64, {}};
  b.output("y", b.gather_qmm(x, q, GatherOptions{lhs, rhs, sorted ? 1 : 0}));
  LoadOptions lo;
  lo.constants = {{"w", random_words(experts * n * k / 8, 1).reshaped({experts, n, k / 8}).value()},
                  {"s", small_f16({experts, n, k / 64}, 0.01f)},
                  {"b", small_f16({experts, n, k / 64}, -0.02f)}};
  auto program = Program::from_bytes(b.serialize().value(), "bench", lo).value();
  Setup s{Session::create(program).value(), experts, n, k, tokens, sorted};
  Tensor xt = Tensor::zeros(DType::kF32, {tokens, k}).value();
  std::mt19937 rng(3);
  std::normal_distribution<float> d;
  for (int64_t i = 0; i < xt.numel(); ++i) xt.mutable_data_as<float>()[i] = d(rng);
  (void)s.session->set_input("x", xt);
  return s;
}

void run(benchmark::State& state, Setup& s, bool fresh_experts) {
  std::mt19937 rng(5);
  std::vector<int32_t> idx(static_cast<size_t>(s.tokens * 8));
  auto pick = [&] {
    for (auto& e : idx) e = fresh_experts ? static_cast<int32_t>(rng() % s.experts) : 0;
    if (s.sorted) {  // pair p is (token p / 8, expert idx[p]): order by expert, stably
      std::vector<int32_t> order(idx.size()), rhs, lhs;
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return idx[a] < idx[b]; });
      for (int32_t p : order) rhs.push_back(idx[p]), lhs.push_back(p / 8);
      (void)s.session->set_input("lhs", Tensor::from_vector<int32_t>(DType::kI32, {s.tokens * 8}, lhs).value());
      (void)s.session->set_input("rhs", Tensor::from_vector<int32_t>(DType::kI32, {s.tokens * 8}, rhs).value());
      return;
    }
    (void)s.session->set_input("rhs", Tensor::from_vector<int32_t>(DType::kI32, {s.tokens * 8}, idx).value());
  };
  pick();
  (void)s.session->execute();  // repack once
  for (auto _ : state) {
    state.PauseTiming();
    pick();
    state.ResumeTiming();
    benchmark::DoNotOptimize(s.session->execute());
  }
  const double pairs = static_cast<double>(s.tokens * 8);
  state.counters["GMAC/s"] = benchmark::Counter(pairs * s.n * s.k * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  state.counters["weight_GB/s"] = benchmark::Counter(
      pairs * s.n * (s.k / 2.0 + s.k / 64.0 * 4.0) * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

void BM_GatherQmmDecodeHot(benchmark::State& state) {
  static Setup s = make(1, 768, 2048, 1);
  run(state, s, false);
}
BENCHMARK(BM_GatherQmmDecodeHot)->Unit(benchmark::kMicrosecond);

void BM_GatherQmmDecodeCold(benchmark::State& state) {
  static Setup s = make(128 * 3, 768, 2048, 1);  // 3 x 128 experts of 0.8 MB: ~0.9 GB
  run(state, s, true);
}
BENCHMARK(BM_GatherQmmDecodeCold)->Unit(benchmark::kMicrosecond);

void BM_GatherQmmPrefill(benchmark::State& state) {
  static Setup s = make(128, 768, 2048, 512, true);  // 128 experts of 0.8 MB, 4096 pairs
  run(state, s, true);
}
BENCHMARK(BM_GatherQmmPrefill)->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::AddCustomContext("cpu_path", cpu::cpu_path_name(cpu::active_cpu_path()));
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
