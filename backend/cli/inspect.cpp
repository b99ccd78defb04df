// `switchboard inspect FILE`: the program's listing (describe_program_file) on stdout, or
// a one-line error and exit status 1. With --verify, the program is loaded against its
// weights file and every byte of that file is hashed against the program's record.
#include <cstdio>
#include <filesystem>

#include "cli.h"

namespace switchboard::cli {

namespace fs = std::filesystem;

int run_inspect(const InspectOptions& o) {
  fs::path program = o.path;
  std::error_code ec;
  if (o.verify && fs::is_directory(program, ec)) program /= "program.sbp";
  auto text = describe_program_file(program.string());
  if (!text) {
    std::fprintf(stderr, "switchboard inspect: %s\n", text.status().to_string().c_str());
    return 1;
  }
  std::fputs(text->c_str(), stdout);
  if (!o.verify) return 0;
  const std::string weights = o.weights.empty() ? (program.parent_path() / "weights.safetensors").string() : o.weights;
  LoadOptions lo;
  lo.weights = {weights};
  lo.verify_weights = true;
  auto loaded = Program::load(program.string(), lo);
  if (!loaded) {
    std::fprintf(stderr, "switchboard inspect: verify failed: %s\n", loaded.status().to_string().c_str());
    return 1;
  }
  std::printf("verified: %s matches %s (size, header and every byte; every constant resolves)\n", weights.c_str(),
              program.string().c_str());
  return 0;
}

}  // namespace switchboard::cli
