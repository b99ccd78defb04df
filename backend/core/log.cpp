#include "log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <cstring>

namespace switchboard::log {

spdlog::logger& logger() {
  // Built once on first use; logs go to stderr so stdout stays machine-readable.
  static std::shared_ptr<spdlog::logger> instance = [] {
    auto l = std::make_shared<spdlog::logger>("switchboard", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    const char* level = std::getenv("SWITCHBOARD_LOG");
    l->set_level(level ? spdlog::level::from_str(level) : spdlog::level::warn);
    // Per-op lines are info messages: asking for them must not need a second variable.
    if (op_log_enabled() && l->level() > spdlog::level::info) l->set_level(spdlog::level::info);
    l->set_pattern("[switchboard %l] %v");
    return l;
  }();
  return *instance;
}

bool op_log_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("SWITCHBOARD_OP_LOG");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

}  // namespace switchboard::log
