// What any kernel design can reach on this device, timed the way `switchboard bench
// moe-layer` times a layer (one submission; the device's timestamps from before the first
// dispatch to after the last): empty submissions, chains of dependent empty dispatches,
// and single dispatches that only read the bytes of a decode MoE layer (stream_read in
// probe.comp: 16-byte loads, four in flight per thread), cold (regions cycled past L2).
// Run: build/release/bin/gpu_floor_bench [--device-index N] [--iters 40] [--quick]
// Prints one JSON object per case.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "vk_runtime.h"

using namespace switchboard;

namespace {

// One 4-bit, group-64 Qwen3-30B-A3B expert as `bench moe-layer` counts it (codes plus
// f16 scales and biases of gate, up and down), and the layer's 8 of them.
constexpr double kExpertBytes = 3.0 * 2048 * 768 * (0.5 + 4.0 / 64);
constexpr double kLayerBytes = 8 * kExpertBytes;

struct Bench {
  std::unique_ptr<vulkan::VulkanRuntime> rt;
  std::vector<gpu::BufferRef> regions;  // cold data, cycled
  gpu::BufferRef out;                   // every dispatch writes it: consecutive ones are ordered
  size_t next = 0;
  int iters = 40;

  // One dispatch reading `bytes` of the next region (0: an empty kernel of one workgroup).
  Status read(double bytes, uint32_t groups) {
    return gpu::dispatch_stream_read(*rt, regions[next++ % regions.size()], static_cast<uint64_t>(bytes) / 16 * 16,
                                     groups, out);
  }

  // Median and minimum device time of a submission of `phases` dependent reads.
  Result<std::pair<double, double>> time(const std::vector<std::pair<double, uint32_t>>& phases) {
    std::vector<double> us;
    for (int i = 0; i < iters + 2; ++i) {
      for (const auto& [bytes, groups] : phases) SB_RETURN_IF_ERROR(read(bytes, groups));
      SB_RETURN_IF_ERROR(rt->sync());
      if (i >= 2) us.push_back(rt->last_gpu_us());  // two warm-up submissions (pipelines)
    }
    std::sort(us.begin(), us.end());
    return std::make_pair(us[us.size() / 2], us.front());
  }
};

int run(int index, int iters, bool quick) {
  auto rt = vulkan::VulkanRuntime::open(index);
  if (!rt) {
    std::fprintf(stderr, "gpu_floor_bench: %s\n", rt.status().to_string().c_str());
    return 1;
  }
  Bench b;
  b.rt = std::move(rt).value();
  b.iters = iters;
  // Regions of a layer's bytes, together ~17x an H100's 50 MB L2 (2 on --quick).
  const int64_t words = static_cast<int64_t>(kLayerBytes / 4) + 4;
  for (int i = 0; i < (quick ? 2 : 40); ++i) {
    auto t = b.rt->alloc(DType::kU32, {words});
    if (!t) return std::fprintf(stderr, "gpu_floor_bench: %s\n", t.status().to_string().c_str()), 1;
    auto ref = b.rt->bind(*t, false);
    if (!ref) return std::fprintf(stderr, "gpu_floor_bench: %s\n", ref.status().to_string().c_str()), 1;
    b.regions.push_back(*ref);
  }
  auto out = b.rt->scratch(size_t{1024} * 8448, 0);  // the widest grid below
  if (!out) return std::fprintf(stderr, "gpu_floor_bench: %s\n", out.status().to_string().c_str()), 1;
  b.out = *out;

  // layers > 1: the phases are `layers` repeats of one layer's (one submission, as in a
  // decode step); per_layer_us is the median over layers.
  auto report = [&](const std::string& name, const std::vector<std::pair<double, uint32_t>>& phases, int layers = 1) {
    auto t = b.time(phases);
    if (!t) return std::fprintf(stderr, "gpu_floor_bench: %s: %s\n", name.c_str(), t.status().to_string().c_str()), 1;
    double bytes = 0;
    nlohmann::json groups = nlohmann::json::array();
    for (const auto& [by, g] : phases) bytes += by, groups.push_back(g);
    nlohmann::json j = {{"case", name},         {"device", b.rt->description()}, {"bytes", bytes},
                        {"workgroups", groups}, {"median_us", t->first},         {"min_us", t->second}};
    if (bytes > 0) j["median_gbps"] = bytes / (t->first * 1e3);
    if (layers > 1) j["layers"] = layers, j["per_layer_us"] = t->first / layers;
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
    return 0;
  };
  int rc = 0;
  rc |= report("empty", {{0, 1}});
  rc |= report("empty_chain_2", {{0, 1}, {0, 1}});
  rc |= report("empty_chain_3", {{0, 1}, {0, 1}, {0, 1}});
  rc |= report("empty_chain_8", std::vector<std::pair<double, uint32_t>>(8, {0, 1}));
  // The layer's bytes in one dispatch, by grid size (132 SMs on an H100).
  for (uint32_t g : {132u, 264u, 528u, 792u, 1056u, 2112u, 4224u, 8448u}) {
    if (quick && g > 264) break;
    rc |= report("read_layer", {{kLayerBytes, g}});
  }
  // Its split as the decode kernels read it: gate + up, then down (after a router).
  for (uint32_t g : {528u, 1056u, 2112u}) {
    if (quick && g > 528) break;
    rc |= report("read_gate_up_then_down", {{kLayerBytes * 2 / 3, g}, {kLayerBytes / 3, g}});
    rc |= report("empty_then_gate_up_then_down", {{0, 1}, {kLayerBytes * 2 / 3, g}, {kLayerBytes / 3, g}});
  }
  // Eight layers in one submission: what a decode step pays per layer, the submission's
  // own start and end shared.
  auto repeat = [](std::vector<std::pair<double, uint32_t>> layer, int n) {
    std::vector<std::pair<double, uint32_t>> v;
    for (int i = 0; i < n; ++i) v.insert(v.end(), layer.begin(), layer.end());
    return v;
  };
  rc |= report("read_layer_x8", repeat({{kLayerBytes, quick ? 264u : 2112u}}, 8), 8);
  rc |= report("empty_then_gate_up_then_down_x8",
               repeat({{0, 1}, {kLayerBytes * 2 / 3, 528}, {kLayerBytes / 3, 528}}, 8), 8);
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  int index = -1, iters = 40;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--device-index") && i + 1 < argc)
      index = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc)
      iters = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--quick"))
      quick = true;
    else
      return std::fprintf(stderr, "usage: gpu_floor_bench [--device-index N] [--iters N] [--quick]\n"), 2;
  }
  return run(index, iters, quick);
}
