// Per-op facts the generic layers need: the op's name, and every tensor and value slot it
// reads or writes, generated from schema/program.fbs by schema/gen_op_info.py (a field is
// written when named `out` or marked (sb_write)).
#pragma once

#include <cstdint>
#include <functional>

#include "program_generated.h"

namespace switchboard {

const char* op_name(fb::OpNode type);  // "Binary", "If", ... ("?" when unknown)

struct SlotRef {
  bool is_tensor;      // false: a value slot
  bool is_write;
  const char* field;   // schema field name, e.g. "rhs_indices"
  int element;         // index inside a vector field, or -1
  uint32_t* idx;       // null when a required slot is missing
};

// Calls `fn` for every slot the op references, in schema field order.
// Optional slots that are absent and literal IntOrVid values are skipped.
void for_each_slot(fb::OpNodeUnion& op, const std::function<void(const SlotRef&)>& fn);

}  // namespace switchboard
