// Kernels that never touch tensor bytes, so every device registers the same ones:
// Reshape (a view of x) and Copy (shares x's storage: tensors are immutable once
// written, and in-place updates copy on write).
#pragma once

#include "device.h"

namespace switchboard::ops {

Status reshape_kernel(KernelContext& ctx, const fb::OpNodeUnion& op);
Status copy_kernel(KernelContext& ctx, const fb::OpNodeUnion& op);
// Adds both to r.
void register_view_kernels(KernelRegistry& r);

}  // namespace switchboard::ops
