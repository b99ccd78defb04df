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
  Interpreter(const ProgramImpl& program, std::unique_ptr<Device> device);

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

  // KernelContext
  Result<Tensor> in(const fb::Tid* tid) override;
  Status out(const fb::Tid* tid, Tensor value) override;
  Result<Tensor> inplace(const fb::Tid* tid) override;
  Result<int64_t> resolve(const fb::IntOrVidT* v) override;
  DType declared_dtype(const fb::Tid* tid) const override;
  bool is_constant(const fb::Tid* tid) const override { return prog_.roles[tid->idx()] == SlotRole::kConstant; }
  void retain(std::shared_ptr<const void> obj) override { retained_.emplace(obj.get(), std::move(obj)); }
  Device& device() override { return *device_; }

 private:
  Status run_chain(uint32_t chain, uint32_t depth);
  Status run_host_op(const fb::OpNodeUnion& op, uint32_t depth);
  void clear_transient();

  const ProgramImpl& prog_;
  std::unique_ptr<Device> device_;
  std::vector<std::vector<KernelFn>> plan_;  // [chain][instruction]
  std::vector<std::vector<Fusion>> fused_;   // [chain][instruction]: a fusion starting there, if any
  std::vector<Tensor> tensors_;
  std::vector<uint8_t> written_;
  std::vector<Value> values_;
  std::vector<uint8_t> value_written_;
  std::vector<uint8_t> value_is_input_;
  std::map<const void*, std::shared_ptr<const void>> retained_;  // one entry per object, however often retained
};

}  // namespace switchboard::detail
