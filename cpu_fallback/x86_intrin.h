// <immintrin.h> for the CPU's SIMD paths, without GCC 12's false uninitialized-use warnings
// from its own _mm512_undefined_* (`__Y = __Y`, GCC bug 105593): silenced for the header's
// lines only, so our code keeps every warning. Clang has no such warning to silence.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif
