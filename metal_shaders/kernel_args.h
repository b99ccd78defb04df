// Kernel argument layouts (push constants), shared by the shaders and the hosts
// (backend/vulkan, backend/metal). Each layout is one macro of 32-bit fields, so
// both languages see the same list; the C++ side checks sizes and offsets with
// static_asserts (backend/vulkan/kernel_table.h), the structural test checks the
// SPIR-V reflection against the same table. Fields are uint/int/float only.
#ifndef SWITCHBOARD_KERNEL_ARGS_H
#define SWITCHBOARD_KERNEL_ARGS_H

// DType codes (schema/program.fbs).
#define SB_DT_F32 0u
#define SB_DT_F16 1u
#define SB_DT_BF16 2u
#define SB_DT_I32 3u
#define SB_DT_I64 4u
#define SB_DT_U8 5u
#define SB_DT_U32 6u
#define SB_DT_BOOL 7u

#define SB_MAX_RANK 6
// Bits of the device status word a kernel raises on bad data (it then skips the element).
#define SB_ERR_INDEX 1u      // an index outside its range
#define SB_ERR_PRUNED 2u     // a pair selects an expert with 0 bits
#define SB_ERR_UNSORTED 4u   // sorted_indices set but rhs_indices not ascending
#define SB_ERR_PERMUTATION 8u  // ScatterRows indices are not a permutation
#define SB_ERR_DIV_ZERO 32u    // FloorDiv by zero
#define SB_ERR_HANDOFF 64u     // a kernel gave up waiting for an index the dispatch before it writes

// elementwise.comp BINARY: out word w (1 or 2 elements); a and b broadcast into out's shape.
#define SB_BINARY_ARGS \
  uint n; uint op; uint dtype; uint rank; \
  uint shape[SB_MAX_RANK]; uint sa[SB_MAX_RANK]; uint sb[SB_MAX_RANK];
// elementwise.comp UNARY.
#define SB_UNARY_ARGS uint n; uint op; uint dtype; uint pad0;
// cast.comp: between f32/f16/bf16/i32/u32/u8/bool.
#define SB_CAST_ARGS uint n; uint from_dtype; uint to_dtype; uint pad0;
// shape_ops.comp FILL: out[i] = pattern[i & 1] over `words` 32-bit words.
#define SB_FILL_ARGS uint words; uint pattern0; uint pattern1; uint pad0;
// glu.comp.
#define SB_GLU_ARGS uint n; uint dtype; uint kind; float alpha; float limit; uint pad0; uint pad1; uint pad2;
// combine.comp: y [T*k, D], weights [T, k] f32, shared [T, D], gate [T, 1].
#define SB_COMBINE_ARGS \
  uint tokens; uint slots; uint dim; uint dtype; \
  uint has_shared; uint shared_dtype; uint has_gate; uint gate_dtype;
// gather_qmm.comp QUANTIZE: x [rows, k] -> q (int8 in words), d, sum per 32-block.
// `permute`: each 8-code word pair in qmm_mma4's K order (0, 2, 4, 6, 1, 3, 5, 7).
#define SB_Q8_ARGS uint rows; uint k; uint dtype; uint permute;
// gather_qmm.comp QMM: out [pairs, n] (x's dtype), experts of per-expert bits.
// QMM: `per_wg` consecutive outputs per workgroup (even: whole f16/bf16 words).
// QMM_ROW: workgroup (pair p, tile t) computes outputs [t*per_wg, t*per_wg + per_wg)
// of pair p (`tiles` tiles per pair) from x itself (of x_dtype), quantized in-kernel.
// QMM_TILES: the work list of QMM_TILE (at most `tiles` entries). QMM_TILE: workgroup
// (entry t, column block c of `tiles` blocks of 64) over pairs sorted by expert.
#define SB_QMM_STAGE_K 8192  // longest K whose Q8 row QMM_ROW stages in shared memory
#define SB_QMM_ROW_SMALL_K 2048  // longest K of qmm_row_2k / qmm_row_glu_2k
#define SB_QMM_ROW_TERMS 1024  // QMM_ROW's group terms per workgroup: projections * per_wg * groups
#define SB_QMM_TILE_PAIRS 32u  // pairs per work-list entry (QMM_TILES) for QMM_TILE
#define SB_QMM_MMA_PAIRS 64u   // ... and for the QMM_MMA kernels (QMM_TILES takes it in per_wg)
#define SB_ATTENTION_TILE 32u  // query vectors an attention_tiles workgroup takes (its mapping assumes 32)
#define SB_QMM_ARGS \
  uint pairs; uint n; uint k; uint groups; \
  uint group_size; uint rows; uint experts; uint scale_dtype; \
  uint out_dtype; uint has_lhs; uint has_rhs; uint sorted; \
  uint per_wg; uint x_dtype; uint tiles; uint pad0;
// QMM_ROW_GLU: QMM_ROW for a gate and an up projection of the same pairs, out = their
// Glu (glu.comp's kinds) of the two results rounded to the output dtype.
// wait_rhs (qmm_row_glu_2k_dot4): rhs is being written by the dispatch just before,
// over -1s; each workgroup stages x, then waits for its pair's index (no barrier between),
// and counts itself in done[pair] once its outputs are stored. wait_x: x is the norm output
// that matmul_rows16_norm_count (recorded before the router, no barrier) stores; each workgroup
// first waits until that many of its workgroups have counted.
#define SB_QMM_GLU_ARGS \
  SB_QMM_ARGS uint glu_kind; float glu_alpha; float glu_limit; uint wait_rhs; uint wait_x; uint pad1; uint pad2; uint pad3;
// QMM_ROW_NORM_2K: QMM_ROW_2K whose x is RmsNorm's input (order Tree32; has_residual: with
// a residual; inv_d, eps, w_dtype as NormArgs); store_out: the first tile also stores the
// normalized row (the sum is always stored with a residual). wait_tiles
// (qmm_row_norm_2k_dot4): x or the residual is the combined output of the down projection
// recorded just before (qmm_row_combine_2k_dot4); each workgroup waits until its row's
// tiles are combined.
#define SB_QMM_NORM_ARGS \
  SB_QMM_ARGS uint has_residual; float inv_d; float eps; uint w_dtype; uint store_out; uint wait_tiles; uint pad2; uint pad3;
// QMM_ROW_COMBINE: QMM_ROW with combine.comp's operands (pairs = tokens * slots); the
// counters are [token][tile], then [token]: the tiles combined (for qmm_row_norm_2k_dot4).
// wait_tiles (qmm_row_combine_2k_dot4): x (h) is being written by the gate/up dispatch just
// before; each workgroup waits until that many of its row's workgroups have counted.
#define SB_QMM_COMBINE_ARGS \
  SB_QMM_ARGS uint slots; uint has_shared; uint shared_dtype; uint has_gate; uint gate_dtype; uint wait_tiles; uint pad2; uint pad3;
// permute.comp GATHER_ROWS: out [rows] of x [src_rows], rows of `row_units` units of
// `unit_bytes` (1, 2 or 4). INVERT: inv[idx[p]] = p for p < rows (inv prefilled with ~0).
#define SB_PERMUTE_ARGS uint rows; uint src_rows; uint row_units; uint unit_bytes; uint out_words; uint pad0; uint pad1; uint pad2;
// router.comp: logits [T, E] -> weights [T, k] f32, indices [T, k] i32.
#define SB_ROUTER_ARGS \
  uint tokens; uint experts; uint k; uint kind; \
  uint dtype; uint renormalize; uint n_group; uint topk_group; \
  float routed_scaling_factor; uint has_bias; uint has_scale; uint wait_count;
// permute.comp ARGSORT: stable ascending order of n i32 keys; ARGSORT_MOE: div >= 1 divides the indices.
#define SB_ARGSORT_ARGS uint n; uint div; uint pad1; uint pad2;
#define SB_ERR_ROUTER 16u  // fewer selectable experts than k

// gather_mm.comp: out [pairs, n] = dot32(x[lhs[p]], w[rhs[p], n]) over k.
#define SB_GATHER_MM_ARGS \
  uint pairs; uint n; uint k; uint rows; \
  uint experts; uint dtype; uint has_lhs; uint has_rhs;
// reduce.comp: x viewed as [outer, d, inner] -> out [outer, inner] (REDUCE: op; ARGMAX: i32).
#define SB_REDUCE_ARGS uint outer; uint d; uint inner; uint op; uint dtype; uint pad0; uint pad1; uint pad2;

// shape_ops.comp REGION: dst[dst_off + r*dst_stride + c] = src[src_off + r*src_stride + c]
// for r < outer, c < len, in units of unit_bytes (1, 2 or 4); visits dst words
// [first_word, first_word + words). REGION_AT: dst_off and the words shifted by
// dyn[dyn_word] * dyn_units units (a whole number of words: SliceUpdate at an input position).
#define SB_REGION_ARGS \
  uint outer; uint len; uint src_off; uint src_stride; \
  uint dst_off; uint dst_stride; uint unit_bytes; uint first_word; \
  uint words; uint dyn_word; uint dyn_units; uint pad2;

// shape_ops.comp TRANSPOSE: out element g (row-major over dims[0..rank)) = x element
// sum_a idx_a(g) * strides[a]; elem_bytes 1, 2, 4 or 8; invocations: out words (8: elements).
#define SB_TRANSPOSE_MAX_RANK 8
#define SB_TRANSPOSE_ARGS \
  uint dims[SB_TRANSPOSE_MAX_RANK]; uint strides[SB_TRANSPOSE_MAX_RANK]; \
  uint rank; uint elem_bytes; uint numel; uint invocations;

// matmul.comp: out [batch, rows, cols] = dot32(a[i, r, :], B[i / group, :, c]) (+ bias[c]).
#define SB_MATMUL_ARGS \
  uint rows; uint cols; uint k; uint dtype; \
  uint b_dtype; uint transpose_b; uint has_bias; uint bias_dtype; \
  uint batch; uint group; uint pad0; uint pad1;
// MATMUL_ROWS16_NORM_COUNT: a is RmsNorm (order Tree32) of x (+ the residual with
// has_residual), inv_d, eps and w_dtype as NormArgs.
#define SB_MATMUL_NORM_ARGS SB_MATMUL_ARGS uint has_residual; float inv_d; float eps; uint w_dtype;

// norm.comp: x viewed as [rows, d] (SOFTMAX; RMS_NORM with weight [d], inv_d = f32(1/d)).
#define SB_NORM_ROW_MAX 4096  // longest row the workgroup-per-row variants stage in shared memory
#define SB_NORM_ARGS uint rows; uint d; uint dtype; float inv_d; float eps; uint out_dtype; uint pad0; uint gated; uint w_dtype;
// RMS_NORM_TREE_Q8: RMS_NORM_TREE (gated 0) that also writes the Q8 blocks of its output (as
// quantize_q8; permute: in qmm_mma4's K order); store_out: the normalized rows too.
#define SB_NORM_Q8_ARGS SB_NORM_ARGS uint permute; uint store_out; uint pad1;
// attention.comp: ATTENTION (order Decomposed): one workgroup per (query row, head), scratch
// holds each row's len + 1 floats. Blocked32: rows row0 .. row0 + rows - 1 in this dispatch,
// nb key blocks a row; scratch holds (m_b, l_b) per (row, head, block), then o_b [hd] each;
// seq_major: caches [cache, hk, hd] instead of [hk, cache, hd]. Workgroup (pair, split) takes
// blocks split, split + nsplit, ...; the first query's position is pos + dyn[pos_word].
#define SB_ATTENTION_ARGS uint m; uint hq; uint hk; uint hd; uint cache; uint pos; uint len; uint dtype; \
  float scale; float mask_value; uint window; uint has_sinks; uint row0; uint rows; uint nb; uint seq_major; \
  uint nsplit; uint pos_word;
// ATTENTION_TILES_Q8: ATTENTION_TILES that also writes the Q8 blocks of its output (as
// quantize_q8; q8_permute: in qmm_mma4's K order); q8_store_out: the output too.
#define SB_ATTENTION_Q8_ARGS SB_ATTENTION_ARGS uint q8_permute; uint q8_store_out;
// ATTENTION_BLOCKS_ROPE: then Rope's q/k/v form of x [1, x_heads, hd] (queries, then hk keys and
// hk values at the end): half_dims, eps, inv_d as SB_ROPE_ARGS; rope_flags bit 0 the query norm,
// bit 1 the key norm, bits 8..15 / 16..23 their weights' dtypes.
#define SB_ATTENTION_ROPE_ARGS SB_ATTENTION_ARGS uint half_dims; float eps; float inv_d; uint rope_flags; \
  uint x_heads; uint pad0;

// rope.comp: x [m, h, hd] of n elements, tables [S, half] f32, row 0 at position pos; ROPE_NORM:
// each head RMSNorm'd first (eps, inv_d = the f32 nearest 1 / hd); has_cache: the output also
// written to a [S, h, hd] cache from row pos. Row 0's position is pos + dyn[pos_word] (dyn: the
// per-execution words of input values; word 0 is 0).
// ROPE_QKV (schema v8): q_heads queries, k_heads keys then values at the end of x's h heads;
// has_norm / has_k_norm: the queries' / keys' weights given (dtypes w_dtype / kw_dtype).
#define SB_ROPE_ARGS uint m; uint h; uint hd; uint half_dims; uint pos; uint dtype; uint n; uint has_cache; \
  float eps; float inv_d; uint pos_word; uint w_dtype; uint q_heads; uint k_heads; uint has_norm; uint has_k_norm; \
  uint kw_dtype;

// linear_attention.comp CAUSAL_CONV1D: x [m, c] (words of `per` channels), weight [c, k], state
// [k - 1, c]; row 0's position pos + dyn[pos_word] (0: the state reads as zeros); silu: 0 or 1.
#define SB_CONV_ARGS uint m; uint c; uint k; uint dtype; uint pos; uint pos_word; uint silu; uint pad0;
// linear_attention.comp GATED_DELTA_RULE: qkv [m, width], a / b [m, hv], a_log / dt_bias [hv]
// (their dtype ab_dtype), state [hv, dk, dv] f32, out [m, hv, dv]; hk key heads; position as above.
#define SB_DELTA_ARGS uint m; uint hk; uint hv; uint dk; uint dv; uint width; uint dtype; uint ab_dtype; \
  uint pos; uint pos_word; uint l2norm; float scale;

// probe.comp: the start-up check of a device's arithmetic against the contract.
#define SB_PROBE_ARGS uint n; uint pad0; uint pad1; uint pad2;
// probe.comp STREAM_READ: reads n 16-byte words; stores only where their XOR is magic.
#define SB_STREAM_ARGS uint n; uint magic; uint pad0; uint pad1;

#ifdef __cplusplus
#include <cstddef>
#include <cstdint>
namespace switchboard::kernels {
using uint = std::uint32_t;
struct BinaryArgs { SB_BINARY_ARGS };
struct UnaryArgs { SB_UNARY_ARGS };
struct CastArgs { SB_CAST_ARGS };
struct FillArgs { SB_FILL_ARGS };
struct GluArgs { SB_GLU_ARGS };
struct CombineArgs { SB_COMBINE_ARGS };
struct Q8Args { SB_Q8_ARGS };
struct QmmArgs { SB_QMM_ARGS };
struct QmmGluArgs { SB_QMM_GLU_ARGS };
struct QmmCombineArgs { SB_QMM_COMBINE_ARGS };
struct QmmNormArgs { SB_QMM_NORM_ARGS };
struct PermuteArgs { SB_PERMUTE_ARGS };
struct ProbeArgs { SB_PROBE_ARGS };
struct StreamArgs { SB_STREAM_ARGS };
struct GatherMmArgs { SB_GATHER_MM_ARGS };
struct ReduceArgs { SB_REDUCE_ARGS };
struct RegionArgs { SB_REGION_ARGS };
struct TransposeArgs { SB_TRANSPOSE_ARGS };
struct MatmulArgs { SB_MATMUL_ARGS };
struct MatmulNormArgs { SB_MATMUL_NORM_ARGS };
struct NormArgs { SB_NORM_ARGS };
struct NormQ8Args { SB_NORM_Q8_ARGS };
struct AttentionArgs { SB_ATTENTION_ARGS };
struct AttentionQ8Args { SB_ATTENTION_Q8_ARGS };
struct AttentionRopeArgs { SB_ATTENTION_ROPE_ARGS };
struct RopeArgs { SB_ROPE_ARGS };
struct ConvArgs { SB_CONV_ARGS };
struct DeltaArgs { SB_DELTA_ARGS };
struct RouterArgs { SB_ROUTER_ARGS };
struct ArgsortArgs { SB_ARGSORT_ARGS };
}  // namespace switchboard::kernels
#endif

#endif  // SWITCHBOARD_KERNEL_ARGS_H
