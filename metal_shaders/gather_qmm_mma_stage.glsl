// stage_block of gather_qmm_mma.comp (included where it stands there; s_b and s_raw are its).
// A block's 32 codes of `bits` bits, from words w[0..bits), as 8 words of int8 at
// s_b[dst]. Register arrays take constant indices only (a dynamically indexed one
// lives in local memory on NVIDIA); the rare widths go through shared memory, in a
// loop kept rolled (unrolled, it doubled the binary and missed in the instruction cache).
void stage_block(uint bits, uint w[8], uint dst) {
#ifdef SB_MMA_BITS4
  // The K order inside each 8-code word is permuted to 0, 2, 4, 6, 1, 3, 5, 7 on both
  // sides (quantize_q8 wrote x so): an exact integer dot does not depend on the order.
  [[unroll]] for (uint i = 0u; i < 4u; ++i) {
    s_b[dst + 2u * i] = w[i] & 0x0f0f0f0fu;
    s_b[dst + 2u * i + 1u] = (w[i] >> 4u) & 0x0f0f0f0fu;
  }
#else
  if (bits == 4u) {
    [[unroll]] for (uint i = 0u; i < 4u; ++i) {
      uint a = w[i] & 0x0f0f0f0fu, c = (w[i] >> 4u) & 0x0f0f0f0fu;  // codes 0,2,4,6 and 1,3,5,7
      s_b[dst + 2u * i] = (a & 0xffu) | ((c & 0xffu) << 8u) | ((a & 0xff00u) << 8u) | ((c & 0xff00u) << 16u);
      s_b[dst + 2u * i + 1u] = ((a >> 16u) & 0xffu) | ((c >> 8u) & 0xff00u) | ((a >> 8u) & 0xff0000u) | (c & 0xff000000u);
    }
    return;
  }
  if (bits == 8u) {
    [[unroll]] for (uint i = 0u; i < 8u; ++i) s_b[dst + i] = w[i] ^ 0x80808080u;  // q - 128 as int8
    return;
  }
  uint raw = gl_LocalInvocationID.x * 8u;
  [[unroll]] for (uint i = 0u; i < 8u; ++i) s_raw[raw + i] = w[i];
  [[dont_unroll]] for (uint o = 0u; o < 8u; ++o) {
    uint word = 0u;
    for (uint k = 0u; k < 4u; ++k) {
      uint bit = (4u * o + k) * bits, sh = bit & 31u, wi = bit >> 5u;
      uint v = s_raw[raw + wi] >> sh;
      if (sh + bits > 32u) v |= s_raw[raw + wi + 1u] << (32u - sh);
      word |= (v & ((1u << bits) - 1u)) << (8u * k);
    }
    s_b[dst + o] = word;
  }
#endif
}
