// The GPU device (Vulkan and Metal alike): each op's kernel checks shapes on the
// host, places operands in device memory and records a dispatch of a kernel of
// metal_shaders/; a chain's dispatches run at sync(). Data-dependent checks
// (indices, permutations) run on the device and surface at sync() as errors. Ops
// or dtypes without a kernel are refused at plan time.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include "cpu_common.h"
#include "exact_math.h"
#include "gpu_kernel_table.h"
#include "gpu_runtime.h"

namespace switchboard::gpu {
namespace {

namespace k = kernels;

using Runtime = GpuRuntime;

class GpuDevice final : public Device {
 public:
  GpuDevice(std::unique_ptr<Runtime> rt, std::string name);
  const std::string& name() const override { return name_; }
  const std::string& description() const override { return rt_->description(); }
  const KernelRegistry& kernels() const override { return registry_; }
  Status can_run(const fb::OpNodeUnion& op, const KernelContext& ctx) const override;
  Fusion fuse(const std::vector<std::unique_ptr<fb::InstructionT>>& ins, size_t i,
              const PrivateTemp& private_temp) const override;
  Status sync() override { return rt_->sync(); }
  double last_device_us() const override { return rt_->last_gpu_us(); }
  long queued_refs(const Tensor& t) const override { return rt_->queued_refs(t); }
  Runtime& rt() { return *rt_; }
  // A per-node table of words computed on the host (GatherQmm's expert table), kept
  // and bound as a constant: uploaded on the node's first run only.
  Result<BufferRef> node_table(const void* node, const std::vector<uint32_t>& words) {
    auto it = node_tables_.find(node);
    if (it == node_tables_.end()) {
      SB_ASSIGN_OR_RETURN(Tensor t, Tensor::from_vector(DType::kU32, {static_cast<int64_t>(words.size())}, words));
      it = node_tables_.emplace(node, std::move(t)).first;
    }
    return rt_->bind(it->second, true);
  }

 private:
  std::unordered_map<const void*, Tensor> node_tables_;
  std::unique_ptr<Runtime> rt_;
  std::string name_;
  KernelRegistry registry_;
};

Runtime& rt_of(KernelContext& ctx) { return static_cast<GpuDevice&>(ctx.device()).rt(); }

Result<BufferRef> bind_in(KernelContext& ctx, const fb::Tid* tid, Tensor* keep = nullptr) {
  SB_ASSIGN_OR_RETURN(Tensor t, ctx.in(tid));
  if (keep) *keep = t;
  return rt_of(ctx).bind(t, ctx.is_constant(tid));
}

Result<uint32_t> u32_count(int64_t n, const char* what) {
  SB_CHECK_OR_RETURN(n >= 0 && n < (int64_t{1} << 31), StatusCode::kUnimplemented,
                     "%s: %lld elements exceed the Vulkan kernels' 2^31 limit", what, (long long)n);
  return static_cast<uint32_t>(n);
}

uint64_t words_of(DType t, int64_t n) { return (static_cast<uint64_t>(n) * dtype_size(t) + 3) / 4; }

// Invocations of the integer kernels (int64.glsl): byte dtypes four elements each, else one.
uint64_t int_invocations(DType t, int64_t n) {
  return dtype_size(t) == 1 ? (static_cast<uint64_t>(n) + 3) / 4 : static_cast<uint64_t>(n);
}

// Kernels for dtypes the 32-bit word kernels do not cover (int64.glsl).
bool needs_int_kernel_binary(DType t) { return !dtype_is_float(t) && t != DType::kI32; }
bool needs_int_kernel_unary(DType t) { return !dtype_is_float(t) && t != DType::kI32 && t != DType::kU32; }

Status binary(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsBinaryNode();
  Runtime& rt = rt_of(ctx);
  Tensor a, b;
  SB_ASSIGN_OR_RETURN(BufferRef ba, bind_in(ctx, n->a.get(), &a));
  SB_ASSIGN_OR_RETURN(BufferRef bb, bind_in(ctx, n->b.get(), &b));
  SB_ASSIGN_OR_RETURN(Shape shape, cpu::broadcast_shape(a.shape(), b.shape()));
  SB_CHECK_OR_RETURN(shape.size() <= SB_MAX_RANK, StatusCode::kUnimplemented, "rank %zu exceeds %d", shape.size(),
                     SB_MAX_RANK);
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(a.dtype(), shape));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  k::BinaryArgs args{};
  SB_ASSIGN_OR_RETURN(args.n, u32_count(out.numel(), "Binary"));
  args.op = static_cast<uint32_t>(n->op);
  args.dtype = static_cast<uint32_t>(a.dtype());
  args.rank = static_cast<uint32_t>(shape.size());
  std::vector<int64_t> sa = cpu::broadcast_strides(a.shape(), shape), sb = cpu::broadcast_strides(b.shape(), shape);
  for (size_t d = 0; d < shape.size(); ++d) {
    args.shape[d] = static_cast<uint32_t>(shape[d]);
    args.sa[d] = static_cast<uint32_t>(sa[d]);
    args.sb[d] = static_cast<uint32_t>(sb[d]);
  }
  if (needs_int_kernel_binary(a.dtype())) {
    SB_RETURN_IF_ERROR(rt.dispatch("binary_int", {ba, bb, bo, rt.error_word()}, &args, sizeof(args),
                                   int_invocations(a.dtype(), out.numel())));
  } else {
    SB_RETURN_IF_ERROR(rt.dispatch(n->op == fb::BinaryOp::Div ? "binary_div" : "binary", {ba, bb, bo, rt.error_word()},
                                   &args, sizeof(args), words_of(out.dtype(), out.numel())));
  }
  return ctx.out(n->out.get(), std::move(out));
}

Status unary(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsUnaryNode();
  Runtime& rt = rt_of(ctx);
  Tensor x;
  SB_ASSIGN_OR_RETURN(BufferRef bx, bind_in(ctx, n->x.get(), &x));
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(x.dtype(), x.shape()));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  k::UnaryArgs args{};
  SB_ASSIGN_OR_RETURN(args.n, u32_count(x.numel(), "Unary"));
  args.op = static_cast<uint32_t>(n->op);
  args.dtype = static_cast<uint32_t>(x.dtype());
  if (needs_int_kernel_unary(x.dtype()))
    SB_RETURN_IF_ERROR(rt.dispatch("unary_int", {bx, bo}, &args, sizeof(args), int_invocations(x.dtype(), x.numel())));
  else
    SB_RETURN_IF_ERROR(rt.dispatch("unary", {bx, bo}, &args, sizeof(args), words_of(x.dtype(), x.numel())));
  return ctx.out(n->out.get(), std::move(out));
}

Status cast(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsCastNode();
  Runtime& rt = rt_of(ctx);
  Tensor x;
  SB_ASSIGN_OR_RETURN(BufferRef bx, bind_in(ctx, n->x.get(), &x));
  const auto to = static_cast<DType>(n->dtype);
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(to, x.shape()));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  k::CastArgs args{};
  SB_ASSIGN_OR_RETURN(args.n, u32_count(x.numel(), "Cast"));
  args.from_dtype = static_cast<uint32_t>(x.dtype());
  args.to_dtype = static_cast<uint32_t>(to);
  if (x.dtype() == DType::kI64 || to == DType::kI64)  // cast_i64: an i64 output is one element per invocation
    SB_RETURN_IF_ERROR(rt.dispatch("cast_i64", {bx, bo}, &args, sizeof(args),
                                   to == DType::kI64 ? static_cast<uint64_t>(x.numel()) : words_of(to, x.numel())));
  else
    SB_RETURN_IF_ERROR(rt.dispatch("cast", {bx, bo}, &args, sizeof(args), words_of(to, x.numel())));
  return ctx.out(n->out.get(), std::move(out));
}

Status full(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsFullNode();
  Runtime& rt = rt_of(ctx);
  SB_ASSIGN_OR_RETURN(Shape shape, cpu::full_shape(ctx, *n));
  const auto t = static_cast<DType>(n->dtype);
  // The fill pattern: two words hold whole elements of every dtype; the CPU kernel
  // encodes them, so the values are the CPU's by construction.
  SB_ASSIGN_OR_RETURN(Tensor pattern, Tensor::zeros(t, {static_cast<int64_t>(8 / dtype_size(t))}));
  std::vector<uint8_t> bytes(8);
  cpu::fill_value(pattern.mutable_data(), t, pattern.numel(), n->value);
  std::memcpy(bytes.data(), pattern.data(), 8);
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(t, shape));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  k::FillArgs args{};
  const uint64_t words = words_of(t, out.numel());
  SB_ASSIGN_OR_RETURN(args.words, u32_count(static_cast<int64_t>(words), "Full"));
  std::memcpy(&args.pattern0, bytes.data(), 4);
  std::memcpy(&args.pattern1, bytes.data() + 4, 4);
  SB_RETURN_IF_ERROR(rt.dispatch("fill", {bo}, &args, sizeof(args), words));
  return ctx.out(n->out.get(), std::move(out));
}

Status glu(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsGluNode();
  Runtime& rt = rt_of(ctx);
  Tensor g, u;
  SB_ASSIGN_OR_RETURN(BufferRef bg, bind_in(ctx, n->gate.get(), &g));
  SB_ASSIGN_OR_RETURN(BufferRef bu, bind_in(ctx, n->up.get(), &u));
  SB_CHECK_OR_RETURN(g.shape() == u.shape(), StatusCode::kInvalidArgument, "gate %s and up %s differ",
                     shape_str(g.shape()).c_str(), shape_str(u.shape()).c_str());
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(g.dtype(), g.shape()));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  k::GluArgs args{};
  SB_ASSIGN_OR_RETURN(args.n, u32_count(g.numel(), "Glu"));
  args.dtype = static_cast<uint32_t>(g.dtype());
  args.kind = static_cast<uint32_t>(n->kind);
  args.alpha = n->alpha;
  args.limit = n->limit;
  SB_RETURN_IF_ERROR(rt.dispatch("glu", {bg, bu, bo}, &args, sizeof(args), words_of(g.dtype(), g.numel())));
  return ctx.out(n->out.get(), std::move(out));
}

// Combine's operands besides y: weights [T, k] f32, optional shared [T, D] and its gate
// [T, 1] (absent ones stand in as the weights' binding, never read).
struct CombineOperands {
  Tensor w, shared, gate;
  BufferRef bw, bs, bgate;
  int64_t tokens = 0, slots = 0;
};

Result<CombineOperands> bind_combine(KernelContext& ctx, const fb::Tid* weights_tid, const fb::Tid* shared_tid,
                                     const fb::Tid* gate_tid, int64_t dim) {
  CombineOperands c;
  SB_ASSIGN_OR_RETURN(c.bw, bind_in(ctx, weights_tid, &c.w));
  c.tokens = c.w.dim(0), c.slots = c.w.dim(1);
  c.bs = c.bgate = c.bw;
  if (shared_tid) {
    SB_ASSIGN_OR_RETURN(c.bs, bind_in(ctx, shared_tid, &c.shared));
    SB_CHECK_OR_RETURN(c.shared.shape() == (Shape{c.tokens, dim}), StatusCode::kInvalidArgument,
                       "shared %s, expected [%lld, %lld]", shape_str(c.shared.shape()).c_str(), (long long)c.tokens,
                       (long long)dim);
  }
  if (gate_tid) {
    SB_ASSIGN_OR_RETURN(c.bgate, bind_in(ctx, gate_tid, &c.gate));
    SB_CHECK_OR_RETURN(c.gate.shape() == (Shape{c.tokens, 1}), StatusCode::kInvalidArgument,
                       "shared_gate %s, expected [%lld, 1]", shape_str(c.gate.shape()).c_str(), (long long)c.tokens);
  }
  return c;
}

constexpr int64_t kCombine16MinOutputs = int64_t{1} << 16;

// Whether Combine of y at `by` into `bo` takes combine16: rows of whole 16-byte units at
// aligned offsets (4 or 8 elements a thread), and outputs enough to fill the GPU: a
// decode token's 2048 went 5.7 -> 8.6 us on the H100 with 4x fewer threads.
bool combine_by16(const Tensor& y, BufferRef by, BufferRef bo, int64_t outputs) {
  return outputs >= kCombine16MinOutputs && y.dim(1) * static_cast<int64_t>(dtype_size(y.dtype())) % 16 == 0 &&
         by.offset % 16 == 0 && bo.offset % 16 == 0;
}

// out = base + sum over slots of weights * y (slot order), y: [T*k, D] on the device;
// with `rows` (combine_rows), slot p's row of y is rows[p].
Status combine_impl(KernelContext& ctx, const Tensor& y, BufferRef by, const CombineOperands& c, const fb::Tid* out_tid,
                    const BufferRef* rows = nullptr) {
  Runtime& rt = rt_of(ctx);
  const int64_t tokens = c.tokens, slots = c.slots, dim = y.dim(1);
  SB_CHECK_OR_RETURN(y.dim(0) == tokens * slots, StatusCode::kInvalidArgument, "y %s does not hold %lld x %lld rows",
                     shape_str(y.shape()).c_str(), (long long)tokens, (long long)slots);
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(y.dtype(), {tokens, dim}));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  k::CombineArgs args{};
  SB_ASSIGN_OR_RETURN(args.tokens, u32_count(tokens, "Combine"));
  SB_ASSIGN_OR_RETURN(args.slots, u32_count(slots, "Combine"));
  SB_ASSIGN_OR_RETURN(args.dim, u32_count(dim, "Combine"));
  SB_RETURN_IF_ERROR(u32_count(y.numel(), "Combine").status());
  args.dtype = static_cast<uint32_t>(y.dtype());
  args.has_shared = c.shared.defined();
  args.shared_dtype = c.shared.defined() ? static_cast<uint32_t>(c.shared.dtype()) : 0;
  args.has_gate = c.gate.defined();
  args.gate_dtype = c.gate.defined() ? static_cast<uint32_t>(c.gate.dtype()) : 0;
  const bool by16 = combine_by16(y, by, bo, tokens * dim);
  SB_CHECK_OR_RETURN(!rows || by16, StatusCode::kInternal, "combine_rows needs rows of 16-byte units");
  const uint64_t words = words_of(y.dtype(), tokens * dim);
  if (rows) {
    SB_RETURN_IF_ERROR(
        rt.dispatch("combine_rows", {by, c.bw, c.bs, c.bgate, bo, *rows}, &args, sizeof(args), words / 4));
  } else {
    SB_RETURN_IF_ERROR(rt.dispatch(by16 ? "combine16" : "combine", {by, c.bw, c.bs, c.bgate, bo}, &args, sizeof(args),
                                   by16 ? words / 4 : words));
  }
  return ctx.out(out_tid, std::move(out));
}

Status combine(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsCombineNode();
  Tensor y;
  SB_ASSIGN_OR_RETURN(BufferRef by, bind_in(ctx, n->y.get(), &y));
  SB_ASSIGN_OR_RETURN(CombineOperands c,
                      bind_combine(ctx, n->weights.get(), n->shared.get(), n->shared_gate.get(), y.dim(1)));
  return combine_impl(ctx, y, by, c, n->out.get());
}

Status argsort(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsArgsortNode();
  Runtime& rt = rt_of(ctx);
  Tensor x;
  SB_ASSIGN_OR_RETURN(BufferRef bx, bind_in(ctx, n->x.get(), &x));
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(DType::kI32, x.shape()));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  k::ArgsortArgs args{};
  SB_ASSIGN_OR_RETURN(args.n, u32_count(x.numel(), "Argsort"));
  // 16 threads per key (permute.comp), workgroups of 256 for 16 keys.
  SB_RETURN_IF_ERROR(rt.dispatch("argsort", {bx, bo}, &args, sizeof(args), 256 * ((uint64_t{args.n} + 15) / 16)));
  return ctx.out(n->out.get(), std::move(out));
}

Status router(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsRouterNode();
  Runtime& rt = rt_of(ctx);
  Tensor logits, bias, scale;
  SB_ASSIGN_OR_RETURN(BufferRef bl, bind_in(ctx, n->logits.get(), &logits));
  BufferRef bb = bl, bs = bl;  // stand-ins when absent
  if (n->selection_bias) {
    SB_ASSIGN_OR_RETURN(bb, bind_in(ctx, n->selection_bias.get(), &bias));
  }
  if (n->expert_scale) {
    SB_ASSIGN_OR_RETURN(bs, bind_in(ctx, n->expert_scale.get(), &scale));
  }
  const int64_t tokens = logits.dim(0), e = logits.dim(1);
  std::vector<uint32_t> live(static_cast<size_t>(e), 1);
  for (int32_t p : n->pruned_experts) live[static_cast<size_t>(p)] = 0;
  SB_ASSIGN_OR_RETURN(Tensor live_t, Tensor::from_vector(DType::kU32, {e}, live));
  SB_ASSIGN_OR_RETURN(BufferRef blive, rt.bind(live_t, false));
  SB_ASSIGN_OR_RETURN(Tensor weights, rt.alloc(DType::kF32, {tokens, n->k}));
  SB_ASSIGN_OR_RETURN(Tensor indices, rt.alloc(DType::kI32, {tokens, n->k}));
  SB_ASSIGN_OR_RETURN(BufferRef bw, rt.bind(weights, false));
  SB_ASSIGN_OR_RETURN(BufferRef bi, rt.bind(indices, false));
  if (rt.cross_dispatch_handoff()) {  // -1 until the router writes: see qmm_row_glu_2k_dot4's wait
    int32_t* idx = indices.mutable_data_as<int32_t>();
    std::fill(idx, idx + indices.numel(), -1);
    rt.handoff() = {bi, bw, {}, {}, 0};
  }
  SB_CHECK_OR_RETURN(e <= 1024 && n->k <= 64, StatusCode::kUnimplemented,
                     "Router on the GPU: %lld experts / k = %d exceed 1024 / 64", (long long)e, n->k);
  k::RouterArgs args{};
  args.tokens = static_cast<uint32_t>(tokens);
  args.experts = static_cast<uint32_t>(e);
  args.k = static_cast<uint32_t>(n->k);
  args.kind = static_cast<uint32_t>(n->kind);
  args.dtype = static_cast<uint32_t>(logits.dtype());
  args.renormalize = n->renormalize;
  args.n_group = static_cast<uint32_t>(n->n_group);
  args.topk_group = static_cast<uint32_t>(n->topk_group);
  args.routed_scaling_factor = n->routed_scaling_factor;
  args.has_bias = bias.defined();
  args.has_scale = scale.defined();
  // One workgroup of 256 threads per token (router.comp); the router_e256_* variants have
  // a quarter of the shared memory and only their kind's code.
  static constexpr const char* kE256[] = {"router_e256_softmax", "router_e256_topk_softmax", "router_e256_sigmoid"};
  SB_CHECK_OR_RETURN(args.kind < 3, StatusCode::kInvalidArgument, "Router kind %u is not known", args.kind);
  SB_RETURN_IF_ERROR(rt.dispatch(e <= 256 ? kE256[args.kind] : "router", {bl, bb, bs, blive, bw, bi, rt.error_word()},
                                 &args, sizeof(args), 256 * static_cast<uint64_t>(tokens)));
  SB_RETURN_IF_ERROR(ctx.out(n->weights.get(), std::move(weights)));
  return ctx.out(n->indices.get(), std::move(indices));
}

// Rows of x as units of 1, 2 or 4 bytes (8-byte dtypes: two 4-byte units).
void row_units(const Tensor& x, int64_t rows, uint32_t& units, uint32_t& unit_bytes) {
  const size_t es = dtype_size(x.dtype());
  unit_bytes = static_cast<uint32_t>(es == 8 ? 4 : es);
  const int64_t per_row = rows ? x.numel() / x.dim(0) : 0;
  units = static_cast<uint32_t>(per_row * (es == 8 ? 2 : 1));
}

Status gather_rows_impl(KernelContext& ctx, const Tensor& x, BufferRef bx, BufferRef bidx, int64_t out_rows,
                        const fb::Tid* out_tid) {
  Runtime& rt = rt_of(ctx);
  Shape shape = x.shape();
  shape[0] = out_rows;
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(x.dtype(), shape));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  k::PermuteArgs args{};
  SB_ASSIGN_OR_RETURN(args.rows, u32_count(out_rows, "rows"));
  SB_ASSIGN_OR_RETURN(args.src_rows, u32_count(x.dim(0), "rows"));
  row_units(x, x.dim(0), args.row_units, args.unit_bytes);
  SB_RETURN_IF_ERROR(u32_count(out_rows * static_cast<int64_t>(args.row_units), "GatherRows").status());
  const uint64_t words = words_of(x.dtype(), out.numel());
  args.out_words = static_cast<uint32_t>(words);
  // Rows of whole 16-byte units at aligned offsets: gather_rows16 (16 bytes per thread).
  const bool by16 =
      args.row_units * args.unit_bytes % 16 == 0 && args.row_units > 0 && bx.offset % 16 == 0 && bo.offset % 16 == 0;
  SB_RETURN_IF_ERROR(rt.dispatch(by16 ? "gather_rows16" : "gather_rows", {bx, bidx, bo, rt.error_word()}, &args,
                                 sizeof(args), by16 ? words / 4 : words));
  return ctx.out(out_tid, std::move(out));
}

Status gather_rows(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsGatherRowsNode();
  Tensor x, idx;
  SB_ASSIGN_OR_RETURN(BufferRef bx, bind_in(ctx, n->x.get(), &x));
  SB_ASSIGN_OR_RETURN(BufferRef bi, bind_in(ctx, n->indices.get(), &idx));
  return gather_rows_impl(ctx, x, bx, bi, idx.numel(), n->out.get());
}

// ScatterRows' operands bound and its permutation inverted on the device (checked there:
// a repeat or an index out of range raises SB_ERR_PERMUTATION).
struct Scatter {
  Tensor x, idx;
  BufferRef bx, inv;
};

Result<Scatter> invert_scatter(KernelContext& ctx, const fb::ScatterRowsNodeT* n) {
  Runtime& rt = rt_of(ctx);
  Scatter s;
  SB_ASSIGN_OR_RETURN(s.bx, bind_in(ctx, n->x.get(), &s.x));
  SB_ASSIGN_OR_RETURN(BufferRef bi, bind_in(ctx, n->indices.get(), &s.idx));
  SB_CHECK_OR_RETURN(s.idx.numel() == s.x.dim(0), StatusCode::kInvalidArgument, "%lld indices for %lld rows",
                     (long long)s.idx.numel(), (long long)s.x.dim(0));
  SB_ASSIGN_OR_RETURN(s.inv, rt.scratch(static_cast<size_t>(s.idx.numel()) * 4, 0xffffffffu));
  k::PermuteArgs args{};
  SB_ASSIGN_OR_RETURN(args.rows, u32_count(s.idx.numel(), "ScatterRows"));
  SB_RETURN_IF_ERROR(rt.dispatch("invert_permutation", {bi, s.inv, rt.error_word()}, &args, sizeof(args),
                                 static_cast<uint64_t>(args.rows)));
  return s;
}

// out[idx[p]] = x[p]: the device inverts the permutation (checking it), then gathers.
Status scatter_rows(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsScatterRowsNode();
  SB_ASSIGN_OR_RETURN(Scatter s, invert_scatter(ctx, n));
  return gather_rows_impl(ctx, s.x, s.bx, s.inv, s.x.dim(0), n->out.get());
}

// ScatterRows then Combine of its (private) output, as MoE prefill ends: Combine reads
// y's rows through the checked inverse permutation (combine_rows), so the scattered
// copy is never written. Rows not in 16-byte units take the two kernels.
Status scatter_combine(KernelContext& ctx, const std::unique_ptr<fb::InstructionT>* ins) {
  const auto* sc = ins[0]->op.AsScatterRowsNode();
  const auto* cn = ins[1]->op.AsCombineNode();
  SB_ASSIGN_OR_RETURN(Scatter s, invert_scatter(ctx, sc));
  if (s.x.rank() == 2) {
    SB_ASSIGN_OR_RETURN(CombineOperands c,
                        bind_combine(ctx, cn->weights.get(), cn->shared.get(), cn->shared_gate.get(), s.x.dim(1)));
    if (combine_by16(s.x, s.bx, BufferRef{}, c.tokens * s.x.dim(1)))
      return combine_impl(ctx, s.x, s.bx, c, cn->out.get(), &s.inv);
  }
  SB_RETURN_IF_ERROR(gather_rows_impl(ctx, s.x, s.bx, s.inv, s.x.dim(0), sc->out.get()));
  return combine(ctx, ins[1]->op);
}

// The optional lhs/rhs index operands of GatherQmm/GatherMm: bound (with the tensors
// kept in `lhs`/`rhs`), or `stand_in` (never read) when absent.
Status bind_indices(KernelContext& ctx, const std::unique_ptr<fb::Tid>& lhs_tid,
                    const std::unique_ptr<fb::Tid>& rhs_tid, BufferRef stand_in, Tensor& lhs, Tensor& rhs,
                    BufferRef& bl, BufferRef& br) {
  bl = br = stand_in;
  if (lhs_tid) {
    SB_ASSIGN_OR_RETURN(bl, bind_in(ctx, lhs_tid.get(), &lhs));
  }
  if (rhs_tid) {
    SB_ASSIGN_OR_RETURN(br, bind_in(ctx, rhs_tid.get(), &rhs));
  }
  return Status::ok();
}

// GatherQmm takes the one-dispatch row kernel (qmm_row) up to this many (pair) rows
// where the tiles do not (each of its workgroups quantizes a row of x). H100, Qwen3 MoE
// layer at M = 5 / 8 / 16 / 32 tokens (40-256 pairs, below the tiles' 4 pairs per
// expert): 456 / 687 / 1324 / 2574 us through quantize + qmm with the limit at 32,
// 116 / 139 / 219 / 378 us through the row kernels.
constexpr int64_t kQmmRowMaxPairs = 512;
// qmm_row widens its tiles while more workgroups than this would run.
constexpr int64_t kQmmRowWorkgroups = 1056;
// Sorted pairs (or pairs without rhs) from this many on, and with rhs at least
// kQmmTilePairsPerExpert per expert on average, take the tiled kernel (qmm_tile): weights read once per tile of 32
// pairs instead of once per pair. Below that its tiles run mostly empty (H100: at 2 pairs per expert it takes twice as
// long as qmm, at 8 half as long).
constexpr int64_t kQmmTileMinPairs = 64;
constexpr int64_t kQmmTilePairsPerExpert = 4;

// GatherQmm's operands bound, its expert table and the kernel arguments: shared by the
// plain kernel and the fused gate/up/Glu one.
struct QmmSetup {
  Tensor x, w, scales, biases, lhs, rhs;
  BufferRef bx, bw, bs, bb, bl, br, bi;
  k::QmmArgs args{};
  int64_t rows = 0, kdim = 0, experts = 0, nout = 0, pairs = 0, groups = 0, sorted = 0;
  bool all_4bit = false;  // every expert 4-bit (none pruned): qmm_mma4 may run
};

// `x_shape`: x is never stored (a fused producer made its Q8 blocks); its shape and
// dtype stand in and binding 0 of the row kernels is never used.
Result<QmmSetup> qmm_setup(KernelContext& ctx, const fb::GatherQmmNodeT* n, const Tensor* x_shape = nullptr) {
  QmmSetup q;
  SB_ASSIGN_OR_RETURN(q.bw, bind_in(ctx, n->w.get(), &q.w));
  if (x_shape) {
    q.x = *x_shape;
    q.bx = q.bw;
  } else {
    SB_ASSIGN_OR_RETURN(q.bx, bind_in(ctx, n->x.get(), &q.x));
  }
  SB_ASSIGN_OR_RETURN(q.bs, bind_in(ctx, n->scales.get(), &q.scales));
  SB_ASSIGN_OR_RETURN(q.bb, bind_in(ctx, n->biases.get(), &q.biases));
  SB_RETURN_IF_ERROR(bind_indices(ctx, n->lhs_indices, n->rhs_indices, q.bx, q.lhs, q.rhs, q.bl, q.br));
  const Tensor &x = q.x, &lhs = q.lhs, &rhs = q.rhs;
  const int64_t rows = x.dim(0), kdim = x.dim(1), experts = q.scales.dim(0), nout = q.scales.dim(1);
  const int64_t pairs = rhs.defined() ? rhs.numel() : lhs.defined() ? lhs.numel() : rows;
  SB_CHECK_OR_RETURN(!lhs.defined() || lhs.numel() == pairs, StatusCode::kInvalidArgument,
                     "lhs_indices has %lld entries, rhs_indices %lld", (long long)lhs.numel(), (long long)pairs);
  SB_CHECK_OR_RETURN(lhs.defined() || rows == 0 || pairs % rows == 0, StatusCode::kInvalidArgument,
                     "%lld pairs are not a multiple of %lld rows of x", (long long)pairs, (long long)rows);
  // Per-expert widths and where each expert's codes start (host-known, from the node).
  std::vector<uint32_t> info(static_cast<size_t>(2 * experts));
  int64_t off = 0;
  for (int64_t e = 0; e < experts; ++e) {
    const int b = n->expert_bits.empty() ? n->bits : n->expert_bits[static_cast<size_t>(e)];
    info[static_cast<size_t>(e)] = static_cast<uint32_t>(b);
    info[static_cast<size_t>(experts + e)] = static_cast<uint32_t>(off);
    off += nout * kdim * b / 32;
  }
  q.all_4bit = std::all_of(info.begin(), info.begin() + experts, [](uint32_t b) { return b == 4; });
  SB_CHECK_OR_RETURN(off == q.w.numel(), StatusCode::kInvalidArgument, "w holds %lld words, the experts need %lld",
                     (long long)q.w.numel(), (long long)off);
  SB_RETURN_IF_ERROR(u32_count(off, "GatherQmm weights").status());
  SB_RETURN_IF_ERROR(u32_count(pairs * nout, "GatherQmm").status());
  SB_RETURN_IF_ERROR(u32_count(pairs * rows, "GatherQmm pairs x rows").status());
  if (n->sorted_indices) {
    SB_ASSIGN_OR_RETURN(q.sorted, ctx.resolve(n->sorted_indices.get()));
  }
  SB_ASSIGN_OR_RETURN(q.bi, static_cast<GpuDevice&>(ctx.device()).node_table(n, info));
  SB_RETURN_IF_ERROR(u32_count(rows * kdim, "GatherQmm x").status());
  k::QmmArgs& args = q.args;
  args.pairs = static_cast<uint32_t>(pairs);
  args.n = static_cast<uint32_t>(nout);
  args.k = static_cast<uint32_t>(kdim);
  args.groups = static_cast<uint32_t>(q.scales.dim(2));
  args.group_size = static_cast<uint32_t>(n->group_size);
  args.rows = static_cast<uint32_t>(rows);
  args.experts = static_cast<uint32_t>(experts);
  args.scale_dtype = static_cast<uint32_t>(q.scales.dtype());
  args.out_dtype = static_cast<uint32_t>(x.dtype());
  args.x_dtype = static_cast<uint32_t>(x.dtype());
  args.has_lhs = lhs.defined();
  args.has_rhs = rhs.defined();
  args.sorted = q.sorted != 0;
  q.rows = rows, q.kdim = kdim, q.experts = experts, q.nout = nout, q.pairs = pairs, q.groups = q.scales.dim(2);
  return q;
}

// Whether the tiled kernels (qmm_tiles + qmm_tile / qmm_mma) take these pairs.
bool qmm_tiled(const QmmSetup& q) {
  return q.pairs >= kQmmTileMinPairs &&
         (q.rhs.defined() ? q.sorted != 0 && q.pairs >= kQmmTilePairsPerExpert * q.experts : true) &&
         (q.x.dtype() == DType::kF32 || q.nout % 2 == 0);
}

// Whether qmm_row (and qmm_row_glu) take these rows (not where the tiles do); then its
// outputs per workgroup and tiles per pair: about two (output, group) tasks per thread,
// widening while more than
// kQmmRowWorkgroups workgroups would run (each workgroup quantizes its row). H100, Qwen3
// decode with the *_dot4 kernels: gate/up/Glu at 8 outputs per workgroup (2 tasks a
// thread) 17.0 us against 18.6 at 16 (4 tasks); down at ~40 (2 tasks) 15.2 us against
// 17.9 at 20 (1 task). `projections` (1 or 2) share SB_QMM_ROW_TERMS.
bool qmm_row_plan(QmmSetup& q, int64_t projections) {
  const int64_t groups = q.groups, nout = q.nout, pairs = q.pairs;
  // x is read 16 bytes at a time (whole 8-element units).
  if (pairs > kQmmRowMaxPairs || q.kdim > SB_QMM_STAGE_K || 2 * projections * groups > SB_QMM_ROW_TERMS ||
      (q.x.dtype() != DType::kF32 && nout % 2 != 0) || q.bx.offset % 16 != 0 || qmm_tiled(q))
    return false;
  int64_t per_wg = std::clamp<int64_t>(2 * 256 / (projections * groups), 2, 256) & ~int64_t{1};
  auto tiles = [&](int64_t t) { return (nout + t - 1) / t; };
  while (2 * per_wg * groups * projections <= SB_QMM_ROW_TERMS && 2 * per_wg <= 256 &&
         pairs * tiles(per_wg) > kQmmRowWorkgroups)
    per_wg *= 2;
  q.args.per_wg = static_cast<uint32_t>(per_wg);
  q.args.tiles = static_cast<uint32_t>(tiles(per_wg));
  return true;
}

// The row kernel for these rows: the *_2k twin (less shared memory) where K allows; the
// *_dot4 twin (packed int8 dot products: H100 decode layer 56 -> 52 us) where the device
// has them and every expert of every projection it computes is 4-bit.
bool row_dot4(const Runtime& rt, bool all_4bit) { return all_4bit && rt.int_dot(); }
bool row_2k(const QmmSetup& q) { return q.kdim <= SB_QMM_ROW_SMALL_K; }

const char* qmm_row_kernel(const Runtime& rt, const QmmSetup& q, bool glu, bool all_4bit) {
  const bool dot4 = row_dot4(rt, all_4bit);
  if (row_2k(q))
    return glu ? (dot4 ? "qmm_row_glu_2k_dot4" : "qmm_row_glu_2k") : (dot4 ? "qmm_row_2k_dot4" : "qmm_row_2k");
  return glu ? (dot4 ? "qmm_row_glu_dot4" : "qmm_row_glu") : (dot4 ? "qmm_row_dot4" : "qmm_row");
}

// The specialization constants of the row kernel row_dot4 picks (gather_qmm.comp: only
// the *_dot4 twins declare them): x, out and scale dtypes and the Glu kind, so the
// driver builds only the path this dispatch takes.
SpecConstants row_spec(const Runtime& rt, bool all_4bit, const k::QmmArgs& a, uint32_t glu_kind = 0) {
  if (!row_dot4(rt, all_4bit)) return {};
  return SpecConstants{{a.x_dtype, a.out_dtype, a.scale_dtype, glu_kind}, 4};
}

// Q8 activation blocks of a GatherQmm's x (quantize_q8); the fused gate/up path makes
// them once for both projections of the same x.
struct Q8Blocks {
  Tensor xq, d, s;
  BufferRef bq, bd, bsum;
  bool permuted = false;
};

// `permute`: in qmm_mma4's K order (only that kernel reads them).
// Device room for the Q8 blocks of `rows` x `k` activations (k a multiple of 32).
Result<Q8Blocks> alloc_q8(Runtime& rt, int64_t rows, int64_t k, bool permuted) {
  Q8Blocks b;
  const int64_t blocks = rows * (k / 32);
  SB_ASSIGN_OR_RETURN(b.xq, rt.alloc(DType::kI32, {blocks * 8}));
  SB_ASSIGN_OR_RETURN(b.d, rt.alloc(DType::kF32, {blocks}));
  SB_ASSIGN_OR_RETURN(b.s, rt.alloc(DType::kI32, {blocks}));
  SB_ASSIGN_OR_RETURN(b.bq, rt.bind(b.xq, false));
  SB_ASSIGN_OR_RETURN(b.bd, rt.bind(b.d, false));
  SB_ASSIGN_OR_RETURN(b.bsum, rt.bind(b.s, false));
  b.permuted = permuted;
  return b;
}

Result<Q8Blocks> quantize_rows(Runtime& rt, const QmmSetup& q, bool permute) {
  const int64_t blocks = q.rows * (q.kdim / 32);
  SB_ASSIGN_OR_RETURN(Q8Blocks b, alloc_q8(rt, q.rows, q.kdim, permute));
  k::Q8Args qa{static_cast<uint32_t>(q.rows), static_cast<uint32_t>(q.kdim), static_cast<uint32_t>(q.x.dtype()),
               permute ? 1u : 0u};
  const bool by16 = q.bx.offset % 16 == 0 && b.bq.offset % 16 == 0;  // 16-byte loads and stores
  SB_RETURN_IF_ERROR(rt.dispatch(by16 ? "quantize_q8_16" : "quantize_q8", {q.bx, b.bq, b.bd, b.bsum}, &qa, sizeof(qa),
                                 static_cast<uint64_t>(blocks)));
  return b;
}

// The kernel of the tiles: int8 tensor cores where the device has them (Vulkan, NVIDIA),
// the all-4-bit twin when every expert is 4-bit.
const char* qmm_tile_kernel(Runtime& rt, const QmmSetup& q) {
  return rt.int8_mma() ? (q.all_4bit ? "qmm_mma4" : "qmm_mma") : "qmm_tile";
}

// Whether a GatherQmm's Q8 blocks are made in qmm_mma4's order.
bool q8_permuted(Runtime& rt, const QmmSetup& q) {
  return qmm_tiled(q) && std::strcmp(qmm_tile_kernel(rt, q), "qmm_mma4") == 0;
}

// The work list of runs of <= 32 pairs of one expert (qmm_tiles), for every projection
// of the same indices.
struct QmmTileList {
  BufferRef bt;
  int64_t max_tiles = 0;
};

Result<QmmTileList> qmm_tile_list(Runtime& rt, QmmSetup& q) {
  QmmTileList t;
  t.max_tiles = q.pairs / SB_QMM_TILE_PAIRS + std::min(q.experts, q.pairs);
  SB_RETURN_IF_ERROR(u32_count(1 + 3 * t.max_tiles, "GatherQmm tiles").status());
  SB_ASSIGN_OR_RETURN(t.bt, rt.scratch(static_cast<size_t>(1 + 3 * t.max_tiles) * 4, 0));
  k::QmmArgs args = q.args;
  args.tiles = static_cast<uint32_t>(t.max_tiles);
  SB_RETURN_IF_ERROR(rt.dispatch("qmm_tiles", {q.br, q.bi, t.bt, rt.error_word()}, &args, sizeof(args), 256));
  return t;
}

// GatherQmm from Q8 blocks into bo: tiles of 32 pairs x 64 outputs that read each
// weight once per tile (`tiles` set: sorted pairs, or all expert 0's), else per pair.
Status qmm_from_q8(Runtime& rt, QmmSetup& q, const Q8Blocks& q8, const QmmTileList* tiles, BufferRef bo) {
  SB_CHECK_OR_RETURN(q8.permuted == (tiles && q8_permuted(rt, q)), StatusCode::kInternal,
                     "GatherQmm: Q8 blocks in the wrong K order for its kernel");
  k::QmmArgs& args = q.args;
  if (tiles) {
    args.tiles = static_cast<uint32_t>((q.nout + 63) / 64);
    return rt.dispatch(qmm_tile_kernel(rt, q),
                       {q8.bq, q8.bd, q8.bsum, q.bw, q.bs, q.bb, q.bl, tiles->bt, q.bi, bo, rt.error_word()}, &args,
                       sizeof(args), 256 * static_cast<uint64_t>(tiles->max_tiles) * args.tiles);
  }
  // Outputs per workgroup: enough (output, group) tasks for its 64 threads, even so
  // f16/bf16 words are whole, within the shader's shared arrays (gather_qmm.comp).
  int64_t per_wg = std::clamp<int64_t>(64 / std::max<int64_t>(q.groups, 1), 2, 64) & ~int64_t{1};
  SB_CHECK_OR_RETURN(per_wg * q.groups <= 1024, StatusCode::kUnimplemented,
                     "GatherQmm on Vulkan: %lld groups per row exceed 512", (long long)q.groups);
  args.per_wg = static_cast<uint32_t>(per_wg);
  const uint64_t workgroups = static_cast<uint64_t>((q.pairs * q.nout + per_wg - 1) / per_wg);
  return rt.dispatch("qmm", {q8.bq, q8.bd, q8.bsum, q.bw, q.bs, q.bb, q.bl, q.br, q.bi, bo, rt.error_word()}, &args,
                     sizeof(args), 64 * workgroups);
}

// Push constants that begin with a QmmArgs (gpu_kernel_table.h checks where the extra
// fields start), the rest zero.
template <typename T>
T extend_qmm_args(const k::QmmArgs& qa) {
  static_assert(sizeof(T) > sizeof(k::QmmArgs));
  T args{};
  std::memcpy(&args, &qa, sizeof(qa));
  return args;
}

// Decode's down projection with combine_weights in one dispatch (qmm_row_combine_2k):
// the row kernel stores y, and the last workgroup of each (token, tile) combines the
// token's slots from the stored y, so the bits are those of GatherQmm then Combine
// (H100: the separate combine dispatch cost 5.7 us of a ~59 us layer).
Status qmm_row_combine(KernelContext& ctx, const fb::GatherQmmNodeT* n, const QmmSetup& q, const CombineOperands& c,
                       const Tensor& y, BufferRef by) {
  Runtime& rt = rt_of(ctx);
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(y.dtype(), {c.tokens, q.nout}));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  SB_ASSIGN_OR_RETURN(uint32_t counters, u32_count(c.tokens * q.args.tiles, "GatherQmm combine tiles"));
  SB_ASSIGN_OR_RETURN(BufferRef bn, rt.scratch(static_cast<size_t>(counters) * 4, 0));
  auto args = extend_qmm_args<k::QmmCombineArgs>(q.args);
  args.slots = static_cast<uint32_t>(c.slots);
  args.has_shared = c.shared.defined();
  args.shared_dtype = c.shared.defined() ? static_cast<uint32_t>(c.shared.dtype()) : 0;
  args.has_gate = c.gate.defined();
  args.gate_dtype = c.gate.defined() ? static_cast<uint32_t>(c.gate.dtype()) : 0;
  const bool dot4 = row_dot4(rt, q.all_4bit);
  const char* kernel = dot4 ? "qmm_row_combine_2k_dot4" : "qmm_row_combine_2k";
  std::vector<BufferRef> bindings = {q.bx, q.bw, q.bs,    q.bb, q.bl, q.br, q.bi, by, rt.error_word(),
                                     c.bw, c.bs, c.bgate, bn,   bo};
  // Straight after the decode gate/up that stores x (h) and counts its rows: no barrier;
  // each workgroup waits for its row's count. What the wait covers (h, the counts, the
  // router's indices and weights, read after it) takes no barrier; anything else still does.
  const Runtime::Handoff& h = rt.handoff();
  const bool wait = dot4 && same_ref(q.bx, h.rows) && same_ref(q.br, h.indices) && !q.args.sorted;
  args.wait_tiles = wait ? h.tiles : 0;
  if (dot4) bindings.push_back(wait ? h.done : bn);  // bn: a stand-in, not read
  SB_RETURN_IF_ERROR(rt.dispatch(kernel, bindings, &args, sizeof(args),
                                 256 * static_cast<uint64_t>(q.pairs) * q.args.tiles, row_spec(rt, q.all_4bit, q.args),
                                 wait ? handoff_mask(bindings, {h.rows, h.done, h.indices, h.weights}) : 0u));
  return ctx.out(n->out.get(), std::move(out));
}

// GatherQmm `n` set up as q; `pre` and `pre_tiles`: x's Q8 blocks and the pairs' work
// list, made by a fused producer (else made here).
Status gather_qmm_run(KernelContext& ctx, const fb::GatherQmmNodeT* n, QmmSetup& q, const Q8Blocks* pre = nullptr,
                      const QmmTileList* pre_tiles = nullptr) {
  Runtime& rt = rt_of(ctx);
  CombineOperands c;
  if (n->combine_weights) {
    SB_ASSIGN_OR_RETURN(c, bind_combine(ctx, n->combine_weights.get(), n->shared.get(), n->shared_gate.get(), q.nout));
    SB_CHECK_OR_RETURN(c.tokens * c.slots == q.pairs, StatusCode::kInvalidArgument,
                       "combine_weights %s does not match %lld pairs", shape_str(c.w.shape()).c_str(),
                       (long long)q.pairs);
  }
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(q.x.dtype(), {q.pairs, q.nout}));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  if (pre) {
    SB_RETURN_IF_ERROR(qmm_from_q8(rt, q, *pre, pre_tiles, bo));
  } else if (qmm_row_plan(q, 1)) {
    // One workgroup per (pair, tile of outputs) quantizes its row itself: no Q8 dispatch.
    if (n->combine_weights && q.kdim <= SB_QMM_ROW_SMALL_K && rt.cross_workgroup_handoff())
      return qmm_row_combine(ctx, n, q, c, out, bo);
    const char* kernel = qmm_row_kernel(rt, q, false, q.all_4bit);
    SB_RETURN_IF_ERROR(rt.dispatch(kernel, {q.bx, q.bw, q.bs, q.bb, q.bl, q.br, q.bi, bo, rt.error_word()}, &q.args,
                                   sizeof(q.args), 256 * static_cast<uint64_t>(q.pairs) * q.args.tiles,
                                   row_spec(rt, q.all_4bit, q.args)));
  } else {
    SB_ASSIGN_OR_RETURN(Q8Blocks q8, quantize_rows(rt, q, q8_permuted(rt, q)));
    QmmTileList tiles;
    if (qmm_tiled(q)) {
      SB_ASSIGN_OR_RETURN(tiles, qmm_tile_list(rt, q));
    }
    SB_RETURN_IF_ERROR(qmm_from_q8(rt, q, q8, tiles.max_tiles ? &tiles : nullptr, bo));
  }
  if (!n->combine_weights) return ctx.out(n->out.get(), std::move(out));
  // Fused down-projection + combine: by the contract its bits are those of the stored
  // (rounded) product followed by Combine, which is what the device runs (a one-kernel
  // version that staged every slot's row per workgroup was slower: bench/RESULTS.md).
  return combine_impl(ctx, out, bo, c, n->out.get());
}

Status gather_qmm(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsGatherQmmNode();
  SB_ASSIGN_OR_RETURN(QmmSetup q, qmm_setup(ctx, n));
  return gather_qmm_run(ctx, n, q);
}

// A kernel's QmmArgs followed by the Glu's kind and constants (qmm_row_glu, qmm_mma4_glu).
k::QmmGluArgs glu_args(const k::QmmArgs& qa, const fb::GluNodeT* glu_node) {
  auto args = extend_qmm_args<k::QmmGluArgs>(qa);
  args.glu_kind = static_cast<uint32_t>(glu_node->kind);
  args.glu_alpha = glu_node->alpha;
  args.glu_limit = glu_node->limit;
  return args;
}

// The fused gate/up/Glu of decode (GpuDevice::fuse): ins[0..1] are GatherQmm of the
// same x, indices and widths, ins[2] the Glu of their outputs. One qmm_row_glu dispatch
// when the rows suit it; otherwise the three kernels one by one.
Status gate_up_glu(KernelContext& ctx, const std::unique_ptr<fb::InstructionT>* ins) {
  const auto* glu_node = ins[2]->op.AsGluNode();
  const bool gate_first = ins[0]->op.AsGatherQmmNode()->out->idx() == glu_node->gate->idx();
  const auto* gate = ins[gate_first ? 0 : 1]->op.AsGatherQmmNode();
  const auto* up = ins[gate_first ? 1 : 0]->op.AsGatherQmmNode();
  Runtime& rt = rt_of(ctx);
  SB_ASSIGN_OR_RETURN(QmmSetup g, qmm_setup(ctx, gate));
  SB_ASSIGN_OR_RETURN(QmmSetup u, qmm_setup(ctx, up));
  const bool same =
      g.scales.shape() == u.scales.shape() && g.scales.dtype() == u.scales.dtype() && g.w.numel() == u.w.numel();
  const bool one_row_kernel = same && qmm_row_plan(g, 2);  // sets g.args for qmm_row_glu
  if (!same || (!one_row_kernel && qmm_row_plan(g, 1))) {
    // Different shapes, or rows too many for one qmm_row_glu but few enough for qmm_row:
    // the three kernels one by one.
    for (int i = 0; i < 2; ++i) SB_RETURN_IF_ERROR(gather_qmm(ctx, ins[i]->op));
    return glu(ctx, ins[2]->op);
  }
  if (!one_row_kernel) {
    // Many rows (prefill): x quantized once and one tile list for both projections (same
    // x and indices: GpuDevice::fuse checks), then the two matmuls and the Glu.
    // Both projections read the one Q8 pass: in qmm_mma4's order only if both run it.
    if (q8_permuted(rt, g) != q8_permuted(rt, u)) g.all_4bit = u.all_4bit = false;
    SB_ASSIGN_OR_RETURN(Q8Blocks q8, quantize_rows(rt, g, q8_permuted(rt, g)));
    QmmTileList tiles;
    if (qmm_tiled(g)) {
      SB_ASSIGN_OR_RETURN(tiles, qmm_tile_list(rt, g));
    }
    for (QmmSetup* q : {&g, &u}) {
      SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(q->x.dtype(), {q->pairs, q->nout}));
      SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
      SB_RETURN_IF_ERROR(qmm_from_q8(rt, *q, q8, tiles.max_tiles ? &tiles : nullptr, bo));
      SB_RETURN_IF_ERROR(ctx.out((q == &g ? gate : up)->out.get(), std::move(out)));
    }
    return glu(ctx, ins[2]->op);
  }
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(g.x.dtype(), {g.pairs, g.nout}));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  k::QmmGluArgs args = glu_args(g.args, glu_node);
  const bool all_4bit = g.all_4bit && u.all_4bit;
  const char* kernel = qmm_row_kernel(rt, g, true, all_4bit);
  // Straight after the router (decode): no barrier, each workgroup stages x and then waits
  // for its pair's expert (rhs), and counts itself per pair once its h is stored, so the
  // down projection need not wait for a barrier either. H100 decode: see bench/RESULTS.md.
  const bool dot4_2k = row_dot4(rt, all_4bit) && row_2k(g);  // qmm_row_glu_2k_dot4: binding 12 = the counts
  const bool wait = dot4_2k && g.args.has_rhs && !g.args.sorted && same_ref(g.br, rt.handoff().indices);
  args.wait_rhs = wait;
  std::vector<BufferRef> bindings = {g.bx, g.bw, g.bs, g.bb, g.bl, g.br, g.bi, bo, rt.error_word(), u.bw, u.bs, u.bb};
  if (wait) {
    SB_ASSIGN_OR_RETURN(BufferRef done, rt.scratch(static_cast<size_t>(g.pairs) * 4, 0));
    bindings.push_back(done);
    rt.handoff().rows = bo, rt.handoff().done = done, rt.handoff().tiles = args.tiles;
  } else if (dot4_2k) {
    bindings.push_back(rt.error_word());  // a stand-in, not touched without wait_rhs
  }
  SB_RETURN_IF_ERROR(rt.dispatch(
      kernel, bindings, &args, sizeof(args), 256 * static_cast<uint64_t>(g.pairs) * args.tiles,
      row_spec(rt, all_4bit, g.args, args.glu_kind), wait ? handoff_mask(bindings, {rt.handoff().indices}) : 0u));
  return ctx.out(glu_node->out.get(), std::move(out));
}

// A sorted MoE FFN (GpuDevice::fuse): ins[0..2] as gate_up_glu, ins[3] the down
// GatherQmm of the Glu's private output with the same experts. On int8 tensor cores with
// every expert 4-bit: x quantized once, one work list for all three projections, and
// qmm_mma4_glu writes the Q8 blocks of h = Glu(gate, up) directly, so h is never stored
// nor quantized again. Anything else runs gate_up_glu, then the down projection.
Status moe_ffn(KernelContext& ctx, const std::unique_ptr<fb::InstructionT>* ins) {
  const auto* glu_node = ins[2]->op.AsGluNode();
  const bool gate_first = ins[0]->op.AsGatherQmmNode()->out->idx() == glu_node->gate->idx();
  const auto* gate = ins[gate_first ? 0 : 1]->op.AsGatherQmmNode();
  const auto* up = ins[gate_first ? 1 : 0]->op.AsGatherQmmNode();
  const auto* down = ins[3]->op.AsGatherQmmNode();
  Runtime& rt = rt_of(ctx);
  SB_ASSIGN_OR_RETURN(QmmSetup g, qmm_setup(ctx, gate));
  SB_ASSIGN_OR_RETURN(QmmSetup u, qmm_setup(ctx, up));
  const bool fast = rt.int8_mma() && g.all_4bit && u.all_4bit && qmm_tiled(g) && g.scales.shape() == u.scales.shape() &&
                    g.scales.dtype() == u.scales.dtype() && g.w.numel() == u.w.numel() && g.nout % 32 == 0;
  Tensor h_shape = Tensor::wrap(g.x.dtype(), {g.pairs, g.nout}, nullptr, nullptr);
  QmmSetup d;
  if (fast) {
    SB_ASSIGN_OR_RETURN(d, qmm_setup(ctx, down, &h_shape));
  }
  if (!fast || !d.all_4bit || d.kdim != g.nout || d.pairs != g.pairs || d.experts != g.experts || !qmm_tiled(d)) {
    SB_RETURN_IF_ERROR(gate_up_glu(ctx, ins));
    return gather_qmm(ctx, ins[3]->op);
  }
  SB_ASSIGN_OR_RETURN(Q8Blocks q8, quantize_rows(rt, g, true));
  SB_ASSIGN_OR_RETURN(QmmTileList tiles, qmm_tile_list(rt, g));
  SB_ASSIGN_OR_RETURN(Q8Blocks h, alloc_q8(rt, g.pairs, g.nout, true));  // h's, in qmm_mma4's K order
  k::QmmGluArgs args = glu_args(g.args, glu_node);
  args.tiles = static_cast<uint32_t>(g.nout / 32);  // column blocks of 32 (gate and up: 64 weight rows)
  SB_RETURN_IF_ERROR(rt.dispatch("qmm_mma4_glu",
                                 {q8.bq, q8.bd, q8.bsum, g.bw, g.bs, g.bb, g.bl, tiles.bt, g.bi, h.bq, rt.error_word(),
                                  u.bw, u.bs, u.bb, h.bd, h.bsum},
                                 &args, sizeof(args), 256 * static_cast<uint64_t>(tiles.max_tiles) * args.tiles));
  return gather_qmm_run(ctx, down, d, &h, &tiles);
}

bool same_tid(const std::unique_ptr<fb::Tid>& a, const std::unique_ptr<fb::Tid>& b) {
  return a ? b && a->idx() == b->idx() : !b;
}

bool same_iov(const std::unique_ptr<fb::IntOrVidT>& a, const std::unique_ptr<fb::IntOrVidT>& b) {
  if (!a || !b) return !a && !b;
  if (a->is_vid != b->is_vid) return false;
  return a->is_vid ? a->vid && b->vid && a->vid->idx() == b->vid->idx() : a->literal == b->literal;
}

Status gather_mm(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsGatherMmNode();
  Runtime& rt = rt_of(ctx);
  Tensor x, w, lhs, rhs;
  SB_ASSIGN_OR_RETURN(BufferRef bx, bind_in(ctx, n->x.get(), &x));
  SB_ASSIGN_OR_RETURN(BufferRef bw, bind_in(ctx, n->w.get(), &w));
  BufferRef bl, br;
  SB_RETURN_IF_ERROR(bind_indices(ctx, n->lhs_indices, n->rhs_indices, bx, lhs, rhs, bl, br));
  const int64_t rows = x.dim(0), kdim = x.dim(1), experts = w.dim(0), nout = w.dim(1);
  SB_CHECK_OR_RETURN(w.dim(2) == kdim, StatusCode::kInvalidArgument, "w %s does not match K = %lld",
                     shape_str(w.shape()).c_str(), (long long)kdim);
  const int64_t pairs = rhs.defined() ? rhs.numel() : lhs.defined() ? lhs.numel() : rows;
  SB_CHECK_OR_RETURN((!lhs.defined() || lhs.numel() == pairs) && (lhs.defined() || rows == 0 || pairs % rows == 0),
                     StatusCode::kInvalidArgument, "index lengths do not match (%lld pairs, %lld rows)",
                     (long long)pairs, (long long)rows);
  SB_RETURN_IF_ERROR(u32_count(w.numel(), "GatherMm weights").status());
  SB_RETURN_IF_ERROR(u32_count(pairs * std::max<int64_t>(rows, nout), "GatherMm").status());
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(x.dtype(), {pairs, nout}));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  k::GatherMmArgs args{static_cast<uint32_t>(pairs),
                       static_cast<uint32_t>(nout),
                       static_cast<uint32_t>(kdim),
                       static_cast<uint32_t>(rows),
                       static_cast<uint32_t>(experts),
                       static_cast<uint32_t>(x.dtype()),
                       lhs.defined(),
                       rhs.defined()};
  // One workgroup of 32 lanes per output word (gather_mm.comp).
  SB_RETURN_IF_ERROR(rt.dispatch("gather_mm", {bx, bw, bl, br, bo, rt.error_word()}, &args, sizeof(args),
                                 32 * words_of(x.dtype(), pairs * nout)));
  return ctx.out(n->out.get(), std::move(out));
}

// Rows from which matmul_rows16 takes a GEMV (below, attention heads keep `matmul`).
constexpr uint32_t kMatmulRows16MinK = 1024;

// MatmulArgs of one [rows, k] x [k, cols] product: no bias, batch and group 1.
k::MatmulArgs matmul_args(int64_t rows, int64_t cols, int64_t kdim, DType a, DType b, bool transpose_b) {
  k::MatmulArgs args{};
  args.rows = static_cast<uint32_t>(rows);
  args.cols = static_cast<uint32_t>(cols);
  args.k = static_cast<uint32_t>(kdim);
  args.dtype = static_cast<uint32_t>(a);
  args.b_dtype = static_cast<uint32_t>(b);
  args.transpose_b = transpose_b;
  args.batch = 1;
  args.group = 1;
  return args;
}

// Matmul / BatchMatmul: 16 x 16 output tiles per workgroup (matmul_tile) when rows and
// columns both fill tiles (prefill), else one output word per 32-lane workgroup (decode
// GEMVs: the lanes split k). 16-bit outputs of odd width share words across rows, which
// only the per-output kernel handles.
Status dispatch_matmul(Runtime& rt, const k::MatmulArgs& args, DType dtype, const std::vector<BufferRef>& binds) {
  const uint64_t batch = args.batch, rows = args.rows, cols = args.cols;
  if (rows >= 16 && cols >= 16 && (dtype == DType::kF32 || cols % 2 == 0))
    return rt.dispatch("matmul_tile", binds, &args, sizeof(args),
                       256 * batch * ((rows + 15) / 16) * ((cols + 15) / 16));
  // Long rows of a and (transposed) b in whole 16-byte units at 16-byte aligned offsets:
  // matmul_rows16 copies them with 16-byte loads (decode GEMVs such as the router logits
  // are latency-bound). Short rows (attention heads) keep `matmul`: the copy's shared
  // memory costs occupancy there (H100 whole-model decode 55 -> 47 tok/s with head rows).
  const bool rows16 = args.transpose_b != 0 && args.k >= kMatmulRows16MinK && args.k % (16 / dtype_size(dtype)) == 0 &&
                      args.k % (16 / dtype_size(static_cast<DType>(args.b_dtype))) == 0 && binds[0].offset % 16 == 0 &&
                      binds[1].offset % 16 == 0;
  return rt.dispatch(rows16 ? "matmul_rows16" : "matmul", binds, &args, sizeof(args),
                     32 * words_of(dtype, static_cast<int64_t>(batch * rows * cols)));
}

Status matmul(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsMatmulNode();
  Runtime& rt = rt_of(ctx);
  Tensor a, b, bias;
  SB_ASSIGN_OR_RETURN(BufferRef ba, bind_in(ctx, n->a.get(), &a));
  SB_ASSIGN_OR_RETURN(BufferRef bb, bind_in(ctx, n->b.get(), &b));
  BufferRef bbias = ba;  // stand-in when absent
  if (n->bias) {
    SB_ASSIGN_OR_RETURN(bbias, bind_in(ctx, n->bias.get(), &bias));
  }
  SB_ASSIGN_OR_RETURN(cpu::MatmulDims dims, cpu::matmul_dims(a, b, n->transpose_b, bias));
  const int64_t kdim = dims.k, rows = dims.rows, cols = dims.cols;
  SB_RETURN_IF_ERROR(u32_count(std::max({a.numel(), b.numel(), rows * cols}), "Matmul").status());
  Shape shape = a.shape();
  shape.back() = cols;
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(a.dtype(), shape));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  k::MatmulArgs args = matmul_args(rows, cols, kdim, a.dtype(), b.dtype(), n->transpose_b);
  args.has_bias = bias.defined();
  args.bias_dtype = bias.defined() ? static_cast<uint32_t>(bias.dtype()) : 0;
  SB_RETURN_IF_ERROR(dispatch_matmul(rt, args, a.dtype(), {ba, bb, bbias, bo}));
  return ctx.out(n->out.get(), std::move(out));
}

// Softmax / RmsNorm along the last axis (norm.comp), one thread per row. 16-bit rows of
// odd length would share output words between threads, so they go through f32 and a
// Cast (the same single rounding as a direct store).
Status norm_rows(KernelContext& ctx, const char* kernel, const fb::Tid* x_tid, const fb::Tid* w_tid, float eps,
                 const fb::Tid* out_tid) {
  Runtime& rt = rt_of(ctx);
  Tensor x, w;
  SB_ASSIGN_OR_RETURN(BufferRef bx, bind_in(ctx, x_tid, &x));
  BufferRef bw;
  const int64_t d = x.dim(x.rank() - 1), rows = d ? x.numel() / d : 0;
  if (w_tid) {
    SB_ASSIGN_OR_RETURN(bw, bind_in(ctx, w_tid, &w));
    SB_CHECK_OR_RETURN(w.numel() == d, StatusCode::kInvalidArgument, "weight %s does not match the last dim %lld",
                       shape_str(w.shape()).c_str(), (long long)d);
  }
  SB_RETURN_IF_ERROR(u32_count(x.numel(), kernel).status());
  const bool via_f32 = dtype_size(x.dtype()) == 2 && d % 2 != 0;
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(via_f32 ? DType::kF32 : x.dtype(), x.shape()));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  k::NormArgs args{static_cast<uint32_t>(rows),
                   static_cast<uint32_t>(d),
                   static_cast<uint32_t>(x.dtype()),
                   d ? static_cast<float>(1.0 / static_cast<double>(d)) : 0.0f,
                   eps,
                   static_cast<uint32_t>(out.dtype()),
                   0,
                   0};
  const std::vector<BufferRef> binds = w_tid ? std::vector<BufferRef>{bx, bw, bo} : std::vector<BufferRef>{bx, bo};
  // Rows that fit in shared memory: a workgroup each (terms staged, one thread adds them).
  const bool per_row = d > 0 && d <= SB_NORM_ROW_MAX;
  const char* name = !per_row ? kernel : w_tid ? "rms_norm_row" : "softmax_row";
  SB_RETURN_IF_ERROR(rt.dispatch(name, binds, &args, sizeof(args), static_cast<uint64_t>(rows) * (per_row ? 256 : 1)));
  if (via_f32) {
    SB_ASSIGN_OR_RETURN(Tensor narrow, rt.alloc(x.dtype(), x.shape()));
    SB_ASSIGN_OR_RETURN(BufferRef bn, rt.bind(narrow, false));
    k::CastArgs ca{static_cast<uint32_t>(x.numel()), static_cast<uint32_t>(DType::kF32),
                   static_cast<uint32_t>(x.dtype()), 0};
    SB_RETURN_IF_ERROR(rt.dispatch("cast", {bo, bn}, &ca, sizeof(ca), words_of(x.dtype(), x.numel())));
    out = narrow;
  }
  return ctx.out(out_tid, std::move(out));
}

Status softmax(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsSoftmaxNode();
  return norm_rows(ctx, "softmax", n->x.get(), nullptr, 0.0f, n->out.get());
}

Status rms_norm(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsRmsNormNode();
  return norm_rows(ctx, "rms_norm", n->x.get(), n->weight.get(), n->eps, n->out.get());
}

Status batch_matmul(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsBatchMatmulNode();
  Runtime& rt = rt_of(ctx);
  Tensor a, b;
  SB_ASSIGN_OR_RETURN(BufferRef ba, bind_in(ctx, n->a.get(), &a));
  SB_ASSIGN_OR_RETURN(BufferRef bb, bind_in(ctx, n->b.get(), &b));
  SB_ASSIGN_OR_RETURN(cpu::MatmulDims dims, cpu::batch_matmul_dims(a, b, n->transpose_b));
  const int64_t batch = dims.batch, m = dims.rows, kdim = dims.k, cols = dims.cols;
  SB_RETURN_IF_ERROR(u32_count(std::max({a.numel(), b.numel(), batch * m * cols}), "BatchMatmul").status());
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(a.dtype(), {batch, m, cols}));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  k::MatmulArgs args = matmul_args(m, cols, kdim, a.dtype(), b.dtype(), n->transpose_b);
  args.batch = static_cast<uint32_t>(batch);
  args.group = static_cast<uint32_t>(dims.group);
  SB_RETURN_IF_ERROR(dispatch_matmul(rt, args, a.dtype(), {ba, bb, ba, bo}));
  return ctx.out(n->out.get(), std::move(out));
}

// x viewed as [outer, d, inner] around `axis`; out drops the axis (1 with keepdims).
Status reduce_like(KernelContext& ctx, const fb::Tid* x_tid, const fb::Tid* out_tid, int32_t axis_in, bool keepdims,
                   uint32_t op, bool is_argmax) {
  Runtime& rt = rt_of(ctx);
  Tensor x;
  SB_ASSIGN_OR_RETURN(BufferRef bx, bind_in(ctx, x_tid, &x));
  SB_ASSIGN_OR_RETURN(int64_t axis, cpu::normalize_axis(axis_in, x.rank()));
  const cpu::AxisSplit s = cpu::split_at(x.shape(), axis);
  SB_CHECK_OR_RETURN(s.dim > 0 || (!is_argmax && op == 0), StatusCode::kInvalidArgument, "%s over an empty axis of %s",
                     is_argmax ? "argmax" : "reduction", shape_str(x.shape()).c_str());
  SB_RETURN_IF_ERROR(u32_count(x.numel(), "Reduce").status());
  Shape shape = x.shape();
  if (keepdims)
    shape[static_cast<size_t>(axis)] = 1;
  else
    shape.erase(shape.begin() + axis);
  const DType out_dtype = is_argmax ? DType::kI32 : x.dtype();
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(out_dtype, shape));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  k::ReduceArgs args{static_cast<uint32_t>(s.outer),
                     static_cast<uint32_t>(s.dim),
                     static_cast<uint32_t>(s.inner),
                     op,
                     static_cast<uint32_t>(x.dtype()),
                     0,
                     0,
                     0};
  // Long contiguous float rows (logits): a workgroup of 256 per output.
  const bool wide = is_argmax && dtype_is_float(x.dtype()) && s.inner == 1 && s.dim >= 1024;
  if (wide) {
    SB_RETURN_IF_ERROR(rt.dispatch("argmax_row", {bx, bo}, &args, sizeof(args), static_cast<uint64_t>(s.outer) * 256));
    return ctx.out(out_tid, std::move(out));
  }
  const char* kernel = is_argmax ? (dtype_is_float(x.dtype()) ? "argmax" : "argmax_int")
                       : op == static_cast<uint32_t>(fb::ReduceOp::Mean) ? "reduce_mean"
                                                                         : "reduce";
  SB_RETURN_IF_ERROR(rt.dispatch(kernel, {bx, bo}, &args, sizeof(args), words_of(out_dtype, out.numel())));
  return ctx.out(out_tid, std::move(out));
}

Status reduce(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsReduceNode();
  return reduce_like(ctx, n->x.get(), n->out.get(), n->axis, n->keepdims, static_cast<uint32_t>(n->op), false);
}

Status argmax(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsArgmaxNode();
  return reduce_like(ctx, n->x.get(), n->out.get(), n->axis, n->keepdims, 0, true);
}

// Copies rows [outer, len] (element units) from src to dst with the given offsets and
// strides (shape_ops.comp REGION); 8-byte dtypes move as two 4-byte units.
Status copy_region(Runtime& rt, DType dtype, BufferRef src, BufferRef dst, int64_t outer, int64_t len, int64_t src_off,
                   int64_t src_stride, int64_t dst_off, int64_t dst_stride) {
  if (outer == 0 || len == 0) return Status::ok();
  const int64_t es = static_cast<int64_t>(dtype_size(dtype)), m = es == 8 ? 2 : 1;
  const int64_t unit = es == 8 ? 4 : es, per = 4 / unit;
  const int64_t first = dst_off * m, last = (dst_off + (outer - 1) * dst_stride + len) * m;  // units [first, last)
  SB_RETURN_IF_ERROR(u32_count(std::max(last, (src_off + (outer - 1) * src_stride + len) * m), "copy").status());
  k::RegionArgs a{};
  a.outer = static_cast<uint32_t>(outer);
  a.len = static_cast<uint32_t>(len * m);
  a.src_off = static_cast<uint32_t>(src_off * m);
  a.src_stride = static_cast<uint32_t>(src_stride * m);
  a.dst_off = static_cast<uint32_t>(first);
  a.dst_stride = static_cast<uint32_t>(dst_stride * m);
  a.unit_bytes = static_cast<uint32_t>(unit);
  a.first_word = static_cast<uint32_t>(first / per);
  a.words = static_cast<uint32_t>((last + per - 1) / per - first / per);
  return rt.dispatch("region", {src, dst}, &a, sizeof(a), a.words);
}

Status slice(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsSliceNode();
  Runtime& rt = rt_of(ctx);
  Tensor x;
  SB_ASSIGN_OR_RETURN(BufferRef bx, bind_in(ctx, n->x.get(), &x));
  SB_ASSIGN_OR_RETURN(int64_t axis, cpu::normalize_axis(n->axis, x.rank()));
  SB_ASSIGN_OR_RETURN(auto range, cpu::slice_range(ctx, *n, x, axis));
  const auto [start, stop] = range;
  const int64_t d = x.dim(axis);
  Shape shape = x.shape();
  shape[static_cast<size_t>(axis)] = stop - start;
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(x.dtype(), shape));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  const cpu::AxisSplit s = cpu::split_at(x.shape(), axis);
  const int64_t len = (stop - start) * s.inner;
  SB_RETURN_IF_ERROR(copy_region(rt, x.dtype(), bx, bo, s.outer, len, start * s.inner, d * s.inner, 0, len));
  return ctx.out(n->out.get(), std::move(out));
}

Status concat(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsConcatNode();
  Runtime& rt = rt_of(ctx);
  std::vector<Tensor> xs(n->inputs.size());
  std::vector<BufferRef> bs(n->inputs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    SB_ASSIGN_OR_RETURN(bs[i], bind_in(ctx, &n->inputs[i], &xs[i]));
  }
  SB_ASSIGN_OR_RETURN(int64_t axis, cpu::normalize_axis(n->axis, xs[0].rank()));
  SB_ASSIGN_OR_RETURN(Shape shape, cpu::concat_shape(xs, axis));
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(xs[0].dtype(), shape));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  const cpu::AxisSplit s = cpu::split_at(shape, axis);
  int64_t at = 0;  // along the axis
  for (size_t i = 0; i < xs.size(); ++i) {
    const int64_t len = xs[i].dim(axis) * s.inner;
    SB_RETURN_IF_ERROR(copy_region(rt, out.dtype(), bs[i], bo, s.outer, len, 0, len, at * s.inner, s.dim * s.inner));
    at += xs[i].dim(axis);
  }
  return ctx.out(n->out.get(), std::move(out));
}

// dst[..., start:start+len, ...] = update, in place in dst's device memory.
Status slice_update(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsSliceUpdateNode();
  Runtime& rt = rt_of(ctx);
  Tensor u;
  SB_ASSIGN_OR_RETURN(BufferRef bu, bind_in(ctx, n->update.get(), &u));
  SB_ASSIGN_OR_RETURN(int64_t start, ctx.resolve(n->start.get()));
  SB_ASSIGN_OR_RETURN(Tensor host_dst, ctx.inplace(n->dst.get()));
  SB_ASSIGN_OR_RETURN(Tensor dst, rt.device_tensor(host_dst));
  SB_ASSIGN_OR_RETURN(int64_t axis, cpu::normalize_axis(n->axis, dst.rank()));
  SB_RETURN_IF_ERROR(cpu::check_slice_update(u, dst, axis, start));
  const int64_t d = dst.dim(axis), len = u.dim(axis);
  SB_ASSIGN_OR_RETURN(BufferRef bd, rt.bind(dst, false));
  const cpu::AxisSplit s = cpu::split_at(dst.shape(), axis);
  SB_RETURN_IF_ERROR(
      copy_region(rt, dst.dtype(), bu, bd, s.outer, len * s.inner, 0, len * s.inner, start * s.inner, d * s.inner));
  // A host buffer was copied to the device: the device copy is the buffer from now on.
  if (dst.data() != host_dst.data()) SB_RETURN_IF_ERROR(ctx.out(n->dst.get(), std::move(dst)));
  return Status::ok();
}

Status transpose(KernelContext& ctx, const fb::OpNodeUnion& op) {
  const auto* n = op.AsTransposeNode();
  Runtime& rt = rt_of(ctx);
  Tensor x;
  SB_ASSIGN_OR_RETURN(BufferRef bx, bind_in(ctx, n->x.get(), &x));
  SB_ASSIGN_OR_RETURN(cpu::TransposePlan p, cpu::transpose_plan(x, n->perm));
  SB_ASSIGN_OR_RETURN(Tensor out, rt.alloc(x.dtype(), p.out_shape));
  if (out.numel() == 0) return ctx.out(n->out.get(), std::move(out));
  SB_ASSIGN_OR_RETURN(BufferRef bo, rt.bind(out, false));
  SB_ASSIGN_OR_RETURN(uint32_t numel, u32_count(x.numel(), "Transpose"));
  SB_CHECK_OR_RETURN(p.dims.size() <= SB_TRANSPOSE_MAX_RANK, StatusCode::kUnimplemented, "Transpose of rank %zu",
                     p.dims.size());
  k::TransposeArgs a{};
  a.rank = static_cast<uint32_t>(p.dims.size());
  for (size_t i = 0; i < p.dims.size(); ++i) {
    a.dims[i] = static_cast<uint32_t>(p.dims[i]);
    a.strides[i] = static_cast<uint32_t>(p.src_strides[i]);
  }
  a.elem_bytes = static_cast<uint32_t>(dtype_size(x.dtype()));
  a.numel = numel;
  a.invocations = a.elem_bytes == 8 ? numel : static_cast<uint32_t>(words_of(x.dtype(), x.numel()));
  SB_RETURN_IF_ERROR(rt.dispatch("transpose", {bx, bo}, &a, sizeof(a), a.invocations));
  return ctx.out(n->out.get(), std::move(out));
}

bool all_float(const KernelContext& ctx, std::initializer_list<const fb::Tid*> tids) {
  for (const fb::Tid* t : tids)
    if (t && !dtype_is_float(ctx.declared_dtype(t))) return false;
  return true;
}

GpuDevice::GpuDevice(std::unique_ptr<Runtime> rt, std::string name) : rt_(std::move(rt)), name_(std::move(name)) {
  registry_.add(fb::OpNode::BinaryNode, binary);
  registry_.add(fb::OpNode::UnaryNode, unary);
  registry_.add(fb::OpNode::CastNode, cast);
  registry_.add(fb::OpNode::FullNode, full);
  registry_.add(fb::OpNode::GluNode, glu);
  registry_.add(fb::OpNode::CombineNode, combine);
  registry_.add(fb::OpNode::GatherRowsNode, gather_rows);
  registry_.add(fb::OpNode::ScatterRowsNode, scatter_rows);
  registry_.add(fb::OpNode::GatherQmmNode, gather_qmm);
  registry_.add(fb::OpNode::ArgsortNode, argsort);
  registry_.add(fb::OpNode::RouterNode, router);
  registry_.add(fb::OpNode::GatherMmNode, gather_mm);
  registry_.add(fb::OpNode::MatmulNode, matmul);
  registry_.add(fb::OpNode::BatchMatmulNode, batch_matmul);
  registry_.add(fb::OpNode::SoftmaxNode, softmax);
  registry_.add(fb::OpNode::RmsNormNode, rms_norm);
  registry_.add(fb::OpNode::ReduceNode, reduce);
  registry_.add(fb::OpNode::ArgmaxNode, argmax);
  registry_.add(fb::OpNode::SliceNode, slice);
  registry_.add(fb::OpNode::ConcatNode, concat);
  registry_.add(fb::OpNode::SliceUpdateNode, slice_update);
  registry_.add(fb::OpNode::TransposeNode, transpose);
  // Reshape (a view) and Copy (shares storage: tensors are immutable once written) never
  // touch the bytes, so the CPU kernels serve as they are.
  const auto cpu = make_cpu_device();
  registry_.add(fb::OpNode::ReshapeNode, cpu->kernels().find(fb::OpNode::ReshapeNode));
  registry_.add(fb::OpNode::CopyNode, cpu->kernels().find(fb::OpNode::CopyNode));
}

// Decode's gate and up projections with their Glu: GatherQmm, GatherQmm (either order),
// Glu of their two outputs, which nothing after the Glu reads. Same x, indices and widths.
Fusion GpuDevice::fuse(const std::vector<std::unique_ptr<fb::InstructionT>>& ins, size_t i,
                       const PrivateTemp& private_temp) const {
  if (i + 2 <= ins.size() && ins[i]->op.type == fb::OpNode::ScatterRowsNode &&
      ins[i + 1]->op.type == fb::OpNode::CombineNode) {
    const auto* sc = ins[i]->op.AsScatterRowsNode();
    const auto* cn = ins[i + 1]->op.AsCombineNode();
    const uint32_t ys = sc->out->idx();
    const bool only_y = cn->y->idx() == ys && cn->weights->idx() != ys && (!cn->shared || cn->shared->idx() != ys) &&
                        (!cn->shared_gate || cn->shared_gate->idx() != ys);
    if (only_y && private_temp(sc->out.get(), i + 1)) return Fusion{scatter_combine, 2};
    return {};
  }
  if (i + 3 > ins.size() || ins[i]->op.type != fb::OpNode::GatherQmmNode ||
      ins[i + 1]->op.type != fb::OpNode::GatherQmmNode || ins[i + 2]->op.type != fb::OpNode::GluNode)
    return {};
  const auto* a = ins[i]->op.AsGatherQmmNode();
  const auto* b = ins[i + 1]->op.AsGatherQmmNode();
  const auto* glu_node = ins[i + 2]->op.AsGluNode();
  const uint32_t ga = a->out->idx(), gb = b->out->idx(), gg = glu_node->gate->idx(), gu = glu_node->up->idx();
  const bool outs_feed_glu = (ga == gg && gb == gu) || (ga == gu && gb == gg);
  const bool plain = !a->combine_weights && !b->combine_weights && !a->shared && !b->shared;
  const bool alike = same_tid(a->x, b->x) && same_tid(a->lhs_indices, b->lhs_indices) &&
                     same_tid(a->rhs_indices, b->rhs_indices) && same_iov(a->sorted_indices, b->sorted_indices) &&
                     a->bits == b->bits && a->group_size == b->group_size && a->expert_bits == b->expert_bits;
  if (!outs_feed_glu || ga == gb || !plain || !alike || !private_temp(a->out.get(), i + 2) ||
      !private_temp(b->out.get(), i + 2))
    return {};
  if (i + 4 <= ins.size() && ins[i + 3]->op.type == fb::OpNode::GatherQmmNode && a->rhs_indices) {
    // The sorted FFN: the down projection of the Glu's output, rows by pair, same experts.
    const auto* d = ins[i + 3]->op.AsGatherQmmNode();
    const uint32_t h = glu_node->out->idx();
    auto not_h = [&](const std::unique_ptr<fb::Tid>& t) { return !t || t->idx() != h; };
    if (d->x->idx() == h && !d->lhs_indices && same_tid(d->rhs_indices, a->rhs_indices) &&
        same_iov(d->sorted_indices, a->sorted_indices) && not_h(d->combine_weights) && not_h(d->shared) &&
        not_h(d->shared_gate) && not_h(d->w) && not_h(d->scales) && not_h(d->biases) &&
        private_temp(glu_node->out.get(), i + 3))
      return Fusion{moe_ffn, 4};
  }
  return Fusion{gate_up_glu, 3};
}

Status GpuDevice::can_run(const fb::OpNodeUnion& op, const KernelContext& ctx) const {
  auto refuse = [&](const char* why) {
    return make_error(StatusCode::kUnimplemented, "device '%s' has no kernel for this %s", name_.c_str(), why);
  };
  const bool int64 = rt_->int64();
  switch (op.type) {
    case fb::OpNode::BinaryNode: {
      const auto* n = op.AsBinaryNode();
      if (needs_int_kernel_binary(ctx.declared_dtype(n->a.get())) && !int64)
        return refuse("integer Binary (the device has no 64-bit integers)");
      if (n->op == fb::BinaryOp::Div && !rt_->exact_division())
        return refuse("Div (the start-up probe found its division not correctly rounded)");
      return Status::ok();
    }
    case fb::OpNode::UnaryNode:
      return needs_int_kernel_unary(ctx.declared_dtype(op.AsUnaryNode()->x.get())) && !int64
                 ? refuse("integer Unary (the device has no 64-bit integers)")
                 : Status::ok();
    case fb::OpNode::CastNode: {
      const auto* n = op.AsCastNode();
      const bool i64 = ctx.declared_dtype(n->x.get()) == DType::kI64 || ctx.declared_dtype(n->out.get()) == DType::kI64;
      return i64 && !int64 ? refuse("Cast to or from i64 (the device has no 64-bit integers)") : Status::ok();
    }
    case fb::OpNode::ReduceNode: {
      const auto* n = op.AsReduceNode();
      if (!all_float(ctx, {n->x.get()})) return refuse("integer Reduce");
      return n->op == fb::ReduceOp::Mean && !rt_->exact_division()
                 ? refuse("Mean (the start-up probe found its division not correctly rounded)")
                 : Status::ok();
    }
    case fb::OpNode::ArgmaxNode:
      return !all_float(ctx, {op.AsArgmaxNode()->x.get()}) && !int64
                 ? refuse("integer Argmax (the device has no 64-bit integers)")
                 : Status::ok();
    default: return Status::ok();
  }
}

}  // namespace

std::unique_ptr<Device> make_gpu_device(std::unique_ptr<GpuRuntime> rt, std::string name) {
  return std::make_unique<GpuDevice>(std::move(rt), std::move(name));
}

uint64_t max_groups_x() {
  static const uint64_t v = [] {
    const char* e = std::getenv("SWITCHBOARD_GPU_MAX_GROUPS_X");
    const long long n = e ? std::atoll(e) : 0;
    return n >= 1 && n <= 65535 ? static_cast<uint64_t>(n) : uint64_t{65535};
  }();
  return v;
}

Status status_from_error_bits(uint32_t bits) {
  // A bad permutation also leaves unclaimed rows that read as bad indices: report the cause.
  if (bits & SB_ERR_PERMUTATION)
    return make_error(StatusCode::kInvalidArgument, "indices are not a permutation (found on the device)");
  // A kernel that gave up waiting for the router's indices also sees a bad index (-1).
  if (bits & SB_ERR_HANDOFF)
    return make_error(StatusCode::kInternal, "a kernel gave up waiting for the router's indices (found on the device)");
  if (bits & SB_ERR_INDEX) return make_error(StatusCode::kOutOfRange, "an index is out of range (found on the device)");
  if (bits & SB_ERR_PRUNED)
    return make_error(StatusCode::kInvalidArgument, "a pair selects an expert which is pruned (0 bits)");
  if (bits & SB_ERR_ROUTER)
    return make_error(StatusCode::kInternal, "the router found fewer selectable experts than k");
  if (bits & SB_ERR_UNSORTED)
    return make_error(StatusCode::kInvalidArgument, "sorted_indices is set but rhs_indices is not ascending");
  if (bits & SB_ERR_DIV_ZERO) return make_error(StatusCode::kInvalidArgument, "FloorDiv by zero (found on the device)");
  return Status::ok();
}

std::vector<float> probe_inputs() {
  const float sub = 1.1754944e-38f;  // FLT_MIN: products below it are subnormal
  return {
      1.0f + 0x1p-23f,
      1.0f - 0x1p-24f,
      -1.0f,  // a*b+c: fused and unfused differ
      3.0f,
      0x1.555556p-2f,
      -1.0f,  // 3 * (1/3) - 1 exposes contraction
      sub,
      0.25f,
      sub,  // subnormal product
      0x1p-130f,
      2.0f,
      0x1p-131f,  // subnormal inputs
      1.0f,
      0x1p-24f,
      1.5f,  // ties to even in add
      -20.5f,
      7.0f,
      2.5f,  // exp, rcp, round_even(2.5) = 2
      88.5f,
      1e-3f,
      -3.5f,  // exp overflow, round_even(-3.5) = -4
      -87.5f,
      4.3e37f,
      1e30f,  // exp underflow, rcp range edge
  };
}

Status check_probe(const std::string& device, const std::vector<float>& in, const float* got, bool& exact_division) {
  static const char* kWhat[] = {"a*b+c (no fusion)", "a*b", "a-c", "exp", "rcp", "round_even"};
  exact_division = true;
  for (size_t i = 0; i < in.size() / 3; ++i) {
    const float a = in[3 * i], b = in[3 * i + 1], c = in[3 * i + 2];
    const float want[6] = {a * b + c, a * b, a - c, exact::exp(a), exact::rcp(b), exact::round_even(c)};
    for (int k = 0; k < 6; ++k)
      SB_CHECK_OR_RETURN(f32_bits(got[7 * i + k]) == f32_bits(want[k]), StatusCode::kFailedPrecondition,
                         "%s: exact mode refused: the start-up probe computed %s(%a, %a, %a) = %a, the contract "
                         "says %a (rounding, contraction or denormal behaviour differs)",
                         device.c_str(), kWhat[k], a, b, c, got[7 * i + k], want[k]);
    exact_division &= f32_bits(got[7 * i + 6]) == f32_bits(a / b);
  }
  return Status::ok();
}

}  // namespace switchboard::gpu
