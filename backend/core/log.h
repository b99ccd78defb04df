// Logging through spdlog. SWITCHBOARD_LOG=debug|info|warn|error|off sets the
// level (default warn); SWITCHBOARD_OP_LOG=1 logs every executed op.
#pragma once

#include <spdlog/spdlog.h>

namespace switchboard::log {

spdlog::logger& logger();
bool op_log_enabled();

template <class... A>
void debug(spdlog::format_string_t<A...> fmt, A&&... args) {
  logger().debug(fmt, std::forward<A>(args)...);
}
template <class... A>
void info(spdlog::format_string_t<A...> fmt, A&&... args) {
  logger().info(fmt, std::forward<A>(args)...);
}
template <class... A>
void warn(spdlog::format_string_t<A...> fmt, A&&... args) {
  logger().warn(fmt, std::forward<A>(args)...);
}

}  // namespace switchboard::log
