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
      "demo", "Build a small MoE-layer program, save program + weights, load them back and run on the CPU");
  demo_cmd->add_option("--save", demo.save_dir, "Directory for program.sbp and weights.safetensors");
  demo_cmd->add_option("--device", demo.device, "Device to run on (cpu)");

  std::string inspect_path;
  auto* inspect_cmd = app.add_subcommand("inspect", "List a program file: header, chains, slots, constants, op counts");
  inspect_cmd->add_option("FILE", inspect_path, "Program file (.sbp)")->required();

  CLI11_PARSE(app, argc, argv);
  if (demo_cmd->parsed()) return switchboard::cli::run_demo(demo);
  if (inspect_cmd->parsed()) return switchboard::cli::run_inspect(inspect_path);
  return 1;
}
