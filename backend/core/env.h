// The process environment, read in one place: every SWITCHBOARD_* variable the library
// honours (README.md, "Environment"), parsed once on first use. They are defaults only:
// SessionOptions and the public setters (switchboard.h, switchboard/log.h) override them.
// env.cpp is the only library file that calls getenv.
#pragma once

#include <spdlog/common.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace switchboard {

struct EnvDefaults {
  // SWITCHBOARD_LOG, by spdlog's names (an unknown one reads as off, as spdlog parses it)
  spdlog::level::level_enum log_level = spdlog::level::warn;

  bool op_log = false;                         // SWITCHBOARD_OP_LOG
  std::string device;                          // SWITCHBOARD_DEVICE; empty: "cpu"
  int cpu_threads = 0;                         // SWITCHBOARD_THREADS; 0: one per hardware thread
  int cpu_path_limit = 3;                      // SWITCHBOARD_CPU_PATH, as parse_cpu_path numbers it
  size_t buffer_pool_bytes = size_t{1} << 30;  // SWITCHBOARD_BUFFER_POOL_MB
  uint64_t gpu_max_groups_x = 65535;           // SWITCHBOARD_GPU_MAX_GROUPS_X
  bool gpu_int8_mma = true;                    // SWITCHBOARD_GPU_MMA (=0: off)
  bool gpu_int_dot = true;                     // SWITCHBOARD_GPU_DOT (=0: off)
  bool gpu_handoff = true;                     // SWITCHBOARD_GPU_HANDOFF (=0: off)
  bool gpu_specialize = true;                  // SWITCHBOARD_GPU_SPECIALIZE (=0: off)
  uint64_t gpu_flush_bytes = 0;                // SWITCHBOARD_GPU_FLUSH_MB (0: an eighth of the free memory)
  bool gpu_replay = true;                      // SWITCHBOARD_GPU_REPLAY (=0: off)
  bool pipeline_stats = false;                 // SWITCHBOARD_PIPELINE_STATS
  std::string spirv_dir;                       // SWITCHBOARD_SPIRV_DIR
  std::string gpu_repeat;                      // SWITCHBOARD_GPU_REPEAT
  std::string gpu_timeline;                    // SWITCHBOARD_GPU_TIMELINE
};

// Read on first call, not at load time, so a process may still setenv() before it uses
// the library (the fuzzer does).
const EnvDefaults& env_defaults();

// SWITCHBOARD_CPU_PATH's names as cpu::CpuPath's values (portable 0 ... amx 3); -1 for
// any other name. Constexpr so the CPU layer can check the two agree.
constexpr int parse_cpu_path(std::string_view name) {
  return name == "portable" ? 0 : name == "avx2" ? 1 : name == "avx512" ? 2 : name == "amx" ? 3 : -1;
}

}  // namespace switchboard
