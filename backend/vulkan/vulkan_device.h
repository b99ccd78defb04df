// Opens the Vulkan device (backend/vulkan/vulkan_device.cpp).
#pragma once

#include <memory>

#include "device.h"
#include "device_registry.h"

namespace switchboard::vulkan {

// index < 0: the best device. kNotFound when there is no loader or no device;
// kFailedPrecondition when the device cannot meet the numerics contract. `options` choose
// kernel paths (each off only where asked; same bits either way) for this device alone.
Result<std::unique_ptr<Device>> open_vulkan_device(int index, const DeviceOptions& options);

}  // namespace switchboard::vulkan
