#include "gpu_memory.h"
#include "log.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <system_error>
#include <thread>

#include "gpu_kernel_table.h"

namespace switchboard::gpu {
namespace {

double since_us(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

// Size classes: powers of two from 256 bytes, then whole MiB above 64 MiB.
uint64_t size_class(uint64_t bytes) {
  if (bytes > (64ull << 20)) return (bytes + (1ull << 20) - 1) & ~((1ull << 20) - 1);
  uint64_t c = 256;
  while (c < bytes) c <<= 1;
  return c;
}

// One thread writing write-combined device memory (and faulting in a mapped weights file)
// moves a few GB/s; a session's weights are many GB, so large copies are split over threads.
void parallel_copy(void* dst, const void* src, size_t bytes) {
  constexpr size_t kMinSlice = size_t{8} << 20;
  const size_t threads = std::min<size_t>({8, std::max(1u, std::thread::hardware_concurrency()), bytes / kMinSlice});
  if (threads < 2) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const size_t slice = (bytes / threads + 4095) & ~size_t{4095};
  std::vector<std::thread> pool;
  auto part = [=](size_t i) {
    std::memcpy(static_cast<uint8_t*>(dst) + i * slice, static_cast<const uint8_t*>(src) + i * slice,
                std::min(slice, bytes - i * slice));
  };
  for (size_t i = 1; i < threads && i * slice < bytes; ++i) {
    try {
      pool.emplace_back(part, i);
    } catch (const std::system_error&) {  // no thread to be had: this one copies the slice
      part(i);
    }
  }
  part(0);
  for (std::thread& th : pool) th.join();
}

}  // namespace

MemoryPool::~MemoryPool() {
  for (auto* lists : {&free_, &queued_free_})
    for (auto& [size, blocks] : *lists)
      for (const Block& b : blocks) alloc_->destroy(b);
  for (auto& [base, l] : live_) alloc_->destroy(l.block);
}

namespace {
// The smallest free block of class `cls` up to twice it: large temporaries (whole MiB classes)
// whose sizes vary op to op reuse each other instead of piling up.
bool take_free(std::map<uint64_t, std::vector<Block>>& lists, uint64_t cls, Block& b) {
  for (auto it = lists.lower_bound(cls); it != lists.end() && it->first <= 2 * cls; ++it) {
    if (it->second.empty()) continue;
    b = it->second.back();
    it->second.pop_back();
    return true;
  }
  return false;
}
}  // namespace

Result<std::shared_ptr<uint8_t>> MemoryPool::take(const std::shared_ptr<MemoryPool>& pool, uint64_t bytes,
                                                  bool queued_ok) {
  const uint64_t cls = size_class(bytes == 0 ? 4 : bytes);
  Block b;
  uint64_t queued_epoch = 0;
  {
    std::lock_guard<std::mutex> lock(pool->mu_);
    if (queued_ok && take_free(pool->queued_free_, cls, b)) queued_epoch = pool->epoch_;
    if (!b.mapped) take_free(pool->free_, cls, b);
  }
  if (!b.mapped) {
    auto made = pool->alloc_->create(cls);
    if (!made.is_ok() && made.status().code() == StatusCode::kResourceExhausted && pool->trim() > 0)
      made = pool->alloc_->create(cls);  // the free blocks given back first
    if (!made.is_ok()) {
      uint64_t live = 0;
      size_t n = 0;
      {
        std::lock_guard<std::mutex> lock(pool->mu_);
        for (const auto& [base, l] : pool->live_) live += l.block.size, ++n;
      }
      return made.status().annotate(strformat("%llu MiB held in %zu blocks", (unsigned long long)(live >> 20), n));
    }
    b = std::move(made).value();
    std::lock_guard<std::mutex> lock(pool->mu_);
    ++pool->created_;
  }
  {
    std::lock_guard<std::mutex> lock(pool->mu_);
    pool->live_[reinterpret_cast<uintptr_t>(b.mapped)] = Live{b, queued_epoch};
  }
  // The deleter returns the block; the pool (and the device under it) lives while any block does.
  return std::shared_ptr<uint8_t>(b.mapped, [pool](uint8_t* p) {
    std::lock_guard<std::mutex> lock(pool->mu_);
    auto it = pool->live_.find(reinterpret_cast<uintptr_t>(p));
    if (it == pool->live_.end()) return;
    const Block& blk = it->second.block;
    (pool->queued_ ? pool->queued_free_ : pool->free_)[blk.size].push_back(blk);
    pool->live_.erase(it);
  });
}

void MemoryPool::settle() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [size, blocks] : queued_free_) {
    auto& to = free_[size];
    to.insert(to.end(), blocks.begin(), blocks.end());
  }
  queued_free_.clear();
  queued_ = false;
  ++epoch_;
}

bool MemoryPool::queued(const void* p) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto addr = reinterpret_cast<uintptr_t>(p);
  auto it = live_.upper_bound(addr);
  if (!addr || it == live_.begin()) return false;
  --it;
  return addr - it->first < it->second.block.size && it->second.queued_epoch == epoch_;
}

uint64_t MemoryPool::trim() {
  std::vector<Block> drop;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [size, blocks] : free_) drop.insert(drop.end(), blocks.begin(), blocks.end());
    free_.clear();
  }
  uint64_t bytes = 0;
  for (const Block& b : drop) {
    bytes += b.size;
    alloc_->destroy(b);
  }
  return bytes;
}

bool MemoryPool::find(const void* p, uint64_t bytes, Block& block, uint64_t& offset, bool& inside) const {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(mu_);
  inside = false;
  auto it = live_.upper_bound(addr);
  if (!addr || it == live_.begin()) return false;
  --it;
  block = it->second.block;
  offset = addr - it->first;
  inside = offset < block.size;
  return offset + bytes <= block.size;
}

Status MappedRuntime::init(std::shared_ptr<MemoryPool> pool, uint64_t max_range, uint64_t alignment) {
  pool_ = std::move(pool);
  max_range_ = max_range;
  alignment_ = std::max<uint64_t>(alignment, 4);
  SB_ASSIGN_OR_RETURN(error_, alloc(DType::kU32, {4}));
  std::memset(error_.mutable_data(), 0, 16);
  return Status::ok();
}

Result<Tensor> MappedRuntime::alloc(DType dtype, Shape shape) {
  return take_block(dtype, std::move(shape), reuse_queued_ && !keeping_fills_);
}

Result<Tensor> MappedRuntime::alloc_host_written(DType dtype, Shape shape) {
  return take_block(dtype, std::move(shape), false);
}

Result<Tensor> MappedRuntime::take_block(DType dtype, Shape shape, bool queued_ok) {
  SB_ASSIGN_OR_RETURN(int64_t n, shape_numel(shape));
  const uint64_t bytes = (static_cast<uint64_t>(n) * dtype_size(dtype) + 3) & ~uint64_t{3};
  SB_CHECK_OR_RETURN(bytes <= max_range_, StatusCode::kResourceExhausted,
                     "a %s tensor of %llu bytes exceeds the device's storage-buffer range (%llu bytes)",
                     shape_str(shape).c_str(), (unsigned long long)bytes, (unsigned long long)max_range_);
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t created = pool_->created();
  auto taken = MemoryPool::take(pool_, bytes, queued_ok);
  if (!taken.is_ok() && taken.status().code() == StatusCode::kResourceExhausted && inflight_bytes_ > 0 &&
      !keeping_fills_) {
    // Out of device memory with work queued: finishing it frees earlier ops' temporaries (this
    // op's stay); then once more.
    SB_RETURN_IF_ERROR(sync_within_op());
    pool_->trim();
    taken = MemoryPool::take(pool_, bytes, queued_ok);
  }
  SB_ASSIGN_OR_RETURN(std::shared_ptr<uint8_t> mem, std::move(taken));
  if (inflight_budget_ == 0) inflight_budget_ = std::max<uint64_t>(uint64_t{256} << 20, memory_bytes() / 8);
  if (pool_->created() != created) {
    ++host_costs_.blocks;
    host_costs_.block_bytes += bytes;
    host_costs_.block_us += since_us(t0);
  }
  // What the queued work holds grows only by blocks it could not take back from finished ops.
  if (!reuse_queued_ || keeping_fills_ || pool_->created() != created) inflight_bytes_ += bytes;
  uint8_t* p = mem.get();
  return Tensor::wrap(dtype, std::move(shape), std::move(mem), p);
}

Result<BufferRef> MappedRuntime::bind(const Tensor& t, bool constant) {
  if (constant)
    if (auto it = constants_.find({t.data(), t.nbytes()}); it != constants_.end()) return it->second.ref;
  const uint64_t bytes = std::max<uint64_t>(4, (t.nbytes() + 3) & ~uint64_t{3});
  Block b;
  uint64_t off = 0;
  bool inside = false;
  if (pool_->find(t.data(), t.nbytes(), b, off, inside) && off % alignment_ == 0) {
    pool_->set_queued();  // blocks given back from here on may be in use until the sync
    keep_.push_back(t);
    if (t.storage_id()) ++kept_[t.storage_id()];
    return BufferRef{b.handle, off, std::min(bytes, b.size - off)};
  }
  // A host tensor is copied in now (its bytes are final). A misaligned view of device
  // memory is copied too, after the queued work that may write it has finished.
  if (inside) SB_RETURN_IF_ERROR(sync_within_op());
  SB_ASSIGN_OR_RETURN(Tensor dev, alloc_host_written(t.dtype(), t.shape()));
  copy_in(dev, t);
  SB_ASSIGN_OR_RETURN(BufferRef ref, bind(dev, false));
  if (constant) constants_.emplace(std::make_pair(t.data(), t.nbytes()), Uploaded{dev, ref});
  return ref;
}

Result<Tensor> MappedRuntime::device_tensor(const Tensor& t) {
  Block b;
  uint64_t off = 0;
  bool inside = false;
  if (pool_->find(t.data(), t.nbytes(), b, off, inside) && off % alignment_ == 0) return t;
  if (inside) SB_RETURN_IF_ERROR(sync_within_op());
  SB_ASSIGN_OR_RETURN(Tensor dev, alloc_host_written(t.dtype(), t.shape()));
  copy_in(dev, t);
  return dev;
}

void MappedRuntime::copy_in(const Tensor& dev, const Tensor& t) {
  if (!t.nbytes()) return;
  const auto t0 = std::chrono::steady_clock::now();
  parallel_copy(dev.mutable_data(), t.data(), t.nbytes());
  ++host_costs_.uploads;
  host_costs_.upload_bytes += t.nbytes();
  host_costs_.upload_us += since_us(t0);
}

Result<BufferRef> MappedRuntime::scratch(size_t bytes, uint32_t fill_word) {
  SB_ASSIGN_OR_RETURN(Tensor t, alloc_host_written(DType::kU32, {static_cast<int64_t>((bytes + 3) / 4)}));
  SB_RETURN_IF_ERROR(fill(t, fill_word));
  return bind(t, false);
}

namespace {
void fill_words(const Tensor& t, uint32_t word) {
  auto* w = t.mutable_data_as<uint32_t>();
  for (uint64_t i = 0; i < t.nbytes() / 4; ++i) w[i] = word;
}
}  // namespace

Status MappedRuntime::fill(const Tensor& t, uint32_t word) {
  // Memory queued work may still use (alloc, not alloc_host_written): that work finishes first.
  if (pool_->queued(t.data())) SB_RETURN_IF_ERROR(sync_within_op());
  fill_words(t, word);
  if (keeping_fills_) fills_.emplace_back(t, word);
  return Status::ok();
}

void MappedRuntime::op_boundary() {
  if (reuse_queued_ && !keeping_fills_) {
    // The finished ops' operands are recorded; the hazard tracking, not these references,
    // keeps later dispatches off their memory (it returns to the pool when nothing else holds it).
    for (const Tensor& t : keep_)
      if (t.storage_id())
        if (auto it = kept_.find(t.storage_id()); it != kept_.end() && --it->second == 0) kept_.erase(it);
    keep_.clear();
  }
  op_mark_ = keep_.size();
}

BufferRef MappedRuntime::error_word() const {
  Block b;
  uint64_t off = 0;
  bool inside = false;
  pool_->find(error_.data(), 16, b, off, inside);
  return BufferRef{b.handle, off, 16};
}

Status MappedRuntime::probe_numerics() {
  const std::vector<float> in = probe_inputs();
  const uint32_t n = static_cast<uint32_t>(in.size() / 3);
  SB_ASSIGN_OR_RETURN(Tensor x, alloc_host_written(DType::kF32, {static_cast<int64_t>(in.size())}));
  std::memcpy(x.mutable_data(), in.data(), in.size() * 4);
  SB_ASSIGN_OR_RETURN(Tensor y, alloc(DType::kF32, {static_cast<int64_t>(7 * n)}));
  SB_ASSIGN_OR_RETURN(BufferRef bx, bind(x, false));
  SB_ASSIGN_OR_RETURN(BufferRef by, bind(y, false));
  kernels::ProbeArgs args{n, 0, 0, 0};
  SB_RETURN_IF_ERROR(dispatch("numerics_probe", {bx, by}, &args, sizeof(args), n));
  SB_RETURN_IF_ERROR(sync());
  return check_probe(description(), in, y.data_as<float>(), exact_division_);
}

Status MappedRuntime::probe_mma_layout() {
  if (!int8_mma_) return Status::ok();
  SB_ASSIGN_OR_RETURN(Tensor y, alloc(DType::kI32, {257}));
  SB_ASSIGN_OR_RETURN(BufferRef by, bind(y, false));
  kernels::ProbeArgs args{1, 0, 0, 0};
  SB_RETURN_IF_ERROR(dispatch("qmm_mma_probe", {by}, &args, sizeof(args), 32));
  SB_RETURN_IF_ERROR(sync());
  // Lane l, element e: row l / 4 + 8 (e / 4), column 8 ((e / 2) % 2) + 2 (l % 4) + e % 2 (the
  // layout NVIDIA's driver gives), and the probe's C[r][c] = r + 16c.
  const int32_t* got = y.data_as<int32_t>();
  bool same = got[256] == 8;
  for (int l = 0; l < 32 && same; ++l)
    for (int e = 0; e < 8; ++e) {
      const int row = l / 4 + 8 * (e / 4), col = 8 * ((e / 2) % 2) + 2 * (l % 4) + e % 2;
      same &= got[8 * l + e] == row + 16 * col;
    }
  if (!same) {
    std::string seen;  // (row, column) of lanes 0, 1, 4's elements, for whoever adapts qmm_mma
    for (int l : {0, 1, 4})
      for (int e = 0; e < 8; ++e) seen += strformat(" %d:%d=(%d,%d)", l, e, got[8 * l + e] % 16, got[8 * l + e] / 16);
    log::logger().info("{}: int8 cooperative matrices off: accumulator layout differs from qmm_mma's ({} elements;{})",
                       description(), got[256], seen);
    int8_mma_ = false;
  }
  return Status::ok();
}

long MappedRuntime::queued_refs(const Tensor& t) const {
  if (!t.storage_id()) return 0;
  auto it = kept_.find(t.storage_id());
  auto rt = recorded_.find(t.storage_id());
  return (it == kept_.end() ? 0 : it->second) + (rt == recorded_.end() ? 0 : rt->second);
}

MappedRuntime::Kept MappedRuntime::take_kept() {
  Kept k{std::move(keep_), std::move(fills_)};
  keep_.clear();
  fills_.clear();
  for (const auto& [storage, n] : kept_) recorded_[storage] += n;
  kept_.clear();
  return k;
}

void MappedRuntime::release_kept(const Kept& k) {
  for (const Tensor& t : k.tensors)
    if (t.storage_id())
      if (auto it = recorded_.find(t.storage_id()); it != recorded_.end() && --it->second == 0) recorded_.erase(it);
}

void MappedRuntime::refill(const Kept& k) {
  for (const auto& [t, word] : k.fills) fill_words(t, word);
}

Status MappedRuntime::sync_within_op() {
  std::vector<Tensor> held(keep_.begin() + static_cast<std::ptrdiff_t>(std::min(op_mark_, keep_.size())), keep_.end());
  Status st = sync();
  for (Tensor& t : held) {
    if (t.storage_id()) ++kept_[t.storage_id()];
    keep_.push_back(std::move(t));
  }
  op_mark_ = 0;
  return st;
}

uint32_t MappedRuntime::finish_submission() {
  ++submissions_;
  const HostCosts& h = host_costs_;
  if (log::op_log_enabled() && (h.blocks || h.uploads || h.pipelines))
    log::logger().info(
        "host: {} blocks created ({:.1f} MiB) in {:.0f} us, {} uploads ({:.1f} MiB) in {:.0f} us, "
        "{} pipelines built in {:.0f} us",
        h.blocks, h.block_bytes / 1048576.0, h.block_us, h.uploads, h.upload_bytes / 1048576.0, h.upload_us,
        h.pipelines, h.pipeline_us);
  host_costs_ = {};
  pool_->settle();
  inflight_bytes_ = 0;
  keep_.clear();
  kept_.clear();
  fills_.clear();
  auto* err = error_.mutable_data_as<uint32_t>();
  const uint32_t bits = err[0];
  err[0] = 0;
  return bits;
}

}  // namespace switchboard::gpu
