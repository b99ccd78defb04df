// GatherQmm's sorted schedule on the GPU (metal_shaders/gather_qmm_tile.comp): a work list
// of runs of one expert's pairs (qmm_tiles), then output tiles of 32 (qmm_tile) or 64
// (qmm_mma on int8 tensor cores) pairs x 64 columns that read each weight once per tile.
#include <algorithm>

#include "gpu_gather_qmm.h"

namespace switchboard::gpu {
namespace {

// Sorted pairs (or pairs without rhs) from this many on, and with rhs at least
// kQmmTilePairsPerExpert per expert on average, take the tiled kernel (qmm_tile): weights
// read once per tile of 32 pairs instead of once per pair. Below that its tiles run mostly
// empty and lose to qmm (the crossover: bench/RESULTS.md).
constexpr int64_t kQmmTileMinPairs = 64;
constexpr int64_t kQmmTilePairsPerExpert = 4;
// On the int8 MMA kernels the tiles beat the row kernels sooner (a short prompt): rows without
// rhs from 16 on, sorted pairs from one per expert on average (bench/RESULTS.md, the
// thirtieth session).
constexpr int64_t kMmaDenseMinRows = 16;
constexpr int64_t kMmaPairsPerExpert = 1;
// Pairs without rhs (dense projections) take the MMA kernels' 64-pair tiles when that still
// makes this many workgroups, else 32-pair ones: fewer than about two per SM of an H100 or
// H200 leave SMs idle (bench/RESULTS.md, the twenty-fifth session).
constexpr uint64_t kMmaWideTileMinWorkgroups = 256;

}  // namespace

bool qmm_tiled(const QmmSetup& q) {
  const bool mma_dense = q.mma && !q.rhs.defined();
  const int64_t per_expert = q.mma ? kMmaPairsPerExpert : kQmmTilePairsPerExpert;
  return q.pairs >= (mma_dense ? kMmaDenseMinRows : kQmmTileMinPairs) &&
         (q.rhs.defined() ? q.sorted != 0 && q.pairs >= per_expert * q.experts : true) &&
         (q.x.dtype() == DType::kF32 || q.nout % 2 == 0);
}

Result<QmmTileList> qmm_tile_list(Runtime& rt, QmmSetup& q) {
  QmmTileList t;
  const bool mma = std::strncmp(qmm_tile_kernel(rt, q), "qmm_mma", 7) == 0;
  t.tile_pairs = mma ? SB_QMM_MMA_PAIRS : SB_QMM_TILE_PAIRS;
  if (!q.rhs.defined()) {
    const auto tiles = [&](uint64_t tp) { return (static_cast<uint64_t>(q.pairs) + tp - 1) / tp; };
    if (mma && tiles(SB_QMM_MMA_PAIRS) * ((q.nout + 63) / 64) < kMmaWideTileMinWorkgroups)
      t.tile_pairs = SB_QMM_TILE_PAIRS;
    t.max_tiles = static_cast<int64_t>(tiles(t.tile_pairs));
    t.bt = q.bi;  // bound for the kernels' layout, not read
    return t;
  }
  t.max_tiles = q.pairs / t.tile_pairs + std::min(q.experts, q.pairs);
  SB_RETURN_IF_ERROR(u32_count(1 + 3 * t.max_tiles, "GatherQmm tiles").status());
  SB_ASSIGN_OR_RETURN(t.bt, rt.scratch(static_cast<size_t>(1 + 3 * t.max_tiles) * 4, 0));
  k::QmmArgs args = q.args;
  args.tiles = static_cast<uint32_t>(t.max_tiles);
  args.per_wg = t.tile_pairs;
  SB_RETURN_IF_ERROR(rt.dispatch("qmm_tiles", {q.br, q.bi, t.bt, rt.error_word()}, &args, sizeof(args), 256));
  return t;
}

}  // namespace switchboard::gpu
