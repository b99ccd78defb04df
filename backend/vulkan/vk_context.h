// The Vulkan runtime's device context (vk_runtime.cpp opens it; vk_replay.cpp submits
// recorded work): the loader's function table, the device, queue, pools and pipelines.
#pragma once

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "gpu_kernel_table.h"
#include "log.h"
#include "switchboard/status.h"

namespace switchboard::vulkan {
#define SB_VK_INSTANCE_FNS(X)                                                                              \
  X(vkDestroyInstance) X(vkEnumeratePhysicalDevices) X(vkGetPhysicalDeviceProperties)                      \
  X(vkGetPhysicalDeviceProperties2) X(vkGetPhysicalDeviceQueueFamilyProperties)                            \
  X(vkGetPhysicalDeviceMemoryProperties) X(vkCreateDevice) X(vkGetDeviceProcAddr)                          \
  X(vkEnumerateDeviceExtensionProperties) X(vkGetPhysicalDeviceFeatures) X(vkGetPhysicalDeviceFeatures2)    \
  X(vkGetPhysicalDeviceMemoryProperties2)
#define SB_VK_DEVICE_FNS(X)                                                                                \
  X(vkDestroyDevice) X(vkGetDeviceQueue) X(vkCreateBuffer) X(vkDestroyBuffer)                              \
  X(vkGetBufferMemoryRequirements) X(vkAllocateMemory) X(vkFreeMemory) X(vkBindBufferMemory) X(vkMapMemory) \
  X(vkCreateShaderModule) X(vkDestroyShaderModule) X(vkCreateDescriptorSetLayout)                          \
  X(vkDestroyDescriptorSetLayout) X(vkCreatePipelineLayout) X(vkDestroyPipelineLayout)                     \
  X(vkCreateComputePipelines) X(vkDestroyPipeline) X(vkCreateCommandPool) X(vkDestroyCommandPool)          \
  X(vkAllocateCommandBuffers) X(vkFreeCommandBuffers) X(vkBeginCommandBuffer) X(vkEndCommandBuffer)       \
  X(vkResetCommandBuffer) X(vkCmdBindPipeline) X(vkCmdPushConstants) X(vkCmdDispatch) X(vkCmdPipelineBarrier) \
  X(vkCmdPushDescriptorSetKHR) X(vkCreateFence) X(vkDestroyFence) X(vkWaitForFences) X(vkResetFences)      \
  X(vkGetFenceStatus)                                                                                      \
  X(vkQueueSubmit) X(vkDeviceWaitIdle) X(vkCreateQueryPool) X(vkDestroyQueryPool) X(vkCmdResetQueryPool)  \
  X(vkCmdWriteTimestamp) X(vkGetQueryPoolResults) X(vkResetQueryPool)

struct Pipeline {
  VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
  VkPipelineLayout layout = VK_NULL_HANDLE;
  VkPipeline pipeline = VK_NULL_HANDLE;
  const kernels::KernelInfo* info = nullptr;
  uint32_t local_size = 1;
};

struct Context {
  void* lib = nullptr;
  PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr = nullptr;
  PFN_vkCreateInstance vkCreateInstance = nullptr;
#define SB_DECLARE(f) PFN_##f f = nullptr;
  SB_VK_INSTANCE_FNS(SB_DECLARE)
  SB_VK_DEVICE_FNS(SB_DECLARE)
#undef SB_DECLARE
  VkInstance instance = VK_NULL_HANDLE;
  VkPhysicalDevice physical = VK_NULL_HANDLE;
  VkDevice device = VK_NULL_HANDLE;
  VkQueue queue = VK_NULL_HANDLE;
  uint32_t queue_family = 0;
  uint32_t memory_type = 0;
  uint64_t heap_bytes = 0;  // the heap of memory_type: tensors can never take more
  uint32_t heap_index = 0;
  bool memory_budget = false;  // VK_EXT_memory_budget: what the heap has left now
  VkPhysicalDeviceLimits limits{};
  uint32_t vendor_id = 0;
  VkPhysicalDeviceType device_type = VK_PHYSICAL_DEVICE_TYPE_OTHER;
  bool int64 = false;
  bool int8_mma = false;
  bool int_dot = false;
  // DeviceOptions::pipeline_stats and VK_KHR_pipeline_executable_properties: each pipeline's
  // compiler statistics (registers, shared memory, ...) are logged when it is created.
  PFN_vkGetPipelineExecutablePropertiesKHR vkGetPipelineExecutablePropertiesKHR = nullptr;
  PFN_vkGetPipelineExecutableStatisticsKHR vkGetPipelineExecutableStatisticsKHR = nullptr;
  VkCommandPool pool = VK_NULL_HANDLE;
  // One command buffer + fence per slice of an execute; grown on demand, reused.
  std::vector<VkCommandBuffer> cmds;
  std::vector<VkFence> fences;
  // GPU timestamps around each dispatch while SWITCHBOARD_OP_LOG is on.
  VkQueryPool timestamps = VK_NULL_HANDLE;
  uint32_t max_timed = 0;
  double ns_per_tick = 1.0;
  std::map<std::string, Pipeline> pipelines;
  std::string spirv_dir;  // DeviceOptions::spirv_dir: kernel development overrides
  bool specialize = true;  // DeviceOptions::gpu_specialize: off, pipelines keep their constants' defaults
  // DeviceOptions::gpu_timeline: a mapped buffer at binding kTimelineBinding of every pipeline,
  // where kernels built by bench/gpu_timeline.sh append their workgroups' stamps (word 0 counts
  // the records of 8 words after the first 8); saved to timeline_path when the device closes.
  static constexpr uint32_t kTimelineBinding = kernels::kMaxBindings;
  std::string timeline_path;
  VkBuffer timeline = VK_NULL_HANDLE;
  VkDeviceMemory timeline_mem = VK_NULL_HANDLE;
  uint32_t* timeline_words = nullptr;
  uint64_t timeline_bytes = 0;

  void save_timeline() {
    const uint64_t cap = timeline_bytes / 32 - 1, n = timeline_words[0] < cap ? timeline_words[0] : cap;
    FILE* f = std::fopen(timeline_path.c_str(), "wb");
    bool saved = f && std::fwrite(timeline_words, 4, 8 + 8 * n, f) == 8 + 8 * n;
    if (f) saved = std::fclose(f) == 0 && saved;
    if (!saved) log::warn("gpu_timeline: the stamps could not be written to {}", timeline_path);
    vkDestroyBuffer(device, timeline, nullptr);
    vkFreeMemory(device, timeline_mem, nullptr);
  }

  ~Context() {
    if (device) {
      vkDeviceWaitIdle(device);
      if (timeline) save_timeline();
      for (auto& [name, p] : pipelines) {
        vkDestroyPipeline(device, p.pipeline, nullptr);
        vkDestroyPipelineLayout(device, p.layout, nullptr);
        vkDestroyDescriptorSetLayout(device, p.set_layout, nullptr);
      }
      for (VkFence f : fences) vkDestroyFence(device, f, nullptr);
      if (timestamps) vkDestroyQueryPool(device, timestamps, nullptr);
      if (pool) vkDestroyCommandPool(device, pool, nullptr);
      vkDestroyDevice(device, nullptr);
    }
    // The instance and the loader stay for the process (see shared_instance()).
  }
};

inline std::string vk_error(const char* what, VkResult r) {
  return strformat("%s failed (VkResult %d)", what, static_cast<int>(r));
}
#define SB_VK_CHECK(call, what)                                                                        \
  do {                                                                                                 \
    VkResult r_ = (call);                                                                              \
    if (r_ != VK_SUCCESS) return make_error(StatusCode::kInternal, "%s", vk_error(what, r_).c_str()); \
  } while (0)

}  // namespace switchboard::vulkan
