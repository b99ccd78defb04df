// A session's options and repeated prompts keep the bits (and, on the CPU, the allocations):
// the tiny models' generations compared bit for bit across GPU syncs between ops, specialized
// and generic kernels, and second prompts.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "op_harness.h"
#include "switchboard/model.h"
#include "test_util.h"

namespace switchboard {
namespace {

namespace fs = std::filesystem;
using optest::test_devices;

fs::path scratch(const std::string& name) { return testing::process_scratch("sb_session_bits_test", name); }

// The tiny 4-bit model of `family` ("" for the default) exported to scratch(name) and loaded.
Result<std::shared_ptr<const Program>> tiny_program(const std::string& name, const std::string& family) {
  const fs::path out = scratch(name);
  SB_RETURN_IF_ERROR(testing::export_tiny_model(out.string(), 4, 2026, family));
  return Program::load((out / "program.sbp").string(), LoadOptions{{(out / "weights.safetensors").string()}});
}

// A prompt (by default the tiny one: nine tokens, four more generated) in session s, its
// tokens and every step's logits kept in *runs.
void tiny_prompt(Session& s, std::vector<models::Generation>* runs,
                 const std::vector<int32_t>& prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9}, int64_t new_tokens = 4) {
  auto g = models::generate(s, prompt, new_tokens, true, nullptr);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  runs->push_back(std::move(g).value());
}

// Every run's tokens and every step's logits are run 0's, bit for bit.
void expect_same_bits(const std::vector<models::Generation>& runs, const std::string& dev) {
  for (size_t r = 1; r < runs.size(); ++r) {
    EXPECT_EQ(runs[0].tokens, runs[r].tokens) << dev << " run " << r;
    ASSERT_EQ(runs[0].logits.size(), runs[r].logits.size()) << dev << " run " << r;
    for (size_t i = 0; i < runs[0].logits.size(); ++i)
      EXPECT_EQ(std::memcmp(runs[0].logits[i].data(), runs[r].logits[i].data(), runs[0].logits[i].nbytes()), 0)
          << dev << " run " << r << " step " << i;
  }
}

// A GPU session that may allocate next to nothing before the queued work must finish (so the
// interpreter syncs between every two ops, as a long prefill does past its budget) gives the
// bits of one that never syncs mid-execution, and so does a second prompt in the same session.
TEST(TinyTest, SyncsBetweenOpsGiveTheSameBits) {
  auto program = tiny_program("tiny35_flush", "qwen3_5_moe");
  ASSERT_TRUE(program.is_ok()) << program.status().to_string();
  for (const std::string& dev : test_devices()) {
    if (dev == "cpu") continue;
    std::vector<models::Generation> runs;
    for (uint64_t flush : {uint64_t{0}, uint64_t{1}}) {
      SessionOptions o{dev};
      o.gpu_flush_bytes = flush;
      auto s = Session::create(*program, o);
      ASSERT_TRUE(s.is_ok()) << s.status().to_string();
      ASSERT_NO_FATAL_FAILURE(tiny_prompt(**s, &runs));
      if (flush == 0) continue;
      // The same session again: the reset zeroes the caches and the linear-attention states on
      // the device (a state left over would change every step).
      for (int r = 0; r < 2; ++r)  // the second time, the buffers the first prompt wrote come back
        ASSERT_NO_FATAL_FAILURE(tiny_prompt(**s, &runs));
    }
    expect_same_bits(runs, dev);
  }
}

// Kernels built for their dispatch's dtypes (specialization constants) give the bits of the
// generic build, where the push constants pick the path (what Metal runs), and so do decode
// kernels with no handoff (barriers between router, gate/up and down; a separate Combine:
// Metal's paths too), for both families.
TEST(TinyTest, SpecializedKernelsGiveTheGenericBits) {
  for (const std::string family : {"", "qwen3_5_moe"}) {
    SCOPED_TRACE("tiny " + family);
    auto program = tiny_program("tiny_spec" + family, family);
    ASSERT_TRUE(program.is_ok()) << program.status().to_string();
    for (const std::string& dev : test_devices()) {
      if (dev == "cpu") continue;
      std::vector<models::Generation> runs;
      for (int form = 0; form < 3; ++form) {  // as is, generic, no handoff
        SessionOptions o{dev};
        o.gpu_specialize = form != 1;
        o.gpu_handoff = form != 2;
        auto s = Session::create(*program, o);
        ASSERT_TRUE(s.is_ok()) << s.status().to_string();
        ASSERT_NO_FATAL_FAILURE(tiny_prompt(**s, &runs));
      }
      expect_same_bits(runs, dev);
    }
  }
}

// Decode steps past the first key blocks (a 70-token prompt: several attention blocks and
// splits a step, which the short prompts above never reach): the tokens and every step's
// logits are the CPU's, bit for bit, on every device.
TEST(TinyTest, DecodeAfterALongPromptGivesTheCpuBits) {
  auto program = tiny_program("tiny_long", "");
  ASSERT_TRUE(program.is_ok()) << program.status().to_string();
  std::vector<int32_t> prompt(70);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(1 + (i * 37) % 200);
  std::vector<models::Generation> runs;
  std::string devices;
  for (const std::string& dev : test_devices()) {
    auto s = Session::create(*program, SessionOptions{dev});
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    ASSERT_NO_FATAL_FAILURE(tiny_prompt(**s, &runs, prompt, 5)) << dev;
    devices += dev + " ";
  }
  expect_same_bits(runs, devices);
}

// The CPU's steady state takes no memory from the system allocator: a second prompt of the same
// length and its decode steps reuse the buffers the first one freed (issue #20 item 5).
TEST(TinyTest, RepeatedDecodeStepsAllocateNothingOnTheCpu) {
  for (const std::string family : {"", "qwen3_5_moe"}) {
    SCOPED_TRACE("tiny " + family);
    auto program = tiny_program("tiny_alloc" + family, family);
    ASSERT_TRUE(program.is_ok()) << program.status().to_string();
    auto s = Session::create(*program, SessionOptions{"cpu"});
    ASSERT_TRUE(s.is_ok());
    auto first = models::generate(**s, {1, 2, 3, 4, 5}, 8, false, nullptr);
    ASSERT_TRUE(first.is_ok()) << first.status().to_string();
    const uint64_t before = buffer_allocations();
    auto again = models::generate(**s, {5, 4, 3, 2, 1}, 8, false, nullptr);
    ASSERT_TRUE(again.is_ok()) << again.status().to_string();
    EXPECT_EQ(again->decode_allocations, 0u);
    EXPECT_EQ(buffer_allocations() - before, 0u) << "the prefill too";
  }
}

}  // namespace
}  // namespace switchboard
