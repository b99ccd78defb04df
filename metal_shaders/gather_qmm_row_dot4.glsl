// The *_DOT4 variants' own parts of gather_qmm_row.comp (no kernel here: its thread ->
// output mapping is at the top of gather_qmm_row.comp, which includes this after its
// bindings and shared arrays): the OpSDot declaration, the specialization constants for
// the dtypes and Glu kind, the 4-bit block dot on packed int8 dot products and the group
// term SB_ROW_TERM. The plain row kernels' versions are in gather_qmm_row.comp.
#extension GL_EXT_spirv_intrinsics : require
// OpSDot (4450) with PackedVectorFormat4x8Bit (0): the exact int32 sum of 4 int8 products.
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sb_sdot4x8(uint a, uint b, spirv_literal int packed_format);

// Specialization constants (Vulkan only, like these kernels): the host sets them to the
// dispatch's dtypes and Glu kind, so the driver builds only that path (half the machine
// code, and faster). ~0u: the push constant decides.
layout(constant_id = 0) const uint kSpecXDtype = 0xffffffffu;
layout(constant_id = 1) const uint kSpecOutDtype = 0xffffffffu;
layout(constant_id = 2) const uint kSpecScaleDtype = 0xffffffffu;
layout(constant_id = 3) const uint kSpecGluKind = 0xffffffffu;
// The group size too: with it constant a group's block loop unrolls, and the driver issues
// the term's scale and bias loads with its code loads (in a loop it sank them past the
// loop: a second memory round trip per task).
layout(constant_id = 4) const uint kSpecGroupSize = 0xffffffffu;
// qmm_row_norm_2k_dot4: the norm weights' dtype (their decode without branches, so their
// loads go out together: one round trip, not eight).
layout(constant_id = 5) const uint kSpecNormWDtype = 0xffffffffu;
#define X_DTYPE SB_SPEC(kSpecXDtype, args.x_dtype)
#define OUT_DTYPE SB_SPEC(kSpecOutDtype, args.out_dtype)
#define SCALE_DTYPE SB_SPEC(kSpecScaleDtype, args.scale_dtype)
#define GLU_KIND SB_SPEC(kSpecGluKind, args.glu_kind)
#define GROUP_SIZE SB_SPEC(kSpecGroupSize, args.group_size)
#define NORM_W_DTYPE SB_SPEC(kSpecNormWDtype, args.w_dtype)

// x's codes are staged in the permuted order 0, 2, 4, 6 | 1, 3, 5, 7 of each 8: a code
// word's even nibbles (masked) and odd nibbles (shifted, masked) are packed int8x4 that
// line up with its two staged words (codes 0..15 read the same as signed bytes).
int dot4_word(uint c, uint xa, uint xb) {
  return sb_sdot4x8(c & 0x0f0f0f0fu, xa, 0) + sb_sdot4x8((c >> 4u) & 0x0f0f0f0fu, xb, 0);
}
int dot4_block(uvec4 cw, uint qb) {
  uvec4 x0 = s_q4[qb >> 2u], x1 = s_q4[(qb >> 2u) + 1u];  // qb is a multiple of 8: two 16-byte loads
  int iq = 0;
  iq += dot4_word(cw[0], x0.x, x0.y);
  iq += dot4_word(cw[1], x0.z, x0.w);
  iq += dot4_word(cw[2], x1.x, x1.y);
  iq += dot4_word(cw[3], x1.z, x1.w);
  return iq;
}

// Group g's term s*P + b*X of output column n0 + oi of expert ex (row words from wbase;
// every expert is 4-bit, so rows are whole 16-byte units: the host checks). Its blocks
// are loaded two at a time before either is used, so their memory latencies overlap.
#define SB_ROW_TERM(NAME, CODES, SCALES, BIASES, DOT, DOT4)                                          \
  float NAME(uint ex, uint n0, uint oi, uint g, uint wbase, uint bits) {                             \
    uint per_group = GROUP_SIZE / 32u, j0 = g * per_group;                                           \
    uint sidx = (ex * args.n + n0 + oi) * args.groups + g;                                           \
    float sc = SB_LOAD(SCALES, SCALE_DTYPE, sidx);                                                   \
    float bc = SB_LOAD(BIASES, SCALE_DTYPE, sidx);                                                   \
    uint row4 = (wbase + oi * (args.k / 8u)) >> 2u;                                                  \
    precise float pg = 0.0, xg = 0.0;                                                                \
    for (uint i = 0u; i < per_group; i += 2u) { /* a constant trip count where specialized */        \
      uint j = j0 + i;                                                                               \
      bool two = i + 1u < per_group;                                                                 \
      uvec4 c0 = CODES[row4 + j], c1 = two ? CODES[row4 + j + 1u] : uvec4(0u);                       \
      int iq0 = dot4_block(c0, j * 8u), iq1 = dot4_block(c1, j * 8u + 8u);                           \
      float d0 = s_d[j];                                                                             \
      pg = pg + float(iq0) * d0;                                                                     \
      xg = xg + float(s_sum[j]) * d0;                                                                \
      if (two) {                                                                                     \
        float d1 = s_d[j + 1u];                                                                      \
        pg = pg + float(iq1) * d1;                                                                   \
        xg = xg + float(s_sum[j + 1u]) * d1;                                                         \
      }                                                                                              \
    }                                                                                                \
    precise float term = sc * pg + bc * xg;                                                          \
    return term;                                                                                     \
  }
