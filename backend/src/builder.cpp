// ProgramBuilder: slot allocation with scoped recycling, shape propagation,
// literal folding, If emission, and serialization with id coalescing.
#include "switchboard/builder.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include "log.h"
#include "op_info.h"
#include "program_impl.h"
#include "builder_state.h"

namespace switchboard {

using namespace builder_detail;

ProgramBuilder::ProgramBuilder() : s_(std::make_unique<BuilderState>()) {
  s_->chains.push_back(std::make_unique<fb::ChainT>());  // chain 0: main
}
ProgramBuilder::~ProgramBuilder() = default;

const Status& ProgramBuilder::status() const { return s_->status; }

DType ProgramBuilder::dtype(TensorRef t) const {
  return t.valid() && t.id < s_->slots.size() ? s_->slots[t.id].dtype : DType::kF32;
}
std::vector<Dim> ProgramBuilder::shape(TensorRef t) const {
  return t.valid() && t.id < s_->slots.size() ? s_->slots[t.id].shape : std::vector<Dim>{};
}

// --- declarations -----------------------------------------------------------

static bool claim_name(BuilderState& s, const std::string& name, const char* what) {
  if (name.empty()) return s.fail(std::string(what) + ": empty name");
  if (!s.io_names.insert(std::string(what) + ":" + name).second)
    return s.fail(strformat("%s '%s' declared twice", what, name.c_str()));
  return true;
}

TensorRef ProgramBuilder::input(const std::string& name, DType dtype, const std::vector<Dim>& shape) {
  if (!s_->status.is_ok() || !claim_name(*s_, name, "input")) return {};
  TensorRef t = s_->new_slot(SlotRole::kInput, dtype, shape);
  s_->slots[t.id].name = name;
  return t;
}

IntOrValue ProgramBuilder::input_value(const std::string& name) {
  if (!s_->status.is_ok() || !claim_name(*s_, name, "input")) return IntOrValue(0);
  s_->value_inputs.emplace_back(name, s_->num_values);
  return IntOrValue::value(s_->num_values++);
}

static std::vector<Dim> to_dims(const Shape& s) { return {s.begin(), s.end()}; }

TensorRef ProgramBuilder::constant(const std::string& name, DType dtype, const Shape& shape) {
  if (!s_->status.is_ok() || !claim_name(*s_, name, "constant")) return {};
  TensorRef t = s_->new_slot(SlotRole::kConstant, dtype, to_dims(shape));
  s_->slots[t.id].name = name;
  return t;
}

TensorRef ProgramBuilder::mutable_buffer(const std::string& name, DType dtype, const Shape& shape) {
  if (!s_->status.is_ok() || !claim_name(*s_, name, "mutable buffer")) return {};
  TensorRef t = s_->new_slot(SlotRole::kMutable, dtype, to_dims(shape));
  s_->slots[t.id].name = name;
  return t;
}

void ProgramBuilder::output(const std::string& name, TensorRef t) {
  if (!s_->ok(t, "output") || !claim_name(*s_, name, "output")) return;
  if (s_->slots[t.id].scope >= 0)
    s_->fail("output '" + name + "': a tmp_scope temp cannot be an output (keep() it out of the scope)");
  s_->outputs.emplace_back(name, t);
}

void ProgramBuilder::output_value(const std::string& name, IntOrValue v) {
  if (!s_->status.is_ok() || !claim_name(*s_, name, "output")) return;
  if (v.is_literal()) {
    s_->fail("output '" + name + "': a literal is not a runtime value");
    return;
  }
  s_->value_outputs.emplace_back(name, v.vid());
}

void ProgramBuilder::set_attribute(const std::string& name, int64_t value) {
  for (auto& a : s_->attributes)
    if (a.first == name) {
      a.second = value;
      return;
    }
  s_->attributes.emplace_back(name, value);
}

// --- tensor ops -------------------------------------------------------------

static TensorRef binary(BuilderState& s, TensorRef a, TensorRef b, fb::BinaryOp op, const char* name) {
  if (!s.ok(a, name) || !s.ok(b, name)) return {};
  const BSlot &sa = s.slots[a.id], &sb = s.slots[b.id];
  if (sa.dtype != sb.dtype) {
    s.fail(strformat("%s: dtypes %s and %s differ", name, dtype_name(sa.dtype), dtype_name(sb.dtype)));
    return {};
  }
  auto out = s.shape_rule(name, ops::broadcast_dims(sa.shape, sb.shape));
  if (!out) return {};
  DType dt = sa.dtype;
  TensorRef o = s.new_slot(SlotRole::kTemp, dt, *out);
  auto n = std::make_unique<fb::BinaryNodeT>();
  n->a = tid(a);
  n->b = tid(b);
  n->out = tid(o);
  n->op = op;
  s.emit(make_op(std::move(n)));
  return o;
}

TensorRef ProgramBuilder::add(TensorRef a, TensorRef b) { return binary(*s_, a, b, fb::BinaryOp::Add, "add"); }
TensorRef ProgramBuilder::sub(TensorRef a, TensorRef b) { return binary(*s_, a, b, fb::BinaryOp::Sub, "sub"); }
TensorRef ProgramBuilder::mul(TensorRef a, TensorRef b) { return binary(*s_, a, b, fb::BinaryOp::Mul, "mul"); }
TensorRef ProgramBuilder::div(TensorRef a, TensorRef b) { return binary(*s_, a, b, fb::BinaryOp::Div, "div"); }
TensorRef ProgramBuilder::maximum(TensorRef a, TensorRef b) { return binary(*s_, a, b, fb::BinaryOp::Max, "maximum"); }
TensorRef ProgramBuilder::minimum(TensorRef a, TensorRef b) { return binary(*s_, a, b, fb::BinaryOp::Min, "minimum"); }

static TensorRef unary(BuilderState& s, TensorRef x, fb::UnaryOp op, const char* name) {
  if (!s.ok(x, name)) return {};
  TensorRef o = s.new_slot(SlotRole::kTemp, s.slots[x.id].dtype, s.slots[x.id].shape);
  auto n = std::make_unique<fb::UnaryNodeT>();
  n->x = tid(x);
  n->out = tid(o);
  n->op = op;
  s.emit(make_op(std::move(n)));
  return o;
}

TensorRef ProgramBuilder::neg(TensorRef x) { return unary(*s_, x, fb::UnaryOp::Neg, "neg"); }
TensorRef ProgramBuilder::abs(TensorRef x) { return unary(*s_, x, fb::UnaryOp::Abs, "abs"); }
TensorRef ProgramBuilder::square(TensorRef x) { return unary(*s_, x, fb::UnaryOp::Square, "square"); }
TensorRef ProgramBuilder::relu(TensorRef x) { return unary(*s_, x, fb::UnaryOp::Relu, "relu"); }
TensorRef ProgramBuilder::exp(TensorRef x) { return unary(*s_, x, fb::UnaryOp::Exp, "exp"); }
TensorRef ProgramBuilder::rcp(TensorRef x) { return unary(*s_, x, fb::UnaryOp::Rcp, "rcp"); }
TensorRef ProgramBuilder::rsqrt(TensorRef x) { return unary(*s_, x, fb::UnaryOp::Rsqrt, "rsqrt"); }
TensorRef ProgramBuilder::sigmoid(TensorRef x) { return unary(*s_, x, fb::UnaryOp::Sigmoid, "sigmoid"); }
TensorRef ProgramBuilder::silu(TensorRef x) { return unary(*s_, x, fb::UnaryOp::Silu, "silu"); }
TensorRef ProgramBuilder::tanh(TensorRef x) { return unary(*s_, x, fb::UnaryOp::Tanh, "tanh"); }
TensorRef ProgramBuilder::gelu_tanh(TensorRef x) { return unary(*s_, x, fb::UnaryOp::GeluTanh, "gelu_tanh"); }
TensorRef ProgramBuilder::softplus(TensorRef x) { return unary(*s_, x, fb::UnaryOp::Softplus, "softplus"); }

TensorRef ProgramBuilder::softmax(TensorRef x) {
  if (!s_->ok(x, "softmax")) return {};
  TensorRef o = s_->new_slot(SlotRole::kTemp, s_->slots[x.id].dtype, s_->slots[x.id].shape);
  auto n = std::make_unique<fb::SoftmaxNodeT>();
  n->x = tid(x);
  n->out = tid(o);
  s_->emit(make_op(std::move(n)));
  return o;
}

TensorRef ProgramBuilder::rms_norm(TensorRef x, TensorRef weight, float eps) {
  if (!s_->ok(x, "rms_norm") || !s_->ok(weight, "rms_norm")) return {};
  TensorRef o = s_->new_slot(SlotRole::kTemp, s_->slots[x.id].dtype, s_->slots[x.id].shape);
  auto n = std::make_unique<fb::RmsNormNodeT>();
  n->x = tid(x);
  n->weight = tid(weight);
  n->out = tid(o);
  n->eps = eps;
  s_->emit(make_op(std::move(n)));
  return o;
}

ProgramBuilder::AddNorm ProgramBuilder::add_rms_norm(TensorRef x, TensorRef residual, TensorRef weight, float eps) {
  if (!s_->ok(x, "add_rms_norm") || !s_->ok(weight, "add_rms_norm")) return {};
  if (residual.valid() && !s_->ok(residual, "add_rms_norm")) return {};
  AddNorm r;
  r.sum = residual.valid() ? s_->new_slot(SlotRole::kTemp, s_->slots[x.id].dtype, s_->slots[x.id].shape) : x;
  r.out = s_->new_slot(SlotRole::kTemp, s_->slots[x.id].dtype, s_->slots[x.id].shape);
  auto n = std::make_unique<fb::RmsNormNodeT>();
  n->x = tid(x);
  n->weight = tid(weight);
  n->out = tid(r.out);
  n->eps = eps;
  n->order = fb::NormOrder::Tree32;
  if (residual.valid()) {
    n->residual = tid(residual);
    n->sum = tid(r.sum);
  }
  s_->emit(make_op(std::move(n)));
  return r;
}

TensorRef ProgramBuilder::cast(TensorRef x, DType dtype) {
  if (!s_->ok(x, "cast")) return {};
  TensorRef o = s_->new_slot(SlotRole::kTemp, dtype, s_->slots[x.id].shape);
  auto n = std::make_unique<fb::CastNodeT>();
  n->x = tid(x);
  n->out = tid(o);
  n->dtype = static_cast<fb::DType>(dtype);
  s_->emit(make_op(std::move(n)));
  return o;
}

TensorRef ProgramBuilder::reshape(TensorRef x, const std::vector<IntOrValue>& shape) {
  if (!s_->ok(x, "reshape")) return {};
  std::vector<Dim> dims;
  int64_t known = 1, infer = -1;
  bool all_static = true;
  for (const Dim& d : s_->slots[x.id].shape) all_static &= d.is_static();
  int64_t total = 1;
  for (const Dim& d : s_->slots[x.id].shape) total *= d.is_static() ? d.size : 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    const IntOrValue& v = shape[i];
    if (!v.is_literal()) {
      dims.push_back(Dim::dynamic());
      all_static = false;
    } else if (v.literal() == -1) {
      if (infer >= 0) {
        s_->fail("reshape: more than one -1");
        return {};
      }
      infer = static_cast<int64_t>(i);
      dims.push_back(Dim::dynamic());
    } else {
      dims.push_back(Dim(v.literal()));
      known *= v.literal();
    }
  }
  bool literal_shape = std::all_of(shape.begin(), shape.end(), [](const IntOrValue& v) { return v.is_literal(); });
  if (all_static && literal_shape) {
    bool fits = infer >= 0 ? (known > 0 && total % known == 0) : known == total;
    if (!fits) {
      s_->fail(strformat("reshape: %lld elements do not fit the requested shape", (long long)total));
      return {};
    }
    if (infer >= 0) dims[infer] = Dim(total / known);
  }
  TensorRef o = s_->new_slot(SlotRole::kTemp, s_->slots[x.id].dtype, dims);
  auto n = std::make_unique<fb::ReshapeNodeT>();
  n->x = tid(x);
  n->out = tid(o);
  for (const IntOrValue& v : shape) n->shape.push_back(iov(v));
  s_->emit(make_op(std::move(n)));
  return o;
}

TensorRef ProgramBuilder::slice(TensorRef x, int axis, IntOrValue start, IntOrValue stop) {
  if (!s_->ok(x, "slice") || !norm_axis(*s_, axis, s_->slots[x.id].shape.size(), "slice")) return {};
  std::vector<Dim> dims = s_->slots[x.id].shape;
  Dim d = dims[axis];
  if (d.is_static() && start.is_literal() && stop.is_literal()) {
    auto clamp = [&](int64_t v) { return std::clamp(v < 0 ? v + d.size : v, int64_t{0}, d.size); };
    int64_t a = clamp(start.literal()), b = std::max(a, clamp(stop.literal()));
    dims[axis] = Dim(b - a);
  } else {
    dims[axis] = Dim::dynamic(0, d.is_static() ? d.size : d.max);
  }
  TensorRef o = s_->new_slot(SlotRole::kTemp, s_->slots[x.id].dtype, dims);
  auto n = std::make_unique<fb::SliceNodeT>();
  n->x = tid(x);
  n->out = tid(o);
  n->axis = axis;
  n->start = iov(start);
  n->stop = iov(stop);
  s_->emit(make_op(std::move(n)));
  return o;
}

TensorRef ProgramBuilder::concat(const std::vector<TensorRef>& xs, int axis) {
  if (xs.empty()) {
    s_->fail("concat: no inputs");
    return {};
  }
  for (TensorRef x : xs)
    if (!s_->ok(x, "concat")) return {};
  if (!norm_axis(*s_, axis, s_->slots[xs[0].id].shape.size(), "concat")) return {};
  std::vector<std::vector<Dim>> shapes;
  for (TensorRef x : xs) shapes.push_back(s_->slots[x.id].shape);
  auto dims = s_->shape_rule("concat", ops::concat_out(shapes, axis));
  if (!dims) return {};
  TensorRef o = s_->new_slot(SlotRole::kTemp, s_->slots[xs[0].id].dtype, *dims);
  auto n = std::make_unique<fb::ConcatNodeT>();
  for (TensorRef x : xs) n->inputs.emplace_back(x.id);
  n->out = tid(o);
  n->axis = axis;
  s_->emit(make_op(std::move(n)));
  return o;
}

TensorRef ProgramBuilder::matmul(TensorRef a, TensorRef b, bool transpose_b, TensorRef bias) {
  if (!s_->ok(a, "matmul") || !s_->ok(b, "matmul") || (bias.valid() && !s_->ok(bias, "matmul"))) return {};
  auto dims = s_->shape_rule("matmul", ops::matmul_out(s_->slots[a.id].shape, s_->slots[b.id].shape, transpose_b));
  if (!dims) return {};
  TensorRef o = s_->new_slot(SlotRole::kTemp, s_->slots[a.id].dtype, *dims);
  auto n = std::make_unique<fb::MatmulNodeT>();
  n->a = tid(a);
  n->b = tid(b);
  if (bias.valid()) n->bias = tid(bias);
  n->out = tid(o);
  n->transpose_b = transpose_b;
  s_->emit(make_op(std::move(n)));
  return o;
}

TensorRef ProgramBuilder::batch_matmul(TensorRef a, TensorRef b, bool transpose_b) {
  if (!s_->ok(a, "batch_matmul") || !s_->ok(b, "batch_matmul")) return {};
  auto dims = s_->shape_rule("batch_matmul",
                              ops::batch_matmul_out(s_->slots[a.id].shape, s_->slots[b.id].shape, transpose_b));
  if (!dims) return {};
  TensorRef o = s_->new_slot(SlotRole::kTemp, s_->slots[a.id].dtype, *dims);
  auto n = std::make_unique<fb::BatchMatmulNodeT>();
  n->a = tid(a);
  n->b = tid(b);
  n->out = tid(o);
  n->transpose_b = transpose_b;
  s_->emit(make_op(std::move(n)));
  return o;
}

TensorRef ProgramBuilder::transpose(TensorRef x, const std::vector<int>& perm) {
  if (!s_->ok(x, "transpose")) return {};
  auto dims = s_->shape_rule("transpose",
                              ops::transpose_out(s_->slots[x.id].shape, std::vector<int32_t>(perm.begin(), perm.end())));
  if (!dims) return {};
  TensorRef o = s_->new_slot(SlotRole::kTemp, s_->slots[x.id].dtype, *dims);
  auto n = std::make_unique<fb::TransposeNodeT>();
  n->x = tid(x);
  n->out = tid(o);
  n->perm.assign(perm.begin(), perm.end());
  s_->emit(make_op(std::move(n)));
  return o;
}

static std::vector<Dim> reduced(std::vector<Dim> dims, int axis, bool keepdims) {
  if (keepdims) dims[axis] = Dim(1);
  else dims.erase(dims.begin() + axis);
  return dims;
}

static TensorRef reduce(BuilderState& s, TensorRef x, int axis, bool keepdims, fb::ReduceOp op, const char* name) {
  if (!s.ok(x, name) || !norm_axis(s, axis, s.slots[x.id].shape.size(), name)) return {};
  TensorRef o = s.new_slot(SlotRole::kTemp, s.slots[x.id].dtype, reduced(s.slots[x.id].shape, axis, keepdims));
  auto n = std::make_unique<fb::ReduceNodeT>();
  n->x = tid(x);
  n->out = tid(o);
  n->axis = axis;
  n->op = op;
  n->keepdims = keepdims;
  s.emit(make_op(std::move(n)));
  return o;
}

TensorRef ProgramBuilder::sum(TensorRef x, int axis, bool k) { return reduce(*s_, x, axis, k, fb::ReduceOp::Sum, "sum"); }
TensorRef ProgramBuilder::mean(TensorRef x, int axis, bool k) { return reduce(*s_, x, axis, k, fb::ReduceOp::Mean, "mean"); }
TensorRef ProgramBuilder::max(TensorRef x, int axis, bool k) { return reduce(*s_, x, axis, k, fb::ReduceOp::Max, "max"); }
TensorRef ProgramBuilder::min(TensorRef x, int axis, bool k) { return reduce(*s_, x, axis, k, fb::ReduceOp::Min, "min"); }

TensorRef ProgramBuilder::argmax(TensorRef x, int axis, bool keepdims) {
  if (!s_->ok(x, "argmax") || !norm_axis(*s_, axis, s_->slots[x.id].shape.size(), "argmax")) return {};
  TensorRef o = s_->new_slot(SlotRole::kTemp, DType::kI32, reduced(s_->slots[x.id].shape, axis, keepdims));
  auto n = std::make_unique<fb::ArgmaxNodeT>();
  n->x = tid(x);
  n->out = tid(o);
  n->axis = axis;
  n->keepdims = keepdims;
  s_->emit(make_op(std::move(n)));
  return o;
}

TensorRef ProgramBuilder::copy(TensorRef x) {
  if (!s_->ok(x, "copy")) return {};
  TensorRef o = s_->new_slot(SlotRole::kTemp, s_->slots[x.id].dtype, s_->slots[x.id].shape);
  emit_copy(*s_, x, o);
  return o;
}

void ProgramBuilder::assign(TensorRef dst, TensorRef src) {
  if (!s_->ok(dst, "assign") || !s_->ok(src, "assign")) return;
  SlotRole r = s_->slots[dst.id].role;
  if (r != SlotRole::kMutable && r != SlotRole::kTemp) {
    s_->fail("assign: dst must be a mutable buffer or a temp");
    return;
  }
  emit_copy(*s_, src, dst);
}

void ProgramBuilder::slice_update(TensorRef dst, TensorRef update, int axis, IntOrValue start) {
  if (!s_->ok(dst, "slice_update") || !s_->ok(update, "slice_update") ||
      !norm_axis(*s_, axis, s_->slots[dst.id].shape.size(), "slice_update"))
    return;
  SlotRole r = s_->slots[dst.id].role;
  if (r != SlotRole::kMutable && r != SlotRole::kTemp) {
    s_->fail("slice_update: dst must be a mutable buffer or a temp");
    return;
  }
  auto n = std::make_unique<fb::SliceUpdateNodeT>();
  n->dst = tid(dst);
  n->update = tid(update);
  n->axis = axis;
  n->start = iov(start);
  s_->emit(make_op(std::move(n)));
}

// --- integer helpers --------------------------------------------------------

IntOrValue ProgramBuilder::size(TensorRef x, int axis) {
  if (!s_->ok(x, "size") || !norm_axis(*s_, axis, s_->slots[x.id].shape.size(), "size")) return IntOrValue(0);
  const Dim& d = s_->slots[x.id].shape[axis];
  if (d.is_static()) return IntOrValue(d.size);
  auto n = std::make_unique<fb::SymSizeNodeT>();
  n->x = tid(x);
  n->axis = axis;
  uint32_t v = s_->num_values++;
  n->out = std::make_unique<fb::Vid>(v);
  s_->emit(make_op(std::move(n)));
  return IntOrValue::value(v);
}

static IntOrValue int_op(BuilderState& s, IntOrValue a, IntOrValue b, fb::IntOp op) {
  if (!s.status.is_ok()) return IntOrValue(0);
  if (a.is_literal() && b.is_literal()) {
    int64_t x = a.literal(), y = b.literal(), r = 0;
    bool bad = false;
    switch (op) {
      case fb::IntOp::Add: bad = __builtin_add_overflow(x, y, &r); break;
      case fb::IntOp::Sub: bad = __builtin_sub_overflow(x, y, &r); break;
      case fb::IntOp::Mul: bad = __builtin_mul_overflow(x, y, &r); break;
      case fb::IntOp::FloorDiv:
      case fb::IntOp::Mod:
        bad = y == 0 || (x == INT64_MIN && y == -1);
        if (!bad) {
          int64_t q = x / y, m = x % y;
          if (m != 0 && ((m < 0) != (y < 0))) { --q; m += y; }
          r = op == fb::IntOp::FloorDiv ? q : m;
        }
        break;
      case fb::IntOp::Max: r = std::max(x, y); break;
      case fb::IntOp::Min: r = std::min(x, y); break;
    }
    if (bad) s.fail(strformat("integer op on literals %lld, %lld overflows or divides by zero", (long long)x, (long long)y));
    return IntOrValue(r);
  }
  // Identities keep static programs free of runtime scalar ops.
  if (b.is_literal() && ((b.literal() == 0 && (op == fb::IntOp::Add || op == fb::IntOp::Sub)) ||
                         (b.literal() == 1 && (op == fb::IntOp::Mul || op == fb::IntOp::FloorDiv))))
    return a;
  if (a.is_literal() && ((a.literal() == 0 && op == fb::IntOp::Add) || (a.literal() == 1 && op == fb::IntOp::Mul)))
    return b;
  auto n = std::make_unique<fb::IntArithNodeT>();
  n->a = iov(a);
  n->b = iov(b);
  n->op = op;
  uint32_t v = s.num_values++;
  n->out = std::make_unique<fb::Vid>(v);
  s.emit(make_op(std::move(n)));
  return IntOrValue::value(v);
}

IntOrValue ProgramBuilder::add_int(IntOrValue a, IntOrValue b) { return int_op(*s_, a, b, fb::IntOp::Add); }
IntOrValue ProgramBuilder::sub_int(IntOrValue a, IntOrValue b) { return int_op(*s_, a, b, fb::IntOp::Sub); }
IntOrValue ProgramBuilder::mul_int(IntOrValue a, IntOrValue b) { return int_op(*s_, a, b, fb::IntOp::Mul); }
IntOrValue ProgramBuilder::floordiv_int(IntOrValue a, IntOrValue b) { return int_op(*s_, a, b, fb::IntOp::FloorDiv); }
IntOrValue ProgramBuilder::max_int(IntOrValue a, IntOrValue b) { return int_op(*s_, a, b, fb::IntOp::Max); }

IntOrValue ProgramBuilder::product(const std::vector<IntOrValue>& xs) {
  int64_t lit = 1;
  std::vector<IntOrValue> dyn;
  for (const IntOrValue& x : xs) {
    if (x.is_literal()) {
      if (__builtin_mul_overflow(lit, x.literal(), &lit)) s_->fail("product: literal overflow");
    } else {
      dyn.push_back(x);
    }
  }
  IntOrValue acc(lit);
  for (const IntOrValue& d : dyn) acc = mul_int(acc, d);  // folds the leading 1
  return acc;
}

// --- control flow -----------------------------------------------------------

std::vector<TensorRef> ProgramBuilder::emit_if_else(IntOrValue cond, const Branch& then_branch,
                                                    const Branch& else_branch) {
  BuilderState& s = *s_;
  if (!s.status.is_ok()) return {};
  if (cond.is_literal()) return cond.literal() != 0 ? then_branch() : else_branch();

  auto run_branch = [&](const Branch& fn, int* chain) {
    *chain = static_cast<int>(s.chains.size());
    s.chains.push_back(std::make_unique<fb::ChainT>());
    int saved = s.current;
    s.current = *chain;
    std::vector<TensorRef> r = fn();
    s.current = saved;
    return r;
  };
  int then_chain, else_chain;
  std::vector<TensorRef> rt = run_branch(then_branch, &then_chain);
  std::vector<TensorRef> re = run_branch(else_branch, &else_chain);
  if (!s.status.is_ok()) return {};
  if (rt.size() != re.size()) {
    s.fail(strformat("emit_if_else: then returns %zu tensors, else %zu", rt.size(), re.size()));
    return {};
  }
  std::vector<TensorRef> outs;
  std::set<uint32_t> used;
  // A branch result can be the shared slot only if that branch wrote it and it is a temp.
  auto own = [&](TensorRef t, int chain) {
    const BSlot& b = s.slots[t.id];
    return b.role == SlotRole::kTemp && b.writer_chain == chain && b.alias == kNone && !used.count(t.id);
  };
  for (size_t i = 0; i < rt.size(); ++i) {
    if (!s.ok(rt[i], "emit_if_else") || !s.ok(re[i], "emit_if_else")) return {};
    const BSlot &a = s.slots[rt[i].id], &b = s.slots[re[i].id];
    if (a.dtype != b.dtype || a.shape.size() != b.shape.size()) {
      s.fail(strformat("emit_if_else: result %zu differs in dtype or rank between branches", i));
      return {};
    }
    TensorRef out = rt[i];
    if (!own(out, then_chain)) {
      out = s.new_slot(SlotRole::kTemp, a.dtype, a.shape);
      int saved = s.current;
      s.current = then_chain;
      emit_copy(s, rt[i], out);
      s.current = saved;
    }
    used.insert(out.id);
    std::vector<Dim> merged;
    for (size_t k = 0; k < a.shape.size(); ++k) merged.push_back(ops::bounds_union(s.slots[out.id].shape[k], b.shape[k]));
    s.slots[out.id].shape = merged;
    if (s.slots[out.id].temp_id >= 0) s.temp_shapes[static_cast<size_t>(s.slots[out.id].temp_id)] = merged;
    if (own(re[i], else_chain) && s.slots[re[i].id].scope == s.slots[out.id].scope) {
      // Retarget: the else result now lives in the shared slot.
      BSlot& e = s.slots[re[i].id];
      s.free_temps[{static_cast<int>(e.dtype), e.shape.size()}].push_back(e.temp_id);
      e.alias = out.id;
      used.insert(re[i].id);
    } else {
      int saved = s.current;
      s.current = else_chain;
      emit_copy(s, re[i], out);
      s.current = saved;
    }
    outs.push_back(out);
  }
  auto n = std::make_unique<fb::IfNodeT>();
  n->cond = iov(cond);
  n->then_chain = static_cast<uint32_t>(then_chain);
  n->else_chain = static_cast<uint32_t>(else_chain);
  for (TensorRef o : outs) n->outputs.emplace_back(o.id);
  s.emit(make_op(std::move(n)));
  return outs;
}

void ProgramBuilder::emit_init(const std::function<void()>& fn) {
  BuilderState& s = *s_;
  if (!s.status.is_ok()) return;
  if (s.current != 0) {
    s.fail("emit_init: must be called from the main chain, not inside a branch");
    return;
  }
  if (s.init_chain < 0) {
    s.init_chain = static_cast<int>(s.chains.size());
    s.chains.push_back(std::make_unique<fb::ChainT>());
  }
  s.current = s.init_chain;
  fn();
  s.current = 0;
}

// --- tmp scopes -------------------------------------------------------------

ProgramBuilder::TmpScope ProgramBuilder::tmp_scope() {
  s_->scopes.emplace_back();
  return TmpScope(this, s_->scopes.size() - 1);
}

ProgramBuilder::TmpScope::~TmpScope() {
  if (!b_) return;
  BuilderState& s = *b_->s_;
  if (s.scopes.size() != level_ + 1) {
    s.fail("tmp_scope: scopes closed out of order");
    s.scopes.resize(level_);
    return;
  }
  for (uint32_t id : s.scopes.back()) s.release(id);
  s.scopes.pop_back();
}

TensorRef ProgramBuilder::TmpScope::keep(TensorRef t) {
  BuilderState& s = *b_->s_;
  if (!s.ok(t, "keep")) return {};
  BSlot& slot = s.slots[t.id];
  if (slot.scope != static_cast<int64_t>(level_)) return t;  // not owned here: nothing to hand over
  auto& mine = s.scopes[level_];
  mine.erase(std::remove(mine.begin(), mine.end(), t.id), mine.end());
  if (level_ == 0) {
    slot.scope = -1;
  } else {
    slot.scope = static_cast<int64_t>(level_) - 1;
    s.scopes[level_ - 1].push_back(t.id);
  }
  return t;
}

// --- serialization ----------------------------------------------------------

Result<std::vector<uint8_t>> ProgramBuilder::serialize() const {
  const BuilderState& s = *s_;
  SB_RETURN_IF_ERROR(s.status);
  auto p = std::make_unique<fb::ProgramT>();
  p->version = kSchemaVersion;
  p->init_chain = s.init_chain;
  for (const auto& c : s.chains) p->chains.push_back(std::make_unique<fb::ChainT>(*c));

  // Which builder slots are referenced, after resolving If aliases.
  std::vector<uint8_t> used(s.slots.size(), 0), vused(s.num_values, 0);
  for (auto& c : p->chains)
    for (auto& ins : c->instructions)
      for_each_slot(ins->op, [&](const SlotRef& r) {
        if (r.is_tensor) *r.idx = s.resolve(*r.idx), used[*r.idx] = 1;
        else vused[*r.idx] = 1;
      });
  for (size_t i = 0; i < s.slots.size(); ++i)
    if (s.slots[i].role == SlotRole::kInput || s.slots[i].role == SlotRole::kMutable) used[i] = 1;
  for (const auto& o : s.outputs) used[s.resolve(o.second.id)] = 1;
  for (const auto& v : s.value_inputs) vused[v.second] = 1;
  for (const auto& v : s.value_outputs) vused[v.second] = 1;

  // Global ids: constants, inputs, mutable buffers, then temps (one per physical temp id).
  std::vector<uint32_t> map(s.slots.size(), kNone);
  std::map<int64_t, uint32_t> temp_map;
  uint32_t next = 0;
  for (SlotRole role : {SlotRole::kConstant, SlotRole::kInput, SlotRole::kMutable})
    for (size_t i = 0; i < s.slots.size(); ++i)
      if (used[i] && s.slots[i].role == role) map[i] = next++;
  for (size_t i = 0; i < s.slots.size(); ++i) {
    if (!used[i] || s.slots[i].role != SlotRole::kTemp) continue;
    auto [it, fresh] = temp_map.try_emplace(s.slots[i].temp_id, next);
    if (fresh) ++next;
    map[i] = it->second;
  }
  std::vector<uint32_t> vmap(s.num_values, kNone);
  uint32_t vnext = 0;
  for (uint32_t v = 0; v < s.num_values; ++v)
    if (vused[v]) vmap[v] = vnext++;

  // Metadata: slots sharing a physical id merge their shapes.
  std::vector<std::vector<Dim>> shapes(next);
  std::vector<DType> dtypes(next);
  std::vector<uint8_t> seen(next, 0);
  for (size_t i = 0; i < s.slots.size(); ++i) {
    if (map[i] == kNone) continue;
    uint32_t g = map[i];
    if (!seen[g]) {
      shapes[g] = s.slots[i].shape;
      dtypes[g] = s.slots[i].dtype;
      seen[g] = 1;
    } else {
      for (size_t k = 0; k < shapes[g].size(); ++k) shapes[g][k] = ops::bounds_union(shapes[g][k], s.slots[i].shape[k]);
    }
  }
  p->num_tensor_slots = next;
  p->num_value_slots = vnext;
  for (uint32_t g = 0; g < next; ++g) p->tensor_meta.push_back(to_meta(dtypes[g], shapes[g]));

  for (auto& c : p->chains)
    for (auto& ins : c->instructions)
      for_each_slot(ins->op, [&](const SlotRef& r) { *r.idx = r.is_tensor ? map[*r.idx] : vmap[*r.idx]; });

  for (size_t i = 0; i < s.slots.size(); ++i) {
    if (map[i] == kNone) continue;
    const BSlot& b = s.slots[i];
    if (b.role == SlotRole::kConstant || b.role == SlotRole::kMutable) {
      auto nt = std::make_unique<fb::NamedTensorT>();
      nt->name = b.name;
      nt->tid = std::make_unique<fb::Tid>(map[i]);
      (b.role == SlotRole::kConstant ? p->constants : p->mutable_buffers).push_back(std::move(nt));
    } else if (b.role == SlotRole::kInput) {
      auto io = std::make_unique<fb::IoSlotT>();
      io->name = b.name;
      io->kind = fb::SlotKind::Tensor;
      io->idx = map[i];
      p->inputs.push_back(std::move(io));
    }
  }
  for (const auto& [name, v] : s.value_inputs) {
    auto io = std::make_unique<fb::IoSlotT>();
    io->name = name;
    io->kind = fb::SlotKind::Value;
    io->idx = vmap[v];
    p->inputs.push_back(std::move(io));
  }
  for (const auto& [name, t] : s.outputs) {
    auto io = std::make_unique<fb::IoSlotT>();
    io->name = name;
    io->kind = fb::SlotKind::Tensor;
    io->idx = map[s.resolve(t.id)];
    p->outputs.push_back(std::move(io));
  }
  for (const auto& [name, v] : s.value_outputs) {
    auto io = std::make_unique<fb::IoSlotT>();
    io->name = name;
    io->kind = fb::SlotKind::Value;
    io->idx = vmap[v];
    p->outputs.push_back(std::move(io));
  }
  for (const auto& [name, value] : s.attributes) {
    auto a = std::make_unique<fb::AttributeT>();
    a->name = name;
    a->value = value;
    p->attributes.push_back(std::move(a));
  }
  Status st = validate_program(*p);
  if (!st.is_ok()) return Status(StatusCode::kInternal, "builder produced an invalid program: " + st.message());
  log::debug("builder: {} builder slots -> {} tensor slots, {} value slots, {} chains", s.slots.size(), next, vnext,
             p->chains.size());
  return serialize_program(*p);
}

Status ProgramBuilder::save(const std::string& path, const std::string& weights_path) const {
  SB_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, serialize());
  if (!weights_path.empty()) {
    SB_ASSIGN_OR_RETURN(WeightsStamp w, weights_stamp(weights_path));
    stamp_weights(bytes, w);
  }
  std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  SB_CHECK_OR_RETURN(f != nullptr, StatusCode::kIoError, "%s: cannot create", tmp.c_str());
  bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return make_error(StatusCode::kIoError, "%s: write failed", path.c_str());
  }
  return Status::ok();
}

}  // namespace switchboard
