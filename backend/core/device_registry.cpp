#include "device_registry.h"

#include <map>
#include <mutex>
#include <vector>

#include "env.h"
#include "file_io.h"
#include "log.h"

namespace switchboard {
namespace {

std::mutex g_mu;

struct Entry {
  std::string name, usage;
  DeviceFactory open;
};

// In registration order, so the "known" list of an error reads as registered.
std::vector<Entry>& entries() {
  static std::vector<Entry> v;
  return v;
}

void ensure_builtins() {
  static std::once_flag once;
  std::call_once(once, [] { register_builtin_devices(); });
}

}  // namespace

void register_device(const std::string& name, const std::string& usage, DeviceFactory factory) {
  std::lock_guard<std::mutex> lock(g_mu);
  for (Entry& e : entries())
    if (e.name == name) {
      e = {name, usage, std::move(factory)};
      return;
    }
  entries().push_back({name, usage, std::move(factory)});
}

DeviceOptions default_device_options() {
  const EnvDefaults& env = env_defaults();
  return {env.gpu_int8_mma,   env.gpu_int_dot, env.gpu_handoff,     env.gpu_specialize,
          env.pipeline_stats, env.spirv_dir,   env.gpu_flush_bytes, env.gpu_repeat,
          env.gpu_timeline};
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
    for (const Entry& e : entries()) {
      known += (known.empty() ? "" : ", ") + e.usage;
      if (e.name == base) factory = e.open;
    }
  }
  // A factory answers kNotFound for a spec it does not take ("cpu:1"): an unknown device.
  Result<std::unique_ptr<Device>> dev =
      factory ? factory(name, options) : Result<std::unique_ptr<Device>>(Status(StatusCode::kNotFound, ""));
  if (!dev.is_ok() && dev.status().code() == StatusCode::kNotFound && dev.status().message().empty())
    dev = make_error(StatusCode::kNotFound, "unknown device '%s' (known: %s)", clip(name).c_str(), known.c_str());
  if (dev.is_ok() || !cpu_fallback || dev.status().code() == StatusCode::kInvalidArgument) return dev;
  static std::once_flag once;
  std::call_once(
      once, [&] { log::warn("device '{}' is unavailable ({}); running on the CPU", clip(name), dev.status().to_string()); });
  return open_device("cpu", false, options);
}

Result<DeviceFloor> measure_device_floor(const std::string& device, uint64_t bytes) {
  SB_ASSIGN_OR_RETURN(std::unique_ptr<Device> dev, open_device(device));
  return dev->measure_floor(bytes);
}

}  // namespace switchboard
