// `switchboard bench moe-layer`: one MoE layer (router + experts + combine) of a
// known model shape with random 4-bit (or mixed) weights, timed with cold
// weights: enough layer copies that the working set is >= 512 MiB, and fresh
// random routing every iteration. DRAM read bandwidth is measured in the same
// run, so the roofline ratio compares against this machine's own memory.
#include <algorithm>
#include <chrono>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli.h"
#include "switchboard/builder.h"
#include "switchboard/switchboard.h"

namespace switchboard::cli {
namespace {

struct Shape3 {
  int64_t experts, k, hidden, ffn;
};

const std::map<std::string, Shape3> kModels = {
    {"qwen3-30b-a3b", {128, 8, 2048, 768}},
    {"olmoe", {64, 8, 2048, 1024}},
    {"granite-1b-a400m", {32, 8, 1024, 512}},
};

// Per-expert bit widths from "8:0.05,4:0.80,2:0.15" (or all `bits`), spread deterministically.
Result<std::vector<uint8_t>> expert_bits(const std::string& mixed, int bits, int64_t experts) {
  std::vector<uint8_t> out;
  if (mixed.empty()) return std::vector<uint8_t>(static_cast<size_t>(experts), static_cast<uint8_t>(bits));
  std::stringstream ss(mixed);
  std::string item;
  double total = 0;
  while (std::getline(ss, item, ',')) {
    int b = 0;
    double frac = 0;
    if (std::sscanf(item.c_str(), "%d:%lf", &b, &frac) != 2 || frac < 0 || (b != 0 && b != 2 && b != 3 && b != 4 && b != 5 &&
                                                                             b != 6 && b != 8))
      return make_error(StatusCode::kInvalidArgument, "--mixed: bad entry '%s' (want bits:fraction)", item.c_str());
    total += frac;
    int64_t n = static_cast<int64_t>(frac * static_cast<double>(experts) + 0.5);
    for (int64_t i = 0; i < n && static_cast<int64_t>(out.size()) < experts; ++i) out.push_back(static_cast<uint8_t>(b));
  }
  SB_CHECK_OR_RETURN(total > 0.99 && total < 1.01, StatusCode::kInvalidArgument, "--mixed: fractions sum to %.3f", total);
  while (static_cast<int64_t>(out.size()) < experts) out.push_back(out.empty() ? 4 : out.back());
  std::mt19937 rng(1234);
  std::shuffle(out.begin(), out.end(), rng);
  return out;
}

Tensor random_bytes(DType dtype, Shape shape, uint64_t seed) {
  Tensor t = Tensor::zeros(dtype, shape).value();
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  auto* p = static_cast<uint8_t*>(t.mutable_data());
  for (size_t i = 0; i + 8 <= t.nbytes(); i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::memcpy(p + i, &x, 8);
  }
  return t;
}

// f16 scales in [0.001, 0.01) and biases in [-0.05, 0.05): plausible for 4-bit weights.
Tensor random_f16(Shape shape, uint64_t seed, float lo, float hi) {
  Tensor t = Tensor::zeros(DType::kF16, shape).value();
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.mutable_data_as<uint16_t>()[i] = f32_to_f16(dist(rng));
  return t;
}

struct Layer {
  std::shared_ptr<const Program> program;
  std::unique_ptr<Session> session;
};

int64_t projection_words(int64_t n, int64_t k, const std::vector<uint8_t>& bits) {
  int64_t w = 0;
  for (uint8_t b : bits) w += n * k * b / 32;
  return w;
}

Result<Layer> make_layer(const Shape3& m, const BenchOptions& o, const std::vector<uint8_t>& bits, int64_t sort_cutoff,
                         uint64_t seed) {
  ProgramBuilder b;
  TensorRef x = b.input("x", DType::kF32, {o.tokens, m.hidden});
  TensorRef logits = b.input("logits", DType::kF32, {o.tokens, m.experts});
  std::vector<std::pair<std::string, Tensor>> consts;
  auto proj = [&](const std::string& name, int64_t n, int64_t k) {
    QuantizedExperts q;
    q.w = b.constant(name + ".w", DType::kU32, {projection_words(n, k, bits)});
    q.scales = b.constant(name + ".scales", DType::kF16, {m.experts, n, k / o.group_size});
    q.biases = b.constant(name + ".biases", DType::kF16, {m.experts, n, k / o.group_size});
    q.group_size = o.group_size;
    q.expert_bits = bits;
    consts.emplace_back(name + ".w", random_bytes(DType::kU32, {projection_words(n, k, bits)}, seed++));
    consts.emplace_back(name + ".scales", random_f16({m.experts, n, k / o.group_size}, seed++, 0.001f, 0.01f));
    consts.emplace_back(name + ".biases", random_f16({m.experts, n, k / o.group_size}, seed++, -0.05f, 0.05f));
    return q;
  };
  MoeExperts e{proj("gate", m.ffn, m.hidden), proj("up", m.ffn, m.hidden), proj("down", m.hidden, m.ffn)};
  e.sort_cutoff = sort_cutoff;
  RouterSpec spec{RouterKind::kSoftmaxTopK, static_cast<int>(m.k), true};
  for (size_t i = 0; i < bits.size(); ++i)
    if (bits[i] == 0) spec.pruned_experts.push_back(static_cast<int32_t>(i));
  RouterOut r = b.router(logits, spec);
  b.output("y", b.moe_experts(x, r.weights, r.indices, e));
  b.output("indices", r.indices);
  SB_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, b.serialize());
  LoadOptions lo;
  lo.constants = std::move(consts);
  Layer layer;
  SB_ASSIGN_OR_RETURN(layer.program, Program::from_bytes(std::move(bytes), "bench", lo));
  SB_ASSIGN_OR_RETURN(layer.session, Session::create(layer.program, SessionOptions{o.device, true}));
  return layer;
}

}  // namespace

// Streaming read bandwidth over a 1 GiB buffer with every kernel thread, best of 5
// passes: the machine's capability, which the roofline compares against.
double measure_dram_gbps() {
  const size_t bytes = size_t{1} << 30;
  std::vector<uint64_t> buf(bytes / 8);
  const size_t threads = static_cast<size_t>(std::max(1, cpu_threads()));
  // Each thread fills, then sums, its own contiguous part.
  auto each = [&](auto fn) {
    std::vector<std::thread> pool;
    for (size_t t = 0; t < threads; ++t)
      pool.emplace_back([&, t] { fn(t, buf.size() * t / threads, buf.size() * (t + 1) / threads); });
    for (auto& th : pool) th.join();
  };
  each([&](size_t, size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) buf[i] = i;
  });
  double best = 0;
  for (int pass = 0; pass < 5; ++pass) {
    std::vector<uint64_t> sums(threads, 0);
    auto t0 = std::chrono::steady_clock::now();
    each([&](size_t t, size_t b, size_t e) {
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (size_t i = b; i + 4 <= e; i += 4) s0 += buf[i], s1 += buf[i + 1], s2 += buf[i + 2], s3 += buf[i + 3];
      sums[t] = s0 + s1 + s2 + s3;
    });
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    volatile uint64_t sink = sums[0];
    (void)sink;
    best = std::max(best, static_cast<double>(bytes) / s / 1e9);
  }
  return best;
}

namespace {

// A 96 MiB f32 -> f32 Cast (96 MiB read + 96 MiB written, beyond any GPU's L2), best of 5:
// a fallback only, since a copy kernel reads well below the device's bandwidth (RESULTS).
double measure_copy_gbps(const std::string& device) {
  ProgramBuilder b;
  const int64_t n = int64_t{24} << 20;
  b.output("y", b.cast(b.input("x", DType::kF32, {n}), DType::kF32));
  auto bytes = b.serialize();
  if (!bytes) return -1;
  auto program = Program::from_bytes(std::move(bytes).value(), "device bandwidth probe");
  if (!program) return -1;
  auto session = Session::create(*program, SessionOptions{device, true});
  if (!session) return -1;
  Tensor x = Tensor::zeros(DType::kF32, {n}).value();
  if (!(*session)->set_input("x", x)) return -1;
  double best = -1;
  for (int pass = 0; pass < 5; ++pass) {
    if (!(*session)->execute()) return -1;
    const double us = (*session)->last_device_time_us();
    if (us > 0) best = std::max(best, 2.0 * 4.0 * static_cast<double>(n) / (us * 1e-6) / 1e9);
  }
  return best;
}

}  // namespace

DeviceBandwidth measure_device_bandwidth(const std::string& device, double floor_bytes) {
  DeviceBandwidth d;
  if (device.rfind("vulkan", 0) == 0 || device == "metal") {
    auto floor = measure_device_floor(device, static_cast<uint64_t>(floor_bytes));
    if (floor) {
      d.gbps = floor->gbps, d.empty_us = floor->empty_us, d.read_us = floor->read_us, d.method = "stream_read";
      return d;
    }
    std::fprintf(stderr, "switchboard bench: read floor: %s; a copy measures the bandwidth\n",
                 floor.status().to_string().c_str());
  }
  d.gbps = measure_copy_gbps(device);
  d.method = "copy";
  return d;
}

namespace {

int fail(const Status& st) {
  std::fprintf(stderr, "switchboard bench: %s\n", st.to_string().c_str());
  return 1;
}

}  // namespace

int run_bench_moe_layer(const BenchOptions& o) {
  auto model = kModels.find(o.model);
  if (model == kModels.end()) return fail(make_error(StatusCode::kInvalidArgument, "unknown --model '%s'", o.model.c_str()));
  const Shape3& m = model->second;
  if (o.threads > 0) set_cpu_threads(o.threads);
  auto bits = expert_bits(o.mixed, o.bits, m.experts);
  if (!bits) return fail(bits.status());
  const int64_t cutoff = o.sorted == "always" ? 0 : o.sorted == "never" ? (int64_t{1} << 40) : MoeExperts{}.sort_cutoff;

  // Bytes of one expert's three projections as stored (codes + f16 scales and biases).
  auto expert_bytes = [&](int b) {
    const int64_t weights = 3 * m.hidden * m.ffn;
    return b == 0 ? 0.0 : weights * b / 8.0 + 2.0 * 2.0 * static_cast<double>(weights) / o.group_size;
  };
  double all_experts = 0;
  for (uint8_t b : *bits) all_experts += expert_bytes(b);
  const int layers = static_cast<int>(std::max(2.0, std::ceil(1.25 * 512.0 * (1 << 20) / all_experts)));
  std::vector<Layer> stack;
  for (int l = 0; l < layers; ++l) {
    auto layer = make_layer(m, o, *bits, cutoff, 1000 * static_cast<uint64_t>(l + 1));
    if (!layer) return fail(layer.status());
    stack.push_back(std::move(layer).value());
  }
  std::mt19937 rng(99);
  std::normal_distribution<float> dist(0.f, 1.f);
  auto random = [&](Shape s) {
    Tensor t = Tensor::zeros(DType::kF32, s).value();
    for (int64_t i = 0; i < t.numel(); ++i) t.mutable_data_as<float>()[i] = dist(rng);
    return t;
  };
  const Tensor x = random({o.tokens, m.hidden});
  const double dram_before = measure_dram_gbps();
  // Warm-up: one pass over every layer (repacks the weights once).
  for (Layer& l : stack) {
    if (Status st = l.session->set_input("x", x); !st) return fail(st);
    if (Status st = l.session->set_input("logits", random({o.tokens, m.experts})); !st) return fail(st);
    if (Status st = l.session->execute(); !st) return fail(st);
  }
  const int iters = o.iterations > 0 ? o.iterations : std::max(layers * 2, o.tokens >= 64 ? 6 : 40);
  double seconds = 0, bytes = 0, device_us = 0;
  bool timed = true;
  for (int i = 0; i < iters; ++i) {
    Layer& l = stack[static_cast<size_t>(i % layers)];
    (void)l.session->set_input("logits", random({o.tokens, m.experts}));
    auto t0 = std::chrono::steady_clock::now();
    if (Status st = l.session->execute(); !st) return fail(st);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double us = l.session->last_device_time_us();
    timed = timed && us > 0;
    device_us += us;
    Tensor idx = *l.session->output("indices");
    std::set<int32_t> used(idx.data_as<int32_t>(), idx.data_as<int32_t>() + idx.numel());
    for (int32_t e : used) bytes += expert_bytes((*bits)[static_cast<size_t>(e)]);
  }
  const double ms = seconds / iters * 1e3, bytes_per_layer = bytes / iters;
  const double dram = std::max(dram_before, measure_dram_gbps());
  const double flops = 2.0 * static_cast<double>(o.tokens) * m.k * 3.0 * m.hidden * m.ffn;
  nlohmann::json j = {
      {"benchmark", "moe-layer"},   {"model", o.model},
      {"tokens", o.tokens},         {"bits", o.bits},
      {"group_size", o.group_size}, {"mixed", o.mixed},
      {"sorted", o.sorted},         {"path", o.tokens > cutoff ? "sorted" : "unsorted"},
      {"threads", cpu_threads()},
      {"device", stack.front().session->device_name()},
      {"isa", cpu_isa()},
      {"layers_cycled", layers},    {"iterations", iters},
      {"ms_per_layer", ms},         {"bytes_per_layer", bytes_per_layer},
      {"dram_gbps", dram},          {"roofline_ms", bytes_per_layer / (dram * 1e9) * 1e3},
      {"roofline_ratio", bytes_per_layer / (dram * 1e9) / (ms / 1e3)},
      {"gflops", flops / (ms / 1e3) / 1e9},
  };
  if (stack.front().session->device_name() != "cpu") {
    // On a GPU the roofline is its own memory: bandwidth and kernel time from its timestamps.
    const DeviceBandwidth bw = measure_device_bandwidth(stack.front().session->device_name(), bytes_per_layer);
    const double gbps = bw.gbps;
    j["device_gbps"] = gbps;
    j["device_gbps_method"] = bw.method;
    // What no kernel design beats, timed the same way: a submission of one empty dispatch,
    // and of one dispatch that only reads the layer's bytes (cold).
    if (bw.empty_us > 0) j["gpu_empty_submission_us"] = bw.empty_us;
    if (bw.read_us > 0) j["gpu_read_floor_us"] = bw.read_us;
    if (timed) {
      const double gpu_us = device_us / iters;
      j["gpu_us_per_layer"] = gpu_us;
      if (gbps > 0) j["gpu_roofline_ratio"] = bytes_per_layer / (gbps * 1e9) / (gpu_us * 1e-6);
      j["gpu_gflops"] = flops / (gpu_us * 1e-6) / 1e9;
    }
  }
  std::printf("%s\n", o.json ? j.dump().c_str() : j.dump(2).c_str());
  return 0;
}

}  // namespace switchboard::cli
