#include "op_info.h"

namespace switchboard {

static_assert(fb::OpNode::MAX == fb::OpNode::TransposeNode,
              "a new op was added to schema/program.fbs: list its name and slots in op_info.cpp");

const char* op_name(fb::OpNode type) {
  switch (type) {
    case fb::OpNode::BinaryNode: return "Binary";
    case fb::OpNode::UnaryNode: return "Unary";
    case fb::OpNode::CastNode: return "Cast";
    case fb::OpNode::ReshapeNode: return "Reshape";
    case fb::OpNode::SliceNode: return "Slice";
    case fb::OpNode::ConcatNode: return "Concat";
    case fb::OpNode::MatmulNode: return "Matmul";
    case fb::OpNode::ReduceNode: return "Reduce";
    case fb::OpNode::ArgmaxNode: return "Argmax";
    case fb::OpNode::CopyNode: return "Copy";
    case fb::OpNode::SliceUpdateNode: return "SliceUpdate";
    case fb::OpNode::SymSizeNode: return "SymSize";
    case fb::OpNode::IntArithNode: return "IntArith";
    case fb::OpNode::IfNode: return "If";
    case fb::OpNode::GatherQmmNode: return "GatherQmm";
    case fb::OpNode::GatherMmNode: return "GatherMm";
    case fb::OpNode::RouterNode: return "Router";
    case fb::OpNode::ArgsortNode: return "Argsort";
    case fb::OpNode::GatherRowsNode: return "GatherRows";
    case fb::OpNode::ScatterRowsNode: return "ScatterRows";
    case fb::OpNode::GluNode: return "Glu";
    case fb::OpNode::CombineNode: return "Combine";
    case fb::OpNode::FullNode: return "Full";
    case fb::OpNode::SoftmaxNode: return "Softmax";
    case fb::OpNode::RmsNormNode: return "RmsNorm";
    case fb::OpNode::BatchMatmulNode: return "BatchMatmul";
    case fb::OpNode::TransposeNode: return "Transpose";
    case fb::OpNode::NONE: break;
  }
  return "?";
}

namespace {

using Fn = std::function<void(const SlotRef&)>;

// A required or optional tensor slot held as a table field.
void tensor(const Fn& fn, const char* field, std::unique_ptr<fb::Tid>& t, bool write, bool optional = false) {
  if (!t && optional) return;
  fn(SlotRef{true, write, field, -1, t ? reinterpret_cast<uint32_t*>(t.get()) : nullptr});
}

void value_out(const Fn& fn, const char* field, std::unique_ptr<fb::Vid>& v) {
  fn(SlotRef{false, true, field, -1, v ? reinterpret_cast<uint32_t*>(v.get()) : nullptr});
}

// An IntOrVid reads a value slot only when it is not a literal.
void int_or_vid(const Fn& fn, const char* field, int element, std::unique_ptr<fb::IntOrVidT>& v) {
  if (!v || !v->is_vid) return;
  fn(SlotRef{false, false, field, element, v->vid ? reinterpret_cast<uint32_t*>(v->vid.get()) : nullptr});
}

void tensor_list(const Fn& fn, const char* field, std::vector<fb::Tid>& ts, bool write) {
  for (size_t i = 0; i < ts.size(); ++i)
    fn(SlotRef{true, write, field, static_cast<int>(i), reinterpret_cast<uint32_t*>(&ts[i])});
}

}  // namespace

static_assert(sizeof(fb::Tid) == sizeof(uint32_t) && sizeof(fb::Vid) == sizeof(uint32_t),
              "slot ids are patched in place through a uint32_t pointer");

void for_each_slot(fb::OpNodeUnion& op, const Fn& fn) {
  switch (op.type) {
    case fb::OpNode::BinaryNode: {
      auto* n = op.AsBinaryNode();
      tensor(fn, "a", n->a, false);
      tensor(fn, "b", n->b, false);
      tensor(fn, "out", n->out, true);
      break;
    }
    case fb::OpNode::UnaryNode: {
      auto* n = op.AsUnaryNode();
      tensor(fn, "x", n->x, false);
      tensor(fn, "out", n->out, true);
      break;
    }
    case fb::OpNode::CastNode: {
      auto* n = op.AsCastNode();
      tensor(fn, "x", n->x, false);
      tensor(fn, "out", n->out, true);
      break;
    }
    case fb::OpNode::ReshapeNode: {
      auto* n = op.AsReshapeNode();
      tensor(fn, "x", n->x, false);
      for (size_t i = 0; i < n->shape.size(); ++i) int_or_vid(fn, "shape", static_cast<int>(i), n->shape[i]);
      tensor(fn, "out", n->out, true);
      break;
    }
    case fb::OpNode::SliceNode: {
      auto* n = op.AsSliceNode();
      tensor(fn, "x", n->x, false);
      int_or_vid(fn, "start", -1, n->start);
      int_or_vid(fn, "stop", -1, n->stop);
      tensor(fn, "out", n->out, true);
      break;
    }
    case fb::OpNode::ConcatNode: {
      auto* n = op.AsConcatNode();
      tensor_list(fn, "inputs", n->inputs, false);
      tensor(fn, "out", n->out, true);
      break;
    }
    case fb::OpNode::MatmulNode: {
      auto* n = op.AsMatmulNode();
      tensor(fn, "a", n->a, false);
      tensor(fn, "b", n->b, false);
      tensor(fn, "bias", n->bias, false, /*optional=*/true);
      tensor(fn, "out", n->out, true);
      break;
    }
    case fb::OpNode::ReduceNode: {
      auto* n = op.AsReduceNode();
      tensor(fn, "x", n->x, false);
      tensor(fn, "out", n->out, true);
      break;
    }
    case fb::OpNode::ArgmaxNode: {
      auto* n = op.AsArgmaxNode();
      tensor(fn, "x", n->x, false);
      tensor(fn, "out", n->out, true);
      break;
    }
    case fb::OpNode::CopyNode: {
      auto* n = op.AsCopyNode();
      tensor(fn, "x", n->x, false);
      tensor(fn, "out", n->out, true);
      break;
    }
    case fb::OpNode::SliceUpdateNode: {
      auto* n = op.AsSliceUpdateNode();
      tensor(fn, "update", n->update, false);
      int_or_vid(fn, "start", -1, n->start);
      tensor(fn, "dst", n->dst, true);  // read-modify-write: dst must already be written
      break;
    }
    case fb::OpNode::SymSizeNode: {
      auto* n = op.AsSymSizeNode();
      tensor(fn, "x", n->x, false);
      value_out(fn, "out", n->out);
      break;
    }
    case fb::OpNode::IntArithNode: {
      auto* n = op.AsIntArithNode();
      int_or_vid(fn, "a", -1, n->a);
      int_or_vid(fn, "b", -1, n->b);
      value_out(fn, "out", n->out);
      break;
    }
    case fb::OpNode::IfNode: {
      auto* n = op.AsIfNode();
      int_or_vid(fn, "cond", -1, n->cond);
      tensor_list(fn, "outputs", n->outputs, true);
      break;
    }
    case fb::OpNode::GatherQmmNode: {
      auto* n = op.AsGatherQmmNode();
      tensor(fn, "x", n->x, false);
      tensor(fn, "w", n->w, false);
      tensor(fn, "scales", n->scales, false);
      tensor(fn, "biases", n->biases, false);
      tensor(fn, "lhs_indices", n->lhs_indices, false, true);
      tensor(fn, "rhs_indices", n->rhs_indices, false, true);
      int_or_vid(fn, "sorted_indices", -1, n->sorted_indices);
      tensor(fn, "combine_weights", n->combine_weights, false, true);
      tensor(fn, "shared", n->shared, false, true);
      tensor(fn, "shared_gate", n->shared_gate, false, true);
      tensor(fn, "out", n->out, true);
      break;
    }
    case fb::OpNode::GatherMmNode: {
      auto* n = op.AsGatherMmNode();
      tensor(fn, "x", n->x, false);
      tensor(fn, "w", n->w, false);
      tensor(fn, "lhs_indices", n->lhs_indices, false, true);
      tensor(fn, "rhs_indices", n->rhs_indices, false, true);
      int_or_vid(fn, "sorted_indices", -1, n->sorted_indices);
      tensor(fn, "out", n->out, true);
      break;
    }
    case fb::OpNode::RouterNode: {
      auto* n = op.AsRouterNode();
      tensor(fn, "logits", n->logits, false);
      tensor(fn, "selection_bias", n->selection_bias, false, true);
      tensor(fn, "expert_scale", n->expert_scale, false, true);
      tensor(fn, "weights", n->weights, true);
      tensor(fn, "indices", n->indices, true);
      break;
    }
    case fb::OpNode::ArgsortNode: {
      auto* n = op.AsArgsortNode();
      tensor(fn, "x", n->x, false);
      tensor(fn, "out", n->out, true);
      break;
    }
    case fb::OpNode::GatherRowsNode: {
      auto* n = op.AsGatherRowsNode();
      tensor(fn, "x", n->x, false);
      tensor(fn, "indices", n->indices, false);
      tensor(fn, "out", n->out, true);
      break;
    }
    case fb::OpNode::ScatterRowsNode: {
      auto* n = op.AsScatterRowsNode();
      tensor(fn, "x", n->x, false);
      tensor(fn, "indices", n->indices, false);
      tensor(fn, "out", n->out, true);
      break;
    }
    case fb::OpNode::GluNode: {
      auto* n = op.AsGluNode();
      tensor(fn, "gate", n->gate, false);
      tensor(fn, "up", n->up, false);
      tensor(fn, "out", n->out, true);
      break;
    }
    case fb::OpNode::FullNode: {
      auto* n = op.AsFullNode();
      for (size_t i = 0; i < n->shape.size(); ++i) int_or_vid(fn, "shape", static_cast<int>(i), n->shape[i]);
      tensor(fn, "out", n->out, true);
      break;
    }
    case fb::OpNode::CombineNode: {
      auto* n = op.AsCombineNode();
      tensor(fn, "y", n->y, false);
      tensor(fn, "weights", n->weights, false);
      tensor(fn, "shared", n->shared, false, true);
      tensor(fn, "shared_gate", n->shared_gate, false, true);
      tensor(fn, "out", n->out, true);
      break;
    }
    case fb::OpNode::SoftmaxNode: {
      auto* n = op.AsSoftmaxNode();
      tensor(fn, "x", n->x, false);
      tensor(fn, "out", n->out, true);
      break;
    }
    case fb::OpNode::RmsNormNode: {
      auto* n = op.AsRmsNormNode();
      tensor(fn, "x", n->x, false);
      tensor(fn, "weight", n->weight, false);
      tensor(fn, "out", n->out, true);
      break;
    }
    case fb::OpNode::BatchMatmulNode: {
      auto* n = op.AsBatchMatmulNode();
      tensor(fn, "a", n->a, false);
      tensor(fn, "b", n->b, false);
      tensor(fn, "out", n->out, true);
      break;
    }
    case fb::OpNode::TransposeNode: {
      auto* n = op.AsTransposeNode();
      tensor(fn, "x", n->x, false);
      tensor(fn, "out", n->out, true);
      break;
    }
    case fb::OpNode::NONE: break;
  }
}

}  // namespace switchboard
