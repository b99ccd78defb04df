#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// Fused MoE routers (softmax -> top-k, top-k -> softmax, sigmoid + bias + grouped
// top-k); twin of cpu_fallback/router.cpp. Thread -> output: workgroup t (256 threads)
// routes token t. Elementwise steps run in parallel; sums run on thread 0 in index (or slot)
// order as docs/numerics.md fixes; top-k is a rank count per expert (grouped routers:
// rounds of a tree over the threads' candidates), exact because "better" is a strict
// total order (value, then id).
#include "common.glsl"

layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer L { uint logits[]; };
layout(std430, binding = 1) readonly buffer Bi { float bias[]; };
layout(std430, binding = 2) readonly buffer Sc { float expert_scale[]; };
layout(std430, binding = 3) readonly buffer Lv { uint live[]; };
layout(std430, binding = 4) writeonly buffer W { float weights[]; };
layout(std430, binding = 5) writeonly buffer I { int indices[]; };
layout(std430, binding = 6) buffer E { uint err[]; };
layout(push_constant) uniform Args { SB_ROUTER_ARGS } args;

#define RT(f) args.f
#include "router.glsl"

void main() {
  uint t = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (t >= args.tokens) return;  // uniform over the workgroup
  route_token(t);
  if (gl_LocalInvocationID.x == 0u) route_write(t);
}
