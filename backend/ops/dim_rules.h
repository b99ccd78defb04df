// Output-shape rules written once over a dim type, so the builder (its static-or-dynamic
// Dim, with bounds) and every device (int64_t run-time sizes, through op_shapes.h) derive
// an op's output shape, and refuse its operands, with the same function. A rule refuses
// only what is known to be wrong: a dynamic dim conflicts with nothing.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "switchboard/builder.h"
#include "switchboard/status.h"

namespace switchboard::ops {

// --- the two dim types -----------------------------------------------------------------
inline bool dim_known(int64_t) { return true; }
inline bool dim_known(const Dim& d) { return d.is_static(); }
inline int64_t dim_size(int64_t d) { return d; }
inline int64_t dim_size(const Dim& d) { return d.size; }
inline std::string dim_str(int64_t d) { return std::to_string(d); }
inline std::string dim_str(const Dim& d) { return d.is_static() ? std::to_string(d.size) : std::string("?"); }
// A dim of unknown size (only builder dims can be unknown).
inline Dim unknown_dim(const Dim&) { return Dim::dynamic(); }
inline int64_t unknown_dim(int64_t) { return -1; }
// One dim whose values span both: a known equal size, else dynamic over the union of bounds.
inline Dim bounds_union(const Dim& a, const Dim& b) {
  if (a.is_static() && b.is_static() && a.size == b.size) return a;
  const int64_t lo_a = a.is_static() ? a.size : a.min, lo_b = b.is_static() ? b.size : b.min;
  const int64_t hi_a = a.is_static() ? a.size : a.max, hi_b = b.is_static() ? b.size : b.max;
  return Dim::dynamic(std::min(lo_a, lo_b), (hi_a < 0 || hi_b < 0) ? -1 : std::max(hi_a, hi_b));
}
inline int64_t bounds_union(int64_t a, int64_t) { return a; }

template <class D>
bool dims_conflict(const D& a, const D& b) {
  return dim_known(a) && dim_known(b) && dim_size(a) != dim_size(b);
}
template <class D>
bool dim_is(const D& d, int64_t v) {
  return dim_known(d) && dim_size(d) == v;
}
template <class D>
std::string dims_str(const std::vector<D>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + dim_str(s[i]);
  return r + "]";
}

// --- rules ---------------------------------------------------------------------------------
// numpy broadcasting: align right; each pair of dims equal or one of them 1.
template <class D>
Result<std::vector<D>> broadcast_dims(const std::vector<D>& a, const std::vector<D>& b) {
  const size_t r = std::max(a.size(), b.size());
  std::vector<D> out;
  for (size_t i = 0; i < r; ++i) {
    const D da = i < r - a.size() ? D(1) : a[i - (r - a.size())];
    const D db = i < r - b.size() ? D(1) : b[i - (r - b.size())];
    SB_CHECK_OR_RETURN(!dims_conflict(da, db) || dim_is(da, 1) || dim_is(db, 1), StatusCode::kInvalidArgument,
                       "shapes %s and %s do not broadcast", dims_str(a).c_str(), dims_str(b).c_str());
    out.push_back(dim_is(da, 1)   ? db
                  : dim_is(db, 1) ? da
                  : dim_known(da) ? da
                  : dim_known(db) ? db
                                  : bounds_union(da, db));
  }
  return out;
}

// Matmul: a [..., K] times b [K, N] (or [N, K] with transpose_b) is [..., N].
template <class D>
Result<std::vector<D>> matmul_out(const std::vector<D>& a, const std::vector<D>& b, bool transpose_b) {
  SB_CHECK_OR_RETURN(a.size() >= 1 && b.size() == 2, StatusCode::kInvalidArgument, "a %s, b %s: need a [..., K], b 2-D",
                     dims_str(a).c_str(), dims_str(b).c_str());
  SB_CHECK_OR_RETURN(!dims_conflict(a.back(), transpose_b ? b[1] : b[0]), StatusCode::kInvalidArgument,
                     "inner dims differ: a %s, b %s (transpose_b=%d)", dims_str(a).c_str(), dims_str(b).c_str(),
                     transpose_b ? 1 : 0);
  std::vector<D> out = a;
  out.back() = transpose_b ? b[0] : b[1];
  return out;
}

// BatchMatmul: a [Ba, M, K] times b [Bb, K, N] (or [Bb, N, K]) is [Ba, M, N]; Ba a multiple
// of Bb (batch i of a against batch i / (Ba / Bb) of b).
template <class D>
Result<std::vector<D>> batch_matmul_out(const std::vector<D>& a, const std::vector<D>& b, bool transpose_b) {
  SB_CHECK_OR_RETURN(a.size() == 3 && b.size() == 3, StatusCode::kInvalidArgument, "a %s, b %s: need rank 3",
                     dims_str(a).c_str(), dims_str(b).c_str());
  SB_CHECK_OR_RETURN(!dims_conflict(a[2], transpose_b ? b[2] : b[1]), StatusCode::kInvalidArgument,
                     "inner dims differ: a %s, b %s (transpose_b=%d)", dims_str(a).c_str(), dims_str(b).c_str(),
                     transpose_b ? 1 : 0);
  if (dim_known(a[0]) && dim_known(b[0])) {
    const int64_t ba = dim_size(a[0]), bb = dim_size(b[0]);
    SB_CHECK_OR_RETURN(bb > 0 ? ba % bb == 0 : ba == 0, StatusCode::kInvalidArgument,
                       "a's batch %lld is not a multiple of b's batch %lld", (long long)ba, (long long)bb);
  }
  return std::vector<D>{a[0], a[1], transpose_b ? b[1] : b[2]};
}

// Concat on `axis` (normalized): inputs of one rank, equal outside the axis; the axis is the
// sum of theirs (unknown if any is).
template <class D>
Result<std::vector<D>> concat_out(const std::vector<std::vector<D>>& xs, int64_t axis) {
  SB_CHECK_OR_RETURN(!xs.empty(), StatusCode::kInvalidArgument, "no inputs");
  std::vector<D> out = xs[0];
  int64_t total = 0;
  bool known = true;
  for (size_t i = 0; i < xs.size(); ++i) {
    SB_CHECK_OR_RETURN(xs[i].size() == out.size(), StatusCode::kInvalidArgument, "inputs differ in rank");
    for (size_t k = 0; k < out.size(); ++k)
      SB_CHECK_OR_RETURN(static_cast<int64_t>(k) == axis || !dims_conflict(xs[i][k], xs[0][k]),
                         StatusCode::kInvalidArgument, "inputs[%zu] shape %s does not match inputs[0] %s", i,
                         dims_str(xs[i]).c_str(), dims_str(xs[0]).c_str());
    known &= dim_known(xs[i][static_cast<size_t>(axis)]);
    total += dim_known(xs[i][static_cast<size_t>(axis)]) ? dim_size(xs[i][static_cast<size_t>(axis)]) : 0;
  }
  out[static_cast<size_t>(axis)] = known ? D(total) : unknown_dim(out[0]);
  return out;
}

// Transpose: out[i] = x[perm[i]], perm a permutation of x's axes.
template <class D>
Result<std::vector<D>> transpose_out(const std::vector<D>& x, const std::vector<int32_t>& perm) {
  SB_CHECK_OR_RETURN(perm.size() == x.size(), StatusCode::kInvalidArgument, "perm has %zu entries for x %s",
                     perm.size(), dims_str(x).c_str());
  std::vector<bool> seen(x.size(), false);
  std::vector<D> out;
  for (int32_t ax : perm) {
    SB_CHECK_OR_RETURN(ax >= 0 && static_cast<size_t>(ax) < x.size() && !seen[static_cast<size_t>(ax)],
                       StatusCode::kInvalidArgument, "perm entry %d out of range or repeated", ax);
    seen[static_cast<size_t>(ax)] = true;
    out.push_back(x[static_cast<size_t>(ax)]);
  }
  return out;
}

}  // namespace switchboard::ops
