// Hostile files and values (issue #19): each input a probe of the CLI found crashing or
// hanging gets a clean error naming the file, and a test here. A hang fails by ctest's
// timeout; a crash fails the test binary.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "file_io.h"
#include "no_throw.h"
#include "safetensors.h"
#include "test_util.h"
#include "switchboard/builder.h"
#include "switchboard/model.h"
#include "switchboard/switchboard.h"

namespace switchboard {
namespace {

std::string temp_dir() {
  static const std::string dir = [] {
    std::string tmpl = ::testing::TempDir() + "/sb_hostile_XXXXXX";
    EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
    return tmpl;
  }();
  return dir;
}

// A FIFO nobody writes to: opening it for reading blocks unless the reader refuses it first.
std::string fifo(const std::string& name) {
  const std::string path = temp_dir() + "/" + name;
  EXPECT_EQ(mkfifo(path.c_str(), 0600), 0) << path;
  return path;
}

std::string deep_json(const std::string& key, int depth) {
  return "{\"model_type\": \"qwen3_moe\", \"" + key + "\": " + std::string(static_cast<size_t>(depth), '[') +
         std::string(static_cast<size_t>(depth), ']') + "}";
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

void expect_error(const Status& st, const std::string& needle) {
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.to_string();
  EXPECT_LT(st.message().size(), 400u) << "the message echoes too much";
}

TEST(HostileInput, DeeplyNestedConfigValuesAreRefusedBeforeParsing) {
  for (const char* key : {"hidden_size", "mlp_only_layers"})
    expect_error(models::parse_hf_config_text(deep_json(key, 100000), "deep/config.json").status(),
                 "deep/config.json: JSON nested deeper than 64 levels");
  // Brackets inside strings do not count.
  const std::string in_string = "{\"model_type\": \"" + std::string(1000, '[') + "\"}";
  expect_error(models::parse_hf_config_text(in_string, "s/config.json").status(), "s/config.json: vocab_size");
}

TEST(HostileInput, DeeplyNestedBitMapIsRefused) {
  models::ExportFormat f;
  expect_error(models::parse_bit_map(std::string(100000, '[') + std::string(100000, ']'), "map.json", &f),
               "map.json: JSON nested deeper than 64 levels");
}

TEST(HostileInput, EchoedValuesAreClipped) {
  const std::string big = "{\"model_type\": \"qwen3_moe\", \"vocab_size\": \"" + std::string(10 << 20, 'x') + "\"}";
  expect_error(models::parse_hf_config_text(big, "big/config.json").status(), "big/config.json: vocab_size: must be");
}

TEST(HostileInput, FifosAreRefusedWithoutBlocking) {
  expect_error(Program::load(fifo("program.sbp")).status(), "not a regular file");
  expect_error(models::parse_hf_config(fifo("config.json")).status(), "not a regular file");
  expect_error(SafetensorsFile::open(fifo("weights.safetensors")).status(), "not a regular file");
  models::ExportFormat f;
  expect_error(models::read_bit_map(fifo("map.json"), &f), "not a regular file");
}

TEST(HostileInput, DevicesAndDirectoriesAreNotPrograms) {
  expect_error(Program::load("/dev/zero").status(), "program /dev/zero: not a regular file");
  expect_error(Program::load(temp_dir()).status(), "not a regular file");
  expect_error(Program::load("").status(), "empty path");
}

TEST(HostileInput, ConfigErrorsNameTheFileAndWhatSetTheValue) {
  models::ModelConfig c = models::tiny_test_config();
  c.origin = "y/config.json";
  c.vocab = -1;
  expect_error(models::check_config(c), "y/config.json: vocab_size must be positive");
  c = models::tiny_test_config();
  c.expert_ffn = 96;
  models::ExportFormat f;
  f.bits = 4;
  f.group_size = 64;
  expect_error(models::check_format(c, f), "--group-size 64 does not divide the input width 96");
  f.quant_origin = "x/config.json";  // set by the checkpoint's "quantization", not by a flag
  expect_error(models::check_format(c, f), "x/config.json: quantization.group_size 64 does not divide");
}

TEST(HostileInput, ExceptionsBecomeErrorValues) {
  Status oom = no_throw("load x", []() -> Status { throw std::bad_alloc(); });
  EXPECT_EQ(oom.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(oom.message(), "load x: out of memory");
  Result<int> other = no_throw("parse y", []() -> Result<int> { throw std::runtime_error("bad thing"); });
  EXPECT_EQ(other.status().code(), StatusCode::kInternal);
  EXPECT_EQ(other.status().message(), "parse y: bad thing");
}

TEST(HostileInput, BufferClaimsBeyondTheMachinesMemoryFailBeforeAllocating) {
  ProgramBuilder b;
  TensorRef big = b.mutable_buffer("huge_cache", DType::kF32, {int64_t{1} << 18, int64_t{1} << 20});  // 1 TiB
  b.output("y", b.add(b.input("x", DType::kF32, {1}), b.slice(b.reshape(big, {-1}), 0, 0, 1)));
  auto bytes = b.serialize();
  ASSERT_TRUE(bytes.is_ok()) << bytes.status().to_string();
  auto program = Program::from_bytes(std::move(bytes).value(), "huge.sbp");
  ASSERT_TRUE(program.is_ok()) << program.status().to_string();
  // Past the option's cap, the device's memory still bounds the claim: the CPU's free host
  // memory, a GPU's heap (lavapipe in CI, where SWITCHBOARD_TEST_DEVICES names vulkan).
  std::vector<std::string> devices = {"cpu"};
  const char* more = std::getenv("SWITCHBOARD_TEST_DEVICES");
  if (more && std::string(more).find("vulkan") != std::string::npos) devices.push_back("vulkan");
  for (const std::string& device : devices) {
    SessionOptions o;
    o.device = device;
    o.max_buffer_bytes = UINT64_MAX;
    auto s = Session::create(*program, o);
    expect_error(s.status(), "huge.sbp: mutable buffers need more than");
    EXPECT_NE(s.status().message().find("(the memory of device '" + device + "'), reached at 'huge_cache'"),
              std::string::npos)
        << s.status().to_string();
  }
}

// --- exports: atomic per OUT, never deleting what the run did not create ----------------

Status export_tiny(const std::string& out, int bits) { return testing::export_tiny_model(out, bits); }

std::string slurp(const std::string& path) {
  auto text = read_text_file(path, 1 << 30, "test");
  return text ? *text : std::string("<unreadable>");
}

TEST(HostileExport, LeavesOtherRunsStagingDirectoriesAlone) {
  const std::string out = temp_dir() + "/stale";
  for (const std::string& dir : {out + ".partial", out + ".partial-keep"}) {
    ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
    write_text(dir + "/mine.txt", "user data");
  }
  ASSERT_TRUE(export_tiny(out, 4).is_ok());
  EXPECT_EQ(slurp(out + ".partial/mine.txt"), "user data");
  EXPECT_EQ(slurp(out + ".partial-keep/mine.txt"), "user data");
  EXPECT_TRUE(Program::load(out + "/program.sbp", LoadOptions{{out + "/weights.safetensors"}}).is_ok());
}

TEST(HostileExport, AProgramPathThatIsADirectoryChangesNothing) {
  const std::string out = temp_dir() + "/blocked";
  ASSERT_EQ(::mkdir(out.c_str(), 0700), 0);
  ASSERT_EQ(::mkdir((out + "/program.sbp").c_str(), 0700), 0);
  write_text(out + "/program.sbp/keep.txt", "x");
  write_text(out + "/weights.safetensors", "old weights");
  expect_error(export_tiny(out, 4), "program.sbp: exists and is not a regular file");
  EXPECT_EQ(slurp(out + "/weights.safetensors"), "old weights");
}

TEST(HostileExport, ConcurrentExportsNeverPairFilesOfTwoRuns) {
  const std::string out = temp_dir() + "/race";
  ASSERT_TRUE(export_tiny(out, 4).is_ok());  // OUT exists: the exports below replace its files
  std::vector<Status> results(4);
  std::vector<std::thread> runs;
  // 4-bit and 8-bit programs need differently shaped weights: a mixed pair cannot load.
  for (size_t i = 0; i < results.size(); ++i) runs.emplace_back([&, i] { results[i] = export_tiny(out, i % 2 ? 8 : 4); });
  for (auto& r : runs) r.join();
  for (const Status& st : results)
    EXPECT_TRUE(st.is_ok() || st.code() == StatusCode::kFailedPrecondition) << st.to_string();
  auto p = Program::load(out + "/program.sbp", LoadOptions{{out + "/weights.safetensors"}});
  EXPECT_TRUE(p.is_ok()) << p.status().to_string();
}

// OUT given as ".", as a symlink to a directory, or with a name too long for a sibling
// staging directory: each lands (the probe of the CLI found all three refused).
TEST(HostileExport, OutputsNamedAnyWayLand) {
  auto loads = [](const std::string& out) {
    return Program::load(out + "/program.sbp", LoadOptions{{out + "/weights.safetensors"}}).is_ok();
  };
  const std::string here = temp_dir() + "/here";
  ASSERT_EQ(::mkdir(here.c_str(), 0700), 0);
  char cwd[4096];
  ASSERT_NE(::getcwd(cwd, sizeof cwd), nullptr);
  ASSERT_EQ(::chdir(here.c_str()), 0);
  Status dot = export_tiny(".", 4);
  ASSERT_EQ(::chdir(cwd), 0);
  EXPECT_TRUE(dot.is_ok()) << dot.to_string();
  EXPECT_TRUE(loads(here));
  const std::string target = temp_dir() + "/target", link = temp_dir() + "/link";
  ASSERT_EQ(::mkdir(target.c_str(), 0700), 0);
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  Status via_link = export_tiny(link, 4);
  EXPECT_TRUE(via_link.is_ok()) << via_link.to_string();
  EXPECT_TRUE(loads(target));
  const std::string long_name = temp_dir() + "/" + std::string(250, 'n');
  Status long_out = export_tiny(long_name, 4);
  EXPECT_TRUE(long_out.is_ok()) << long_out.to_string();
  EXPECT_TRUE(loads(long_name));
}

TEST(HostileExport, AnEmptyOutputPathIsAClearError) { expect_error(export_tiny("", 4), "output directory: empty path"); }

}  // namespace
}  // namespace switchboard
