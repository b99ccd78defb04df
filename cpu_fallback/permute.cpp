// Argsort (stable), row gather, and the inverse-permutation row scatter.
#include <algorithm>
#include <numeric>

#include "cpu_common.h"

namespace switchboard::cpu {
namespace {

Status argsort(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsArgsortNode();
  SB_ASSIGN_OR_RETURN(Tensor x, ctx.in(n->x.get()));
  SB_CHECK_OR_RETURN(x.numel() <= INT32_MAX, StatusCode::kOutOfRange, "too many elements for i32 indices");
  const int32_t* v = x.data_as<int32_t>();
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::zeros(DType::kI32, x.shape()));
  int32_t* o = out.mutable_data_as<int32_t>();
  std::iota(o, o + x.numel(), 0);
  std::stable_sort(o, o + x.numel(), [v](int32_t a, int32_t b) { return v[a] < v[b]; });
  return ctx.out(n->out.get(), std::move(out));
}

// Row size in bytes of x viewed as [rows, ...].
size_t row_bytes(const Tensor& x) {
  return x.dim(0) ? x.nbytes() / static_cast<size_t>(x.dim(0)) : 0;
}

Status gather_rows(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsGatherRowsNode();
  SB_ASSIGN_OR_RETURN(Tensor x, ctx.in(n->x.get()));
  SB_ASSIGN_OR_RETURN(Tensor idx, ctx.in(n->indices.get()));
  Shape shape = x.shape();
  shape[0] = idx.numel();
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(x.dtype(), shape));
  const size_t rb = row_bytes(x);
  const int32_t* ip = idx.data_as<int32_t>();
  for (int64_t p = 0; p < idx.numel(); ++p) {
    SB_CHECK_OR_RETURN(ip[p] >= 0 && ip[p] < x.dim(0), StatusCode::kOutOfRange, "indices[%lld] = %d out of range [0, %lld)",
                       (long long)p, ip[p], (long long)x.dim(0));
    std::memcpy(static_cast<uint8_t*>(out.mutable_data()) + p * rb, static_cast<const uint8_t*>(x.data()) + ip[p] * rb, rb);
  }
  return ctx.out(n->out.get(), std::move(out));
}

Status scatter_rows(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsScatterRowsNode();
  SB_ASSIGN_OR_RETURN(Tensor x, ctx.in(n->x.get()));
  SB_ASSIGN_OR_RETURN(Tensor idx, ctx.in(n->indices.get()));
  SB_CHECK_OR_RETURN(idx.numel() == x.dim(0), StatusCode::kInvalidArgument, "%lld indices for %lld rows",
                     (long long)idx.numel(), (long long)x.dim(0));
  SB_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(x.dtype(), x.shape()));
  std::vector<uint8_t> seen(static_cast<size_t>(x.dim(0)), 0);
  const size_t rb = row_bytes(x);
  const int32_t* ip = idx.data_as<int32_t>();
  for (int64_t p = 0; p < idx.numel(); ++p) {
    SB_CHECK_OR_RETURN(ip[p] >= 0 && ip[p] < x.dim(0) && !seen[ip[p]], StatusCode::kInvalidArgument,
                       "indices[%lld] = %d: not a permutation of 0..%lld", (long long)p, ip[p], (long long)x.dim(0) - 1);
    seen[ip[p]] = 1;
    std::memcpy(static_cast<uint8_t*>(out.mutable_data()) + ip[p] * rb, static_cast<const uint8_t*>(x.data()) + p * rb, rb);
  }
  return ctx.out(n->out.get(), std::move(out));
}

}  // namespace

void register_permute_kernels(KernelRegistry& r) {
  r.add(fb::OpNode::ArgsortNode, argsort);
  r.add(fb::OpNode::GatherRowsNode, gather_rows);
  r.add(fb::OpNode::ScatterRowsNode, scatter_rows);
}

}  // namespace switchboard::cpu
