// The host side of metal_shaders/probe.comp: the start-up numerics probe (the inputs it
// feeds a device and the check of its results against the CPU's contract arithmetic), and
// stream_read, from which the read floor is measured: what any kernel can reach on a
// device (read bandwidth, the fixed cost of a submission) from its own timestamps.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "exact_math.h"
#include "gpu_kernel_table.h"
#include "gpu_runtime.h"

namespace switchboard::gpu {

std::vector<float> probe_inputs() {
  const float sub = 1.1754944e-38f;  // FLT_MIN: products below it are subnormal
  return {
      1.0f + 0x1p-23f,
      1.0f - 0x1p-24f,
      -1.0f,  // a*b+c: fused and unfused differ
      3.0f,
      0x1.555556p-2f,
      -1.0f,  // 3 * (1/3) - 1 exposes contraction
      sub,
      0.25f,
      sub,  // subnormal product
      0x1p-130f,
      2.0f,
      0x1p-131f,  // subnormal inputs
      1.0f,
      0x1p-24f,
      1.5f,  // ties to even in add
      -20.5f,
      7.0f,
      2.5f,  // exp, rcp, round_even(2.5) = 2
      88.5f,
      1e-3f,
      -3.5f,  // exp overflow, round_even(-3.5) = -4
      -87.5f,
      4.3e37f,
      1e30f,  // exp underflow, rcp range edge
  };
}

Status check_probe(const std::string& device, const std::vector<float>& in, const float* got, bool& exact_division) {
  static const char* kWhat[] = {"a*b+c (no fusion)", "a*b", "a-c", "exp", "rcp", "round_even"};
  exact_division = true;
  for (size_t i = 0; i < in.size() / 3; ++i) {
    const float a = in[3 * i], b = in[3 * i + 1], c = in[3 * i + 2];
    const float want[6] = {a * b + c, a * b, a - c, exact::exp(a), exact::rcp(b), exact::round_even(c)};
    for (int k = 0; k < 6; ++k)
      SB_CHECK_OR_RETURN(f32_bits(got[7 * i + k]) == f32_bits(want[k]), StatusCode::kFailedPrecondition,
                         "%s: exact mode refused: the start-up probe computed %s(%a, %a, %a) = %a, the contract "
                         "says %a (rounding, contraction or denormal behaviour differs)",
                         device.c_str(), kWhat[k], a, b, c, got[7 * i + k], want[k]);
    exact_division &= f32_bits(got[7 * i + 6]) == f32_bits(a / b);
  }
  return Status::ok();
}

Status dispatch_stream_read(GpuRuntime& rt, const BufferRef& data, uint64_t bytes, uint32_t groups,
                            const BufferRef& out) {
  SB_CHECK_OR_RETURN(bytes % 16 == 0 && bytes <= data.range && bytes / 16 <= UINT32_MAX, StatusCode::kInvalidArgument,
                     "stream_read: %llu bytes of a %llu-byte buffer", (unsigned long long)bytes,
                     (unsigned long long)data.range);
  SB_CHECK_OR_RETURN(out.range >= uint64_t{1024} * groups, StatusCode::kInvalidArgument,
                     "stream_read: %u workgroups need %llu output bytes, got %llu", groups,
                     (unsigned long long)(uint64_t{1024} * groups), (unsigned long long)out.range);
  kernels::StreamArgs a{};
  a.n = static_cast<uint32_t>(bytes / 16);
  a.magic = 0x9e3779b9u;  // a store only where the words' XOR happens to equal it
  return rt.dispatch("stream_read", {data, out}, &a, sizeof(a), uint64_t{groups} * 256);
}

namespace {

// Device microseconds of `reps` submissions of one read each (region i of `regions`).
Result<std::vector<double>> time_reads(GpuRuntime& rt, const std::vector<BufferRef>& regions, uint64_t bytes,
                                       uint32_t groups, const BufferRef& out, int reps) {
  std::vector<double> us;
  for (int i = 0; i < reps; ++i) {
    SB_RETURN_IF_ERROR(dispatch_stream_read(rt, regions[static_cast<size_t>(i) % regions.size()], bytes, groups, out));
    SB_RETURN_IF_ERROR(rt.sync());
    SB_CHECK_OR_RETURN(rt.last_gpu_us() > 0, StatusCode::kUnimplemented, "%s has no timestamps",
                       rt.description().c_str());
    us.push_back(rt.last_gpu_us());
  }
  std::sort(us.begin(), us.end());
  return us;
}

}  // namespace

Result<ReadFloor> measure_read_floor(GpuRuntime& rt, uint64_t bytes) {
  // 128 MiB: the storage-buffer range every device here binds (lavapipe's limit).
  constexpr uint64_t kBig = uint64_t{128} << 20, kSmall = uint64_t{32} << 20;
  constexpr uint32_t kGroups = 2112;                // 16 per H100 SM: its best read_layer grid (bench/RESULTS.md)
  bytes = bytes <= kBig / 4 ? bytes / 16 * 16 : 0;  // larger reads would not be cold
  SB_ASSIGN_OR_RETURN(Tensor data, rt.alloc(DType::kU32, {static_cast<int64_t>(kBig / 4)}));
  SB_ASSIGN_OR_RETURN(BufferRef whole, rt.bind(data, false));
  SB_ASSIGN_OR_RETURN(BufferRef out, rt.scratch(size_t{1024} * kGroups, 0));
  // `bytes` regions across the whole buffer, visited in turn: each is cold (evicted by the others) when read.
  std::vector<BufferRef> regions;
  for (uint64_t off = 0; bytes > 0 && off + bytes <= kBig; off += (bytes + 255) / 256 * 256)
    regions.push_back({whole.buffer, whole.offset + off, bytes});
  ReadFloor f;
  SB_ASSIGN_OR_RETURN(auto empty, time_reads(rt, {whole}, 0, 1, out, 21));
  f.empty_us = empty[empty.size() / 2];
  if (bytes > 0) {
    SB_ASSIGN_OR_RETURN(auto read,
                        time_reads(rt, regions, bytes, kGroups, out, 2 * static_cast<int>(regions.size()) + 1));
    f.read_us = read[read.size() / 2];
  }
  SB_ASSIGN_OR_RETURN(auto big, time_reads(rt, {whole}, kBig, kGroups, out, 5));
  SB_ASSIGN_OR_RETURN(auto small, time_reads(rt, {{whole.buffer, whole.offset, kSmall}}, kSmall, kGroups, out, 5));
  // The slope between two sizes: bandwidth without the submission's fixed cost.
  f.gbps = static_cast<double>(kBig - kSmall) / ((big.front() - small.front()) * 1e3);
  return f;
}

}  // namespace switchboard::gpu
