// Many sessions on one program at once (issue #19 item 8): a Program is shared read-only,
// each Session owns its buffers. Every thread must get the single-threaded bits on every
// device; CI also runs this under ThreadSanitizer (the tsan preset), which fails on any race.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "op_harness.h"
#include "test_util.h"
#include "switchboard/model.h"
#include "switchboard/switchboard.h"

namespace switchboard {
namespace {

namespace fs = std::filesystem;

std::shared_ptr<const Program> tiny_program() {
  static const std::shared_ptr<const Program> program = []() -> std::shared_ptr<const Program> {
    std::string tmpl = ::testing::TempDir() + "/sb_concurrency_XXXXXX";
    EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
    const fs::path out = fs::path(tmpl) / "tiny";
    Status st = testing::export_tiny_model(out.string());
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    auto p = Program::load((out / "program.sbp").string(), LoadOptions{{(out / "weights.safetensors").string()}});
    EXPECT_TRUE(p.is_ok()) << p.status().to_string();
    return p.is_ok() ? *p : nullptr;
  }();
  return program;
}

struct Outcome {
  Status status;
  std::vector<int32_t> tokens;
  std::vector<Tensor> logits;
};

// Each thread's prompt differs, so sessions sharing anything by mistake would show it.
std::vector<int32_t> prompt_of(int thread) { return {thread + 1, 7, 3 * thread + 2, 11}; }

Outcome generate_on(const std::shared_ptr<const Program>& p, const std::string& device, int thread, int rounds) {
  Outcome r;
  SessionOptions o{device};
  o.cpu_fallback = false;
  auto s = Session::create(p, o);
  if (!s.is_ok()) return Outcome{s.status(), {}, {}};
  for (int i = 0; i < rounds; ++i) {  // the same session again: reset must clear everything
    auto g = models::generate(**s, prompt_of(thread), 6, true);
    if (!g.is_ok()) return Outcome{g.status(), {}, {}};
    if (i > 0 && g->tokens != r.tokens) return Outcome{Status(StatusCode::kInternal, "a second round differs"), {}, {}};
    r.tokens = g->tokens;
    r.logits = g->logits;
  }
  return r;
}

void expect_same_bits(const Outcome& got, const Outcome& want, const std::string& what) {
  ASSERT_TRUE(got.status.is_ok()) << what << ": " << got.status.to_string();
  EXPECT_EQ(got.tokens, want.tokens) << what;
  ASSERT_EQ(got.logits.size(), want.logits.size()) << what;
  for (size_t i = 0; i < want.logits.size(); ++i)
    EXPECT_EQ(std::memcmp(got.logits[i].data(), want.logits[i].data(), want.logits[i].nbytes()), 0)
        << what << ": step " << i << " logits differ from the single-threaded run";
}

TEST(Concurrency, SessionsOnOneProgramMatchTheSingleThreadedBits) {
  constexpr int kThreads = 4;
  auto p = tiny_program();
  ASSERT_NE(p, nullptr);
  for (const std::string& dev : optest::test_devices()) {
    if (!optest::detail::open_session(p, dev)) continue;  // skipped visibly
    std::vector<Outcome> want(kThreads), got(kThreads);
    for (int t = 0; t < kThreads; ++t) want[t] = generate_on(p, dev, t, 1);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) threads.emplace_back([&, t] { got[t] = generate_on(p, dev, t, 2); });
    for (auto& th : threads) th.join();
    for (int t = 0; t < kThreads; ++t) expect_same_bits(got[t], want[t], dev + " thread " + std::to_string(t));
  }
}

// Sessions on different devices at once, on one program.
TEST(Concurrency, DevicesSideBySide) {
  auto p = tiny_program();
  ASSERT_NE(p, nullptr);
  const std::vector<std::string> devices = optest::test_devices();
  if (devices.size() < 2) {
    std::printf("[ DEVICE SKIPPED ] only the CPU is under test (SWITCHBOARD_TEST_DEVICES)\n");
    return;
  }
  std::vector<Outcome> got(devices.size());
  std::vector<std::thread> threads;
  for (size_t d = 0; d < devices.size(); ++d)
    threads.emplace_back([&, d] { got[d] = generate_on(p, devices[d], 0, 2); });
  for (auto& th : threads) th.join();
  for (size_t d = 1; d < devices.size(); ++d) expect_same_bits(got[d], got[0], devices[d] + " vs " + devices[0]);
}

}  // namespace
}  // namespace switchboard
