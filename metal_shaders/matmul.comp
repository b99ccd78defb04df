// Kernel variants of this file, one line each (metal_shaders/README.md, "Variants"):
// SB_KERNEL(matmul, MATMUL, "rrrw", MatmulArgs, SB_MATMUL_ARGS, 32, 0)
// SB_KERNEL(matmul_rows16, MATMUL_ROWS16, "rrrw", MatmulArgs, SB_MATMUL_ARGS, 64, 0)
// SB_KERNEL(matmul_tile, MATMUL_TILE, "rrrw", MatmulArgs, SB_MATMUL_ARGS, 256, 0)
// matmul_rows16 that counts its finished workgroups in binding 4 (the router waits on it).
// SB_KERNEL(matmul_rows16_count, MATMUL_ROWS16_COUNT, "rrrwb", MatmulArgs, SB_MATMUL_ARGS, 64, 0)
// matmul_rows16_count whose a is RmsNorm's output (order Tree32), computed by each workgroup:
// bindings x, b, bias, out, done, then the norm's residual, weight, out and sum.
// SB_KERNEL(matmul_rows16_norm_count, MATMUL_ROWS16_NORM_COUNT, "rrrwbrrww", MatmulNormArgs, SB_MATMUL_NORM_ARGS, 64, 0)
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// Matmul / linear and BatchMatmul with the dot32 order of docs/numerics.md (then +
// bias); twin of cpu_fallback/matmul.cpp. Thread -> output: workgroup w writes word w
// of out [batch, rows, cols] (1 or 2 elements); lane l keeps partial sum l over k = l, l+32, ...
// (product, then add), and the halving tree 16..1 combines them (MATMUL_ROWS16 the same with
// 64 threads: lanes 32..63 hold the word's second element, both read through shared memory).
#include "common.glsl"

#ifdef MATMUL_ROWS16_NORM_COUNT
#define MATMUL_ROWS16_COUNT
#define SB_NORM
#endif
#ifdef MATMUL_TILE
layout(local_size_x = 256) in;
#elif defined(MATMUL_ROWS16) || defined(MATMUL_ROWS16_COUNT)
layout(local_size_x = 64) in;
#else
layout(local_size_x = 32) in;
#endif
#ifdef MATMUL_ROWS16_COUNT
#define MATMUL_ROWS16
#define SB_COUNT
#endif
#ifdef MATMUL_ROWS16
// MATMUL_ROWS16: `matmul` for b transposed and rows of a and b in whole 16-byte units from
// 16-byte aligned bindings (the host checks).
#define MATMUL
layout(std430, binding = 0) readonly buffer A { uvec4 a4[]; };
layout(std430, binding = 1) readonly buffer B { uvec4 b4[]; };
#else
layout(std430, binding = 0) readonly buffer A { uint a[]; };
layout(std430, binding = 1) readonly buffer B { uint b[]; };
#endif
layout(std430, binding = 2) readonly buffer Bias { uint bias[]; };
#ifdef SB_COUNT
// MATMUL_ROWS16_COUNT: each workgroup, its word stored and made visible, counts itself in
// done[0], for a kernel recorded after it with no barrier (the router).
layout(std430, binding = 3) coherent writeonly buffer O { uint o[]; };
layout(std430, binding = 4) coherent buffer Dn { uint done[]; };
#else
layout(std430, binding = 3) writeonly buffer O { uint o[]; };
#endif
#ifdef SB_NORM
// MATMUL_ROWS16_NORM_COUNT: a's row r is RmsNorm (order Tree32) of x's row r (+ the residual's
// with has_residual): rms_norm_tree's steps in each workgroup; the row's first workgroup also
// stores the norm's out and sum (read after the count by kernels recorded with no barrier).
layout(std430, binding = 5) readonly buffer Nr { uvec4 res4[]; };
layout(std430, binding = 6) readonly buffer Nw { uint norm_w[]; };
layout(std430, binding = 7) coherent writeonly buffer No { uvec4 norm_out4[]; };
layout(std430, binding = 8) coherent writeonly buffer Ns { uvec4 norm_sum4[]; };
layout(push_constant) uniform Args { SB_MATMUL_NORM_ARGS } args;
#else
layout(push_constant) uniform Args { SB_MATMUL_ARGS } args;
#endif
#include "spec_constants.glsl"
#define DT SB_SPEC(kSpecDt0, args.dtype)           // a and the output
#define B_DT SB_SPEC(kSpecDt1, args.b_dtype)       // b
#define BIAS_DT SB_SPEC(kSpecDt2, args.bias_dtype) // the bias
#ifdef SB_NORM
#define NORM_W_DT SB_SPEC(kSpecExtent, args.w_dtype) // the norm's weights (an extent's slot)
#include "norm_common.glsl"
#endif

#ifdef MATMUL_TILE
// Many rows and columns (prefill projections such as the router's): workgroup (batch, row
// tile, column tile) computes 16 x 16 outputs; per chunk of kC = 128 k the A rows and B
// columns go to shared memory once, and the next chunk's loads are in flight while this
// one is added (four times fewer barriers than 32-k chunks: the loop waited on latency).
// Thread -> output: t takes residue q = t % 4 of outputs out[batch, 16 tr + 2 (t / 32) + y,
// 16 tc + 2 ((t / 4) % 8) + x] (x, y < 2): their dot32 partial sums p = q + 4u (u < 8; element
// i -> partial i % 32, increasing i, each product rounded then added), and the halving tree's
// levels 16, 8 and 4 in registers (they pair partials of one residue); levels 2 and 1 take the
// four residues' sums through shared memory, thread t for output t. The same bits as the
// one-output-per-workgroup kernel below. A row of the chunk is staged by residue, [q][k / 16]
// in vec4s (k = q + 16 j + 4 c at component c of vec4 j): a thread's four k of a residue are
// one 16-byte load, four loads for 16 products (a vec4 of each of its 2 rows and 2 columns).
const uint kT = 16u, kC = 128u, kLoads = kT * kC / 256u;
const uint kQs = kC / 16u + 1u;  // vec4s a residue (+1: the four residues on different banks)
const uint kRow = 4u * kQs + 2u; // vec4s a row (+2: a quarter-warp's two columns on different banks)
shared vec4 s_a[kT * kRow];  // [row][residue][k / 16] of the chunk
shared vec4 s_b[kT * kRow];  // [column][residue][k / 16] of the chunk (B transposed)
shared float s_o[4u * 256u]; // [output][residue]: the level-4 inputs

// This thread's elements of the chunk at k0: element t + 256 q is (row or column
// (t + 256 q) / kC, k0 + t % kC); 0 past the matrices (branches, not selects: no load
// outside the buffers).
void tile_load(uint k0, uint r0, uint c0, uint boff, uint rows_left, out float va[kLoads], out float vb[kLoads]) {
  uint t = gl_LocalInvocationID.x, i = k0 + t % kC;
  [[unroll]] for (uint q = 0u; q < kLoads; ++q) {
    uint rc = (t + 256u * q) / kC;
    uint bi = boff + (args.transpose_b != 0u ? (c0 + rc) * args.k + i : i * args.cols + c0 + rc);
    va[q] = vb[q] = 0.0;
    if (rc < rows_left && i < args.k) va[q] = SB_LOAD(a, DT, (r0 + rc) * args.k + i);
    if (c0 + rc < args.cols && i < args.k) vb[q] = SB_LOAD(b, B_DT, bi);
  }
}

// Chunk element kk's place in a staged row: residue kk % 4, vec4 kk / 16, component (kk / 4) % 4.
uint tile_at(uint kk) { return (kk & 3u) * kQs + (kk >> 4u); }

void main() {
  uint t = gl_LocalInvocationID.x;
  uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  uint tiles_r = (args.rows + kT - 1u) / kT, tiles_c = (args.cols + kT - 1u) / kT;
  uint bt = wg / (tiles_r * tiles_c), tr = (wg / tiles_c) % tiles_r, tc = wg % tiles_c;
  if (bt >= args.batch) return;  // uniform over the workgroup
  uint r0 = bt * args.rows + kT * tr, c0 = kT * tc;  // r0: row over all batches
  uint boff = (bt / args.group) * args.cols * args.k, rows_left = args.rows - kT * tr;
  precise float p[4][8];  // [output 2y + x][partial slot u: p = q + 4u]
  [[unroll]] for (uint o = 0u; o < 4u; ++o) {
    [[unroll]] for (uint u = 0u; u < 8u; ++u) p[o][u] = 0.0;
  }
  float va[kLoads], vb[kLoads];
  tile_load(0u, r0, c0, boff, rows_left, va, vb);
  uint q = t & 3u, lr = 2u * (t >> 5u), lc = 2u * ((t >> 2u) & 7u);
  for (uint k0 = 0u; k0 < args.k; k0 += kC) {
    [[unroll]] for (uint l = 0u; l < kLoads; ++l) {
      uint rc = (t + 256u * l) / kC, kk = t % kC;
      s_a[rc * kRow + tile_at(kk)][(kk >> 2u) & 3u] = va[l];
      s_b[rc * kRow + tile_at(kk)][(kk >> 2u) & 3u] = vb[l];
    }
    barrier();
    if (k0 + kC < args.k) tile_load(k0 + kC, r0, c0, boff, rows_left, va, vb);
    // vec4 j holds k = q + 16 j + 4 c: partial (q + 4 c + 16 (j % 2)), slot c + 4 (j % 2); j in
    // increasing order keeps each partial's elements in increasing order.
    bool whole = k0 + kC <= args.k;  // uniform: a whole chunk, no per-term test
    [[unroll]] for (uint j = 0u; j < kC / 16u; ++j) {
      uint at = q * kQs + j;
      vec4 a0 = s_a[lr * kRow + at], a1 = s_a[(lr + 1u) * kRow + at];
      vec4 b0 = s_b[lc * kRow + at], b1 = s_b[(lc + 1u) * kRow + at];
      [[unroll]] for (uint c = 0u; c < 4u; ++c) {
        uint u = c + 4u * (j & 1u);
        if (whole || k0 + q + 16u * j + 4u * c < args.k) {  // terms past k are skipped, not added as 0
          p[0][u] = p[0][u] + a0[c] * b0[c];
          p[1][u] = p[1][u] + a0[c] * b1[c];
          p[2][u] = p[2][u] + a1[c] * b0[c];
          p[3][u] = p[3][u] + a1[c] * b1[c];
        }
      }
    }
    barrier();
  }
  // Levels 16, 8, 4 of the halving tree pair slots u, u + 4 (partials q + 4u, q + 4u + 16), then
  // u, u + 2, then 0, 1: partial q's level-3 sum. Levels 2 and 1: (s0 + s2) + (s1 + s3).
  [[unroll]] for (uint o = 0u; o < 4u; ++o) {
    [[unroll]] for (uint u = 0u; u < 4u; ++u) p[o][u] = p[o][u] + p[o][u + 4u];
    [[unroll]] for (uint u = 0u; u < 2u; ++u) p[o][u] = p[o][u] + p[o][u + 2u];
    p[o][0] = p[o][0] + p[o][1];
    s_o[4u * ((lr + (o >> 1u)) * 16u + lc + (o & 1u)) + q] = p[o][0];
  }
  barrier();
  precise float l4a = s_o[4u * t] + s_o[4u * t + 2u], l4b = s_o[4u * t + 1u] + s_o[4u * t + 3u];
  precise float v = l4a + l4b;
  uint r = kT * tr + (t >> 4u), c = c0 + (t & 15u);
  if (args.has_bias != 0u && c < args.cols) v = v + SB_LOAD(bias, BIAS_DT, c);
  bool live = r < args.rows && c < args.cols;
  uint e = (bt * args.rows + r) * args.cols + c;
  barrier();  // s_o is read above and written below
  if (sb_per_word(DT) == 2u) {  // the host keeps cols even: columns c, c + 1 share a word
    s_o[t] = v;
    barrier();
    if (live && (t & 1u) == 0u) o[e >> 1u] = sb_encode_word(v, s_o[t + 1u], DT);
  } else if (live) {
    o[e] = floatBitsToUint(v);
  }
}
#elif defined(MATMUL_ROWS16)
const uint kChunkWords = 2048u;  // words of a and of each b row staged per pass
const uint kUnits = kChunkWords / 4u / 64u;  // 16-byte units a thread copies per row and pass
shared uint s_aw[kChunkWords], s_bw[2u * kChunkWords];
shared float s_part[64];

// Thread t = 32 slot + lane: partial `lane` of output (r, c + slot) over i = lane, lane + 32, ...
// in [0, k) (b transposed, rows whole 16-byte units), slot 1 only with `pair`. Each pass copies
// up to kChunkWords words of a's row and of both b rows into shared memory with 16-byte loads,
// all issued before any is used (a latency-bound decode GEMV waits on them), then adds in order.
float dot32_rows16(uint t, uint r, uint c, uint boff, bool pair) {
  uint lane = t & 31u, slot = t >> 5u, pa = sb_per_word(DT), pb = sb_per_word(B_DT);
  uint qa = r * args.k / (4u * pa), qb = (boff + c * args.k) / (4u * pb), row_b = args.k / (4u * pb);
  uint chunk = kChunkWords * min(pa, pb);  // elements per pass: a multiple of 32
  precise float part = 0.0;
  for (uint c0 = 0u; c0 < args.k; c0 += chunk) {
    uint len = min(chunk, args.k - c0), na = len / (4u * pa), nb = len / (4u * pb);
    uint a0 = qa + c0 / (4u * pa), b0 = qb + c0 / (4u * pb);
    uvec4 va[kUnits], vb[kUnits], vc[kUnits];
    [[unroll]] for (uint j = 0u; j < kUnits; ++j) {
      uint u = t + 64u * j;
      va[j] = a4[a0 + min(u, na - 1u)];
      vb[j] = b4[b0 + min(u, nb - 1u)];
      vc[j] = pair ? b4[b0 + row_b + min(u, nb - 1u)] : uvec4(0u);
    }
    [[unroll]] for (uint j = 0u; j < kUnits; ++j) {
      uint u = t + 64u * j;
      [[unroll]] for (uint w = 0u; w < 4u; ++w) {
        if (u < na) s_aw[4u * u + w] = va[j][w];
        if (u < nb) {
          s_bw[4u * u + w] = vb[j][w];
          s_bw[kChunkWords + 4u * u + w] = vc[j][w];
        }
      }
    }
    barrier();
    if (slot == 0u || pair) {
      for (uint i = lane; i < len; i += 32u) {
        float av = sb_decode(s_aw[sb_word(DT, i)], DT, i);
        float bv = sb_decode(s_bw[slot * kChunkWords + sb_word(B_DT, i)], B_DT, i);
        part = part + av * bv;
      }
    }
    barrier();
  }
  return part;
}

#ifdef SB_NORM
// Row r of a, normalized, in s_aw as a's words (k <= kNormMax, whole 8-element units): thread t
// takes units t, t + 64, ...; their x, residual and weights are loaded together, then the b
// rows' words (their loads in flight through the norm's barriers), stored to s_bw after it.
const uint kNormMax = 2048u, kNormUnits = kNormMax / 8u / 64u;
shared float s_row[kNormMax];
shared float s_npart[32];
shared float s_inv;

SB_LOAD_UNIT(load_x_unit, a4, DT)
SB_LOAD_UNIT(load_res_unit, res4, DT)

void stage_norm_row(uint t, uint r, uint c, uint boff, bool pair, bool first) {
  uint units = args.k / 8u, pb = sb_per_word(B_DT);
  uint qb = (boff + c * args.k) / (4u * pb), row_b = args.k / (4u * pb), nb = args.k / (4u * pb);
  float v[kNormUnits][8], rv[kNormUnits][8];
  uint wraw[kNormUnits][8];
  [[unroll]] for (uint j = 0u; j < kNormUnits; ++j) {
    uint u = min(t + 64u * j, units - 1u), e = r * args.k + u * 8u;
    load_x_unit(e, v[j]);
    if (args.has_residual != 0u) load_res_unit(e, rv[j]);
    [[unroll]] for (uint i = 0u; i < 8u; ++i) wraw[j][i] = norm_w[sb_word(NORM_W_DT, u * 8u + i)];
  }
  uvec4 vb[kUnits], vc[kUnits];
  [[unroll]] for (uint j = 0u; j < kUnits; ++j) {
    uint u = min(t + 64u * j, nb - 1u);
    vb[j] = b4[qb + u];
    vc[j] = pair ? b4[qb + row_b + u] : uvec4(0u);
  }
  [[unroll]] for (uint j = 0u; j < kNormUnits; ++j) {
    uint u = t + 64u * j;
    if (args.has_residual != 0u) {
      [[unroll]] for (uint i = 0u; i < 8u; ++i) {
        precise float a = v[j][i] + rv[j][i];
        v[j][i] = sb_round_to(a, DT);
      }
    }
    if (u < units) {
      [[unroll]] for (uint i = 0u; i < 8u; ++i) s_row[u * 8u + i] = v[j][i];
      if (first && args.has_residual != 0u) SB_STORE_UNIT(norm_sum4, r * args.k + u * 8u, v[j], DT)
    }
  }
  barrier();
  if (t < 32u) {  // partial t: elements t, t + 32, ... in order
    precise float p = 0.0;
    for (uint i = t; i < args.k; i += 32u) p = p + s_row[i] * s_row[i];
    s_npart[t] = p;
  }
  barrier();
  if (t == 0u) s_inv = sb_tree32_rsqrt(s_npart, args.inv_d, args.eps);
  barrier();
  float inv = s_inv;
  [[unroll]] for (uint j = 0u; j < kNormUnits; ++j) {
    uint u = t + 64u * j;
    float y[8];
    [[unroll]] for (uint i = 0u; i < 8u; ++i) {
      precise float m = (v[j][i] * inv) * sb_decode(wraw[j][i], NORM_W_DT, u * 8u + i);
      y[i] = sb_round_to(m, DT);
    }
    if (u < units) {
      if (sb_is16(DT)) {
        [[unroll]] for (uint i = 0u; i < 4u; ++i) s_aw[u * 4u + i] = sb_encode_word(y[2u * i], y[2u * i + 1u], DT);
      } else {
        [[unroll]] for (uint i = 0u; i < 8u; ++i) s_aw[u * 8u + i] = floatBitsToUint(y[i]);
      }
      if (first) SB_STORE_UNIT(norm_out4, r * args.k + u * 8u, y, DT)
    }
  }
  [[unroll]] for (uint j = 0u; j < kUnits; ++j) {
    uint u = t + 64u * j;
    [[unroll]] for (uint w = 0u; w < 4u; ++w) {
      if (u < nb) {
        s_bw[4u * u + w] = vb[j][w];
        s_bw[kChunkWords + 4u * u + w] = vc[j][w];
      }
    }
  }
  memoryBarrierBuffer();  // the first workgroup's out and sum before its count
  barrier();
}

// dot32_rows16 over a's and b's rows already in shared memory (one pass).
float dot32_staged(uint t, bool pair) {
  uint lane = t & 31u, slot = t >> 5u;
  precise float part = 0.0;
  if (slot == 0u || pair) {
    for (uint i = lane; i < args.k; i += 32u) {
      float av = sb_decode(s_aw[sb_word(DT, i)], DT, i);
      float bv = sb_decode(s_bw[slot * kChunkWords + sb_word(B_DT, i)], B_DT, i);
      part = part + av * bv;
    }
  }
  return part;
}
#endif

// Output e (slot 0) and, with `pair`, e + 1 of the same row (slot 1): partials, then each
// slot's halving tree 16..1, then the bias.
void outputs_rows16(uint e, bool pair, out float v0, out float v1) {
  uint t = gl_LocalInvocationID.x, lane = t & 31u;
  uint r = e / args.cols, c = e % args.cols;  // r: row over all batches
  uint boff = (r / args.rows / args.group) * args.cols * args.k;  // b's batch (grouped)
#ifdef SB_NORM
  stage_norm_row(t, r, c, boff, pair, c == 0u);
  s_part[t] = dot32_staged(t, pair);
#else
  s_part[t] = dot32_rows16(t, r, c, boff, pair);
#endif
  barrier();
  for (uint s = 16u; s >= 1u; s >>= 1) {
    if (lane < s) {
      precise float sum = s_part[t] + s_part[t + s];
      s_part[t] = sum;
    }
    barrier();
  }
  precise float a = s_part[0], b = s_part[32];
  if (args.has_bias != 0u) {
    a = a + SB_LOAD(bias, BIAS_DT, c);
    if (pair) b = b + SB_LOAD(bias, BIAS_DT, c + 1u);
  }
  v0 = a;
  v1 = b;
  barrier();  // s_part is reused by a second call
}

void main() {
  uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  uint per = sb_per_word(DT), i = wg * per, count = args.batch * args.rows * args.cols;
  if (i >= count) return;
  bool two = per == 2u && i + 1u < count;
  bool pair = two && i % args.cols + 1u < args.cols;  // both elements in one row of a
  float v0, v1, w1;
  outputs_rows16(i, pair, v0, v1);
  if (two && !pair) outputs_rows16(i + 1u, false, v1, w1);
  if (gl_LocalInvocationID.x == 0u) {
    o[wg] = sb_encode_word(v0, two ? v1 : 0.0, DT);
#ifdef SB_COUNT
    memoryBarrierBuffer();  // the word before the count
    atomicAdd(done[0], 1u);
#endif
  }
}
#else
shared float s_part[32];
shared float s_out[2];
void dot32(uint e, uint slot) {
  uint lane = gl_LocalInvocationID.x;
  uint r = e / args.cols, c = e % args.cols;  // r: row over all batches
  uint boff = (r / args.rows / args.group) * args.cols * args.k;  // b's batch (grouped)
  precise float part = 0.0;
  // Sixteen (a, b) pairs loaded before any is used, at clamped indices (no branch around
  // a load): one memory wait per sixteen terms.
  for (uint i0 = lane; i0 < args.k; i0 += 512u) {
    float av[16], bv[16];
    [[unroll]] for (uint j = 0u; j < 16u; ++j) {
      uint i = min(i0 + 32u * j, args.k - 1u);
      uint bi = boff + (args.transpose_b != 0u ? c * args.k + i : i * args.cols + c);
      av[j] = SB_LOAD(a, DT, r * args.k + i);
      bv[j] = SB_LOAD(b, B_DT, bi);
    }
    [[unroll]] for (uint j = 0u; j < 16u; ++j)
      if (i0 + 32u * j < args.k) part = part + av[j] * bv[j];
  }
  s_part[lane] = part;
  barrier();
  for (uint s = 16u; s >= 1u; s >>= 1) {
    if (lane < s) {
      precise float sum = s_part[lane] + s_part[lane + s];
      s_part[lane] = sum;
    }
    barrier();
  }
  if (lane == 0u) {
    precise float v = s_part[0];
    if (args.has_bias != 0u) v = v + SB_LOAD(bias, BIAS_DT, c);
    s_out[slot] = v;
  }
  barrier();
}

void main() {
  uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  uint per = sb_per_word(DT);
  uint i = wg * per;
  uint count = args.batch * args.rows * args.cols;
  if (i >= count) return;
  dot32(i, 0u);
  bool two = per == 2u && i + 1u < count;
  if (two) dot32(i + 1u, 1u);
  if (gl_LocalInvocationID.x == 0u) {
    o[wg] = sb_encode_word(s_out[0], two ? s_out[1] : 0.0, DT);
  }
}
#endif
