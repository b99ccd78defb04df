#include "log.h"

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <mutex>
#include <string_view>

#include "env.h"
#include "switchboard/log.h"

namespace switchboard {
namespace {

spdlog::level::level_enum to_spdlog(LogLevel l) {
  switch (l) {
    case LogLevel::kDebug: return spdlog::level::debug;
    case LogLevel::kInfo: return spdlog::level::info;
    case LogLevel::kWarn: return spdlog::level::warn;
    case LogLevel::kError: return spdlog::level::err;
    case LogLevel::kOff: break;
  }
  return spdlog::level::off;
}

// spdlog's trace and critical (reachable through $SWITCHBOARD_LOG) fold into their neighbours.
LogLevel from_spdlog(spdlog::level::level_enum l) {
  if (l <= spdlog::level::debug) return LogLevel::kDebug;
  if (l == spdlog::level::info) return LogLevel::kInfo;
  if (l == spdlog::level::warn) return LogLevel::kWarn;
  return l == spdlog::level::off ? LogLevel::kOff : LogLevel::kError;
}

// The logger's one sink: the embedder's callback when set, else stderr. base_sink's
// mutex guards both the swap and each call, so callbacks never overlap.
class HookSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  HookSink() : stderr_(std::make_shared<spdlog::sinks::stderr_color_sink_mt>()) {
    stderr_->set_pattern("[switchboard %l] %v");
  }
  void set_hook(LogSink hook) {
    std::lock_guard<std::mutex> lock(mutex_);
    hook_ = std::move(hook);
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (!hook_) return stderr_->log(msg);
    hook_(from_spdlog(msg.level), std::string_view(msg.payload.data(), msg.payload.size()));
  }
  void flush_() override { stderr_->flush(); }

 private:
  std::shared_ptr<spdlog::sinks::sink> stderr_;
  LogSink hook_;
};

const std::shared_ptr<HookSink>& hook_sink() {
  static const std::shared_ptr<HookSink> sink = std::make_shared<HookSink>();
  return sink;
}

}  // namespace

namespace log {

spdlog::logger& logger() {
  // Built once on first use; logs go to stderr so stdout stays machine-readable.
  static std::shared_ptr<spdlog::logger> instance = [] {
    auto l = std::make_shared<spdlog::logger>("switchboard", hook_sink());
    l->set_level(env_defaults().log_level);
    // Per-op lines are info messages: asking for them must not need a second variable.
    if (op_log_enabled() && l->level() > spdlog::level::info) l->set_level(spdlog::level::info);
    return l;
  }();
  return *instance;
}

bool op_log_enabled() { return env_defaults().op_log; }

}  // namespace log

void set_log_sink(LogSink sink) { hook_sink()->set_hook(std::move(sink)); }
void set_log_level(LogLevel level) { log::logger().set_level(to_spdlog(level)); }
LogLevel log_level() { return from_spdlog(log::logger().level()); }

}  // namespace switchboard
