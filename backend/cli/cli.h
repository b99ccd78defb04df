// Subcommands of the `switchboard` CLI. Each returns the process exit status.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "switchboard/switchboard.h"

namespace switchboard::cli {

struct DemoOptions {
  std::string save_dir;  // empty: a temporary directory
  std::string device;
};
int run_demo(const DemoOptions& opts);

struct BenchOptions {
  std::string model = "qwen3-30b-a3b";
  std::string device = "cpu";  // cpu | vulkan | vulkan:N (falls back to the CPU, saying so)
  int bits = 4;
  int group_size = 64;
  int64_t tokens = 1;
  std::string mixed;           // "8:0.05,4:0.80,2:0.15"
  std::string sorted = "auto"; // auto | always | never
  int threads = 0;             // 0: default
  int iterations = 0;          // 0: automatic
  bool json = false;
};
int run_bench_moe_layer(const BenchOptions& opts);

struct ExportCliOptions {
  std::string hf_dir, synthetic, out, dtype = "f32", bit_map;
  bool tiny_test = false;
  std::string tiny_family;  // --tiny-test's value: "" (qwen2_moe) or qwen3_5_moe
  int bits = 0, group_size = 64;
  int64_t max_seq = 0, layers = 0;
};
int run_export(const ExportCliOptions& o);

struct RunOptions {
  std::string program, prompt_ids, device;
  int64_t max_new_tokens = 16;
};
int run_run(const RunOptions& o);

struct ValidateOptions {
  std::string program_a, program_b, device_a = "cpu", device_b = "cpu", prompt_ids;
  int64_t max_new_tokens = 16;
  int runs = 3;
};
int run_validate(const ValidateOptions& o);

struct BenchModelOptions {
  std::string program, device = "cpu";
  // Instead of --program: a benchmark shape built in memory (no export), its first `layers`
  // layers (0: all), with random codes as `export --synthetic` writes them.
  std::string synthetic, dtype = "bf16";
  int64_t layers = 0, max_seq = 0;
  int bits = 4, group_size = 64;
  int64_t prompt_len = 512, gen = 64;
  // Prefills timed before the generation's own (prefill_tok_s is the median of all of them).
  int prefill_runs = 2;
  int threads = 0;
  bool json = false;
};
int run_bench_model(const BenchModelOptions& o);
// The middle value (the upper of the two middle ones; 0 for none).
double median(std::vector<double> v);
// An exported model: a directory holding program.sbp + weights.safetensors, or the .sbp.
Result<std::shared_ptr<const Program>> load_model(const std::string& path);
// Streaming read bandwidth of this machine with every kernel thread (GB/s, best of 5).
double measure_dram_gbps();
// A GPU's memory bandwidth from its own timestamps (gbps; -1 without a timer). Vulkan: the
// read bandwidth of stream_read (gpu_runtime.h ReadFloor), with the submission floor and,
// for floor_bytes > 0, the time of one cold read of that many bytes; other devices: a
// 96 MiB copy (read + written), best of 5.
struct DeviceBandwidth {
  double gbps = -1, empty_us = -1, read_us = -1;
  std::string method;  // "stream_read" or "copy"
};
DeviceBandwidth measure_device_bandwidth(const std::string& device, double floor_bytes);
struct InspectOptions {
  std::string path, weights;  // weights: default the program's sibling weights.safetensors
  bool verify = false;
};
int run_inspect(const InspectOptions& o);

}  // namespace switchboard::cli
