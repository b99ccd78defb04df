// Widening helpers of element_access.h.
#include "element_access.h"

namespace switchboard::ops {

std::vector<float> widen_f32(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = load_f32(t.data(), t.dtype(), static_cast<int64_t>(i));
  return v;
}

const float* f32_data(const Tensor& t, std::vector<float>* storage) {
  if (t.dtype() == DType::kF32) return t.data_as<float>();
  *storage = widen_f32(t);
  return storage->data();
}

}  // namespace switchboard::ops
