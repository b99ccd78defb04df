// The GPU memory pool (backend/gpu/gpu_memory.h) over a fake allocator with a capacity: freed
// blocks serve later requests up to half their size (large temporaries whose sizes vary op to op
// reuse each other), and when the device is full the free blocks are given back before failing.
#include <gtest/gtest.h>

#include <cstdlib>

#include "gpu_memory.h"

namespace switchboard::gpu {
namespace {

class FakeAllocator : public BlockAllocator {
 public:
  FakeAllocator(uint64_t capacity, int* creates, uint64_t* in_use)
      : capacity_(capacity), creates_(creates), in_use_(in_use) {}
  Result<Block> create(uint64_t size) override {
    if (*in_use_ + size > capacity_) return make_error(StatusCode::kResourceExhausted, "fake device full");
    ++*creates_;
    *in_use_ += size;
    Block b;
    b.mapped = static_cast<uint8_t*>(std::malloc(1));
    b.handle = reinterpret_cast<uint64_t>(b.mapped);
    b.size = size;
    return b;
  }
  void destroy(const Block& b) override {
    *in_use_ -= b.size;
    std::free(b.mapped);
  }

 private:
  uint64_t capacity_;
  int* creates_;
  uint64_t* in_use_;
};

constexpr uint64_t kMiB = 1ull << 20;

TEST(MemoryPool, LargeFreeBlocksServeSmallerRequestsUpToHalf) {
  int creates = 0;
  uint64_t in_use = 0;
  auto pool = std::make_shared<MemoryPool>(std::make_unique<FakeAllocator>(1ull << 40, &creates, &in_use));
  {
    auto a = MemoryPool::take(pool, 101 * kMiB);
    ASSERT_TRUE(a.is_ok());
  }
  {
    auto b = MemoryPool::take(pool, 100 * kMiB);
    ASSERT_TRUE(b.is_ok());
  }  // reuses the 101 MiB block
  EXPECT_EQ(creates, 1);
  {
    auto c = MemoryPool::take(pool, 20 * kMiB);
    ASSERT_TRUE(c.is_ok());
  }  // class 32 MiB: under half of it
  EXPECT_EQ(creates, 2);
  EXPECT_EQ(pool->trim(), 101 * kMiB + 32 * kMiB);
  EXPECT_EQ(in_use, 0u);
}

TEST(MemoryPool, AFullDeviceGetsTheFreeBlocksBackFirst) {
  int creates = 0;
  uint64_t in_use = 0;
  auto pool = std::make_shared<MemoryPool>(std::make_unique<FakeAllocator>(300 * kMiB, &creates, &in_use));
  {
    auto a = MemoryPool::take(pool, 200 * kMiB);
    ASSERT_TRUE(a.is_ok());
  }                                             // freed, kept in the pool
  auto b = MemoryPool::take(pool, 250 * kMiB);  // does not fit beside it: the pool gives it back
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  EXPECT_EQ(in_use, 250 * kMiB);
  auto c = MemoryPool::take(pool, 100 * kMiB);  // nothing left to give back: a clear error
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace switchboard::gpu
