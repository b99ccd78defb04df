// Semantic validation of a verified program. The FlatBuffer verifier only
// proves the bytes are in bounds; this proves every id, index, dtype, shape and
// name is meaningful, so the interpreter can trust them. Every error names the
// path into the file, e.g. "chains[2].instructions[7].Binary.a: ...".
#include <set>
#include <string>

#include "op_info.h"
#include "program_impl.h"

namespace switchboard {
namespace {

constexpr uint32_t kMaxSlots = 1u << 24;
constexpr size_t kMaxChains = 1u << 16;
constexpr size_t kMaxRank = 8;

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

  Status check_axis(int32_t axis, size_t rank, const std::string& path, bool allow_end = false) const {
    int64_t r = static_cast<int64_t>(rank) + (allow_end ? 1 : 0);
    if (axis < -r || axis >= r) return error(path + ".axis", strformat("%d out of range for rank %zu", axis, rank));
    return Status::ok();
  }

  Status same_dtype(const fb::Tid* a, const fb::Tid* b, const std::string& path, const char* fa, const char* fb_) const {
    if (meta(a).dtype != meta(b).dtype)
      return error(path, strformat("dtype of %s (%s) differs from %s (%s)", fa, dtype_name(static_cast<DType>(meta(a).dtype)),
                                   fb_, dtype_name(static_cast<DType>(meta(b).dtype))));
    return Status::ok();
  }

  bool is_float(const fb::Tid* t) const { return dtype_is_float(static_cast<DType>(meta(t).dtype)); }

  Status check_op(const fb::OpNodeUnion& op, size_t chain, const std::string& path) const;

  const fb::ProgramT& p_;
  std::vector<SlotRole> roles_;
  std::set<uint32_t> value_inputs_;
};

template <class E>
bool enum_ok(E v, E max) {
  return static_cast<int>(v) >= 0 && static_cast<int>(v) <= static_cast<int>(max);
}

Status Validator::check_op(const fb::OpNodeUnion& op, size_t chain, const std::string& path) const {
  switch (op.type) {
    case fb::OpNode::BinaryNode: {
      const auto* n = op.AsBinaryNode();
      if (!enum_ok(n->op, fb::BinaryOp::MAX)) return error(path + ".op", strformat("%d unknown", (int)n->op));
      SB_RETURN_IF_ERROR(same_dtype(n->a.get(), n->b.get(), path, "a", "b"));
      SB_RETURN_IF_ERROR(same_dtype(n->a.get(), n->out.get(), path, "a", "out"));
      DType t = static_cast<DType>(meta(n->a.get()).dtype);
      if (!dtype_is_float(t) && t != DType::kI32 && t != DType::kI64)
        return error(path + ".a", strformat("dtype %s is not supported (float, i32, i64)", dtype_name(t)));
      if (n->op == fb::BinaryOp::Div && !dtype_is_float(t))
        return error(path + ".op", "Div needs a float dtype");
      return Status::ok();
    }
    case fb::OpNode::UnaryNode: {
      const auto* n = op.AsUnaryNode();
      if (!enum_ok(n->op, fb::UnaryOp::MAX)) return error(path + ".op", strformat("%d unknown", (int)n->op));
      return same_dtype(n->x.get(), n->out.get(), path, "x", "out");
    }
    case fb::OpNode::CastNode: {
      const auto* n = op.AsCastNode();
      if (!dtype_is_valid(static_cast<int>(n->dtype))) return error(path + ".dtype", strformat("%d unknown", (int)n->dtype));
      if (meta(n->out.get()).dtype != n->dtype) return error(path + ".out", "dtype differs from the cast's dtype");
      return Status::ok();
    }
    case fb::OpNode::ReshapeNode: {
      const auto* n = op.AsReshapeNode();
      if (n->shape.size() > kMaxRank) return error(path + ".shape", strformat("rank %zu > %zu", n->shape.size(), kMaxRank));
      for (size_t i = 0; i < n->shape.size(); ++i)
        if (!n->shape[i]) return error(strformat("%s.shape[%zu]", path.c_str(), i), "missing");
      return same_dtype(n->x.get(), n->out.get(), path, "x", "out");
    }
    case fb::OpNode::SliceNode: {
      const auto* n = op.AsSliceNode();
      SB_RETURN_IF_ERROR(check_axis(n->axis, meta(n->x.get()).shape.size(), path));
      return same_dtype(n->x.get(), n->out.get(), path, "x", "out");
    }
    case fb::OpNode::ConcatNode: {
      const auto* n = op.AsConcatNode();
      if (n->inputs.empty()) return error(path + ".inputs", "empty");
      size_t rank = meta(&n->inputs[0]).shape.size();
      SB_RETURN_IF_ERROR(check_axis(n->axis, rank, path));
      for (const auto& t : n->inputs) {
        SB_RETURN_IF_ERROR(same_dtype(&t, n->out.get(), path, "inputs", "out"));
        if (meta(&t).shape.size() != rank) return error(path + ".inputs", "inputs differ in rank");
      }
      return Status::ok();
    }
    case fb::OpNode::MatmulNode: {
      const auto* n = op.AsMatmulNode();
      if (!is_float(n->a.get())) return error(path + ".a", "Matmul needs a float dtype");
      SB_RETURN_IF_ERROR(same_dtype(n->a.get(), n->b.get(), path, "a", "b"));
      SB_RETURN_IF_ERROR(same_dtype(n->a.get(), n->out.get(), path, "a", "out"));
      if (meta(n->b.get()).shape.size() != 2) return error(path + ".b", "must have rank 2");
      if (meta(n->a.get()).shape.empty()) return error(path + ".a", "must have rank >= 1");
      if (n->bias) {
        SB_RETURN_IF_ERROR(same_dtype(n->a.get(), n->bias.get(), path, "a", "bias"));
        if (meta(n->bias.get()).shape.size() != 1) return error(path + ".bias", "must have rank 1");
      }
      return Status::ok();
    }
    case fb::OpNode::ReduceNode: {
      const auto* n = op.AsReduceNode();
      if (!enum_ok(n->op, fb::ReduceOp::MAX)) return error(path + ".op", strformat("%d unknown", (int)n->op));
      if (!is_float(n->x.get())) return error(path + ".x", "Reduce needs a float dtype");
      SB_RETURN_IF_ERROR(check_axis(n->axis, meta(n->x.get()).shape.size(), path));
      return same_dtype(n->x.get(), n->out.get(), path, "x", "out");
    }
    case fb::OpNode::ArgmaxNode: {
      const auto* n = op.AsArgmaxNode();
      SB_RETURN_IF_ERROR(check_axis(n->axis, meta(n->x.get()).shape.size(), path));
      if (meta(n->out.get()).dtype != fb::DType::I32) return error(path + ".out", "dtype must be i32");
      return Status::ok();
    }
    case fb::OpNode::CopyNode: {
      const auto* n = op.AsCopyNode();
      return same_dtype(n->x.get(), n->out.get(), path, "x", "out");
    }
    case fb::OpNode::SliceUpdateNode: {
      const auto* n = op.AsSliceUpdateNode();
      SB_RETURN_IF_ERROR(check_axis(n->axis, meta(n->dst.get()).shape.size(), path));
      if (meta(n->dst.get()).shape.size() != meta(n->update.get()).shape.size())
        return error(path + ".update", "rank differs from dst");
      return same_dtype(n->dst.get(), n->update.get(), path, "dst", "update");
    }
    case fb::OpNode::SymSizeNode: {
      const auto* n = op.AsSymSizeNode();
      return check_axis(n->axis, meta(n->x.get()).shape.size(), path);
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
    case fb::OpNode::NONE: break;
  }
  return error(path, "unknown op");
}

}  // namespace

Status validate_program(const fb::ProgramT& p) { return Validator(p).run(); }

}  // namespace switchboard
