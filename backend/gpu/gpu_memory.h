// Device memory the host can map (Vulkan host-visible memory, Metal shared
// buffers), pooled by size class, and the GpuRuntime operations that only need
// that: tensors that live in it, binding (with uploads of host tensors and a cache
// of uploaded constants), scratch and the error word. Backends add blocks,
// dispatch and sync.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gpu_runtime.h"

namespace switchboard::gpu {

struct Block {
  uint64_t handle = 0;     // VkBuffer / id<MTLBuffer>
  uint64_t memory = 0;     // VkDeviceMemory (Vulkan only)
  uint8_t* mapped = nullptr;
  uint64_t size = 0;
};

// Creates and destroys blocks; owned by the pool, so it outlives every block.
class BlockAllocator {
 public:
  virtual ~BlockAllocator() = default;
  virtual Result<Block> create(uint64_t size) = 0;
  virtual void destroy(const Block& b) = 0;
};

class MemoryPool {
 public:
  explicit MemoryPool(std::unique_ptr<BlockAllocator> alloc) : alloc_(std::move(alloc)) {}
  ~MemoryPool();
  // A block of at least `bytes` whose shared_ptr returns it to the pool. With `queued_ok`, a
  // block that queued work may still read or write can be taken (only dispatches may touch it:
  // they are ordered after that work by the runtime's hazard barriers; the host may not).
  static Result<std::shared_ptr<uint8_t>> take(const std::shared_ptr<MemoryPool>& pool, uint64_t bytes,
                                               bool queued_ok = false);
  // The live block holding [p, p + bytes), with p's offset in it; false if none.
  bool find(const void* p, uint64_t bytes, Block& block, uint64_t& offset, bool& inside) const;
  // Destroys every idle free block (when the device runs out of memory); returns their bytes.
  uint64_t trim();
  // Blocks the allocator has created so far.
  uint64_t created() const {
    std::lock_guard<std::mutex> lock(mu_);
    return created_;
  }
  // Work that binds blocks is being recorded: a block given back now stays "queued" until
  // settle(), called once that work has finished.
  void set_queued() {
    if (queued_.load(std::memory_order_relaxed)) return;
    std::lock_guard<std::mutex> lock(mu_);
    queued_ = true;
  }
  void settle();
  // Whether p's block was taken while queued work may still use it (the host must not write it).
  bool queued(const void* p) const;

 private:
  struct Live {
    Block block;
    uint64_t queued_epoch = 0;  // taken queued in this epoch (0: taken idle)
  };
  std::unique_ptr<BlockAllocator> alloc_;
  mutable std::mutex mu_;  // tensors may be freed on any thread
  std::map<uint64_t, std::vector<Block>> free_, queued_free_;  // idle / given back while work was queued
  std::map<uintptr_t, Live> live_;                             // mapped base -> block
  uint64_t created_ = 0, epoch_ = 1;
  std::atomic<bool> queued_{false};  // written under mu_; read without it by set_queued()
};

// GpuRuntime over a MemoryPool. Backends call init() once the pool exists.
class MappedRuntime : public GpuRuntime {
 public:
  Result<Tensor> alloc(DType dtype, Shape shape) override;
  Result<Tensor> alloc_host_written(DType dtype, Shape shape) override;
  Result<BufferRef> bind(const Tensor& t, bool constant) override;
  Result<BufferRef> scratch(size_t bytes, uint32_t fill_word) override;
  Status fill(const Tensor& t, uint32_t word) override;
  Result<Tensor> device_tensor(const Tensor& t) override;
  BufferRef error_word() const override;
  long queued_refs(const Tensor& t) const override;
  bool wants_flush() const override { return inflight_bytes_ > inflight_budget_; }
  void op_boundary() override;

 protected:
  Status init(std::shared_ptr<MemoryPool> pool, uint64_t max_range, uint64_t alignment);
  void set_flush_bytes(uint64_t bytes) { inflight_budget_ = bytes; }  // 0: decided on first use
  // Runs numerics_probe (probe.comp) and compares it bit for bit with the CPU's
  // contract arithmetic; sets exact_division_. An error refuses the device.
  Status probe_numerics();
  // With int8_mma_ set: checks the accumulator layout qmm_mma assumes (qmm_mma_probe);
  // a device that differs keeps int8_mma_ off (the portable tiles run instead).
  Status probe_mma_layout();
  // Drops the operands of finished work and returns (and clears) the error word's bits.
  uint32_t finish_submission();
  // sync() inside an op: the operands the op has bound so far stay kept (it may dispatch with
  // them after the sync); those of earlier ops are let go.
  Status sync_within_op();

  // A recorded submission's operands (kept while it lives; they count as queued) and its
  // scratch words, filled again before each replay.
  struct Kept {
    std::vector<Tensor> tensors;
    std::vector<std::pair<Tensor, uint32_t>> fills;
  };
  bool keeping_fills_ = false;  // while recording: scratch() notes its fills
  // The operands recorded since the last finished submission, moved out of the queue's keep.
  Kept take_kept();
  void release_kept(const Kept& k);
  static void refill(const Kept& k);
  Result<Tensor> take_block(DType dtype, Shape shape, bool queued_ok);
  // t's bytes into dev's mapping (counted in host_costs_).
  void copy_in(const Tensor& dev, const Tensor& t);

  std::shared_ptr<MemoryPool> pool_;
  // Temporaries of finished ops go back to the pool while the submission is still queued, and
  // later dispatches reuse them (the backend's hazard tracking orders the accesses by buffer
  // range). Off while recording for replay: recorded work keeps its buffers.
  bool reuse_queued_ = false;

 private:
  uint64_t max_range_ = 0, alignment_ = 16;
  // Bytes allocated since the last finished submission: the queued work keeps every tensor it
  // binds until then, so a long prefill holds all its temporaries; past the budget (an eighth of
  // the device memory free when first asked) the interpreter syncs between ops.
  uint64_t inflight_bytes_ = 0, inflight_budget_ = 0;
  // Operands of recorded dispatches, and how many of them hold each storage.
  std::vector<Tensor> keep_;
  // keep_'s size when the current op began.
  size_t op_mark_ = 0;
  std::unordered_map<const void*, long> kept_, recorded_;  // storage -> queued / recorded references
  std::vector<std::pair<Tensor, uint32_t>> fills_;
  struct KeyHash {
    size_t operator()(const std::pair<const void*, size_t>& k) const {
      return std::hash<const void*>()(k.first) ^ (k.second * 0x9E3779B97F4A7C15ull);
    }
  };
  // Host bytes (address, size) -> their device copy and its binding: looked up first on every
  // bind of a weight (the copy lives here, so a bind neither searches the pool nor keeps it).
  struct Uploaded {
    Tensor dev;
    BufferRef ref;
  };
  std::unordered_map<std::pair<const void*, size_t>, Uploaded, KeyHash> constants_;
  Tensor error_;
};

}  // namespace switchboard::gpu
