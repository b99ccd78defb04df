#include "switchboard/tensor.h"

#include <cstdlib>
#include <cstring>

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

Result<Tensor> Tensor::zeros(DType dtype, Shape shape) {
  SB_ASSIGN_OR_RETURN(int64_t n, shape_numel(shape));
  // Refuse sizes no allocator could satisfy before asking (1 TiB cap).
  SB_CHECK_OR_RETURN(n <= (int64_t{1} << 40) / static_cast<int64_t>(dtype_size(dtype)), StatusCode::kOutOfRange,
                     "tensor %s of %s is too large", shape_str(shape).c_str(), dtype_name(dtype));
  size_t bytes = static_cast<size_t>(n) * dtype_size(dtype);
  // 64-byte alignment suits every SIMD width we dispatch to.
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  SB_CHECK_OR_RETURN(p != nullptr, StatusCode::kOutOfRange, "out of memory allocating %zu bytes", bytes);
  std::memset(p, 0, bytes);
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.storage_ = std::shared_ptr<const void>(p, [](const void* q) { std::free(const_cast<void*>(q)); });
  t.data_ = p;
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
