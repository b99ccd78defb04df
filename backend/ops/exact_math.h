// Deterministic f32 math built only from +, -, * (each rounded to nearest even,
// never contracted), integer bit operations and comparisons. The shaders carry
// the same sequences (metal_shaders/exact_math.glsl), so every device returns
// the same bits. docs/numerics.md states each routine's steps and accuracy.
#pragma once

#include <cstdint>

#include "switchboard/dtype.h"

namespace switchboard::exact {

inline constexpr float kInf = __builtin_inff();

// Round to nearest integer, ties to even, for |v| < 2^22: adding 1.5 * 2^23
// pushes the fraction out of the mantissa under round-to-nearest-even.
inline float round_even(float v) {
  const float magic = 12582912.0f;
  return (v + magic) - magic;
}

// 2^n for n in [-126, 127], built from the exponent bits.
inline float pow2i(int n) { return f32_from_bits(static_cast<uint32_t>(n + 127) << 23); }

// e^x. x > 88 -> +inf, x < -87 -> +0, NaN -> NaN. Otherwise n = round(x log2 e),
// r = x - n ln2 (Cody-Waite, two steps), e^r by a degree-6 Taylor polynomial in
// Horner form, times 2^n. Max error about 3 ulp.
inline float exp(float x) {
  if (x != x) return x;
  if (x > 88.0f) return kInf;
  if (x < -87.0f) return 0.0f;
  const float n = round_even(x * 1.44269504f);
  float r = x - n * 0.693145751953125f;  // ln2 high part: exact product for |n| <= 128
  r = r - n * 1.42860677e-06f;           // ln2 low part
  float p = 1.38888889e-03f;             // 1/720
  p = p * r + 8.33333333e-03f;           // 1/120
  p = p * r + 4.16666667e-02f;           // 1/24
  p = p * r + 1.66666667e-01f;           // 1/6
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return p * pow2i(static_cast<int>(n));
}

// exp of n values, y[i] = exp(x[i]) bit for bit, without branches so the compiler can run
// several lanes at once (attention's exps of a key block).
inline void exp_n(const float* x, float* y, int n) {
  for (int i = 0; i < n; ++i) {
    const float v = x[i];
    const float c = v > 88.0f ? 88.0f : (v < -87.0f ? -87.0f : v);  // NaN stays NaN
    const float k = round_even(c * 1.44269504f);
    float r = c - k * 0.693145751953125f;
    r = r - k * 1.42860677e-06f;
    float p = 1.38888889e-03f;
    p = p * r + 8.33333333e-03f;
    p = p * r + 4.16666667e-02f;
    p = p * r + 1.66666667e-01f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int ki = v == v ? static_cast<int>(k) : 0;
    const float e = p * f32_from_bits(static_cast<uint32_t>(ki + 127) << 23);
    y[i] = v != v ? v : (v > 88.0f ? kInf : (v < -87.0f ? 0.0f : e));
  }
}

// 1/x: on |x| in [2^-125, 2^125] a bit-trick seed, then three Newton steps
// r <- r (2 - |x| r); smaller |x| is scaled by 2^64 first (and the result by 2^64, which
// overflows to inf below about 2^-128); |x| > 2^125 (and inf) -> 0; +-0 -> +-inf; the
// sign is applied last. Max error about 2 ulp.
inline float rcp(float x) {
  if (x != x) return x;
  const uint32_t sign = f32_bits(x) & 0x80000000u;
  float a = f32_from_bits(f32_bits(x) & 0x7fffffffu);
  if (a > 4.2535296e37f) return f32_from_bits(sign);               // 2^125
  if (a == 0.0f) return f32_from_bits(sign | 0x7f800000u);
  float post = 1.0f;
  if (a < 2.3509887e-38f) {  // 2^-125
    a = a * 1.8446744e19f;   // 2^64, exact
    post = 1.8446744e19f;
  }
  float r = f32_from_bits(0x7EF311C3u - f32_bits(a));
  for (int i = 0; i < 3; ++i) r = r * (2.0f - a * r);
  r = r * post;
  return sign ? -r : r;
}

// 1/sqrt(x). NaN or x < 0 -> NaN; +-0 -> +-inf; +inf -> +0. Inputs below 2^-100
// are scaled by 2^100 first (the result by 2^50), so subnormals work. Seed
// 0x5F375A86 - bits/2, then three Newton steps y = y (1.5 - (0.5 x) y y).
inline float rsqrt(float x) {
  if (x != x || x < 0.0f) return f32_from_bits(0x7fc00000u);
  if (x == 0.0f) return f32_from_bits(f32_bits(x) | 0x7f800000u);
  if (x > 3.4028235e38f) return 0.0f;
  float post = 1.0f;
  if (x < 7.8886091e-31f) {  // 2^-100
    x = x * 1.2676506e30f;   // 2^100, exact
    post = 1.1258999e15f;    // 2^50
  }
  const float h = 0.5f * x;
  float y = f32_from_bits(0x5F375A86u - (f32_bits(x) >> 1));
  for (int i = 0; i < 3; ++i) {
    const float t = (h * y) * y;
    y = y * (1.5f - t);
  }
  return y * post;
}

// 1 / (1 + e^-x).
inline float sigmoid(float x) { return rcp(1.0f + exp(-x)); }

// x * sigmoid(x).
inline float silu(float x) { return x * sigmoid(x); }

// silu of n values, y[i] = silu(x[i]) bit for bit, the exps branch-free (exp_n) so the
// compiler can run several lanes at once; y may be x.
inline void silu_n(const float* x, float* y, int n) {
  float e[64];
  for (int i0 = 0; i0 < n; i0 += 64) {
    const int len = n - i0 < 64 ? n - i0 : 64;
    for (int i = 0; i < len; ++i) e[i] = -x[i0 + i];
    exp_n(e, e, len);
    for (int i = 0; i < len; ++i) y[i0 + i] = x[i0 + i] * rcp(1.0f + e[i]);
  }
}

// tanh(u) = 1 - 2 / (e^(2u) + 1).
inline float tanh(float u) { return 1.0f - 2.0f * rcp(exp(u + u) + 1.0f); }

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
inline float gelu_tanh(float x) {
  const float x3 = x * x * x;
  const float u = 0.7978845608f * (x + 0.044715f * x3);
  return 0.5f * x * (1.0f + tanh(u));
}

// log(1 + u) for u >= 0 (the domain softplus needs; NaN -> NaN, +inf -> +inf). w = 1 + u and
// its rounding error c = u - (w - 1) (exact); w = 2^e m with m in [sqrt(1/2), sqrt(2)), f = m - 1,
// s = f * rcp(2 + f), log m = 2s (1 + s^2/3 + ... + s^10/11) in Horner form; the result
// e ln2_hi + (e ln2_lo + log m + c * rcp(w)). Max error about 4 ulp.
inline float log1p(float u) {
  if (u != u || u > 3.4028235e38f) return u;
  if (u == 0.0f) return u;
  const float w = 1.0f + u;
  const float c = u - (w - 1.0f);
  int e = static_cast<int>(f32_bits(w) >> 23) - 127;
  float m = f32_from_bits((f32_bits(w) & 0x007fffffu) | 0x3f800000u);
  if (m > 1.41421354f) {
    m = m * 0.5f;
    e = e + 1;
  }
  const float f = m - 1.0f;
  const float s = f * rcp(2.0f + f);
  const float z = s * s;
  float p = 9.09090909e-02f;    // 1/11
  p = p * z + 1.11111111e-01f;  // 1/9
  p = p * z + 1.42857143e-01f;  // 1/7
  p = p * z + 2.0e-01f;         // 1/5
  p = p * z + 3.33333333e-01f;  // 1/3
  p = p * z + 1.0f;
  const float logm = (s + s) * p;
  const float fe = static_cast<float>(e);
  return fe * 0.693145751953125f + ((fe * 1.42860677e-06f + logm) + c * rcp(w));
}

// PyTorch's softplus (beta 1, threshold 20): x > 20 -> x, else log1p(exp(x)).
inline float softplus(float x) {
  if (x != x || x > 20.0f) return x;
  return log1p(exp(x));
}

}  // namespace switchboard::exact
