// The declared-operand rules of every device op family, stated once (schema/program.fbs
// gives each op's semantics): the dtypes, ranks, static dims, axes, enums and bit widths
// its slots must be declared with. The validator checks every loaded instruction with
// them and the builder every instruction it emits, so the builder never writes a program
// the loader refuses. What only run-time shapes decide is op_shapes.h, used by every
// device; host ops (SymSize, IntArith, If) are the validator's own.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "program_generated.h"
#include "switchboard/status.h"
#include "switchboard/tensor.h"

namespace switchboard::ops {

// A slot as declared: dtype and dims (a static size, or -1 when dynamic).
struct SlotDecl {
  DType dtype = DType::kF32;
  std::vector<int64_t> dims;
};
// The declaration of a tensor slot the op names (every id already checked in range).
using SlotDecls = std::function<SlotDecl(const fb::Tid* tid)>;

// Highest rank a declaration or a Reshape/Full shape may have.
inline constexpr size_t kMaxRank = 8;

// OK, or kInvalidProgram naming `path` + the field, e.g. "<path>.b: must have rank 2".
// Host ops and NONE are not device ops: "unknown op".
Status check_op_rules(const fb::OpNodeUnion& op, const SlotDecls& decls, const std::string& path);

// `axis` in [-rank, rank) (or [-rank - 1, rank] with allow_end); the error names path.axis.
Status check_axis(int32_t axis, size_t rank, const std::string& path, bool allow_end = false);

}  // namespace switchboard::ops
