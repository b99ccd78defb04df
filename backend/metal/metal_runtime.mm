// The Metal runtime under the GPU device (Objective-C++, ARC; Apple only). Same
// kernels, table and dispatch plan as Vulkan: the MSL that sb_shaderc made from the
// same SPIR-V (binding n -> [[buffer(n)]], arguments -> [[buffer(30)]]), compiled at
// run time with safe math; tensors in shared-storage buffers; one serial compute
// encoder per submission, so each dispatch sees the writes of the ones before it.
#import <Foundation/Foundation.h>
#import <Metal/Metal.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "gpu_embedded_shaders.h"
#include "gpu_kernel_table.h"
#include "gpu_memory.h"
#include "log.h"
#include "metal_device.h"

namespace switchboard::metal {
namespace {

std::string ns_error(NSError* e) { return e ? std::string([[e localizedDescription] UTF8String]) : "unknown error"; }

// Shared-storage buffers: the CPU and the GPU see the same bytes (unified memory).
class MetalBlocks final : public gpu::BlockAllocator {
 public:
  explicit MetalBlocks(id<MTLDevice> device) : device_(device) {}
  Result<gpu::Block> create(uint64_t size) override {
    id<MTLBuffer> buf = [device_ newBufferWithLength:size options:MTLResourceStorageModeShared];
    SB_CHECK_OR_RETURN(buf != nil, StatusCode::kResourceExhausted, "newBufferWithLength: %llu bytes failed",
                       (unsigned long long)size);
    gpu::Block b;
    b.mapped = static_cast<uint8_t*>([buf contents]);
    b.size = size;
    b.handle = reinterpret_cast<uint64_t>((__bridge_retained void*)buf);  // released in destroy()
    return b;
  }
  void destroy(const gpu::Block& b) override {
    id<MTLBuffer> buf = (__bridge_transfer id<MTLBuffer>)reinterpret_cast<void*>(b.handle);
    buf = nil;
  }

 private:
  id<MTLDevice> device_;
};

struct Pipeline {
  id<MTLComputePipelineState> state = nil;
  const kernels::KernelInfo* info = nullptr;
};

class MetalRuntime final : public gpu::MappedRuntime {
 public:
  static Result<std::unique_ptr<MetalRuntime>> open();
  ~MetalRuntime() override {
    @autoreleasepool {
      if (cmd_ != nil) (void)sync();
    }
  }
  const std::string& description() const override { return description_; }
  // `spec` is ignored: the kernels' specialization constants (spec_constants.glsl and the
  // Vulkan-only *_dot4 kernels') keep their defaults, so the push constants decide; so is
  // `handoff` (cross_dispatch_handoff() is false: every dependency takes a barrier).
  Status record_dispatch(const char* kernel, const std::vector<gpu::BufferRef>& bindings, const void* args,
                         size_t args_size, uint64_t invocations, const gpu::SpecConstants& spec,
                         uint32_t handoff) override;
  Status sync() override;
  double last_gpu_us() const override { return last_gpu_us_; }

 private:
  Result<Pipeline*> pipeline_for(const char* name);
  Result<Pipeline*> compile_pipeline(const char* name);
  Status record(const char* kernel, const std::vector<gpu::BufferRef>& bindings, const void* args, size_t args_size,
                uint64_t invocations);
  Status finish();

  id<MTLDevice> device_ = nil;
  id<MTLCommandQueue> queue_ = nil;
  id<MTLCommandBuffer> cmd_ = nil;
  id<MTLComputeCommandEncoder> enc_ = nil;
  std::map<std::string, Pipeline> pipelines_;
  std::string description_;
  int dispatches_ = 0;
  double last_gpu_us_ = -1;
};

Result<std::unique_ptr<MetalRuntime>> MetalRuntime::open() {
  std::unique_ptr<MetalRuntime> rt(new MetalRuntime());
  rt->device_ = MTLCreateSystemDefaultDevice();
  SB_CHECK_OR_RETURN(rt->device_ != nil, StatusCode::kNotFound, "no Metal device");
  rt->queue_ = [rt->device_ newCommandQueue];
  SB_CHECK_OR_RETURN(rt->queue_ != nil, StatusCode::kNotFound, "Metal: newCommandQueue failed");
  rt->description_ = std::string("metal ") + [[rt->device_ name] UTF8String];
  rt->int64_ = true;  // MSL has 64-bit integers on every Metal GPU
  // int8_mma_ and int_dot_ stay false: their kernels are Vulkan only and have no MSL.
  // Metal buffer offsets for device-address-space arguments need 4-byte alignment;
  // 16 keeps the same rule as Vulkan (the shaders read 16-byte vectors nowhere).
  SB_RETURN_IF_ERROR(rt->init(std::make_shared<gpu::MemoryPool>(std::make_unique<MetalBlocks>(rt->device_)),
                              [rt->device_ maxBufferLength], 16));
  SB_RETURN_IF_ERROR(rt->probe_numerics());
  return rt;
}

// One library per kernel, from its MSL, with safe math: no reassociation, no
// fast-math transcendentals (the kernels call none anyway), IEEE NaN/Inf/-0.
// Every entry point from C++ drains its own autorelease pool: command buffers,
// encoders and NSStrings are autoreleased, and the caller's thread may have no pool.
Result<Pipeline*> MetalRuntime::pipeline_for(const char* name) {
  @autoreleasepool {
    return compile_pipeline(name);
  }
}

Result<Pipeline*> MetalRuntime::compile_pipeline(const char* name) {
  auto it = pipelines_.find(name);
  if (it != pipelines_.end()) return &it->second;
  const kernels::KernelInfo* info = kernels::find_kernel(name);
  const gpu::EmbeddedKernel* code = gpu::find_embedded_kernel(name);
  SB_CHECK_OR_RETURN(info && code, StatusCode::kInternal, "kernel '%s' is not built into this library", name);
  SB_CHECK_OR_RETURN(!info->vulkan_only(), StatusCode::kUnimplemented, "kernel '%s' is Vulkan only (no MSL)", name);
  MTLCompileOptions* opts = [MTLCompileOptions new];
  opts.languageVersion = MTLLanguageVersion2_3;
#if (defined(__MAC_OS_X_VERSION_MAX_ALLOWED) && __MAC_OS_X_VERSION_MAX_ALLOWED >= 150000) || \
    (defined(__IPHONE_OS_VERSION_MAX_ALLOWED) && __IPHONE_OS_VERSION_MAX_ALLOWED >= 180000)
  if (@available(macOS 15.0, iOS 18.0, *)) {
    opts.mathMode = MTLMathModeSafe;
    opts.mathFloatingPointFunctions = MTLMathFloatingPointFunctionsPrecise;
  } else {
    opts.fastMathEnabled = NO;
  }
#else
  opts.fastMathEnabled = NO;  // SDKs before macOS 15 / iOS 18: the older switch
#endif
  NSError* err = nil;
  id<MTLLibrary> lib = [device_ newLibraryWithSource:[NSString stringWithUTF8String:code->msl] options:opts error:&err];
  SB_CHECK_OR_RETURN(lib != nil, StatusCode::kInternal, "Metal: compiling %s failed: %s", name, ns_error(err).c_str());
  const std::string entry = std::string("sb_") + name;
  // Through constantValues: a function with function constants (spec_constants.glsl's, all with
  // defaults) only makes a pipeline once specialized; none set, the defaults apply.
  MTLFunctionConstantValues* constants = [[MTLFunctionConstantValues alloc] init];
  id<MTLFunction> fn = [lib newFunctionWithName:[NSString stringWithUTF8String:entry.c_str()]
                                 constantValues:constants
                                          error:&err];
  SB_CHECK_OR_RETURN(fn != nil, StatusCode::kInternal, "Metal: %s has no function %s: %s", name, entry.c_str(),
                     ns_error(err).c_str());
  id<MTLComputePipelineState> state = [device_ newComputePipelineStateWithFunction:fn error:&err];
  SB_CHECK_OR_RETURN(state != nil, StatusCode::kInternal, "Metal: pipeline %s failed: %s", name, ns_error(err).c_str());
  SB_CHECK_OR_RETURN([state maxTotalThreadsPerThreadgroup] >= info->local_size_x, StatusCode::kInternal,
                     "Metal: %s allows %lu threads per threadgroup, the kernel needs %u", name,
                     (unsigned long)[state maxTotalThreadsPerThreadgroup], info->local_size_x);
  return &pipelines_.emplace(name, Pipeline{state, info}).first->second;
}

Status MetalRuntime::record_dispatch(const char* kernel, const std::vector<gpu::BufferRef>& bindings,
                                     const void* args, size_t args_size, uint64_t invocations,
                                     const gpu::SpecConstants&, uint32_t) {
  @autoreleasepool {
    return record(kernel, bindings, args, args_size, invocations);
  }
}

Status MetalRuntime::sync() {
  @autoreleasepool {
    return finish();
  }
}

Status MetalRuntime::record(const char* kernel, const std::vector<gpu::BufferRef>& bindings, const void* args,
                            size_t args_size, uint64_t invocations) {
  if (invocations == 0) return Status::ok();
  SB_ASSIGN_OR_RETURN(Pipeline * p, pipeline_for(kernel));
  SB_CHECK_OR_RETURN(static_cast<int>(bindings.size()) == p->info->num_bindings && args_size == p->info->args_size,
                     StatusCode::kInternal, "kernel %s: %zu bindings / %zu argument bytes, expected %d / %u", kernel,
                     bindings.size(), args_size, p->info->num_bindings, p->info->args_size);
  const uint64_t local = p->info->local_size_x;
  const uint64_t groups = (invocations + local - 1) / local;
  const uint64_t gx = std::min<uint64_t>(groups, gpu::max_groups_x()), gy = (groups + gx - 1) / gx;  // the Vulkan grid shape
  SB_CHECK_OR_RETURN(gy <= 65535, StatusCode::kResourceExhausted, "kernel %s: %llu invocations are too many", kernel,
                     (unsigned long long)invocations);
  if (cmd_ == nil) {
    cmd_ = [queue_ commandBuffer];
    enc_ = [cmd_ computeCommandEncoderWithDispatchType:MTLDispatchTypeSerial];
    dispatches_ = 0;
  }
  [enc_ setComputePipelineState:p->state];
  for (size_t i = 0; i < bindings.size(); ++i) {
    id<MTLBuffer> buf = (__bridge id<MTLBuffer>)reinterpret_cast<void*>(bindings[i].buffer);
    [enc_ setBuffer:buf offset:bindings[i].offset atIndex:i];
  }
  [enc_ setBytes:args length:args_size atIndex:kernels::kMetalArgsBuffer];
  [enc_ dispatchThreadgroups:MTLSizeMake(gx, gy, 1) threadsPerThreadgroup:MTLSizeMake(local, 1, 1)];
  ++dispatches_;
  return Status::ok();
}

Status MetalRuntime::finish() {
  if (cmd_ == nil) return Status::ok();
  [enc_ endEncoding];
  [cmd_ commit];
  [cmd_ waitUntilCompleted];
  const MTLCommandBufferStatus st = [cmd_ status];
  NSError* err = [cmd_ error];
  last_gpu_us_ = ([cmd_ GPUEndTime] - [cmd_ GPUStartTime]) * 1e6;
  if (log::op_log_enabled())
    log::logger().info("gpu submission: {} dispatches, {:.2f} us on {}", dispatches_, last_gpu_us_, description_);
  cmd_ = nil;
  enc_ = nil;
  const uint32_t bits = finish_submission();
  SB_CHECK_OR_RETURN(st == MTLCommandBufferStatusCompleted, StatusCode::kInternal, "Metal command buffer failed: %s",
                     ns_error(err).c_str());
  return gpu::status_from_error_bits(bits);
}

}  // namespace

Result<std::unique_ptr<Device>> open_metal_device() {
  @autoreleasepool {
    SB_ASSIGN_OR_RETURN(std::unique_ptr<MetalRuntime> rt, MetalRuntime::open());
    return gpu::make_gpu_device(std::move(rt), "metal");
  }
}

}  // namespace switchboard::metal
