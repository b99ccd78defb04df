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

void register_builtin_devices() {
  register_device("cpu", [](const std::string& spec, const DeviceOptions&) -> Result<std::unique_ptr<Device>> {
    if (spec != "cpu") return make_error(StatusCode::kInvalidArgument, "device '%s': expected cpu", spec.c_str());
    return make_cpu_device();
  });
  register_device("vulkan",
                  [](const std::string& spec, const DeviceOptions& options) -> Result<std::unique_ptr<Device>> {
                    int index = -1;
                    if (spec.size() > 7) {  // "vulkan:N"
                      char* end = nullptr;
                      const long v = std::strtol(spec.c_str() + 7, &end, 10);
                      if (spec[6] != ':' || *end || v < 0 || v > 1024)
                        return make_error(StatusCode::kInvalidArgument, "device '%s': expected vulkan:N", spec.c_str());
                      index = static_cast<int>(v);
                    }
#if SWITCHBOARD_HAS_VULKAN
                    return vulkan::open_vulkan_device(index, options);
#else
    (void)index, (void)options;
    return make_error(StatusCode::kNotFound, "this build has no Vulkan device");
#endif
                  });
  register_device("metal", [](const std::string& spec, const DeviceOptions&) -> Result<std::unique_ptr<Device>> {
    if (spec != "metal") return make_error(StatusCode::kInvalidArgument, "device '%s': expected metal", spec.c_str());
#if SWITCHBOARD_HAS_METAL
    return metal::open_metal_device();
#else
    return make_error(StatusCode::kNotFound, "this build has no Metal device (Apple platforms only)");
#endif
  });
}

}  // namespace switchboard
