// Executes a validated program on one device: slot tables, chains, If, and the
// per-session mutable buffers.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "device.h"
#include "program_impl.h"

namespace switchboard::detail {

// A host scalar: an integer (shapes, indices) or a float.
struct Value {
  bool is_float = false;
  int64_t i = 0;
  double f = 0;
};

class Interpreter final : public KernelContext {
 public:
  // replay: record a repeated execution on devices that can (Device::begin_recording) and
  // replay it while its inputs allow (replay.cpp).
  Interpreter(const ProgramImpl& program, std::unique_ptr<Device> device, bool replay = false);
  ~Interpreter() override;

  // Resolves a kernel for every instruction; errors name the first op the device lacks.
  Status plan();
  // Zero-fills mutable buffers, then runs the init chain.
  Status reset();
  Status execute();

  Status set_input(size_t index, Tensor value);
  Status set_input_value(size_t index, int64_t value);
  Result<Tensor> tensor_slot(uint32_t tid) const;
  Result<Value> value_slot(uint32_t vid) const;
  const std::string& device_name() const { return device_->name(); }
  const std::string& device_description() const { return device_->description(); }
  double last_device_us() const { return device_->last_device_us(); }
  double last_record_us() const { return device_->last_record_us(); }
  uint64_t device_dispatches() const { return device_->dispatches(); }
  // Whether the last execute() replayed recorded work instead of running the chains.
  bool last_replayed() const { return last_replayed_; }
  // Host time the last execute() spent inside op kernels (and host ops), microseconds.
  double last_kernel_us() const { return kernel_us_; }

  // KernelContext
  Result<Tensor> in(const fb::Tid* tid) override;
  Status out(const fb::Tid* tid, Tensor value) override;
  Result<Tensor> inplace(const fb::Tid* tid) override;
  Result<int64_t> resolve(const fb::IntOrVidT* v) override;
  Result<DynamicValue> resolve_dynamic(const fb::IntOrVidT* v) override;
  void guard_dynamic(const fb::IntOrVidT* v, int64_t lo, int64_t hi) override;
  DType declared_dtype(const fb::Tid* tid) const override;
  int64_t declared_dim(const fb::Tid* tid, size_t i) const override;
  bool is_constant(const fb::Tid* tid) const override { return prog_.roles[tid->idx()] == SlotRole::kConstant; }
  void retain(std::shared_ptr<const void> obj) override { retained_.emplace(obj.get(), std::move(obj)); }
  Device& device() override { return *device_; }

 private:
  Status run_chain(uint32_t chain, uint32_t depth);
  Status flush_if_wanted();
  Status run_host_op(const fb::OpNodeUnion& op, uint32_t depth);
  void clear_transient();
  // replay.cpp: recording an execution and replaying it.
  struct Recording;
  std::vector<uint32_t> dynamic_words() const;
  bool want_recording() const;
  Status stage_inputs(Recording& r);
  void keep_recording(std::unique_ptr<Recording> r, bool ok);
  bool replayable() const;
  Status replay();

  const ProgramImpl& prog_;
  std::unique_ptr<Device> device_;
  std::vector<std::vector<KernelFn>> plan_;  // [chain][instruction]
  std::vector<std::vector<Fusion>> fused_;   // [chain][instruction]: a fusion starting there, if any
  // [main chain instruction]: temps nothing reads after it, dropped once it ran (their memory
  // serves later ops: a prefill holds a layer's temporaries, not the whole model's).
  std::vector<std::vector<uint32_t>> release_;
  void plan_release();
  std::vector<Tensor> tensors_;
  std::vector<uint8_t> written_;
  std::vector<Value> values_;
  std::vector<uint8_t> value_written_;
  std::vector<uint8_t> value_is_input_;
  std::map<const void*, std::shared_ptr<const void>> retained_;  // one entry per object, however often retained
  // How this execution's kernels read each input value: baked in (static) or on the device.
  enum class Use : uint8_t { kUnread, kStatic, kDynamic };
  std::vector<Use> value_use_;
  std::vector<uint32_t> dyn_word_;                  // value slot -> its dynamic word (0: none)
  std::vector<std::pair<int64_t, int64_t>> guard_;  // value slot -> the range kernels accept
  std::vector<uint8_t> guarded_;
  bool replay_ = false;
  bool last_replayed_ = false;
  double kernel_us_ = 0;
  int failed_recordings_ = 0;             // recordings made but never replayed, in a row
  std::vector<Shape> last_shapes_;        // the tensor inputs' shapes at the last execution
  std::unique_ptr<Recording> recording_;  // after device_: destroyed before it
};

// What a recorded execution baked in, and the device work (replay.cpp).
struct Interpreter::Recording {
  std::unique_ptr<RecordedWork> work;
  std::vector<Tensor> staged;  // per tensor input, in input order: the device copy the work reads
  struct Fixed {
    uint32_t slot;
    int64_t value;
  };
  std::vector<Fixed> fixed;  // input values baked in
  struct Range {
    uint32_t slot;
    int64_t lo, hi;
  };
  std::vector<Range> ranges;                         // input values read on the device
  std::vector<std::pair<uint32_t, Tensor>> outputs;  // tensor outputs, written by the work
  // Mutable buffers' storage, updated in place (identities only: a reference here would make
  // every normal execution copy the buffers before writing them).
  std::vector<std::pair<uint32_t, const void*>> buffers;
  std::vector<Value> values;                         // every value slot at the end
  std::vector<uint8_t> value_written;
};

}  // namespace switchboard::detail
