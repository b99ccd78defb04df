// Switchboard public API: load a program and its weights, create a session,
// set inputs, execute, read outputs.
//
//   auto program = switchboard::Program::load("model/program.sbp", {"model/weights.safetensors"});
//   if (!program) { fprintf(stderr, "%s\n", program.status().to_string().c_str()); return 1; }
//   auto session = switchboard::Session::create(*program);
//   session.value()->set_input("tokens", tokens);
//   session.value()->execute();
//   auto logits = session.value()->output("logits");
//
// Every call returns Status or Result<T>; nothing throws or aborts on bad input.
// A Program is immutable and may be shared by any number of sessions; each
// Session owns its mutable buffers (e.g. a KV cache) and is used by one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "switchboard/dtype.h"
#include "switchboard/log.h"
#include "switchboard/status.h"
#include "switchboard/tensor.h"

namespace switchboard {

// One dimension of a declared shape: size >= 0 is static; -1 is dynamic in [min, max]
// (max == -1: unbounded).
struct DimInfo {
  int64_t size = -1;
  int64_t min = 0;
  int64_t max = -1;
};

// A named input or output of a program.
struct IoInfo {
  std::string name;
  bool is_tensor = true;  // false: a host integer value
  DType dtype = DType::kF32;
  std::vector<DimInfo> shape;
};

// How a weights file's bytes reach memory. kMap (the default) shares the page cache; if
// another process truncates the file, the next read of the lost part is caught and the
// session's execute fails with kIoError ("changed on disk") instead of the process dying.
// kRead copies the file into memory the session owns (its size in anonymous memory), so
// nothing done to the file afterwards reaches the session.
enum class WeightsAccess { kMap, kRead };

struct LoadOptions {
  // Safetensors files searched in order for each named constant.
  std::vector<std::string> weights;
  // When false, constants stay unresolved: the program can be inspected but a
  // session cannot be created from it.
  bool resolve_constants = true;
  // Constants supplied from memory (checked like file entries); searched before the files.
  std::vector<std::pair<std::string, Tensor>> constants;
  WeightsAccess weights_access = WeightsAccess::kMap;
  // An exported program records its weights file's size and header hash; the first weights
  // file must match them (a program and weights from different exports fail to load,
  // naming both files). Off: any file with the right tensors is accepted.
  bool check_weights_fingerprint = true;
  // Also hash every byte of the first weights file (XXH3-64, reads the whole file) against the
  // program's record: finds a flipped bit anywhere. A program without a record fails.
  bool verify_weights = false;
};

namespace detail {
struct ProgramImpl;
class Interpreter;
}  // namespace detail

class Program {
 public:
  // Reads, verifies and validates `path`, then resolves constants by name.
  static Result<std::shared_ptr<const Program>> load(const std::string& path, const LoadOptions& options = {});
  // Same, from bytes in memory; `origin` names them in error messages.
  static Result<std::shared_ptr<const Program>> from_bytes(std::vector<uint8_t> bytes, const std::string& origin,
                                                           const LoadOptions& options = {});

  const std::vector<IoInfo>& inputs() const;
  const std::vector<IoInfo>& outputs() const;
  // Integer attribute stored in the program (e.g. a tuning cutoff), if present.
  bool attribute(std::string_view name, int64_t* value) const;

  const detail::ProgramImpl& impl() const { return *impl_; }
  ~Program();

 private:
  Program();
  std::unique_ptr<detail::ProgramImpl> impl_;
};

struct SessionOptions {
  // "cpu", "vulkan" (the best Vulkan device) or "vulkan:N"; empty means
  // $SWITCHBOARD_DEVICE, or "cpu" when that is unset.
  std::string device;
  // When the device cannot be opened (no Vulkan loader, no GPU), run on the CPU and
  // log a warning once instead of failing. Always on for $SWITCHBOARD_DEVICE.
  bool cpu_fallback = false;
  // Upper bound on the bytes of all mutable buffers (e.g. KV caches) together;
  // a program asking for more is refused before anything is allocated.
  uint64_t max_buffer_bytes = uint64_t{16} << 30;

  // GPU kernel paths (Vulkan; other devices ignore them); each gives the same bits on or
  // off. Unset: $SWITCHBOARD_GPU_MMA / _DOT / _HANDOFF / _SPECIALIZE ("0" turns one off), else
  // on wherever the device supports it.
  std::optional<bool> gpu_int8_mma;  // int8 cooperative-matrix kernels (faster prefill)
  std::optional<bool> gpu_int_dot;   // packed int8 dot-product row kernels (faster decode)
  // Decode's router, gate/up and down kernels wait for each other's values instead of
  // being separated by barriers (only on devices known to run dispatches in order), and the
  // down projection's last workgroups combine its slots (no separate Combine dispatch).
  std::optional<bool> gpu_handoff;
  // Kernels built for their dispatch's dtypes (Vulkan specialization constants: less machine
  // code, faster decode); off, every dtype's path in one build decides at run time.
  std::optional<bool> gpu_specialize;
  // Repeated executions (decode steps) recorded once and replayed: an execution with the input
  // shapes of the one before is recorded, and later ones whose inputs only change values that
  // the kernels read on the device (the position) submit the recorded work again. Unset:
  // $SWITCHBOARD_GPU_REPLAY ("0" turns it off), else on where the device can record.
  std::optional<bool> gpu_replay;
  // GPU memory one execution may allocate before the work queued so far is finished (a sync
  // between two ops) so its temporaries can be reused: long prefills stay within the device.
  // Unset: $SWITCHBOARD_GPU_FLUSH_MB (MiB), else an eighth of the device memory free when first
  // needed. Any value gives the same bits.
  std::optional<uint64_t> gpu_flush_bytes;
  // Kernel development (Vulkan). Unset: $SWITCHBOARD_PIPELINE_STATS / $SWITCHBOARD_SPIRV_DIR /
  // $SWITCHBOARD_GPU_REPEAT / $SWITCHBOARD_GPU_TIMELINE.
  std::optional<bool> pipeline_stats;    // log each pipeline's registers and memory (info level)
  std::optional<std::string> spirv_dir;  // DIR/<kernel>.spv replaces a built-in kernel; "": none
  // "k1,k2": every dispatch of these kernels recorded twice (what one more costs in its chain;
  // the same results for kernels that do not count or accumulate across workgroups); "": none.
  std::optional<std::string> gpu_repeat;
  // A file for each workgroup's start and end stamps (kernels built by bench/gpu_timeline.sh,
  // through spirv_dir), written when the device closes; "": none.
  std::optional<std::string> gpu_timeline;
};

class Session {
 public:
  // Opens the device, plans every chain for it, zero-fills the mutable buffers
  // and runs the init chain if the program has one.
  static Result<std::unique_ptr<Session>> create(std::shared_ptr<const Program> program,
                                                 const SessionOptions& options = {});

  // Inputs are checked against the program's declared dtype and shape bounds.
  Status set_input(std::string_view name, Tensor value);
  Status set_input_value(std::string_view name, int64_t value);
  // Runs the main chain. Inputs stay set between executions; mutable buffers persist.
  Status execute();
  Result<Tensor> output(std::string_view name) const;
  Result<int64_t> output_value(std::string_view name) const;
  // The current contents of a mutable buffer (e.g. for checkpointing a cache).
  Result<Tensor> mutable_buffer(std::string_view name) const;
  // Zero-fills the mutable buffers and reruns the init chain.
  Status reset();

  const std::string& device_name() const;
  // The device in words, e.g. "vulkan:0 NVIDIA H100 ... (Vulkan 1.4, driver ...), int8
  // cooperative matrices"; "cpu" on the CPU.
  const std::string& device_description() const;
  // GPU time of the last execute() (first kernel start to last kernel end, from device
  // timestamps) in microseconds; -1 on the CPU or without timestamps.
  double last_device_time_us() const;
  // Host time recording the last execute()'s GPU work, first dispatch to last submission
  // (us); -1 on the CPU. Beside last_device_time_us it tells a host-bound step from a GPU one.
  double last_record_time_us() const;
  // Host time the last execute() spent inside its ops' kernels and host ops (us): on the CPU the
  // ops' own work, so the rest of execute() is the interpreter's; on a GPU, recording them.
  double last_kernel_time_us() const;
  // Kernel dispatches the session's GPU device has recorded so far (0 on the CPU).
  uint64_t device_dispatches() const;
  // Whether the last execute() replayed recorded work (SessionOptions::gpu_replay).
  bool last_execute_replayed() const;
  ~Session();

 private:
  Session();
  std::shared_ptr<const Program> program_;
  std::unique_ptr<detail::Interpreter> interp_;
};

// Library version string, e.g. "0.1.0".
const char* version();

// A program file described for people (`switchboard inspect`): header, chains and their
// instructions, slots, constants, node counts. Errors name the file.
Result<std::string> describe_program_file(const std::string& path);

// Process-wide settings; each starts from its environment variable (README.md).
// The CPU device's worker pool: threads its kernels split work over ($SWITCHBOARD_THREADS,
// else one per hardware thread).
int cpu_threads();
void set_cpu_threads(int n);
// The SIMD path the CPU kernels take here: "amx", "avx512-vnni", "avx2" or "portable".
const char* cpu_isa();
// Caps that path: "portable", "avx2", "avx512" or "amx" (no cap; the default unless
// $SWITCHBOARD_CPU_PATH names another). Every path gives the same bits. kInvalidArgument
// for other names.
Status set_cpu_path_limit(std::string_view path);
// Bytes of freed tensor buffers kept for reuse ($SWITCHBOARD_BUFFER_POOL_MB, default
// 1 GiB; 0 keeps none). Lowering it frees what is cached above the new bound.
uint64_t buffer_pool_bytes();
void set_buffer_pool_bytes(uint64_t bytes);
// Tensor buffers taken from the system allocator so far (the pool's misses, every size): an
// execution whose shapes repeat the last one's takes none (the CPU's steady state).
uint64_t buffer_allocations();
// Log level and destination: switchboard/log.h.

// What any kernel can reach on a GPU device, from its own timestamps: read bandwidth
// (GB/s), a submission of one empty dispatch (us) and one that reads `bytes` cold (us);
// -1 where not measured. kUnimplemented on devices without the probe (the CPU).
struct DeviceFloor {
  double gbps = -1, empty_us = -1, read_us = -1;
};
Result<DeviceFloor> measure_device_floor(const std::string& device, uint64_t bytes);

}  // namespace switchboard
