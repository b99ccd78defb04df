// GatherQmm with Intel AMX (AMX-TILE + AMX-INT8) on the repacked 16-row tiles of
// gather_qmm_x86.cpp, for runs of many token rows on one expert (prefill, the
// sorted schedule). One tdpbsud multiplies
//   A = 16 token rows x one 32-block of int8 activations (signed; 16 rows x 32 bytes)
//   B = that block's codes for 16 output rows in the VNNI layout (unsigned; 8 rows
//       x 64 bytes: row i holds k = 4i..4i+3 of each output row, 4 bytes per row)
// into C = 16 x 16 int32: exactly the contract's Iq_j for 16 tokens x 16 output
// rows (|Iq_j| <= 32 * 127 * 255 < 2^31, and integer sums are exact in any order).
// The 8-bit repacked format (also used for 3/5/6-bit) is the B layout already;
// 4-bit and 2-bit blocks are unpacked to one byte per code in a 512-byte scratch
// first. C goes to memory and the float steps are the shared ones of
// gather_qmm_x86_steps.h in the contract's order, so the bits equal every path's.
#if defined(__GNUC__) && !defined(__clang__)
// gcc 12's self-initialized _mm512_undefined_*() trips this once inlined (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "gather_qmm_x86.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include "x86_intrin.h"
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <cstring>
#include <vector>

#include "gather_qmm_x86_steps.h"

namespace switchboard::cpu::x86 {

namespace {

uint64_t read_xcr0() {  // xgetbv, without needing the xsave target
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

bool detect_amx() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return false;  // xgetbv usable
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (!(d & (1u << 24)) || !(d & (1u << 25))) return false;  // EDX: AMX-TILE, AMX-INT8
  constexpr uint64_t kTileState = (uint64_t{1} << 17) | (uint64_t{1} << 18);  // XTILECFG, XTILEDATA
  if ((read_xcr0() & kTileState) != kTileState) return false;
#if defined(__linux__)
  // Linux enables tile data per process, on request (once; later requests succeed too).
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return false;
#endif
  return true;
}

}  // namespace

bool amx_available() {
  static const bool ok = available() && detect_amx();
  return ok;
}

namespace {

constexpr int kTile = 16;
constexpr int kBlockBytes = 8 * 64;  // one 32-block of a 16-row tile as a B tile
constexpr int kPrefetchBlocks = 32;  // as in gather_qmm_x86.cpp

#define SB_AMX __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni")))

// gcc's _tile_loadd and _tile_loadconfig are asm that does not tell the compiler
// which memory it reads. This barrier (taking the pointer, so the buffer counts
// as escaped) lands every earlier store before it and keeps later ones after it.
#define SB_MEMORY_BARRIER(p) __asm__ volatile("" : : "r"(p) : "memory")
#define SB_TILE_LOADD(tile, base, stride) \
  do {                                    \
    SB_MEMORY_BARRIER(base);              \
    _tile_loadd(tile, base, stride);      \
    SB_MEMORY_BARRIER(base);              \
  } while (0)

// Tile registers (literal numbers: the intrinsics paste them into the asm).
// Two blocks are in flight: C = Iq, A = activations, B = codes.
#define SB_TMM_C0 0
#define SB_TMM_C1 1
#define SB_TMM_A0 2
#define SB_TMM_A1 3
#define SB_TMM_B0 4
#define SB_TMM_B1 5

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};  // bytes per row
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "ldtilecfg reads 64 bytes");

TileConfig tile_config() {
  TileConfig c;
  for (int t : {SB_TMM_C0, SB_TMM_C1}) c.rows[t] = kTile, c.colsb[t] = kTile * 4;  // 16 tokens x 16 int32
  for (int t : {SB_TMM_A0, SB_TMM_A1}) c.rows[t] = kTile, c.colsb[t] = kQ8Block;   // 16 tokens x 32 int8
  for (int t : {SB_TMM_B0, SB_TMM_B1}) c.rows[t] = kQ8Block / 4, c.colsb[t] = 64;  // 8 x (16 rows x 4 codes)
  return c;
}

// Block j of one tile's codes as a B tile (8 rows of 64 bytes, stride 64).
// 4-bit chunk c (k0 = 32j + 8c): low nibbles are k0..k0+3 (B row 2c), high
// nibbles k0+4..k0+7 (B row 2c+1). 2-bit chunk c (k0 = 32j + 16c): crumb i is
// k0+4i..k0+4i+3 (B row 4c+i). 8-bit chunk c is B row c as it stands.
template <int FMT>
SB_AMX inline const uint8_t* b_tile(const uint8_t* codes, int64_t j, uint8_t* scratch) {
  if constexpr (FMT == 8) {
    return codes + j * kBlockBytes;
  } else if constexpr (FMT == 4) {
    const __m512i m = _mm512_set1_epi8(0x0F);
    for (int c = 0; c < 4; ++c) {
      const __m512i v = _mm512_load_si512(codes + (j * 4 + c) * 64);
      _mm512_store_si512(scratch + (2 * c) * 64, _mm512_and_si512(v, m));
      _mm512_store_si512(scratch + (2 * c + 1) * 64, _mm512_and_si512(_mm512_srli_epi16(v, 4), m));
    }
    return scratch;
  } else {
    static_assert(FMT == 2, "formats are 2, 4 and 8");
    const __m512i m = _mm512_set1_epi8(0x03);
    for (int c = 0; c < 2; ++c) {
      const __m512i v = _mm512_load_si512(codes + (j * 2 + c) * 64);
      for (int i = 0; i < 4; ++i)
        _mm512_store_si512(scratch + (4 * c + i) * 64, _mm512_and_si512(_mm512_srli_epi16(v, 2 * i), m));
    }
    return scratch;
  }
}

// Token rows, gathered for one group of up to 16 (rows past `count` are zero and never stored).
struct TokenGroup {
  std::vector<int8_t> q;  // [16, K]: the A tiles of block j start at j * 32, stride K
  std::vector<float> d;   // [blocks, 16]
  std::vector<float> xg;  // [groups, 16]
};

void gather_tokens(const Q8Activations& xq, const float* xg, int64_t groups, const int64_t* rows, int64_t count,
                   TokenGroup& tg) {
  const int64_t k = xq.k, nblocks = k / kQ8Block;
  tg.q.resize(static_cast<size_t>(kTile * k));
  tg.d.resize(static_cast<size_t>(nblocks * kTile));
  tg.xg.resize(static_cast<size_t>(groups * kTile));
  for (int64_t m = 0; m < kTile; ++m) {
    const bool real = m < count;
    const int64_t r = real ? rows[m] : 0;
    if (real) std::memcpy(tg.q.data() + m * k, xq.q.data() + r * k, static_cast<size_t>(k));
    else std::memset(tg.q.data() + m * k, 0, static_cast<size_t>(k));
    for (int64_t j = 0; j < nblocks; ++j) tg.d[j * kTile + m] = real ? xq.d[r * nblocks + j] : 0.0f;
    for (int64_t g = 0; g < groups; ++g) tg.xg[g * kTile + m] = real ? xg[r * groups + g] : 0.0f;
  }
}

// Iq of blocks j and j + 1 (if j + 1 < nblocks) for 16 tokens x 16 output rows, into iq[0] and iq[1].
template <int FMT>
SB_AMX inline void block_pair_dots(const uint8_t* codes, const int8_t* a, int64_t k, int64_t j, int64_t nblocks,
                                   uint8_t (*scratch)[kBlockBytes], int32_t (*iq)[kTile][kTile]) {
  const bool two = j + 1 < nblocks;
  for (int h = 0; h < (two ? 2 : 1); ++h)
    _mm_prefetch(reinterpret_cast<const char*>(codes + (j + h + kPrefetchBlocks) * FMT * 64), _MM_HINT_T0);
  const uint8_t* b0 = b_tile<FMT>(codes, j, scratch[0]);
  SB_TILE_LOADD(SB_TMM_A0, a + j * kQ8Block, k);
  SB_TILE_LOADD(SB_TMM_B0, b0, 64);
  _tile_zero(SB_TMM_C0);
  _tile_dpbsud(SB_TMM_C0, SB_TMM_A0, SB_TMM_B0);  // signed A x unsigned B
  if (two) {
    const uint8_t* b1 = b_tile<FMT>(codes, j + 1, scratch[1]);
    SB_TILE_LOADD(SB_TMM_A1, a + (j + 1) * kQ8Block, k);
    SB_TILE_LOADD(SB_TMM_B1, b1, 64);
    _tile_zero(SB_TMM_C1);
    _tile_dpbsud(SB_TMM_C1, SB_TMM_A1, SB_TMM_B1);
  }
  _tile_stored(SB_TMM_C0, iq[0], kTile * 4);
  if (two) _tile_stored(SB_TMM_C1, iq[1], kTile * 4);
}

// One token group against 16-row tiles [tile0, tile1), the whole K; the
// configured tiles are in use. Lane = output row, as in the VNNI path. The
// integer products of the next pair of blocks are issued before the float steps
// of this pair, so the float steps read C stores that have long completed.
// (Plain pointers, not the thread_local group: its address would be looked up
// again after every memory barrier.)
template <int FMT>
SB_AMX void group_tiles(const Repacked& rp, int e, const int8_t* a, const float* dt, const float* xgt, int64_t count,
                        int64_t tile0, int64_t tile1, float* out, int64_t stride) {
  const int64_t k = rp.k, nblocks = k / kQ8Block, per = rp.group_size / kQ8Block;
  const size_t es = dtype_size(rp.scale_dtype);
  const int64_t tile_codes = k * FMT / 8 * kTile;
  const int64_t tile_sb = rp.groups * 2 * kTile * static_cast<int64_t>(es);
  alignas(64) uint8_t scratch[2][kBlockBytes];
  alignas(64) int32_t iq[2][2][kTile][kTile];  // [pair in flight][block of the pair][token][output row]
  for (int64_t tile = tile0; tile < tile1; ++tile) {
    const uint8_t* codes = rp.codes.get() + rp.code_offset[e] + tile * tile_codes;
    const uint8_t* sb = rp.sb.get() + rp.sb_offset[e] + tile * tile_sb;
    __m512 acc[kTile], p[kTile];
    for (int m = 0; m < kTile; ++m) acc[m] = p[m] = _mm512_setzero_ps();
    block_pair_dots<FMT>(codes, a, k, 0, nblocks, scratch, iq[0]);
    for (int64_t j = 0; j < nblocks; j += 2) {
      const int slot = static_cast<int>(j / 2) & 1;
      if (j + 2 < nblocks) block_pair_dots<FMT>(codes, a, k, j + 2, nblocks, scratch, iq[slot ^ 1]);
      // The contract's float steps, blocks in ascending order, group by group.
      for (int64_t jj = j; jj < std::min(j + 2, nblocks); ++jj) {
        const float* d = dt + jj * kTile;
        for (int m = 0; m < kTile; ++m)
          p[m] = steps::block_step(p[m], _mm512_load_si512(iq[slot][jj - j][m]), _mm512_set1_ps(d[m]));
        if ((jj + 1) % per != 0) continue;
        const int64_t g = jj / per;
        const uint8_t* gsb = sb + g * 2 * kTile * es;
        const __m512 s = steps::load16(gsb, rp.scale_dtype), b = steps::load16(gsb + kTile * es, rp.scale_dtype);
        const float* x = xgt + g * kTile;
        for (int m = 0; m < kTile; ++m) {
          acc[m] = steps::group_step(acc[m], s, b, p[m], _mm512_set1_ps(x[m]));
          p[m] = _mm512_setzero_ps();
        }
      }
    }
    const int64_t n0 = tile * kTile, valid = std::min<int64_t>(kTile, rp.n - n0);
    const __mmask16 keep = static_cast<__mmask16>((1u << valid) - 1);
    for (int64_t m = 0; m < count; ++m) _mm512_mask_storeu_ps(out + m * stride + (n0 - tile0 * kTile), keep, acc[m]);
  }
}

// Rows [0, n) in groups of 16 (the last one may be partial), tiles configured once.
template <int FMT>
SB_AMX void amx_rows(const Repacked& rp, int e, const Q8Activations& xq, const float* xg, const int64_t* rows,
                     int64_t n, int64_t tile0, int64_t tile1, float* out, int64_t stride) {
  static thread_local TokenGroup tg;
  const TileConfig cfg = tile_config();
  SB_MEMORY_BARRIER(&cfg);
  _tile_loadconfig(&cfg);
  for (int64_t i = 0; i < n; i += kTile) {
    const int64_t count = std::min<int64_t>(kTile, n - i);
    gather_tokens(xq, xg, rp.groups, rows + i, count, tg);
    group_tiles<FMT>(rp, e, tg.q.data(), tg.d.data(), tg.xg.data(), count, tile0, tile1, out + i * stride, stride);
  }
  _tile_release();
}

#undef SB_AMX

}  // namespace

void qmm_tiles_amx(const Repacked& r, int e, const Q8Activations& xq, const float* xg, const int64_t* rows,
                   int64_t count, int64_t tile0, int64_t tile1, float* out, int64_t out_stride) {
  // Whole groups of 16, plus a last partial group if it has kAmxMinRows rows or more.
  const int64_t tail = count % kTile, amx = count - tail + (tail >= kAmxMinRows ? tail : 0);
  if (amx > 0) {
    switch (r.format[e]) {
      case 4: amx_rows<4>(r, e, xq, xg, rows, amx, tile0, tile1, out, out_stride); break;
      case 2: amx_rows<2>(r, e, xq, xg, rows, amx, tile0, tile1, out, out_stride); break;
      case 8: amx_rows<8>(r, e, xq, xg, rows, amx, tile0, tile1, out, out_stride); break;
      default: return;
    }
  }
  if (amx < count) qmm_tiles(r, e, xq, xg, rows + amx, count - amx, tile0, tile1, out + amx * out_stride, out_stride);
}

}  // namespace switchboard::cpu::x86

#else  // not x86-64: no AMX; callers check amx_available() first.

namespace switchboard::cpu::x86 {
bool amx_available() { return false; }
void qmm_tiles_amx(const Repacked&, int, const Q8Activations&, const float*, const int64_t*, int64_t, int64_t, int64_t,
                   float*, int64_t) {}
}  // namespace switchboard::cpu::x86

#endif
