// Shared by every kernel: the float-control execution modes that make + - * exact
// on GPUs (RoundingModeRTE + SignedZeroInfNanPreserve, fp32), element load/store by
// dtype through 32-bit words, f16/bf16 conversions by integer ops, and the exact
// routines of docs/numerics.md (backend/ops/exact_math.h carries the same steps).
// Rule for every kernel: float arithmetic only into `precise` variables, so each op
// is decorated NoContraction (checked by tests/shader_structure_test.cpp).
#extension GL_EXT_spirv_intrinsics : require

spirv_execution_mode(extensions = ["SPV_KHR_float_controls"], capabilities = [4466], 4461, 32);  // SZInfNanPreserve
spirv_execution_mode(extensions = ["SPV_KHR_float_controls"], capabilities = [4467], 4462, 32);  // RoundingModeRTE

#include "kernel_args.h"

// Linear invocation id over a 2D grid of 1D workgroups (the host splits large
// counts into rows of at most 65535 workgroups). A macro, not a function: this file
// is included before the kernel's local_size layout, and a function here would see
// gl_WorkGroupSize as 1.
#define sb_linear_id() (gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * (gl_NumWorkGroups.x * gl_WorkGroupSize.x))

// A specialization constant C when the host set one (not ~0u), else the push-constant value ARG.
#define SB_SPEC(C, ARG) (C != 0xffffffffu ? C : ARG)

// A hand-off's wait (a count the dispatch recorded just before, with no barrier between, raises
// as its workgroups finish): thread 0 polls COUNT (a coherent volatile word) until it reaches
// TARGET, at most 2^22 reads (then SB_ERR_HANDOFF in ERR[0]); then every invocation's later
// loads see what the count covers. Call in uniform control flow.
#define SB_WAIT_COUNT(COUNT, TARGET, ERR)                                \
  {                                                                      \
    if (gl_LocalInvocationID.x == 0u) {                                  \
      uint n_ = 0u;                                                      \
      while ((COUNT) < (TARGET) && n_ < (1u << 22)) ++n_;                \
      if (n_ == (1u << 22)) atomicOr(ERR[0], SB_ERR_HANDOFF);            \
    }                                                                    \
    barrier();                                                           \
    memoryBarrierBuffer();                                               \
  }

bool sb_is16(uint dt) { return dt == SB_DT_F16 || dt == SB_DT_BF16; }
uint sb_word(uint dt, uint i) { return sb_is16(dt) ? (i >> 1) : i; }

float sb_f16_to_f32(uint h) {
  uint sign = (h & 0x8000u) << 16;
  uint e = (h >> 10) & 0x1fu;
  uint mant = h & 0x3ffu;
  if (e == 0x1fu) return uintBitsToFloat(sign | 0x7f800000u | (mant << 13));
  if (e == 0u) {
    if (mant == 0u) return uintBitsToFloat(sign);
    int s = -1;
    do {
      ++s;
      mant <<= 1;
    } while ((mant & 0x400u) == 0u);
    return uintBitsToFloat(sign | ((112u - uint(s)) << 23) | ((mant & 0x3ffu) << 13));
  }
  return uintBitsToFloat(sign | ((e + 112u) << 23) | (mant << 13));
}

uint sb_f32_to_f16(float f) {
  uint x = floatBitsToUint(f);
  uint sign = (x >> 16) & 0x8000u;
  uint a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u | ((a >> 13) & 0x3ffu);
  if (a >= 0x477ff000u) return sign | 0x7c00u;
  if (a < 0x38800000u) {
    if (a < 0x33000000u) return sign;
    uint e = a >> 23;
    uint mant = (a & 0x7fffffu) | 0x800000u;
    uint shift = 126u - e;
    uint halfway = 1u << (shift - 1u);
    uint rem = mant & ((1u << shift) - 1u);
    uint q = mant >> shift;
    if (rem > halfway || (rem == halfway && (q & 1u) != 0u)) ++q;
    return sign | q;
  }
  uint r = a - 0x38000000u;
  r += 0xfffu + ((r >> 13) & 1u);
  return sign | (r >> 13);
}

uint sb_f32_to_bf16(float f) {
  uint u = floatBitsToUint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return ((u >> 16) | 0x40u) & 0xffffu;
  u += 0x7fffu + ((u >> 16) & 1u);
  return u >> 16;
}

// Element i of a float tensor whose 32-bit word holding it is `w`.
float sb_decode(uint w, uint dt, uint i) {
  if (dt == SB_DT_F32) return uintBitsToFloat(w);
  uint h = (w >> ((i & 1u) * 16u)) & 0xffffu;
  return dt == SB_DT_F16 ? sb_f16_to_f32(h) : uintBitsToFloat(h << 16);
}
uint sb_encode16(float v, uint dt) { return dt == SB_DT_F16 ? sb_f32_to_f16(v) : sb_f32_to_bf16(v); }
// One output word: f32 holds `lo`; f16/bf16 hold lo in the low half and hi in the high half.
uint sb_encode_word(float lo, float hi, uint dt) {
  if (dt == SB_DT_F32) return floatBitsToUint(lo);
  return sb_encode16(lo, dt) | (sb_encode16(hi, dt) << 16);
}
// Elements per 32-bit word of a float dtype.
uint sb_per_word(uint dt) { return sb_is16(dt) ? 2u : 1u; }
// v rounded to dtype dt and widened back: the value a stored output would hold.
float sb_round_to(float v, uint dt) { return sb_is16(dt) ? sb_decode(sb_encode16(v, dt), dt, 0u) : v; }

#define SB_LOAD(buf, dt, i) sb_decode(buf[sb_word(dt, i)], dt, i)

// ---- exact routines (docs/numerics.md) ----

bool sb_isnan(float x) { return (floatBitsToUint(x) & 0x7fffffffu) > 0x7f800000u; }

// Float comparisons through the bits: NVIDIA's driver compares subnormal operands as
// zero (even where its arithmetic keeps them), so exact kernels never use float
// compares (the structural test forbids them). Ordered: false when either is NaN;
// -0 equals +0.
int sb_key(float x) {
  int b = floatBitsToInt(x);
  return b < 0 ? -(b & 0x7fffffff) : b;
}
// The float of order key `key` (sb_key's inverse); the key 0 stands for +-0, whose bits
// the caller gives (the AND of the zeros seen, as a running max_f32 leaves them).
float sb_from_key(int key, uint zero_bits) {
  if (key == 0) return uintBitsToFloat(zero_bits);
  return key > 0 ? intBitsToFloat(key) : uintBitsToFloat(uint(-key) | 0x80000000u);
}
bool sb_lt(float a, float b) { return !sb_isnan(a) && !sb_isnan(b) && sb_key(a) < sb_key(b); }
bool sb_gt(float a, float b) { return sb_lt(b, a); }
bool sb_le(float a, float b) { return !sb_isnan(a) && !sb_isnan(b) && sb_key(a) <= sb_key(b); }
bool sb_ge(float a, float b) { return sb_le(b, a); }
bool sb_eq(float a, float b) { return !sb_isnan(a) && !sb_isnan(b) && sb_key(a) == sb_key(b); }
bool sb_is_zero(float x) { return (floatBitsToUint(x) & 0x7fffffffu) == 0u; }

float sb_max(float a, float b) {
  if (sb_isnan(a) || sb_isnan(b)) return sb_isnan(a) ? a : b;
  if (sb_eq(a, b)) return uintBitsToFloat(floatBitsToUint(a) & floatBitsToUint(b));
  return sb_gt(a, b) ? a : b;
}
float sb_min(float a, float b) {
  if (sb_isnan(a) || sb_isnan(b)) return sb_isnan(a) ? a : b;
  if (sb_eq(a, b)) return uintBitsToFloat(floatBitsToUint(a) | floatBitsToUint(b));
  return sb_lt(a, b) ? a : b;
}

float sb_round_even(float v) {
  precise float t = v + 12582912.0;
  precise float r = t - 12582912.0;
  return r;
}
float sb_pow2i(int n) { return uintBitsToFloat(uint(n + 127) << 23); }

float sb_exp(float x) {
  if (sb_isnan(x)) return x;
  if (sb_gt(x, 88.0)) return uintBitsToFloat(0x7f800000u);
  if (sb_lt(x, -87.0)) return 0.0;
  precise float xl = x * 1.44269504;
  precise float n = sb_round_even(xl);
  precise float r = x - n * 0.693145751953125;
  r = r - n * 1.42860677e-06;
  precise float p = 1.38888889e-03;
  p = p * r + 8.33333333e-03;
  p = p * r + 4.16666667e-02;
  p = p * r + 1.66666667e-01;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  precise float out_v = p * sb_pow2i(int(n));
  return out_v;
}

float sb_rcp(float x) {
  if (sb_isnan(x)) return x;
  uint sign = floatBitsToUint(x) & 0x80000000u;
  precise float a = uintBitsToFloat(floatBitsToUint(x) & 0x7fffffffu);
  if (sb_gt(a, 4.2535296e37)) return uintBitsToFloat(sign);  // 2^125
  if (sb_is_zero(a)) return uintBitsToFloat(sign | 0x7f800000u);
  float post = 1.0;
  if (sb_lt(a, 2.3509887e-38)) {  // 2^-125: scale by 2^64 (exact), the result too
    a = a * 1.8446744e19;
    post = 1.8446744e19;
  }
  precise float r = uintBitsToFloat(0x7EF311C3u - floatBitsToUint(a));
  for (int i = 0; i < 3; ++i) {
    precise float t = 2.0 - a * r;
    r = r * t;
  }
  precise float scaled = r * post;
  return sign != 0u ? -scaled : scaled;
}

float sb_rsqrt(float x) {
  if (sb_isnan(x) || sb_lt(x, 0.0)) return uintBitsToFloat(0x7fc00000u);
  if (sb_is_zero(x)) return uintBitsToFloat(floatBitsToUint(x) | 0x7f800000u);
  if (sb_gt(x, 3.4028235e38)) return 0.0;
  float post = 1.0;
  precise float xs = x;
  if (sb_lt(x, 7.8886091e-31)) {  // 2^-100: scale by 2^100 (exact), the result by 2^50
    xs = x * 1.2676506e30;
    post = 1.1258999e15;
  }
  precise float h = 0.5 * xs;
  precise float y = uintBitsToFloat(0x5F375A86u - (floatBitsToUint(xs) >> 1));
  for (int i = 0; i < 3; ++i) {
    precise float t = (h * y) * y;
    y = y * (1.5 - t);
  }
  precise float r = y * post;
  return r;
}

float sb_sigmoid(float x) {
  precise float e = 1.0 + sb_exp(-x);
  return sb_rcp(e);
}
// exact::log1p and exact::softplus (backend/ops/exact_math.h).
float sb_log1p(float u) {
  if (sb_isnan(u) || sb_gt(u, 3.4028235e38)) return u;
  if (sb_is_zero(u)) return u;
  precise float w = 1.0 + u;
  precise float c = u - (w - 1.0);
  int e = int(floatBitsToUint(w) >> 23) - 127;
  precise float m = uintBitsToFloat((floatBitsToUint(w) & 0x007fffffu) | 0x3f800000u);
  if (sb_gt(m, 1.41421354)) {
    m = m * 0.5;
    e = e + 1;
  }
  precise float f = m - 1.0;
  precise float s = f * sb_rcp(2.0 + f);
  precise float z = s * s;
  precise float p = 9.09090909e-02;
  p = p * z + 1.11111111e-01;
  p = p * z + 1.42857143e-01;
  p = p * z + 2.0e-01;
  p = p * z + 3.33333333e-01;
  p = p * z + 1.0;
  precise float logm = (s + s) * p;
  precise float fe = float(e);
  precise float r = fe * 0.693145751953125 + ((fe * 1.42860677e-06 + logm) + c * sb_rcp(w));
  return r;
}
float sb_softplus(float x) {
  if (sb_isnan(x) || sb_gt(x, 20.0)) return x;
  return sb_log1p(sb_exp(x));
}
float sb_silu(float x) {
  precise float r = x * sb_sigmoid(x);
  return r;
}
float sb_tanh(float u) {
  precise float e = sb_exp(u + u) + 1.0;
  precise float r = 1.0 - 2.0 * sb_rcp(e);
  return r;
}
float sb_gelu_tanh(float x) {
  precise float x3 = x * x * x;
  precise float u = 0.7978845608 * (x + 0.044715 * x3);
  precise float r = 0.5 * x * (1.0 + sb_tanh(u));
  return r;
}
// Glu of a gate and an up value (kind 0 SwiGLU, 1 GEGLU, 2 clamped SwiGLU); twin of
// cpu_fallback/glu.cpp, shared by glu.comp and the fused QMM_ROW_GLU.
float sb_glu(float gv, float uv, uint kind, float alpha, float limit) {
  precise float r;
  if (kind == 0u) {
    r = sb_silu(gv) * uv;
  } else if (kind == 1u) {
    r = sb_gelu_tanh(gv) * uv;
  } else {
    float gc = sb_min(gv, limit);
    float uc = sb_max(sb_min(uv, limit), -limit);
    precise float ag = alpha * gc;
    precise float left = gc * sb_sigmoid(ag);
    precise float right = uc + 1.0;
    r = left * right;
  }
  return r;
}
