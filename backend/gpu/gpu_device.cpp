// The GPU device (Vulkan and Metal alike): the kernel registry the op families fill
// (backend/gpu/<family>.cpp), the fusions it plans, the ops and dtypes it refuses at plan
// time, and sync(). Data-dependent checks (indices, permutations) run on the device and
// surface at sync() as errors.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include "env.h"
#include "gpu_gather_qmm.h"
#include "gpu_ops.h"
#include "op_info.h"

namespace switchboard::gpu {
namespace {

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
  bool wants_flush() const override { return rt_->wants_flush(); }
  void op_boundary() override { rt_->op_boundary(); }
  double last_device_us() const override { return rt_->execution_gpu_us(); }
  double last_record_us() const override { return rt_->execution_record_us(); }
  void begin_execution() override { rt_->begin_execution(); }
  uint64_t dispatches() const override { return rt_->dispatches(); }
  long queued_refs(const Tensor& t) const override { return rt_->queued_refs(t); }
  // The heap's size, not what is free in it: a claim past it can never be met.
  uint64_t available_memory() const override { return rt_->memory_bytes(); }
  Result<DeviceFloor> measure_floor(uint64_t bytes) override {
    SB_ASSIGN_OR_RETURN(ReadFloor f, measure_read_floor(*rt_, bytes));
    return DeviceFloor{f.gbps, f.empty_us, f.read_us};
  }
  bool begin_recording() override { return rt_->begin_recording(); }
  std::unique_ptr<RecordedWork> end_recording() override { return rt_->end_recording(); }
  Status replay(const RecordedWork& w) override { return rt_->replay(w); }
  Status set_dynamic_values(const std::vector<uint32_t>& words) override {
    SB_RETURN_IF_ERROR(dynamic_values(words.size()).status());
    std::memcpy(dyn_.mutable_data(), words.data(), words.size() * 4);
    return Status::ok();
  }
  Result<Tensor> stage_input(const Tensor& t) override {
    SB_ASSIGN_OR_RETURN(Tensor dev, rt_->alloc_host_written(t.dtype(), t.shape()));
    if (t.nbytes()) std::memcpy(dev.mutable_data(), t.data(), t.nbytes());
    return dev;
  }
  // Zeroed on the device by the queued work (a reset's KV caches and states: no host zeros
  // copied through the mapping before each prompt).
  Result<Tensor> zeros(DType dtype, const Shape& shape) override {
    SB_ASSIGN_OR_RETURN(Tensor t, rt_->alloc(dtype, shape));
    SB_RETURN_IF_ERROR(zero_in_place(t));
    return t;
  }
  Status zero_in_place(const Tensor& t) override {
    // Only where kernels bind t itself (not a copy bind() would make of it).
    SB_ASSIGN_OR_RETURN(Tensor dev, rt_->device_tensor(t));
    if (dev.data() != t.data())
      return make_error(StatusCode::kUnimplemented, "a buffer outside this device's memory is not zeroed in place");
    SB_ASSIGN_OR_RETURN(uint32_t words,
                        u32_count(static_cast<int64_t>(words_of(t.dtype(), t.numel())), "a mutable buffer"));
    if (words == 0) return Status::ok();
    SB_ASSIGN_OR_RETURN(BufferRef b, rt_->bind(t, false));
    k::FillArgs args{words, 0, 0, 0};
    return rt_->dispatch("fill", {b}, &args, sizeof(args), words);
  }
  // The dynamic-value words' binding, holding at least `words` (zeros until written). Grown
  // only before an execution, when no queued or recorded work reads them yet.
  Result<BufferRef> dynamic_values(size_t words = 1) {
    if (!dyn_.defined() || static_cast<size_t>(dyn_.numel()) < words) {
      SB_ASSIGN_OR_RETURN(dyn_,
                          rt_->alloc_host_written(DType::kU32, {static_cast<int64_t>(std::max<size_t>(words, 1))}));
      std::memset(dyn_.mutable_data(), 0, dyn_.nbytes());
      SB_ASSIGN_OR_RETURN(dyn_ref_, rt_->bind(dyn_, false));
    }
    return dyn_ref_;
  }
  Runtime& rt() { return *rt_; }
  // The hand-off record of the submission being recorded: cleared whenever one finished,
  // also by the runtime's own syncs, so a record never outlives the buffers it names.
  MoeHandoff& handoff() {
    fresh_handoffs();
    return handoff_;
  }
  RowHandoff& row_handoff() {
    fresh_handoffs();
    return row_handoff_;
  }
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
  Tensor dyn_;  // the dynamic-value words (set_dynamic_values)
  BufferRef dyn_ref_;
  void fresh_handoffs() {
    if (handoff_submission_ == rt_->submissions()) return;
    handoff_ = {};
    row_handoff_ = {};
    handoff_submission_ = rt_->submissions();
  }
  MoeHandoff handoff_;
  RowHandoff row_handoff_;
  uint64_t handoff_submission_ = 0;
  std::unique_ptr<Runtime> rt_;
  std::string name_;
  KernelRegistry registry_;
};

bool same_tid(const std::unique_ptr<fb::Tid>& a, const std::unique_ptr<fb::Tid>& b) {
  return a ? b && a->idx() == b->idx() : !b;
}

bool same_iov(const std::unique_ptr<fb::IntOrVidT>& a, const std::unique_ptr<fb::IntOrVidT>& b) {
  if (!a || !b) return !a && !b;
  if (a->is_vid != b->is_vid) return false;
  return a->is_vid ? a->vid && b->vid && a->vid->idx() == b->vid->idx() : a->literal == b->literal;
}

bool all_float(const KernelContext& ctx, std::initializer_list<const fb::Tid*> tids) {
  for (const fb::Tid* t : tids)
    if (t && !dtype_is_float(ctx.declared_dtype(t))) return false;
  return true;
}

GpuDevice::GpuDevice(std::unique_ptr<Runtime> rt, std::string name) : rt_(std::move(rt)), name_(std::move(name)) {
  register_elementwise(registry_);
  register_cast(registry_);
  register_shape_ops(registry_);
  register_glu(registry_);
  register_combine(registry_);
  register_permute(registry_);
  register_router(registry_);
  register_gather_qmm(registry_);
  register_gather_mm(registry_);
  register_matmul(registry_);
  register_norm(registry_);
  register_attention(registry_);
  register_rope(registry_);
  register_linear_attention(registry_);
  register_reduce(registry_);
}

// RmsNorm (order Tree32, no gate) and a GatherQmm without indices that reads the norm's output
// only as x — unless that GatherQmm starts a gate/up fusion. (Into the router's Matmul, whose
// 32-lane workgroups would each normalize the row, it was slower: bench/RESULTS.md.)
Fusion norm_qmm_fusion(const std::vector<std::unique_ptr<fb::InstructionT>>& ins, size_t i,
                       const PrivateTemp& private_temp, const Fusion& next) {
  const auto* nn = ins[i]->op.AsRmsNormNode();
  const auto* q = ins[i + 1]->op.AsGatherQmmNode();
  if (nn->order != fb::NormOrder::Tree32 || nn->gate || next.fn || !q) return {};
  const uint32_t h = nn->out->idx();
  auto not_h = [&](const std::unique_ptr<fb::Tid>& t) { return !t || t->idx() != h; };
  if (q->x->idx() != h || q->lhs_indices || q->rhs_indices || q->combine_weights || !not_h(q->w) || !not_h(q->scales) ||
      !not_h(q->biases))
    return {};
  return Fusion{private_temp(nn->out.get(), i + 1) ? norm_qmm_private : norm_qmm, 2};
}

// Whether an instruction of the chain from ins[from] on reads slot `h` other than the experts'
// GatherQmm by router indices (the one reader that waits for norm_matmul_router's GEMV), an If
// (the experts' branches) or a SymSize (its shape): a shared expert's projections would each take
// a barrier behind the router instead. Up to the slot's next write: later layers reuse slots.
bool read_unrouted(const std::vector<std::unique_ptr<fb::InstructionT>>& ins, size_t from, uint32_t h) {
  bool read = false, written = false;
  for (size_t j = from; j < ins.size() && !read && !written; ++j) {
    const auto* q = ins[j]->op.AsGatherQmmNode();
    const fb::OpNode t = ins[j]->op.type;
    const bool skip = t == fb::OpNode::IfNode || t == fb::OpNode::SymSizeNode || (q && q->rhs_indices);
    for_each_slot(ins[j]->op, [&](const SlotRef& r) {
      if (!r.is_tensor || !r.idx || *r.idx != h) return;
      if (r.is_write) written = true;
      else read |= !skip;
    });
  }
  return read;
}

// The sorted MoE's pairs (builder_moe.cpp): Argsort of flat indices F, GatherRows of F by the
// order, Full of one i32 k >= 1 that only the FloorDiv reads, FloorDiv of the order by it.
Fusion moe_order_fusion(const std::vector<std::unique_ptr<fb::InstructionT>>& ins, size_t i,
                        const PrivateTemp& private_temp) {
  const auto* as = ins[i]->op.AsArgsortNode();
  const auto* gr = ins[i + 1]->op.AsGatherRowsNode();
  const auto* fl = ins[i + 2]->op.AsFullNode();
  const auto* bn = ins[i + 3]->op.AsBinaryNode();
  if (!gr || !fl || !bn) return {};
  const uint32_t order = as->out->idx();
  const bool one = fl->shape.size() == 1 && fl->shape[0] && !fl->shape[0]->is_vid && fl->shape[0]->literal == 1;
  const bool k_ok = fl->dtype == fb::DType::I32 && fl->value >= 1.0 && fl->value < 2147483648.0;
  if (gr->x->idx() != as->x->idx() || gr->indices->idx() != order || bn->op != fb::BinaryOp::FloorDiv ||
      bn->a->idx() != order || bn->b->idx() != fl->out->idx() || !one || !k_ok || !private_temp(fl->out.get(), i + 3))
    return {};
  return Fusion{moe_order, 4};
}

// Decode's gate and up projections with their Glu: GatherQmm, GatherQmm (either order),
// Glu of their two outputs, which nothing after the Glu reads. Same x, indices and widths.
Fusion GpuDevice::fuse(const std::vector<std::unique_ptr<fb::InstructionT>>& ins, size_t i,
                       const PrivateTemp& private_temp) const {
  if (i + 3 <= ins.size() && ins[i]->op.type == fb::OpNode::RmsNormNode) {
    // The router's norm, its logits' Matmul (of the norm's output) and the Router.
    const auto* nn = ins[i]->op.AsRmsNormNode();
    const auto* mm = ins[i + 1]->op.AsMatmulNode();
    const auto* rn = ins[i + 2]->op.AsRouterNode();
    if (mm && rn && nn->order == fb::NormOrder::Tree32 && !nn->gate && mm->a->idx() == nn->out->idx() &&
        mm->b->idx() != nn->out->idx() && (!mm->bias || mm->bias->idx() != nn->out->idx()) &&
        rn->logits->idx() == mm->out->idx() && !read_unrouted(ins, i + 3, nn->out->idx()))
      return Fusion{norm_matmul_router, 3};
  }
  if (i + 2 <= ins.size() && ins[i]->op.type == fb::OpNode::RmsNormNode)
    return norm_qmm_fusion(ins, i, private_temp, fuse(ins, i + 1, private_temp));
  if (i + 2 <= ins.size() && ins[i]->op.type == fb::OpNode::RopeNode &&
      ins[i + 1]->op.type == fb::OpNode::AttentionNode) {
    // Rope's q/k/v form and the Blocked32 Attention of its queries over its caches, at its position.
    const auto* rn = ins[i]->op.AsRopeNode();
    const auto* an = ins[i + 1]->op.AsAttentionNode();
    const bool over_rope = rn->k_heads > 0 && rn->cache && rn->v_cache && an->q->idx() == rn->out->idx() &&
                           an->k_cache->idx() == rn->cache->idx() && an->v_cache->idx() == rn->v_cache->idx() &&
                           same_iov(rn->pos, an->pos) && an->order == fb::AttentionOrder::Blocked32 && an->seq_major;
    return over_rope && private_temp(rn->out.get(), i + 1) ? Fusion{rope_attention, 2} : Fusion{};
  }
  if (i + 2 <= ins.size() && ins[i]->op.type == fb::OpNode::MatmulNode &&
      ins[i + 1]->op.type == fb::OpNode::RouterNode &&
      ins[i + 1]->op.AsRouterNode()->logits->idx() == ins[i]->op.AsMatmulNode()->out->idx())
    return Fusion{matmul_router, 2};
  if (i + 4 <= ins.size() && ins[i]->op.type == fb::OpNode::ArgsortNode)
    return moe_order_fusion(ins, i, private_temp);
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
    // The kernels' register arrays (linear_attention.comp): refused when the session opens, not
    // half way through a step whose earlier layers already advanced their states.
    case fb::OpNode::CausalConv1dNode:
      return ctx.declared_dim(op.AsCausalConv1dNode()->weight.get(), 1) > 8
                 ? refuse("CausalConv1d wider than 8 taps (the kernel's register window)")
                 : Status::ok();
    case fb::OpNode::GatedDeltaRuleNode: {
      const auto* n = op.AsGatedDeltaRuleNode();
      if (ctx.declared_dim(n->state.get(), 1) > 128) return refuse("GatedDeltaRule with key heads over 128");
      return ctx.declared_dtype(n->a_log.get()) != ctx.declared_dtype(n->dt_bias.get())
                 ? refuse("GatedDeltaRule with a_log and dt_bias of different dtypes")
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

Runtime& rt_of(KernelContext& ctx) { return static_cast<GpuDevice&>(ctx.device()).rt(); }

MoeHandoff& moe_handoff(KernelContext& ctx) { return static_cast<GpuDevice&>(ctx.device()).handoff(); }

RowHandoff& row_handoff(KernelContext& ctx) { return static_cast<GpuDevice&>(ctx.device()).row_handoff(); }

const RowHandoff* handed_to(KernelContext& ctx, const BufferRef& b) {
  const RowHandoff& h = row_handoff(ctx);
  const Runtime& rt = rt_of(ctx);
  return rt.cross_dispatch_handoff() && h.count && h.at == rt.dispatches() && same_ref(b, h.out) ? &h : nullptr;
}

Result<BufferRef> node_table(KernelContext& ctx, const void* node, const std::vector<uint32_t>& words) {
  return static_cast<GpuDevice&>(ctx.device()).node_table(node, words);
}

Result<BufferRef> dynamic_words(KernelContext& ctx) { return static_cast<GpuDevice&>(ctx.device()).dynamic_values(); }

Result<DynamicArg> dynamic_arg(KernelContext& ctx, const fb::IntOrVidT* v) {
  SB_ASSIGN_OR_RETURN(KernelContext::DynamicValue d, ctx.resolve_dynamic(v));
  SB_ASSIGN_OR_RETURN(BufferRef words, dynamic_words(ctx));
  return DynamicArg{d.value, d.word, words};
}

Result<InPlace> inplace_on_device(KernelContext& ctx, const fb::Tid* tid) {
  InPlace b;
  SB_ASSIGN_OR_RETURN(b.host, ctx.inplace(tid));
  SB_ASSIGN_OR_RETURN(b.dev, rt_of(ctx).device_tensor(b.host));
  return b;
}

Status keep_on_device(KernelContext& ctx, const fb::Tid* tid, InPlace& b) {
  return b.dev.data() != b.host.data() ? ctx.out(tid, std::move(b.dev)) : Status::ok();
}

Result<BufferRef> bind_in(KernelContext& ctx, const fb::Tid* tid, Tensor* keep) {
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

uint64_t int_invocations(DType t, int64_t n) {
  return dtype_size(t) == 1 ? (static_cast<uint64_t>(n) + 3) / 4 : static_cast<uint64_t>(n);
}

bool needs_int_kernel_binary(DType t) { return !dtype_is_float(t) && t != DType::kI32; }
bool needs_int_kernel_unary(DType t) { return !dtype_is_float(t) && t != DType::kI32 && t != DType::kU32; }

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

std::unique_ptr<Device> make_gpu_device(std::unique_ptr<GpuRuntime> rt, std::string name) {
  return std::make_unique<GpuDevice>(std::move(rt), std::move(name));
}

uint64_t max_groups_x() { return env_defaults().gpu_max_groups_x; }

Status status_from_error_bits(uint32_t bits) {
  // A bad permutation also leaves unclaimed rows that read as bad indices: report the cause.
  if (bits & SB_ERR_PERMUTATION)
    return make_error(StatusCode::kInvalidArgument, "indices are not a permutation (found on the device)");
  // A kernel that gave up waiting for the router's indices also sees a bad index (-1).
  if (bits & SB_ERR_HANDOFF)
    return make_error(StatusCode::kInternal,
                      "a kernel gave up waiting for a value the dispatch before it writes (the router's indices or "
                      "logits, an expert's rows; found on the device)");
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

}  // namespace switchboard::gpu
