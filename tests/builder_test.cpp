// Builder: slot recycling, id coalescing, literal folding, If emission, errors.
#include "test_util.h"

namespace switchboard {
namespace {
using namespace switchboard::testing;

// A chain of n adds; with scopes, each step's temps return to the pool.
std::vector<uint8_t> add_chain(int n, bool scoped) {
  ProgramBuilder b;
  TensorRef x = b.input("x", DType::kF32, {4});
  TensorRef y = x;
  for (int i = 0; i < n; ++i) {
    if (scoped) {
      auto scope = b.tmp_scope();
      TensorRef t = b.mul(b.add(y, x), x);
      y = scope.keep(t);
    } else {
      y = b.mul(b.add(y, x), x);
    }
  }
  b.output("y", y);
  auto bytes = b.serialize();
  EXPECT_TRUE(bytes.is_ok()) << bytes.status().to_string();
  return bytes.is_ok() ? *bytes : std::vector<uint8_t>{};
}

TEST(Builder, TmpScopeRecyclesTemporaries) {
  auto unscoped = unpack(add_chain(50, false));
  auto scoped = unpack(add_chain(50, true));
  EXPECT_EQ(unscoped->num_tensor_slots, 1u + 100u);
  // Inside a scope only the add temp recycles; kept results still accumulate.
  EXPECT_LE(scoped->num_tensor_slots, 1u + 50u + 2u);
  EXPECT_LT(scoped->num_tensor_slots, unscoped->num_tensor_slots);
  // Both compute the same thing.
  for (bool scoped_build : {false, true}) {
    auto s = Session::create(load(add_chain(5, scoped_build))).value();
    SB_ASSERT_OK(s->set_input("x", f32({4}, {1, 1, 1, 1})));
    SB_ASSERT_OK(s->execute());
    EXPECT_EQ(floats(*s->output("y"))[0], 6.f);  // y = (y + 1) * 1, five times
  }
}

TEST(Builder, NestedScopesReleaseInnerTempsOnly) {
  ProgramBuilder b;
  TensorRef x = b.input("x", DType::kF32, {4});
  TensorRef kept;
  {
    auto outer = b.tmp_scope();
    TensorRef a = b.add(x, x);
    {
      auto inner = b.tmp_scope();
      TensorRef t = b.mul(a, a);
      kept = inner.keep(t);  // now owned by the outer scope
    }
    TensorRef c = b.add(kept, a);  // a and kept still live here
    kept = outer.keep(c);
  }
  b.output("y", kept);
  auto bytes = b.serialize();
  ASSERT_TRUE(bytes.is_ok()) << bytes.status().to_string();
  auto s = Session::create(load(*bytes)).value();
  SB_ASSERT_OK(s->set_input("x", f32({4}, {1, 2, 3, 4})));
  SB_ASSERT_OK(s->execute());
  EXPECT_EQ(floats(*s->output("y")), (std::vector<float>{6, 20, 42, 72}));  // 4x^2 + 2x
}

TEST(Builder, UseAfterScopeIsAnError) {
  ProgramBuilder b;
  TensorRef x = b.input("x", DType::kF32, {4});
  TensorRef dead;
  {
    auto scope = b.tmp_scope();
    dead = b.add(x, x);
  }
  b.output("y", b.add(dead, x));
  auto r = b.serialize();
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("used after its tmp_scope ended"), std::string::npos) << r.status().message();
}

TEST(Builder, ScopedTempCannotBeAnOutput) {
  ProgramBuilder b;
  TensorRef x = b.input("x", DType::kF32, {4});
  auto scope = b.tmp_scope();
  b.output("y", b.add(x, x));
  EXPECT_NE(b.status().message().find("keep()"), std::string::npos) << b.status().message();
}

TEST(Builder, CoalescingKeepsOnlyReferencedSlotsDense) {
  ProgramBuilder b;
  TensorRef x = b.input("x", DType::kF32, {2});
  b.constant("unused", DType::kF32, {2});
  TensorRef w = b.constant("w", DType::kF32, {2});
  b.output("y", b.add(x, w));
  auto ir = unpack(b.serialize().value());
  ASSERT_TRUE(ir);
  ASSERT_EQ(ir->constants.size(), 1u);
  EXPECT_EQ(ir->constants[0]->name, "w");
  EXPECT_EQ(ir->constants[0]->tid->idx(), 0u) << "constants come first";
  EXPECT_EQ(ir->inputs[0]->idx, 1u);
  EXPECT_EQ(ir->num_tensor_slots, 3u);
}

TEST(Builder, IntegerHelpersFoldLiterals) {
  ProgramBuilder b;
  TensorRef s = b.input("s", DType::kF32, {3, 5});
  TensorRef d = b.input("d", DType::kF32, {Dim::dynamic(1, 9), 5});
  EXPECT_TRUE(b.size(s, 0).is_literal());
  EXPECT_EQ(b.size(s, -1).literal(), 5);
  EXPECT_EQ(b.product({b.size(s, 0), b.size(s, 1), 2}).literal(), 30);
  EXPECT_EQ(b.add_int(7, 5).literal(), 12);
  EXPECT_EQ(b.sub_int(7, 9).literal(), -2);
  EXPECT_EQ(b.floordiv_int(-7, 2).literal(), -4) << "floor, not truncation";
  EXPECT_EQ(b.max_int(-7, 2).literal(), 2);
  IntOrValue m = b.size(d, 0);
  EXPECT_FALSE(m.is_literal());
  IntOrValue same = b.mul_int(m, 1);
  EXPECT_EQ(same.vid(), m.vid()) << "x * 1 folds to x";
  IntOrValue n = b.product({m, b.size(d, 1)});  // one multiply, by the static 5
  EXPECT_FALSE(n.is_literal());
  b.output_value("n", n);
  b.output_value("q", b.floordiv_int(b.sub_int(m, 1), 4));
  auto bytes = b.serialize().value();
  auto counts = op_counts(bytes);
  EXPECT_EQ(counts["SymSize"], 1);
  EXPECT_EQ(counts["IntArith"], 3);  // m*5, m-1, (m-1)//4
  auto session = Session::create(load(bytes)).value();
  SB_ASSERT_OK(session->set_input("s", Tensor::zeros(DType::kF32, {3, 5}).value()));
  SB_ASSERT_OK(session->set_input("d", Tensor::zeros(DType::kF32, {6, 5}).value()));
  SB_ASSERT_OK(session->execute());
  EXPECT_EQ(*session->output_value("n"), 30);
  EXPECT_EQ(*session->output_value("q"), 1);
}

TEST(Builder, LiteralOverflowIsAnError) {
  ProgramBuilder b;
  b.mul_int(INT64_MAX, 2);
  EXPECT_FALSE(b.status().is_ok());
  ProgramBuilder c;
  c.floordiv_int(1, 0);
  EXPECT_FALSE(c.status().is_ok());
}

TEST(Builder, LiteralConditionEmitsOnlyTheChosenBranchInline) {
  for (int cond : {0, 1}) {
    ProgramBuilder b;
    TensorRef x = b.input("x", DType::kF32, {2});
    auto r = b.emit_if_else(
        cond, [&] { return std::vector<TensorRef>{b.neg(x)}; },
        [&] { return std::vector<TensorRef>{b.square(b.abs(x))}; });
    b.output("y", r[0]);
    auto ir = unpack(b.serialize().value());
    ASSERT_EQ(ir->chains.size(), 1u);
    EXPECT_EQ(ir->chains[0]->instructions.size(), cond ? 1u : 2u);
  }
}

TEST(Builder, DynamicConditionSharesResultSlotsAcrossBranches) {
  ProgramBuilder b;
  TensorRef x = b.input("x", DType::kF32, {Dim::dynamic(1, 8), 2});
  TensorRef c = b.input("c", DType::kF32, {1, 2});
  IntOrValue cond = b.sub_int(b.size(x, 0), 1);
  auto r = b.emit_if_else(
      cond, [&] { return std::vector<TensorRef>{b.add(x, c), c}; },       // second result: an input → copied
      [&] { return std::vector<TensorRef>{b.sub(x, c), b.neg(c)}; });
  b.output("y", r[0]);
  b.output("z", r[1]);
  auto bytes = b.serialize().value();
  auto ir = unpack(bytes);
  ASSERT_EQ(ir->chains.size(), 3u);
  const auto* ifn = ir->chains[0]->instructions.back()->op.AsIfNode();
  ASSERT_NE(ifn, nullptr);
  ASSERT_EQ(ifn->outputs.size(), 2u);
  EXPECT_EQ(op_counts(bytes)["Copy"], 1) << "only the branch returning an input needs a copy";
  auto s = Session::create(load(bytes)).value();
  SB_ASSERT_OK(s->set_input("c", f32({1, 2}, {1, 1})));
  SB_ASSERT_OK(s->set_input("x", f32({1, 2}, {5, 5})));
  SB_ASSERT_OK(s->execute());
  EXPECT_EQ(floats(*s->output("y")), (std::vector<float>{4, 4}));
  EXPECT_EQ(floats(*s->output("z")), (std::vector<float>{-1, -1}));
  SB_ASSERT_OK(s->set_input("x", f32({2, 2}, {5, 5, 5, 5})));
  SB_ASSERT_OK(s->execute());
  EXPECT_EQ(floats(*s->output("y")), (std::vector<float>{6, 6, 6, 6}));
  EXPECT_EQ(floats(*s->output("z")), (std::vector<float>{1, 1}));
}

TEST(Builder, BranchResultMismatchIsAnError) {
  ProgramBuilder b;
  TensorRef x = b.input("x", DType::kF32, {Dim::dynamic(1, 8)});
  b.emit_if_else(
      b.size(x, 0), [&] { return std::vector<TensorRef>{x}; }, [&] { return std::vector<TensorRef>{}; });
  EXPECT_NE(b.status().message().find("then returns 1 tensors, else 0"), std::string::npos) << b.status().message();
}

TEST(Builder, ShapeInferenceAndErrors) {
  ProgramBuilder b;
  TensorRef x = b.input("x", DType::kF32, {3, 1});
  TensorRef y = b.input("y", DType::kF32, {1, 4});
  EXPECT_EQ(b.shape(b.add(x, y)).size(), 2u);
  EXPECT_EQ(b.shape(b.add(x, y))[1].size, 4);
  EXPECT_EQ(b.shape(b.reshape(b.add(x, y), {-1})).at(0).size, 12);
  EXPECT_EQ(b.shape(b.slice(y, 1, -3, 100)).at(1).size, 3);
  EXPECT_EQ(b.dtype(b.argmax(y, 1)), DType::kI32);
  TensorRef z = b.input("z", DType::kF32, {5});
  b.add(y, z);
  EXPECT_NE(b.status().message().find("do not broadcast"), std::string::npos) << b.status().message();
  ProgramBuilder c;
  TensorRef i = c.input("i", DType::kI32, {2});
  c.add(i, c.input("f", DType::kF32, {2}));
  EXPECT_NE(c.status().message().find("dtypes i32 and f32 differ"), std::string::npos);
  ProgramBuilder d;
  d.input("x", DType::kF32, {1});
  d.input("x", DType::kF32, {1});
  EXPECT_NE(d.status().message().find("declared twice"), std::string::npos);
}

// The builder infers output shapes with the devices' own rules (backend/ops/dim_rules.h):
// the same mistake gets the same words at build time as at run time, and dynamic dims pass.
TEST(Builder, ShapeRulesAreTheDevicesRules) {
  auto message_of = [](auto&& build) {
    ProgramBuilder b;
    build(b);
    return b.status().message();
  };
  EXPECT_NE(message_of([](ProgramBuilder& b) {
              b.matmul(b.input("a", DType::kF32, {2, 3}), b.input("w", DType::kF32, {4, 5}), false);
            }).find("matmul: inner dims differ: a [2, 3], b [4, 5]"),
            std::string::npos);
  EXPECT_NE(message_of([](ProgramBuilder& b) {
              b.concat({b.input("a", DType::kF32, {2, 3}), b.input("c", DType::kF32, {2, 4})}, 0);
            }).find("concat: inputs[1] shape [2, 4] does not match inputs[0] [2, 3]"),
            std::string::npos);
  EXPECT_NE(message_of([](ProgramBuilder& b) {
              b.batch_matmul(b.input("a", DType::kF32, {3, 2, 4}), b.input("c", DType::kF32, {2, 4, 5}), false);
            }).find("batch_matmul: a's batch 3 is not a multiple of b's batch 2"),
            std::string::npos);
  EXPECT_NE(message_of([](ProgramBuilder& b) {
              b.transpose(b.input("a", DType::kF32, {2, 3}), {0, 0});
            }).find("transpose: perm entry 0 out of range or repeated"),
            std::string::npos);
  ProgramBuilder b;
  TensorRef x = b.input("x", DType::kF32, {Dim::dynamic(1, 8), 3});
  TensorRef m = b.matmul(x, b.input("w", DType::kF32, {3, 5}), false);
  EXPECT_FALSE(b.shape(m)[0].is_static());
  EXPECT_EQ(b.shape(m)[1].size, 5);
  TensorRef c = b.concat({x, x}, 0);
  EXPECT_FALSE(b.shape(c)[0].is_static());
  EXPECT_EQ(b.shape(c)[1].size, 3);
  EXPECT_TRUE(b.status().is_ok()) << b.status().message();
}

}  // namespace
}  // namespace switchboard
