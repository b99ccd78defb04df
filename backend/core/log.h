// Logging through spdlog: one logger whose lines go to stderr or to the embedder's sink
// (switchboard/log.h). Its level and the per-op log start from $SWITCHBOARD_LOG (default
// warn) and $SWITCHBOARD_OP_LOG (env.h).
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
