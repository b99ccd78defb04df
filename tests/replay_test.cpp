// Recorded decode steps (SessionOptions::gpu_replay): on a device that records, the third
// decode step on is a replay of the second's work (every decode step of later prompts, a reset
// between them or not), and every step's logits are the bits of the CPU and of the same device
// without replay. Replays and resets never overwrite what a caller holds, and inputs a
// recording cannot serve (another position range) run normally.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>

#include "op_harness.h"
#include "test_util.h"
#include "switchboard/model.h"

namespace switchboard {
namespace {

namespace fs = std::filesystem;
using optest::test_devices;

// The tiny test model, or (family "qwen3_5_moe") the tiny hybrid, whose Gated DeltaNet layers
// keep conv and recurrent states that a replay must carry from step to step.
std::shared_ptr<const Program> tiny_program(const std::string& family = "") {
  const fs::path out = fs::temp_directory_path() / ("sb_replay_test_" + family + std::to_string(::getpid()));
  fs::remove_all(out);
  EXPECT_TRUE(testing::export_tiny_model(out.string(), 4, 2026, family).is_ok());
  auto p = Program::load((out / "program.sbp").string(), LoadOptions{{(out / "weights.safetensors").string()}});
  EXPECT_TRUE(p.is_ok()) << p.status().to_string();
  return p.is_ok() ? std::move(p).value() : nullptr;
}

std::unique_ptr<Session> open(const std::shared_ptr<const Program>& p, const std::string& dev, bool replay) {
  SessionOptions o{dev};
  o.gpu_replay = replay;
  auto s = Session::create(p, o);
  if (!s.is_ok()) {
    std::printf("[ DEVICE SKIPPED ] %s: %s\n", dev.c_str(), s.status().to_string().c_str());
    return nullptr;
  }
  return std::move(s).value();
}

struct Step {
  Status status;
  Tensor logits;  // a copy
  int32_t next = -1;
  bool replayed = false;
};

Step run(Session& s, const std::vector<int32_t>& tokens, int64_t pos) {
  Step r;
  r.status =
      s.set_input("tokens", Tensor::from_vector(DType::kI32, {static_cast<int64_t>(tokens.size())}, tokens).value());
  if (r.status.is_ok()) r.status = s.set_input_value("pos", pos);
  if (r.status.is_ok()) r.status = s.execute();
  r.replayed = s.last_execute_replayed();
  if (!r.status.is_ok()) return r;
  r.logits = s.output("logits").value().clone();
  r.next = s.output("next_token").value().data_as<int32_t>()[0];
  return r;
}

// Prefill of 5, then `steps` greedy decode steps.
std::vector<Step> generate(Session& s, int steps) {
  std::vector<Step> out;
  std::vector<int32_t> feed = {3, 1, 4, 1, 5};
  int64_t pos = 0;
  for (int i = 0; i <= steps; ++i) {
    out.push_back(run(s, feed, pos));
    if (!out.back().status.is_ok()) break;
    pos += static_cast<int64_t>(feed.size());
    feed = {out.back().next};
  }
  return out;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

TEST(Replay, DecodeStepsReplayWithTheBitsOfEveryRun) {
  for (const std::string family : {"", "qwen3_5_moe"}) {
    SCOPED_TRACE("tiny " + family);
    auto p = tiny_program(family);
    ASSERT_TRUE(p);
    auto cpu = open(p, "cpu", true);
    ASSERT_TRUE(cpu);
    const std::vector<Step> want = generate(*cpu, 12);
    for (const Step& st : want) ASSERT_FALSE(st.replayed) << "the CPU records nothing";
    for (const std::string& dev : test_devices()) {
      if (dev == "cpu") continue;
      SCOPED_TRACE(dev);
      for (bool replay : {true, false}) {
        auto s = open(p, dev, replay);
        if (!s) continue;
        // Three times on one session: the second sequence starts at position 0 (fresh states)
        // and replays the first one's recording; so does the third, after a reset (the buffers
        // zeroed in place keep the recording).
        for (int pass = 0; pass < 3; ++pass) {
          if (pass == 2) {
            ASSERT_TRUE(s->reset().is_ok());
          }
          const std::vector<Step> got = generate(*s, 12);
          ASSERT_EQ(got.size(), want.size());
          for (size_t i = 0; i < got.size(); ++i) {
            ASSERT_TRUE(got[i].status.is_ok()) << got[i].status.to_string();
            EXPECT_TRUE(same_bits(got[i].logits, want[i].logits))
                << "pass " << pass << " step " << i << " replay " << replay;
            // Prefill, the first decode step (new shapes), the recorded one; then replays.
            EXPECT_EQ(got[i].replayed, replay && (pass > 0 ? i >= 1 : i >= 3)) << "pass " << pass << " step " << i;
          }
        }
      }
    }
  }
}

// body on a replaying session of the tiny model on each GPU test device.
void on_gpu_sessions(const std::function<void(Session&)>& body) {
  auto p = tiny_program();
  ASSERT_TRUE(p);
  for (const std::string& dev : test_devices()) {
    if (dev == "cpu") continue;
    SCOPED_TRACE(dev);
    auto s = open(p, dev, true);
    if (s) body(*s);
  }
}

// body on a session of each GPU test device after a prompt and `steps` decode steps (the last
// one a replay).
void after_replays(int steps, const std::function<void(Session&, const std::vector<Step>&)>& body) {
  on_gpu_sessions([&](Session& s) {
    const std::vector<Step> done = generate(s, steps);
    ASSERT_TRUE(done.back().replayed);
    body(s, done);
  });
}

TEST(Replay, HeldTensorsAreNeverOverwritten) {
  after_replays(4, [](Session& session, const std::vector<Step>& steps) {
    Session* s = &session;
    int64_t pos = 5 + 4;
    // An output the caller holds: the next step runs normally and leaves it alone.
    Tensor held = s->output("logits").value();
    const Tensor copy = held.clone();
    Step a = run(*s, {steps.back().next}, pos++);
    ASSERT_TRUE(a.status.is_ok()) << a.status.to_string();
    EXPECT_FALSE(a.replayed);
    EXPECT_TRUE(same_bits(held, copy));
    held = Tensor();
    // A mutable buffer the caller holds: the same.
    Tensor cache = s->mutable_buffer("layers.0.k_cache").value();
    const Tensor cache_copy = cache.clone();
    Step b = run(*s, {a.next}, pos++);
    ASSERT_TRUE(b.status.is_ok()) << b.status.to_string();
    EXPECT_FALSE(b.replayed);
    EXPECT_TRUE(same_bits(cache, cache_copy));
    cache = Tensor();
    // Released: replays resume (the recording still holds, or a new one is made).
    Step c = run(*s, {b.next}, pos++);
    Step d = run(*s, {c.next}, pos++);
    ASSERT_TRUE(c.status.is_ok() && d.status.is_ok());
    EXPECT_TRUE(d.replayed);
  });
}

// A reset zeroes the caches in place (keeping the recording) only where nobody holds them: a
// cache the caller took keeps its contents, and the session's fresh one is zero.
TEST(Replay, AResetZeroesTheCachesInPlace) {
  after_replays(4, [](Session& s, const std::vector<Step>&) {
    const void* before = s.mutable_buffer("layers.0.k_cache").value().data();
    ASSERT_TRUE(s.reset().is_ok());
    const Tensor cache = s.mutable_buffer("layers.0.k_cache").value();
    EXPECT_EQ(cache.data(), before);
    for (double v : cache.to_doubles()) ASSERT_EQ(v, 0.0);
  });
}

TEST(Replay, AResetLeavesAHeldCacheAlone) {
  after_replays(4, [](Session& s, const std::vector<Step>&) {
    Tensor cache = s.mutable_buffer("layers.0.k_cache").value();
    const Tensor copy = cache.clone();
    ASSERT_TRUE(s.reset().is_ok());
    EXPECT_TRUE(same_bits(cache, copy));
    const Tensor fresh = s.mutable_buffer("layers.0.k_cache").value();
    EXPECT_NE(fresh.data(), cache.data());
    for (double v : fresh.to_doubles()) ASSERT_EQ(v, 0.0);
  });
}

// A step that cannot replay (two new tokens: other shapes) writes the caches in place: the
// recording's hold on them is no reason to copy them.
TEST(Replay, StepsBesideARecordingUpdateTheCachesInPlace) {
  after_replays(4, [](Session& s, const std::vector<Step>& steps) {
    const void* before = s.mutable_buffer("layers.0.k_cache").value().data();
    Step two = run(s, {steps.back().next, 7}, 5 + 4);
    ASSERT_TRUE(two.status.is_ok()) << two.status.to_string();
    EXPECT_FALSE(two.replayed);
    EXPECT_EQ(s.mutable_buffer("layers.0.k_cache").value().data(), before) << "the cache was copied";
  });
}

// A buffer assigned a new value each step (out of place: its storage changes during the step)
// is never replayed from a stale recording: every step is the CPU's.
TEST(Replay, ABufferAssignedOutOfPlaceKeepsEveryStepExact) {
  ProgramBuilder b;
  TensorRef state = b.mutable_buffer("state", DType::kF32, {4});
  TensorRef x = b.input("x", DType::kF32, {4});
  TensorRef next = b.add(state, x);
  b.assign(state, next);
  b.output("y", b.mul(next, b.full({1}, DType::kF32, 2.0)));
  auto program = Program::from_bytes(b.serialize().value(), "assign");
  ASSERT_TRUE(program.is_ok()) << program.status().to_string();
  for (const std::string& dev : test_devices()) {
    SCOPED_TRACE(dev);
    auto s = open(*program, dev, true);
    if (!s) continue;
    for (int step = 1; step <= 6; ++step) {
      ASSERT_TRUE(s->set_input("x", Tensor::from_vector(DType::kF32, {4}, std::vector<float>{1, 2, 3, 4}).value()).is_ok());
      ASSERT_TRUE(s->execute().is_ok());
      const float* y = s->output("y").value().data_as<float>();
      EXPECT_EQ(y[3], 8.0f * static_cast<float>(step)) << "step " << step;
    }
  }
}

TEST(Replay, PositionsOutsideTheRecordingAndResetRunNormally) {
  auto p = tiny_program();
  ASSERT_TRUE(p);
  int64_t max_seq = 0;
  ASSERT_TRUE(p->attribute("model.max_seq", &max_seq));
  for (const std::string& dev : test_devices()) {
    if (dev == "cpu") continue;
    SCOPED_TRACE(dev);
    auto s = open(p, dev, true);
    if (!s) continue;
    std::vector<Step> first = generate(*s, 5);
    ASSERT_TRUE(first.back().replayed);
    // Past the caches: the kernels' own error, not a replay reading out of bounds.
    Step bad = run(*s, {1}, max_seq);
    EXPECT_EQ(bad.status.code(), StatusCode::kOutOfRange) << bad.status.to_string();
    EXPECT_FALSE(bad.replayed);
    // The last position still replays.
    Step last = run(*s, {1}, max_seq - 1);
    ASSERT_TRUE(last.status.is_ok()) << last.status.to_string();
    EXPECT_TRUE(last.replayed);
    // After a reset the same prompt gives the same bits as the first time, its decode steps
    // replaying the recording from the first (the reset zeroed the caches in place).
    ASSERT_TRUE(s->reset().is_ok());
    std::vector<Step> again = generate(*s, 5);
    ASSERT_EQ(again.size(), first.size());
    for (size_t i = 0; i < again.size(); ++i) {
      ASSERT_TRUE(again[i].status.is_ok());
      EXPECT_TRUE(same_bits(again[i].logits, first[i].logits)) << "step " << i;
      EXPECT_EQ(again[i].replayed, i >= 1) << "step " << i;
    }
  }
}

// Prompts alone (a reset, then one execution each, as `bench model --prefill-runs` times them)
// are never recorded: a prefill's recording kept all its temporaries and, never replayed, used up
// the recordings a session may waste, so its later decode steps were not replayed at all.
TEST(Replay, PromptsAfterResetAreNotRecorded) {
  on_gpu_sessions([](Session& s) {
    for (int i = 0; i < 6; ++i) {
      ASSERT_TRUE(s.reset().is_ok());
      Step prompt = run(s, {3, 1, 4, 1, 5}, 0);
      ASSERT_TRUE(prompt.status.is_ok()) << prompt.status.to_string();
      EXPECT_FALSE(prompt.replayed);
    }
    ASSERT_TRUE(s.reset().is_ok());
    std::vector<Step> steps = generate(s, 5);
    for (size_t i = 0; i < steps.size(); ++i) EXPECT_EQ(steps[i].replayed, i >= 3) << "step " << i;
  });
}

// models::generate as `bench model` runs it: prompts of 70 tokens after resets (their
// temporaries reused within the prefill), then decode steps, which replay from the third on —
// and from the first in a later generation.
TEST(Replay, GenerateReplaysItsDecodeStepsAfterLongPrompts) {
  on_gpu_sessions([](Session& s) {
    std::vector<int32_t> prompt(70);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 7 + 3) % 50);
    for (int run = 0; run < 4; ++run) {
      auto g = models::generate(s, prompt, run < 2 ? 1 : 10, false);
      ASSERT_TRUE(g.is_ok()) << g.status().to_string();
      // The first generation records its second decode step; the next (after generate's reset)
      // replays from its first.
      if (run >= 2) {
        EXPECT_EQ(g->decode_replays, run == 2 ? 7 : 9);
      }
    }
  });
}

// A Qwen3-MoE-shaped decoder of `layers` layers, small enough for lavapipe (hidden 1,024: the
// router GEMV's 16-byte row form; 16 experts of 256, top 4; bf16, 4-bit codes of group 64).
std::shared_ptr<const Program> qwen3_shaped(int64_t layers) {
  auto c = models::synthetic_config("qwen3-30b-a3b");
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  if (!c.is_ok()) return nullptr;
  c->vocab = 256;
  c->hidden = 1024;
  c->heads = 8;
  c->kv_heads = 2;
  c->experts = 16;
  c->top_k = 4;
  c->expert_ffn = 256;
  c->max_seq = 64;
  c->layers = layers;
  c->moe_layer.assign(static_cast<size_t>(layers), true);
  models::ExportFormat f;
  f.bits = 4;
  f.group_size = 64;
  f.dtype = DType::kBF16;
  const fs::path out = fs::temp_directory_path() / ("sb_replay_test_q3_" + std::to_string(layers) + "_" +
                                                    std::to_string(::getpid()));
  fs::remove_all(out);
  Status st = models::write_model(out.string(), *c, f, [&](const models::WeightSink& sink) {
    return models::synthetic_weights(*c, f, 11, nullptr, sink);
  });
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  auto p = Program::load((out / "program.sbp").string(), LoadOptions{{(out / "weights.safetensors").string()}});
  EXPECT_TRUE(p.is_ok()) << p.status().to_string();
  return p.is_ok() ? std::move(p).value() : nullptr;
}

// The decode layer's dispatches on every GPU test device, as the number a step grows by with a
// layer more: a fusion lost on some layers (as the router's norm was, to the next layer's reuse
// of its slot) shows here. Qwen3's layer: norm + q/k/v, Rope + attention blocks, merge,
// o-projection, norm + router logits, router, gate/up + Glu, down + combine.
TEST(DecodeStep, Qwen3LayerTakesEightDispatches) {
  std::map<std::string, std::vector<uint64_t>> per_step;  // device: a replayed step's, per model
  for (int64_t layers : {2, 3}) {
    auto p = qwen3_shaped(layers);
    ASSERT_TRUE(p);
    for (const std::string& dev : test_devices()) {
      if (dev == "cpu") continue;
      auto s = open(p, dev, true);
      if (!s) continue;
      std::vector<Step> done = generate(*s, 3);
      ASSERT_TRUE(done.back().status.is_ok()) << done.back().status.to_string();
      ASSERT_TRUE(done.back().replayed) << dev;
      const uint64_t before = s->device_dispatches();
      const Step next = run(*s, {done.back().next}, 5 + 3);
      ASSERT_TRUE(next.status.is_ok() && next.replayed) << dev << ": " << next.status.to_string();
      per_step[dev].push_back(s->device_dispatches() - before);
    }
  }
  if (per_step.empty()) std::printf("[ DEVICE SKIPPED ] DecodeStep: no GPU test device\n");
  for (const auto& [dev, counts] : per_step) {
    ASSERT_EQ(counts.size(), 2u) << dev;
    EXPECT_EQ(counts[1] - counts[0], 8u) << dev << ": a step of 2 layers took " << counts[0] << ", of 3 " << counts[1];
  }
}

}  // namespace
}  // namespace switchboard
