// The Vulkan runtime under the GPU device: the loader opened at run time (dlopen,
// so a binary without libvulkan still runs on the CPU), one compute queue,
// host-visible device memory that tensors live in, a pipeline per kernel with push
// descriptors and push constants, and one command buffer that collects a chain's
// dispatches (with a barrier between each) until sync().
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "device_registry.h"
#include "gpu_kernel_table.h"
#include "gpu_memory.h"

namespace switchboard::vulkan {

struct Context;  // instance, device, queue, memory pool; shared by every allocation

class VulkanRuntime final : public gpu::MappedRuntime {
 public:
  // index < 0: the best device (discrete, integrated, virtual, then CPU). The options
  // are this device's alone: the process shares only the loader and the VkInstance.
  static Result<std::unique_ptr<VulkanRuntime>> open(int index,
                                                     const DeviceOptions& options = default_device_options());
  ~VulkanRuntime() override;

  const std::string& description() const override { return description_; }
  Status record_dispatch(const char* kernel, const std::vector<gpu::BufferRef>& bindings, const void* args,
                         size_t args_size, uint64_t invocations, const gpu::SpecConstants& spec,
                         uint32_t handoff) override;
  Status sync() override;
  // vk_replay.cpp: a submission's command buffers kept and submitted again.
  bool begin_recording() override;
  std::unique_ptr<RecordedWork> end_recording() override;
  Status replay(const RecordedWork& work) override;
  double last_gpu_us() const override { return last_gpu_us_; }
  double last_record_us() const override { return last_record_us_; }
  void begin_execution() override { exec_gpu_us_ = exec_record_us_ = 0; }
  double execution_gpu_us() const override { return exec_gpu_us_; }
  double execution_record_us() const override { return exec_record_us_; }
  uint64_t memory_bytes() const override;

 private:
  VulkanRuntime() = default;
  struct Recorded;
  void drop(Recorded& r);
  void keep_recorded(uint32_t slices);  // sync(): the recording's submission has finished
  Status begin_if_needed();
  Status begin_slice();
  Status submit_slice();
  // read_timestamps: the submission's last_gpu_us_ (and the op log's lines); log_timestamps
  // also adds the submission's times to the execution's.
  void log_timestamps();
  void read_timestamps();
  void barrier(bool to_host = false);  // into the current slice
  bool hazard(const char* kernel, const std::vector<gpu::BufferRef>& bindings, const kernels::Access* access,
              uint32_t handoff);
  void track(const std::vector<gpu::BufferRef>& bindings, const kernels::Access* access);
  bool status_word(const gpu::BufferRef& b);  // the SB_ERR_* word every kernel may atomicOr

  std::shared_ptr<Context> ctx_;
  std::string description_;
  bool recording_ = false;
  // An execute is recorded in slices, each submitted when full: the first of kFirstSlice
  // dispatches (the GPU starts early), each next one twice the last, up to kSliceDispatches.
  static constexpr uint32_t kFirstSlice = 8, kSliceDispatches = 128;
  // Timestamp queries are reset in chunks of this many, as they are used.
  static constexpr uint32_t kQueryChunk = 256;
  size_t slice_ = 0;
  bool per_dispatch_timing_ = false;  // SWITCHBOARD_OP_LOG: a timestamp pair per dispatch
  uint32_t slice_dispatches_ = 0;
  std::vector<const char*> timed_;  // kernels of the timed dispatches, in order
  double last_gpu_us_ = -1, last_record_us_ = -1;
  double exec_gpu_us_ = 0, exec_record_us_ = 0;  // since begin_execution(); -1: a submission had no timer
  using Clock = std::chrono::steady_clock;
  Clock::time_point record_start_;  // when the submission's first dispatch was recorded
  const void* bound_ = nullptr;
  // Device memory the dispatches since the last barrier read and write.
  std::vector<gpu::BufferRef> reads_, writes_;
  gpu::BufferRef err_;  // the status word (fixed for the runtime's life)
  // Recording: on from begin_recording() to end_recording(); the first sync's submission is
  // kept (captured_), a second one breaks the recording.
  bool capturing_ = false;
  int capture_syncs_ = 0;
  uint64_t capture_dispatches0_ = 0;
  std::unique_ptr<RecordedWork> captured_;  // a Recorded (vk_replay.cpp)
};

}  // namespace switchboard::vulkan
