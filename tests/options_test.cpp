// Runtime policy through the public API: the log hook and level (switchboard/log.h),
// SessionOptions' GPU fields reaching the device, and the process-wide setters.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "gpu_embedded_shaders.h"
#include "log.h"
#include "op_harness.h"
#include "switchboard/builder.h"
#include "switchboard/log.h"
#include "switchboard/switchboard.h"
#include "test_util.h"

namespace switchboard {
namespace {

struct Line {
  LogLevel level;
  std::string text;
};

// Collects what the library logs while alive; stderr and the previous level come back after.
class LogCapture {
 public:
  LogCapture() : saved_(log_level()) {
    set_log_sink([this](LogLevel level, std::string_view text) {
      std::lock_guard<std::mutex> lock(mu_);
      lines_.push_back({level, std::string(text)});
    });
  }
  ~LogCapture() {
    set_log_sink(nullptr);
    set_log_level(saved_);
  }
  std::vector<Line> take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(lines_, {});
  }
  // The captured lines containing `part`, all of them taken.
  std::vector<Line> take_matching(const std::string& part) {
    std::vector<Line> out;
    for (Line& l : take())
      if (l.text.find(part) != std::string::npos) out.push_back(std::move(l));
    return out;
  }

 private:
  LogLevel saved_;
  std::mutex mu_;
  std::vector<Line> lines_;
};

std::vector<uint8_t> neg_program_bytes() {
  ProgramBuilder b;
  b.output("y", b.neg(b.input("x", DType::kF32, {4})));
  return b.serialize().value();
}

std::shared_ptr<const Program> neg_program() {
  return Program::from_bytes(neg_program_bytes(), "options_test").value();
}

// y = -x on the session's device, as every device must give it.
void expect_runs(Session& s) {
  ASSERT_TRUE(s.set_input("x", Tensor::from_vector(DType::kF32, {4}, std::vector<float>{1, -2, 0, 3}).value()).is_ok());
  ASSERT_TRUE(s.execute().is_ok());
  EXPECT_EQ(s.output("y").value().to_doubles(), (std::vector<double>{-1, 2, -0.0, -3}));
}

bool vulkan_under_test() {
  for (const std::string& d : optest::test_devices())
    if (d.rfind("vulkan", 0) == 0) return true;
  std::printf("[ DEVICE SKIPPED ] vulkan: not in $SWITCHBOARD_TEST_DEVICES\n");
  return false;
}

// A Vulkan session with `o`, or null (with a visible skip) where Vulkan cannot be opened
// and $SWITCHBOARD_REQUIRE_VULKAN does not ask for it.
std::unique_ptr<Session> vulkan_session(SessionOptions o) {
  o.device = "vulkan";
  auto s = Session::create(neg_program(), o);
  if (s.is_ok()) return std::move(*s);
  const char* req = std::getenv("SWITCHBOARD_REQUIRE_VULKAN");
  EXPECT_FALSE(req && *req == '1') << s.status().to_string();
  std::printf("[ DEVICE SKIPPED ] vulkan: %s\n", s.status().to_string().c_str());
  return nullptr;
}

TEST(LogHook, SinkReceivesTheDeviceFallbackWarning) {
  LogCapture cap;
  set_log_level(LogLevel::kWarn);
  auto s = Session::create(neg_program(), SessionOptions{"vulkan:99", true});
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ((*s)->device_name(), "cpu");
  const std::vector<Line> lines = cap.take_matching("is unavailable");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].level, LogLevel::kWarn);
  // The text alone: no "[switchboard warning]" prefix, no newline.
  EXPECT_EQ(lines[0].text.rfind("device 'vulkan:99' is unavailable (", 0), 0u) << lines[0].text;
  EXPECT_EQ(lines[0].text.find("[switchboard"), std::string::npos) << lines[0].text;
  EXPECT_EQ(lines[0].text.find('\n'), std::string::npos) << lines[0].text;
}

TEST(LogHook, LevelsFilterAndOffSilencesEverything) {
  LogCapture cap;
  set_log_level(LogLevel::kDebug);
  EXPECT_EQ(log_level(), LogLevel::kDebug);
  ASSERT_TRUE(Program::from_bytes(neg_program_bytes(), "debug_load").is_ok());
  const std::vector<Line> loaded = cap.take_matching("loaded debug_load");
  ASSERT_EQ(loaded.size(), 1u);
  EXPECT_EQ(loaded[0].level, LogLevel::kDebug);

  set_log_level(LogLevel::kWarn);
  ASSERT_TRUE(Program::from_bytes(neg_program_bytes(), "warn_load").is_ok());
  log::warn("a warning from {}", "the test");
  std::vector<Line> lines = cap.take();
  ASSERT_EQ(lines.size(), 1u);  // the loader's debug line is dropped, the warning kept
  EXPECT_EQ(lines[0].text, "a warning from the test");

  set_log_level(LogLevel::kOff);
  EXPECT_EQ(log_level(), LogLevel::kOff);
  ASSERT_TRUE(Program::from_bytes(neg_program_bytes(), "off_load").is_ok());
  log::warn("dropped");
  log::logger().error("dropped too");
  // The fallback warning is logged once per process: this test (its own process under
  // ctest) is where it would come, and kOff drops it.
  ASSERT_TRUE(Session::create(neg_program(), SessionOptions{"vulkan:98", true}).is_ok());
  lines = cap.take();
  EXPECT_TRUE(lines.empty()) << lines.size() << " lines, first: " << lines[0].text;
}

TEST(LogHook, NullSinkSendsLinesToStderrAgain) {
  LogLevel saved = log_level();
  set_log_level(LogLevel::kWarn);
  int calls = 0;
  set_log_sink([&](LogLevel, std::string_view) { ++calls; });
  log::warn("to the sink");
  set_log_sink(nullptr);
  ::testing::internal::CaptureStderr();
  log::warn("to stderr");
  const std::string err = ::testing::internal::GetCapturedStderr();
  set_log_level(saved);
  EXPECT_EQ(calls, 1);
  EXPECT_NE(err.find("[switchboard warning] to stderr"), std::string::npos) << err;
}

TEST(SessionOptionsTest, GpuFieldsAreAcceptedOnTheCpu) {
  SessionOptions o{"cpu"};
  o.gpu_int8_mma = false;
  o.gpu_int_dot = false;
  o.gpu_handoff = false;
  o.gpu_specialize = false;
  o.pipeline_stats = true;
  o.spirv_dir = "/nonexistent";
  auto s = Session::create(neg_program(), o);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ((*s)->device_description(), "cpu");
  expect_runs(**s);
}

TEST(SessionOptionsTest, GpuIntDotReachesTheVulkanDevice) {
  if (!vulkan_under_test()) return;
  SessionOptions on, off;
  on.gpu_int_dot = true;  // overrides $SWITCHBOARD_GPU_DOT either way
  off.gpu_int_dot = false;
  off.gpu_int8_mma = false;
  std::unique_ptr<Session> a = vulkan_session(on), b = vulkan_session(off);
  if (!a || !b) return;
  const std::string& with = a->device_description();
  const std::string& without = b->device_description();
  // lavapipe (CI) has VK_KHR_shader_integer_dot_product; other devices say what they have.
  if (with.find("llvmpipe") != std::string::npos) {
    EXPECT_NE(with.find(", int8 dot products"), std::string::npos) << with;
  }
  EXPECT_EQ(without.find("int8 dot products"), std::string::npos) << without;
  EXPECT_EQ(without.find("int8 cooperative matrices"), std::string::npos) << without;
  expect_runs(*a);
  expect_runs(*b);
}

TEST(SessionOptionsTest, SpirvDirReplacesAKernelOnVulkanPerSession) {
  if (!vulkan_under_test()) return;
  const gpu::EmbeddedKernel* k = gpu::find_embedded_kernel("unary");
  ASSERT_NE(k, nullptr);
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "sb_options_test_spirv";
  std::filesystem::create_directories(dir);
  FILE* f = std::fopen((dir / "unary.spv").c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(std::fwrite(k->spirv, 4, k->spirv_words, f), k->spirv_words);
  std::fclose(f);
  LogCapture cap;
  set_log_level(LogLevel::kWarn);
  SessionOptions with, without;
  with.spirv_dir = dir.string();
  without.spirv_dir = "";  // none, whatever $SWITCHBOARD_SPIRV_DIR says
  for (const SessionOptions* o : {&with, &without, &with}) {
    std::unique_ptr<Session> s = vulkan_session(*o);
    if (!s) return;
    expect_runs(*s);
    // One line per pipeline built from the file (a kernel may have several specializations).
    const size_t n = cap.take_matching("kernel unary from " + (dir / "unary.spv").string()).size();
    if (o == &with) {
      EXPECT_GE(n, 1u);
    }
    if (o == &without) {
      EXPECT_EQ(n, 0u);
    }
  }
  set_log_level(LogLevel::kOff);  // the same override, silenced
  std::unique_ptr<Session> s = vulkan_session(with);
  ASSERT_NE(s, nullptr);
  expect_runs(*s);
  EXPECT_TRUE(cap.take().empty());
}

// gpu_repeat (profiling): the named kernel's dispatches recorded twice, the results unchanged,
// and a warning says so; "" repeats nothing whatever $SWITCHBOARD_GPU_REPEAT says.
TEST(SessionOptionsTest, GpuRepeatRecordsANamedKernelTwice) {
  if (!vulkan_under_test()) return;
  LogCapture cap;
  set_log_level(LogLevel::kWarn);
  SessionOptions once, twice;
  once.gpu_repeat = "";
  twice.gpu_repeat = "cast,unary";
  uint64_t dispatches[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    std::unique_ptr<Session> s = vulkan_session(i == 0 ? once : twice);
    if (!s) return;
    const uint64_t before = s->device_dispatches();
    expect_runs(*s);
    dispatches[i] = s->device_dispatches() - before;
    EXPECT_EQ(cap.take_matching("recorded twice").size(), i == 0 ? 0u : 1u);
  }
  set_log_level(LogLevel::kOff);
  EXPECT_EQ(dispatches[1], 2 * dispatches[0]);
  EXPECT_GE(dispatches[0], 1u);
}

// gpu_timeline (profiling): with kernels built by bench/gpu_timeline.sh, every workgroup's
// thread 0 stamps its start and its end; the file holds them once the session's device closes,
// and the results are unchanged.
TEST(SessionOptionsTest, GpuTimelineStampsEachWorkgroup) {
  if (!vulkan_under_test()) return;
  namespace fs = std::filesystem;
  const fs::path dir = testing::process_scratch("sb_timeline", "kernels"), file = testing::process_scratch("sb_timeline", "stamps");
  const std::string build = "bash " SB_SOURCE_DIR "/bench/gpu_timeline.sh " + dir.string() + " unary > /dev/null";
  ASSERT_EQ(std::system(build.c_str()), 0) << build;
  unsigned kid = 0;
  char name[64] = {};
  FILE* ids = std::fopen((dir / "timeline_ids.txt").c_str(), "r");
  ASSERT_NE(ids, nullptr);
  ASSERT_EQ(std::fscanf(ids, "%u %63s", &kid, name), 2);
  std::fclose(ids);
  EXPECT_STREQ(name, "unary");
  SessionOptions o;
  o.spirv_dir = dir.string();
  o.gpu_timeline = file.string();
  {
    std::unique_ptr<Session> s = vulkan_session(o);
    if (!s) return;
    expect_runs(*s);
    expect_runs(*s);
  }
  std::vector<uint32_t> w(fs::exists(file) ? fs::file_size(file) / 4 : 0);
  FILE* f = std::fopen(file.c_str(), "rb");
  ASSERT_NE(f, nullptr) << file;
  ASSERT_EQ(std::fread(w.data(), 4, w.size(), f), w.size());
  std::fclose(f);
  ASSERT_GE(w.size(), 8u);
  ASSERT_EQ(w.size(), 8 + 8 * size_t{w[0]});
  ASSERT_GE(w[0], 4u);  // two executions, each a start and an end of at least one workgroup
  size_t phase[2] = {0, 0};
  for (size_t i = 8; i < w.size(); i += 8) {
    if ((w[i] & 0xFFFFu) != kid) continue;  // the probes' kernels were not rebuilt: only unary stamps
    ++phase[w[i] >> 16];
    EXPECT_LT(w[i + 1], w[i + 2]) << "workgroup within the dispatch's count";
  }
  EXPECT_GE(phase[0], 2u);
  EXPECT_EQ(phase[0], phase[1]);
  fs::remove_all(dir.parent_path());
}

TEST(ProcessSettings, CpuPathLimit) {
  const std::string initial = cpu_isa();
  EXPECT_EQ(set_cpu_path_limit("avx9").code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(set_cpu_path_limit("portable").is_ok());
  EXPECT_STREQ(cpu_isa(), "portable");
  auto s = Session::create(neg_program());
  ASSERT_TRUE(s.is_ok());
  expect_runs(**s);
  ASSERT_TRUE(set_cpu_path_limit("amx").is_ok());  // no cap: the best path this CPU has
  if (!std::getenv("SWITCHBOARD_CPU_PATH")) {
    EXPECT_EQ(cpu_isa(), initial);
  }
}

TEST(ProcessSettings, BufferPoolAndThreads) {
  if (!std::getenv("SWITCHBOARD_BUFFER_POOL_MB")) {
    EXPECT_EQ(buffer_pool_bytes(), uint64_t{1} << 30);
  }
  const uint64_t pool = buffer_pool_bytes();
  // Cache a large buffer, then lower the bound under it: the pool frees what it holds.
  {
    auto t = Tensor::zeros(DType::kF32, {1 << 20});
    ASSERT_TRUE(t.is_ok());
  }
  set_buffer_pool_bytes(0);
  EXPECT_EQ(buffer_pool_bytes(), 0u);
  {
    auto t = Tensor::zeros(DType::kF32, {1 << 20});
    ASSERT_TRUE(t.is_ok());
  }
  set_buffer_pool_bytes(pool);
  EXPECT_EQ(buffer_pool_bytes(), pool);

  const int threads = cpu_threads();
  set_cpu_threads(2);
  EXPECT_EQ(cpu_threads(), 2);
  auto s = Session::create(neg_program());
  ASSERT_TRUE(s.is_ok());
  expect_runs(**s);
  set_cpu_threads(threads);
  EXPECT_EQ(cpu_threads(), threads);
}

}  // namespace
}  // namespace switchboard
