// The Vulkan runtime under the Vulkan device: the loader opened at run time
// (dlopen, so a binary without libvulkan still runs on the CPU), one compute queue,
// host-visible device memory that tensors live in, a pipeline per kernel with push
// descriptors and push constants, and one command buffer that collects a chain's
// dispatches (with a barrier between each) until sync().
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "switchboard/status.h"
#include "switchboard/tensor.h"

namespace switchboard::vulkan {

struct Context;  // instance, device, queue, memory pool; shared by every allocation

// A tensor's place in device memory.
struct BufferRef {
  uint64_t buffer = 0;  // VkBuffer
  uint64_t offset = 0;
  uint64_t range = 0;
};

class Runtime {
 public:
  // index < 0: the best device (discrete, integrated, virtual, then CPU).
  static Result<std::unique_ptr<Runtime>> open(int index);
  ~Runtime();

  const std::string& description() const { return description_; }
  uint64_t max_storage_range() const;

  // A tensor in device memory (contents undefined until a kernel writes it).
  Result<Tensor> alloc(DType dtype, Shape shape);
  // Where t lives for a kernel: its own allocation, a cached upload of a constant,
  // or a fresh upload of a host tensor. Keeps t alive until sync().
  Result<BufferRef> bind(const Tensor& t, bool constant);
  // A small zeroed scratch buffer of `bytes` (e.g. an inverse permutation).
  Result<BufferRef> scratch(size_t bytes, uint32_t fill_word);
  // The status word kernels raise SB_ERR_* bits in (reset at each sync).
  BufferRef error_word() const;

  // Records one dispatch of `kernel` over `invocations` threads (split into a 2D grid).
  Status dispatch(const char* kernel, const std::vector<BufferRef>& bindings, const void* args, size_t args_size,
                  uint64_t invocations);
  // Submits what was recorded and waits; an error names the SB_ERR_* bits raised.
  Status sync();

 private:
  Runtime() = default;
  Status begin_if_needed();
  Status probe_numerics();

  std::shared_ptr<Context> ctx_;
  std::string description_;
  bool recording_ = false;
  std::vector<Tensor> keep_;  // operands of recorded dispatches
  std::vector<std::pair<std::pair<const void*, size_t>, Tensor>> constants_;  // host bytes -> device copy
  Tensor error_;
};

}  // namespace switchboard::vulkan
