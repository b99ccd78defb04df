#include "quantize.h"

#include <cmath>
#include <vector>

#include "element_access.h"

namespace switchboard {

namespace {
void quantize_group(const float* v, int n, int bits, std::vector<uint8_t>& codes, float* scale_out, float* bias_out) {
  const float n_bins = static_cast<float>((1 << bits) - 1);
  float w_min = 3.4028235e38f, w_max = 0.0f;  // MLX starts w_max at 0
  for (int i = 0; i < n; ++i) {
    w_min = std::min(w_min, v[i]);
    w_max = std::max(w_max, v[i]);
  }
  float scale = std::max((w_max - w_min) / n_bins, 1e-7f);
  const bool side = std::fabs(w_min) > std::fabs(w_max);
  scale = side ? scale : -scale;
  const float edge = side ? w_min : w_max;
  const float q0 = std::round(edge / scale);
  const bool at_zero = q0 == 0.0f;
  scale = at_zero ? scale : edge / q0;
  const float bias = at_zero ? 0.0f : edge;
  for (int i = 0; i < n; ++i) codes.push_back(static_cast<uint8_t>(std::min(std::round((v[i] - bias) / scale), n_bins)));
  *scale_out = scale;
  *bias_out = bias;
}

void pack_row(const std::vector<uint8_t>& codes, int bits, uint32_t* out) {
  for (size_t j = 0; j < codes.size(); ++j) {
    const uint64_t bit = j * static_cast<uint64_t>(bits);
    const uint64_t word = bit >> 5;
    const unsigned shift = static_cast<unsigned>(bit & 31);
    out[word] |= static_cast<uint32_t>(codes[j]) << shift;
    if (shift + static_cast<unsigned>(bits) > 32) out[word + 1] |= static_cast<uint32_t>(codes[j]) >> (32 - shift);
  }
}
}  // namespace

Result<QuantizedRows> affine_quantize(const Tensor& w, int bits, int group_size, DType scale_dtype) {
  SB_CHECK_OR_RETURN(quant_bits_allowed(bits), StatusCode::kInvalidArgument, "quantize: bits %d not in {2,3,4,5,6,8}",
                     bits);
  SB_CHECK_OR_RETURN(quant_group_allowed(group_size), StatusCode::kInvalidArgument,
                     "quantize: group_size %d not in {32,64,128}", group_size);
  SB_CHECK_OR_RETURN(dtype_is_float(w.dtype()) && dtype_is_float(scale_dtype) && w.rank() == 2,
                     StatusCode::kInvalidArgument, "quantize: need a 2-D float tensor, got %s %s",
                     dtype_name(w.dtype()), shape_str(w.shape()).c_str());
  const int64_t rows = w.dim(0), k = w.dim(1);
  SB_CHECK_OR_RETURN(k % group_size == 0, StatusCode::kInvalidArgument,
                     "quantize: row length %lld is not a multiple of group_size %d", (long long)k, group_size);
  const int64_t words = k * bits / 32, groups = k / group_size;
  QuantizedRows q;
  SB_ASSIGN_OR_RETURN(q.w, Tensor::zeros(DType::kU32, {rows, words}));
  SB_ASSIGN_OR_RETURN(q.scales, Tensor::zeros(scale_dtype, {rows, groups}));
  SB_ASSIGN_OR_RETURN(q.biases, Tensor::zeros(scale_dtype, {rows, groups}));
  std::vector<float> row(static_cast<size_t>(k));
  std::vector<uint8_t> codes;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < k; ++j) row[j] = ops::load_f32(w.data(), w.dtype(), r * k + j);
    codes.clear();
    for (int64_t g = 0; g < groups; ++g) {
      float s, b;
      quantize_group(row.data() + g * group_size, group_size, bits, codes, &s, &b);
      ops::store_f32(q.scales.mutable_data(), scale_dtype, r * groups + g, s);
      ops::store_f32(q.biases.mutable_data(), scale_dtype, r * groups + g, b);
    }
    pack_row(codes, bits, q.w.mutable_data_as<uint32_t>() + r * words);
  }
  return q;
}

Result<Tensor> affine_dequantize(const Tensor& wq, const Tensor& scales, const Tensor& biases, int bits, int group_size,
                                 int64_t k) {
  SB_CHECK_OR_RETURN(wq.dtype() == DType::kU32 && wq.rank() == 2 && wq.dim(1) == k * bits / 32,
                     StatusCode::kInvalidArgument, "dequantize: codes %s do not hold %lld %d-bit values per row",
                     shape_str(wq.shape()).c_str(), (long long)k, bits);
  const int64_t rows = wq.dim(0), groups = k / group_size;
  SB_CHECK_OR_RETURN(scales.numel() == rows * groups && biases.numel() == rows * groups, StatusCode::kInvalidArgument,
                     "dequantize: scales/biases must hold %lld values", (long long)(rows * groups));
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::zeros(DType::kF32, {rows, k}));
  float* o = out.mutable_data_as<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const uint32_t* row = wq.data_as<uint32_t>() + r * wq.dim(1);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t g = r * groups + j / group_size;
      const float s = ops::load_f32(scales.data(), scales.dtype(), g), b = ops::load_f32(biases.data(), biases.dtype(), g);
      o[r * k + j] = s * static_cast<float>(unpack_code(row, j, bits)) + b;
    }
  }
  return out;
}

}  // namespace switchboard
