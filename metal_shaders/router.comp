// Kernel variants of this file, one line each (metal_shaders/README.md, "Variants"):
// SB_KERNEL(router, ROUTER, "rrrrwwbr", RouterArgs, SB_ROUTER_ARGS, 256, 0)
// router for <= 256 experts of one kind (RouterKind 0, 1, 2).
// SB_KERNEL(router_e256_softmax, ROUTER_E256_SOFTMAX, "rrrrwwbr", RouterArgs, SB_ROUTER_ARGS, 256, 0)
// SB_KERNEL(router_e256_topk_softmax, ROUTER_E256_TOPK_SOFTMAX, "rrrrwwbr", RouterArgs, SB_ROUTER_ARGS, 256, 0)
// SB_KERNEL(router_e256_sigmoid, ROUTER_E256_SIGMOID, "rrrrwwbr", RouterArgs, SB_ROUTER_ARGS, 256, 0)
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
// Coherent: with wait_count the logits' matmul may still run when this starts (no barrier).
layout(std430, binding = 0) coherent readonly buffer L { uint logits[]; };
layout(std430, binding = 1) readonly buffer Bi { float bias[]; };
layout(std430, binding = 2) readonly buffer Sc { float expert_scale[]; };
layout(std430, binding = 3) readonly buffer Lv { uint live[]; };
// Coherent: the decode kernels after the router may read these while it runs (no barrier).
layout(std430, binding = 4) coherent writeonly buffer W { float weights[]; };
layout(std430, binding = 5) coherent writeonly buffer I { int indices[]; };
layout(std430, binding = 6) buffer E { uint err[]; };
// wait_count > 0: the matmul's workgroups done (matmul_rows16_count, recorded just before).
layout(std430, binding = 7) coherent volatile readonly buffer Dn { uint logits_done[]; };
layout(push_constant) uniform Args { SB_ROUTER_ARGS } args;

// The router_e256_* variants: <= 256 experts, one kind each. Shared memory is sized for
// the experts because it bounds the workgroups per SM; the kind is fixed at build time so
// the kernel holds only that kind's code (half the machine code; the first dispatch of a
// submission is faster for it: bench/RESULTS.md). The host picks the variant of args.kind.
#if defined(ROUTER_E256_SOFTMAX)
#define ROUTER_E256
#define KIND 0u
#elif defined(ROUTER_E256_TOPK_SOFTMAX)
#define ROUTER_E256
#define KIND 1u
#elif defined(ROUTER_E256_SIGMOID)
#define ROUTER_E256
#define KIND 2u
#else
#define KIND args.kind
#endif
#ifdef ROUTER_E256
const uint kMaxExperts = 256u;
#else
const uint kMaxExperts = 1024u;
#endif
const uint kThreads = 256u, kMaxK = 64u, NONE = 0xffffffffu;
const uint ALLOWED = 1u, TAKEN = 2u, KEPT_GROUP = 4u;
shared float s_v[kMaxExperts];  // p (softmax), logits (top-k softmax) or s (sigmoid)
shared float s_c[kMaxExperts];  // corrected scores (sigmoid router)
shared uint s_f[kMaxExperts];   // ALLOWED / TAKEN; KEPT_GROUP on group slots
shared float s_g[kMaxExperts];  // group scores
shared float r_v[kThreads];
shared uint r_i[kThreads];
shared float s_w[kMaxK];
shared uint s_id[kMaxK];
shared uint s_rank[kMaxExperts];
// Selection keys, four per word so a rank count reads 16 bytes at a time: higher is
// better, NaN highest; 0: not allowed (and the padding past the last expert).
shared uvec4 s_key4[kMaxExperts / 4u];
shared float s_m;
shared int s_max_key;
shared uint s_zeros, s_first_nan;

// Higher first, NaN above everything, ties to the lower id; NONE loses to all.
bool better(float va, uint ia, float vb, uint ib) {
  if (ib == NONE) return ia != NONE;
  if (ia == NONE) return false;
  bool na = sb_isnan(va), nb = sb_isnan(vb);
  if (na != nb) return na;
  if (!na && !sb_eq(va, vb)) return sb_gt(va, vb);
  return ia < ib;
}

// Best allowed, untaken id in [lo, hi) of s_c (use_c) or s_v; NONE if none. Called
// by every thread.
uint pick(bool use_c, uint lo, uint hi) {
  uint tid = gl_LocalInvocationID.x;
  uint best = NONE;
  float bv = 0.0;
  for (uint i = lo + tid; i < hi; i += kThreads) {
    if ((s_f[i] & (ALLOWED | TAKEN)) != ALLOWED) continue;
    float v = use_c ? s_c[i] : s_v[i];
    if (better(v, i, bv, best)) {
      best = i;
      bv = v;
    }
  }
  r_v[tid] = bv;
  r_i[tid] = best;
  barrier();
  for (uint s = kThreads / 2u; s > 0u; s >>= 1) {
    if (tid < s && better(r_v[tid + s], r_i[tid + s], r_v[tid], r_i[tid])) {
      r_v[tid] = r_v[tid + s];
      r_i[tid] = r_i[tid + s];
    }
    barrier();
  }
  uint r = r_i[0];
  barrier();
  return r;
}

// Top-k without rounds: an allowed expert's slot is the number of allowed experts
// better than it ("better" is a strict total order, so slots are distinct); slots
// left empty (fewer than k allowed) raise SB_ERR_ROUTER and hold expert 0, as pick() does.
// "better" as one unsigned key per expert: the value's order key (NaN highest), ties
// to the lower id; keys of allowed experts are >= 0x00800000, so key 0 marks the others.
// Thread -> (expert i, part q): the parts split the comparisons of i (integer counts,
// added in any order), so a router of few experts still keeps every thread busy; each
// part is whole words of s_key4. Plain loops: the 8-wide unrolled count was slower.
void select_by_rank(bool use_c, uint e) {
  uint tid = gl_LocalInvocationID.x, words = (e + 3u) >> 2;
  for (uint j = tid; j < args.k; j += kThreads) s_id[j] = NONE;
  for (uint i = tid; i < 4u * words; i += kThreads) {
    float v = use_c ? s_c[min(i, e - 1u)] : s_v[min(i, e - 1u)];
    bool allowed = i < e && (s_f[i] & ALLOWED) != 0u;
    s_key4[i >> 2][i & 3u] = !allowed ? 0u : sb_isnan(v) ? 0xffffffffu : uint(sb_key(v)) ^ 0x80000000u;
    s_rank[i] = 0u;
  }
  barrier();
  uint parts = max(1u, kThreads / e);
  for (uint u = tid; u < e * parts; u += kThreads) {
    uint i = u % e, q = u / e, ki = s_key4[i >> 2][i & 3u];
    if (ki == 0u) continue;
    uint count = 0u;
    for (uint w = q * words / parts; w < (q + 1u) * words / parts; ++w) {
      uvec4 kj = s_key4[w];
      uint j = 4u * w;
      count += (kj.x > ki || (kj.x == ki && j < i)) ? 1u : 0u;
      count += (kj.y > ki || (kj.y == ki && j + 1u < i)) ? 1u : 0u;
      count += (kj.z > ki || (kj.z == ki && j + 2u < i)) ? 1u : 0u;
      count += (kj.w > ki || (kj.w == ki && j + 3u < i)) ? 1u : 0u;
    }
    if (count != 0u) atomicAdd(s_rank[i], count);
  }
  barrier();
  for (uint i = tid; i < e; i += kThreads) {
    uint rank = s_rank[i];
    if (s_key4[i >> 2][i & 3u] != 0u && rank < args.k) {
      s_id[rank] = i;
      s_w[rank] = s_v[i];
    }
  }
  barrier();
  for (uint j = tid; j < args.k; j += kThreads) {
    if (s_id[j] != NONE) continue;
    atomicOr(err[0], SB_ERR_ROUTER);
    s_id[j] = 0u;
    s_w[j] = s_v[0];
  }
  barrier();
}

// The running max of s_v[0..e) in index order (max_f32: a NaN sticks, equal values
// AND their bits) without the serial loop: it is the first NaN if there is one, else
// the value of the largest order key, where the key 0 (+-0) gives the AND of all zeros'
// bits. s_max_key / s_zeros / s_first_nan were set in main's first pass.
float softmax_max() {
  return s_first_nan != NONE ? s_v[s_first_nan] : sb_from_key(s_max_key, s_zeros);
}

// s_v[0] + ... + s_v[e - 1] in index order (thread 0).
float sum_in_order(uint e) {
  precise float sum = 0.0;
  for (uint i = 0u; i < e; ++i) sum = sum + s_v[i];
  return sum;
}

// Softmax over s_w[0..k) in slot order (thread 0).
void softmax_slots() {
  float m = s_w[0];
  for (uint j = 0u; j < args.k; ++j) m = sb_max(m, s_w[j]);
  precise float sum = 0.0;
  for (uint j = 0u; j < args.k; ++j) {
    precise float d = s_w[j] - m;
    float ex = sb_exp(d);
    s_w[j] = ex;
    sum = sum + ex;
  }
  float r = sb_rcp(sum);
  for (uint j = 0u; j < args.k; ++j) {
    precise float p = s_w[j] * r;
    s_w[j] = p;
  }
}

// Slot j's weight w scaled as the router's kind and options say.
float slot_weight(uint j, float w) {
  precise float v = w;
  if (KIND == 2u) v = v * args.routed_scaling_factor;
  if (args.has_scale != 0u) v = v * expert_scale[s_id[j]];
  return v;
}

// The logits once the matmul recorded just before (no barrier between) has counted all its
// args.wait_count workgroups: thread 0 polls, bounded (SB_ERR_HANDOFF), as the row kernels
// wait for the router; that matmul's workgroups were launched first and finish meanwhile.
void wait_for_logits() SB_WAIT_COUNT(logits_done[0], args.wait_count, err)

void main() {
  uint t = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (t >= args.tokens) return;  // uniform over the workgroup
  if (args.wait_count != 0u) wait_for_logits();  // uniform
  uint tid = gl_LocalInvocationID.x, e = args.experts;
  if (tid == 0u) {
    s_max_key = int(0x80000000u);
    s_zeros = 0xffffffffu;
    s_first_nan = NONE;
  }
  barrier();
  for (uint i = tid; i < e; i += kThreads) {
    float v = SB_LOAD(logits, args.dtype, t * e + i);
    s_f[i] = live[i] != 0u ? ALLOWED : 0u;
    if (KIND == 2u) {
      float s = sb_sigmoid(v);
      s_v[i] = s;
      precise float cv = s + (args.has_bias != 0u ? bias[i] : 0.0);
      s_c[i] = args.has_bias != 0u ? cv : s;
    } else {
      s_v[i] = v;
      if (KIND == 0u) {  // for softmax_max
        int key = sb_key(v);
        if (sb_isnan(v)) {
          atomicMin(s_first_nan, i);
        } else {
          atomicMax(s_max_key, key);
          if (key == 0) atomicAnd(s_zeros, floatBitsToUint(v));
        }
      }
    }
  }
  barrier();
  if (KIND == 0u) {  // softmax over all experts: max and sum in index order
    float m = softmax_max();
    for (uint i = tid; i < e; i += kThreads) {
      precise float d = s_v[i] - m;
      s_v[i] = sb_exp(d);
    }
    barrier();
    if (tid == 0u) s_m = sb_rcp(sum_in_order(e));
    barrier();
    for (uint i = tid; i < e; i += kThreads) {
      precise float p = s_v[i] * s_m;
      s_v[i] = p;
    }
    barrier();
  }
  if (KIND == 2u && args.n_group > 1u) {
    uint per = e / args.n_group;
    for (uint q = 0u; q < args.n_group; ++q) {  // group score: its best two live scores
      uint b0 = pick(true, q * per, (q + 1u) * per);
      if (tid == 0u && b0 != NONE) s_f[b0] |= TAKEN;
      barrier();
      uint b1 = pick(true, q * per, (q + 1u) * per);
      if (tid == 0u) {
        if (b0 == NONE) {
          s_g[q] = uintBitsToFloat(0xff800000u);
        } else if (b1 == NONE) {
          s_g[q] = s_c[b0];
        } else {
          precise float two = s_c[b0] + s_c[b1];
          s_g[q] = two;
        }
        if (b0 != NONE) s_f[b0] &= ~TAKEN;
      }
      barrier();
    }
    if (tid == 0u) {  // keep the topk_group best groups (ties: lower group)
      for (uint s = 0u; s < args.topk_group; ++s) {
        uint best = NONE;
        for (uint q = 0u; q < args.n_group; ++q)
          if ((s_f[q] & KEPT_GROUP) == 0u && better(s_g[q], q, best == NONE ? 0.0 : s_g[best], best)) best = q;
        if (best != NONE) s_f[best] |= KEPT_GROUP;
      }
    }
    barrier();
    for (uint i = tid; i < e; i += kThreads)
      if ((s_f[i / per] & KEPT_GROUP) == 0u) s_f[i] &= ~ALLOWED;
    barrier();
    for (uint i = tid; i < e; i += kThreads) s_f[i] &= (ALLOWED | TAKEN);
    barrier();
  }
  if (KIND == 2u && args.n_group > 1u) {
    for (uint j = 0u; j < args.k; ++j) {
      uint best = pick(true, 0u, e);
      if (tid == 0u) {
        if (best == NONE) atomicOr(err[0], SB_ERR_ROUTER);
        uint id = best == NONE ? 0u : best;
        s_f[id] |= TAKEN;
        s_id[j] = id;
        s_w[j] = s_v[id];
      }
      barrier();
    }
  } else {
    select_by_rank(KIND == 2u, e);
  }
  // Thread j < k finishes slot j; each adds the k weights in slot order itself (the same
  // sum on every thread), so no thread waits for another.
  float w = 0.0;
  if (KIND == 1u) {  // uniform
    if (tid == 0u) softmax_slots();
    barrier();
    if (tid < args.k) w = s_w[tid];
  } else if (tid < args.k) {  // k <= kMaxK < kThreads
    precise float v = s_w[tid];
    if (args.renormalize != 0u) {
      precise float sum = 0.0;
      for (uint j = 0u; j < args.k; ++j) sum = sum + s_w[j];
      precise float r = v * sb_rcp(sum);
      v = r;
    }
    w = v;
  }
  if (tid < args.k) weights[t * args.k + tid] = slot_weight(tid, w);
  // The weights before the indices (in uniform control flow: lavapipe dropped stores after
  // a memory barrier in thread 0's loop): a reader that sees an index sees its weight.
  memoryBarrierBuffer();
  if (tid < args.k) indices[t * args.k + tid] = int(s_id[tid]);
}
