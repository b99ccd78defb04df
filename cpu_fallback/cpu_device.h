// Makes the CPU fallback device: every op's reference kernel (opened by name through
// device_registry.h; the built-in devices are registered in backend/devices/).
#pragma once

#include <memory>

#include "device.h"

namespace switchboard {

std::unique_ptr<Device> make_cpu_device();

}  // namespace switchboard
