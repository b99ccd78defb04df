#include "device_registry.h"

#include <map>
#include <mutex>

#include "env.h"
#include "log.h"

namespace switchboard {
namespace {

std::mutex g_mu;

std::map<std::string, DeviceFactory>& factories() {
  static std::map<std::string, DeviceFactory> m;
  return m;
}

void ensure_builtins() {
  static std::once_flag once;
  std::call_once(once, [] { register_builtin_devices(); });
}

}  // namespace

void register_device(const std::string& name, DeviceFactory factory) {
  std::lock_guard<std::mutex> lock(g_mu);
  factories()[name] = std::move(factory);
}

DeviceOptions default_device_options() {
  const EnvDefaults& env = env_defaults();
  return {env.gpu_int8_mma, env.gpu_int_dot, env.gpu_handoff, env.pipeline_stats, env.spirv_dir};
}

Result<std::unique_ptr<Device>> open_device(const std::string& spec, bool cpu_fallback, const DeviceOptions& options) {
  ensure_builtins();
  std::string name = spec;
  if (name.empty()) {
    name = env_defaults().device.empty() ? "cpu" : env_defaults().device;
    cpu_fallback = true;
  }
  DeviceFactory factory;
  std::string known;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    const std::string base = name.substr(0, name.find(':'));
    for (const auto& [n, f] : factories()) {
      known += (known.empty() ? "" : ", ") + n;
      if (n == base) factory = f;
    }
  }
  Result<std::unique_ptr<Device>> dev =
      factory ? factory(name, options)
              : make_error(StatusCode::kNotFound, "unknown device '%s' (known: %s)", name.c_str(), known.c_str());
  if (dev.is_ok() || !cpu_fallback || !factory || dev.status().code() == StatusCode::kInvalidArgument) return dev;
  static std::once_flag once;
  std::call_once(
      once, [&] { log::warn("device '{}' is unavailable ({}); running on the CPU", name, dev.status().to_string()); });
  return open_device("cpu", false, options);
}

Result<DeviceFloor> measure_device_floor(const std::string& device, uint64_t bytes) {
  SB_ASSIGN_OR_RETURN(std::unique_ptr<Device> dev, open_device(device));
  return dev->measure_floor(bytes);
}

}  // namespace switchboard
