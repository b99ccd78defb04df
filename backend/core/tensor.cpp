#include "switchboard/tensor.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <vector>

#include "env.h"
#include "switchboard/switchboard.h"

namespace switchboard {

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

Result<int64_t> shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    SB_CHECK_OR_RETURN(d >= 0, StatusCode::kInvalidArgument, "shape %s has a negative dim", shape_str(s).c_str());
    SB_CHECK_OR_RETURN(d == 0 || n <= INT64_MAX / d, StatusCode::kOutOfRange, "shape %s: element count overflows",
                       shape_str(s).c_str());
    n *= d;
  }
  return n;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

namespace {

// Buffers freed by tensors are kept for reuse (every size): an execution allocates the same
// sizes every time, so a repeated one takes nothing from the system allocator (large fresh
// pages cost a page fault each).
class BufferPool {
 public:
  static BufferPool& get() {
    static BufferPool* pool = new BufferPool();  // never destroyed: tensors may outlive static destructors
    return *pool;
  }
  void* take(size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(bytes);
      if (it != free_.end()) {
        void* p = it->second;
        free_.erase(it);
        cached_ -= bytes;
        return p;
      }
    }
    allocations_.fetch_add(1, std::memory_order_relaxed);
    return std::aligned_alloc(64, bytes);  // 64-byte alignment suits every SIMD width we dispatch to
  }
  // Past the bound the largest cached buffers make room: sizes freed lately (those an execution
  // repeats) stay, one-off sizes (a longer prompt's) go.
  void give(void* p, size_t bytes) {
    std::vector<void*> drop;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (bytes > max_cached_) {
        drop.push_back(p);
      } else {
        while (cached_ + bytes > max_cached_) {
          auto it = std::prev(free_.end());
          cached_ -= it->first;
          drop.push_back(it->second);
          free_.erase(it);
        }
        free_.emplace(bytes, p);
        cached_ += bytes;
      }
    }
    for (void* q : drop) std::free(q);
  }
  uint64_t allocations() const { return allocations_.load(std::memory_order_relaxed); }
  size_t max_cached() {
    std::lock_guard<std::mutex> lock(mu_);
    return max_cached_;
  }
  // A smaller bound frees the cached buffers over it at once.
  void set_max_cached(size_t bytes) {
    std::vector<void*> drop;
    {
      std::lock_guard<std::mutex> lock(mu_);
      max_cached_ = bytes;
      for (auto it = free_.end(); cached_ > max_cached_ && it != free_.begin();) {
        --it;
        cached_ -= it->first;
        drop.push_back(it->second);
        it = free_.erase(it);
      }
    }
    for (void* p : drop) std::free(p);
  }

 private:
  BufferPool() = default;
  // The cache's bound: $SWITCHBOARD_BUFFER_POOL_MB (default 1 GiB; 0 disables it) until set.
  size_t max_cached_ = env_defaults().buffer_pool_bytes;
  std::mutex mu_;
  std::multimap<size_t, void*> free_;
  size_t cached_ = 0;
  std::atomic<uint64_t> allocations_{0};
};

}  // namespace

uint64_t buffer_pool_bytes() { return BufferPool::get().max_cached(); }
uint64_t buffer_allocations() { return BufferPool::get().allocations(); }
void set_buffer_pool_bytes(uint64_t bytes) { BufferPool::get().set_max_cached(static_cast<size_t>(bytes)); }

Result<Tensor> Tensor::uninitialized(DType dtype, Shape shape) {
  SB_ASSIGN_OR_RETURN(int64_t n, shape_numel(shape));
  // Refuse sizes no allocator could satisfy before asking (1 TiB cap).
  SB_CHECK_OR_RETURN(n <= (int64_t{1} << 40) / static_cast<int64_t>(dtype_size(dtype)), StatusCode::kOutOfRange,
                     "tensor %s of %s is too large", shape_str(shape).c_str(), dtype_name(dtype));
  const size_t bytes = static_cast<size_t>(n) * dtype_size(dtype);
  const size_t rounded = (bytes + 63) / 64 * 64 + 64;
  void* p = BufferPool::get().take(rounded);
  SB_CHECK_OR_RETURN(p != nullptr, StatusCode::kOutOfRange, "out of memory allocating %zu bytes", bytes);
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.storage_ = std::shared_ptr<const void>(p, [rounded](const void* q) { BufferPool::get().give(const_cast<void*>(q), rounded); });
  t.data_ = p;
  return t;
}

Result<Tensor> Tensor::zeros(DType dtype, Shape shape) {
  SB_ASSIGN_OR_RETURN(Tensor t, uninitialized(dtype, std::move(shape)));
  std::memset(t.mutable_data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::wrap(DType dtype, Shape shape, std::shared_ptr<const void> keepalive, const void* data) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.storage_ = std::move(keepalive);
  t.data_ = data;
  return t;
}

Result<Tensor> Tensor::reshaped(Shape shape) const {
  SB_ASSIGN_OR_RETURN(int64_t n, shape_numel(shape));
  SB_CHECK_OR_RETURN(n == numel(), StatusCode::kInvalidArgument, "cannot reshape %s to %s",
                     shape_str(shape_).c_str(), shape_str(shape).c_str());
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::clone() const {
  Result<Tensor> r = zeros(dtype_, shape_);
  if (!r.is_ok()) return Tensor();
  if (nbytes()) std::memcpy(r->mutable_data(), data_, nbytes());
  return std::move(r).value();
}

std::vector<double> Tensor::to_doubles() const {
  std::vector<double> out(static_cast<size_t>(numel()));
  const auto* b = static_cast<const uint8_t*>(data_);
  for (size_t i = 0; i < out.size(); ++i) {
    const uint8_t* p = b + i * dtype_size(dtype_);
    switch (dtype_) {
      case DType::kF32: { float v; std::memcpy(&v, p, 4); out[i] = v; break; }
      case DType::kF16: { uint16_t v; std::memcpy(&v, p, 2); out[i] = f16_to_f32(v); break; }
      case DType::kBF16: { uint16_t v; std::memcpy(&v, p, 2); out[i] = bf16_to_f32(v); break; }
      case DType::kI32: { int32_t v; std::memcpy(&v, p, 4); out[i] = v; break; }
      case DType::kI64: { int64_t v; std::memcpy(&v, p, 8); out[i] = static_cast<double>(v); break; }
      case DType::kU8: out[i] = *p; break;
      case DType::kU32: { uint32_t v; std::memcpy(&v, p, 4); out[i] = v; break; }
      case DType::kBool: out[i] = *p ? 1.0 : 0.0; break;
    }
  }
  return out;
}

}  // namespace switchboard
