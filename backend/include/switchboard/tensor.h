// A host tensor: dtype, row-major shape and a pointer into shared storage.
// Copies share storage (cheap); clone() copies the bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "switchboard/dtype.h"
#include "switchboard/status.h"

namespace switchboard {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& s);  // "[2, 3]"
// Element count; error when a dim is negative or the product overflows int64.
Result<int64_t> shape_numel(const Shape& s);

class Tensor {
 public:
  Tensor() = default;

  // A zero-filled tensor that owns its bytes.
  static Result<Tensor> zeros(DType dtype, Shape shape);
  // Like zeros() without the fill, for results that overwrite every element.
  static Result<Tensor> uninitialized(DType dtype, Shape shape);
  // A tensor over external bytes; `keepalive` owns them. The bytes must hold
  // numel * dtype_size and stay valid while any copy lives.
  static Tensor wrap(DType dtype, Shape shape, std::shared_ptr<const void> keepalive, const void* data);
  // A tensor holding a copy of `values` (T must match dtype's size).
  template <class T>
  static Result<Tensor> from_vector(DType dtype, Shape shape, const std::vector<T>& values);

  bool defined() const { return data_ != nullptr || storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }
  int64_t dim(int64_t i) const { return shape_[static_cast<size_t>(i)]; }
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

  const void* data() const { return data_; }
  // Writable only for tensors a kernel allocated; constants may be read-only maps.
  void* mutable_data() const { return const_cast<void*>(data_); }
  template <class T>
  const T* data_as() const { return static_cast<const T*>(data_); }
  template <class T>
  T* mutable_data_as() const { return static_cast<T*>(mutable_data()); }

  // The same bytes with another shape of equal element count.
  Result<Tensor> reshaped(Shape shape) const;
  // True when no other tensor shares this storage (safe to write in place).
  bool storage_unique() const { return storage_.use_count() == 1; }
  // Tensors sharing this storage, this one included.
  long storage_use_count() const { return storage_.use_count(); }
  bool shares_storage(const Tensor& o) const { return storage_ && storage_ == o.storage_; }
  // Identifies the storage (equal for tensors that share it; null without storage).
  const void* storage_id() const { return storage_.get(); }
  // A deep copy into fresh storage.
  Tensor clone() const;
  // Values converted to double (for tests and printing).
  std::vector<double> to_doubles() const;

 private:
  DType dtype_ = DType::kF32;
  Shape shape_;
  std::shared_ptr<const void> storage_;
  const void* data_ = nullptr;
};

template <class T>
Result<Tensor> Tensor::from_vector(DType dtype, Shape shape, const std::vector<T>& values) {
  SB_CHECK_OR_RETURN(sizeof(T) == dtype_size(dtype), StatusCode::kInvalidArgument,
                     "from_vector: element size %zu does not match dtype %s", sizeof(T), dtype_name(dtype));
  SB_ASSIGN_OR_RETURN(Tensor t, zeros(dtype, std::move(shape)));
  SB_CHECK_OR_RETURN(static_cast<int64_t>(values.size()) == t.numel(), StatusCode::kInvalidArgument,
                     "from_vector: %zu values for shape %s", values.size(), shape_str(t.shape()).c_str());
  if (!values.empty()) std::memcpy(t.mutable_data(), values.data(), values.size() * sizeof(T));
  return t;
}

}  // namespace switchboard
