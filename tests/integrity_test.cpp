// Integrity of exported models (issue #19 items 5-7): the program's checksum and weights
// record, `verify`, weights read instead of mapped, a mapped file truncated under a running
// session, and the streaming writer behind exports.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fcntl.h>

#include "mapped_file.h"
#include "op_harness.h"
#include "safetensors.h"
#include "test_util.h"
#include "switchboard/builder.h"
#include "switchboard/model.h"
#include "switchboard/switchboard.h"

namespace switchboard {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  static const fs::path dir = [] {
    std::string tmpl = ::testing::TempDir() + "/sb_integrity_XXXXXX";
    EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
    return fs::path(tmpl);
  }();
  return dir / name;
}

// The tiny test model exported to `out` (4-bit; the seed fixes the weights).
fs::path export_tiny(const std::string& name, uint64_t seed = 2026) {
  const fs::path out = scratch(name);
  Status st = testing::export_tiny_model(out.string(), 4, seed);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return out;
}

Result<std::shared_ptr<const Program>> load(const fs::path& program, const fs::path& weights,
                                            LoadOptions o = {}) {
  o.weights = {weights.string()};
  return Program::load(program.string(), o);
}

void flip_byte(const fs::path& file, uint64_t offset) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

// Greedy tokens of a fresh session (empty on any error, which the test reports).
std::vector<int32_t> tokens(const std::shared_ptr<const Program>& p, const std::string& device = "cpu") {
  auto s = Session::create(p, SessionOptions{device});
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  if (!s.is_ok()) return {};
  auto g = models::generate(**s, {3, 1, 4, 1}, 5, false);
  EXPECT_TRUE(g.is_ok()) << g.status().to_string();
  return g.is_ok() ? g->tokens : std::vector<int32_t>{};
}

TEST(Integrity, ExportRecordsItsWeightsAndLoadsWithThem) {
  const fs::path out = export_tiny("ok");
  auto text = describe_program_file((out / "program.sbp").string());
  ASSERT_TRUE(text.is_ok()) << text.status().to_string();
  EXPECT_NE(text->find("format_version 2"), std::string::npos);
  EXPECT_NE(text->find("weights: exported with a file of " + std::to_string(fs::file_size(out / "weights.safetensors")) +
                       " bytes"),
            std::string::npos)
      << *text;
  LoadOptions verify;
  verify.verify_weights = true;
  auto p = load(out / "program.sbp", out / "weights.safetensors", verify);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_EQ(tokens(*p).size(), 5u);
}

// Two exports of the same shapes differ in their export id, so neither accepts the other's weights.
TEST(Integrity, ProgramRefusesTheWeightsOfAnotherExport) {
  const fs::path a = export_tiny("pair_a"), b = export_tiny("pair_b", 7);
  EXPECT_EQ(fs::file_size(a / "weights.safetensors"), fs::file_size(b / "weights.safetensors"));
  auto p = load(a / "program.sbp", b / "weights.safetensors");
  ASSERT_FALSE(p.is_ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidWeights);
  const std::string& m = p.status().message();
  EXPECT_NE(m.find((a / "program.sbp").string() + " was exported with a weights file of"), std::string::npos) << m;
  EXPECT_NE(m.find((b / "weights.safetensors").string()), std::string::npos) << m;
  EXPECT_NE(m.find("come from different exports"), std::string::npos) << m;
  // Deliberately pairing them is still possible.
  LoadOptions any;
  any.check_weights_fingerprint = false;
  auto q = load(a / "program.sbp", b / "weights.safetensors", any);
  ASSERT_TRUE(q.is_ok()) << q.status().to_string();
  EXPECT_EQ(tokens(*q).size(), 5u);
}

// A flipped byte in the data section passes the (header) fingerprint; the full hash finds it.
TEST(Integrity, VerifyFindsAFlippedWeightsByte) {
  const fs::path out = export_tiny("flip");
  const fs::path w = out / "weights.safetensors";
  flip_byte(w, fs::file_size(w) - 1000);
  EXPECT_TRUE(load(out / "program.sbp", w).is_ok());
  LoadOptions verify;
  verify.verify_weights = true;
  auto p = load(out / "program.sbp", w, verify);
  ASSERT_FALSE(p.is_ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidWeights);
  EXPECT_NE(p.status().message().find(w.string() + ": its contents hash to"), std::string::npos)
      << p.status().to_string();
  EXPECT_NE(p.status().message().find("the weights file is corrupt"), std::string::npos);
  // A flip in the header changes the fingerprint (or breaks the JSON): refused at every load.
  const fs::path out2 = export_tiny("flip_header");
  flip_byte(out2 / "weights.safetensors", 40);
  EXPECT_FALSE(load(out2 / "program.sbp", out2 / "weights.safetensors").is_ok());
}

TEST(Integrity, VerifyNeedsARecordAndAWeightsFile) {
  const fs::path out = export_tiny("norecord");
  ProgramBuilder b;
  TensorRef x = b.input("x", DType::kF32, {4});
  b.output("y", b.add(x, x));
  ASSERT_TRUE(b.save((out / "plain.sbp").string()).is_ok());
  LoadOptions verify;
  verify.verify_weights = true;
  auto p = load(out / "plain.sbp", out / "weights.safetensors", verify);
  ASSERT_FALSE(p.is_ok());
  EXPECT_EQ(p.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(p.status().message().find("records no weights checksum"), std::string::npos) << p.status().to_string();
  EXPECT_TRUE(load(out / "plain.sbp", out / "weights.safetensors").is_ok());  // no record: nothing to check
  auto none = Program::load((out / "program.sbp").string(), verify);
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument) << none.status().to_string();
}

// kRead copies the weights: truncating the file afterwards changes nothing.
TEST(Integrity, ReadWeightsAreImmuneToTheFile) {
  const fs::path out = export_tiny("read");
  auto mapped = load(out / "program.sbp", out / "weights.safetensors");
  ASSERT_TRUE(mapped.is_ok());
  const std::vector<int32_t> want = tokens(*mapped);
  LoadOptions read;
  read.weights_access = WeightsAccess::kRead;
  auto p = load(out / "program.sbp", out / "weights.safetensors", read);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  ASSERT_EQ(::truncate((out / "weights.safetensors").c_str(), 0), 0);
  for (const std::string& dev : optest::test_devices()) EXPECT_EQ(tokens(*p, dev), want) << dev;
}

// A mapped file truncated under a live session: reads past the new end fault; the session
// fails with an error naming the file instead of the process dying with SIGBUS.
TEST(Integrity, TruncatedMappedWeightsFailTheSessionNotTheProcess) {
  for (const std::string& dev : optest::test_devices()) {
    const fs::path out = export_tiny("truncate_" + dev.substr(0, dev.find(':')));
    const fs::path w = out / "weights.safetensors";
    auto p = load(out / "program.sbp", w);
    ASSERT_TRUE(p.is_ok());
    ASSERT_EQ(::truncate(w.c_str(), 4096), 0);  // only the header page remains
    auto s = Session::create(*p, SessionOptions{dev});
    Status st = s.status();
    if (s.is_ok()) st = models::generate(**s, {3, 1, 4}, 2, false).status();
    ASSERT_FALSE(st.is_ok()) << dev << ": nothing noticed the truncation";
    EXPECT_EQ(st.code(), StatusCode::kIoError) << dev << ": " << st.to_string();
    EXPECT_NE(st.message().find(w.string() + ": changed on disk"), std::string::npos) << dev << ": " << st.to_string();
    if (s.is_ok()) {  // and every later step says so too
      Status again = models::generate(**s, {3}, 1, false).status();
      EXPECT_NE(again.message().find("changed on disk"), std::string::npos) << again.to_string();
    }
  }
}

// release_pages drops only whole pages of a live file mapping (they read back from the file);
// other memory is never touched.
TEST(Integrity, ReleasedMappedPagesReadBackFromTheFile) {
  const fs::path f = fs::temp_directory_path() / ("sb_release_" + std::to_string(::getpid()));
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE)), size = 8 * page + 123;
  std::vector<uint8_t> bytes(size);
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<uint8_t>(i * 7 + 3);
  std::ofstream(f, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(size));
  const int fd = ::open(f.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  auto m = MappedFile::map(fd, size, f.string());
  ::close(fd);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  ASSERT_TRUE((*m)->guarded());
  ASSERT_EQ(std::memcmp((*m)->data(), bytes.data(), size), 0);
  // From byte 100 to the end: pages 1 .. 7 are whole inside it (page 8 holds the tail).
  EXPECT_EQ(MappedFile::release_pages((*m)->data() + 100, size - 100), 7 * page);
  EXPECT_EQ(std::memcmp((*m)->data(), bytes.data(), size), 0) << "the released pages read back";
  EXPECT_EQ(MappedFile::release_pages((*m)->data() + 10, 20), 0u) << "no whole page";
  std::vector<uint8_t> heap = bytes;
  EXPECT_EQ(MappedFile::release_pages(heap.data(), heap.size()), 0u) << "not a file mapping";
  EXPECT_EQ(heap, bytes);
  m->reset();
  fs::remove(f);
}

// Re-exporting to the same OUT replaces files by rename: a running session keeps its mapping.
TEST(Integrity, ReexportDoesNotDisturbARunningSession) {
  const fs::path out = export_tiny("reexport");
  auto p = load(out / "program.sbp", out / "weights.safetensors");
  ASSERT_TRUE(p.is_ok());
  const std::vector<int32_t> want = tokens(*p);
  auto s = Session::create(*p, SessionOptions{"cpu"});
  ASSERT_TRUE(s.is_ok());
  ASSERT_TRUE(testing::export_tiny_model(out.string(), 8, 99).is_ok());
  auto g = models::generate(**s, {3, 1, 4, 1}, 5, false);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  EXPECT_EQ(g->tokens, want);
}

// write_model holds no tensor after handing it on: the source's storage is freed at once.
TEST(Integrity, ExportStreamsTensorByTensor) {
  models::ExportFormat f;
  f.bits = 4;
  f.group_size = 64;
  const models::ModelConfig c = models::tiny_test_config();
  auto all = models::random_weights(c, f, 2026);
  ASSERT_TRUE(all.is_ok());
  size_t handed = 0, freed = 0;
  Status st = models::write_model(scratch("stream").string(), c, f, [&](const models::WeightSink& sink) -> Status {
    for (auto it = all->rbegin(); it != all->rend(); ++it) {  // reverse order: placement must not depend on it
      const Tensor& t = it->second;
      auto storage = std::shared_ptr<uint8_t[]>(new uint8_t[t.nbytes() + 1]);
      std::memcpy(storage.get(), t.data(), t.nbytes());
      std::weak_ptr<uint8_t[]> watch = storage;
      SB_RETURN_IF_ERROR(sink(it->first, Tensor::wrap(t.dtype(), t.shape(), storage, storage.get())));
      storage.reset();
      ++handed;
      freed += watch.expired();
    }
    return Status::ok();
  });
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(freed, handed);
  auto p = load(scratch("stream") / "program.sbp", scratch("stream") / "weights.safetensors");
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  auto q = load(export_tiny("stream_ref") / "program.sbp", scratch("stream_ref") / "weights.safetensors");
  ASSERT_TRUE(q.is_ok());
  EXPECT_EQ(tokens(*p), tokens(*q));
}

TEST(SafetensorsWriter, RefusesWhatWasNotDeclaredAndLeavesNoPartialFile) {
  const fs::path path = scratch("w.safetensors");
  auto a = Tensor::zeros(DType::kF32, {2, 3}), b = Tensor::zeros(DType::kBF16, {5});
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  {
    auto w = SafetensorsWriter::create(path.string(), {{"a", DType::kF32, {2, 3}}, {"b", DType::kBF16, {5}}});
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    EXPECT_NE((*w)->write("c", *a).message().find("tensor 'c' was not declared"), std::string::npos);
    EXPECT_NE((*w)->write("b", *a).message().find("tensor 'b' is f32 [2, 3], declared bf16 [5]"), std::string::npos)
        << (*w)->write("b", *a).to_string();
    ASSERT_TRUE((*w)->write("b", *b).is_ok());
    EXPECT_NE((*w)->write("b", *b).message().find("tensor 'b' given twice"), std::string::npos);
    Status st = (*w)->finish();
    EXPECT_NE(st.message().find("tensor 'a' was declared but never written"), std::string::npos) << st.to_string();
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path.string() + ".tmp"));
  auto dup = SafetensorsWriter::create(path.string(), {{"a", DType::kF32, {1}}, {"a", DType::kF32, {1}}});
  EXPECT_EQ(dup.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace switchboard
