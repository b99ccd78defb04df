// Subcommands of the `switchboard` CLI. Each returns the process exit status.
#pragma once

#include <string>

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
int run_inspect(const std::string& path);

}  // namespace switchboard::cli
