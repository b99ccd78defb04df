// `switchboard inspect FILE`: the program's listing (describe_program_file) on stdout, or
// a one-line error and exit status 1.
#include <cstdio>

#include "cli.h"

namespace switchboard::cli {

int run_inspect(const std::string& path) {
  auto text = describe_program_file(path);
  if (!text) {
    std::fprintf(stderr, "switchboard inspect: %s\n", text.status().to_string().c_str());
    return 1;
  }
  std::fputs(text->c_str(), stdout);
  return 0;
}

}  // namespace switchboard::cli
