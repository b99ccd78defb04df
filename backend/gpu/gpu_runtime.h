// What the GPU op kernels (backend/gpu/<family>.cpp) need from a GPU backend: device memory
// that tensors live in, binding a tensor for a kernel, dispatching a built kernel
// (gpu_kernel_table.h) and waiting. Vulkan (backend/vulkan) and Metal
// (backend/metal) implement it, so both run the same dispatch plan.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "device.h"
#include "switchboard/status.h"
#include "switchboard/tensor.h"

namespace switchboard::gpu {

// A tensor's place in device memory: a backend buffer handle (VkBuffer or
// id<MTLBuffer>), a byte offset and a byte range.
struct BufferRef {
  uint64_t buffer = 0;
  uint64_t offset = 0;
  uint64_t range = 0;
};

// Values of a kernel's specialization constants 0 .. count - 1: the driver builds the
// kernel for them (Vulkan). count 0: the kernel's defaults.
struct SpecConstants {
  uint32_t values[8] = {};
  uint32_t count = 0;
};

class GpuRuntime {
 public:
  virtual ~GpuRuntime() = default;
  // "vulkan:0 NVIDIA H100 ..." and the like.
  virtual const std::string& description() const = 0;
  // A tensor in device memory (contents undefined until a kernel writes it).
  virtual Result<Tensor> alloc(DType dtype, Shape shape) = 0;
  // The same for a tensor the host writes before queued work has finished (an upload, a fill):
  // never memory that work may still use.
  virtual Result<Tensor> alloc_host_written(DType dtype, Shape shape) { return alloc(dtype, std::move(shape)); }
  // Where t lives for a kernel: its own allocation, a cached upload of a constant,
  // or a fresh upload of a host tensor. Keeps t alive until sync().
  virtual Result<BufferRef> bind(const Tensor& t, bool constant) = 0;
  // t itself when it lives in device memory where kernels can bind it, else a device
  // copy of it (for tensors a kernel updates in place).
  virtual Result<Tensor> device_tensor(const Tensor& t) = 0;
  // A scratch buffer of `bytes`, every word set to fill_word.
  virtual Result<BufferRef> scratch(size_t bytes, uint32_t fill_word) = 0;
  // Sets every word of the device tensor t to `word` now, and again before each replay of
  // the submission being recorded (a value kernels expect to find, like scratch's fill).
  virtual Status fill(const Tensor& t, uint32_t word) = 0;
  // The status word kernels raise SB_ERR_* bits in (reset at each sync).
  virtual BufferRef error_word() const = 0;
  // Records one dispatch of `kernel` over `invocations` threads (a 2D grid of
  // workgroups of the kernel's size, at most 65535 wide). `spec`: only for kernels that
  // declare specialization constants (the *_dot4 row kernels; spec_constants.glsl). `handoff`: bit
  // i set where the kernel itself waits for binding i's values from an earlier dispatch
  // (only where cross_dispatch_handoff()): no barrier for that binding.
  Status dispatch(const char* kernel, const std::vector<BufferRef>& bindings, const void* args, size_t args_size,
                  uint64_t invocations, const SpecConstants& spec = {}, uint32_t handoff = 0) {
    ++dispatches_;
    if (repeated(kernel)) {
      ++dispatches_;
      SB_RETURN_IF_ERROR(record_dispatch(kernel, bindings, args, args_size, invocations, spec, handoff));
    }
    return record_dispatch(kernel, bindings, args, args_size, invocations, spec, handoff);
  }
  // Profiling (DeviceOptions::gpu_repeat): the kernels whose dispatches are recorded twice.
  void set_repeated(const std::string& names) {
    repeated_.clear();
    for (size_t b = 0; b <= names.size();) {
      const size_t e = std::min(names.find(',', b), names.size());
      if (e > b) repeated_.push_back(names.substr(b, e - b));
      b = e + 1;
    }
  }
  // Dispatches recorded since the runtime opened (`bench model`: dispatches per token).
  uint64_t dispatches() const { return dispatches_; }

  // Runs what was recorded and waits; errors name the SB_ERR_* bits raised.
  virtual Status sync() = 0;
  // Recorded submissions (Device::begin_recording): the next submission's command buffers
  // and operands are kept, and replay() submits them again. false where the runtime cannot
  // record (then nothing changes).
  virtual bool begin_recording() { return false; }
  virtual std::unique_ptr<RecordedWork> end_recording() { return nullptr; }
  virtual Status replay(const RecordedWork&) {
    return make_error(StatusCode::kUnimplemented, "%s does not replay work", description().c_str());
  }
  // Memory the heap tensors live in has free now (Vulkan: VK_EXT_memory_budget, else the
  // heap size: an upper bound on any claim); 0 when unknown.
  virtual uint64_t memory_bytes() const { return 0; }
  // Device::wants_flush: memory allocated since the last finished submission passed the budget.
  virtual bool wants_flush() const { return false; }
  // Between two ops: what is bound from here on belongs to the next op (a sync inside it keeps
  // those operands, which it may still dispatch with).
  virtual void op_boundary() {}
  // GPU time of the last submission, first dispatch start to last dispatch end (us);
  // -1 when the device has no timer.
  virtual double last_gpu_us() const { return -1; }
  // Host time of the last submission's recording, its first dispatch to its last submit (us);
  // -1 when not measured.
  virtual double last_record_us() const { return -1; }
  // The same summed over every submission since begin_execution() (an execution that syncs
  // between ops, as a long prefill does, submits several times); -1 if one had no timer.
  virtual void begin_execution() {}
  virtual double execution_gpu_us() const { return last_gpu_us(); }
  virtual double execution_record_us() const { return last_record_us(); }
  // References to t's storage held by recorded, unfinished dispatches.
  virtual long queued_refs(const Tensor& t) const { return 0; }
  // Submissions finished so far (every sync, the runtime's own included): state recorded for
  // "the submission being recorded" is stale once this moves on.
  uint64_t submissions() const { return submissions_; }
  // Whether kernels that divide (gpu_kernel_table.h `divides`) may run: set by the probe.
  bool exact_division() const { return exact_division_; }
  // Whether kernels on 64-bit integers (gpu_kernel_table.h `int64`) may run.
  bool int64() const { return int64_; }
  // Whether int8 cooperative-matrix kernels (gpu_kernel_table.h `int8_mma`) may run.
  bool int8_mma() const { return int8_mma_; }
  // Whether packed int8 dot-product kernels (gpu_kernel_table.h `int_dot`) may run.
  bool int_dot() const { return int_dot_; }
  // Whether a workgroup may read what other workgroups of the same dispatch stored, after
  // an atomic count that follows their memoryBarrierBuffer() (coherent buffers): GLSL's
  // Vulkan semantics. Metal's translation of the fence is not known to promise it, so
  // qmm_row_combine_2k runs on Vulkan only.
  bool cross_workgroup_handoff() const { return cross_workgroup_handoff_; }
  // Whether a kernel may wait (bounded polls) for values that a dispatch recorded before
  // it writes, with no barrier between: that dispatch's workgroups are launched first and
  // finish while the later ones wait (NVIDIA; lavapipe runs dispatches one at a time).
  bool cross_dispatch_handoff() const { return cross_dispatch_handoff_; }

  // Host work outside recording since the last finished submission: device memory created,
  // host bytes copied into it, pipelines built (where a session's first prompt goes).
  struct HostCosts {
    uint64_t blocks = 0, block_bytes = 0, uploads = 0, upload_bytes = 0, pipelines = 0;
    double block_us = 0, upload_us = 0, pipeline_us = 0;
  };
  const HostCosts& host_costs() const { return host_costs_; }

 protected:
  HostCosts host_costs_;
  bool exact_division_ = false;
  bool int64_ = false;
  bool int8_mma_ = false;
  bool int_dot_ = false;
  bool cross_workgroup_handoff_ = false;
  bool cross_dispatch_handoff_ = false;
  uint64_t submissions_ = 0;
  std::vector<std::string> repeated_;
  bool repeated(const char* kernel) const {
    for (const std::string& r : repeated_)
      if (r == kernel) return true;
    return false;
  }
  void count_replayed(uint64_t dispatches) { dispatches_ += dispatches; }
  // The device's own recording of one dispatch (dispatch() counts, then calls it).
  virtual Status record_dispatch(const char* kernel, const std::vector<BufferRef>& bindings, const void* args,
                                 size_t args_size, uint64_t invocations, const SpecConstants& spec,
                                 uint32_t handoff) = 0;

 private:
  uint64_t dispatches_ = 0;
};

inline bool same_ref(const BufferRef& a, const BufferRef& b) {
  return a.buffer != 0 && a.buffer == b.buffer && a.offset == b.offset && a.range == b.range;
}

// Bit i set where bindings[i] is one of `handed` (a handoff mask for GpuRuntime::dispatch).
inline uint32_t handoff_mask(const std::vector<BufferRef>& bindings, std::initializer_list<BufferRef> handed) {
  uint32_t m = 0;
  for (size_t i = 0; i < bindings.size(); ++i)
    for (const BufferRef& h : handed)
      if (same_ref(bindings[i], h)) m |= 1u << i;
  return m;
}

// The widest grid row dispatch() uses: 65535 workgroups, or SWITCHBOARD_GPU_MAX_GROUPS_X
// (tests set it small so small tensors take the two-dimensional grid path).
uint64_t max_groups_x();

// The error a device status word stands for (OK when no bit is set).
Status status_from_error_bits(uint32_t bits);

// The numbers the start-up probe (probe.comp) feeds a device, and the check of its
// results (7 per triple) against the CPU's contract arithmetic. `exact_division` says
// whether the device's a / b was correctly rounded on every probe row.
std::vector<float> probe_inputs();
Status check_probe(const std::string& device, const std::vector<float>& inputs, const float* results,
                   bool& exact_division);

// Records a stream_read dispatch (probe.comp): `bytes` (a multiple of 16) of `data` read
// by `groups` workgroups of 256; `out` holds at least 1 KiB per workgroup.
Status dispatch_stream_read(GpuRuntime& rt, const BufferRef& data, uint64_t bytes, uint32_t groups,
                            const BufferRef& out);

// What any kernel can reach on rt (probe.cpp), from its timestamps: `gbps` the read
// bandwidth (the slope from 32 to 128 MiB reads), `empty_us` a submission of one empty
// dispatch, `read_us` a submission of one dispatch reading `bytes` cold (median; 0 or over
// 32 MiB: not measured).
struct ReadFloor {
  double gbps = -1, empty_us = -1, read_us = -1;
};
Result<ReadFloor> measure_read_floor(GpuRuntime& rt, uint64_t bytes);

// A Device that runs every GPU kernel on `rt`; `name` is "vulkan", "metal", ...
std::unique_ptr<Device> make_gpu_device(std::unique_ptr<GpuRuntime> rt, std::string name);

}  // namespace switchboard::gpu
