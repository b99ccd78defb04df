// What RmsNorm's order Tree32 kernels share (norm.comp, rope.comp, gather_qmm_row.comp and
// matmul.comp include it after common.glsl; their sources enable GL_EXT_control_flow_attributes).
// No kernel here.
// RmsNorm's r in order Tree32 (docs/numerics.md) from the 32 dot32 partials of the sum of
// squares: the halving tree 16..1, ms = ss * inv_d + eps, rsqrt.
float sb_tree32_rsqrt(float part[32], float inv_d, float eps) {
  precise float p[32];
  [[unroll]] for (uint l = 0u; l < 32u; ++l) p[l] = part[l];
  [[unroll]] for (uint h = 16u; h >= 1u; h >>= 1u) {
    [[unroll]] for (uint l = 0u; l < h; ++l) p[l] = p[l] + p[l + h];
  }
  precise float ms = p[0] * inv_d + eps;
  return sb_rsqrt(ms);
}

// Elements [e, e + 8) of a row of dtype DT (e a multiple of 8) from one 16-byte load (f16, bf16)
// or two (f32): every workgroup of a decode projection reads the same row, and element-wise loads
// made that row's staging a large part of the dispatch. NAME(e, v) reads BUF4 (uvec4[]).
#define SB_LOAD_UNIT(NAME, BUF4, DT)                                                  \
  void NAME(uint e, out float v[8]) {                                                 \
    if (sb_is16(DT)) {                                                                \
      uvec4 w = BUF4[e >> 3u];                                                        \
      [[unroll]] for (uint i = 0u; i < 8u; ++i) v[i] = sb_decode(w[i >> 1u], DT, i);  \
    } else {                                                                          \
      uvec4 a = BUF4[e >> 2u], b = BUF4[(e >> 2u) + 1u];                              \
      [[unroll]] for (uint i = 0u; i < 4u; ++i) {                                     \
        v[i] = uintBitsToFloat(a[i]);                                                 \
        v[i + 4u] = uintBitsToFloat(b[i]);                                            \
      }                                                                               \
    }                                                                                 \
  }
// Elements [e, e + 8) of a norm output row into BUF4 (uvec4[]), in dtype DT (the encoding rounds).
#define SB_STORE_UNIT(BUF4, e, v, DT)                                                            \
  if (sb_is16(DT)) {                                                                             \
    BUF4[(e) >> 3u] = uvec4(sb_encode_word(v[0], v[1], DT), sb_encode_word(v[2], v[3], DT),       \
                            sb_encode_word(v[4], v[5], DT), sb_encode_word(v[6], v[7], DT));      \
  } else {                                                                                       \
    BUF4[(e) >> 2u] = floatBitsToUint(vec4(v[0], v[1], v[2], v[3]));                            \
    BUF4[((e) >> 2u) + 1u] = floatBitsToUint(vec4(v[4], v[5], v[6], v[7]));                     \
  }
