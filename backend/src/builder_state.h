// Internal state of ProgramBuilder, shared by its implementation files.
#pragma once

#include <algorithm>
#include <map>
#include <optional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "dim_rules.h"
#include "op_info.h"
#include "op_rules.h"
#include "program_impl.h"
#include "switchboard/builder.h"

namespace switchboard {
namespace builder_detail {
constexpr int kNoChain = -1;
constexpr uint32_t kNone = UINT32_MAX;

struct BSlot {
  SlotRole role = SlotRole::kTemp;
  DType dtype = DType::kF32;
  std::vector<Dim> shape;
  std::string name;           // constants and mutable buffers
  int64_t temp_id = -1;       // temps: recycled physical id
  int64_t scope = -1;         // owning scope level, -1: never released
  uint32_t alias = kNone;     // If results from the else branch share the then slot
  bool released = false;
  int writer_chain = kNoChain;  // chain of the last instruction that wrote it
};
}  // namespace builder_detail

using builder_detail::BSlot;
using builder_detail::kNoChain;
using builder_detail::kNone;

struct BuilderState {
  Status status;
  std::vector<BSlot> slots;
  uint32_t num_values = 0;
  std::vector<std::unique_ptr<fb::ChainT>> chains;
  int current = 0;
  int init_chain = -1;
  std::vector<std::vector<uint32_t>> scopes;              // temps owned by each open scope
  std::map<std::pair<int, size_t>, std::vector<int64_t>> free_temps;  // (dtype, rank) -> ids
  int64_t next_temp = 0;
  std::vector<std::vector<Dim>> temp_shapes;  // by physical temp id: the shape its slots share
  std::vector<std::pair<std::string, TensorRef>> outputs;
  std::vector<std::pair<std::string, uint32_t>> value_inputs, value_outputs;
  std::vector<std::pair<std::string, int64_t>> attributes;
  std::set<std::string> io_names;

  bool fail(const std::string& msg) {
    if (status.is_ok()) status = Status(StatusCode::kInvalidArgument, "builder: " + msg);
    return false;
  }
  bool ok(TensorRef t, const char* op) {
    if (!status.is_ok()) return false;
    if (!t.valid() || t.id >= slots.size()) return fail(std::string(op) + ": invalid tensor ref");
    if (slots[t.id].released) return fail(strformat("%s: tensor %u used after its tmp_scope ended", op, t.id));
    return true;
  }
  uint32_t resolve(uint32_t id) const {
    while (slots[id].alias != kNone) id = slots[id].alias;
    return id;
  }
  TensorRef new_slot(SlotRole role, DType dtype, std::vector<Dim> shape) {
    BSlot s;
    s.role = role;
    s.dtype = dtype;
    s.shape = std::move(shape);
    if (role == SlotRole::kTemp) {
      // Reuse a free physical id only when its shape agrees dim for dim (static and equal,
      // or both dynamic): sharing merges shapes, and a merged static dim would turn dynamic.
      auto& pool = free_temps[{static_cast<int>(dtype), s.shape.size()}];
      auto same = [&](int64_t id) {
        const std::vector<Dim>& t = temp_shapes[static_cast<size_t>(id)];
        for (size_t k = 0; k < t.size(); ++k)
          if (t[k].is_static() != s.shape[k].is_static() || (t[k].is_static() && t[k].size != s.shape[k].size))
            return false;
        return true;
      };
      auto it = std::find_if(pool.rbegin(), pool.rend(), same);
      if (it == pool.rend()) {
        s.temp_id = next_temp++;
        temp_shapes.push_back(s.shape);
      } else {
        s.temp_id = *it;
        pool.erase(std::next(it).base());
      }
      if (!scopes.empty()) {
        s.scope = static_cast<int64_t>(scopes.size()) - 1;
        scopes.back().push_back(static_cast<uint32_t>(slots.size()));
      }
    }
    slots.push_back(std::move(s));
    return TensorRef{static_cast<uint32_t>(slots.size() - 1)};
  }
  void release(uint32_t id) {
    BSlot& s = slots[id];
    if (s.released || s.alias != kNone) return;
    s.released = true;
    free_temps[{static_cast<int>(s.dtype), s.shape.size()}].push_back(s.temp_id);
  }
  fb::InstructionT& emit(fb::OpNodeUnion op) {
    auto ins = std::make_unique<fb::InstructionT>();
    ins->op = std::move(op);
    for_each_slot(ins->op, [&](const SlotRef& r) {
      if (r.is_tensor && r.is_write && r.idx && *r.idx < slots.size()) slots[*r.idx].writer_chain = current;
    });
    check_rules(ins->op);
    chains[current]->instructions.push_back(std::move(ins));
    return *chains[current]->instructions.back();
  }
  // An op's output shape from its shared rule (ops/dim_rules.h), or none after failing
  // with the rule's words.
  std::optional<std::vector<Dim>> shape_rule(const char* op, Result<std::vector<Dim>> dims) {
    if (dims.is_ok()) return std::move(dims).value();
    fail(std::string(op) + ": " + dims.status().message());
    return std::nullopt;
  }
  // The op family's declared-operand rules (ops::check_op_rules), the ones the loader
  // applies: a program the builder writes is one the loader accepts.
  void check_rules(fb::OpNodeUnion& op) {
    const fb::OpNode t = op.type;
    if (!status.is_ok() || t == fb::OpNode::SymSizeNode || t == fb::OpNode::IntArithNode || t == fb::OpNode::IfNode)
      return;
    bool ids_ok = true;
    for_each_slot(op, [&](const SlotRef& r) { ids_ok &= !r.is_tensor || !r.idx || *r.idx < slots.size(); });
    if (!ids_ok) return;  // the op's own method failed first
    const ops::SlotDecls decls = [this](const fb::Tid* tid) {
      const BSlot& s = slots[tid->idx()];
      ops::SlotDecl d{s.dtype, {}};
      for (const Dim& dim : s.shape) d.dims.push_back(dim.is_static() ? dim.size : -1);
      return d;
    };
    Status st = ops::check_op_rules(op, decls, op_name(t));
    if (!st.is_ok()) fail(st.message());
  }
};

namespace builder_detail {


inline std::unique_ptr<fb::Tid> tid(TensorRef t) { return std::make_unique<fb::Tid>(t.id); }

// Every given operand usable by `op` (absent ones skipped: optional) and no earlier failure;
// required_ok: every operand must be given.
inline bool all_ok(BuilderState& s, std::initializer_list<TensorRef> ts, const char* op) {
  for (TensorRef t : ts)
    if (t.valid() && !s.ok(t, op)) return false;
  return s.status.is_ok();
}
inline bool required_ok(BuilderState& s, std::initializer_list<TensorRef> ts, const char* op) {
  for (TensorRef t : ts)
    if (!s.ok(t, op)) return false;
  return s.status.is_ok();
}

inline std::unique_ptr<fb::IntOrVidT> iov(IntOrValue v) {
  auto r = std::make_unique<fb::IntOrVidT>();
  if (v.is_literal()) {
    r->literal = v.literal();
  } else {
    r->is_vid = true;
    r->vid = std::make_unique<fb::Vid>(v.vid());
  }
  return r;
}

template <class T>
fb::OpNodeUnion make_op(std::unique_ptr<T> node) {
  fb::OpNodeUnion u;
  u.Set(std::move(*node));
  return u;
}

// Dims that differ become dynamic with bounds covering both.
inline std::unique_ptr<fb::TensorMetaT> to_meta(DType dtype, const std::vector<Dim>& shape) {
  auto m = std::make_unique<fb::TensorMetaT>();
  m->dtype = static_cast<fb::DType>(dtype);
  for (const Dim& d : shape) {
    auto fd = std::make_unique<fb::DimT>();
    fd->size = d.size;
    fd->min = d.is_static() ? 0 : d.min;
    fd->max = d.is_static() ? -1 : d.max;
    m->shape.push_back(std::move(fd));
  }
  return m;
}


inline bool norm_axis(BuilderState& s, int& axis, size_t rank, const char* op) {
  int r = static_cast<int>(rank);
  if (axis < -r || axis >= r) return s.fail(strformat("%s: axis %d out of range for rank %d", op, axis, r));
  if (axis < 0) axis += r;
  return true;
}

inline void emit_copy(BuilderState& s, TensorRef src, TensorRef dst) {
  auto n = std::make_unique<fb::CopyNodeT>();
  n->x = tid(src);
  n->out = tid(dst);
  s.emit(make_op(std::move(n)));
}

}  // namespace builder_detail
}  // namespace switchboard
