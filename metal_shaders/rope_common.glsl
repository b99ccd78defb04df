// Rope's head-row steps, shared by rope.comp (ROPE, ROPE_NORM, ROPE_QKV) and attention.comp
// (ATTENTION_BLOCKS_ROPE, which computes a decode step's rope itself), so both give Rope's bits
// (docs/numerics.md). No kernel here. The includer defines rnd() (rounding to the dtype), HD,
// xin(i) (element i of the rows read), `args` with half_dims, inv_d and eps, and the f32 tables
// cos_t, sin_t [S, half].

// Element e of the head row whose elements start at base, rotated by c and s (the position's
// table entries for e's pair, rounded to the dtype), or x itself past the rotated dims.
float element_rot(uint base, uint e, float c, float s) {
  uint half_dims = args.half_dims;
  if (e >= 2u * half_dims) return xin(base + e);
  uint f = e < half_dims ? e : e - half_dims;
  float x1 = xin(base + f), x2 = xin(base + half_dims + f);
  precise float v;
  if (e < half_dims) {
    precise float a = x1 * c, b = x2 * s;
    v = rnd(a) - rnd(b);
  } else {
    precise float a = x2 * c, b = x1 * s;
    v = rnd(a) + rnd(b);
  }
  return v;
}

// The cos/sin table entry of rotated element e (< 2 half_dims) at position p.
uint table_at(uint e, uint p) {
  uint half_dims = args.half_dims;
  return p * half_dims + (e < half_dims ? e : e - half_dims);
}

// Element e of the head row whose elements start at base, at position p.
float element_at(uint base, uint e, uint p) {
  if (e >= 2u * args.half_dims) return xin(base + e);
  uint t = table_at(e, p);
  return element_rot(base, e, rnd(cos_t[t]), rnd(sin_t[t]));
}

#ifdef SB_ROPE_STAGED
// RmsNorm (order Tree32) of a head row staged in s_x[base, base + HD) (the includer's shared
// array): partial l < 32 of dot32(row, row), elements l, l + 32, ... in order; then, with r
// from sb_tree32_rsqrt, element e as RmsNorm stores it.
float head_partial(uint base, uint l) {
  precise float p = 0.0;
  for (uint e = l; e < HD; e += 32u) p = p + s_x[base + e] * s_x[base + e];
  return p;
}
float head_normalized(float xe, float r, float we) {
  precise float v = (xe * r) * we;
  return rnd(v);
}
#endif
