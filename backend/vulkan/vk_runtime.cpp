#include "vk_runtime.h"

#include <dlfcn.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "gpu_embedded_shaders.h"
#include "gpu_kernel_table.h"
#include "log.h"
#include "vk_context.h"
#include "vulkan_device.h"

namespace switchboard::vulkan {
namespace {

Status load_loader(Context& c) {
  c.lib = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!c.lib) c.lib = dlopen("libvulkan.so", RTLD_NOW | RTLD_LOCAL);
  SB_CHECK_OR_RETURN(c.lib, StatusCode::kNotFound, "no Vulkan loader (libvulkan.so.1 not found)");
  c.vkGetInstanceProcAddr = reinterpret_cast<PFN_vkGetInstanceProcAddr>(dlsym(c.lib, "vkGetInstanceProcAddr"));
  SB_CHECK_OR_RETURN(c.vkGetInstanceProcAddr, StatusCode::kNotFound, "the Vulkan loader lacks vkGetInstanceProcAddr");
  c.vkCreateInstance = reinterpret_cast<PFN_vkCreateInstance>(c.vkGetInstanceProcAddr(nullptr, "vkCreateInstance"));
  SB_CHECK_OR_RETURN(c.vkCreateInstance, StatusCode::kNotFound, "the Vulkan loader lacks vkCreateInstance");
  return Status::ok();
}

Status create_instance(Context& c) {
  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "switchboard";
  app.apiVersion = VK_API_VERSION_1_2;
  VkInstanceCreateInfo ci{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  ci.pApplicationInfo = &app;
  VkResult r = c.vkCreateInstance(&ci, nullptr, &c.instance);
  SB_CHECK_OR_RETURN(r == VK_SUCCESS, StatusCode::kNotFound, "vkCreateInstance failed (VkResult %d): no Vulkan driver?",
                     static_cast<int>(r));
#define SB_LOAD_I(f) \
  c.f = reinterpret_cast<PFN_##f>(c.vkGetInstanceProcAddr(c.instance, #f)); \
  SB_CHECK_OR_RETURN(c.f, StatusCode::kNotFound, "Vulkan instance function %s missing", #f);
  SB_VK_INSTANCE_FNS(SB_LOAD_I)
#undef SB_LOAD_I
  return Status::ok();
}

// One loader handle and one VkInstance per process, never released: destroying the
// last instance makes the loader unload the driver, and NVIDIA's driver, loaded
// again in the same process, refuses new instances (VK_ERROR_INCOMPATIBLE_DRIVER).
struct SharedInstance {
  Status status;
  Context fns;  // only the loader and instance members are filled
};

const SharedInstance& shared_instance() {
  static SharedInstance* si = [] {
    auto* s = new SharedInstance();
    s->status = load_loader(s->fns);
    if (s->status.is_ok()) s->status = create_instance(s->fns);
    return s;
  }();
  return *si;
}

Status attach_instance(Context& c) {
  const SharedInstance& si = shared_instance();
  SB_RETURN_IF_ERROR(si.status);
  c.lib = si.fns.lib;
  c.vkGetInstanceProcAddr = si.fns.vkGetInstanceProcAddr;
  c.vkCreateInstance = si.fns.vkCreateInstance;
  c.instance = si.fns.instance;
#define SB_COPY_I(f) c.f = si.fns.f;
  SB_VK_INSTANCE_FNS(SB_COPY_I)
#undef SB_COPY_I
  return Status::ok();
}

int device_rank(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return 4;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return 3;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return 1;
    default: return 0;
  }
}

Status pick_device(Context& c, int index, std::string& description) {
  uint32_t n = 0;
  c.vkEnumeratePhysicalDevices(c.instance, &n, nullptr);
  SB_CHECK_OR_RETURN(n > 0, StatusCode::kNotFound, "no Vulkan device");
  std::vector<VkPhysicalDevice> devs(n);
  c.vkEnumeratePhysicalDevices(c.instance, &n, devs.data());
  int best = -1, best_rank = -1;
  for (uint32_t i = 0; i < n; ++i) {
    VkPhysicalDeviceProperties p;
    c.vkGetPhysicalDeviceProperties(devs[i], &p);
    if (device_rank(p.deviceType) > best_rank) best = static_cast<int>(i), best_rank = device_rank(p.deviceType);
  }
  if (index >= 0) {
    SB_CHECK_OR_RETURN(static_cast<uint32_t>(index) < n, StatusCode::kNotFound, "vulkan:%d: only %u Vulkan device(s)",
                       index, n);
    best = index;
  }
  c.physical = devs[static_cast<size_t>(best)];
  VkPhysicalDeviceProperties p;
  c.vkGetPhysicalDeviceProperties(c.physical, &p);
  c.limits = p.limits;
  c.vendor_id = p.vendorID;
  c.device_type = p.deviceType;
  description = strformat("vulkan:%d %s (Vulkan %u.%u, driver 0x%x)", best, p.deviceName, VK_VERSION_MAJOR(p.apiVersion),
                          VK_VERSION_MINOR(p.apiVersion), p.driverVersion);
  SB_CHECK_OR_RETURN(VK_VERSION_MINOR(p.apiVersion) >= 2 || VK_VERSION_MAJOR(p.apiVersion) > 1, StatusCode::kNotFound,
                     "%s: Vulkan 1.2 is required", description.c_str());
  // Exact mode needs the float controls the shaders declare (docs/numerics.md).
  VkPhysicalDeviceFloatControlsProperties fc{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FLOAT_CONTROLS_PROPERTIES};
  VkPhysicalDeviceProperties2 p2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  p2.pNext = &fc;
  c.vkGetPhysicalDeviceProperties2(c.physical, &p2);
  SB_CHECK_OR_RETURN(fc.shaderRoundingModeRTEFloat32 && fc.shaderSignedZeroInfNanPreserveFloat32,
                     StatusCode::kFailedPrecondition,
                     "%s: exact mode refused: the device lacks RoundingModeRTE (%d) or SignedZeroInfNanPreserve (%d) "
                     "for fp32",
                     description.c_str(), fc.shaderRoundingModeRTEFloat32, fc.shaderSignedZeroInfNanPreserveFloat32);
  return Status::ok();
}

bool has_extension(const std::vector<VkExtensionProperties>& exts, const char* name) {
  for (const auto& e : exts)
    if (std::strcmp(e.extensionName, name) == 0) return true;
  return false;
}

// Whether qmm_mma can run: VK_NV_cooperative_matrix with the 16x16x32 int8 -> int32 shape
// at subgroup scope in compute shaders, plus the int8 and Vulkan memory model features
// its SPIR-V declares. DeviceOptions::gpu_int8_mma turns it off (the portable tiles run).
bool int8_mma_supported(Context& c, const std::vector<VkExtensionProperties>& exts) {
  if (!has_extension(exts, VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME)) return false;
  auto props_fn = reinterpret_cast<PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV>(
      c.vkGetInstanceProcAddr(c.instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV"));
  if (!props_fn) return false;
  VkPhysicalDeviceCooperativeMatrixFeaturesNV cm{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
  VkPhysicalDeviceVulkan12Features v12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  v12.pNext = &cm;
  VkPhysicalDeviceFeatures2 f2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  f2.pNext = &v12;
  c.vkGetPhysicalDeviceFeatures2(c.physical, &f2);
  if (!cm.cooperativeMatrix || !v12.shaderInt8 || !v12.vulkanMemoryModel) return false;
  VkPhysicalDeviceCooperativeMatrixPropertiesNV cp{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_PROPERTIES_NV};
  VkPhysicalDeviceProperties2 p2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  p2.pNext = &cp;
  c.vkGetPhysicalDeviceProperties2(c.physical, &p2);
  if (!(cp.cooperativeMatrixSupportedStages & VK_SHADER_STAGE_COMPUTE_BIT)) return false;
  uint32_t n = 0;
  if (props_fn(c.physical, &n, nullptr) != VK_SUCCESS) return false;
  std::vector<VkCooperativeMatrixPropertiesNV> shapes(n, {VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV});
  if (props_fn(c.physical, &n, shapes.data()) != VK_SUCCESS) return false;
  for (const auto& s : shapes)
    if (s.MSize == 16 && s.NSize == 16 && s.KSize == 32 && s.AType == VK_COMPONENT_TYPE_SINT8_NV &&
        s.BType == VK_COMPONENT_TYPE_SINT8_NV && s.CType == VK_COMPONENT_TYPE_SINT32_NV &&
        s.DType == VK_COMPONENT_TYPE_SINT32_NV && s.scope == VK_SCOPE_SUBGROUP_NV)
      return true;
  return false;
}

// Whether the *_dot4 row kernels can run: VK_KHR_shader_integer_dot_product's feature
// (lavapipe has it too, so CI runs them). DeviceOptions::gpu_int_dot turns it off.
bool int_dot_supported(Context& c, const std::vector<VkExtensionProperties>& exts) {
  if (!has_extension(exts, VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME)) return false;
  VkPhysicalDeviceShaderIntegerDotProductFeaturesKHR dot{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES_KHR};
  VkPhysicalDeviceFeatures2 f2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  f2.pNext = &dot;
  c.vkGetPhysicalDeviceFeatures2(c.physical, &f2);
  return dot.shaderIntegerDotProduct == VK_TRUE;
}

Status create_device(Context& c, const std::string& description, const DeviceOptions& options) {
  uint32_t n = 0;
  c.vkGetPhysicalDeviceQueueFamilyProperties(c.physical, &n, nullptr);
  std::vector<VkQueueFamilyProperties> fams(n);
  c.vkGetPhysicalDeviceQueueFamilyProperties(c.physical, &n, fams.data());
  int fam = -1;
  for (uint32_t i = 0; i < n && fam < 0; ++i)
    if (fams[i].queueFlags & VK_QUEUE_COMPUTE_BIT) fam = static_cast<int>(i);
  SB_CHECK_OR_RETURN(fam >= 0, StatusCode::kNotFound, "%s: no compute queue", description.c_str());
  c.queue_family = static_cast<uint32_t>(fam);

  uint32_t ne = 0;
  c.vkEnumerateDeviceExtensionProperties(c.physical, nullptr, &ne, nullptr);
  std::vector<VkExtensionProperties> exts(ne);
  c.vkEnumerateDeviceExtensionProperties(c.physical, nullptr, &ne, exts.data());
  bool push = false;
  for (const auto& e : exts) push |= std::strcmp(e.extensionName, VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME) == 0;
  SB_CHECK_OR_RETURN(push, StatusCode::kNotFound, "%s: VK_KHR_push_descriptor is required", description.c_str());

  VkPhysicalDeviceMemoryProperties mp;
  c.vkGetPhysicalDeviceMemoryProperties(c.physical, &mp);
  const VkMemoryPropertyFlags need = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  int best = -1;
  for (uint32_t i = 0; i < mp.memoryTypeCount; ++i) {
    VkMemoryPropertyFlags f = mp.memoryTypes[i].propertyFlags;
    if ((f & need) != need) continue;
    // Device-local and mappable (unified memory, or resizable BAR) beats host memory.
    if (best < 0 || ((f & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) &&
                     !(mp.memoryTypes[best].propertyFlags & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT)))
      best = static_cast<int>(i);
  }
  SB_CHECK_OR_RETURN(best >= 0, StatusCode::kNotFound, "%s: no host-visible coherent memory", description.c_str());
  c.memory_type = static_cast<uint32_t>(best);
  c.heap_index = mp.memoryTypes[best].heapIndex;
  c.heap_bytes = mp.memoryHeaps[c.heap_index].size;
  c.memory_budget = has_extension(exts, VK_EXT_MEMORY_BUDGET_EXTENSION_NAME);

  float prio = 1.0f;
  VkDeviceQueueCreateInfo qi{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  qi.queueFamilyIndex = c.queue_family;
  qi.queueCount = 1;
  qi.pQueuePriorities = &prio;
  std::vector<const char*> ext_names = {VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME};
  VkDeviceCreateInfo di{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  di.queueCreateInfoCount = 1;
  di.pQueueCreateInfos = &qi;
  const bool stats =
      options.pipeline_stats && has_extension(exts, VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
  VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR pe{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR};
  pe.pipelineExecutableInfo = VK_TRUE;
  if (stats) {
    ext_names.push_back(VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
    pe.pNext = const_cast<void*>(di.pNext);
    di.pNext = &pe;
  }
  c.int8_mma = options.gpu_int8_mma && int8_mma_supported(c, exts);
  VkPhysicalDeviceCooperativeMatrixFeaturesNV cm{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
  cm.cooperativeMatrix = VK_TRUE;
  // hostQueryReset (required by Vulkan 1.2): the execute's two timestamps are reset on the
  // host, so no reset command runs on the GPU ahead of the first dispatch.
  VkPhysicalDeviceVulkan12Features v12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  v12.hostQueryReset = VK_TRUE;
  v12.pNext = const_cast<void*>(di.pNext);
  if (c.int8_mma) {
    ext_names.push_back(VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME);
    v12.shaderInt8 = VK_TRUE;
    v12.vulkanMemoryModel = VK_TRUE;
    cm.pNext = v12.pNext;
    v12.pNext = &cm;
  }
  di.pNext = &v12;
  c.int_dot = options.gpu_int_dot && int_dot_supported(c, exts);
  VkPhysicalDeviceShaderIntegerDotProductFeaturesKHR dot{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES_KHR};
  dot.shaderIntegerDotProduct = VK_TRUE;
  if (c.int_dot) {
    ext_names.push_back(VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME);
    dot.pNext = const_cast<void*>(di.pNext);
    di.pNext = &dot;
  }
  VkPhysicalDeviceShaderClockFeaturesKHR clock{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CLOCK_FEATURES_KHR};
  clock.shaderSubgroupClock = clock.shaderDeviceClock = VK_TRUE;
  if (!options.gpu_timeline.empty()) {
    SB_CHECK_OR_RETURN(has_extension(exts, VK_KHR_SHADER_CLOCK_EXTENSION_NAME), StatusCode::kUnimplemented,
                       "gpu_timeline: the device has no %s", VK_KHR_SHADER_CLOCK_EXTENSION_NAME);
    ext_names.push_back(VK_KHR_SHADER_CLOCK_EXTENSION_NAME);
    clock.pNext = const_cast<void*>(di.pNext);
    di.pNext = &clock;
  }
  di.enabledExtensionCount = static_cast<uint32_t>(ext_names.size());
  di.ppEnabledExtensionNames = ext_names.data();
  // 64-bit integers for the integer kernels (int64.glsl), where the device has them.
  VkPhysicalDeviceFeatures have{}, want{};
  c.vkGetPhysicalDeviceFeatures(c.physical, &have);
  want.shaderInt64 = have.shaderInt64;
  c.int64 = have.shaderInt64 == VK_TRUE;
  di.pEnabledFeatures = &want;
  SB_VK_CHECK(c.vkCreateDevice(c.physical, &di, nullptr, &c.device), "vkCreateDevice");
#define SB_LOAD_D(f) \
  c.f = reinterpret_cast<PFN_##f>(c.vkGetDeviceProcAddr(c.device, #f)); \
  SB_CHECK_OR_RETURN(c.f, StatusCode::kNotFound, "Vulkan device function %s missing", #f);
  SB_VK_DEVICE_FNS(SB_LOAD_D)
#undef SB_LOAD_D
  if (stats) {
    c.vkGetPipelineExecutablePropertiesKHR = reinterpret_cast<PFN_vkGetPipelineExecutablePropertiesKHR>(
        c.vkGetDeviceProcAddr(c.device, "vkGetPipelineExecutablePropertiesKHR"));
    c.vkGetPipelineExecutableStatisticsKHR = reinterpret_cast<PFN_vkGetPipelineExecutableStatisticsKHR>(
        c.vkGetDeviceProcAddr(c.device, "vkGetPipelineExecutableStatisticsKHR"));
  }
  c.vkGetDeviceQueue(c.device, c.queue_family, 0, &c.queue);
  VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pi.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pi.queueFamilyIndex = c.queue_family;
  SB_VK_CHECK(c.vkCreateCommandPool(c.device, &pi, nullptr, &c.pool), "vkCreateCommandPool");
  if (fams[c.queue_family].timestampValidBits > 0 && c.limits.timestampComputeAndGraphics) {
    VkQueryPoolCreateInfo qp{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
    qp.queryType = VK_QUERY_TYPE_TIMESTAMP;
    qp.queryCount = 8192;  // a multiple of kQueryChunk
    SB_VK_CHECK(c.vkCreateQueryPool(c.device, &qp, nullptr, &c.timestamps), "vkCreateQueryPool");
    c.max_timed = qp.queryCount / 2;
    c.ns_per_tick = c.limits.timestampPeriod;
  }
  return Status::ok();
}

// Host-visible, coherent storage buffers, each with its own memory, mapped for life.
class VulkanBlocks final : public gpu::BlockAllocator {
 public:
  explicit VulkanBlocks(std::shared_ptr<Context> ctx) : ctx_(std::move(ctx)) {}
  Result<gpu::Block> create(uint64_t size) override {
    Context& c = *ctx_;
    VkBuffer buf = VK_NULL_HANDLE;
    VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
    bi.size = size;
    bi.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT;
    bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    SB_VK_CHECK(c.vkCreateBuffer(c.device, &bi, nullptr, &buf), "vkCreateBuffer");
    VkMemoryRequirements req;
    c.vkGetBufferMemoryRequirements(c.device, buf, &req);
    if (!(req.memoryTypeBits & (1u << c.memory_type))) {
      c.vkDestroyBuffer(c.device, buf, nullptr);
      return make_error(StatusCode::kInternal, "storage buffers cannot use the chosen memory type");
    }
    VkMemoryAllocateInfo mi{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
    mi.allocationSize = req.size;
    mi.memoryTypeIndex = c.memory_type;
    VkDeviceMemory mem = VK_NULL_HANDLE;
    VkResult r = c.vkAllocateMemory(c.device, &mi, nullptr, &mem);
    if (r != VK_SUCCESS) {
      c.vkDestroyBuffer(c.device, buf, nullptr);
      return make_error(StatusCode::kResourceExhausted, "vkAllocateMemory of %llu bytes failed (VkResult %d)",
                        (unsigned long long)size, static_cast<int>(r));
    }
    c.vkBindBufferMemory(c.device, buf, mem, 0);
    void* p = nullptr;
    r = c.vkMapMemory(c.device, mem, 0, VK_WHOLE_SIZE, 0, &p);
    gpu::Block b{reinterpret_cast<uint64_t>(buf), reinterpret_cast<uint64_t>(mem), static_cast<uint8_t*>(p), size};
    if (r != VK_SUCCESS) {
      destroy(b);
      return make_error(StatusCode::kInternal, "%s", vk_error("vkMapMemory", r).c_str());
    }
    return b;
  }
  void destroy(const gpu::Block& b) override {
    ctx_->vkDestroyBuffer(ctx_->device, reinterpret_cast<VkBuffer>(b.handle), nullptr);
    ctx_->vkFreeMemory(ctx_->device, reinterpret_cast<VkDeviceMemory>(b.memory), nullptr);
  }

 private:
  std::shared_ptr<Context> ctx_;  // the device outlives its blocks
};

// One line per compiler statistic of each executable of `pipeline` (diagnostics only).
void log_pipeline_stats(Context& c, const char* name, VkPipeline pipeline) {
  VkPipelineInfoKHR pi{VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR};
  pi.pipeline = pipeline;
  uint32_t n = 0;
  if (c.vkGetPipelineExecutablePropertiesKHR(c.device, &pi, &n, nullptr) != VK_SUCCESS) return;
  for (uint32_t e = 0; e < n; ++e) {
    VkPipelineExecutableInfoKHR ei{VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR};
    ei.pipeline = pipeline;
    ei.executableIndex = e;
    uint32_t m = 0;
    if (c.vkGetPipelineExecutableStatisticsKHR(c.device, &ei, &m, nullptr) != VK_SUCCESS) continue;
    std::vector<VkPipelineExecutableStatisticKHR> st(m, {VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR});
    if (c.vkGetPipelineExecutableStatisticsKHR(c.device, &ei, &m, st.data()) != VK_SUCCESS) continue;
    for (const auto& s : st) {
      std::string v;
      switch (s.format) {
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR: v = s.value.b32 ? "true" : "false"; break;
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR: v = std::to_string(s.value.i64); break;
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR: v = std::to_string(s.value.u64); break;
        default: v = std::to_string(s.value.f64); break;
      }
      log::logger().info("pipeline {} [{}] {} = {}", name, e, s.name, v);
    }
  }
}

// The pipeline of kernel `name` built for `spec` (one per distinct set of values).
Result<Pipeline*> pipeline_for(Context& c, const char* name, const gpu::SpecConstants& requested) {
  const gpu::SpecConstants spec = c.specialize ? requested : gpu::SpecConstants{};  // defaults: same bits
  SB_CHECK_OR_RETURN(spec.count <= 8, StatusCode::kInternal, "kernel %s: %u specialization constants", name,
                     spec.count);
  std::string key = name;
  for (uint32_t i = 0; i < spec.count; ++i) key += (i ? "," : "#") + std::to_string(spec.values[i]);
  auto it = c.pipelines.find(key);
  if (it != c.pipelines.end()) return &it->second;
  const kernels::KernelInfo* info = kernels::find_kernel(name);
  const gpu::EmbeddedKernel* code = gpu::find_embedded_kernel(name);
  SB_CHECK_OR_RETURN(info && code, StatusCode::kInternal, "kernel '%s' is not built into this library", name);
  Pipeline p;
  p.info = info;
  p.local_size = info->local_size_x;
  std::vector<VkDescriptorSetLayoutBinding> binds(static_cast<size_t>(info->num_bindings) + (c.timeline ? 1 : 0));
  for (size_t i = 0; i < binds.size(); ++i) {
    binds[i] = {};
    binds[i].binding = static_cast<int>(i) < info->num_bindings ? static_cast<uint32_t>(i) : Context::kTimelineBinding;
    binds[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    binds[i].descriptorCount = 1;
    binds[i].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
  }
  VkDescriptorSetLayoutCreateInfo dl{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
  dl.flags = VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR;
  dl.bindingCount = static_cast<uint32_t>(binds.size());
  dl.pBindings = binds.data();
  SB_VK_CHECK(c.vkCreateDescriptorSetLayout(c.device, &dl, nullptr, &p.set_layout), "vkCreateDescriptorSetLayout");
  VkPushConstantRange pcr{VK_SHADER_STAGE_COMPUTE_BIT, 0, info->args_size};
  VkPipelineLayoutCreateInfo pl{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  pl.setLayoutCount = 1;
  pl.pSetLayouts = &p.set_layout;
  pl.pushConstantRangeCount = 1;
  pl.pPushConstantRanges = &pcr;
  SB_VK_CHECK(c.vkCreatePipelineLayout(c.device, &pl, nullptr, &p.layout), "vkCreatePipelineLayout");
  VkShaderModuleCreateInfo sm{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
  sm.codeSize = code->spirv_words * 4;
  sm.pCode = code->spirv;
  // Kernel development: spirv_dir/<name>.spv replaces the built-in SPIR-V (same
  // interface), so a shader experiment needs no rebuild of the library.
  std::vector<uint32_t> override_words;
  if (!c.spirv_dir.empty()) {
    const std::string path = c.spirv_dir + "/" + name + ".spv";
    if (FILE* f = std::fopen(path.c_str(), "rb")) {
      uint32_t w;
      while (std::fread(&w, 4, 1, f) == 1) override_words.push_back(w);
      std::fclose(f);
      log::logger().warn("kernel {} from {} ({} words) instead of the built-in SPIR-V", name, path,
                         override_words.size());
      sm.codeSize = override_words.size() * 4;
      sm.pCode = override_words.data();
    }
  }
  VkShaderModule mod = VK_NULL_HANDLE;
  SB_VK_CHECK(c.vkCreateShaderModule(c.device, &sm, nullptr, &mod), "vkCreateShaderModule");
  VkComputePipelineCreateInfo ci{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  ci.stage = {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO};
  ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  ci.stage.module = mod;
  ci.stage.pName = "main";
  std::array<VkSpecializationMapEntry, 8> entries{};
  for (uint32_t i = 0; i < spec.count; ++i) entries[i] = {i, 4 * i, 4};
  const VkSpecializationInfo si{spec.count, entries.data(), 4 * spec.count, spec.values};
  if (spec.count) ci.stage.pSpecializationInfo = &si;
  ci.layout = p.layout;
  const bool stats = c.vkGetPipelineExecutablePropertiesKHR && c.vkGetPipelineExecutableStatisticsKHR;
  if (stats) ci.flags |= VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR;
  VkResult r = c.vkCreateComputePipelines(c.device, VK_NULL_HANDLE, 1, &ci, nullptr, &p.pipeline);
  c.vkDestroyShaderModule(c.device, mod, nullptr);
  SB_CHECK_OR_RETURN(r == VK_SUCCESS, StatusCode::kInternal, "%s", vk_error("vkCreateComputePipelines", r).c_str());
  if (stats) log_pipeline_stats(c, key.c_str(), p.pipeline);
  return &c.pipelines.emplace(key, p).first->second;
}

// DeviceOptions::gpu_timeline: 256 MiB of mapped memory for the workgroups' stamps (8M records).
Status open_timeline(const std::shared_ptr<Context>& ctx, const std::string& path) {
  SB_ASSIGN_OR_RETURN(gpu::Block b, VulkanBlocks(ctx).create(uint64_t{256} << 20));
  Context& c = *ctx;
  c.timeline = reinterpret_cast<VkBuffer>(b.handle);
  c.timeline_mem = reinterpret_cast<VkDeviceMemory>(b.memory);
  c.timeline_words = reinterpret_cast<uint32_t*>(b.mapped);
  c.timeline_bytes = b.size;
  c.timeline_path = path;
  std::fill(c.timeline_words, c.timeline_words + 8, 0u);
  log::warn("vulkan: workgroup stamps (gpu_timeline) go to {} when the device closes", path);
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<VulkanRuntime>> VulkanRuntime::open(int index, const DeviceOptions& options) {
  std::unique_ptr<VulkanRuntime> rt(new VulkanRuntime());
  rt->ctx_ = std::make_shared<Context>();
  Context& c = *rt->ctx_;
  c.spirv_dir = options.spirv_dir;
  c.specialize = options.gpu_specialize;
  SB_RETURN_IF_ERROR(attach_instance(c));  // the instance is the process's; all below is this device's
  SB_RETURN_IF_ERROR(pick_device(c, index, rt->description_));
  SB_RETURN_IF_ERROR(create_device(c, rt->description_, options));
  rt->int64_ = c.int64;
  rt->int8_mma_ = c.int8_mma;
  rt->int_dot_ = c.int_dot;
  // Within a dispatch: GLSL's Vulkan semantics promise it; off with gpu_handoff for the A/B and
  // to test the paths Metal takes.
  rt->cross_workgroup_handoff_ = options.gpu_handoff;
  if (!options.gpu_timeline.empty()) SB_RETURN_IF_ERROR(open_timeline(rt->ctx_, options.gpu_timeline));
  rt->set_flush_bytes(options.gpu_flush_bytes);
  rt->set_repeated(options.gpu_repeat);
  if (!options.gpu_repeat.empty())
    log::warn("vulkan: every dispatch of {} is recorded twice (gpu_repeat: profiling, not a product timing)",
              options.gpu_repeat);
  // NVIDIA launches a queue's dispatches' workgroups in order; lavapipe (a CPU device) runs
  // one dispatch at a time. Elsewhere not known: every dependency takes a barrier, as it
  // does with DeviceOptions::gpu_handoff off.
  rt->cross_dispatch_handoff_ =
      options.gpu_handoff && (c.vendor_id == 0x10de || c.device_type == VK_PHYSICAL_DEVICE_TYPE_CPU);
  SB_RETURN_IF_ERROR(rt->init(std::make_shared<gpu::MemoryPool>(std::make_unique<VulkanBlocks>(rt->ctx_)),
                              c.limits.maxStorageBufferRange, c.limits.minStorageBufferOffsetAlignment));
  rt->reuse_queued_ = true;  // hazard() orders dispatches by buffer range, whoever held the memory before
  SB_RETURN_IF_ERROR(rt->probe_numerics());
  SB_RETURN_IF_ERROR(rt->probe_mma_layout());
  if (rt->int8_mma()) rt->description_ += ", int8 cooperative matrices";
  if (rt->int_dot()) rt->description_ += ", int8 dot products";
  return rt;
}

VulkanRuntime::~VulkanRuntime() {
  if (recording_) (void)sync();
}

// A command buffer (and its fence) for slice `slice_`, begun; an execute's first also resets the queries.
Status VulkanRuntime::begin_slice() {
  Context& c = *ctx_;
  if (slice_ == c.cmds.size()) {
    VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    ai.commandPool = c.pool;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    VkCommandBuffer cmd = VK_NULL_HANDLE;
    SB_VK_CHECK(c.vkAllocateCommandBuffers(c.device, &ai, &cmd), "vkAllocateCommandBuffers");
    c.cmds.push_back(cmd);
    VkFenceCreateInfo fi{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    VkFence fence = VK_NULL_HANDLE;
    SB_VK_CHECK(c.vkCreateFence(c.device, &fi, nullptr, &fence), "vkCreateFence");
    c.fences.push_back(fence);
  }
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  bi.flags = capturing_ ? 0 : VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  SB_VK_CHECK(c.vkBeginCommandBuffer(c.cmds[slice_], &bi), "vkBeginCommandBuffer");
  if (slice_ == 0 && c.timestamps) {
    // Reset only the queries this execute may write, in chunks as the op log needs them:
    // on NVIDIA resetting all 8192 costs GPU time inside the timed span (RESULTS).
    per_dispatch_timing_ = log::op_log_enabled();
    // Without the op log the two stamps are reset on the host (the last execute has
    // finished), cheaper than a reset command in the submission (RESULTS).
    if (per_dispatch_timing_)
      c.vkCmdResetQueryPool(c.cmds[0], c.timestamps, 0, kQueryChunk);
    else
      c.vkResetQueryPool(c.device, c.timestamps, 0, 2);
    // Query 0 starts the execute. Without the op log query 1 ends it; with it, query i + 1
    // is written when dispatch i completes (every dispatch then waits for the previous
    // one), so consecutive stamps give each dispatch's own cost, launch included.
    c.vkCmdWriteTimestamp(c.cmds[0], VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, c.timestamps, 0);
  }
  slice_dispatches_ = 0;
  bound_ = nullptr;  // a new command buffer has no pipeline bound
  return Status::ok();
}

Status VulkanRuntime::begin_if_needed() {
  if (recording_) return Status::ok();
  slice_ = 0;
  SB_RETURN_IF_ERROR(begin_slice());
  timed_.clear();
  recording_ = true;
  record_start_ = Clock::now();
  return Status::ok();
}

// Ends and submits the current slice without waiting for it.
Status VulkanRuntime::submit_slice() {
  Context& c = *ctx_;
  SB_VK_CHECK(c.vkEndCommandBuffer(c.cmds[slice_]), "vkEndCommandBuffer");
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.commandBufferCount = 1;
  si.pCommandBuffers = &c.cmds[slice_];
  SB_VK_CHECK(c.vkQueueSubmit(c.queue, 1, &si, c.fences[slice_]), "vkQueueSubmit");
  return Status::ok();
}

Status VulkanRuntime::record_dispatch(const char* kernel, const std::vector<gpu::BufferRef>& bindings, const void* args,
                               size_t args_size, uint64_t invocations, const gpu::SpecConstants& spec,
                               uint32_t handoff) {
  if (invocations == 0) return Status::ok();
  Context& c = *ctx_;
  const size_t built = c.pipelines.size();
  const auto t0 = Clock::now();
  SB_ASSIGN_OR_RETURN(Pipeline * p, pipeline_for(c, kernel, spec));
  if (c.pipelines.size() != built) {
    ++host_costs_.pipelines;
    host_costs_.pipeline_us += std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  }
  SB_CHECK_OR_RETURN(static_cast<int>(bindings.size()) == p->info->num_bindings && args_size == p->info->args_size,
                     StatusCode::kInternal, "kernel %s: %zu bindings / %zu argument bytes, expected %d / %u", kernel,
                     bindings.size(), args_size, p->info->num_bindings, p->info->args_size);
  const uint64_t groups = (invocations + p->local_size - 1) / p->local_size;
  const uint64_t gx = std::min<uint64_t>(groups, gpu::max_groups_x()), gy = (groups + gx - 1) / gx;
  SB_CHECK_OR_RETURN(gy <= 65535, StatusCode::kResourceExhausted, "kernel %s: %llu invocations are too many", kernel,
                     (unsigned long long)invocations);
  SB_RETURN_IF_ERROR(begin_if_needed());
  VkCommandBuffer cmd = c.cmds[slice_];
  // Fixed arrays: this runs thousands of times per decode step.
  std::array<VkDescriptorBufferInfo, kernels::kMaxBindings + 1> infos;
  std::array<VkWriteDescriptorSet, kernels::kMaxBindings + 1> writes;
  const size_t nwrites = bindings.size() + (c.timeline ? 1 : 0);
  for (size_t i = 0; i < nwrites; ++i) {
    infos[i] = i < bindings.size()
                   ? VkDescriptorBufferInfo{reinterpret_cast<VkBuffer>(bindings[i].buffer), bindings[i].offset,
                                            bindings[i].range}
                   : VkDescriptorBufferInfo{c.timeline, 0, VK_WHOLE_SIZE};
    writes[i] = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
    writes[i].dstBinding = i < bindings.size() ? static_cast<uint32_t>(i) : Context::kTimelineBinding;
    writes[i].descriptorCount = 1;
    writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    writes[i].pBufferInfo = &infos[i];
  }
  const bool timed = c.timestamps && per_dispatch_timing_ && timed_.size() + 1 < 2 * c.max_timed;
  // A dispatch waits for the earlier ones only where it touches what they write, or
  // writes what they read; independent neighbours (q/k/v projections) may overlap.
  // Bindings in `handoff` are waited for by the kernel itself (cross_dispatch_handoff).
  if (per_dispatch_timing_ || hazard(kernel, bindings, p->info->access, cross_dispatch_handoff_ ? handoff : 0))
    barrier();
  if (p != bound_) c.vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, p->pipeline);
  bound_ = p;
  c.vkCmdPushDescriptorSetKHR(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, p->layout, 0, static_cast<uint32_t>(nwrites),
                              writes.data());
  c.vkCmdPushConstants(cmd, p->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, static_cast<uint32_t>(args_size), args);
  c.vkCmdDispatch(cmd, static_cast<uint32_t>(gx), static_cast<uint32_t>(gy), 1);
  if (timed) {
    const uint32_t q = static_cast<uint32_t>(timed_.size() + 1);
    if (q % kQueryChunk == 0) c.vkCmdResetQueryPool(cmd, c.timestamps, q, kQueryChunk);
    c.vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, c.timestamps, q);
    timed_.push_back(p->info->name);  // the table's name: `kernel` may not outlive the call
  }
  track(bindings, p->info->access);
  // Hand full slices to the GPU while recording goes on, so the two overlap. Barriers order
  // dispatches across command buffers too: their scopes follow the queue's submission order.
  // A recording stays one command buffer: a replay then submits one.
  const uint32_t limit = slice_ < 4 ? std::min(kSliceDispatches, kFirstSlice << slice_) : kSliceDispatches;
  if (++slice_dispatches_ >= limit && !capturing_) {
    SB_RETURN_IF_ERROR(submit_slice());
    ++slice_;
    SB_RETURN_IF_ERROR(begin_slice());
  }
  return Status::ok();
}

// Device writes so far -> later dispatches (and the host, at the end of a submission);
// forgets the pending accesses. Between dispatches the barrier names no host access:
// that would ask for more than a compute-to-compute dependency every time.
void VulkanRuntime::barrier(bool to_host) {
  Context& c = *ctx_;
  VkCommandBuffer cmd = c.cmds[slice_];
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
  mb.dstAccessMask = to_host ? VK_ACCESS_HOST_READ_BIT : VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
  c.vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                         to_host ? VK_PIPELINE_STAGE_HOST_BIT : VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb, 0,
                         nullptr, 0, nullptr);
  reads_.clear();
  writes_.clear();
}

namespace {
bool overlaps(const gpu::BufferRef& a, const gpu::BufferRef& b) {
  return a.buffer == b.buffer && a.offset < b.offset + b.range && b.offset < a.offset + a.range;
}
bool overlaps_any(const gpu::BufferRef& a, const std::vector<gpu::BufferRef>& v) {
  for (const gpu::BufferRef& b : v)
    if (overlaps(a, b)) return true;
  return false;
}
}  // namespace

// Whether a dispatch with these bindings must wait for the dispatches since the last
// barrier: it reads or writes what they write, or writes what they read. The status
// word is exempt: kernels only atomicOr into it, in any order.
bool VulkanRuntime::status_word(const gpu::BufferRef& b) {
  if (!err_.buffer) err_ = error_word();
  return b.buffer == err_.buffer && b.offset == err_.offset;
}

// Which binding costs the barrier is logged at debug level (a hand-off that still takes one:
// often memory reused from a buffer written since the last barrier).
bool VulkanRuntime::hazard(const char* kernel, const std::vector<gpu::BufferRef>& bindings,
                           const kernels::Access* access, uint32_t handoff) {
  for (size_t i = 0; i < bindings.size(); ++i) {
    const gpu::BufferRef& b = bindings[i];
    if (status_word(b) || (handoff >> i & 1u)) continue;
    const bool after_write = overlaps_any(b, writes_);
    if (after_write || (access[i] != kernels::Access::kRead && overlaps_any(b, reads_))) {
      log::debug("vulkan: barrier before {}: binding {} {} since the last barrier", kernel, i,
                 after_write ? "was written" : "is written, was read");
      return true;
    }
  }
  return false;
}

void VulkanRuntime::track(const std::vector<gpu::BufferRef>& bindings, const kernels::Access* access) {
  for (size_t i = 0; i < bindings.size(); ++i) {
    if (status_word(bindings[i])) continue;
    (access[i] == kernels::Access::kRead ? reads_ : writes_).push_back(bindings[i]);
  }
}

// The heap's budget for this process less its usage where the driver reports it, else its size.
uint64_t VulkanRuntime::memory_bytes() const {
  const Context& c = *ctx_;
  if (!c.memory_budget) return c.heap_bytes;
  VkPhysicalDeviceMemoryBudgetPropertiesEXT budget{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT};
  VkPhysicalDeviceMemoryProperties2 mp{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2, &budget};
  c.vkGetPhysicalDeviceMemoryProperties2(c.physical, &mp);
  const uint64_t b = budget.heapBudget[c.heap_index], used = budget.heapUsage[c.heap_index];
  return b > used ? b - used : 1;  // 1, not 0: zero means "unknown" to the caller
}

Status VulkanRuntime::sync() {
  if (!recording_) return Status::ok();
  Context& c = *ctx_;
  recording_ = false;
  barrier(true);  // the host reads what the last dispatches wrote
  if (c.timestamps && !per_dispatch_timing_)
    c.vkCmdWriteTimestamp(c.cmds[slice_], VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, c.timestamps, 1);
  SB_RETURN_IF_ERROR(submit_slice());
  last_record_us_ = std::chrono::duration<double, std::micro>(Clock::now() - record_start_).count();
  const uint32_t n = static_cast<uint32_t>(slice_ + 1);
  SB_VK_CHECK(c.vkWaitForFences(c.device, n, c.fences.data(), VK_TRUE, UINT64_MAX), "vkWaitForFences");
  c.vkResetFences(c.device, n, c.fences.data());
  if (capturing_ && capture_syncs_++ == 0)
    keep_recorded(n);
  else
    for (uint32_t i = 0; i < n; ++i) c.vkResetCommandBuffer(c.cmds[i], 0);
  log_timestamps();
  return gpu::status_from_error_bits(finish_submission());
}

// One line per timed dispatch (SWITCHBOARD_OP_LOG): kernel and GPU microseconds, then the total.
void VulkanRuntime::log_timestamps() {
  read_timestamps();
  exec_gpu_us_ = last_gpu_us_ < 0 || exec_gpu_us_ < 0 ? -1 : exec_gpu_us_ + last_gpu_us_;
  exec_record_us_ = last_record_us_ < 0 || exec_record_us_ < 0 ? -1 : exec_record_us_ + last_record_us_;
}

void VulkanRuntime::read_timestamps() {
  Context& c = *ctx_;
  last_gpu_us_ = -1;
  if (c.timestamps && !per_dispatch_timing_) {
    uint64_t ends[2] = {0, 0};
    if (c.vkGetQueryPoolResults(c.device, c.timestamps, 0, 2, sizeof(ends), ends, 8,
                                VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT) == VK_SUCCESS)
      last_gpu_us_ = static_cast<double>(ends[1] - ends[0]) * c.ns_per_tick * 1e-3;
    return;
  }
  if (!c.timestamps || timed_.empty()) return;
  std::vector<uint64_t> ticks(timed_.size() + 1);
  VkResult r = c.vkGetQueryPoolResults(c.device, c.timestamps, 0, static_cast<uint32_t>(ticks.size()),
                                       ticks.size() * 8, ticks.data(), 8, VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
  if (r != VK_SUCCESS) return;
  last_gpu_us_ = static_cast<double>(ticks.back() - ticks.front()) * c.ns_per_tick * 1e-3;
  if (!log::op_log_enabled()) return;
  double total = 0;
  for (size_t i = 0; i < timed_.size(); ++i) {
    const double us = static_cast<double>(ticks[i + 1] - ticks[i]) * c.ns_per_tick * 1e-3;
    total += us;
    log::logger().info("gpu {} {:.2f} us on {}", timed_[i], us, description_);
  }
  log::logger().info("gpu submission: {} dispatches, {:.2f} us of kernels, {:.2f} us first to last", timed_.size(),
                     total, last_gpu_us_);
}

Result<std::unique_ptr<Device>> open_vulkan_device(int index, const DeviceOptions& options) {
  SB_ASSIGN_OR_RETURN(std::unique_ptr<VulkanRuntime> rt, VulkanRuntime::open(index, options));
  return gpu::make_gpu_device(std::move(rt), index < 0 ? "vulkan" : "vulkan:" + std::to_string(index));
}

}  // namespace switchboard::vulkan
