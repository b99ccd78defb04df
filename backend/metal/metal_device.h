// Opens the Metal device (backend/metal/metal_runtime.mm; Apple platforms only).
#pragma once

#include <memory>

#include "device.h"

namespace switchboard::metal {

// The system's default Metal device. kNotFound when there is none;
// kFailedPrecondition when its arithmetic fails the start-up probe.
Result<std::unique_ptr<Device>> open_metal_device();

}  // namespace switchboard::metal
