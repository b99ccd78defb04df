#include "gather_qmm_x86.h"

#if defined(__x86_64__)
#include "x86_intrin.h"
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

#include "cpu_common.h"
#include "gather_qmm_x86_steps.h"
#include "quantize.h"

namespace switchboard::cpu::x86 {

bool available() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vnni");
  return ok;
}

double repacked_bytes_per_weight(int format) { return format / 8.0; }

namespace {

constexpr int kTile = 16;
constexpr int kPrefetchBlocks = 32;  // how far ahead (in 32-blocks) software prefetch reaches

// Weight buffers are streamed once per token: 2 MiB pages cut the TLB misses of
// jumping between experts (transparent huge pages, where the kernel allows them).
std::shared_ptr<uint8_t> aligned_bytes(size_t n) {
  const size_t huge = size_t{2} << 20;
  const bool big = n >= huge;
  const size_t align = big ? huge : 64, size = (n + align - 1) / align * align;
  void* p = std::aligned_alloc(align, size);
  if (p && big) madvise(p, size, MADV_HUGEPAGE);
  if (p) std::memset(p, 0, n);
  return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [](uint8_t* q) { std::free(q); });
}

int format_for(int bits) { return bits == 0 ? 0 : bits == 2 ? 2 : bits == 4 ? 4 : 8; }

// Writes expert e's codes in the tile layout at dst.
void repack_codes(const ExpertTable& t, int e, int fmt, int64_t tiles, uint8_t* dst) {
  const int bits = t.bits[e];
  const int64_t words = t.k * bits / 32;
  const int64_t k_per_chunk = fmt == 4 ? 8 : fmt == 2 ? 16 : 4;
  const int64_t chunks = t.k / k_per_chunk;
  for (int64_t tile = 0; tile < tiles; ++tile)
    for (int64_t c = 0; c < chunks; ++c) {
      uint8_t* out = dst + (tile * chunks + c) * 64;
      for (int lane = 0; lane < kTile; ++lane) {
        const int64_t n = tile * kTile + lane;
        if (n >= t.n) continue;  // padding rows keep code 0 and scale 0
        const uint32_t* row = t.codes + t.word_offset[e] + n * words;
        const int64_t k0 = c * k_per_chunk;
        if (bits == fmt) {  // the chunk is exactly one aligned source word: shuffle its fields
          const uint32_t word = row[k0 * bits / 32];
          for (int b = 0; b < 4; ++b) {
            uint32_t v = 0;
            if (fmt == 4) v = ((word >> (4 * b)) & 0xF) | (((word >> (4 * (b + 4))) & 0xF) << 4);
            else if (fmt == 2)
              for (int i = 0; i < 4; ++i) v |= ((word >> (2 * (4 * i + b))) & 3) << (2 * i);
            else v = (word >> (8 * b)) & 0xFF;
            out[lane * 4 + b] = static_cast<uint8_t>(v);
          }
          continue;
        }
        for (int b = 0; b < 4; ++b) {
          uint32_t v;
          if (fmt == 4) v = unpack_code(row, k0 + b, bits) | (unpack_code(row, k0 + 4 + b, bits) << 4);
          else if (fmt == 2) {
            v = 0;
            for (int i = 0; i < 4; ++i) v |= unpack_code(row, k0 + 4 * i + b, bits) << (2 * i);
          } else {
            v = unpack_code(row, k0 + b, bits);
          }
          out[lane * 4 + b] = static_cast<uint8_t>(v);
        }
      }
    }
}

// Scales then biases of each (tile, group): 16 values each, in the source dtype.
void repack_sb(const ExpertTable& t, int e, int64_t tiles, uint8_t* dst) {
  const size_t es = dtype_size(t.scale_dtype);
  for (int64_t tile = 0; tile < tiles; ++tile)
    for (int64_t g = 0; g < t.groups; ++g) {
      uint8_t* out = dst + (tile * t.groups + g) * 2 * kTile * es;
      for (int lane = 0; lane < kTile; ++lane) {
        const int64_t n = tile * kTile + lane;
        if (n >= t.n) continue;
        const int64_t src = ((static_cast<int64_t>(e) * t.n + n) * t.groups + g) * static_cast<int64_t>(es);
        std::memcpy(out + lane * es, static_cast<const uint8_t*>(t.scales) + src, es);
        std::memcpy(out + (kTile + lane) * es, static_cast<const uint8_t*>(t.biases) + src, es);
      }
    }
}

}  // namespace

std::shared_ptr<const Repacked> repack(const ExpertTable& t, std::vector<Tensor> sources) {
  auto r = std::make_shared<Repacked>();
  r->sources = std::move(sources);
  r->n = t.n;
  r->k = t.k;
  r->groups = t.groups;
  r->group_size = t.group_size;
  r->tiles = (t.n + kTile - 1) / kTile;
  r->scale_dtype = t.scale_dtype;
  int64_t code_bytes = 0, sb_bytes = 0;
  const int64_t sb_per_expert = r->tiles * t.groups * 2 * kTile * static_cast<int64_t>(dtype_size(t.scale_dtype));
  for (size_t e = 0; e < t.bits.size(); ++e) {
    int fmt = format_for(t.bits[e]);
    r->format.push_back(fmt);
    r->code_offset.push_back(code_bytes);
    r->sb_offset.push_back(sb_bytes);
    if (fmt) {
      code_bytes += r->tiles * kTile * t.k * fmt / 8;
      sb_bytes += sb_per_expert;
    }
  }
  r->codes = aligned_bytes(static_cast<size_t>(code_bytes));
  r->sb = aligned_bytes(static_cast<size_t>(sb_bytes));
  if (!r->codes || !r->sb) return nullptr;
  for (size_t e = 0; e < t.bits.size(); ++e) {
    if (!r->format[e]) continue;
    repack_codes(t, static_cast<int>(e), r->format[e], r->tiles, r->codes.get() + r->code_offset[e]);
    repack_sb(t, static_cast<int>(e), r->tiles, r->sb.get() + r->sb_offset[e]);
  }
  return r;
}

namespace {

// vpdpbusd takes the broadcast straight from memory ({1to16}).
typedef int32_t unaligned_i32 __attribute__((aligned(1), may_alias));
__attribute__((target("avx512f"))) inline __m512i bcast4(const int8_t* p) {
  return _mm512_set1_epi32(*reinterpret_cast<const unaligned_i32*>(p));
}

// Integer dots of one 32-block, for TT tiles x R token rows, into iacc[t][r].
// Codes are masked in place (a high nibble masked with 0xF0 is 16x its value),
// each bit position gets its own accumulator, and the accumulators are shifted
// back and added at the end: integer sums are exact in any order, so this is
// the contract's Iq_j exactly.
template <int FMT, int TT, int R>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) inline void block_dots(const uint8_t* const* codes,
                                                                                const int8_t* const* xq, int64_t j,
                                                                                __m512i (*iacc)[R]) {
  constexpr int kParts = FMT == 4 ? 2 : FMT == 2 ? 4 : 1;  // fields per code byte
  constexpr int kChunks = 8 / kParts;                      // 64-byte loads per block: 4 (4-bit), 2 (2-bit), 8 (8-bit)
  __m512i part[TT][R][kParts];
  for (int t = 0; t < TT; ++t)
    for (int r = 0; r < R; ++r)
      for (int q = 0; q < kParts; ++q) part[t][r][q] = _mm512_setzero_si512();
  for (int c = 0; c < kChunks; ++c) {
    const int64_t k = j * 32 + c * 4 * kParts;
    __m512i x[R][kParts];
    for (int r = 0; r < R; ++r)
      for (int q = 0; q < kParts; ++q) x[r][q] = bcast4(xq[r] + k + 4 * q);
    for (int t = 0; t < TT; ++t) {
      const __m512i v = _mm512_load_si512(codes[t] + (j * kChunks + c) * 64);
      for (int q = 0; q < kParts; ++q) {
        const __m512i w = kParts == 1 ? v : _mm512_and_si512(v, _mm512_set1_epi8(static_cast<char>(((1 << FMT) - 1) << (FMT * q))));
        for (int r = 0; r < R; ++r) part[t][r][q] = _mm512_dpbusd_epi32(part[t][r][q], w, x[r][q]);
      }
    }
  }
  for (int t = 0; t < TT; ++t)
    for (int r = 0; r < R; ++r) {
      __m512i sum = part[t][r][0];
      for (int q = 1; q < kParts; ++q) sum = _mm512_add_epi32(sum, _mm512_srai_epi32(part[t][r][q], FMT * q));
      iacc[t][r] = sum;
    }
}

// TT 16-row tiles x R token rows, the whole K: the contract's float steps, lane = output row.
template <int FMT, int TT, int R>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void tile_rows(const Repacked& rp, const uint8_t* const* codes,
                                                                       const uint8_t* const* sb, const Q8Activations& xq,
                                                                       const float* xg, const int64_t* rows,
                                                                       float (*out)[R][kTile]) {
  const int64_t blocks_per_group = rp.group_size / kQ8Block, nblocks = rp.k / kQ8Block;
  const size_t es = dtype_size(rp.scale_dtype);
  const int8_t* xr[R];
  const float* dr[R];
  for (int r = 0; r < R; ++r) {
    xr[r] = xq.q.data() + rows[r] * xq.k;
    dr[r] = xq.d.data() + rows[r] * nblocks;
  }
  __m512 acc[TT][R];
  for (int t = 0; t < TT; ++t)
    for (int r = 0; r < R; ++r) acc[t][r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < rp.groups; ++g) {
    __m512 p[TT][R];
    for (int t = 0; t < TT; ++t)
      for (int r = 0; r < R; ++r) p[t][r] = _mm512_setzero_ps();
    for (int64_t j = g * blocks_per_group; j < (g + 1) * blocks_per_group; ++j) {
      // Weights stream from DRAM once: ask for them a few blocks ahead.
      for (int t = 0; t < TT; ++t)
        _mm_prefetch(reinterpret_cast<const char*>(codes[t] + (j + kPrefetchBlocks) * FMT * 64), _MM_HINT_T0);
      __m512i iacc[TT][R];
      block_dots<FMT, TT, R>(codes, xr, j, iacc);
      for (int r = 0; r < R; ++r) {
        const __m512 d = _mm512_set1_ps(dr[r][j]);
        for (int t = 0; t < TT; ++t) p[t][r] = steps::block_step(p[t][r], iacc[t][r], d);
      }
    }
    for (int t = 0; t < TT; ++t) {
      const uint8_t* gsb = sb[t] + g * 2 * kTile * es;
      const __m512 s = steps::load16(gsb, rp.scale_dtype), b = steps::load16(gsb + kTile * es, rp.scale_dtype);
      for (int r = 0; r < R; ++r)
        acc[t][r] = steps::group_step(acc[t][r], s, b, p[t][r], _mm512_set1_ps(xg[rows[r] * rp.groups + g]));
    }
  }
  for (int t = 0; t < TT; ++t)
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(out[t][r], acc[t][r]);
}

// Runs one kernel instance over TT tiles starting at `tile` for R rows, copying valid outputs.
template <int FMT, int TT, int R>
void run_tiles(const Repacked& rp, int e, const Q8Activations& xq, const float* xg, const int64_t* rows, int64_t tile,
               int64_t tile0, float* out, int64_t stride) {
  const int64_t tile_codes = rp.k * FMT / 8 * kTile;
  const int64_t tile_sb = rp.groups * 2 * kTile * static_cast<int64_t>(dtype_size(rp.scale_dtype));
  const uint8_t* codes[TT];
  const uint8_t* sb[TT];
  for (int t = 0; t < TT; ++t) {
    codes[t] = rp.codes.get() + rp.code_offset[e] + (tile + t) * tile_codes;
    sb[t] = rp.sb.get() + rp.sb_offset[e] + (tile + t) * tile_sb;
  }
  alignas(64) float tmp[TT][R][kTile];
  tile_rows<FMT, TT, R>(rp, codes, sb, xq, xg, rows, tmp);
  for (int t = 0; t < TT; ++t) {
    const int64_t n0 = (tile + t) * kTile, valid = std::min<int64_t>(kTile, rp.n - n0);
    for (int r = 0; r < R; ++r)
      std::memcpy(out + r * stride + (n0 - tile0 * kTile), tmp[t][r], static_cast<size_t>(valid) * 4);
  }
}

template <int FMT>
void tiles_for_format(const Repacked& rp, int e, const Q8Activations& xq, const float* xg, const int64_t* rows,
                      int64_t count, int64_t tile0, int64_t tile1, float* out, int64_t stride) {
  int64_t i = 0;
  // Four rows at a time share each weight load; single rows take four tiles per pass instead.
  for (; i + 4 <= count; i += 4)
    for (int64_t tile = tile0; tile < tile1; ++tile)
      run_tiles<FMT, 1, 4>(rp, e, xq, xg, rows + i, tile, tile0, out + i * stride, stride);
  for (; i < count; ++i) {
    int64_t tile = tile0;
    for (; tile + 4 <= tile1; tile += 4) run_tiles<FMT, 4, 1>(rp, e, xq, xg, rows + i, tile, tile0, out + i * stride, stride);
    for (; tile < tile1; ++tile) run_tiles<FMT, 1, 1>(rp, e, xq, xg, rows + i, tile, tile0, out + i * stride, stride);
  }
}

}  // namespace

void qmm_tiles(const Repacked& r, int e, const Q8Activations& xq, const float* xg, const int64_t* rows, int64_t count,
               int64_t tile0, int64_t tile1, float* out, int64_t out_stride) {
  switch (r.format[e]) {
    case 4: tiles_for_format<4>(r, e, xq, xg, rows, count, tile0, tile1, out, out_stride); break;
    case 2: tiles_for_format<2>(r, e, xq, xg, rows, count, tile0, tile1, out, out_stride); break;
    case 8: tiles_for_format<8>(r, e, xq, xg, rows, count, tile0, tile1, out, out_stride); break;
    default: break;
  }
}

}  // namespace switchboard::cpu::x86

#else  // not x86-64: no fast path; callers check available() first.

namespace switchboard::cpu::x86 {
bool available() { return false; }
double repacked_bytes_per_weight(int format) { return format / 8.0; }
std::shared_ptr<const Repacked> repack(const ExpertTable&, std::vector<Tensor>) { return nullptr; }
void qmm_tiles(const Repacked&, int, const Q8Activations&, const float*, const int64_t*, int64_t, int64_t, int64_t,
               float*, int64_t) {}
}  // namespace switchboard::cpu::x86

#endif
