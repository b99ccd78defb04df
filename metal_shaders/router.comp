#version 450
#extension GL_GOOGLE_include_directive : require
// Fused MoE routers (softmax -> top-k, top-k -> softmax, sigmoid + bias + grouped
// top-k); twin of cpu_fallback/router.cpp, same sequential order per token.
// Thread -> output: invocation t routes token t and writes its k weights and ids;
// per-token temporaries live in `scratch` ([T, 3E] floats) and `flags` ([T, E]).
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer L { uint logits[]; };
layout(std430, binding = 1) readonly buffer Bi { float bias[]; };
layout(std430, binding = 2) readonly buffer Sc { float expert_scale[]; };
layout(std430, binding = 3) readonly buffer Lv { uint live[]; };
layout(std430, binding = 4) buffer W { float weights[]; };
layout(std430, binding = 5) buffer I { int indices[]; };
layout(std430, binding = 6) buffer S { float scratch[]; };
layout(std430, binding = 7) buffer F { uint flags[]; };
layout(std430, binding = 8) buffer E { uint err[]; };
layout(push_constant) uniform Args { SB_ROUTER_ARGS } args;

// Selection order: higher first, NaN above everything, ties to the lower id.
bool better(float va, uint ia, float vb, uint ib) {
  bool na = sb_isnan(va), nb = sb_isnan(vb);
  if (na != nb) return na;
  if (!na && va != vb) return va > vb;
  return ia < ib;
}

const uint ALLOWED = 1u, TAKEN = 2u;

// Best allowed, untaken index in [lo, hi) of the values at scratch[base + i]; ~0u if none.
uint pick(uint base, uint fbase, uint lo, uint hi) {
  uint best = 0xffffffffu;
  for (uint i = lo; i < hi; ++i) {
    uint f = flags[fbase + i];
    if ((f & ALLOWED) == 0u || (f & TAKEN) != 0u) continue;
    if (best == 0xffffffffu || better(scratch[base + i], i, scratch[base + best], best)) best = i;
  }
  return best;
}

// w[0..k) of this token, renormalized: times rcp of their sum in slot order.
void renormalize(uint wb) {
  precise float sum = 0.0;
  for (uint j = 0u; j < args.k; ++j) sum = sum + weights[wb + j];
  float r = sb_rcp(sum);
  for (uint j = 0u; j < args.k; ++j) {
    precise float v = weights[wb + j] * r;
    weights[wb + j] = v;
  }
}

void main() {
  uint t = sb_linear_id();
  if (t >= args.tokens) return;
  uint e = args.experts;
  uint a = t * 3u * e;  // values (p, v or s)
  uint c = a + e;       // corrected scores (sigmoid router)
  uint g = c + e;       // group scores
  uint fb = t * e;
  uint wb = t * args.k;
  for (uint i = 0u; i < e; ++i) {
    scratch[a + i] = SB_LOAD(logits, args.dtype, t * e + i);
    flags[fb + i] = live[i] != 0u ? ALLOWED : 0u;
  }
  if (args.kind == 0u) {  // SoftmaxTopK
    float m = scratch[a];
    for (uint i = 0u; i < e; ++i) m = sb_max(m, scratch[a + i]);
    precise float sum = 0.0;
    for (uint i = 0u; i < e; ++i) {
      precise float d = scratch[a + i] - m;
      float ex = sb_exp(d);
      scratch[a + i] = ex;
      sum = sum + ex;
    }
    float r = sb_rcp(sum);
    for (uint i = 0u; i < e; ++i) {
      precise float p = scratch[a + i] * r;
      scratch[a + i] = p;
    }
  } else if (args.kind == 2u) {  // SigmoidGroupedTopK
    for (uint i = 0u; i < e; ++i) {
      float s = sb_sigmoid(scratch[a + i]);
      scratch[a + i] = s;
      precise float cv = s + (args.has_bias != 0u ? bias[i] : 0.0);
      scratch[c + i] = args.has_bias != 0u ? cv : s;
    }
    if (args.n_group > 1u) {
      uint per = e / args.n_group;
      for (uint q = 0u; q < args.n_group; ++q) {
        uint b0 = pick(c, fb, q * per, (q + 1u) * per);
        if (b0 != 0xffffffffu) flags[fb + b0] |= TAKEN;
        uint b1 = pick(c, fb, q * per, (q + 1u) * per);
        if (b0 != 0xffffffffu) flags[fb + b0] &= ~TAKEN;
        precise float sc2 = (b0 == 0xffffffffu) ? uintBitsToFloat(0xff800000u)
                            : (b1 == 0xffffffffu) ? scratch[c + b0] : scratch[c + b0] + scratch[c + b1];
        scratch[g + q] = sc2;
      }
      // Keep the topk_group best groups (ties: lower group): mark kept groups in TAKEN-free bit 4.
      for (uint q = 0u; q < args.n_group; ++q) flags[fb + q] |= 4u;
      for (uint s = 0u; s < args.topk_group; ++s) {
        uint best = 0xffffffffu;
        for (uint q = 0u; q < args.n_group; ++q)
          if ((flags[fb + q] & 4u) != 0u && (best == 0xffffffffu || better(scratch[g + q], q, scratch[g + best], best)))
            best = q;
        if (best != 0xffffffffu) flags[fb + best] = (flags[fb + best] & ~4u) | 8u;
      }
      // Bit 8 now marks kept groups (in the first n_group flags); clear experts of the rest.
      for (uint i = 0u; i < e; ++i) {
        bool kept = (flags[fb + i / per] & 8u) != 0u;
        if (!kept) flags[fb + i] &= ~ALLOWED;
      }
      for (uint i = 0u; i < e; ++i) flags[fb + i] &= (ALLOWED | TAKEN);
    }
  }
  uint sel = args.kind == 2u ? c : a;
  for (uint j = 0u; j < args.k; ++j) {
    uint best = pick(sel, fb, 0u, e);
    if (best == 0xffffffffu) {
      atomicOr(err[0], SB_ERR_ROUTER);
      return;
    }
    flags[fb + best] |= TAKEN;
    indices[wb + j] = int(best);
    weights[wb + j] = scratch[a + best];
  }
  if (args.kind == 1u) {  // TopKSoftmax: softmax over the k picked logits, slot order
    float m = weights[wb];
    for (uint j = 0u; j < args.k; ++j) m = sb_max(m, weights[wb + j]);
    precise float sum = 0.0;
    for (uint j = 0u; j < args.k; ++j) {
      precise float d = weights[wb + j] - m;
      float ex = sb_exp(d);
      weights[wb + j] = ex;
      sum = sum + ex;
    }
    float r = sb_rcp(sum);
    for (uint j = 0u; j < args.k; ++j) {
      precise float p = weights[wb + j] * r;
      weights[wb + j] = p;
    }
  } else if (args.renormalize != 0u) {
    renormalize(wb);
  }
  for (uint j = 0u; j < args.k; ++j) {
    precise float v = weights[wb + j];
    if (args.kind == 2u) v = v * args.routed_scaling_factor;
    if (args.has_scale != 0u) v = v * expert_scale[uint(indices[wb + j])];
    weights[wb + j] = v;
  }
}
