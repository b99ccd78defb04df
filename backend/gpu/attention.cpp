// Attention over a KV cache on the GPU (metal_shaders/attention.comp). Order Blocked32: one
// workgroup per (row, head, key block of 32), then one per (row, head) merging the blocks (after
// a decode row's attention_blocks_rope without a barrier where the runtime allows hand-offs: each
// merge workgroup waits for its pair's count; a prefill of head dims 32k <= 128 goes to
// attention_tiles.cpp instead). Order Decomposed:
// attention_decomposed.cpp.
#include <algorithm>
#include <cstddef>
#include <cstring>

#include "gpu_gather_qmm.h"
#include "gpu_ops.h"
#include "op_shapes.h"

namespace switchboard::gpu {
namespace {

constexpr int64_t kMaxHeadDim = 256;  // attention.comp's shared arrays

// Scratch a Blocked32 dispatch pair may hold; longer prefills go in chunks of rows (a row's
// bits do not depend on its chunk).
constexpr uint64_t kBlockedScratchBytes = 64ull << 20;
// Workgroups a (row, head) pair's key blocks are split over when the position is read on the
// device: the grid and scratch then follow the cache's length, not the position's.
constexpr uint64_t kDynamicSplits = 64;

// attention_blocks_rope's part beyond attention_blocks' (rope_attention_row).
struct BlocksRope {
  k::AttentionRopeArgs args{};
  std::vector<BufferRef> binds;  // its bindings, scratch (3) filled in by blocked()
  SpecConstants spec;
};

// Blocked32 in chunks of rows: bindings q, k, v, sinks, out, dynamic words. With pos_word
// set, every block of the cache has a scratch slot and the blocks past the position are skipped.
// With `rope`, the blocks kernel is attention_blocks_rope (one row).
Status blocked(Runtime& rt, const ops::AttentionDims& d, k::AttentionArgs args, const std::vector<BufferRef>& b,
               BlocksRope* rope = nullptr) {
  if (d.m == 0 || d.hq == 0) return Status::ok();
  if (!rope && use_attention_tiles(d, args)) return attention_tiles(rt, d, args, b);
  const int64_t keys = args.pos_word ? d.cache : d.len;
  const uint64_t nb = static_cast<uint64_t>((keys + ops::kAttentionBlock - 1) / ops::kAttentionBlock);
  const uint64_t nsplit = args.pos_word ? std::min(nb, kDynamicSplits) : nb;
  const uint64_t row_floats = static_cast<uint64_t>(d.hq) * nb * static_cast<uint64_t>(d.hd + 2);
  const uint64_t chunk = std::clamp<uint64_t>(kBlockedScratchBytes / 4 / row_floats, 1, static_cast<uint64_t>(d.m));
  SB_RETURN_IF_ERROR(u32_count(static_cast<int64_t>(chunk * row_floats), "attention block scratch").status());
  SB_ASSIGN_OR_RETURN(Tensor scratch, rt.alloc(DType::kF32, {static_cast<int64_t>(chunk * row_floats)}));
  SB_ASSIGN_OR_RETURN(BufferRef bt, rt.bind(scratch, false));
  const SpecConstants spec = dtype_spec({static_cast<DType>(args.dtype)}, {d.hd});
  args.nb = static_cast<uint32_t>(nb);
  args.nsplit = static_cast<uint32_t>(nsplit);
  for (uint64_t row0 = 0; row0 < static_cast<uint64_t>(d.m); row0 += chunk) {
    const uint64_t rows = std::min<uint64_t>(chunk, static_cast<uint64_t>(d.m) - row0);
    args.row0 = static_cast<uint32_t>(row0);
    args.rows = static_cast<uint32_t>(rows);
    const uint64_t pairs = rows * static_cast<uint64_t>(d.hq);
    if (rope) {
      static_assert(offsetof(k::AttentionRopeArgs, half_dims) == sizeof(k::AttentionArgs));
      std::memcpy(&rope->args, &args, sizeof(args));  // the same fields first
      SB_ASSIGN_OR_RETURN(BufferRef counters, rt.scratch(pairs * 4, 0));  // splits done, per pair
      rope->binds[3] = bt;
      rope->binds.resize(10);
      rope->binds[9] = counters;
      SB_RETURN_IF_ERROR(rt.dispatch("attention_blocks_rope", rope->binds, &rope->args, sizeof(rope->args),
                                     pairs * nsplit * 128, rope->spec));
      if (rt.cross_dispatch_handoff()) {  // the merge waits on the counts instead of a barrier
        const std::vector<BufferRef> mb = {b[3], bt, b[4], b[5], counters, rt.error_word()};
        SB_RETURN_IF_ERROR(rt.dispatch("attention_merge_wait", mb, &args, sizeof(args), pairs * 128, spec,
                                       handoff_mask(mb, {bt, counters})));
        continue;
      }
    } else {
      SB_RETURN_IF_ERROR(rt.dispatch("attention_blocks", {b[0], b[1], b[2], bt, b[5]}, &args, sizeof(args),
                                     pairs * nsplit * 128, spec));
    }
    SB_RETURN_IF_ERROR(rt.dispatch("attention_merge", {b[3], bt, b[4], b[5]}, &args, sizeof(args), pairs * 128, spec));
  }
  return Status::ok();
}

// The kernels' arguments for node n with these sizes (pos.word: read on the device).
k::AttentionArgs attention_args(const fb::AttentionNodeT& n, const ops::AttentionDims& d, const DynamicArg& pos,
                                DType dt) {
  return k::AttentionArgs{static_cast<uint32_t>(d.m),
                          static_cast<uint32_t>(d.hq),
                          static_cast<uint32_t>(d.hk),
                          static_cast<uint32_t>(d.hd),
                          static_cast<uint32_t>(d.cache),
                          pos.word ? 0u : static_cast<uint32_t>(d.pos),
                          static_cast<uint32_t>(d.len),
                          static_cast<uint32_t>(dt),
                          n.scale,
                          n.mask_value,
                          static_cast<uint32_t>(n.window),
                          n.sinks ? 1u : 0u,
                          0,
                          static_cast<uint32_t>(d.m),
                          0,
                          n.seq_major ? 1u : 0u,
                          0,
                          pos.word};
}

// What the GPU kernels take of node n's sizes (beyond attention_dims' checks).
Status attention_supported(const fb::AttentionNodeT& n, const ops::AttentionDims& d, DType dt) {
  SB_CHECK_OR_RETURN(d.hd <= kMaxHeadDim && (dtype_size(dt) == 4 || d.hd % 2 == 0), StatusCode::kUnimplemented,
                     "attention: head dim %lld (the GPU kernel takes up to %lld, even for 16-bit)", (long long)d.hd,
                     (long long)kMaxHeadDim);
  SB_RETURN_IF_ERROR(u32_count(d.hk * d.cache * d.hd, "attention cache").status());
  SB_CHECK_OR_RETURN(n.window >= 0 && n.window <= INT32_MAX, StatusCode::kUnimplemented, "attention: window %lld",
                     (long long)n.window);
  return Status::ok();
}

// Rope's q/k/v form whose queries only the Attention after it reads, over the caches it appends
// to, at the same position; a one-row step runs as attention_blocks_rope + attention_merge.
Status rope_attention_row(KernelContext& ctx, const fb::RopeNodeT& rn, const fb::AttentionNodeT& an, RopeQkv& r,
                          bool* done) {
  *done = false;
  Runtime& rt = rt_of(ctx);
  if (r.d.m != 1 || !an.seq_major || an.order != fb::AttentionOrder::Blocked32 || r.pos.word == 0) return Status::ok();
  Tensor sinks;
  BufferRef bs = r.bx;  // never read without sinks
  if (an.sinks) {
    SB_ASSIGN_OR_RETURN(bs, bind_in(ctx, an.sinks.get(), &sinks));
  }
  const Tensor q = Tensor::wrap(r.x.dtype(), {r.d.m, r.d.q_heads, r.d.hd}, nullptr, nullptr);  // never computed
  SB_ASSIGN_OR_RETURN(ops::AttentionDims d, ops::attention_dims(q, r.kc.dev, r.vc.dev, an.sinks ? &sinks : nullptr,
                                                                r.pos.value, an.seq_major));
  SB_RETURN_IF_ERROR(attention_supported(an, d, q.dtype()));
  k::AttentionArgs args = attention_args(an, d, r.pos, q.dtype());
  if (use_attention_tiles(d, args)) return Status::ok();
  ctx.guard_dynamic(an.pos.get(), 0, d.cache - d.m);
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(q.dtype(), {d.m, d.hq * d.hd}));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  BlocksRope br;
  br.args.half_dims = r.args.half_dims;
  br.args.eps = r.args.eps;
  br.args.inv_d = r.args.inv_d;
  br.args.rope_flags = r.args.has_norm | r.args.has_k_norm << 1 | r.args.w_dtype << 8 | r.args.kw_dtype << 16;
  br.args.x_heads = static_cast<uint32_t>(r.d.h);
  br.binds = {r.bx, r.bk, r.bv, r.bx, r.pos.words, r.bc, r.bs, r.bqw, r.bkw};
  br.spec = rope_qkv_spec(r);
  SB_RETURN_IF_ERROR(blocked(rt, d, args, {r.bx, r.bk, r.bv, bs, bo, r.pos.words}, &br));
  SB_RETURN_IF_ERROR(rope_qkv_keep(ctx, rn, r));
  *done = true;
  return ctx.out(an.out.get(), std::move(out));
}

}  // namespace

Status rope_attention(KernelContext& ctx, const std::unique_ptr<fb::InstructionT>* ins) {
  const fb::RopeNodeT& rn = *ins[0]->op.AsRopeNode();
  SB_ASSIGN_OR_RETURN(RopeQkv r, rope_qkv_bind(ctx, rn));
  bool done = false;
  SB_RETURN_IF_ERROR(rope_attention_row(ctx, rn, *ins[1]->op.AsAttentionNode(), r, &done));
  if (done) return Status::ok();
  SB_RETURN_IF_ERROR(rope_qkv_run(ctx, rn, r));
  return attention(ctx, ins[1]->op);
}

Status attention(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsAttentionNode();
  Runtime& rt = rt_of(ctx);
  Tensor q, kc, vc, sinks;
  SB_ASSIGN_OR_RETURN(BufferRef bq, bind_in(ctx, n->q.get(), &q));
  SB_ASSIGN_OR_RETURN(BufferRef bk, bind_in(ctx, n->k_cache.get(), &kc));
  SB_ASSIGN_OR_RETURN(BufferRef bv, bind_in(ctx, n->v_cache.get(), &vc));
  BufferRef bs = bq;  // never read without sinks
  if (n->sinks) {
    SB_ASSIGN_OR_RETURN(bs, bind_in(ctx, n->sinks.get(), &sinks));
  }
  // A decode step (one query row) reads its position on the device, so a recorded step replays
  // at any position; longer prefills size their grid by the position (far fewer blocks).
  const bool one_row = q.rank() == 3 && q.dim(0) == 1 && n->order == fb::AttentionOrder::Blocked32;
  DynamicArg pos;
  if (one_row) {
    SB_ASSIGN_OR_RETURN(pos, dynamic_arg(ctx, n->pos.get()));
  } else {
    SB_ASSIGN_OR_RETURN(pos.value, ctx.resolve(n->pos.get()));
    SB_ASSIGN_OR_RETURN(pos.words, dynamic_words(ctx));  // bound, read at word 0 (always 0)
  }
  SB_ASSIGN_OR_RETURN(ops::AttentionDims d,
                      ops::attention_dims(q, kc, vc, n->sinks ? &sinks : nullptr, pos.value, n->seq_major));
  if (one_row) ctx.guard_dynamic(n->pos.get(), 0, d.cache - d.m);
  SB_RETURN_IF_ERROR(attention_supported(*n, d, q.dtype()));
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(q.dtype(), {d.m, d.hq * d.hd}));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  const k::AttentionArgs args = attention_args(*n, d, pos, q.dtype());
  if (n->order == fb::AttentionOrder::Blocked32) {
    if (use_attention_tiles(d, args) && d.m >= kPrefillQ8MinRows) {
      // A prefill's: the output's Q8 blocks too, held for the o-projection (x_q8).
      SB_ASSIGN_OR_RETURN(Q8Blocks q8, alloc_q8(rt, d.m, d.hq * d.hd, rt.int8_mma()));
      SB_RETURN_IF_ERROR(attention_tiles(rt, d, args, {bq, bk, bv, bs, bo, pos.words}, &q8));
      hold_x_q8(ctx, out, bo, std::move(q8));
      return ctx.out(n->out.get(), std::move(out));
    }
    SB_RETURN_IF_ERROR(blocked(rt, d, args, {bq, bk, bv, bs, bo, pos.words}));
    return ctx.out(n->out.get(), std::move(out));
  }
  SB_RETURN_IF_ERROR(attention_decomposed(rt, d, args, {bq, bk, bv, bs, bo}));
  return ctx.out(n->out.get(), std::move(out));
}

void register_attention(KernelRegistry& r) { r.add(fb::OpNode::AttentionNode, attention); }

}  // namespace switchboard::gpu
