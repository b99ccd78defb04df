#version 450
#extension GL_GOOGLE_include_directive : require
// Start-up probe: the arithmetic the contract relies on, on inputs that expose a
// device that contracts a*b+c, flushes subnormals or rounds other than to nearest
// even. The host compares with the CPU (backend/vulkan/vk_runtime.cpp).
// Thread -> output: invocation i reads triple i (a, b, c) and writes 7 results; the
// 7th, a / b, decides only whether kernels that divide may run (gpu_kernel_table.h).
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer In { float v[]; };
layout(std430, binding = 1) writeonly buffer Out { float r[]; };
layout(push_constant) uniform Args { SB_PROBE_ARGS } args;

void main() {
  uint i = sb_linear_id();
  if (i >= args.n) return;
  float a = v[3u * i], b = v[3u * i + 1u], c = v[3u * i + 2u];
  precise float mad = a * b + c;
  precise float mul = a * b;
  precise float sub = a - c;
  precise float quo = a / b;
  r[7u * i] = mad;
  r[7u * i + 1u] = mul;
  r[7u * i + 2u] = sub;
  r[7u * i + 3u] = sb_exp(a);
  r[7u * i + 4u] = sb_rcp(b);
  r[7u * i + 5u] = sb_round_even(c);
  r[7u * i + 6u] = quo;
}
