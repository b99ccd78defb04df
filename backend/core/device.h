// A device executes ops through a kernel registry: one op -> one kernel per
// device. Host-only ops (SymSize, IntArith, If) never reach a device.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <string>

#include "program_generated.h"
#include "switchboard/status.h"
#include "switchboard/switchboard.h"
#include "switchboard/tensor.h"

namespace switchboard {

class KernelContext;

// A device's work of one execution, kept to be submitted again (Device::end_recording).
class RecordedWork {
 public:
  virtual ~RecordedWork() = default;
};

using KernelFn = Status (*)(KernelContext& ctx, const fb::OpNodeUnion& op);

// A kernel for consecutive instructions ins[0 .. span) of a chain (a device's fusion).
using FusedFn = Status (*)(KernelContext& ctx, const std::unique_ptr<fb::InstructionT>* ins);
struct Fusion {
  FusedFn fn = nullptr;
  size_t span = 0;
};
// Whether tensor slot `t` is a temp whose value no instruction after ins[last] reads
// (nor another chain, nor an output): a fusion ending at `last` may leave it unwritten.
using PrivateTemp = std::function<bool(const fb::Tid* t, size_t last)>;

class KernelRegistry {
 public:
  void add(fb::OpNode op, KernelFn fn) { fns_[static_cast<size_t>(op)] = fn; }
  KernelFn find(fb::OpNode op) const {
    auto i = static_cast<size_t>(op);
    return i < fns_.size() ? fns_[i] : nullptr;
  }

 private:
  std::array<KernelFn, static_cast<size_t>(fb::OpNode::MAX) + 1> fns_{};
};

class Device {
 public:
  virtual ~Device() = default;
  virtual const std::string& name() const = 0;
  // The device in words: "cpu", or the GPU, its driver and the kernel paths it enables.
  virtual const std::string& description() const { return name(); }
  virtual const KernelRegistry& kernels() const = 0;
  // Whether this device runs `op` with the operands' declared dtypes (asked once per
  // instruction at plan time); kUnimplemented with the reason when it does not.
  virtual Status can_run(const fb::OpNodeUnion& op, const KernelContext& ctx) const { return Status::ok(); }
  // A fusion starting at ins[i] (asked once per instruction at plan time), or none. The
  // fused kernel may still run the instructions one by one when shapes rule it out.
  virtual Fusion fuse(const std::vector<std::unique_ptr<fb::InstructionT>>& ins, size_t i,
                      const PrivateTemp& private_temp) const {
    return {};
  }
  // Waits for queued work; returns the errors the device found in it (an index out of
  // range, say). Devices that run kernels synchronously have nothing to wait for.
  virtual Status sync() { return Status::ok(); }
  // True when the work queued since the last sync holds so much memory that the interpreter
  // should sync between two ops (a long prefill's temporaries, freed only once it finished).
  virtual bool wants_flush() const { return false; }
  // Called before each op (GPU: a sync the op needs keeps what it has bound).
  virtual void op_boundary() {}
  // Called when an execution starts: last_device_us / last_record_us sum from here.
  virtual void begin_execution() {}
  // Device time of the work the syncs since begin_execution() waited for, in microseconds; -1
  // if unknown.
  virtual double last_device_us() const { return -1; }
  // Host time spent recording that GPU work (us); -1 where not measured.
  virtual double last_record_us() const { return -1; }
  // Kernel dispatches recorded since the device opened; 0 where there are none (the CPU).
  virtual uint64_t dispatches() const { return 0; }
  // References to t's storage held by queued work only. Work queued later runs after it,
  // so an in-place write queued now needs neither a sync nor a copy on their account.
  virtual long queued_refs(const Tensor& t) const { return 0; }
  // Bytes this device can allocate for a session's buffers (the CPU: the host memory free
  // now; a GPU: the size of the heap its tensors live in); 0 when unknown (then only
  // SessionOptions::max_buffer_bytes bounds a program's buffer claims).
  virtual uint64_t available_memory() const { return 0; }
  // What any kernel can reach on this device (switchboard.h, measure_device_floor).
  virtual Result<DeviceFloor> measure_floor(uint64_t bytes) {
    return make_error(StatusCode::kUnimplemented, "device '%s' has no read-floor probe", name().c_str());
  }

  // Recorded executions (GPU devices): the interpreter records a decode step once and
  // replays it for every later token. begin_recording: keep the next submission's work;
  // false where the device cannot (then nothing changes). end_recording, after the sync()
  // that ended the execution: the work, or null (nothing recorded, or a sync split it).
  virtual bool begin_recording() { return false; }
  virtual std::unique_ptr<RecordedWork> end_recording() { return nullptr; }
  // Submits recorded work again and waits, as sync() does.
  virtual Status replay(const RecordedWork&) {
    return make_error(StatusCode::kUnimplemented, "device '%s' does not replay work", name().c_str());
  }
  // The words kernels read input values from while they run (KernelContext::resolve_dynamic),
  // written before each execution: words[0] = 0, words[1 + i] = input i's value.
  virtual Status set_dynamic_values(const std::vector<uint32_t>& words) { return Status::ok(); }
  // A device copy of an input tensor that recorded work reads, refilled before each replay.
  virtual Result<Tensor> stage_input(const Tensor& t) { return t; }
  // A zero-filled tensor where this device's kernels read it (a reset's mutable buffers).
  virtual Result<Tensor> zeros(DType dtype, const Shape& shape) { return Tensor::zeros(dtype, shape); }
  // Zeroes one of those in place, by queued work (a reset that keeps recorded work valid);
  // kUnimplemented where the device does not (then a reset takes new zeros()).
  virtual Status zero_in_place(const Tensor& t) {
    return make_error(StatusCode::kUnimplemented, "device '%s' does not zero buffers in place", name().c_str());
  }
};

// Opening a device by name: device_registry.h.

// What a kernel sees: its operands by slot id, resolved scalars, and the
// declared dtype of its outputs. Implemented by the interpreter.
class KernelContext {
 public:
  virtual ~KernelContext() = default;
  // The tensor in a slot; an error when no executed instruction wrote it.
  virtual Result<Tensor> in(const fb::Tid* tid) = 0;
  // Stores a result; checked against the slot's declared dtype and shape.
  virtual Status out(const fb::Tid* tid, Tensor value) = 0;
  // A slot's tensor for in-place update, copied first if its storage is shared.
  virtual Result<Tensor> inplace(const fb::Tid* tid) = 0;
  virtual Result<int64_t> resolve(const fb::IntOrVidT* v) = 0;
  // v for a kernel that reads it on the device while it runs (Device::set_dynamic_values'
  // word `word`) instead of baking it into its arguments; word 0 (always 0 on the device)
  // where v is a literal or a computed value: then `value` goes in the arguments. A kernel
  // then states the range its checks accept (guard_dynamic): recorded work replays for any
  // value in it; without a guard v counts as baked in.
  struct DynamicValue {
    int64_t value = 0;
    uint32_t word = 0;
  };
  virtual Result<DynamicValue> resolve_dynamic(const fb::IntOrVidT* v) = 0;
  virtual void guard_dynamic(const fb::IntOrVidT* v, int64_t lo, int64_t hi) = 0;
  virtual DType declared_dtype(const fb::Tid* tid) const = 0;
  // Dim i of the slot's declaration: its static size, or -1 (dynamic, or no such dim).
  virtual int64_t declared_dim(const fb::Tid* tid, size_t i) const = 0;
  // True for constant slots: their contents never change, so derived data
  // (e.g. repacked weights) may be cached.
  virtual bool is_constant(const fb::Tid* tid) const = 0;
  // Keeps `obj` alive as long as the session (e.g. a cache entry it uses);
  // retaining the same object again is a no-op.
  virtual void retain(std::shared_ptr<const void> obj) = 0;
  // The device running the kernel (device kernels reach their queues through it).
  virtual Device& device() = 0;
};

}  // namespace switchboard
