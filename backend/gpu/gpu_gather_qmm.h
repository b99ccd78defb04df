// The GatherQmm family's host code on the GPU, shared by its schedules' files
// (gather_qmm.cpp: setup, Q8 activations, the generic kernel; gather_qmm_row.cpp: decode
// rows; gather_qmm_tile.cpp: sorted tiles; gather_qmm_mma.cpp: int8 tensor cores), each
// beside the shader of its name in metal_shaders/.
#pragma once

#include <cstring>

#include "gather_qmm_plan.h"
#include "gpu_ops.h"

namespace switchboard::gpu {

// GatherQmm's operands bound, its plan (ops::plan_gather_qmm) and the kernel arguments:
// shared by the plain kernel and the fused ones.
struct QmmSetup {
  Tensor x, w, scales, biases, lhs, rhs;
  BufferRef bx, bw, bs, bb, bl, br, bi;
  k::QmmArgs args{};
  int64_t rows = 0, kdim = 0, experts = 0, nout = 0, pairs = 0, groups = 0, sorted = 0;
  bool all_4bit = false;  // every expert 4-bit (none pruned): qmm_mma4 may run
  bool mma = false;       // the device has int8 cooperative matrices (the qmm_mma kernels)
};

// `x_shape`: x is never stored (a fused producer made its Q8 blocks); its shape and
// dtype stand in and binding 0 of the row kernels is never used.
Result<QmmSetup> qmm_setup(KernelContext& ctx, const fb::GatherQmmNodeT* n, const Tensor* x_shape = nullptr);

// Q8 activation blocks of a GatherQmm's x (quantize_q8); the fused paths make them once
// for every projection of the same x.
struct Q8Blocks {
  Tensor xq, d, s;
  BufferRef bq, bd, bsum;
  bool permuted = false;
};

// Device room for the Q8 blocks of `rows` x `k` activations (k a multiple of 32);
// `permuted`: in qmm_mma4's K order (only that kernel reads them).
Result<Q8Blocks> alloc_q8(Runtime& rt, int64_t rows, int64_t k, bool permuted);
// x's Q8 blocks (quantize_q8 / quantize_q8_16).
Result<Q8Blocks> quantize_rows(Runtime& rt, const QmmSetup& q, bool permute);

// The tiles of pairs for every projection of the same indices: with rhs, qmm_tiles' work
// list of runs of up to tile_pairs pairs of one expert in bt; without, tiles of
// tile_pairs pairs in order that the kernels derive themselves (bt only bound).
struct QmmTileList {
  BufferRef bt;
  int64_t max_tiles = 0;
  uint32_t tile_pairs = 0;
};

// Whether the tiled kernels (qmm_tiles + qmm_tile / qmm_mma) take these pairs.
bool qmm_tiled(const QmmSetup& q);
Result<QmmTileList> qmm_tile_list(Runtime& rt, QmmSetup& q);
// The kernel of the tiles: int8 tensor cores where the device has them (Vulkan, NVIDIA),
// the all-4-bit twin when every expert is 4-bit (gather_qmm_mma.cpp).
const char* qmm_tile_kernel(Runtime& rt, const QmmSetup& q);
// The specialization constants of a qmm_tile_kernel dispatch (the MMA kernels': scale and output
// dtypes, Glu kind, k, n and group size; none for the portable qmm_tile).
SpecConstants qmm_tile_spec(const char* kernel, const k::QmmArgs& a, uint32_t glu_kind = 0);
// Whether a GatherQmm's Q8 blocks are made in qmm_mma4's order.
bool q8_permuted(Runtime& rt, const QmmSetup& q);

// GatherQmm from Q8 blocks into bo: the tiles when `tiles` is set, else qmm per pair.
Status qmm_from_q8(Runtime& rt, QmmSetup& q, const Q8Blocks& q8, const QmmTileList* tiles, BufferRef bo);
// An RmsNorm's bound operands (the residual's stand-in is x where it has none).
struct NormOperands {
  Tensor x, res, w;
  BufferRef bx, br, bw;
};
// An RmsNorm's outputs on the device, each bound: the normalized rows (with `store_out`) and the
// sum (with a residual); `stand_in` binds the absent ones (never written).
struct NormOutputs {
  Tensor normed, sum;
  BufferRef bn, bs;
};
Result<NormOutputs> alloc_norm_outputs(Runtime& rt, const Tensor& x, bool store_out, bool residual, BufferRef stand_in);
// Whether rms_norm_tree_q8 takes this RmsNorm (order Tree32, no gate): x [rows, d], d a
// multiple of 32 that its workgroup stages whole, float.
bool norm_q8_fits(const fb::RmsNormNodeT& nn, const NormOperands& in);
// rms_norm_tree_q8: nn's sum (with a residual) and, with `store_out`, its output (also into
// *normed_out, bound at *normed_ref) as its slots' values; returns the output's Q8 blocks
// (`permute`: in qmm_mma4's K order).
Result<Q8Blocks> norm_q8_run(KernelContext& ctx, const fb::RmsNormNodeT& nn, const NormOperands& in, bool store_out,
                             bool permute, Tensor* normed_out = nullptr, BufferRef* normed_ref = nullptr);
// RmsNorm and the GatherQmm of its output set up as q (GpuDevice::fuse's norm_qmm) on rows
// GatherQmm quantizes (prefill: not the row kernels): norm_q8_run, then the projection from
// those blocks — one dispatch fewer than the norm and quantize_q8. false (nothing recorded)
// where the rows do not suit it.
Result<bool> norm_q8_qmm(KernelContext& ctx, const fb::RmsNormNodeT& nn, const fb::GatherQmmNodeT* qn, QmmSetup& q,
                         const NormOperands& in, bool store_out);
// Rows from which a prefill's producers (the router's norm, the tiled attention) also write
// their output's Q8 blocks for the projection after them: fewer rows take the row kernels, which
// quantize in-kernel.
constexpr int64_t kPrefillQ8MinRows = 64;
// Holds `q8`, the Q8 blocks of `of` (bound at `bx`), for the next x_q8 of that tensor.
void hold_x_q8(KernelContext& ctx, Tensor of, BufferRef bx, Q8Blocks q8);
// x's Q8 blocks in `permute` order: the ones a producer held (hold_x_q8: the router's norm, the
// tiled attention) (MoeHandoff::x_q8, then let
// go) when x is that norm's output, else quantize_rows'.
Result<Q8Blocks> x_q8(KernelContext& ctx, const QmmSetup& q, bool permute);
// GatherQmm `n` set up as q; `pre` and `pre_tiles`: x's Q8 blocks and the pairs' work
// list, made by a fused producer (else made here).
Status gather_qmm_run(KernelContext& ctx, const fb::GatherQmmNodeT* n, QmmSetup& q, const Q8Blocks* pre = nullptr,
                      const QmmTileList* pre_tiles = nullptr);

// Whether the decode row kernels (qmm_row, qmm_row_glu) take these rows; then sets the
// outputs per workgroup and tiles per pair in q.args (gather_qmm_row.cpp).
bool qmm_row_plan(QmmSetup& q, int64_t projections);
const char* qmm_row_kernel(const Runtime& rt, const QmmSetup& q, bool glu, bool all_4bit);
SpecConstants row_spec(const Runtime& rt, bool all_4bit, const k::QmmArgs& a, uint32_t glu_kind = 0,
                       uint32_t norm_w_dtype = ~0u);
// Decode's down projection with combine_weights in one dispatch (qmm_row_combine_2k).
Status qmm_row_combine(KernelContext& ctx, const fb::GatherQmmNodeT* n, const QmmSetup& q, const CombineOperands& c,
                       const Tensor& y, BufferRef by);

// Push constants that begin with a QmmArgs (gpu_kernel_table.h checks where the extra
// fields start), the rest zero.
template <typename T>
T extend_qmm_args(const k::QmmArgs& qa) {
  static_assert(sizeof(T) > sizeof(k::QmmArgs));
  T args{};
  std::memcpy(&args, &qa, sizeof(qa));
  return args;
}
// A kernel's QmmArgs followed by the Glu's kind and constants (qmm_row_glu, qmm_mma4_glu).
k::QmmGluArgs glu_args(const k::QmmArgs& qa, const fb::GluNodeT* glu_node);

// What decode's MoE kernels hand to the next ones without a barrier, in the submission
// being recorded (only where GpuRuntime::cross_dispatch_handoff(); forgotten once any
// submission finishes, GpuRuntime::submissions()):
// the router's indices (-1 until it writes each) and weights, and the gate/up's h with its
// per-row counts of workgroups done (`tiles` per row when complete). The router records
// it; gather_qmm_row.cpp's kernels wait on it. Where the router's logits came from
// matmul_rows16_norm_count (norm_matmul_router): the norm's out and sum, stored by the GEMV's
// first workgroup of the row, and its count of workgroups done (`norm_count` when complete).
struct MoeHandoff {
  BufferRef indices, weights, rows, done;
  uint32_t tiles = 0;
  BufferRef norm_out, norm_sum, norm_done;
  uint32_t norm_count = 0;
  // The GEMV's outputs held until the next such record: written with no barrier after them, their
  // memory given to the next norm + q/k/v would cost that hand-off a barrier (a write hazard).
  std::vector<Tensor> norm_keep;
  // Prefill: the Q8 blocks of a producer's output (hold_x_q8) for the projection after it (x_q8);
  // x_q8_of holds that output, so its memory (x_q8_bx) is no other tensor's while they are here.
  Q8Blocks x_q8;
  Tensor x_q8_of;
  BufferRef x_q8_bx;
};
MoeHandoff& moe_handoff(KernelContext& ctx);

}  // namespace switchboard::gpu
