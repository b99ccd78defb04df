// Helpers attention.comp and attention_tiles.comp share; included after `args` (SB_ATTENTION_ARGS).
#include "spec_constants.glsl"
#define ADT SB_SPEC(kSpecDt0, args.dtype)  // q, the caches, sinks and the output
#define HD SB_SPEC(kSpecExtent, args.hd)    // the head dim

const uint kBlock = 32u;  // op_shapes.h kAttentionBlock

// v rounded to the attention's dtype, as a stored result holds it.
float rnd(float x) { return sb_round_to(x, ADT); }

// Element 0 of key j of cache head kh: caches [hk, S, hd] or (seq_major) [S, hk, hd].
uint key_at(uint kh, uint j) {
  return args.seq_major != 0u ? (j * args.hk + kh) * HD : (kh * args.cache + j) * HD;
}

// The first key a query at position `at` sees: 0, or at + 1 - window with a sliding window
// (op_shapes.h visible_keys; the last is `at`).
uint first_visible(uint at) { return args.window > 0u && at + 1u > args.window ? at + 1u - args.window : 0u; }

// Halving tree 16, 8, 4, 2, 1 over 32 partials.
#define SB_TREE32(p)                                                   \
  [[unroll]] for (uint h2 = 16u; h2 >= 1u; h2 >>= 1u) {                \
    [[unroll]] for (uint l = 0u; l < h2; ++l) p[l] = p[l] + p[l + h2]; \
  }
