// Attention in order Decomposed on the GPU (metal_shaders/attention_decomposed.comp): one
// workgroup per (row, head), the steps of the decomposed ops in one kernel. attention.cpp
// sends that order here.
#include "gpu_ops.h"
#include "op_shapes.h"

namespace switchboard::gpu {
namespace {
constexpr int64_t kRowMax = 4096;  // attention_decomposed.comp's kRowMax
}  // namespace

// Bindings q, k, v, sinks (q when there are none), out.
Status attention_decomposed(Runtime& rt, const ops::AttentionDims& d, const k::AttentionArgs& args,
                            const std::vector<BufferRef>& b) {
  SB_RETURN_IF_ERROR(u32_count(d.m * d.hq * (d.len + 1), "attention scores").status());
  // Rows of more than kRowMax scores live in a scratch buffer instead of shared memory.
  const bool in_shared = d.len + args.has_sinks <= kRowMax;
  SB_ASSIGN_OR_RETURN(Tensor scratch, rt.alloc(DType::kF32, {in_shared ? 1 : d.m * d.hq * (d.len + 1)}));
  SB_ASSIGN_OR_RETURN(BufferRef bt, rt.bind(scratch, false));
  if (d.m * d.hq == 0) return Status::ok();
  return rt.dispatch("attention", {b[0], b[1], b[2], b[3], bt, b[4]}, &args, sizeof(args),
                     static_cast<uint64_t>(d.m * d.hq) * 128,
                     dtype_spec({static_cast<DType>(args.dtype)}, {d.hd}));
}

}  // namespace switchboard::gpu
