// The devices this build has, registered by name: the one place that knows them all.
#include <cstdlib>

#include "cpu_device.h"
#include "device_registry.h"
#if SWITCHBOARD_HAS_VULKAN
#include "vulkan_device.h"
#endif
#if SWITCHBOARD_HAS_METAL
#include "metal_device.h"
#endif

namespace switchboard {

namespace {

// kNotFound with no message: a spec this factory does not take (device_registry.h).
Status not_taken() { return Status(StatusCode::kNotFound, ""); }

Result<std::unique_ptr<Device>> open_cpu(const std::string& spec, const DeviceOptions&) {
  if (spec != "cpu") return not_taken();
  return make_cpu_device();
}

// "vulkan" (the best device) or "vulkan:N".
Result<std::unique_ptr<Device>> open_vulkan(const std::string& spec, const DeviceOptions& options) {
  int index = -1;
  if (spec.size() > 7) {
    char* end = nullptr;
    const long v = std::strtol(spec.c_str() + 7, &end, 10);
    if (*end || v < 0 || v > 1024)
      return make_error(StatusCode::kInvalidArgument, "device '%s': expected vulkan:N", spec.c_str());
    index = static_cast<int>(v);
  }
#if SWITCHBOARD_HAS_VULKAN
  return vulkan::open_vulkan_device(index, options);
#else
  (void)index, (void)options;
  return make_error(StatusCode::kNotFound, "this build has no Vulkan device");
#endif
}

Result<std::unique_ptr<Device>> open_metal(const std::string& spec, const DeviceOptions&) {
  if (spec != "metal") return not_taken();
#if SWITCHBOARD_HAS_METAL
  return metal::open_metal_device();
#else
  return make_error(StatusCode::kNotFound, "this build has no Metal device (Apple platforms only)");
#endif
}

}  // namespace

void register_builtin_devices() {
  register_device("cpu", "cpu", open_cpu);
  register_device("vulkan", "vulkan, vulkan:N", open_vulkan);
  register_device("metal", "metal", open_metal);
}

}  // namespace switchboard
