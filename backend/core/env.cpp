#include "env.h"

#include <cstdlib>
#include <cstring>

namespace switchboard {
namespace {

// Set and not "0": the switches that turn a diagnostic on.
bool flag_on(const char* v) { return v && *v && std::strcmp(v, "0") != 0; }
// Exactly "0": the switches that turn a default-on kernel path off.
bool flag_off(const char* v) { return v && std::strcmp(v, "0") == 0; }

EnvDefaults read_env() {
  EnvDefaults e;
  if (const char* v = std::getenv("SWITCHBOARD_LOG")) e.log_level = spdlog::level::from_str(v);
  e.op_log = flag_on(std::getenv("SWITCHBOARD_OP_LOG"));
  if (const char* v = std::getenv("SWITCHBOARD_DEVICE"); v && *v) e.device = v;
  if (const char* v = std::getenv("SWITCHBOARD_THREADS"); v && std::atoi(v) > 0) e.cpu_threads = std::atoi(v);
  if (const char* v = std::getenv("SWITCHBOARD_CPU_PATH"); v && parse_cpu_path(v) >= 0)
    e.cpu_path_limit = parse_cpu_path(v);  // an unknown name leaves the SIMD path uncapped
  if (const char* v = std::getenv("SWITCHBOARD_BUFFER_POOL_MB"); v && *v)
    e.buffer_pool_bytes = static_cast<size_t>(std::strtoull(v, nullptr, 10)) << 20;
  if (const char* v = std::getenv("SWITCHBOARD_GPU_MAX_GROUPS_X")) {
    const long long n = std::atoll(v);
    if (n >= 1 && n <= 65535) e.gpu_max_groups_x = static_cast<uint64_t>(n);
  }
  e.gpu_int8_mma = !flag_off(std::getenv("SWITCHBOARD_GPU_MMA"));
  e.gpu_int_dot = !flag_off(std::getenv("SWITCHBOARD_GPU_DOT"));
  e.gpu_handoff = !flag_off(std::getenv("SWITCHBOARD_GPU_HANDOFF"));
  e.gpu_specialize = !flag_off(std::getenv("SWITCHBOARD_GPU_SPECIALIZE"));
  if (const char* v = std::getenv("SWITCHBOARD_GPU_FLUSH_MB"); v && *v)
    e.gpu_flush_bytes = static_cast<uint64_t>(std::strtoull(v, nullptr, 10)) << 20;
  e.gpu_replay = !flag_off(std::getenv("SWITCHBOARD_GPU_REPLAY"));
  e.pipeline_stats = flag_on(std::getenv("SWITCHBOARD_PIPELINE_STATS"));
  if (const char* v = std::getenv("SWITCHBOARD_SPIRV_DIR"); v && *v) e.spirv_dir = v;
  if (const char* v = std::getenv("SWITCHBOARD_GPU_REPEAT"); v && *v) e.gpu_repeat = v;
  if (const char* v = std::getenv("SWITCHBOARD_GPU_TIMELINE"); v && *v) e.gpu_timeline = v;
  return e;
}

}  // namespace

const EnvDefaults& env_defaults() {
  static const EnvDefaults e = read_env();
  return e;
}

}  // namespace switchboard
