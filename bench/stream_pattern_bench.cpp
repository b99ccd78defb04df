// Read bandwidth of the decode weight pattern without any arithmetic: each
// thread reads 4 random 768 KiB regions (one expert projection each) out of a
// 288 MiB pool, as 1, 2 or 4 interleaved streams, with or without software
// prefetch. Prints one JSON line per configuration (median iteration per thread;
// the pool is larger than the last-level cache, but random picks can still hit it).
// Run: build/release/bin/stream_pattern_bench
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

namespace {

constexpr size_t kRegion = 786432, kRegions = 384;

__attribute__((target("avx512f"))) double read_regions(const uint8_t* pool, int streams, int prefetch, uint32_t seed) {
  std::mt19937 rng(seed);
  __m512i acc = _mm512_setzero_si512();
  std::vector<double> rates;
  for (int it = 0; it < 300; ++it) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int e = 0; e < 4; ++e) {
      const uint8_t* base = pool + (rng() % kRegions) * kRegion;
      const size_t per = kRegion / static_cast<size_t>(streams);
      for (size_t off = 0; off < per; off += 64)
        for (int s = 0; s < streams; ++s) {
          const uint8_t* p = base + static_cast<size_t>(s) * per + off;
          if (prefetch) _mm_prefetch(reinterpret_cast<const char*>(p + prefetch), _MM_HINT_T0);
          acc = _mm512_xor_si512(acc, _mm512_load_si512(p));
        }
    }
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (it >= 10) rates.push_back(4.0 * kRegion / sec / 1e9);
  }
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, acc);
  volatile int32_t sink = lanes[0];
  (void)sink;
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

}  // namespace

int main() {
  if (!__builtin_cpu_supports("avx512f")) {
    std::printf("{\"skipped\": \"no AVX-512\"}\n");
    return 0;
  }
  const size_t total = kRegion * kRegions;
  auto* pool = static_cast<uint8_t*>(std::aligned_alloc(size_t{2} << 20, total));
  madvise(pool, total, MADV_HUGEPAGE);
  std::memset(pool, 1, total);
  for (int threads : {1, 2})
    for (int streams : {1, 2, 4})
      for (int prefetch : {0, 4096}) {
        std::vector<double> best(static_cast<size_t>(threads));
        std::vector<std::thread> pool_threads;
        for (int t = 0; t < threads; ++t)
          pool_threads.emplace_back([&, t] { best[t] = read_regions(pool, streams, prefetch, 1u + t); });
        for (auto& th : pool_threads) th.join();
        double sum = 0;
        for (double b : best) sum += b;
        std::printf("{\"threads\": %d, \"streams\": %d, \"prefetch_bytes\": %d, \"gbps_per_thread\": %.1f, \"gbps_sum\": %.1f}\n",
                    threads, streams, prefetch, best[0], sum);
      }
  std::free(pool);
  return 0;
}
