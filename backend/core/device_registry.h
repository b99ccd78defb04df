// Devices are opened by name through one registry: a device layer provides a factory for
// its name, and the library registers the built-in ones (backend/devices/) on first use,
// so no device includes another and the runtime includes none.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "device.h"

namespace switchboard {

// Opens the device a spec names ("vulkan" or "vulkan:N" both reach the "vulkan" factory).
using DeviceFactory = std::function<Result<std::unique_ptr<Device>>(const std::string& spec)>;

// Adds (or replaces) the factory for `name`: specs "name" and "name:..." reach it.
void register_device(const std::string& name, DeviceFactory factory);

// "cpu", "vulkan", "vulkan:N", "metal" or a registered name; empty → the environment's
// default device (env.h), with cpu_fallback. Unknown names are kNotFound. With
// cpu_fallback a device that cannot be opened (but was named correctly) is replaced by
// the CPU, with one warning per process.
Result<std::unique_ptr<Device>> open_device(const std::string& spec, bool cpu_fallback = false);

// Defined by the library's device layer (backend/devices/builtin_devices.cpp): registers
// cpu, vulkan and metal. open_device calls it once, before the first lookup.
void register_builtin_devices();

}  // namespace switchboard
