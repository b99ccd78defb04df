// The GPU memory pool (backend/gpu/gpu_memory.h) over a fake allocator with a capacity: freed
// blocks serve later requests up to half their size (large temporaries whose sizes vary op to op
// reuse each other), and when the device is full the free blocks are given back before failing;
// a runtime out of memory inside an op syncs, letting go of earlier ops' operands only.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

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
    b.mapped = static_cast<uint8_t*>(std::calloc(size, 1));
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

TEST(MemoryPool, BlocksGivenBackWhileWorkIsQueuedServeOnlyDispatchesUntilItFinishes) {
  int creates = 0;
  uint64_t in_use = 0;
  auto pool = std::make_shared<MemoryPool>(std::make_unique<FakeAllocator>(1ull << 40, &creates, &in_use));
  pool->set_queued();  // work that may use the block below is being recorded
  uint8_t* first = nullptr;
  {
    auto a = MemoryPool::take(pool, kMiB);
    ASSERT_TRUE(a.is_ok());
    first = a->get();
  }
  auto host = MemoryPool::take(pool, kMiB);  // the host would write it now: not the queued block
  ASSERT_TRUE(host.is_ok());
  EXPECT_NE(host->get(), first);
  EXPECT_FALSE(pool->queued(host->get()));
  EXPECT_EQ(creates, 2);
  {
    auto dev = MemoryPool::take(pool, kMiB, true);  // a dispatch's output: the block given back first
    ASSERT_TRUE(dev.is_ok());
    EXPECT_EQ(dev->get(), first);
    EXPECT_TRUE(pool->queued(first + 100));
  }
  EXPECT_EQ(creates, 2);
  pool->settle();                             // the work finished
  auto again = MemoryPool::take(pool, kMiB);  // idle blocks serve host writes again
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(again->get(), first);
  EXPECT_FALSE(pool->queued(first));
  EXPECT_EQ(creates, 2);
}

// A runtime over the fake pool whose queued work is always finished at sync().
class FakeRuntime final : public MappedRuntime {
 public:
  explicit FakeRuntime(std::shared_ptr<MemoryPool> pool, bool reuse = false) {
    EXPECT_TRUE(init(std::move(pool), 1ull << 40, 16).is_ok());
    reuse_queued_ = reuse;
  }
  const std::string& description() const override { return name_; }
  Status sync() override {
    ++syncs;
    finish_submission();
    return Status::ok();
  }
  int syncs = 0;

 protected:
  Status record_dispatch(const char*, const std::vector<BufferRef>&, const void*, size_t, uint64_t,
                         const SpecConstants&, uint32_t) override {
    return Status::ok();
  }

 private:
  std::string name_ = "fake";
};

TEST(MappedRuntime, OutOfMemoryInsideAnOpKeepsWhatTheOpBound) {
  int creates = 0;
  uint64_t in_use = 0;
  auto pool = std::make_shared<MemoryPool>(std::make_unique<FakeAllocator>(3 * kMiB + 4096, &creates, &in_use));
  FakeRuntime rt(pool);
  rt.op_boundary();
  {  // an earlier op's temporary: only the queued work holds it
    auto a = rt.alloc(DType::kF32, {static_cast<int64_t>(2 * kMiB / 4)});
    ASSERT_TRUE(a.is_ok());
    ASSERT_TRUE(rt.bind(*a, false).is_ok());
  }
  rt.op_boundary();
  auto s = rt.scratch(256 << 10, 0);  // this op's scratch: it dispatches with it later
  ASSERT_TRUE(s.is_ok());
  auto big = rt.alloc(DType::kF32, {static_cast<int64_t>(kMiB / 4)});  // fits only once the 2 MiB go
  ASSERT_TRUE(big.is_ok()) << big.status().to_string();
  Block b;
  uint64_t off = 0;
  bool inside = false;
  EXPECT_TRUE(pool->find(reinterpret_cast<const void*>(s->buffer + s->offset), 4, b, off, inside))
      << "the op's scratch was let go by the sync";
  EXPECT_EQ(in_use, kMiB + (256 << 10) + 256);  // the new block, the scratch, the error word
}

// A finished op's temporary serves the next op's output while the submission is still queued
// (no sync, no new block); host-written memory (scratch) never takes it, and a host fill of a
// tensor that did waits for the queued work first.
TEST(MappedRuntime, FinishedOpsTemporariesServeLaterDispatchesNotTheHost) {
  int creates = 0;
  uint64_t in_use = 0;
  auto pool = std::make_shared<MemoryPool>(std::make_unique<FakeAllocator>(1ull << 40, &creates, &in_use));
  FakeRuntime rt(pool, true);
  const int base = creates;  // the error word
  rt.op_boundary();
  const void* first = nullptr;
  {
    auto a = rt.alloc(DType::kF32, {static_cast<int64_t>(kMiB / 4)});
    ASSERT_TRUE(a.is_ok());
    ASSERT_TRUE(rt.bind(*a, false).is_ok());
    first = a->data();
  }  // the interpreter dropped it; the queued op still reads it
  rt.op_boundary();
  auto s = rt.scratch(kMiB, 7);
  ASSERT_TRUE(s.is_ok());
  EXPECT_NE(reinterpret_cast<const void*>(s->buffer), first) << "host words written into memory queued work reads";
  auto b = rt.alloc(DType::kF32, {static_cast<int64_t>(kMiB / 4)});
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(b->data(), first);
  EXPECT_EQ(creates, base + 2);  // the first temporary and the scratch
  EXPECT_EQ(rt.syncs, 0);
  ASSERT_TRUE(rt.fill(*b, 1).is_ok());  // the host writes it: the queued work finishes first
  EXPECT_EQ(rt.syncs, 1);
  EXPECT_EQ(b->data_as<uint32_t>()[0], 1u);
}

// A large host tensor is copied in by several threads (slices of 4 KiB multiples): every byte
// arrives, the unaligned tail included.
TEST(MappedRuntime, LargeUploadsArriveWhole) {
  int creates = 0;
  uint64_t in_use = 0;
  auto pool = std::make_shared<MemoryPool>(std::make_unique<FakeAllocator>(1ull << 40, &creates, &in_use));
  FakeRuntime rt(pool, true);
  const int64_t n = (int64_t{40} << 20) / 4 + 3;
  auto host = Tensor::uninitialized(DType::kU32, {n});
  ASSERT_TRUE(host.is_ok());
  auto* w = host->mutable_data_as<uint32_t>();
  for (int64_t i = 0; i < n; ++i) w[i] = static_cast<uint32_t>(i * 2654435761u);
  auto ref = rt.bind(*host, false);
  ASSERT_TRUE(ref.is_ok());
  const auto* got = reinterpret_cast<const uint32_t*>(ref->buffer + ref->offset);
  EXPECT_EQ(std::memcmp(got, w, static_cast<size_t>(n) * 4), 0);
}

}  // namespace
}  // namespace switchboard::gpu
