// Integer elements of any integer dtype as int64 (i32 sign-extended, u32/u8 zero-
// extended, bool 0/1, i64 from two words) and back (low bits; bool: != 0), for the
// integer kernels, which mirror the CPU's int64 arithmetic. Needs shaderInt64.
// (The including kernel enables GL_EXT_shader_explicit_arithmetic_types_int64 first.)

uint sb_int_size(uint dt) { return dt == SB_DT_I64 ? 8u : (dt == SB_DT_U8 || dt == SB_DT_BOOL) ? 1u : 4u; }
// The words holding element i: lo, and hi (i64 only).
uint sb_int_word(uint dt, uint i) { return dt == SB_DT_I64 ? 2u * i : sb_int_size(dt) == 1u ? (i >> 2) : i; }

int64_t sb_int_value(uint dt, uint lo, uint hi, uint i) {
  if (dt == SB_DT_I64) return int64_t(uint64_t(lo) | (uint64_t(hi) << 32));
  if (dt == SB_DT_I32) return int64_t(int(lo));
  if (dt == SB_DT_U32) return int64_t(lo);
  uint b = (lo >> ((i & 3u) * 8u)) & 0xffu;
  return int64_t(dt == SB_DT_BOOL ? uint(b != 0u) : b);
}
#define SB_LOAD_INT(buf, dt, i) \
  sb_int_value(dt, buf[sb_int_word(dt, i)], dt == SB_DT_I64 ? buf[sb_int_word(dt, i) + 1u] : 0u, i)

// Elements per invocation and the invocation's output words: i64 one element in two
// words, 4-byte dtypes one in one, byte dtypes four in one.
uint sb_int_per(uint dt) { return sb_int_size(dt) == 1u ? 4u : 1u; }

// Stores v[0..count) (the invocation's elements, first element index e0) as dt.
#define SB_STORE_INTS(buf, dt, e0, vals, count)                                        \
  {                                                                                    \
    if (dt == SB_DT_I64) {                                                             \
      buf[2u * e0] = uint(uint64_t(vals[0]));                                          \
      buf[2u * e0 + 1u] = uint(uint64_t(vals[0]) >> 32);                               \
    } else if (sb_int_size(dt) == 4u) {                                                \
      buf[e0] = uint(uint64_t(vals[0]));                                               \
    } else {                                                                           \
      uint w_ = 0u;                                                                    \
      for (uint s_ = 0u; s_ < count; ++s_) {                                           \
        uint b_ = dt == SB_DT_BOOL ? uint(vals[s_] != 0) : uint(uint64_t(vals[s_]) & 0xffu); \
        w_ |= b_ << (8u * s_);                                                         \
      }                                                                                \
      buf[e0 >> 2] = w_;                                                               \
    }                                                                                  \
  }
