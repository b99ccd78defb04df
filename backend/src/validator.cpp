// Semantic validation of a verified program. The FlatBuffer verifier only
// proves the bytes are in bounds; this proves every id, index, dtype, shape and
// name is meaningful, so the interpreter can trust them. Every error names the
// path into the file, e.g. "chains[2].instructions[7].Binary.a: ...".
#include <algorithm>
#include <set>
#include <string>

#include "op_info.h"
#include "program_impl.h"
#include "op_rules.h"

namespace switchboard {
namespace {

constexpr uint32_t kMaxSlots = 1u << 24;
constexpr size_t kMaxChains = 1u << 16;
using ops::kMaxRank;

using MetaList = std::vector<std::unique_ptr<fb::TensorMetaT>>;

Status error(const std::string& path, const std::string& what) {
  return Status(StatusCode::kInvalidProgram, path + ": " + what);
}

Status check_meta(const fb::TensorMetaT* m, const std::string& path) {
  if (!m) return error(path, "missing");
  if (!dtype_is_valid(static_cast<int>(m->dtype)))
    return error(path + ".dtype", strformat("%d is not a dtype", static_cast<int>(m->dtype)));
  if (m->shape.size() > kMaxRank) return error(path + ".shape", strformat("rank %zu > %zu", m->shape.size(), kMaxRank));
  for (size_t i = 0; i < m->shape.size(); ++i) {
    const fb::DimT* d = m->shape[i].get();
    std::string dp = strformat("%s.shape[%zu]", path.c_str(), i);
    if (!d) return error(dp, "missing");
    if (d->size < -1) return error(dp + ".size", strformat("%lld is neither >= 0 nor -1 (dynamic)", (long long)d->size));
    if (d->size == -1 && (d->min < 0 || (d->max != -1 && d->max < d->min)))
      return error(dp, strformat("bounds [%lld, %lld] are invalid", (long long)d->min, (long long)d->max));
  }
  return Status::ok();
}

bool is_static(const fb::TensorMetaT& m) {
  for (const auto& d : m.shape)
    if (d->size < 0) return false;
  return true;
}

class Validator {
 public:
  explicit Validator(const fb::ProgramT& p) : p_(p) {}

  Status run() {
    SB_RETURN_IF_ERROR(check_root());
    SB_RETURN_IF_ERROR(check_named_slots());
    for (size_t c = 0; c < p_.chains.size(); ++c) SB_RETURN_IF_ERROR(check_chain(c));
    std::vector<int> state(p_.chains.size(), 0);
    SB_RETURN_IF_ERROR(check_nesting(p_.main_chain, 0, state, "main_chain"));
    if (p_.init_chain >= 0) SB_RETURN_IF_ERROR(check_nesting(static_cast<uint32_t>(p_.init_chain), 0, state, "init_chain"));
    return Status::ok();
  }

 private:
  Status check_root() {
    if (p_.version < 1 || p_.version > kSchemaVersion)
      return error("version", strformat("%u is not supported (this build reads 1..%u)", p_.version, kSchemaVersion));
    if (p_.num_tensor_slots > kMaxSlots) return error("num_tensor_slots", strformat("%u > %u", p_.num_tensor_slots, kMaxSlots));
    if (p_.num_value_slots > kMaxSlots) return error("num_value_slots", strformat("%u > %u", p_.num_value_slots, kMaxSlots));
    if (p_.tensor_meta.size() != p_.num_tensor_slots)
      return error("tensor_meta", strformat("%zu entries for %u tensor slots", p_.tensor_meta.size(), p_.num_tensor_slots));
    for (size_t i = 0; i < p_.tensor_meta.size(); ++i)
      SB_RETURN_IF_ERROR(check_meta(p_.tensor_meta[i].get(), strformat("tensor_meta[%zu]", i)));
    if (p_.chains.empty() || p_.chains.size() > kMaxChains)
      return error("chains", strformat("%zu chains (allowed 1..%zu)", p_.chains.size(), kMaxChains));
    if (p_.main_chain >= p_.chains.size())
      return error("main_chain", strformat("%u out of range (%zu chains)", p_.main_chain, p_.chains.size()));
    if (p_.init_chain < -1 || p_.init_chain >= static_cast<int64_t>(p_.chains.size()) ||
        p_.init_chain == static_cast<int64_t>(p_.main_chain))
      return error("init_chain", strformat("%d is not -1 or a chain other than main (%zu chains)", p_.init_chain,
                                           p_.chains.size()));
    roles_.assign(p_.num_tensor_slots, SlotRole::kTemp);
    return Status::ok();
  }

  Status check_tid(uint32_t tid, const std::string& path) const {
    if (tid >= p_.num_tensor_slots)
      return error(path, strformat("tensor slot %u out of range (%u slots)", tid, p_.num_tensor_slots));
    return Status::ok();
  }

  Status check_named_list(const std::vector<std::unique_ptr<fb::NamedTensorT>>& list, const char* field,
                          SlotRole role) {
    std::set<std::string> names;
    for (size_t i = 0; i < list.size(); ++i) {
      std::string path = strformat("%s[%zu]", field, i);
      const fb::NamedTensorT* e = list[i].get();
      if (!e || !e->tid) return error(path, "missing");
      if (e->name.empty()) return error(path + ".name", "empty");
      if (!names.insert(e->name).second) return error(path + ".name", "'" + e->name + "' appears twice");
      SB_RETURN_IF_ERROR(check_tid(e->tid->idx(), path + ".tid"));
      SlotRole& r = roles_[e->tid->idx()];
      if (r != SlotRole::kTemp) return error(path + ".tid", strformat("slot %u already has another role", e->tid->idx()));
      r = role;
      if (!is_static(*p_.tensor_meta[e->tid->idx()]))
        return error(path, "'" + e->name + "' must have a static shape, has " +
                               dims_str(p_.tensor_meta[e->tid->idx()]->shape));
    }
    return Status::ok();
  }

  Status check_io(const std::vector<std::unique_ptr<fb::IoSlotT>>& list, const char* field, bool is_input) {
    std::set<std::string> names;
    for (size_t i = 0; i < list.size(); ++i) {
      std::string path = strformat("%s[%zu]", field, i);
      const fb::IoSlotT* e = list[i].get();
      if (!e) return error(path, "missing");
      if (e->name.empty()) return error(path + ".name", "empty");
      if (!names.insert(e->name).second) return error(path + ".name", "'" + e->name + "' appears twice");
      if (e->kind == fb::SlotKind::Tensor) {
        SB_RETURN_IF_ERROR(check_tid(e->idx, path + ".idx"));
        if (is_input) {
          if (roles_[e->idx] != SlotRole::kTemp)
            return error(path + ".idx", strformat("tensor slot %u is already a constant, buffer or input", e->idx));
          roles_[e->idx] = SlotRole::kInput;
        }
      } else if (e->kind == fb::SlotKind::Value) {
        if (e->idx >= p_.num_value_slots)
          return error(path + ".idx", strformat("value slot %u out of range (%u slots)", e->idx, p_.num_value_slots));
        if (is_input) value_inputs_.insert(e->idx);
      } else {
        return error(path + ".kind", strformat("%d is not a slot kind", static_cast<int>(e->kind)));
      }
    }
    return Status::ok();
  }

  Status check_named_slots() {
    SB_RETURN_IF_ERROR(check_named_list(p_.constants, "constants", SlotRole::kConstant));
    SB_RETURN_IF_ERROR(check_named_list(p_.mutable_buffers, "mutable_buffers", SlotRole::kMutable));
    SB_RETURN_IF_ERROR(check_io(p_.inputs, "inputs", true));
    SB_RETURN_IF_ERROR(check_io(p_.outputs, "outputs", false));
    std::set<std::string> names;
    for (size_t i = 0; i < p_.attributes.size(); ++i) {
      if (!p_.attributes[i] || p_.attributes[i]->name.empty() || !names.insert(p_.attributes[i]->name).second)
        return error(strformat("attributes[%zu].name", i), "missing, empty or repeated");
    }
    return Status::ok();
  }

  const fb::TensorMetaT& meta(const fb::Tid* t) const { return *p_.tensor_meta[t->idx()]; }

  Status check_slot(const SlotRef& ref, const std::string& path) const {
    std::string fp = path + "." + ref.field + (ref.element >= 0 ? strformat("[%d]", ref.element) : "");
    if (!ref.idx) return error(fp, "missing");
    if (!ref.is_tensor) {
      if (*ref.idx >= p_.num_value_slots)
        return error(fp, strformat("value slot %u out of range (%u slots)", *ref.idx, p_.num_value_slots));
      if (ref.is_write && value_inputs_.count(*ref.idx))
        return error(fp, strformat("writes value slot %u, which is a program input", *ref.idx));
      return Status::ok();
    }
    SB_RETURN_IF_ERROR(check_tid(*ref.idx, fp));
    SlotRole r = roles_[*ref.idx];
    if (ref.is_write && (r == SlotRole::kConstant || r == SlotRole::kInput))
      return error(fp, strformat("writes tensor slot %u, which is a %s", *ref.idx,
                                 r == SlotRole::kConstant ? "constant" : "program input"));
    return Status::ok();
  }

  Status check_chain(size_t c) {
    const fb::ChainT* chain = p_.chains[c].get();
    std::string cp = strformat("chains[%zu]", c);
    if (!chain) return error(cp, "missing");
    for (size_t i = 0; i < chain->instructions.size(); ++i) {
      std::string path = strformat("%s.instructions[%zu]", cp.c_str(), i);
      fb::InstructionT* ins = chain->instructions[i].get();
      if (!ins || ins->op.type == fb::OpNode::NONE || ins->op.value == nullptr)
        return error(path, strformat("unknown op type %d (written by a newer schema?)",
                                     ins ? static_cast<int>(ins->op.type) : -1));
      path += std::string(".") + op_name(ins->op.type);
      Status st;
      for_each_slot(ins->op, [&](const SlotRef& ref) {
        if (st.is_ok()) st = check_slot(ref, path);
      });
      SB_RETURN_IF_ERROR(st);
      SB_RETURN_IF_ERROR(check_op(ins->op, c, path));
    }
    return Status::ok();
  }

  // Chains reachable through If nodes must form a tree-like DAG of bounded depth.
  Status check_nesting(uint32_t c, uint32_t depth, std::vector<int>& state, const std::string& path) {
    if (depth > kMaxIfDepth) return error(path, strformat("If nesting deeper than %u", kMaxIfDepth));
    if (state[c] == 1) return error(path, strformat("chain %u is reached from itself (If cycle)", c));
    if (state[c] == 2) return Status::ok();
    state[c] = 1;
    const auto& ins = p_.chains[c]->instructions;
    for (size_t i = 0; i < ins.size(); ++i) {
      if (ins[i]->op.type != fb::OpNode::IfNode) continue;
      const fb::IfNodeT* n = ins[i]->op.AsIfNode();
      std::string ip = strformat("chains[%u].instructions[%zu].If", c, i);
      SB_RETURN_IF_ERROR(check_nesting(n->then_chain, depth + 1, state, ip + ".then_chain"));
      SB_RETURN_IF_ERROR(check_nesting(n->else_chain, depth + 1, state, ip + ".else_chain"));
    }
    state[c] = 2;
    return Status::ok();
  }

  Status check_op(const fb::OpNodeUnion& op, size_t chain, const std::string& path) const;

  const fb::ProgramT& p_;
  std::vector<SlotRole> roles_;
  std::set<uint32_t> value_inputs_;
};

template <class E>
bool enum_ok(E v, E max) {
  return static_cast<int>(v) >= 0 && static_cast<int>(v) <= static_cast<int>(max);
}

// Host ops are the validator's own; every device op's rules are ops::check_op_rules.
Status Validator::check_op(const fb::OpNodeUnion& op, size_t chain, const std::string& path) const {
  switch (op.type) {
    case fb::OpNode::SymSizeNode: {
      const auto* n = op.AsSymSizeNode();
      return ops::check_axis(n->axis, meta(n->x.get()).shape.size(), path);
    }
    case fb::OpNode::IntArithNode: {
      const auto* n = op.AsIntArithNode();
      if (!enum_ok(n->op, fb::IntOp::MAX)) return error(path + ".op", strformat("%d unknown", (int)n->op));
      return Status::ok();
    }
    case fb::OpNode::IfNode: {
      const auto* n = op.AsIfNode();
      for (auto [idx, field] : {std::pair{n->then_chain, ".then_chain"}, std::pair{n->else_chain, ".else_chain"}}) {
        if (idx >= p_.chains.size())
          return error(path + field, strformat("%u out of range (%zu chains)", idx, p_.chains.size()));
        if (idx == chain) return error(path + field, strformat("%u is the chain holding this If (cycle)", idx));
      }
      return Status::ok();
    }
    case fb::OpNode::NONE: return error(path, "unknown op");
    default: {
      const ops::SlotDecls decls = [this](const fb::Tid* t) {
        ops::SlotDecl d{static_cast<DType>(meta(t).dtype), {}};
        for (const auto& dim : meta(t).shape) d.dims.push_back(dim->size);
        return d;
      };
      return ops::check_op_rules(op, decls, path);
    }
  }
}

}  // namespace

Status validate_program(const fb::ProgramT& p) { return Validator(p).run(); }

}  // namespace switchboard
