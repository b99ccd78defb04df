// Devices are opened by name through one registry: a device layer provides a factory for
// its name, and the library registers the built-in ones (backend/devices/) on first use,
// so no device includes another and the runtime includes none.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "device.h"

namespace switchboard {

// Per-open device policy: a session's options (SessionOptions' gpu_* and kernel
// development fields), each unset one from the environment. Devices without a use for a
// field ignore it; every choice gives the same bits.
struct DeviceOptions {
  bool gpu_int8_mma = true;     // int8 cooperative-matrix kernels, where the device has them
  bool gpu_int_dot = true;      // packed int8 dot-product row kernels, where the device has them
  bool gpu_handoff = true;      // decode kernels wait for each other's values, where known safe
  bool gpu_specialize = true;   // kernels built for their dispatch's dtypes (specialization constants)
  bool pipeline_stats = false;  // log each pipeline's compiler statistics (info level)
  std::string spirv_dir;        // kernel development: DIR/<kernel>.spv replaces a built-in kernel
  // Memory one submission may allocate before the interpreter syncs between ops (0: an eighth
  // of the device memory free when first needed).
  uint64_t gpu_flush_bytes = 0;
  // Profiling: every dispatch of these kernels (comma-separated names) recorded twice, so a
  // benchmark reads what one more such dispatch costs inside its chain.
  std::string gpu_repeat;
  // Profiling (bench/gpu_timeline.sh): each workgroup's start and end stamps, written by kernels
  // built with them, saved to this file when the device closes.
  std::string gpu_timeline;
};
// The environment's choices ($SWITCHBOARD_GPU_MMA, ... through env.h).
DeviceOptions default_device_options();

// Opens the device a spec names ("vulkan" or "vulkan:N" both reach the "vulkan" factory).
using DeviceFactory = std::function<Result<std::unique_ptr<Device>>(const std::string& spec, const DeviceOptions&)>;

// Adds (or replaces) the factory for `name`: specs "name" and "name:..." reach it; `usage`
// lists the specs it takes for error messages ("vulkan, vulkan:N"). A factory answers a spec
// it does not take with kNotFound and an empty message (the registry names the device
// unknown), one it cannot parse with kInvalidArgument (no CPU fallback for a typo).
void register_device(const std::string& name, const std::string& usage, DeviceFactory factory);

// "cpu", "vulkan", "vulkan:N", "metal" or a registered name; empty → the environment's
// default device ($SWITCHBOARD_DEVICE through env.h, else cpu), with cpu_fallback. Unknown
// names are kNotFound. With cpu_fallback a device that cannot be opened (but was named
// correctly) is replaced by the CPU, with one warning per process. `options` reach the
// device's factory.
Result<std::unique_ptr<Device>> open_device(const std::string& spec, bool cpu_fallback = false,
                                            const DeviceOptions& options = default_device_options());

// Defined by the library's device layer (backend/devices/builtin_devices.cpp): registers
// cpu, vulkan and metal. open_device calls it once, before the first lookup.
void register_builtin_devices();

}  // namespace switchboard
