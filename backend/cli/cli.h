// Subcommands of the `switchboard` CLI. Each returns the process exit status.
#pragma once

#include <string>

namespace switchboard::cli {

struct DemoOptions {
  std::string save_dir;  // empty: a temporary directory
  std::string device;
};
int run_demo(const DemoOptions& opts);
int run_inspect(const std::string& path);

}  // namespace switchboard::cli
