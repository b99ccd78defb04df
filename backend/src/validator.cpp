// Semantic validation of a verified program. The FlatBuffer verifier only
// proves the bytes are in bounds; this proves every id, index, dtype, shape and
// name is meaningful, so the interpreter can trust them. Every error names the
// path into the file, e.g. "chains[2].instructions[7].Binary.a: ...".
#include <algorithm>
#include <set>
#include <string>

#include "op_info.h"
#include "program_impl.h"
#include "quantize.h"

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
  Status check_moe_op(const fb::OpNodeUnion& op, const std::string& path) const;
  Status check_gather_qmm(const fb::GatherQmmNodeT& n, const std::string& path) const;
  Status check_router(const fb::RouterNodeT& n, const std::string& path) const;

  size_t rank(const fb::Tid* t) const { return meta(t).shape.size(); }
  // A static dim's size, or -1 when dynamic.
  int64_t dim(const fb::Tid* t, size_t i) const { return meta(t).shape[i]->size; }
  DType dt(const fb::Tid* t) const { return static_cast<DType>(meta(t).dtype); }
  Status expect(bool ok, const std::string& path, const std::string& what) const {
    return ok ? Status::ok() : error(path, what);
  }
  Status index_vector(const fb::Tid* t, const std::string& path) const {
    if (!t) return Status::ok();
    return expect(dt(t) == DType::kI32 && rank(t) == 1, path, "must be a 1-D i32 tensor");
  }

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
      if (n->op == fb::BinaryOp::FloorDiv && dtype_is_float(t))
        return error(path + ".op", "FloorDiv needs an integer dtype");
      return Status::ok();
    }
    case fb::OpNode::UnaryNode: {
      const auto* n = op.AsUnaryNode();
      if (!enum_ok(n->op, fb::UnaryOp::MAX)) return error(path + ".op", strformat("%d unknown", (int)n->op));
      if (n->op >= fb::UnaryOp::Exp && !dtype_is_float(dt(n->x.get())))
        return error(path + ".x", strformat("%s needs a float dtype", fb::EnumNameUnaryOp(n->op)));
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
    case fb::OpNode::BatchMatmulNode: {
      const auto* n = op.AsBatchMatmulNode();
      if (!is_float(n->a.get())) return error(path + ".a", "BatchMatmul needs a float dtype");
      SB_RETURN_IF_ERROR(same_dtype(n->a.get(), n->b.get(), path, "a", "b"));
      SB_RETURN_IF_ERROR(same_dtype(n->a.get(), n->out.get(), path, "a", "out"));
      if (meta(n->a.get()).shape.size() != 3) return error(path + ".a", "must have rank 3");
      if (meta(n->b.get()).shape.size() != 3) return error(path + ".b", "must have rank 3");
      return Status::ok();
    }
    case fb::OpNode::TransposeNode: {
      const auto* n = op.AsTransposeNode();
      SB_RETURN_IF_ERROR(same_dtype(n->x.get(), n->out.get(), path, "x", "out"));
      const size_t r = rank(n->x.get());
      if (n->perm.size() != r)
        return error(path + ".perm", strformat("has %zu entries for x of rank %zu", n->perm.size(), r));
      if (rank(n->out.get()) != r) return error(path + ".out", strformat("must have rank %zu", r));
      std::vector<bool> seen(r, false);
      for (size_t a = 0; a < r; ++a) {
        const int32_t p = n->perm[a];
        if (p < 0 || static_cast<size_t>(p) >= r || seen[static_cast<size_t>(p)])
          return error(strformat("%s.perm[%zu]", path.c_str(), a), strformat("%d is not a permutation entry", p));
        seen[static_cast<size_t>(p)] = true;
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
    default: return check_moe_op(op, path);
  }
  return error(path, "unknown op");
}

Status Validator::check_gather_qmm(const fb::GatherQmmNodeT& n, const std::string& path) const {
  SB_RETURN_IF_ERROR(expect(rank(n.x.get()) == 2 && dtype_is_float(dt(n.x.get())), path + ".x", "must be a 2-D float tensor"));
  const int64_t k = dim(n.x.get(), 1);
  SB_RETURN_IF_ERROR(expect(k > 0 && k % 32 == 0, path + ".x", "K must be static and a multiple of 32"));
  SB_RETURN_IF_ERROR(expect(quant_group_allowed(n.group_size), path + ".group_size",
                            strformat("%d not in {32, 64, 128}", n.group_size)));
  SB_RETURN_IF_ERROR(expect(k % n.group_size == 0, path + ".group_size", "does not divide K"));
  const fb::Tid *sc = n.scales.get(), *bi = n.biases.get();
  SB_RETURN_IF_ERROR(expect(rank(sc) == 3 && dtype_is_float(dt(sc)), path + ".scales", "must be a 3-D float tensor"));
  SB_RETURN_IF_ERROR(expect(meta(sc).dtype == meta(bi).dtype && rank(bi) == 3, path + ".biases",
                            "must match scales' dtype and rank"));
  const int64_t e = dim(sc, 0), nn = dim(sc, 1), g = dim(sc, 2);
  SB_RETURN_IF_ERROR(expect(e > 0 && nn > 0 && g == k / n.group_size, path + ".scales",
                            "must be [E, N, K/group_size] with static dims"));
  for (size_t i = 0; i < 3; ++i)
    SB_RETURN_IF_ERROR(expect(dim(bi, i) == dim(sc, i), path + ".biases", "shape differs from scales"));
  SB_RETURN_IF_ERROR(expect(dt(n.w.get()) == DType::kU32, path + ".w", "must be u32"));
  if (n.expert_bits.empty()) {
    SB_RETURN_IF_ERROR(expect(quant_bits_allowed(n.bits), path + ".bits", strformat("%d not in {2,3,4,5,6,8}", n.bits)));
    SB_RETURN_IF_ERROR(expect(rank(n.w.get()) == 3 && dim(n.w.get(), 0) == e && dim(n.w.get(), 1) == nn &&
                                  dim(n.w.get(), 2) == k * n.bits / 32,
                              path + ".w", strformat("must be [%lld, %lld, %lld] for %d-bit codes", (long long)e,
                                                     (long long)nn, (long long)(k * n.bits / 32), n.bits)));
  } else {
    SB_RETURN_IF_ERROR(expect(static_cast<int64_t>(n.expert_bits.size()) == e, path + ".expert_bits",
                              strformat("%zu entries for %lld experts", n.expert_bits.size(), (long long)e)));
    int64_t words = 0;
    for (size_t i = 0; i < n.expert_bits.size(); ++i) {
      int b = n.expert_bits[i];
      SB_RETURN_IF_ERROR(expect(b == 0 || quant_bits_allowed(b), strformat("%s.expert_bits[%zu]", path.c_str(), i),
                                strformat("%d not in {0,2,3,4,5,6,8}", b)));
      words += nn * k * b / 32;
    }
    SB_RETURN_IF_ERROR(expect(rank(n.w.get()) == 1 && dim(n.w.get(), 0) == words, path + ".w",
                              strformat("must be [%lld]: the experts' packed blocks back to back", (long long)words)));
  }
  SB_RETURN_IF_ERROR(index_vector(n.lhs_indices.get(), path + ".lhs_indices"));
  SB_RETURN_IF_ERROR(index_vector(n.rhs_indices.get(), path + ".rhs_indices"));
  SB_RETURN_IF_ERROR(expect(dt(n.out.get()) == dt(n.x.get()) && rank(n.out.get()) == 2, path + ".out",
                            "must be 2-D with x's dtype"));
  if (n.combine_weights) {
    SB_RETURN_IF_ERROR(expect(dt(n.combine_weights.get()) == DType::kF32 && rank(n.combine_weights.get()) == 2,
                              path + ".combine_weights", "must be a 2-D f32 tensor"));
    SB_RETURN_IF_ERROR(expect(!n.lhs_indices, path + ".lhs_indices", "must be absent with combine_weights"));
  } else {
    SB_RETURN_IF_ERROR(expect(!n.shared && !n.shared_gate, path + ".shared", "needs combine_weights"));
  }
  if (n.shared) SB_RETURN_IF_ERROR(expect(dt(n.shared.get()) == dt(n.out.get()) && rank(n.shared.get()) == 2,
                                          path + ".shared", "must be 2-D with out's dtype"));
  if (n.shared_gate) SB_RETURN_IF_ERROR(expect(n.shared && dtype_is_float(dt(n.shared_gate.get())) &&
                                                   rank(n.shared_gate.get()) == 2,
                                               path + ".shared_gate", "must be [T, 1] float and needs shared"));
  return Status::ok();
}

Status Validator::check_router(const fb::RouterNodeT& n, const std::string& path) const {
  SB_RETURN_IF_ERROR(expect(enum_ok(n.kind, fb::RouterKind::MAX), path + ".kind", strformat("%d unknown", (int)n.kind)));
  SB_RETURN_IF_ERROR(expect(rank(n.logits.get()) == 2 && dtype_is_float(dt(n.logits.get())), path + ".logits",
                            "must be a 2-D float tensor"));
  const int64_t e = dim(n.logits.get(), 1);
  SB_RETURN_IF_ERROR(expect(e > 0, path + ".logits", "expert count (last dim) must be static"));
  std::set<int32_t> pruned;
  for (size_t i = 0; i < n.pruned_experts.size(); ++i) {
    int32_t p = n.pruned_experts[i];
    SB_RETURN_IF_ERROR(expect(p >= 0 && p < e, strformat("%s.pruned_experts[%zu]", path.c_str(), i),
                              strformat("%d out of range (%lld experts)", p, (long long)e)));
    pruned.insert(p);
  }
  const int64_t live = e - static_cast<int64_t>(pruned.size());
  SB_RETURN_IF_ERROR(expect(n.k >= 1 && n.k <= live, path + ".k",
                            strformat("%d not in [1, %lld] (%lld experts, %zu pruned)", n.k, (long long)live,
                                      (long long)e, pruned.size())));
  if (n.kind == fb::RouterKind::SigmoidGroupedTopK) {
    SB_RETURN_IF_ERROR(expect(n.n_group >= 1 && e % n.n_group == 0, path + ".n_group",
                              strformat("%d does not divide %lld experts", n.n_group, (long long)e)));
    SB_RETURN_IF_ERROR(expect(n.topk_group >= 1 && n.topk_group <= n.n_group, path + ".topk_group",
                              strformat("%d not in [1, n_group = %d]", n.topk_group, n.n_group)));
    SB_RETURN_IF_ERROR(expect(n.n_group == 1 || e / n.n_group >= 2, path + ".n_group", "groups need >= 2 experts"));
    // Whichever groups win, they must hold k live experts: check the worst choice.
    std::vector<int64_t> live_per_group(static_cast<size_t>(n.n_group), e / n.n_group);
    for (int32_t p : pruned) --live_per_group[static_cast<size_t>(p / (e / n.n_group))];
    std::sort(live_per_group.begin(), live_per_group.end());
    int64_t worst = 0;
    for (int g = 0; g < n.topk_group; ++g) worst += live_per_group[static_cast<size_t>(g)];
    SB_RETURN_IF_ERROR(expect(worst >= n.k, path + ".topk_group",
                              strformat("%d kept groups may hold only %lld live experts, fewer than k = %d",
                                        n.topk_group, (long long)worst, n.k)));
  } else {
    SB_RETURN_IF_ERROR(expect(!n.selection_bias, path + ".selection_bias", "only SigmoidGroupedTopK uses it"));
  }
  for (const fb::Tid* t : {n.selection_bias.get(), n.expert_scale.get()})
    if (t) SB_RETURN_IF_ERROR(expect(dt(t) == DType::kF32 && rank(t) == 1 && dim(t, 0) == e, path,
                                     "selection_bias / expert_scale must be [E] f32"));
  SB_RETURN_IF_ERROR(expect(dt(n.weights.get()) == DType::kF32 && rank(n.weights.get()) == 2, path + ".weights",
                            "must be a 2-D f32 tensor"));
  return expect(dt(n.indices.get()) == DType::kI32 && rank(n.indices.get()) == 2, path + ".indices",
                "must be a 2-D i32 tensor");
}

Status Validator::check_moe_op(const fb::OpNodeUnion& op, const std::string& path) const {
  switch (op.type) {
    case fb::OpNode::GatherQmmNode: return check_gather_qmm(*op.AsGatherQmmNode(), path);
    case fb::OpNode::GatherMmNode: {
      const auto& n = *op.AsGatherMmNode();
      SB_RETURN_IF_ERROR(expect(rank(n.x.get()) == 2 && dtype_is_float(dt(n.x.get())), path + ".x", "must be 2-D float"));
      SB_RETURN_IF_ERROR(expect(rank(n.w.get()) == 3 && dt(n.w.get()) == dt(n.x.get()), path + ".w",
                                "must be [E, N, K] with x's dtype"));
      SB_RETURN_IF_ERROR(index_vector(n.lhs_indices.get(), path + ".lhs_indices"));
      SB_RETURN_IF_ERROR(index_vector(n.rhs_indices.get(), path + ".rhs_indices"));
      return expect(dt(n.out.get()) == dt(n.x.get()) && rank(n.out.get()) == 2, path + ".out", "must be 2-D, x's dtype");
    }
    case fb::OpNode::RouterNode: return check_router(*op.AsRouterNode(), path);
    case fb::OpNode::ArgsortNode: {
      const auto& n = *op.AsArgsortNode();
      SB_RETURN_IF_ERROR(index_vector(n.x.get(), path + ".x"));
      return index_vector(n.out.get(), path + ".out");
    }
    case fb::OpNode::GatherRowsNode:
    case fb::OpNode::ScatterRowsNode: {
      const fb::Tid *x = op.type == fb::OpNode::GatherRowsNode ? op.AsGatherRowsNode()->x.get() : op.AsScatterRowsNode()->x.get();
      const fb::Tid *idx = op.type == fb::OpNode::GatherRowsNode ? op.AsGatherRowsNode()->indices.get()
                                                                 : op.AsScatterRowsNode()->indices.get();
      const fb::Tid *out = op.type == fb::OpNode::GatherRowsNode ? op.AsGatherRowsNode()->out.get()
                                                                 : op.AsScatterRowsNode()->out.get();
      SB_RETURN_IF_ERROR(index_vector(idx, path + ".indices"));
      SB_RETURN_IF_ERROR(expect(rank(x) >= 1, path + ".x", "must have rank >= 1"));
      return same_dtype(x, out, path, "x", "out");
    }
    case fb::OpNode::GluNode: {
      const auto& n = *op.AsGluNode();
      SB_RETURN_IF_ERROR(expect(enum_ok(n.kind, fb::GluKind::MAX), path + ".kind", strformat("%d unknown", (int)n.kind)));
      SB_RETURN_IF_ERROR(expect(dtype_is_float(dt(n.gate.get())), path + ".gate", "must be float"));
      SB_RETURN_IF_ERROR(same_dtype(n.gate.get(), n.up.get(), path, "gate", "up"));
      return same_dtype(n.gate.get(), n.out.get(), path, "gate", "out");
    }
    case fb::OpNode::FullNode: {
      const auto& n = *op.AsFullNode();
      SB_RETURN_IF_ERROR(expect(dtype_is_valid(static_cast<int>(n.dtype)), path + ".dtype", "unknown dtype"));
      SB_RETURN_IF_ERROR(expect(n.shape.size() <= kMaxRank, path + ".shape", "rank too large"));
      for (size_t i = 0; i < n.shape.size(); ++i)
        if (!n.shape[i]) return error(strformat("%s.shape[%zu]", path.c_str(), i), "missing");
      return expect(meta(n.out.get()).dtype == n.dtype, path + ".out", "dtype differs from the fill dtype");
    }
    case fb::OpNode::CombineNode: {
      const auto& n = *op.AsCombineNode();
      SB_RETURN_IF_ERROR(expect(dtype_is_float(dt(n.y.get())) && rank(n.y.get()) == 2, path + ".y", "must be 2-D float"));
      SB_RETURN_IF_ERROR(expect(dt(n.weights.get()) == DType::kF32 && rank(n.weights.get()) == 2, path + ".weights",
                                "must be a 2-D f32 tensor"));
      if (n.shared) SB_RETURN_IF_ERROR(same_dtype(n.y.get(), n.shared.get(), path, "y", "shared"));
      if (n.shared_gate)
        SB_RETURN_IF_ERROR(expect(n.shared && dtype_is_float(dt(n.shared_gate.get())), path + ".shared_gate",
                                  "must be float and needs shared"));
      return same_dtype(n.y.get(), n.out.get(), path, "y", "out");
    }
    case fb::OpNode::SoftmaxNode: {
      const auto& n = *op.AsSoftmaxNode();
      SB_RETURN_IF_ERROR(expect(dtype_is_float(dt(n.x.get())) && rank(n.x.get()) >= 1, path + ".x",
                                "must be a float tensor of rank >= 1"));
      return same_dtype(n.x.get(), n.out.get(), path, "x", "out");
    }
    case fb::OpNode::RmsNormNode: {
      const auto& n = *op.AsRmsNormNode();
      SB_RETURN_IF_ERROR(expect(dtype_is_float(dt(n.x.get())) && rank(n.x.get()) >= 1, path + ".x",
                                "must be a float tensor of rank >= 1"));
      SB_RETURN_IF_ERROR(expect(rank(n.weight.get()) == 1, path + ".weight", "must be 1-D"));
      SB_RETURN_IF_ERROR(same_dtype(n.x.get(), n.weight.get(), path, "x", "weight"));
      return same_dtype(n.x.get(), n.out.get(), path, "x", "out");
    }
    default: break;
  }
  return error(path, "unknown op");
}

}  // namespace

Status validate_program(const fb::ProgramT& p) { return Validator(p).run(); }

}  // namespace switchboard
