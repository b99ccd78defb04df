// Loader hardening: every malformed program or weights file must come back as
// an error Status naming the offending path, never a crash or an OOB read.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "hash.h"
#include "program_impl.h"
#include "safetensors.h"
#include "switchboard/builder.h"
#include "switchboard/switchboard.h"

namespace switchboard {
namespace {

using ::testing::HasSubstr;
using Bytes = std::vector<uint8_t>;

constexpr size_t kHeader = sizeof(FileHeader);
constexpr int64_t kMaxInputElems = 4096;

// --- files -------------------------------------------------------------------

std::string temp_dir() {
  static const std::string dir = [] {
    std::string tmpl = testing::TempDir() + "/sb_loader_XXXXXX";
    EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
    return tmpl;
  }();
  return dir;
}

Bytes read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// Writes one f32/f16 tensor named `name` to a fresh safetensors file and returns its path.
std::string write_weights(const std::string& file, const std::string& name, DType dtype, const Shape& shape) {
  std::string path = temp_dir() + "/" + file;
  Result<Tensor> t = Tensor::zeros(dtype, shape);
  EXPECT_TRUE(t.is_ok()) << t.status().to_string();
  if (dtype == DType::kF32 && shape == Shape{4, 4}) {
    // Identity, so the sample's matmul passes x through unchanged.
    auto* p = t->mutable_data_as<float>();
    for (int i = 0; i < 4; ++i) p[i * 4 + i] = 1.0f;
  }
  Status st = write_safetensors(path, {{name, *t}});
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return path;
}

const std::string& good_weights() {
  static const std::string path = write_weights("good.safetensors", "w", DType::kF32, {4, 4});
  return path;
}

// --- the sample program ------------------------------------------------------

// x [1..8, 4] f32, constant w [4, 4], buffer acc [1, 4]:
//   y = x @ w^T + x;  r = rows > 1 ? relu(y) : -y  (an If node);  acc += sum(r, 0)
//   outputs y = r, best = argmax(y, 1), half = f16(sum(r, 0)).
Bytes build_sample() {
  ProgramBuilder b;
  TensorRef x = b.input("x", DType::kF32, {Dim::dynamic(1, 8), 4});
  TensorRef w = b.constant("w", DType::kF32, {4, 4});
  TensorRef acc = b.mutable_buffer("acc", DType::kF32, {1, 4});
  TensorRef y = b.add(b.matmul(x, w), x);
  IntOrValue cond = b.sub_int(b.size(x, 0), 1);
  std::vector<TensorRef> r = b.emit_if_else(
      cond, [&] { return std::vector<TensorRef>{b.relu(y)}; }, [&] { return std::vector<TensorRef>{b.neg(y)}; });
  TensorRef s = r.empty() ? TensorRef{} : b.sum(r[0], 0, true);
  b.assign(acc, b.add(acc, s));
  b.output("y", r.empty() ? TensorRef{} : r[0]);
  b.output("best", b.argmax(y, 1));
  b.output("half", b.cast(s, DType::kF16));
  Result<Bytes> bytes = b.serialize();
  EXPECT_TRUE(bytes.is_ok()) << bytes.status().to_string();
  return bytes.is_ok() ? *bytes : Bytes{};
}

const Bytes& sample() {
  static const Bytes bytes = build_sample();
  return bytes;
}

// The FlatBuffer of a program file, unpacked (copied to aligned storage first).
std::unique_ptr<fb::ProgramT> unpack(const Bytes& file) {
  std::vector<uint64_t> aligned((file.size() - kHeader + 7) / 8);
  std::memcpy(aligned.data(), file.data() + kHeader, file.size() - kHeader);
  return std::unique_ptr<fb::ProgramT>(fb::GetProgram(aligned.data())->UnPack());
}

// Index of the `nth` instruction of `type` in `chain`; ADD_FAILURE and 0 if absent.
size_t find_op(const fb::ProgramT& p, size_t chain, fb::OpNode type, int nth = 0) {
  const auto& ins = p.chains[chain]->instructions;
  for (size_t i = 0; i < ins.size(); ++i)
    if (ins[i]->op.type == type && nth-- == 0) return i;
  ADD_FAILURE() << "no " << fb::EnumNameOpNode(type) << " in chains[" << chain << "]";
  return 0;
}

fb::OpNodeUnion& op_at(fb::ProgramT& p, size_t chain, fb::OpNode type, int nth = 0) {
  return p.chains[chain]->instructions[find_op(p, chain, type, nth)]->op;
}

// Appends a tensor slot with static `dims` and returns its id.
uint32_t add_slot(fb::ProgramT& p, fb::DType dtype, const std::vector<int64_t>& dims) {
  auto m = std::make_unique<fb::TensorMetaT>();
  m->dtype = dtype;
  for (int64_t d : dims) {
    m->shape.push_back(std::make_unique<fb::DimT>());
    m->shape.back()->size = d;
  }
  p.tensor_meta.push_back(std::move(m));
  return p.num_tensor_slots++;
}

std::unique_ptr<fb::Tid> tid(uint32_t idx) { return std::make_unique<fb::Tid>(idx); }

uint32_t input_slot(const fb::ProgramT& p) { return p.inputs[0]->idx; }
uint32_t constant_slot(const fb::ProgramT& p) { return p.constants[0]->tid->idx(); }

Result<std::shared_ptr<const Program>> load(Bytes bytes, const LoadOptions& options = {{}, false}) {
  return Program::from_bytes(std::move(bytes), "bad.sbp", options);
}

Status load_status(const fb::ProgramT& p) { return load(serialize_program(p)).status(); }

void expect_invalid(const fb::ProgramT& p, const std::string& fragment) {
  Status st = load_status(p);
  EXPECT_EQ(st.code(), StatusCode::kInvalidProgram) << st.to_string();
  EXPECT_THAT(st.message(), HasSubstr(fragment));
}

void expect_invalid_bytes(const Bytes& bytes, const std::string& fragment) {
  Status st = load(bytes).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidProgram) << st.to_string();
  EXPECT_THAT(st.message(), HasSubstr(fragment));
}

template <class T>
void poke(Bytes& bytes, size_t offset, T value) {
  std::memcpy(bytes.data() + offset, &value, sizeof value);
}

// Records the FlatBuffer's checksum again after a test edited its bytes, so the edit reaches
// the verifier and validator instead of stopping at the checksum.
Bytes& restamp(Bytes& b) {
  FileHeader h;
  std::memcpy(&h, b.data(), sizeof h);
  if (h.flatbuffer_offset > b.size() || h.flatbuffer_size > b.size() - h.flatbuffer_offset) return b;
  poke(b, offsetof(FileHeader, checksum_xxh3),
       program_checksum(h, std::span<const uint8_t>(b).subspan(h.flatbuffer_offset, h.flatbuffer_size)));
  return b;
}

// --- running -----------------------------------------------------------------

// Zeros with each dynamic dim at its lower bound; OutOfRange over kMaxInputElems elements.
Result<Tensor> small_input(const IoInfo& in) {
  Shape shape;
  int64_t n = 1;
  for (const DimInfo& d : in.shape) {
    int64_t v = d.size >= 0 ? d.size : d.min;
    if (v < 0 || (v > 0 && n > kMaxInputElems / v)) return Status(StatusCode::kOutOfRange, "input too large");
    n *= v;
    shape.push_back(v);
  }
  return Tensor::zeros(in.dtype, shape);
}

// Creates a session, sets small inputs and executes once; the Status of the first failing step.
Status run_once(std::shared_ptr<const Program> prog) {
  SessionOptions opts;
  opts.max_buffer_bytes = 64u << 20;  // flipped bits can declare huge buffers; those must be refused, not allocated
  SB_ASSIGN_OR_RETURN(std::unique_ptr<Session> s, Session::create(prog, opts));
  for (const IoInfo& in : prog->inputs()) {
    if (!in.is_tensor) {
      SB_RETURN_IF_ERROR(s->set_input_value(in.name, 1));
      continue;
    }
    SB_ASSIGN_OR_RETURN(Tensor t, small_input(in));
    SB_RETURN_IF_ERROR(s->set_input(in.name, t));
  }
  return s->execute();
}

// --- the sample itself ------------------------------------------------------

TEST(LoaderSample, HasTheOpsTheOtherTestsMutate) {
  ASSERT_FALSE(sample().empty());
  auto p = unpack(sample());
  EXPECT_EQ(p->chains.size(), 3u);
  for (fb::OpNode t : {fb::OpNode::MatmulNode, fb::OpNode::BinaryNode, fb::OpNode::SymSizeNode,
                       fb::OpNode::IntArithNode, fb::OpNode::IfNode, fb::OpNode::ArgmaxNode, fb::OpNode::CastNode})
    find_op(*p, 0, t);
  EXPECT_EQ(p->constants.size(), 1u);
  EXPECT_EQ(p->mutable_buffers.size(), 1u);
  EXPECT_TRUE(p->chains[0]->instructions[find_op(*p, 0, fb::OpNode::IntArithNode)]->op.AsIntArithNode()->a->is_vid);
}

TEST(LoaderSample, LoadsAndRunsBothBranches) {
  auto prog = load(sample(), {{good_weights()}, true});
  ASSERT_TRUE(prog.is_ok()) << prog.status().to_string();
  auto s = Session::create(*prog);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  // Two rows take the relu branch, one row the negation: y = 2x either way before it.
  for (auto [rows, sign] : {std::pair{2, 1.0}, std::pair{1, -1.0}}) {
    std::vector<float> xs;
    for (int i = 0; i < rows * 4; ++i) xs.push_back(static_cast<float>(i + 1));
    auto x = Tensor::from_vector(DType::kF32, {rows, 4}, xs);
    ASSERT_TRUE(x.is_ok());
    ASSERT_TRUE((*s)->set_input("x", *x).is_ok());
    Status st = (*s)->execute();
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    auto y = (*s)->output("y");
    ASSERT_TRUE(y.is_ok()) << y.status().to_string();
    std::vector<double> want;
    for (float v : xs) want.push_back(sign > 0 ? 2.0 * v : -2.0 * v);
    EXPECT_EQ(y->to_doubles(), want) << "rows=" << rows;
  }
}

// --- raw bytes: truncation, bit flips, header --------------------------------

TEST(LoaderBytes, EveryTruncationIsAnError) {
  const Bytes& full = sample();
  ASSERT_GT(full.size(), kHeader);
  for (size_t n = 0; n < full.size(); ++n) {
    Status st = load(Bytes(full.begin(), full.begin() + static_cast<ptrdiff_t>(n))).status();
    ASSERT_EQ(st.code(), StatusCode::kInvalidProgram) << "length " << n << ": " << st.to_string();
    ASSERT_THAT(st.message(), HasSubstr("header")) << "length " << n;
  }
}

// Every single-bit flip anywhere in the file is refused: the header's own fields by their
// checks or the checksum, which covers the rest of the header and the FlatBuffer.
TEST(LoaderBytes, EveryBitFlipFailsALoad) {
  const Bytes& full = sample();
  for (size_t i = 0; i < full.size(); ++i)
    for (int bit = 0; bit < 8; ++bit) {
      Bytes bytes = full;
      bytes[i] ^= static_cast<uint8_t>(1u << bit);
      Status st = load(bytes).status();
      ASSERT_EQ(st.code(), StatusCode::kInvalidProgram) << "byte " << i << " bit " << bit;
      if (i >= offsetof(FileHeader, checksum_xxh3)) {
        ASSERT_THAT(st.message(), HasSubstr("header.checksum_xxh3")) << "byte " << i << " bit " << bit;
      }
    }
}

// Past the checksum (re-stamped), every single-bit flip must give an error or a program that
// validates and then runs to OK or an error. ASan turns any OOB read along the way into a failure.
TEST(LoaderBytes, EveryBitFlipIsAnErrorOrAValidProgram) {
  const Bytes& full = sample();
  size_t loaded = 0, rejected = 0, ran_ok = 0;
  for (size_t i = 0; i < full.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      Bytes bytes = full;
      bytes[i] ^= static_cast<uint8_t>(1u << bit);
      const bool checksum_field = i >= offsetof(FileHeader, checksum_xxh3) && i < offsetof(FileHeader, weights_bytes);
      if (!checksum_field) restamp(bytes);
      auto prog = Program::from_bytes(std::move(bytes), "flip", {{good_weights()}, true});
      if (!prog.is_ok()) {
        ++rejected;
        ASSERT_FALSE(prog.status().message().empty()) << "byte " << i << " bit " << bit;
        continue;
      }
      ++loaded;
      if (run_once(*prog).is_ok()) ++ran_ok;
    }
  }
  RecordProperty("loaded", static_cast<int>(loaded));
  RecordProperty("ran_ok", static_cast<int>(ran_ok));
  EXPECT_GT(rejected, full.size());  // flips in the header alone reject more than this
  EXPECT_GT(loaded, 0u);             // flips of literal values and padding still load
}

TEST(LoaderBytes, HeaderMagic) {
  Bytes b = sample();
  b[0] = 'X';
  expect_invalid_bytes(b, "header.magic: 58 57 42 50 is not \"SWBP\"");
}

TEST(LoaderBytes, HeaderFormatVersion) {
  for (uint32_t v : {0u, kFormatVersion + 1}) {
    Bytes b = sample();
    poke(b, offsetof(FileHeader, format_version), v);
    expect_invalid_bytes(b, strformat("header.format_version: %u is not supported", v));
  }
}

TEST(LoaderBytes, HeaderSize) {
  for (uint32_t v : {0u, 31u, 32u, 65u}) {
    Bytes b = sample();
    poke(b, offsetof(FileHeader, header_size), v);
    expect_invalid_bytes(b, strformat("header.header_size: %u, expected 64 for format 2", v));
  }
  Bytes b = sample();
  poke(b, offsetof(FileHeader, format_version), 1u);  // a format 1 header is 32 bytes
  expect_invalid_bytes(b, "header.header_size: 64, expected 32 for format 1");
}

TEST(LoaderBytes, HeaderUnknownFlags) {
  Bytes b = sample();
  poke(b, offsetof(FileHeader, flags), 6u);
  expect_invalid_bytes(b, "header.flags: 0x6 has unknown bits");
}

TEST(LoaderBytes, FlatbufferOutsideTheFile) {
  const Bytes& full = sample();
  const uint64_t n = full.size(), body = n - kHeader;
  struct Case {
    uint64_t offset, size;
  };
  for (Case c : {Case{n + 1, 0}, Case{16, body}, Case{kHeader, body + 1}, Case{kHeader + 8, body},
                 Case{UINT64_MAX, body}, Case{kHeader, UINT64_MAX}, Case{UINT64_MAX - 7, 16}}) {
    Bytes b = full;
    poke(b, offsetof(FileHeader, flatbuffer_offset), c.offset);
    poke(b, offsetof(FileHeader, flatbuffer_size), c.size);
    expect_invalid_bytes(b, strformat("header: flatbuffer [%llu, +%llu) is outside the %llu-byte file",
                                      (unsigned long long)c.offset, (unsigned long long)c.size,
                                      (unsigned long long)n));
  }
}

// The loader copies the FlatBuffer to aligned storage, so any offset works.
TEST(LoaderBytes, FlatbufferAtAnyOffsetLoads) {
  for (size_t pad : {1u, 3u, 8u}) {
    Bytes b = sample();
    b.insert(b.begin() + kHeader, pad, 0xee);
    poke(b, offsetof(FileHeader, flatbuffer_offset), uint64_t{kHeader + pad});
    restamp(b);
    auto prog = load(b);
    EXPECT_TRUE(prog.is_ok()) << "pad " << pad << ": " << prog.status().to_string();
  }
}

TEST(LoaderBytes, FileIdentifier) {
  Bytes b = sample();
  b[kHeader + 4] = 'X';  // the identifier follows the 4-byte root offset
  expect_invalid_bytes(restamp(b), "flatbuffer: missing file identifier \"SWB1\"");
}

// Finds the type byte of chains[c].instructions[i].op in the file through the table's vtable.
size_t op_type_offset(const Bytes& file, size_t c, size_t i) {
  std::vector<uint64_t> aligned((file.size() - kHeader + 7) / 8);
  std::memcpy(aligned.data(), file.data() + kHeader, file.size() - kHeader);
  const auto* base = reinterpret_cast<const uint8_t*>(aligned.data());
  const auto* table = reinterpret_cast<const uint8_t*>(fb::GetProgram(base)->chains()->Get(c)->instructions()->Get(i));
  const uint8_t* vtable = table - flatbuffers::ReadScalar<flatbuffers::soffset_t>(table);
  auto field = flatbuffers::ReadScalar<flatbuffers::voffset_t>(vtable + fb::Instruction::VT_OP_TYPE);
  EXPECT_GT(field, 0) << "op type stored as the default";
  return kHeader + static_cast<size_t>(table - base) + field;
}

TEST(LoaderBytes, UnknownUnionType) {
  auto p = unpack(sample());
  size_t n = find_op(*p, 0, fb::OpNode::BinaryNode);
  for (int type : {0, static_cast<int>(fb::OpNode::MAX) + 1, 255}) {
    Bytes b = sample();
    size_t at = op_type_offset(b, 0, n);
    ASSERT_EQ(b[at], static_cast<uint8_t>(fb::OpNode::BinaryNode));
    b[at] = static_cast<uint8_t>(type);
    expect_invalid_bytes(restamp(b), strformat("chains[0].instructions[%zu]: unknown op type %d", n, type));
  }
}

// --- root fields -------------------------------------------------------------

TEST(LoaderRoot, SchemaVersion) {
  for (uint32_t v : {0u, kSchemaVersion + 1}) {
    auto p = unpack(sample());
    p->version = v;
    expect_invalid(*p, strformat("version: %u is not supported (this build reads 1..%u)", v, kSchemaVersion));
  }
}

TEST(LoaderRoot, TensorMetaCountMismatch) {
  auto p = unpack(sample());
  p->tensor_meta.pop_back();
  expect_invalid(*p, strformat("tensor_meta: %zu entries for %u tensor slots", p->tensor_meta.size(),
                               p->num_tensor_slots));
}

TEST(LoaderRoot, InvalidDtypeInTensorMeta) {
  for (int v : {-1, kNumDTypes, 42}) {
    auto p = unpack(sample());
    p->tensor_meta[1]->dtype = static_cast<fb::DType>(v);
    expect_invalid(*p, strformat("tensor_meta[1].dtype: %d is not a dtype", v));
  }
}

TEST(LoaderRoot, BadDims) {
  auto mutate_x_dim = [](const std::function<void(fb::DimT&)>& f) {
    auto p = unpack(sample());
    f(*p->tensor_meta[input_slot(*p)]->shape[0]);
    return p;
  };
  const std::string x = strformat("tensor_meta[%u].shape[0]", input_slot(*unpack(sample())));
  expect_invalid(*mutate_x_dim([](fb::DimT& d) { d.size = -2; }), x + ".size: -2 is neither >= 0 nor -1");
  expect_invalid(*mutate_x_dim([](fb::DimT& d) { d.min = -1; }), x + ": bounds [-1, 8] are invalid");
  expect_invalid(*mutate_x_dim([](fb::DimT& d) { d.min = 5, d.max = 2; }), x + ": bounds [5, 2] are invalid");
  auto p = unpack(sample());
  auto& shape = p->tensor_meta[0]->shape;
  while (shape.size() < 9) shape.push_back(std::make_unique<fb::DimT>());
  expect_invalid(*p, "tensor_meta[0].shape: rank 9 > 8");
}

TEST(LoaderRoot, MainAndInitChainOutOfRange) {
  auto p = unpack(sample());
  const size_t chains = p->chains.size();
  p->main_chain = static_cast<uint32_t>(chains);
  expect_invalid(*p, strformat("main_chain: %zu out of range (%zu chains)", chains, chains));
  for (int init : {-2, 0, static_cast<int>(chains), INT32_MAX}) {
    p = unpack(sample());
    p->init_chain = init;
    expect_invalid(*p, strformat("init_chain: %d is not -1 or a chain other than main (%zu chains)", init, chains));
  }
}

// --- slot references -----------------------------------------------------------

TEST(LoaderSlots, TensorSlotOutOfRange) {
  struct Case {
    fb::OpNode type;
    const char* field;
    std::function<void(fb::OpNodeUnion&)> set;
  };
  const Case cases[] = {
      {fb::OpNode::BinaryNode, "Binary.a", [](auto& op) { op.AsBinaryNode()->a = tid(91); }},
      {fb::OpNode::BinaryNode, "Binary.b", [](auto& op) { op.AsBinaryNode()->b = tid(91); }},
      {fb::OpNode::BinaryNode, "Binary.out", [](auto& op) { op.AsBinaryNode()->out = tid(91); }},
      {fb::OpNode::MatmulNode, "Matmul.b", [](auto& op) { op.AsMatmulNode()->b = tid(91); }},
      {fb::OpNode::MatmulNode, "Matmul.bias", [](auto& op) { op.AsMatmulNode()->bias = tid(91); }},
      {fb::OpNode::ArgmaxNode, "Argmax.x", [](auto& op) { op.AsArgmaxNode()->x = tid(91); }},
      {fb::OpNode::CastNode, "Cast.out", [](auto& op) { op.AsCastNode()->out = tid(91); }},
      {fb::OpNode::SymSizeNode, "SymSize.x", [](auto& op) { op.AsSymSizeNode()->x = tid(91); }},
      {fb::OpNode::IfNode, "If.outputs[0]", [](auto& op) { op.AsIfNode()->outputs[0] = fb::Tid(91); }},
  };
  for (const Case& c : cases) {
    auto p = unpack(sample());
    size_t n = find_op(*p, 0, c.type);
    c.set(p->chains[0]->instructions[n]->op);
    expect_invalid(*p, strformat("chains[0].instructions[%zu].%s: tensor slot 91 out of range (%u slots)", n,
                                 c.field, p->num_tensor_slots));
  }
}

TEST(LoaderSlots, TensorSlotOutOfRangeInABranch) {
  auto p = unpack(sample());
  size_t n = find_op(*p, 1, fb::OpNode::UnaryNode);
  op_at(*p, 1, fb::OpNode::UnaryNode).AsUnaryNode()->x = tid(UINT32_MAX);
  expect_invalid(*p, strformat("chains[1].instructions[%zu].Unary.x: tensor slot %u out of range (%u slots)", n,
                               UINT32_MAX, p->num_tensor_slots));
}

TEST(LoaderSlots, NamedSlotsOutOfRange) {
  auto p = unpack(sample());
  p->constants[0]->tid = tid(91);
  expect_invalid(*p, strformat("constants[0].tid: tensor slot 91 out of range (%u slots)", p->num_tensor_slots));
  p = unpack(sample());
  p->outputs[0]->idx = 91;
  expect_invalid(*p, strformat("outputs[0].idx: tensor slot 91 out of range (%u slots)", p->num_tensor_slots));
}

TEST(LoaderSlots, ValueSlotOutOfRange) {
  auto p = unpack(sample());
  size_t n = find_op(*p, 0, fb::OpNode::SymSizeNode);
  p->chains[0]->instructions[n]->op.AsSymSizeNode()->out = std::make_unique<fb::Vid>(77);
  expect_invalid(*p, strformat("chains[0].instructions[%zu].SymSize.out: value slot 77 out of range (%u slots)", n,
                               p->num_value_slots));

  p = unpack(sample());
  n = find_op(*p, 0, fb::OpNode::IfNode);
  p->chains[0]->instructions[n]->op.AsIfNode()->cond->vid = std::make_unique<fb::Vid>(77);
  expect_invalid(*p, strformat("chains[0].instructions[%zu].If.cond: value slot 77 out of range (%u slots)", n,
                               p->num_value_slots));
}

TEST(LoaderSlots, MissingVidWhenIsVid) {
  auto p = unpack(sample());
  size_t n = find_op(*p, 0, fb::OpNode::IntArithNode);
  p->chains[0]->instructions[n]->op.AsIntArithNode()->a->vid.reset();
  expect_invalid(*p, strformat("chains[0].instructions[%zu].IntArith.a: missing", n));

  p = unpack(sample());  // b is a literal; claiming it is a vid without one is the same error
  p->chains[0]->instructions[n]->op.AsIntArithNode()->b->is_vid = true;
  expect_invalid(*p, strformat("chains[0].instructions[%zu].IntArith.b: missing", n));
}

TEST(LoaderSlots, WritesAConstantOrAnInput) {
  auto p = unpack(sample());
  size_t n = find_op(*p, 0, fb::OpNode::BinaryNode);
  uint32_t w = constant_slot(*p);
  p->chains[0]->instructions[n]->op.AsBinaryNode()->out = tid(w);
  expect_invalid(*p, strformat("chains[0].instructions[%zu].Binary.out: writes tensor slot %u, which is a constant",
                               n, w));

  p = unpack(sample());
  uint32_t x = input_slot(*p);
  n = find_op(*p, 1, fb::OpNode::UnaryNode);
  op_at(*p, 1, fb::OpNode::UnaryNode).AsUnaryNode()->out = tid(x);
  expect_invalid(*p, strformat("chains[1].instructions[%zu].Unary.out: writes tensor slot %u, which is a program input",
                               n, x));
}

// --- If ----------------------------------------------------------------------

std::unique_ptr<fb::InstructionT> if_instruction(uint32_t then_chain, uint32_t else_chain) {
  auto n = std::make_unique<fb::IfNodeT>();
  n->cond = std::make_unique<fb::IntOrVidT>();
  n->cond->literal = 1;
  n->then_chain = then_chain;
  n->else_chain = else_chain;
  auto ins = std::make_unique<fb::InstructionT>();
  ins->op.Set(std::move(*n));
  return ins;
}

TEST(LoaderIf, ChainOutOfRange) {
  auto p = unpack(sample());
  size_t n = find_op(*p, 0, fb::OpNode::IfNode);
  const size_t chains = p->chains.size();
  p->chains[0]->instructions[n]->op.AsIfNode()->then_chain = 9;
  expect_invalid(*p, strformat("chains[0].instructions[%zu].If.then_chain: 9 out of range (%zu chains)", n, chains));
  p = unpack(sample());
  p->chains[0]->instructions[n]->op.AsIfNode()->else_chain = static_cast<uint32_t>(chains);
  expect_invalid(*p, strformat("chains[0].instructions[%zu].If.else_chain: %zu out of range (%zu chains)", n, chains,
                               chains));
}

TEST(LoaderIf, SelfReference) {
  auto p = unpack(sample());
  p->chains[1]->instructions.push_back(if_instruction(1, 2));
  const size_t at = p->chains[1]->instructions.size() - 1;
  expect_invalid(*p,
                 strformat("chains[1].instructions[%zu].If.then_chain: 1 is the chain holding this If (cycle)", at));
}

TEST(LoaderIf, CycleThroughTwoChains) {
  auto p = unpack(sample());
  p->chains[1]->instructions.push_back(if_instruction(2, 2));  // then -> else
  p->chains[2]->instructions.push_back(if_instruction(1, 1));  // else -> then
  Status st = load_status(*p);
  EXPECT_EQ(st.code(), StatusCode::kInvalidProgram);
  EXPECT_THAT(st.message(), HasSubstr("is reached from itself (If cycle)"));
  EXPECT_THAT(st.message(), HasSubstr(".If.then_chain"));
}

// chains[i] holds one If into chains[i + 1]; the last chain is empty.
Bytes nested_program(uint32_t depth) {
  fb::ProgramT p;
  p.version = kSchemaVersion;
  for (uint32_t c = 0; c <= depth; ++c) {
    p.chains.push_back(std::make_unique<fb::ChainT>());
    if (c < depth) p.chains.back()->instructions.push_back(if_instruction(c + 1, c + 1));
  }
  return serialize_program(p);
}

TEST(LoaderIf, NestingDepthLimit) {
  // The deepest allowed nesting loads and runs: the validator and interpreter agree on the limit.
  auto ok = Program::from_bytes(nested_program(kMaxIfDepth), "deep.sbp");
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  Status run = run_once(*ok);
  EXPECT_TRUE(run.is_ok()) << run.to_string();

  Status st = load(nested_program(kMaxIfDepth + 1)).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidProgram);
  EXPECT_THAT(st.message(), HasSubstr(strformat(".If.then_chain: If nesting deeper than %u", kMaxIfDepth)));
}

// --- op semantics ------------------------------------------------------------

TEST(LoaderOps, BinaryDtypesDiffer) {
  auto p = unpack(sample());
  size_t n = find_op(*p, 0, fb::OpNode::BinaryNode);
  p->chains[0]->instructions[n]->op.AsBinaryNode()->b = tid(add_slot(*p, fb::DType::I32, {2, 4}));
  expect_invalid(*p, strformat("chains[0].instructions[%zu].Binary: dtype of a (f32) differs from b (i32)", n));
}

TEST(LoaderOps, ArgmaxOutNotI32) {
  auto p = unpack(sample());
  size_t n = find_op(*p, 0, fb::OpNode::ArgmaxNode);
  p->chains[0]->instructions[n]->op.AsArgmaxNode()->out = tid(add_slot(*p, fb::DType::F32, {2}));
  expect_invalid(*p, strformat("chains[0].instructions[%zu].Argmax.out: dtype must be i32", n));
}

TEST(LoaderOps, CastOutDtypeDiffersFromCastDtype) {
  auto p = unpack(sample());
  size_t n = find_op(*p, 0, fb::OpNode::CastNode);
  p->chains[0]->instructions[n]->op.AsCastNode()->dtype = fb::DType::BF16;
  expect_invalid(*p, strformat("chains[0].instructions[%zu].Cast.out: dtype differs from the cast's dtype", n));
  p->chains[0]->instructions[n]->op.AsCastNode()->dtype = static_cast<fb::DType>(42);
  expect_invalid(*p, strformat("chains[0].instructions[%zu].Cast.dtype: 42 unknown", n));
}

TEST(LoaderOps, MatmulOnI32) {
  auto p = unpack(sample());
  size_t n = find_op(*p, 0, fb::OpNode::MatmulNode);
  auto* mm = p->chains[0]->instructions[n]->op.AsMatmulNode();
  mm->a = tid(add_slot(*p, fb::DType::I32, {2, 4}));
  mm->b = tid(add_slot(*p, fb::DType::I32, {4, 4}));
  mm->out = tid(add_slot(*p, fb::DType::I32, {2, 4}));
  expect_invalid(*p, strformat("chains[0].instructions[%zu].Matmul.a: Matmul needs a float dtype", n));
}

// --- named slots ---------------------------------------------------------------

TEST(LoaderNames, DuplicateInputNames) {
  auto p = unpack(sample());
  auto in = std::make_unique<fb::IoSlotT>(*p->inputs[0]);
  in->idx = add_slot(*p, fb::DType::F32, {4});
  p->inputs.push_back(std::move(in));
  expect_invalid(*p, "inputs[1].name: 'x' appears twice");
}

TEST(LoaderNames, DuplicateConstantNames) {
  auto p = unpack(sample());
  auto c = std::make_unique<fb::NamedTensorT>();
  c->name = "w";
  c->tid = tid(add_slot(*p, fb::DType::F32, {4, 4}));
  p->constants.push_back(std::move(c));
  expect_invalid(*p, "constants[1].name: 'w' appears twice");
}

TEST(LoaderNames, ConstantWithDynamicShape) {
  auto p = unpack(sample());
  fb::DimT& d = *p->tensor_meta[constant_slot(*p)]->shape[0];
  d.size = -1, d.min = 1, d.max = 8;
  expect_invalid(*p, "constants[0]: 'w' must have a static shape, has [?1..8, 4]");
}

// --- weights -------------------------------------------------------------------

TEST(LoaderWeights, ConstantMissingFromTheWeightsFile) {
  std::string path = write_weights("other.safetensors", "v", DType::kF32, {4, 4});
  Status st = load(sample(), {{path}, true}).status();
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.to_string();
  EXPECT_THAT(st.message(), HasSubstr("constants[0] 'w': not in " + path));
}

TEST(LoaderWeights, NoWeightsFileGiven) {
  Status st = load(sample(), {}).status();
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.to_string();
  EXPECT_THAT(st.message(), HasSubstr("constants[0] 'w': no weights file was given"));
}

TEST(LoaderWeights, WrongDtypeOrShape) {
  std::string f16 = write_weights("f16.safetensors", "w", DType::kF16, {4, 4});
  Status st = load(sample(), {{f16}, true}).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidWeights) << st.to_string();
  EXPECT_THAT(st.message(), HasSubstr(f16 + ": tensor 'w' is f16 [4, 4], the program declares f32 [4, 4]"));

  std::string narrow = write_weights("narrow.safetensors", "w", DType::kF32, {4, 3});
  st = load(sample(), {{narrow}, true}).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidWeights) << st.to_string();
  EXPECT_THAT(st.message(), HasSubstr(narrow + ": tensor 'w' is f32 [4, 3], the program declares f32 [4, 4]"));
}

TEST(LoaderWeights, DataOffsetsPastTheEnd) {
  Bytes file = read_bytes(good_weights());
  const std::string from = "\"data_offsets\":[0,64]", to = "\"data_offsets\":[0,99]";
  auto at = std::search(file.begin(), file.end(), from.begin(), from.end());
  ASSERT_NE(at, file.end()) << "unexpected header layout";
  std::copy(to.begin(), to.end(), at);
  std::string path = temp_dir() + "/past_end.safetensors";
  write_bytes(path, file);
  Status st = load(sample(), {{path}, true}).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidWeights) << st.to_string();
  EXPECT_THAT(st.message(), HasSubstr(path + ": tensor 'w': data_offsets [0, 99] end past the data section"));
}

TEST(LoaderWeights, TruncatedOrMissingFile) {
  Bytes file = read_bytes(good_weights());
  file.resize(file.size() - 1);
  std::string path = temp_dir() + "/truncated.safetensors";
  write_bytes(path, file);
  Status st = load(sample(), {{path}, true}).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidWeights) << st.to_string();
  EXPECT_THAT(st.message(), HasSubstr(path + ": tensor 'w'"));

  std::string missing = temp_dir() + "/missing.safetensors";
  st = load(sample(), {{missing}, true}).status();
  EXPECT_EQ(st.code(), StatusCode::kIoError) << st.to_string();
  EXPECT_THAT(st.message(), HasSubstr(missing + ": cannot open"));
}

// --- execution of a valid-but-wrong program ----------------------------------

Status execute_sample(const fb::ProgramT& p) {
  SB_ASSIGN_OR_RETURN(auto prog, Program::from_bytes(serialize_program(p), "edited.sbp", {{good_weights()}, true}));
  return run_once(prog);
}

TEST(LoaderExecute, ReadsATensorNobodyWrote) {
  auto p = unpack(sample());
  size_t n = find_op(*p, 0, fb::OpNode::BinaryNode);
  auto unwritten = std::make_unique<fb::TensorMetaT>(*p->tensor_meta[input_slot(*p)]);
  uint32_t t = p->num_tensor_slots++;
  p->tensor_meta.push_back(std::move(unwritten));
  p->chains[0]->instructions[n]->op.AsBinaryNode()->a = tid(t);
  Status st = execute_sample(*p);
  EXPECT_EQ(st.code(), StatusCode::kInvalidProgram) << st.to_string();
  EXPECT_THAT(st.message(), HasSubstr(strformat("chains[0].instructions[%zu].Binary: reads tensor slot %u, which "
                                                "no executed instruction wrote", n, t)));
}

TEST(LoaderExecute, ReadsAValueNobodyWrote) {
  auto p = unpack(sample());
  size_t n = find_op(*p, 0, fb::OpNode::IntArithNode);
  uint32_t v = p->num_value_slots++;
  p->chains[0]->instructions[n]->op.AsIntArithNode()->a->vid = std::make_unique<fb::Vid>(v);
  Status st = execute_sample(*p);
  EXPECT_EQ(st.code(), StatusCode::kInvalidProgram) << st.to_string();
  EXPECT_THAT(st.message(), HasSubstr(strformat("chains[0].instructions[%zu].IntArith: reads value slot %u, which "
                                                "no executed instruction wrote", n, v)));
}

// --- fuzz seed corpus ----------------------------------------------------------

std::vector<std::string> corpus_files(const char* dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(std::string(SB_SOURCE_DIR) + "/fuzz/corpus/" + dir))
    if (e.is_regular_file()) out.push_back(e.path().string());
  return out;
}

// The committed seeds must stay loadable (and runnable, having no constants) so
// the fuzzer starts from deep inside the interpreter, not at the header checks.
TEST(FuzzCorpus, SeedFilesAreValidPrograms) {
  std::vector<std::string> files = corpus_files("program");
  EXPECT_GE(files.size(), 3u);
  for (const std::string& f : files) {
    Bytes bytes = read_bytes(f);
    EXPECT_LT(bytes.size(), 4096u) << f;
    auto prog = Program::from_bytes(bytes, f, {{}, false});
    ASSERT_TRUE(prog.is_ok()) << prog.status().to_string();
    if (!(*prog)->impl().ir->constants.empty()) continue;
    auto runnable = Program::from_bytes(bytes, f, {});
    ASSERT_TRUE(runnable.is_ok()) << runnable.status().to_string();
    Status st = run_once(*runnable);
    EXPECT_TRUE(st.is_ok()) << f << ": " << st.to_string();
  }
}

TEST(FuzzCorpus, SeedFilesAreValidSafetensors) {
  std::vector<std::string> files = corpus_files("safetensors");
  EXPECT_GE(files.size(), 2u);
  for (const std::string& f : files) {
    auto file = SafetensorsFile::open(f);
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    EXPECT_FALSE((*file)->entries().empty()) << f;
    for (const auto& [name, e] : (*file)->entries()) EXPECT_TRUE((*file)->tensor(name).is_ok()) << f << " " << name;
  }
}

}  // namespace
}  // namespace switchboard

namespace switchboard {
namespace {

// A program declaring a buffer larger than the session limit is refused before allocation.
TEST(LoaderLimits, HugeMutableBufferIsRefused) {
  ProgramBuilder b;
  TensorRef x = b.input("x", DType::kF32, {4});
  TensorRef acc = b.mutable_buffer("acc", DType::kF32, {1, int64_t{1} << 31});
  b.output("y", b.add(x, x));
  b.output("acc_shape_only", b.slice(acc, 1, 0, 4));
  auto prog = Program::from_bytes(b.serialize().value(), "huge");
  ASSERT_TRUE(prog.is_ok()) << prog.status().to_string();
  SessionOptions opts;
  opts.max_buffer_bytes = uint64_t{1} << 30;
  auto s = Session::create(*prog, opts);
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.status().code(), StatusCode::kOutOfRange);
  EXPECT_THAT(s.status().message(), ::testing::HasSubstr("mutable buffers need more than 1073741824 bytes"));
  EXPECT_THAT(s.status().message(), ::testing::HasSubstr("'acc'"));
}

}  // namespace
}  // namespace switchboard
