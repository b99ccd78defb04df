// What the GPU op families' host files (backend/gpu/<family>.cpp, one per
// metal_shaders/<family>.comp) share: the device's runtime, operand binding and count
// checks, each family's registration, and the kernels one family calls from another.
// Each kernel checks shapes on the host, binds its operands and records dispatches;
// they run at the device's sync().
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "device.h"
#include "gpu_kernel_table.h"
#include "gpu_runtime.h"
#include "op_shapes.h"

namespace switchboard::ops {
struct AttentionDims;
}  // namespace switchboard::ops

namespace switchboard::gpu {

namespace k = kernels;
using Runtime = GpuRuntime;

// --- the device (gpu_device.cpp) ---------------------------------------------------
Runtime& rt_of(KernelContext& ctx);
// A per-node table of words computed on the host (GatherQmm's expert table), kept and
// bound as a constant: uploaded on the node's first run only.
Result<BufferRef> node_table(KernelContext& ctx, const void* node, const std::vector<uint32_t>& words);
// A value the kernel reads on the device (KernelContext::resolve_dynamic): the value, its
// word in `words` (0: none, the value goes in the arguments) and the words' binding.
struct DynamicArg {
  int64_t value = 0;
  uint32_t word = 0;
  BufferRef words;
};
Result<DynamicArg> dynamic_arg(KernelContext& ctx, const fb::IntOrVidT* v);
// The dynamic-value words' binding alone (for a kernel that declares it but takes v baked in).
Result<BufferRef> dynamic_words(KernelContext& ctx);
// An output the dispatch just recorded counts per row as it stores it, for the next dispatch
// to wait on instead of a barrier (only where GpuRuntime::cross_dispatch_handoff(); decode's
// down + combine kernel for the next layer's norm + q/k/v): `done` [row] reaches `count` once
// row `row` of `out` is stored; `at` is GpuRuntime::dispatches() just after the producer, so
// the record serves the very next dispatch only (a later one may get the memory reused).
struct RowHandoff {
  BufferRef out, done;
  uint32_t count = 0;
  uint64_t at = 0;
};
RowHandoff& row_handoff(KernelContext& ctx);
// The record if `b` is the output the dispatch just before counted (else nullptr).
const RowHandoff* handed_to(KernelContext& ctx, const BufferRef& b);
// The tensor in `tid` bound for a kernel (kept in *keep when given).
Result<BufferRef> bind_in(KernelContext& ctx, const fb::Tid* tid, Tensor* keep = nullptr);
// A buffer an op writes in place (a KV cache, a recurrent state), on the device: `dev` is the
// host one or its device copy. keep_on_device makes a copy the buffer from then on.
struct InPlace {
  Tensor host, dev;
};
Result<InPlace> inplace_on_device(KernelContext& ctx, const fb::Tid* tid);
Status keep_on_device(KernelContext& ctx, const fb::Tid* tid, InPlace& b);
// n as a kernel's u32 count; kUnimplemented past the kernels' 2^31 limit.
Result<uint32_t> u32_count(int64_t n, const char* what);

// kSpecExtent, kSpecExtent2, ... (metal_shaders/spec_constants.glsl, constants 3..5) set to
// these extents after s's (up to 3) dtype constants: the driver builds fixed loop counts. An
// extent out of [0, 2^31) keeps its default (the push constant decides).
inline void add_extents(SpecConstants& s, std::initializer_list<int64_t> extents) {
  if (extents.size() == 0) return;
  while (s.count < 3) s.values[s.count++] = 0xffffffffu;  // unset dtypes keep their defaults
  for (int64_t e : extents) s.values[s.count++] = e >= 0 && e <= INT32_MAX ? static_cast<uint32_t>(e) : 0xffffffffu;
}
// kSpecDt0, kSpecDt1, ... set to these (up to 3) dtypes, in the order the kernel names them, then
// the extents: the driver builds only their paths.
inline SpecConstants dtype_spec(std::initializer_list<DType> dtypes, std::initializer_list<int64_t> extents = {}) {
  SpecConstants s;
  for (DType d : dtypes) s.values[s.count++] = static_cast<uint32_t>(d);
  add_extents(s, extents);
  return s;
}
// 32-bit words of n elements of t.
uint64_t words_of(DType t, int64_t n);
// Invocations of the integer kernels (int64.glsl): byte dtypes four elements each, else one.
uint64_t int_invocations(DType t, int64_t n);
// Dtypes the 32-bit word kernels do not cover (int64.glsl kernels; refused without int64).
bool needs_int_kernel_binary(DType t);
bool needs_int_kernel_unary(DType t);
// The optional lhs/rhs index operands of GatherQmm/GatherMm: bound (with the tensors
// kept in `lhs`/`rhs`), or `stand_in` (never read) when absent.
Status bind_indices(KernelContext& ctx, const std::unique_ptr<fb::Tid>& lhs_tid,
                    const std::unique_ptr<fb::Tid>& rhs_tid, BufferRef stand_in, Tensor& lhs, Tensor& rhs,
                    BufferRef& bl, BufferRef& br);

// --- families: registration -----------------------------------------------------------
void register_elementwise(KernelRegistry& r);
void register_cast(KernelRegistry& r);
void register_shape_ops(KernelRegistry& r);
void register_glu(KernelRegistry& r);
void register_combine(KernelRegistry& r);
void register_permute(KernelRegistry& r);
void register_router(KernelRegistry& r);
void register_gather_qmm(KernelRegistry& r);
void register_gather_mm(KernelRegistry& r);
void register_matmul(KernelRegistry& r);
void register_norm(KernelRegistry& r);
void register_attention(KernelRegistry& r);
// Order Blocked32 for prefills (attention_tiles.cpp): whether it takes these rows, and the
// dispatch (bindings q, k, v, sinks, out, dynamic words); with `q8`, the output's Q8 blocks too
// (attention_tiles_q8, for the projection after it).
struct Q8Blocks;
bool use_attention_tiles(const ops::AttentionDims& d, const kernels::AttentionArgs& args);
Status attention_tiles(Runtime& rt, const ops::AttentionDims& d, kernels::AttentionArgs args,
                       const std::vector<BufferRef>& b, const Q8Blocks* q8 = nullptr);
// Order Decomposed (attention_decomposed.cpp): bindings q, k, v, sinks (q without), out.
Status attention_decomposed(Runtime& rt, const ops::AttentionDims& d, const kernels::AttentionArgs& args,
                            const std::vector<BufferRef>& b);
void register_rope(KernelRegistry& r);
void register_linear_attention(KernelRegistry& r);
void register_reduce(KernelRegistry& r);

// --- kernels other families call ----------------------------------------------------
Status glu(KernelContext& ctx, const fb::OpNodeUnion& op);

// Combine's operands besides y: weights [T, k] f32, optional shared [T, D] and its gate
// [T, 1] (absent ones stand in as the weights' binding, never read).
struct CombineOperands {
  Tensor w, shared, gate;
  BufferRef bw, bs, bgate;
  int64_t tokens = 0, slots = 0;
};
Result<CombineOperands> bind_combine(KernelContext& ctx, const fb::Tid* weights_tid, const fb::Tid* shared_tid,
                                     const fb::Tid* gate_tid, int64_t dim);
// out = base + sum over slots of weights * y (slot order), y: [T*k, D] on the device;
// with `rows` (combine_rows), slot p's row of y is rows[p].
Status combine_impl(KernelContext& ctx, const Tensor& y, BufferRef by, const CombineOperands& c, const fb::Tid* out_tid,
                    const BufferRef* rows = nullptr);
// Whether Combine of y at `by` into `bo` takes combine16 (rows of whole 16-byte units).
bool combine_by16(const Tensor& y, BufferRef by, BufferRef bo, int64_t outputs);
Status combine(KernelContext& ctx, const fb::OpNodeUnion& op);

// out_rows rows of x gathered through the i32 row indices at bidx.
Status gather_rows_impl(KernelContext& ctx, const Tensor& x, BufferRef bx, BufferRef bidx, int64_t out_rows,
                        const fb::Tid* out_tid);
// ScatterRows' operands bound and its permutation inverted on the device (checked there:
// a repeat or an index out of range raises SB_ERR_PERMUTATION).
struct Scatter {
  Tensor x, idx;
  BufferRef bx, inv;
};
Result<Scatter> invert_scatter(KernelContext& ctx, const fb::ScatterRowsNodeT* n);

Status gather_qmm(KernelContext& ctx, const fb::OpNodeUnion& op);
Status rms_norm(KernelContext& ctx, const fb::OpNodeUnion& op);
// Matmul; with `done`, a decode GEMV counts its workgroups there (*counted: how many; 0 when
// another kernel ran) for a kernel recorded after it without a barrier (matmul.cpp).
Status matmul_run(KernelContext& ctx, const fb::OpNodeUnion& op, const BufferRef* done, uint32_t* counted);
// RmsNorm `norm` (order Tree32, no gate) and the decode GEMV `op` of its output in one counted
// dispatch (matmul_rows16_norm_count) where the row suits it: false (nothing recorded) where not.
// *out and *sum: where the norm's outputs were stored (sum: only with a residual).
// *keep: the tensors it stored (normalized row, logits).
Result<bool> norm_matmul_run(KernelContext& ctx, const fb::RmsNormNodeT& norm, const fb::OpNodeUnion& op,
                             const BufferRef& done, uint32_t* counted, BufferRef* out, BufferRef* sum,
                             std::vector<Tensor>* keep);

// Rope's q/k/v form (rope.cpp) bound: x, the tables and norm weights, the caches' device
// copies (bk, bv), the position and the kernel's arguments; rope_qkv_keep keeps the caches
// on the device once a dispatch wrote them.
struct RopeQkv {
  Tensor x, cos, sin, qw, kw;
  BufferRef bx, bc, bs, bqw, bkw, bk, bv;
  InPlace kc, vc;
  DynamicArg pos;
  ops::RopeDims d;
  k::RopeArgs args{};
};
Result<RopeQkv> rope_qkv_bind(KernelContext& ctx, const fb::RopeNodeT& n);
SpecConstants rope_qkv_spec(const RopeQkv& r);
Status rope_qkv_keep(KernelContext& ctx, const fb::RopeNodeT& n, RopeQkv& r);
// rope_qkv: its dispatch, the caches kept and the queries output.
Status rope_qkv_run(KernelContext& ctx, const fb::RopeNodeT& n, RopeQkv& r);
// Attention on the GPU (attention.cpp).
Status attention(KernelContext& ctx, const fb::OpNodeUnion& op);

// --- fusions (GpuDevice::fuse picks them) ----------------------------------------------
// Rope's q/k/v form + the Blocked32 Attention of its queries over its caches (attention.cpp):
// a decode row's blocks kernel computes the rope itself; other rows run the two ops.
Status rope_attention(KernelContext& ctx, const std::unique_ptr<fb::InstructionT>* ins);
// ScatterRows + Combine of its private output (combine.cpp).
Status scatter_combine(KernelContext& ctx, const std::unique_ptr<fb::InstructionT>* ins);
// GatherQmm gate, GatherQmm up, Glu (gather_qmm_row.cpp).
Status gate_up_glu(KernelContext& ctx, const std::unique_ptr<fb::InstructionT>* ins);
// ... + the down GatherQmm of the Glu's output (gather_qmm_mma.cpp).
Status moe_ffn(KernelContext& ctx, const std::unique_ptr<fb::InstructionT>* ins);
// RmsNorm (order Tree32) + the GatherQmm of its output (gather_qmm_row.cpp); the _private
// form leaves the norm's output unwritten (nothing after the GatherQmm reads it).
Status norm_qmm(KernelContext& ctx, const std::unique_ptr<fb::InstructionT>* ins);
Status norm_qmm_private(KernelContext& ctx, const std::unique_ptr<fb::InstructionT>* ins);
// Matmul + the Router of its logits (router.cpp): where dispatches may hand off, the router
// waits for the GEMV's workgroups instead of a barrier.
Status matmul_router(KernelContext& ctx, const std::unique_ptr<fb::InstructionT>* ins);
// RmsNorm + that Matmul of its output + the Router (router.cpp): where dispatches hand off, the
// GEMV's workgroups normalize the row themselves (one dispatch and one barrier fewer).
Status norm_matmul_router(KernelContext& ctx, const std::unique_ptr<fb::InstructionT>* ins);
// Argsort + GatherRows of its keys by its order + Full of a positive i32 k + FloorDiv of the
// order by it (the sorted MoE's pairs: order, experts, tokens), one dispatch (permute.cpp).
Status moe_order(KernelContext& ctx, const std::unique_ptr<fb::InstructionT>* ins);

}  // namespace switchboard::gpu
