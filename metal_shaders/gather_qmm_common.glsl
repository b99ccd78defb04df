// What the GatherQmm schedules share (gather_qmm.comp, gather_qmm_row.comp,
// gather_qmm_tile.comp, gather_qmm_mma.comp include it after their variant defines):
// common.glsl, the Q8 steps of one 32-block (q8_params, q8_code: the quantizer, the row
// kernels, qmm_mma4_glu) and the exact integer block dot SB_BLOCK_DOT (qmm, the row
// kernels); glslang drops the functions a kernel does not call. No kernel here: each .comp
// states its kernels' thread -> output mapping and declares its own bindings (their
// layouts differ).
//
// GatherQmm on the integer contract of docs/numerics.md; twin of
// cpu_fallback/gather_qmm.cpp. QUANTIZE makes the Q8 activation blocks, the QMM kernels
// the quantized expert matmul. Integer dots are exact in any order; the float steps
// run in the contract's fixed order.
#include "common.glsl"

// The Q8 steps of docs/numerics.md for one 32-block from the bits of its amax (|x| as
// bits orders non-negative floats, NaN above inf): the scale 2^sh for the codes and
// d = 2^-sh; `zero` when every code is 0 (amax < 2^-100: d = 0; not finite: d = NaN).
void q8_params(uint amax_bits, out float scale, out float d, out bool zero) {
  bool finite = amax_bits <= 0x7f7fffffu;
  zero = !finite || amax_bits < 0x0d800000u;  // 2^-100
  scale = 0.0;
  d = finite ? 0.0 : uintBitsToFloat(0x7fc00000u);
  if (zero) return;
  int sh = 6 - (int(amax_bits >> 23) - 127);
  precise float top = uintBitsToFloat(amax_bits) * sb_pow2i(sh);
  if (sb_gt(sb_round_even(top), 127.0)) --sh;
  scale = sb_pow2i(sh);
  d = sb_pow2i(-sh);
}

int q8_code(float x, float scale) {
  precise float v = x * scale;
  return int(sb_round_even(v));
}

// Exact int dot of a 32-block of codes (exactly `bits` words from CODES[base]) with
// the int8 activation block at word qb (QBUF(w): word w); codes of 2, 4 and 8 bits never
// straddle words. Defined per code and activation buffer (global or shared).
#define SB_BLOCK_DOT(NAME, CODES, QBUF)                                              \
  int NAME(uint base, uint bits, uint qb) {                                          \
    int iq = 0;                                                                      \
    uint mask = (1u << bits) - 1u;                                                   \
    if (bits == 4u || bits == 2u || bits == 8u) {                                    \
      uint per_word = 32u / bits;                                                    \
      for (uint w = 0u; w < bits; ++w) {                                             \
        uint cw = CODES(base + w);                                                   \
        for (uint i = 0u; i < per_word; ++i) {                                       \
          uint idx = w * per_word + i;                                               \
          int xv = bitfieldExtract(int(QBUF(qb + (idx >> 2))), int(8u * (idx & 3u)), 8); \
          iq += int((cw >> (i * bits)) & mask) * xv;                                 \
        }                                                                            \
      }                                                                              \
      return iq;                                                                     \
    }                                                                                \
    for (uint i = 0u; i < 32u; ++i) {                                                \
      uint bit = i * bits;                                                           \
      uint sh = bit & 31u;                                                           \
      uint v = CODES(base + (bit >> 5)) >> sh;                                       \
      if (sh + bits > 32u) v |= CODES(base + (bit >> 5) + 1u) << (32u - sh);         \
      iq += int(v & mask) * bitfieldExtract(int(QBUF(qb + (i >> 2))), int(8u * (i & 3u)), 8); \
    }                                                                                \
    return iq;                                                                       \
  }
