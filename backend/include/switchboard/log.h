// Switchboard's log lines (loader detail, a device falling back to the CPU, per-op
// timings): an embedder can route them to its own logger or silence them. By default
// they go to stderr as "[switchboard warning] ...", at the level $SWITCHBOARD_LOG sets
// (warn when unset).
#pragma once

#include <functional>
#include <string_view>

namespace switchboard {

enum class LogLevel { kDebug, kInfo, kWarn, kError, kOff };

// Receives each line's text, without the "[switchboard level]" prefix. Calls may come
// from any thread but never overlap; a sink must not call back into Switchboard.
using LogSink = std::function<void(LogLevel level, std::string_view message)>;

// Sends every later line to `sink`; nullptr sends them to stderr again. Thread-safe.
void set_log_sink(LogSink sink);
// Lines below `level` are dropped (kOff: all of them). Thread-safe.
void set_log_level(LogLevel level);
LogLevel log_level();

}  // namespace switchboard
