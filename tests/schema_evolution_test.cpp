// Schema evolution rules (schema/README.md), checked two ways:
//  1. structurally: every frozen snapshot in schema/history/ must be a prefix of
//     the current schema (same tables, field ids, types, defaults, enum values);
//  2. behaviourally: a program file written by an older build must still load
//     and compute the same results.
#include <flatbuffers/reflection.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "test_util.h"

namespace switchboard {
namespace {
using namespace switchboard::testing;
namespace fs = std::filesystem;

std::vector<uint8_t> read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::string type_name(const reflection::Schema& s, const reflection::Type& t) {
  std::string n = reflection::EnumNameBaseType(t.base_type());
  n += "/" + std::string(reflection::EnumNameBaseType(t.element()));
  if (t.index() >= 0) {
    // index names an object for tables/structs (or vectors of them), else an enum or union.
    bool is_obj = t.base_type() == reflection::Obj || (t.base_type() == reflection::Vector && t.element() == reflection::Obj);
    n += "/" + (is_obj ? s.objects()->Get(t.index())->name()->str() : s.enums()->Get(t.index())->name()->str());
  }
  return n;
}

// Returns every rule the new schema breaks relative to the old one.
std::vector<std::string> evolution_violations(const reflection::Schema& old_s, const reflection::Schema& new_s) {
  std::vector<std::string> v;
  for (const reflection::Object* o : *old_s.objects()) {
    const reflection::Object* n = new_s.objects()->LookupByKey(o->name()->c_str());
    if (!n) {
      v.push_back("table " + o->name()->str() + " was removed or renamed");
      continue;
    }
    if (n->is_struct() != o->is_struct() || (o->is_struct() && n->bytesize() != o->bytesize()))
      v.push_back(o->name()->str() + ": struct layout changed");
    for (const reflection::Field* f : *o->fields()) {
      std::string path = o->name()->str() + "." + f->name()->str();
      const reflection::Field* g = n->fields()->LookupByKey(f->name()->c_str());
      if (!g) {
        v.push_back(path + " was removed or renamed (deprecate it instead)");
        continue;
      }
      if (g->id() != f->id()) v.push_back(path + ": field id changed (fields are append-only)");
      if (type_name(new_s, *g->type()) != type_name(old_s, *f->type())) v.push_back(path + ": type changed");
      if (g->default_integer() != f->default_integer() || g->default_real() != f->default_real())
        v.push_back(path + ": default changed");
      if (g->required() && !f->required()) v.push_back(path + ": became required");
    }
    for (const reflection::Field* g : *n->fields())
      if (!o->fields()->LookupByKey(g->name()->c_str()) && g->id() < o->fields()->size())
        v.push_back(o->name()->str() + "." + g->name()->str() + ": new field not appended at the end");
  }
  for (const reflection::Enum* e : *old_s.enums()) {
    const reflection::Enum* n = new_s.enums()->LookupByKey(e->name()->c_str());
    if (!n) {
      v.push_back("enum/union " + e->name()->str() + " was removed or renamed");
      continue;
    }
    if (n->underlying_type()->base_type() != e->underlying_type()->base_type())
      v.push_back(e->name()->str() + ": underlying type changed");
    for (const reflection::EnumVal* ev : *e->values()) {
      const reflection::EnumVal* nv = n->values()->LookupByKey(ev->value());
      if (!nv || nv->name()->str() != ev->name()->str())
        v.push_back(e->name()->str() + "." + ev->name()->str() + ": value renumbered or removed (append only)");
    }
  }
  if (std::string(old_s.root_table()->name()->c_str()) != new_s.root_table()->name()->c_str())
    v.push_back("root table changed");
  if (old_s.file_ident()->str() != new_s.file_ident()->str()) v.push_back("file_identifier changed");
  return v;
}

const reflection::Schema& schema_of(const std::vector<uint8_t>& bfbs) {
  flatbuffers::Verifier verifier(bfbs.data(), bfbs.size());
  EXPECT_TRUE(reflection::VerifySchemaBuffer(verifier));
  return *reflection::GetSchema(bfbs.data());
}

TEST(SchemaEvolution, EverySnapshotIsAPrefixOfTheCurrentSchema) {
  auto current = read_bytes(fs::path(SB_GEN_DIR) / "program.bfbs");
  ASSERT_FALSE(current.empty());
  int snapshots = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(SB_GEN_DIR) / "history")) {
    auto old = read_bytes(entry.path());
    auto violations = evolution_violations(schema_of(old), schema_of(current));
    for (const auto& msg : violations) ADD_FAILURE() << entry.path().filename() << ": " << msg;
    ++snapshots;
  }
  EXPECT_EQ(snapshots, static_cast<int>(kSchemaVersion)) << "each schema version has a snapshot in schema/history/";
}

// The checker itself must catch the breaks it exists for.
TEST(SchemaEvolution, CheckerDetectsBreakingEdits) {
  auto current = read_bytes(fs::path(SB_GEN_DIR) / "program.bfbs");
  ASSERT_TRUE(evolution_violations(schema_of(current), schema_of(current)).empty());
  // Compile mutated copies of the schema text with flatc and expect violations.
  std::ifstream in(fs::path(SB_SOURCE_DIR) / "schema" / "program.fbs");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  struct Edit {
    std::string from, to, expect;
  };
  std::vector<Edit> edits = {
      {"table BinaryNode { a: Tid (required); b: Tid (required);", "table BinaryNode { b: Tid (required); a: Tid (required);",
       "field id changed"},
      {"F16 = 1, BF16 = 2", "BF16 = 1, F16 = 2", "renumbered"},
      {"transpose_b: bool = true", "transpose_b: bool = false", "default changed"},
      {"  BinaryNode, UnaryNode,", "  UnaryNode, BinaryNode,", "renumbered"},
  };
  fs::path dir = fs::path(::testing::TempDir()) / "sb_schema_edit";
  fs::create_directories(dir);
  for (const Edit& e : edits) {
    std::string mutated = text;
    size_t at = mutated.find(e.from);
    ASSERT_NE(at, std::string::npos) << e.from;
    mutated.replace(at, e.from.size(), e.to);
    std::ofstream(dir / "program.fbs") << mutated;
    std::string cmd = "flatc --binary --schema -o " + dir.string() + " " + (dir / "program.fbs").string();
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    auto edited = read_bytes(dir / "program.bfbs");
    auto violations = evolution_violations(schema_of(current), schema_of(edited));
    bool found = false;
    for (const auto& msg : violations) found |= msg.find(e.expect) != std::string::npos;
    EXPECT_TRUE(found) << "edit '" << e.to << "' not detected";
  }
}

// The sample: x [M <= 8, 4]; If (M > 2) squares x, else doubles it; the column
// sums accumulate in the buffer "acc"; outputs acc, argmax(acc) and 2 * step.
std::vector<uint8_t> build_sample() {
  ProgramBuilder b;
  TensorRef x = b.input("x", DType::kF32, {Dim::dynamic(1, 8), 4});
  IntOrValue step = b.input_value("step");
  TensorRef acc = b.mutable_buffer("acc", DType::kF32, {4});
  auto r = b.emit_if_else(
      b.floordiv_int(b.sub_int(b.size(x, 0), 1), 2), [&] { return std::vector<TensorRef>{b.square(x)}; },
      [&] { return std::vector<TensorRef>{b.add(x, x)}; });
  b.assign(acc, b.add(acc, b.sum(r[0], 0)));
  TensorRef out = b.copy(acc);
  b.output("acc", out);
  b.output("best", b.argmax(b.reshape(out, {1, 4}), 1));
  b.output_value("twice", b.mul_int(step, 2));
  return b.serialize().value();
}

// Runs the sample twice (M = 1, then M = 3) and checks what the semantics give.
void check_sample(const std::vector<uint8_t>& bytes) {
  auto program = load(bytes);
  ASSERT_TRUE(program);
  auto s = Session::create(program).value();
  SB_ASSERT_OK(s->set_input("x", f32({1, 4}, {1, 2, 3, 4})));
  SB_ASSERT_OK(s->set_input_value("step", 21));
  SB_ASSERT_OK(s->execute());
  EXPECT_EQ(floats(*s->output("acc")), (std::vector<float>{2, 4, 6, 8}));  // else: x + x
  SB_ASSERT_OK(s->set_input("x", f32({3, 4}, {1, 0, 0, -3, 1, 0, 0, 0, 1, 0, 0, 0})));
  SB_ASSERT_OK(s->execute());
  EXPECT_EQ(floats(*s->output("acc")), (std::vector<float>{5, 4, 6, 17}));  // then: sum of squares added
  EXPECT_EQ(s->output("best")->data_as<int32_t>()[0], 3);
  EXPECT_EQ(*s->output_value("twice"), 42);
}

TEST(SampleProgram, StoredV1FileStillLoadsAndRuns) {
  auto bytes = read_bytes(fs::path(SB_SOURCE_DIR) / "tests" / "data" / "sample_v1.sbp");
  ASSERT_FALSE(bytes.empty()) << "tests/data/sample_v1.sbp is missing";
  EXPECT_EQ(op_counts(bytes)["If"], 1);
  check_sample(bytes);
}

// Set SB_WRITE_SAMPLE=path to write a fresh sample (only when freezing a new version).
TEST(SampleProgram, CurrentBuilderGivesTheSameResults) {
  auto bytes = build_sample();
  check_sample(bytes);
  if (const char* out = std::getenv("SB_WRITE_SAMPLE")) {
    std::ofstream(out, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
}

}  // namespace
}  // namespace switchboard
