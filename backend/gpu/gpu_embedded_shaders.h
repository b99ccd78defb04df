// The kernels compiled at build time (cmake/shaders.cmake): SPIR-V for Vulkan, MSL
// for Metal and spirv-cross reflection JSON, one entry per kernel variant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace switchboard::gpu {

struct EmbeddedKernel {
  const char* name;
  const uint32_t* spirv;
  size_t spirv_words;
  const char* msl;
  const char* reflection_json;
};

extern const EmbeddedKernel kEmbeddedKernels[];
extern const size_t kNumEmbeddedKernels;

// The entry with this name, or null.
inline const EmbeddedKernel* find_embedded_kernel(const char* name) {
  for (size_t i = 0; i < kNumEmbeddedKernels; ++i)
    if (std::strcmp(kEmbeddedKernels[i].name, name) == 0) return &kEmbeddedKernels[i];
  return nullptr;
}

}  // namespace switchboard::gpu
