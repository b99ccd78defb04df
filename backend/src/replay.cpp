// Recorded executions: a decode step, run once with the device keeping its work, is then
// replayed (submitted again) for every later token instead of running the chains. Valid while
// what the recorded work baked in is unchanged: the tensor inputs' shapes, every input value a
// kernel or host op read on the host, the mutable buffers' storage. Input values that kernels
// read on the device (resolve_dynamic) may change within the ranges the kernels' checks accept.
#include <cstring>

#include "interpreter.h"

namespace switchboard::detail {

Interpreter::~Interpreter() = default;

// Replays the recorded work where it is valid; else runs the main chain (recording it when
// want_recording() says so).
Status Interpreter::execute() {
  for (const auto& io : prog_.ir->inputs) {
    bool set = io->kind == fb::SlotKind::Tensor ? written_[io->idx] : value_written_[io->idx];
    SB_CHECK_OR_RETURN(set, StatusCode::kInvalidArgument, "input '%s' was not set", io->name.c_str());
  }
  clear_transient();
  device_->begin_execution();
  last_replayed_ = false;
  kernel_us_ = 0;
  SB_RETURN_IF_ERROR(device_->set_dynamic_values(dynamic_words()));
  if (recording_ && replayable()) return replay();
  std::unique_ptr<Recording> rec;
  if (want_recording() && device_->begin_recording()) {
    rec = std::make_unique<Recording>();
    Status st = stage_inputs(*rec);
    if (!st.is_ok()) {
      (void)device_->end_recording();
      return st;
    }
  }
  value_use_.assign(value_use_.size(), Use::kUnread);
  guarded_.assign(guarded_.size(), 0);
  if (rec)  // the buffers' storage the recorded work will update (it must stay the same)
    for (const auto& mb : prog_.ir->mutable_buffers)
      rec->buffers.emplace_back(mb->tid->idx(), tensors_[mb->tid->idx()].storage_id());
  Status st = run_chain(prog_.ir->main_chain, 0);
  Status done = device_->sync();  // always drain queued work, even after an error
  if (rec) keep_recording(std::move(rec), st.is_ok() && done.is_ok());
  last_shapes_.clear();
  for (const auto& io : prog_.ir->inputs)
    if (io->kind == fb::SlotKind::Tensor) last_shapes_.push_back(tensors_[io->idx].shape());
  return st.is_ok() ? done : st;
}

std::vector<uint32_t> Interpreter::dynamic_words() const {
  std::vector<uint32_t> w(1 + prog_.ir->inputs.size(), 0);
  for (size_t i = 0; i < prog_.ir->inputs.size(); ++i) {
    const fb::IoSlotT& io = *prog_.ir->inputs[i];
    if (io.kind == fb::SlotKind::Value && value_written_[io.idx] && !values_[io.idx].is_float)
      w[1 + i] = static_cast<uint32_t>(values_[io.idx].i);  // kernels read it only within their guards
  }
  return w;
}

// Record the second of two executions with the same input shapes (the first decode step
// after a prefill has the prefill's predecessor); give up after kMaxUnreplayed recordings in a
// row were never replayed (a program whose kernels bake the position in, say).
constexpr int kMaxUnreplayed = 4;

bool Interpreter::want_recording() const {
  if (!replay_ || failed_recordings_ >= kMaxUnreplayed) return false;
  size_t k = 0;
  for (const auto& io : prog_.ir->inputs) {
    if (io->kind != fb::SlotKind::Tensor) continue;
    if (k >= last_shapes_.size() || last_shapes_[k] != tensors_[io->idx].shape()) return false;
    ++k;
  }
  return true;
}

// The recorded work reads the tensor inputs from device copies the interpreter refills.
Status Interpreter::stage_inputs(Recording& r) {
  for (const auto& io : prog_.ir->inputs) {
    if (io->kind != fb::SlotKind::Tensor) continue;
    SB_ASSIGN_OR_RETURN(Tensor t, device_->stage_input(tensors_[io->idx]));
    SB_CHECK_OR_RETURN(!t.shares_storage(tensors_[io->idx]), StatusCode::kInternal,
                       "input '%s': the device staged it in place", io->name.c_str());
    tensors_[io->idx] = t;
    r.staged.push_back(std::move(t));
  }
  return Status::ok();
}

void Interpreter::keep_recording(std::unique_ptr<Recording> r, bool ok) {
  r->work = device_->end_recording();
  const fb::ProgramT& ir = *prog_.ir;
  for (const auto& io : ir.outputs) {
    if (io->kind != fb::SlotKind::Tensor) continue;
    // An output that is not a temp (an input, a buffer, a constant) is not the work's to write.
    if (prog_.roles[io->idx] != SlotRole::kTemp) ok = false;
    r->outputs.emplace_back(io->idx, tensors_[io->idx]);
  }
  // A buffer that took new storage during the step (a copy-on-write, a buffer assigned a new
  // value): the work read the old storage, which a replay would read again.
  for (const auto& [slot, storage] : r->buffers)
    if (tensors_[slot].storage_id() != storage) ok = false;
  if (!ok || !r->work) {  // a failed execution leaves the recording there is
    ++failed_recordings_;
    return;
  }
  for (const auto& io : ir.inputs) {
    if (io->kind != fb::SlotKind::Value) continue;
    const uint32_t v = io->idx;
    if (value_use_[v] == Use::kStatic || (value_use_[v] == Use::kDynamic && !guarded_[v]))
      r->fixed.push_back({v, values_[v].i});
    else if (value_use_[v] == Use::kDynamic)
      r->ranges.push_back({v, guard_[v].first, guard_[v].second});
  }
  r->values = values_;
  r->value_written = value_written_;
  if (recording_) ++failed_recordings_;  // the previous one was never replayed
  recording_ = std::move(r);
}

bool Interpreter::replayable() const {
  const Recording& r = *recording_;
  // References to a storage that the recording itself holds (its own tensor lists).
  auto own = [&](const Tensor& t) {
    long n = 0;
    for (const auto& [slot, x] : r.outputs) n += x.shares_storage(t);
    for (const Tensor& x : r.staged) n += x.shares_storage(t);
    return n;
  };
  size_t k = 0;
  for (const auto& io : prog_.ir->inputs) {
    if (io->kind != fb::SlotKind::Tensor) continue;
    const Tensor& now = tensors_[io->idx];
    if (now.dtype() != r.staged[k].dtype() || now.shape() != r.staged[k].shape()) return false;
    ++k;
  }
  for (const auto& f : r.fixed)
    if (values_[f.slot].is_float || values_[f.slot].i != f.value) return false;
  for (const auto& g : r.ranges)
    if (values_[g.slot].is_float || values_[g.slot].i < g.lo || values_[g.slot].i > g.hi) return false;
  // The buffers the work updates are still the slots' storage, and nobody else holds them (an
  // execution would copy them first); nobody holds an output the work would overwrite.
  for (const auto& [slot, storage] : r.buffers) {
    const Tensor& now = tensors_[slot];
    if (now.storage_id() != storage || now.storage_use_count() - 1 - own(now) - device_->queued_refs(now) != 0)
      return false;
  }
  for (const auto& [slot, t] : r.outputs)
    if (t.storage_use_count() - own(t) - device_->queued_refs(t) != 0) return false;
  return true;
}

Status Interpreter::replay() {
  Recording& r = *recording_;
  size_t k = 0;
  for (const auto& io : prog_.ir->inputs) {
    if (io->kind != fb::SlotKind::Tensor) continue;
    Tensor& staged = r.staged[k++];
    Tensor& now = tensors_[io->idx];
    if (!now.shares_storage(staged) && now.nbytes()) std::memcpy(staged.mutable_data(), now.data(), now.nbytes());
    now = staged;
  }
  Status st = device_->replay(*r.work);
  if (!st.is_ok()) {
    recording_.reset();
    return st;
  }
  for (const auto& [slot, t] : r.outputs) {
    tensors_[slot] = t;
    written_[slot] = 1;
  }
  for (size_t v = 0; v < values_.size(); ++v)
    if (!value_is_input_[v]) values_[v] = r.values[v], value_written_[v] = r.value_written[v];
  failed_recordings_ = 0;
  last_replayed_ = true;
  return Status::ok();
}

}  // namespace switchboard::detail
