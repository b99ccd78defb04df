#version 450
#extension GL_GOOGLE_include_directive : require
// Full: fills 32-bit words with a pattern the host encoded (any dtype); twin of
// cpu_fallback/shape_ops.cpp. Thread -> output: invocation w writes word w.
#include "common.glsl"

layout(local_size_x = 256) in;
layout(std430, binding = 0) writeonly buffer O { uint o[]; };
layout(push_constant) uniform Args { SB_FILL_ARGS } args;

void main() {
  uint w = sb_linear_id();
  if (w >= args.words) return;
  o[w] = (w & 1u) == 0u ? args.pattern0 : args.pattern1;
}
