// switchboard: the command-line front end.
#include <CLI/CLI.hpp>

#include "cli.h"
#include "switchboard/switchboard.h"

int main(int argc, char** argv) {
  CLI::App app{"Switchboard: Mixture-of-Experts programs on CPU, Vulkan and Metal with identical bits"};
  app.set_version_flag("--version", switchboard::version());
  app.require_subcommand(1);

  switchboard::cli::DemoOptions demo;
  auto* demo_cmd = app.add_subcommand(
      "demo", "Build a 4-bit MoE-layer program, save program + weights, load them back and run it (M = 1 and 8)");
  demo_cmd->add_option("--save", demo.save_dir, "Directory for program.sbp and weights.safetensors");
  demo_cmd->add_option("--device", demo.device, "cpu | vulkan | vulkan:N (no Vulkan: the CPU, with a message)");

  std::string inspect_path;
  auto* inspect_cmd = app.add_subcommand("inspect", "List a program file: header, chains, slots, constants, op counts");
  inspect_cmd->add_option("FILE", inspect_path, "Program file (.sbp)")->required();

  switchboard::cli::BenchOptions bench;
  auto* bench_cmd = app.add_subcommand("bench", "Benchmarks that print JSON");
  bench_cmd->require_subcommand(1);
  auto* moe_cmd = bench_cmd->add_subcommand("moe-layer", "One MoE layer with cold weights: time, bytes, roofline");
  moe_cmd->add_option("--model", bench.model, "qwen3-30b-a3b | olmoe | granite-1b-a400m")
      ->check(CLI::IsMember({"qwen3-30b-a3b", "olmoe", "granite-1b-a400m"}));
  moe_cmd->add_option("--bits", bench.bits, "Bits of every expert (2, 3, 4, 5, 6, 8)")->check(CLI::IsMember({2, 3, 4, 5, 6, 8}));
  moe_cmd->add_option("--group-size", bench.group_size, "Quantization group size")->check(CLI::IsMember({32, 64, 128}));
  moe_cmd->add_option("--tokens", bench.tokens, "Tokens M per layer call")->check(CLI::Range(1, 4096));
  moe_cmd->add_option("--mixed", bench.mixed, "Per-expert bits as bits:fraction,... e.g. 8:0.05,4:0.80,2:0.15");
  moe_cmd->add_option("--sorted", bench.sorted, "auto | always | never")->check(CLI::IsMember({"auto", "always", "never"}));
  moe_cmd->add_option("--device", bench.device, "cpu | vulkan | vulkan:N (no Vulkan: the CPU, with a message)");
  moe_cmd->add_option("--threads", bench.threads, "Kernel threads (default: all cores)");
  moe_cmd->add_option("--iterations", bench.iterations, "Timed iterations (default: automatic)");
  moe_cmd->add_flag("--json", bench.json, "One JSON object on one line");

  CLI11_PARSE(app, argc, argv);
  if (moe_cmd->parsed()) return switchboard::cli::run_bench_moe_layer(bench);
  if (demo_cmd->parsed()) return switchboard::cli::run_demo(demo);
  if (inspect_cmd->parsed()) return switchboard::cli::run_inspect(inspect_path);
  return 1;
}
