// Attention in order Blocked32 for prefill rows on the GPU (metal_shaders/attention_tiles.comp):
// each tile of 32 query vectors (row, head of one cache head) walks its key blocks in one
// workgroup, the softmax state on chip. attention.cpp sends the prefills it takes here.
#include <algorithm>
#include <cstring>

#include "gpu_gather_qmm.h"
#include "gpu_ops.h"
#include "op_shapes.h"

namespace switchboard::gpu {
namespace {
constexpr uint64_t kTile = SB_ATTENTION_TILE;  // query vectors a workgroup (kernel_args.h)
static_assert(kTile == 32, "attention_tiles.comp's thread mapping covers 32 query vectors a workgroup");
// Query scratch a dispatch may hold; longer prefills go in chunks of rows.
constexpr uint64_t kScratchBytes = 64ull << 20;

}  // namespace

// Prefill rows (the position known at dispatch) with head dims the tiles kernel stages, and
// enough query vectors to fill a tile.
bool use_attention_tiles(const ops::AttentionDims& d, const k::AttentionArgs& args) {
  return args.pos_word == 0 && d.hd % 32 == 0 && d.hd <= 128 && d.hk > 0 &&
         static_cast<uint64_t>(d.m * (d.hq / d.hk)) >= kTile;
}

// The tiles kernel in chunks of rows: bindings q, k, v, sinks, out, dynamic words; each
// workgroup's queries widened into 16 KiB of scratch (a row's bits do not depend on its chunk).
Status attention_tiles(Runtime& rt, const ops::AttentionDims& d, k::AttentionArgs args, const std::vector<BufferRef>& b,
                       const Q8Blocks* q8) {
  const uint64_t group = static_cast<uint64_t>(d.hq / d.hk), hk = static_cast<uint64_t>(d.hk);
  const uint64_t tile_floats = kTile * 32 * 4;
  // Rows a chunk: whole tiles of vectors, the scratch within kScratchBytes.
  const uint64_t max_tiles = std::max<uint64_t>(1, kScratchBytes / 4 / tile_floats / hk);
  const uint64_t chunk =
      std::min<uint64_t>(static_cast<uint64_t>(d.m), std::max<uint64_t>(1, max_tiles * kTile / group));
  const uint64_t tiles_max = (chunk * group + kTile - 1) / kTile;
  SB_ASSIGN_OR_RETURN(Tensor scratch, rt.alloc(DType::kF32, {static_cast<int64_t>(tiles_max * hk * tile_floats)}));
  SB_ASSIGN_OR_RETURN(BufferRef bt, rt.bind(scratch, false));
  for (uint64_t row0 = 0; row0 < static_cast<uint64_t>(d.m); row0 += chunk) {
    const uint64_t rows = std::min<uint64_t>(chunk, static_cast<uint64_t>(d.m) - row0);
    args.row0 = static_cast<uint32_t>(row0);
    args.rows = static_cast<uint32_t>(rows);
    const uint64_t ntiles = (rows * group + kTile - 1) / kTile;
    const SpecConstants spec = dtype_spec({static_cast<DType>(args.dtype)}, {d.hd});
    if (q8) {  // also the output's Q8 blocks (the output stored too: another op may read it)
      k::AttentionQ8Args qa{};
      std::memcpy(&qa, &args, sizeof(args));  // the same fields first (gpu_kernel_table.h)
      qa.q8_permute = q8->permuted ? 1u : 0u;
      qa.q8_store_out = 1u;
      SB_RETURN_IF_ERROR(rt.dispatch("attention_tiles_q8", {b[0], b[1], b[2], b[3], b[4], b[5], bt, q8->bq, q8->bd, q8->bsum},
                                     &qa, sizeof(qa), ntiles * hk * 256, spec));
      continue;
    }
    SB_RETURN_IF_ERROR(rt.dispatch("attention_tiles", {b[0], b[1], b[2], b[3], b[4], b[5], bt}, &args, sizeof(args),
                                   ntiles * hk * 256, spec));
  }
  return Status::ok();
}

}  // namespace switchboard::gpu
