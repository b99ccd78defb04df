// Kernel variants of this file, one line each (metal_shaders/README.md, "Variants"):
// SB_KERNEL(numerics_probe, PROBE, "rw", ProbeArgs, SB_PROBE_ARGS, 64, F_DIVIDES)
// SB_KERNEL(stream_read, STREAM_READ, "rw", StreamArgs, SB_STREAM_ARGS, 256, 0)
#version 450
#extension GL_GOOGLE_include_directive : require
// Probes. PROBE (numerics_probe): the arithmetic the contract relies on, on inputs that
// expose a device that contracts a*b+c, flushes subnormals or rounds other than to
// nearest even. The host compares with the CPU (backend/gpu/probe.cpp).
// Thread -> output: invocation i reads triple i (a, b, c) and writes 7 results; the
// 7th, a / b, decides only whether kernels that divide may run (gpu_kernel_table.h).
// STREAM_READ (stream_read): the device's read floor for bench/gpu_floor_bench.cpp.
// Thread -> output: invocation i XORs 16-byte words i, i + T, i + 2T, ... (T: all
// invocations) and stores only if that XOR equals args.magic (so no load is dead code).
#include "common.glsl"

#ifdef STREAM_READ
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer In { uvec4 w[]; };
layout(std430, binding = 1) writeonly buffer Out { uint o[]; };
layout(push_constant) uniform Args { SB_STREAM_ARGS } args;

void main() {
  uint i = sb_linear_id(), t = gl_NumWorkGroups.x * gl_NumWorkGroups.y * gl_WorkGroupSize.x;
  uvec4 acc = uvec4(0u);
  // Four loads in flight per thread before any is used.
  for (uint j = i; j < args.n; j += 4u * t) {
    uvec4 a = w[j];
    uvec4 b = j + t < args.n ? w[j + t] : uvec4(0u);
    uvec4 c = j + 2u * t < args.n ? w[j + 2u * t] : uvec4(0u);
    uvec4 d = j + 3u * t < args.n ? w[j + 3u * t] : uvec4(0u);
    acc ^= a ^ b ^ c ^ d;
  }
  if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == args.magic) o[i] = 1u;
}
#else

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
#endif
