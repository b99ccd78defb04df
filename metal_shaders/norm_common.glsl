// What RmsNorm's order Tree32 kernels share (norm.comp, rope.comp, gather_qmm_row.comp include it
// after common.glsl; their sources enable GL_EXT_control_flow_attributes). No kernel here.
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
