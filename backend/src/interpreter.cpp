#include "interpreter.h"

#include <algorithm>
#include <chrono>

#include "log.h"
#include "op_info.h"

namespace switchboard::detail {

Interpreter::Interpreter(const ProgramImpl& program, std::unique_ptr<Device> device, bool replay)
    : prog_(program), device_(std::move(device)), replay_(replay) {
  const fb::ProgramT& ir = *prog_.ir;
  tensors_.resize(ir.num_tensor_slots);
  written_.assign(ir.num_tensor_slots, 0);
  values_.resize(ir.num_value_slots);
  value_written_.assign(ir.num_value_slots, 0);
  value_is_input_.assign(ir.num_value_slots, 0);
  value_use_.assign(ir.num_value_slots, Use::kUnread);
  dyn_word_.assign(ir.num_value_slots, 0);
  guard_.assign(ir.num_value_slots, {0, 0});
  guarded_.assign(ir.num_value_slots, 0);
  for (size_t i = 0; i < ir.inputs.size(); ++i)
    if (ir.inputs[i]->kind == fb::SlotKind::Value) {
      value_is_input_[ir.inputs[i]->idx] = 1;
      dyn_word_[ir.inputs[i]->idx] = static_cast<uint32_t>(1 + i);
    }
  for (uint32_t t = 0; t < ir.num_tensor_slots; ++t) {
    if (prog_.roles[t] == SlotRole::kConstant) {
      tensors_[t] = prog_.constants[t];
      written_[t] = 1;
    }
  }
}

static bool is_host_op(fb::OpNode t) {
  return t == fb::OpNode::SymSizeNode || t == fb::OpNode::IntArithNode || t == fb::OpNode::IfNode;
}

// How instructions [from, end) of `chain` first touch `slot` (Ifs: through their branches).
enum class FirstUse { kNone, kRead, kWrite };
static FirstUse first_use(const fb::ProgramT& ir, uint32_t chain, uint32_t slot, size_t from, uint32_t depth) {
  if (depth > kMaxIfDepth || chain >= ir.chains.size()) return FirstUse::kRead;  // malformed: assume a read
  const auto& ins = ir.chains[chain]->instructions;
  for (size_t j = from; j < ins.size(); ++j) {
    if (const auto* n = ins[j]->op.AsIfNode()) {
      const FirstUse a = first_use(ir, n->then_chain, slot, 0, depth + 1);
      const FirstUse b = first_use(ir, n->else_chain, slot, 0, depth + 1);
      if (a == FirstUse::kRead || b == FirstUse::kRead) return FirstUse::kRead;
      if (a == FirstUse::kWrite && b == FirstUse::kWrite) return FirstUse::kWrite;
    }
    bool read = false, write = false;
    for_each_slot(ins[j]->op, [&](const SlotRef& r) {
      if (r.is_tensor && r.idx && *r.idx == slot) (r.is_write ? write : read) = true;
    });
    if (read) return FirstUse::kRead;
    if (write) return FirstUse::kWrite;
  }
  return FirstUse::kNone;
}

// Whether nothing after instruction `last` of `chain` reads the value in `slot`: it is
// overwritten first, or never touched again here and (for a branch) after every If
// that runs the branch.
static bool dead_after(const fb::ProgramT& ir, uint32_t chain, uint32_t slot, size_t last, uint32_t depth = 0) {
  if (depth > kMaxIfDepth) return false;
  const FirstUse use = first_use(ir, chain, slot, last + 1, 0);
  if (use != FirstUse::kNone) return use == FirstUse::kWrite;
  if (chain == static_cast<uint32_t>(ir.main_chain)) return true;
  bool run = false;
  for (uint32_t p = 0; p < ir.chains.size(); ++p)
    for (size_t j = 0; j < ir.chains[p]->instructions.size(); ++j)
      if (const auto* n = ir.chains[p]->instructions[j]->op.AsIfNode();
          n && (n->then_chain == chain || n->else_chain == chain)) {
        run = true;
        if (!dead_after(ir, p, slot, j, depth + 1)) return false;
      }
  return run;  // a chain no If runs (the init chain): its values stay
}

Status Interpreter::plan() {
  const auto& chains = prog_.ir->chains;
  plan_.assign(chains.size(), {});
  fused_.assign(chains.size(), {});
  std::vector<bool> is_output(prog_.ir->num_tensor_slots, false);
  for (const auto& io : prog_.ir->outputs)
    if (io->kind == fb::SlotKind::Tensor && io->idx < is_output.size()) is_output[io->idx] = true;
  for (size_t c = 0; c < chains.size(); ++c) {
    for (size_t i = 0; i < chains[c]->instructions.size(); ++i) {
      fb::OpNode t = chains[c]->instructions[i]->op.type;
      KernelFn fn = is_host_op(t) ? nullptr : device_->kernels().find(t);
      SB_CHECK_OR_RETURN(is_host_op(t) || fn, StatusCode::kUnimplemented,
                         "chains[%zu].instructions[%zu]: device '%s' has no kernel for %s", c, i,
                         device_->name().c_str(), op_name(t));
      if (fn) {
        Status st = device_->can_run(chains[c]->instructions[i]->op, *this);
        if (!st.is_ok()) return st.annotate(strformat("chains[%zu].instructions[%zu].%s", c, i, op_name(t)));
      }
      plan_[c].push_back(fn);
    }
    const PrivateTemp private_temp = [&](const fb::Tid* t, size_t last) {
      return t && t->idx() < is_output.size() && prog_.roles[t->idx()] == SlotRole::kTemp &&
             !is_output[t->idx()] && dead_after(*prog_.ir, static_cast<uint32_t>(c), t->idx(), last);
    };
    for (size_t i = 0; i < chains[c]->instructions.size(); ++i) {
      Fusion f = device_->fuse(chains[c]->instructions, i, private_temp);
      fused_[c].push_back(f.fn && f.span > 1 && i + f.span <= chains[c]->instructions.size() ? f : Fusion{});
    }
  }
  plan_release();
  return Status::ok();
}

// A temp (not an output) that only the main chain touches is dead after the last instruction
// touching it; one that an If's branches or the init chain touch is kept (conservative).
void Interpreter::plan_release() {
  const fb::ProgramT& ir = *prog_.ir;
  constexpr int kNone = -1, kMany = -2;
  std::vector<int> chain_of(ir.num_tensor_slots, kNone);
  std::vector<size_t> last(ir.num_tensor_slots, 0);
  for (const auto& io : ir.outputs)
    if (io->kind == fb::SlotKind::Tensor && io->idx < chain_of.size()) chain_of[io->idx] = kMany;
  for (size_t c = 0; c < ir.chains.size(); ++c)
    for (size_t i = 0; i < ir.chains[c]->instructions.size(); ++i)
      for_each_slot(ir.chains[c]->instructions[i]->op, [&](const SlotRef& r) {
        if (!r.is_tensor || !r.idx || *r.idx >= chain_of.size()) return;
        int& o = chain_of[*r.idx];
        o = o == kNone || o == static_cast<int>(c) ? static_cast<int>(c) : kMany;
        last[*r.idx] = i;
      });
  const auto main = static_cast<int>(ir.main_chain);
  release_.assign(ir.main_chain < ir.chains.size() ? ir.chains[ir.main_chain]->instructions.size() : 0, {});
  for (uint32_t t = 0; t < chain_of.size(); ++t)
    if (chain_of[t] == main && !release_.empty() && prog_.roles[t] == SlotRole::kTemp) release_[last[t]].push_back(t);
}

Status Interpreter::reset() {
  // The next execution (a prompt) is not the second of a pair a recording wants: recording it
  // would keep every temporary of a prefill alive, and count as a recording never replayed.
  last_shapes_.clear();
  // A recording survives where every mutable buffer is zeroed where it is (nobody but the
  // recorded work holds one): the next prompt's decode steps replay it without the two steps
  // that run the chains, each costly in host time (bench/RESULTS.md).
  bool in_place = recording_ != nullptr;
  for (const auto& mb : prog_.ir->mutable_buffers) {
    const Tensor& t = tensors_[mb->tid->idx()];
    in_place = in_place && t.defined() && t.storage_use_count() - 1 - device_->queued_refs(t) == 0;
  }
  for (const auto& mb : prog_.ir->mutable_buffers) {
    uint32_t t = mb->tid->idx();
    if (in_place) {
      Status st = device_->zero_in_place(tensors_[t]);
      if (st.is_ok()) continue;
      if (st.code() != StatusCode::kUnimplemented) {
        recording_.reset();  // half zeroed: nothing may replay over it
        (void)device_->sync();
        return st;
      }
      in_place = false;
    }
    recording_.reset();  // the mutable buffers it wrote are replaced
    const fb::TensorMetaT& m = *prog_.ir->tensor_meta[t];
    Shape s;
    for (const auto& d : m.shape) s.push_back(d->size);
    SB_ASSIGN_OR_RETURN(tensors_[t], device_->zeros(static_cast<DType>(m.dtype), s));
    written_[t] = 1;
  }
  // A GPU zeroes them with queued work: done before the host can read them.
  if (!prog_.ir->mutable_buffers.empty()) {
    Status st = device_->sync();
    if (!st.is_ok()) recording_.reset();
    SB_RETURN_IF_ERROR_AT(st, "zeroing the mutable buffers");
  }
  if (prog_.ir->init_chain >= 0) {
    clear_transient();
    SB_RETURN_IF_ERROR(device_->set_dynamic_values(dynamic_words()));
    Status st = run_chain(static_cast<uint32_t>(prog_.ir->init_chain), 0);
    Status done = device_->sync();
    SB_RETURN_IF_ERROR_AT(st.is_ok() ? done : st, "init chain");
  }
  return Status::ok();
}

// Temps and non-input values from the previous execution must not count as written.
void Interpreter::clear_transient() {
  for (size_t t = 0; t < tensors_.size(); ++t) {
    if (prog_.roles[t] == SlotRole::kTemp) {
      tensors_[t] = Tensor();
      written_[t] = 0;
    }
  }
  for (size_t v = 0; v < values_.size(); ++v)
    if (!value_is_input_[v]) value_written_[v] = 0;
}

// Between two ops nothing is half bound: a sync there lets the queued work's temporaries go.
Status Interpreter::flush_if_wanted() {
  if (!device_->wants_flush()) return Status::ok();
  Status st = device_->sync();
  return st.is_ok() ? st : st.annotate("a sync to free the queued work's memory");
}

Status Interpreter::run_chain(uint32_t chain, uint32_t depth) {
  const auto& ins = prog_.ir->chains[chain]->instructions;
  const bool main = chain == static_cast<uint32_t>(prog_.ir->main_chain) && release_.size() == ins.size();
  auto release_after = [&](size_t i, size_t span) {
    for (size_t j = i; j < i + span; ++j)
      for (uint32_t t : release_[j]) tensors_[t] = Tensor(), written_[t] = 0;
  };
  for (size_t i = 0; i < ins.size(); ++i) {
    const fb::OpNodeUnion& op = ins[i]->op;
    device_->op_boundary();
    auto start = std::chrono::steady_clock::now();
    if (const Fusion& f = fused_[chain][i]; f.fn) {
      // Instructions [i, i + span) as one kernel; errors name the first of them.
      Status st = f.fn(*this, &ins[i]);
      kernel_us_ += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
      if (!st.is_ok())
        return st.annotate(strformat("chains[%u].instructions[%zu..%zu].%s", chain, i, i + f.span - 1, op_name(op.type)));
      if (log::op_log_enabled())
        log::logger().info("op chains[{}][{}..{}] fused {} ... {} {:.1f} us on {}", chain, i, i + f.span - 1,
                           op_name(op.type), op_name(ins[i + f.span - 1]->op.type),
                           std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count(),
                           device_->name());
      if (main) release_after(i, f.span);
      i += f.span - 1;
      SB_RETURN_IF_ERROR(flush_if_wanted());
      continue;
    }
    Status st = plan_[chain][i] ? plan_[chain][i](*this, op) : run_host_op(op, depth);
    if (op.type != fb::OpNode::IfNode)  // an If's branch ops count themselves
      kernel_us_ += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    if (!st.is_ok()) return st.annotate(strformat("chains[%u].instructions[%zu].%s", chain, i, op_name(op.type)));
    if (main) release_after(i, 1);
    SB_RETURN_IF_ERROR(flush_if_wanted());
    if (log::op_log_enabled() && op.type != fb::OpNode::IfNode) {
      double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
      std::string shapes;
      for_each_slot(const_cast<fb::OpNodeUnion&>(op), [&](const SlotRef& r) {
        if (r.is_tensor && r.idx && written_[*r.idx])
          shapes += strformat(" %s%s=%s", r.is_write ? "->" : "", r.field, shape_str(tensors_[*r.idx].shape()).c_str());
      });
      log::logger().info("op chains[{}][{}] {}{} {:.1f} us on {}", chain, i, op_name(op.type), shapes, us,
                         device_->name());
    }
  }
  return Status::ok();
}

Status Interpreter::run_host_op(const fb::OpNodeUnion& op, uint32_t depth) {
  switch (op.type) {
    case fb::OpNode::SymSizeNode: {
      const auto* n = op.AsSymSizeNode();
      SB_ASSIGN_OR_RETURN(Tensor x, in(n->x.get()));
      int64_t axis = n->axis < 0 ? n->axis + x.rank() : n->axis;
      SB_CHECK_OR_RETURN(axis >= 0 && axis < x.rank(), StatusCode::kInvalidArgument, "axis %d out of range for %s",
                         n->axis, shape_str(x.shape()).c_str());
      values_[n->out->idx()] = Value{false, x.dim(axis), 0};
      value_written_[n->out->idx()] = 1;
      return Status::ok();
    }
    case fb::OpNode::IntArithNode: {
      const auto* n = op.AsIntArithNode();
      SB_ASSIGN_OR_RETURN(int64_t a, resolve(n->a.get()));
      SB_ASSIGN_OR_RETURN(int64_t b, resolve(n->b.get()));
      int64_t r = 0;
      bool overflow = false;
      switch (n->op) {
        case fb::IntOp::Add: overflow = __builtin_add_overflow(a, b, &r); break;
        case fb::IntOp::Sub: overflow = __builtin_sub_overflow(a, b, &r); break;
        case fb::IntOp::Mul: overflow = __builtin_mul_overflow(a, b, &r); break;
        case fb::IntOp::FloorDiv:
        case fb::IntOp::Mod: {
          SB_CHECK_OR_RETURN(b != 0, StatusCode::kInvalidArgument, "division by zero");
          SB_CHECK_OR_RETURN(!(a == INT64_MIN && b == -1), StatusCode::kOutOfRange, "int64 overflow");
          int64_t q = a / b, m = a % b;
          if (m != 0 && ((m < 0) != (b < 0))) { --q; m += b; }  // round toward -inf
          r = n->op == fb::IntOp::FloorDiv ? q : m;
          break;
        }
        case fb::IntOp::Max: r = a > b ? a : b; break;
        case fb::IntOp::Min: r = a < b ? a : b; break;
      }
      SB_CHECK_OR_RETURN(!overflow, StatusCode::kOutOfRange, "int64 overflow");
      values_[n->out->idx()] = Value{false, r, 0};
      value_written_[n->out->idx()] = 1;
      return Status::ok();
    }
    case fb::OpNode::IfNode: {
      const auto* n = op.AsIfNode();
      SB_ASSIGN_OR_RETURN(int64_t cond, resolve(n->cond.get()));
      uint32_t target = cond != 0 ? n->then_chain : n->else_chain;
      SB_CHECK_OR_RETURN(depth < kMaxIfDepth, StatusCode::kOutOfRange, "If nesting deeper than %u", kMaxIfDepth);
      SB_RETURN_IF_ERROR_AT(run_chain(target, depth + 1), cond != 0 ? "then" : "else");
      for (const fb::Tid& t : n->outputs)
        SB_CHECK_OR_RETURN(written_[t.idx()], StatusCode::kInvalidProgram,
                           "%s branch (chain %u) did not write output tensor slot %u", cond ? "then" : "else", target,
                           t.idx());
      return Status::ok();
    }
    default: return make_error(StatusCode::kInternal, "not a host op");
  }
}

Result<Tensor> Interpreter::in(const fb::Tid* tid) {
  uint32_t t = tid->idx();
  SB_CHECK_OR_RETURN(written_[t], StatusCode::kInvalidProgram,
                     "reads tensor slot %u, which no executed instruction wrote", t);
  return tensors_[t];
}

Status Interpreter::out(const fb::Tid* tid, Tensor value) {
  uint32_t t = tid->idx();
  const fb::TensorMetaT& m = *prog_.ir->tensor_meta[t];
  SB_CHECK_OR_RETURN(value.dtype() == static_cast<DType>(m.dtype), StatusCode::kInternal,
                     "result dtype %s differs from slot %u's %s", dtype_name(value.dtype()), t,
                     dtype_name(static_cast<DType>(m.dtype)));
  SB_CHECK_OR_RETURN(shape_fits(value.shape(), m.shape), StatusCode::kInvalidArgument,
                     "result shape %s does not fit slot %u's declared %s", shape_str(value.shape()).c_str(), t,
                     dims_str(m.shape).c_str());
  tensors_[t] = std::move(value);
  written_[t] = 1;
  return Status::ok();
}

Result<Tensor> Interpreter::inplace(const fb::Tid* tid) {
  SB_ASSIGN_OR_RETURN(Tensor cur, in(tid));
  tensors_[tid->idx()] = Tensor();  // drop our reference so use_count reflects other holders
  // Copy-on-write: the storage may be shared with a caller's tensor or a view. The host
  // copy reads the bytes, so queued device work that writes them must finish first.
  // References held only by the device's queue need neither (the write is queued after).
  auto others = [&] { return cur.storage_use_count() - 1 - device_->queued_refs(cur); };
  if (others() > 0) SB_RETURN_IF_ERROR(device_->sync());
  Tensor t = others() == 0 ? std::move(cur) : cur.clone();
  tensors_[tid->idx()] = t;
  return t;
}

Result<int64_t> Interpreter::resolve(const fb::IntOrVidT* v) {
  if (!v->is_vid) return v->literal;
  uint32_t id = v->vid->idx();
  SB_CHECK_OR_RETURN(value_written_[id], StatusCode::kInvalidProgram,
                     "reads value slot %u, which no executed instruction wrote", id);
  if (value_is_input_[id]) value_use_[id] = Use::kStatic;
  const Value& val = values_[id];
  return val.is_float ? static_cast<int64_t>(val.f) : val.i;
}

Result<KernelContext::DynamicValue> Interpreter::resolve_dynamic(const fb::IntOrVidT* v) {
  // Literals, computed values and float inputs go in the kernel's arguments (baked in: resolve's
  // static read); an integer input is read on the device unless something baked it in already.
  const uint32_t id = v->is_vid ? v->vid->idx() : 0;
  const bool on_device = v->is_vid && value_is_input_[id] && !values_[id].is_float;
  const Use before = on_device ? value_use_[id] : Use::kUnread;
  SB_ASSIGN_OR_RETURN(int64_t x, resolve(v));
  if (!on_device) return DynamicValue{x, 0};
  value_use_[id] = before == Use::kStatic ? Use::kStatic : Use::kDynamic;
  return DynamicValue{x, dyn_word_[id]};
}

void Interpreter::guard_dynamic(const fb::IntOrVidT* v, int64_t lo, int64_t hi) {
  if (!v->is_vid || !value_is_input_[v->vid->idx()]) return;
  const uint32_t id = v->vid->idx();
  auto& g = guard_[id];
  g = guarded_[id] ? std::make_pair(std::max(g.first, lo), std::min(g.second, hi)) : std::make_pair(lo, hi);
  guarded_[id] = 1;
}

DType Interpreter::declared_dtype(const fb::Tid* tid) const {
  return static_cast<DType>(prog_.ir->tensor_meta[tid->idx()]->dtype);
}

int64_t Interpreter::declared_dim(const fb::Tid* tid, size_t i) const {
  const auto& shape = prog_.ir->tensor_meta[tid->idx()]->shape;
  return i < shape.size() && shape[i] ? shape[i]->size : -1;
}

Status Interpreter::set_input(size_t index, Tensor value) {
  const fb::IoSlotT& io = *prog_.ir->inputs[index];
  const fb::TensorMetaT& m = *prog_.ir->tensor_meta[io.idx];
  SB_CHECK_OR_RETURN(value.defined() || value.numel() == 0, StatusCode::kInvalidArgument, "input '%s': empty tensor",
                     io.name.c_str());
  SB_CHECK_OR_RETURN(value.dtype() == static_cast<DType>(m.dtype), StatusCode::kInvalidArgument,
                     "input '%s': dtype %s, expected %s", io.name.c_str(), dtype_name(value.dtype()),
                     dtype_name(static_cast<DType>(m.dtype)));
  SB_CHECK_OR_RETURN(shape_fits(value.shape(), m.shape), StatusCode::kInvalidArgument,
                     "input '%s': shape %s does not fit %s", io.name.c_str(), shape_str(value.shape()).c_str(),
                     dims_str(m.shape).c_str());
  tensors_[io.idx] = std::move(value);
  written_[io.idx] = 1;
  return Status::ok();
}

Status Interpreter::set_input_value(size_t index, int64_t value) {
  const fb::IoSlotT& io = *prog_.ir->inputs[index];
  values_[io.idx] = Value{false, value, 0};
  value_written_[io.idx] = 1;
  return Status::ok();
}

Result<Tensor> Interpreter::tensor_slot(uint32_t tid) const {
  SB_CHECK_OR_RETURN(written_[tid], StatusCode::kInvalidArgument, "tensor slot %u was not written", tid);
  return tensors_[tid];
}

Result<Value> Interpreter::value_slot(uint32_t vid) const {
  SB_CHECK_OR_RETURN(value_written_[vid], StatusCode::kInvalidArgument, "value slot %u was not written", vid);
  return values_[vid];
}

}  // namespace switchboard::detail
