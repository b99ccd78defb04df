// Whole models: every Hugging Face fixture (tests/fixtures/, made by make_fixtures.py with
// transformers) exported in f32 must give the reference's greedy tokens and logits on
// the CPU and on each test device, and the devices must agree bitwise. Also the export
// path's errors on bad checkpoints, and the tiny test model.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "op_harness.h"
#include "quantize.h"
#include "safetensors.h"
#include "switchboard/model.h"
#include "test_util.h"

namespace switchboard {
namespace {

namespace fs = std::filesystem;
using optest::test_devices;

const fs::path kFixtures = fs::path(SB_SOURCE_DIR) / "tests" / "fixtures";

fs::path scratch(const std::string& name) { return testing::process_scratch("sb_model_test", name); }

std::vector<int32_t> ints(const Tensor& t) {
  return std::vector<int32_t>(t.data_as<int32_t>(), t.data_as<int32_t>() + t.numel());
}

// HF's logits come from f32 with other summation orders (BLAS) and libm's exp/cos; ours
// from dot32 and the exact routines (<= 3 ulp). Measured worst over the seven softmax-attention
// fixtures, 2026-11-22: 3.6e-6 (logits of magnitude ~1-10); the hybrids (2026-11-27) reach
// 3.3e-5, as HF prefills Gated DeltaNet in chunks (another order) where we walk the tokens.
// The bound stays far below the smallest greedy margin (0.0077, mixtral), so tokens cannot
// flip by rounding.
constexpr double kLogitTolerance = 5e-5;

struct Reference {
  std::vector<int32_t> prompt, generated;
  Tensor logits;  // [N, V]
};

Reference read_reference(const fs::path& dir) {
  auto f = SafetensorsFile::open((dir / "reference.safetensors").string());
  EXPECT_TRUE(f.is_ok()) << f.status().to_string();
  Reference r;
  r.prompt = ints((*f)->tensor("prompt_ids").value());
  r.generated = ints((*f)->tensor("generated_ids").value());
  r.logits = (*f)->tensor("logits").value().clone();
  return r;
}

void check_fixture(const std::string& name) {
  SCOPED_TRACE(name);
  const fs::path src = kFixtures / name / "hf", out = scratch(name);
  models::ExportOptions o;
  o.max_seq = 64;
  Status st = models::export_hf(src.string(), out.string(), o);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  auto program = Program::load((out / "program.sbp").string(), LoadOptions{{(out / "weights.safetensors").string()}});
  ASSERT_TRUE(program.is_ok()) << program.status().to_string();
  const Reference ref = read_reference(kFixtures / name);
  const int64_t steps = static_cast<int64_t>(ref.generated.size()), vocab = ref.logits.dim(1);
  std::vector<Tensor> first;
  for (const std::string& dev : test_devices()) {
    SCOPED_TRACE(dev);
    auto session = optest::detail::open_session(*program, dev);
    if (!session) continue;
    auto g = models::generate(*session, ref.prompt, steps, true, &ref.generated);
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    EXPECT_EQ(g->tokens, ref.generated) << "greedy tokens differ from transformers";
    double worst = 0;
    for (int64_t s = 0; s < steps; ++s) {
      const float* got = g.value().logits[static_cast<size_t>(s)].template data_as<float>();
      const float* want = ref.logits.data_as<float>() + s * vocab;
      for (int64_t v = 0; v < vocab; ++v) worst = std::max(worst, std::fabs(double(got[v]) - double(want[v])));
      if (first.size() < static_cast<size_t>(steps)) continue;
      EXPECT_EQ(std::memcmp(got, first[static_cast<size_t>(s)].data(), static_cast<size_t>(vocab) * 4), 0)
          << "step " << s << ": logits not bitwise equal to the CPU's";
    }
    std::printf("[ LOGITS ] %s on %s: max |ours - transformers| = %.3g\n", name.c_str(), dev.c_str(), worst);
    EXPECT_LE(worst, kLogitTolerance);
    if (first.empty()) first = g->logits;
  }
}

// Batch invariance: a position's logits are the same bits whether its token came in a prefill
// of any length or as a decode step. The fixture's tokens are fed as prompt + forced decode
// steps split at several points; every position computed more than once must match exactly.
void check_batch_invariance(const std::string& name) {
  SCOPED_TRACE(name);
  const fs::path out = scratch(name + "_inv");
  models::ExportOptions o;
  o.max_seq = 64;
  Status st = models::export_hf((kFixtures / name / "hf").string(), out.string(), o);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  auto program = Program::load((out / "program.sbp").string(), LoadOptions{{(out / "weights.safetensors").string()}});
  ASSERT_TRUE(program.is_ok()) << program.status().to_string();
  const Reference ref = read_reference(kFixtures / name);
  std::vector<int32_t> all = ref.prompt;
  all.insert(all.end(), ref.generated.begin(), ref.generated.end() - 1);
  const int64_t n = static_cast<int64_t>(all.size());
  for (const std::string& dev : test_devices()) {
    SCOPED_TRACE(dev);
    auto session = optest::detail::open_session(*program, dev);
    if (!session) continue;
    std::map<int64_t, Tensor> seen;  // position -> logits
    int compared = 0;
    for (int64_t split : {int64_t{1}, n / 2, n - 1, n}) {
      const std::vector<int32_t> prompt(all.begin(), all.begin() + split);
      std::vector<int32_t> forced(all.begin() + split, all.end());
      forced.push_back(0);  // generate() asks one per step; the last is never fed
      auto g = models::generate(*session, prompt, n - split + 1, true, &forced);
      ASSERT_TRUE(g.is_ok()) << g.status().to_string();
      for (int64_t s = 0; s <= n - split; ++s) {
        const int64_t position = split - 1 + s;
        const Tensor& got = g->logits[static_cast<size_t>(s)];
        auto [it, fresh] = seen.emplace(position, got);
        if (fresh) continue;
        ++compared;
        EXPECT_EQ(std::memcmp(got.data(), it->second.data(), got.nbytes()), 0)
            << "position " << position << " of " << n << ": prompt of " << split << " tokens gives other bits";
      }
    }
    // Splits n/2, n - 1 and n recompute positions n/2 - 1.., n - 2.. and n - 1.
    EXPECT_EQ(compared, (n - n / 2 + 1) + 2 + 1) << "positions compared";
  }
}

TEST(BatchInvariance, EveryFixtureEveryDevice) {
  for (const char* name : {"qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "qwen3_moe_geglu", "glm4_moe", "gpt_oss",
                           "qwen3_next", "qwen3_5_moe_text", "qwen3_5_moe"})
    check_batch_invariance(name);
}

TEST(HfFixture, Qwen3Moe) { check_fixture("qwen3_moe"); }
TEST(HfFixture, Qwen2Moe) { check_fixture("qwen2_moe"); }
TEST(HfFixture, Mixtral) { check_fixture("mixtral"); }
TEST(HfFixture, Olmoe) { check_fixture("olmoe"); }
TEST(HfFixture, Qwen3MoeGegluTied) { check_fixture("qwen3_moe_geglu"); }
TEST(HfFixture, Glm4MoeDeepSeekRouter) { check_fixture("glm4_moe"); }
TEST(HfFixture, GptOss) { check_fixture("gpt_oss"); }
TEST(HfFixture, Qwen3NextHybrid) { check_fixture("qwen3_next"); }
TEST(HfFixture, Qwen35MoeText) { check_fixture("qwen3_5_moe_text"); }
TEST(HfFixture, Qwen35MoeWrappedWithVision) { check_fixture("qwen3_5_moe"); }

void expect_export_error(const fs::path& src, const std::vector<std::string>& needles, models::ExportFormat f = {});

// --- quantized export -------------------------------------------------------------------

// Greedy run of an exported model on every test device; the devices must agree bitwise.
// Returns the CPU's generation (tokens and logits).
models::Generation run_everywhere(const fs::path& out, const std::vector<int32_t>& prompt, int64_t steps,
                                  const std::vector<int32_t>* forced) {
  auto program = Program::load((out / "program.sbp").string(), LoadOptions{{(out / "weights.safetensors").string()}});
  EXPECT_TRUE(program.is_ok()) << program.status().to_string();
  models::Generation first;
  if (!program.is_ok()) return first;
  for (const std::string& dev : test_devices()) {
    auto session = optest::detail::open_session(*program, dev);
    if (!session) continue;
    auto g = models::generate(*session, prompt, steps, true, forced);
    EXPECT_TRUE(g.is_ok()) << dev << ": " << g.status().to_string();
    if (!g.is_ok()) continue;
    // GPUs time each execute with their own timestamps; the CPU reports none.
    if (dev == "cpu") EXPECT_LT(g->prefill_device_us, 0);
    else EXPECT_GT(g->prefill_device_us, 0) << dev;
    if (first.logits.empty()) {
      first = std::move(g).value();
      continue;
    }
    EXPECT_EQ(g->tokens, first.tokens) << dev;
    for (size_t i = 0; i < first.logits.size(); ++i)
      EXPECT_EQ(std::memcmp(g->logits[i].data(), first.logits[i].data(), first.logits[i].nbytes()), 0)
          << dev << ": step " << i << " logits not bitwise equal to the CPU's";
  }
  return first;
}

// 8-bit weights (MLX affine, group 32) with int8 activation blocks (GatherQmm's contract)
// in every linear, attention included. Measured 2026-11-22: max logit error 0.069 after a
// one-token prompt, 0.486 over the 8 teacher-forced steps of the 8-token prompt (random
// attention amplifies it); greedy tokens all equal to transformers'. The bound leaves room
// over that measurement, no more.
TEST(QuantizedExport, EightBitFollowsTransformers) {
  const Reference ref = read_reference(kFixtures / "qwen3_moe");
  const fs::path out = scratch("q8");
  models::ExportOptions o;
  o.max_seq = 64;
  o.format.bits = 8;
  o.format.group_size = 32;
  ASSERT_TRUE(models::export_hf((kFixtures / "qwen3_moe" / "hf").string(), out.string(), o).is_ok());
  const auto g = run_everywhere(out, ref.prompt, static_cast<int64_t>(ref.generated.size()), &ref.generated);
  ASSERT_EQ(g.logits.size(), ref.generated.size());
  double worst = 0;
  for (size_t s = 0; s < g.logits.size(); ++s)
    for (int64_t v = 0; v < ref.logits.dim(1); ++v)
      worst = std::max(worst, std::fabs(double(g.logits[s].data_as<float>()[v]) -
                                        double(ref.logits.data_as<float>()[static_cast<int64_t>(s) * ref.logits.dim(1) + v])));
  std::printf("[ LOGITS ] qwen3_moe 8-bit: max |ours - transformers f32| = %.3g\n", worst);
  EXPECT_EQ(g.tokens, ref.generated) << "8-bit greedy tokens differ from transformers";
  EXPECT_LE(worst, 0.6);
}

// A bit map with 2-, 4- and 8-bit experts and a pruned one: it runs, pruned experts are never
// chosen (the router skips them), and the devices agree bitwise.
TEST(QuantizedExport, PerExpertBitMapWithPrunedExpert) {
  const fs::path map = scratch("bitmap.json"), out = scratch("mixed");
  std::ofstream(map) << R"({"0": {"0": 8, "1": 2, "2": 0}, "2": {"7": 8}})";
  models::ExportOptions o;
  o.max_seq = 64;
  o.format.bits = 4;
  o.format.group_size = 32;
  ASSERT_TRUE(models::read_bit_map(map.string(), &o.format).is_ok());
  Status st = models::export_hf((kFixtures / "qwen3_moe" / "hf").string(), out.string(), o);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  const auto g = run_everywhere(out, {3, 17, 42, 99, 5, 64, 120, 7}, 6, nullptr);
  EXPECT_EQ(g.tokens.size(), 6u);
}

// An mlx-lm style checkpoint made from the qwen3_moe fixture with our (MLX-exact) quantizer:
// every linear quantized (experts stacked as switch_mlp, the experts' down projection at
// 8 bits, the rest 4 bits, or k_proj at k_bits; groups of 32), router and embedding in float.
// Exported as it is, it must equal our own 4-bit export with the same widths, bit for bit.
fs::path make_mlx_checkpoint(int k_bits = 4, int qv_bits = 4) {
  const fs::path dst = scratch("mlx_qwen3_k" + std::to_string(k_bits) + "_qv" + std::to_string(qv_bits));
  fs::create_directories(dst);
  auto src = SafetensorsFile::open((kFixtures / "qwen3_moe" / "hf" / "model.safetensors").string());
  EXPECT_TRUE(src.is_ok());
  std::vector<std::pair<std::string, Tensor>> out;
  auto f32 = [&](const std::string& name) {
    std::vector<double> v = (*src)->tensor(name).value().to_doubles();
    std::vector<float> f(v.begin(), v.end());
    return Tensor::from_vector(DType::kF32, (*src)->tensor(name).value().shape(), f).value();
  };
  auto quantize = [&](const std::string& stem, const Tensor& w, int bits, int gs) {
    const int64_t k = w.dim(w.rank() - 1), rows = w.numel() / k;
    QuantizedRows q = affine_quantize(w.reshaped({rows, k}).value(), bits, gs, DType::kBF16).value();
    Shape lead(w.shape().begin(), w.shape().end() - 1);
    auto with = [&](Shape s, int64_t last) { s.push_back(last); return s; };
    out.emplace_back(stem + ".weight", q.w.reshaped(with(lead, k * bits / 32)).value());
    out.emplace_back(stem + ".scales", q.scales.reshaped(with(lead, k / gs)).value());
    out.emplace_back(stem + ".biases", q.biases.reshaped(with(lead, k / gs)).value());
  };
  // save_pretrained writes one tensor per expert: stack them as MLX's switch_mlp does.
  std::map<std::string, std::vector<Tensor>> stacks;
  for (const auto& [name, e] : (*src)->entries()) {
    const Tensor t = f32(name);
    const size_t at = name.find("mlp.experts.");
    if (at != std::string::npos) {
      const size_t dot = name.find('.', at + 12);
      stacks[name.substr(0, at) + "mlp.switch_mlp." + name.substr(dot + 1, name.size() - dot - 8)].push_back(t);
    } else if (name.find("_proj.weight") != std::string::npos || name == "lm_head.weight") {
      const bool qv = name.find("q_proj") != std::string::npos || name.find("v_proj") != std::string::npos;
      quantize(name.substr(0, name.size() - 7), t, name.find("k_proj") != std::string::npos ? k_bits : qv ? qv_bits : 4, 32);
    } else {
      out.emplace_back(name, (*src)->tensor(name).value().clone());
    }
  }
  for (const auto& [stem, experts] : stacks) {  // entries() is sorted: experts 0..9 only, in order
    const int64_t n = experts[0].dim(0), k = experts[0].dim(1), ex = static_cast<int64_t>(experts.size());
    Tensor w = Tensor::zeros(DType::kF32, {ex, n, k}).value();
    for (int64_t x = 0; x < ex; ++x) std::memcpy(w.mutable_data_as<float>() + x * n * k, experts[x].data(), experts[x].nbytes());
    quantize(stem, w, stem.find("down_proj") != std::string::npos ? 8 : 4, 32);
  }
  EXPECT_TRUE(write_safetensors((dst / "model.safetensors").string(), out).is_ok());
  std::ifstream in(kFixtures / "qwen3_moe" / "hf" / "config.json");
  std::string cfg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  cfg.replace(cfg.find('{'), 1, R"({"quantization": {"group_size": 32, "bits": 4},)");
  std::ofstream(dst / "config.json") << cfg;
  return dst;
}

// q, k and v at one width make one projection (also at a width other than the default); k at
// another keeps them apart. Our export with per-linear widths keeps them apart unless all are 4.
void check_mlx_as_our_quantization(int k_bits, int qv_bits) {
  SCOPED_TRACE(::testing::Message() << "k " << k_bits << " q, v " << qv_bits);
  const fs::path mlx = make_mlx_checkpoint(k_bits, qv_bits), a = scratch("mlx_as_is"), b = scratch("ours_q4");
  Status st = models::export_hf(mlx.string(), a.string(), models::ExportOptions{{}, 64, nullptr});
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  models::ExportOptions o;
  o.max_seq = 64;
  o.format.bits = 4;
  o.format.group_size = 32;
  o.format.dtype = DType::kBF16;  // MLX keeps the embedding in its scales' width
  for (int layer : {0, 1, 2}) {
    const std::string l = "layers." + std::to_string(layer);
    if (layer != 1) o.format.linear_quant[l + ".experts.down"] = {8, 32};
    if (k_bits != 4) o.format.linear_quant[l + ".attn.k"] = {k_bits, 32};
    if (qv_bits != 4) o.format.linear_quant[l + ".attn.q"] = o.format.linear_quant[l + ".attn.v"] = {qv_bits, 32};
  }
  st = models::export_hf((kFixtures / "qwen3_moe" / "hf").string(), b.string(), o);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  for (const auto& [dir, fused] : {std::pair{a, k_bits == qv_bits}, {b, k_bits == 4 && qv_bits == 4}}) {
    auto w = SafetensorsFile::open((dir / "weights.safetensors").string());
    ASSERT_TRUE(w.is_ok());
    EXPECT_EQ((*w)->tensor("layers.0.attn.qkv.weight").is_ok(), fused) << dir;
    EXPECT_EQ((*w)->tensor("layers.0.attn.k.weight").is_ok(), !fused) << dir;
  }
  const std::vector<int32_t> prompt = {3, 17, 42, 99, 5, 64, 120, 7};
  const auto ga = run_everywhere(a, prompt, 6, nullptr), gb = run_everywhere(b, prompt, 6, nullptr);
  ASSERT_EQ(ga.logits.size(), gb.logits.size());
  EXPECT_EQ(ga.tokens, gb.tokens);
  for (size_t i = 0; i < ga.logits.size(); ++i)
    EXPECT_EQ(std::memcmp(ga.logits[i].data(), gb.logits[i].data(), ga.logits[i].nbytes()), 0) << "step " << i;
}

TEST(MlxImport, UsedAsTheyAreEqualsOurOwnQuantization) {
  check_mlx_as_our_quantization(4, 4);
  check_mlx_as_our_quantization(8, 4);
  check_mlx_as_our_quantization(8, 8);
}

// q, k and v in one projection (layers.<i>.attn.qkv) with Rope's q/k/v form give the separate
// projections' bits: the tiny models (q/k/v biases; a gated q with per-head norms) built both
// ways from the same random draws.
TEST(FusedQkv, SameBitsAsSeparateProjections) {
  for (const char* family : {"", "qwen3_5_moe"}) {
    SCOPED_TRACE(family);
    models::ExportFormat f;
    f.bits = 4;
    f.group_size = 64;
    std::vector<models::Generation> runs;
    for (bool fuse : {true, false}) {
      auto c = models::tiny_test_config(family);
      ASSERT_TRUE(c.is_ok());
      c->fuse_qkv = fuse;
      int fused = 0;
      for (const models::WeightSpec& s : models::weight_specs(*c, f))
        fused += s.name.find(".attn.qkv.") != std::string::npos;
      EXPECT_EQ(fused > 0, fuse);
      auto w = models::random_weights(*c, f, 2026);
      ASSERT_TRUE(w.is_ok()) << w.status().to_string();
      const fs::path out = scratch(std::string("fused_qkv_") + family + (fuse ? "_on" : "_off"));
      ASSERT_TRUE(models::write_model(out.string(), *c, f, *w).is_ok());
      runs.push_back(run_everywhere(out, {1, 2, 3, 4, 5, 6}, 6, nullptr));
    }
    ASSERT_EQ(runs[0].logits.size(), runs[1].logits.size());
    EXPECT_EQ(runs[0].tokens, runs[1].tokens);
    for (size_t i = 0; i < runs[0].logits.size(); ++i)
      EXPECT_EQ(std::memcmp(runs[0].logits[i].data(), runs[1].logits[i].data(), runs[0].logits[i].nbytes()), 0)
          << "step " << i;
  }
}

TEST(MlxImport, RefusesRequantization) {
  const fs::path mlx = make_mlx_checkpoint();
  models::ExportFormat f;
  f.bits = 4;
  expect_export_error(mlx, {"already quantized"}, f);
}

// --- bad input ------------------------------------------------------------------------------

// A copy of a fixture's checkpoint, editable.
fs::path copy_fixture(const std::string& name, const std::string& as) {
  const fs::path dst = scratch(as);
  fs::create_directories(dst);
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(kFixtures / name / "hf" / f, dst / f);
  return dst;
}

void edit_config(const fs::path& dir, const std::string& from, const std::string& to) {
  std::ifstream in(dir / "config.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  text.replace(at, from.size(), to);
  std::ofstream(dir / "config.json") << text;
}

// Rewrites model.safetensors through `edit` on its tensor list.
void edit_tensors(const fs::path& dir, const std::function<void(std::vector<std::pair<std::string, Tensor>>&)>& edit) {
  std::vector<std::pair<std::string, Tensor>> ts;
  {
    auto f = SafetensorsFile::open((dir / "model.safetensors").string());
    ASSERT_TRUE(f.is_ok());
    for (const auto& [name, e] : (*f)->entries()) ts.emplace_back(name, (*f)->tensor(name).value().clone());
  }
  edit(ts);
  ASSERT_TRUE(write_safetensors((dir / "model.safetensors").string(), ts).is_ok());
}

// The export fails with a message containing every `needles`, and leaves nothing in OUT.
void expect_export_error(const fs::path& src, const std::vector<std::string>& needles, models::ExportFormat f) {
  const fs::path out = scratch("out_" + src.filename().string());
  models::ExportOptions o;
  o.format = f;
  Status st = models::export_hf(src.string(), out.string(), o);
  ASSERT_FALSE(st.is_ok());
  for (const std::string& n : needles) EXPECT_NE(st.message().find(n), std::string::npos) << st.message() << "\nlacks: " << n;
  EXPECT_FALSE(fs::exists(out)) << "a failed export left " << out;
  EXPECT_FALSE(fs::exists(out.string() + ".partial")) << "a failed export left its temporary directory";
}

TEST(ExportErrors, UnknownArchitecture) {
  fs::path d = copy_fixture("mixtral", "bad_arch");
  edit_config(d, "\"model_type\": \"mixtral\"", "\"model_type\": \"llama\"");
  expect_export_error(d, {"config.json", "model_type", "'llama' is not supported"});
}

TEST(ExportErrors, MissingTensor) {
  fs::path d = copy_fixture("mixtral", "missing");
  edit_tensors(d, [](auto& ts) {
    ts.erase(std::remove_if(ts.begin(), ts.end(), [](auto& t) { return t.first == "model.layers.1.self_attn.k_proj.weight"; }),
             ts.end());
  });
  expect_export_error(d, {"missing", "tensor 'model.layers.1.self_attn.k_proj.weight' is missing"});
}

TEST(ExportErrors, ExtraTensor) {
  fs::path d = copy_fixture("mixtral", "extra");
  edit_tensors(d, [](auto& ts) { ts.emplace_back("model.layers.0.mystery.weight", Tensor::zeros(DType::kF32, {4}).value()); });
  expect_export_error(d, {"model.safetensors", "tensor 'model.layers.0.mystery.weight' is not used"});
}

TEST(ExportErrors, WrongShape) {
  fs::path d = copy_fixture("olmoe", "shape");
  edit_tensors(d, [](auto& ts) {
    for (auto& [name, t] : ts)
      if (name == "model.layers.2.self_attn.q_norm.weight") t = Tensor::zeros(DType::kBF16, {32}).value();
  });
  expect_export_error(d, {"model.safetensors", "'model.layers.2.self_attn.q_norm.weight'", "shape [32], expected [64]"});
}

TEST(ExportErrors, BitsNotAllowed) {
  models::ExportFormat f;
  f.bits = 7;
  expect_export_error(kFixtures / "qwen3_moe" / "hf", {"--bits 7"}, f);
  f.bits = 4;
  f.group_size = 48;
  expect_export_error(kFixtures / "qwen3_moe" / "hf", {"--group-size 48"}, f);
}

TEST(ExportErrors, BitMapNamesMissingLayerOrExpert) {
  models::ExportFormat f;
  f.bits = 4;
  f.group_size = 32;
  f.expert_bits[9][0] = 2;
  expect_export_error(kFixtures / "qwen3_moe" / "hf", {"bit map: layer 9 does not exist"}, f);
  f.expert_bits.clear();
  f.expert_bits[0][8] = 2;
  expect_export_error(kFixtures / "qwen3_moe" / "hf", {"bit map: layer 0 expert 8 does not exist"}, f);
  f.expert_bits.clear();
  f.expert_bits[1][0] = 2;  // layer 1 is dense (mlp_only_layers)
  expect_export_error(kFixtures / "qwen3_moe" / "hf", {"layer 1 has no experts"}, f);
  f.expert_bits.clear();
  for (int e = 0; e < 7; ++e) f.expert_bits[0][e] = 0;
  expect_export_error(kFixtures / "qwen3_moe" / "hf", {"keeps 1 experts, fewer than top-k 2"}, f);
}

TEST(ExportErrors, TruncatedSafetensors) {
  fs::path d = copy_fixture("qwen2_moe", "truncated");
  fs::resize_file(d / "model.safetensors", fs::file_size(d / "model.safetensors") / 2);
  expect_export_error(d, {"model.safetensors"});
}

TEST(ExportErrors, ConfigValuesOutOfRange) {
  fs::path d = copy_fixture("glm4_moe", "cfg_range");
  edit_config(d, "\"n_shared_experts\": 1", "\"n_shared_experts\": 4611686018427387904");
  expect_export_error(d, {"n_shared_experts", "outside [0, 64]"});
  fs::path e = copy_fixture("mixtral", "cfg_theta");
  edit_config(e, "\"rope_theta\": 10000.0", "\"rope_theta\": 0.5");
  expect_export_error(e, {"rope_theta must be a finite number > 1"});
}

// Qwen3-Next / Qwen3.5 configs and checkpoints that cannot make a model: one error naming the
// file and the key (or tensor).
TEST(ExportErrors, HybridConfigAndTensors) {
  fs::path d = copy_fixture("qwen3_next", "lin_heads");
  edit_config(d, "\"linear_num_value_heads\": 4", "\"linear_num_value_heads\": 3");
  expect_export_error(
      d, {"config.json", "linear_num_value_heads", "3 must be a positive multiple of linear_num_key_heads (2)"});
  d = copy_fixture("qwen3_next", "lin_conv");
  edit_config(d, "\"linear_conv_kernel_dim\": 4", "\"linear_conv_kernel_dim\": 0");
  expect_export_error(d, {"config.json", "linear_conv_kernel_dim", "0 is outside [1, 64]"});
  d = copy_fixture("qwen3_next", "lin_types");
  edit_config(d, "\"linear_attention\",\n    \"full_attention\",", "\"full_attention\",");
  expect_export_error(d, {"config.json", "layer_types", "must list one type per layer (3), has 2"});
  d = copy_fixture("qwen3_5_moe", "lin_text");
  edit_config(d, "\"text_config\"", "\"text_konfig\"");
  expect_export_error(d, {"config.json", "text_config: missing"});
  d = copy_fixture("qwen3_5_moe_text", "lin_a_log");
  edit_tensors(d, [](auto& ts) {
    ts.erase(
        std::remove_if(ts.begin(), ts.end(), [](auto& t) { return t.first == "model.layers.2.linear_attn.A_log"; }),
        ts.end());
  });
  expect_export_error(d, {"tensor 'model.layers.2.linear_attn.A_log' is missing"});
}

// A sharded checkpoint's index says which files hold the weights; others beside them are ignored,
// and an index may not point outside the directory.
TEST(ExportErrors, ShardIndexChoosesTheFiles) {
  fs::path d = copy_fixture("mixtral", "indexed");
  fs::copy_file(d / "model.safetensors", d / "consolidated.safetensors");  // a duplicate copy
  std::ofstream(d / "model.safetensors.index.json") << R"({"weight_map": {"model.norm.weight": "model.safetensors"}})";
  const fs::path out = scratch("indexed_out");
  models::ExportOptions o;
  o.max_seq = 32;
  Status st = models::export_hf(d.string(), out.string() + "/", o);  // a trailing separator names the directory
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_TRUE(fs::exists(out / "program.sbp"));
  EXPECT_FALSE(fs::exists(out.string() + ".partial"));
  std::ofstream(d / "model.safetensors.index.json") << R"({"weight_map": {"a": "../model.safetensors"}})";
  expect_export_error(d, {"model.safetensors.index.json", "outside the model directory"});
}

TEST(ExportErrors, BadBitMapFile) {
  const fs::path map = scratch("bad_map.json");
  std::ofstream(map) << R"({"0": {"x": 4}})";
  models::ExportFormat f;
  Status st = models::read_bit_map(map.string(), &f);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("expert key 'x'"), std::string::npos) << st.message();
}

// --- the tiny test model ----------------------------------------------------------------------

TEST(TinyTest, DeterministicAndEqualOnEveryDevice) {
  models::ExportFormat f;
  f.bits = 4;
  f.group_size = 64;
  const models::ModelConfig c = models::tiny_test_config();
  auto w1 = models::random_weights(c, f, 2026), w2 = models::random_weights(c, f, 2026);
  ASSERT_TRUE(w1.is_ok() && w2.is_ok());
  ASSERT_EQ(w1->size(), w2->size());
  for (size_t i = 0; i < w1->size(); ++i)
    EXPECT_EQ(std::memcmp((*w1)[i].second.data(), (*w2)[i].second.data(), (*w1)[i].second.nbytes()), 0) << (*w1)[i].first;
  const fs::path out = scratch("tiny");
  ASSERT_TRUE(models::write_model(out.string(), c, f, *w1).is_ok());
  // Prefill of 8 tokens (the sorted expert path), then decode steps (the unsorted one).
  const auto g = run_everywhere(out, {1, 2, 3, 4, 5, 6, 7, 8}, 12, nullptr);
  EXPECT_EQ(g.tokens.size(), 12u);
}

// The benchmark models' fast path (random codes written directly) makes a program that loads
// and runs everywhere with finite logits; shown on the tiny shape (the 30B one is 17.7 GB).
TEST(TinyTest, SyntheticWeightsRun) {
  models::ExportFormat f;
  f.bits = 4;
  f.group_size = 64;
  f.dtype = DType::kBF16;
  const models::ModelConfig c = models::tiny_test_config();
  const fs::path out = scratch("synthetic");
  ASSERT_TRUE(models::write_model(out.string(), c, f, [&](const models::WeightSink& sink) {
                return models::synthetic_weights(c, f, 7, nullptr, sink);
              }).is_ok());
  const auto g = run_everywhere(out, {5, 6, 7}, 4, nullptr);
  ASSERT_EQ(g.logits.size(), 4u);
  for (const Tensor& l : g.logits)
    for (int64_t v = 0; v < l.numel(); ++v) ASSERT_TRUE(std::isfinite(l.data_as<float>()[v])) << v;
  EXPECT_EQ(models::synthetic_config("nope").status().code(), StatusCode::kInvalidArgument);
}

// Which layers are Gated DeltaNet: layer_types when given, else every full_attention_interval-th
// layer (1-based) is full attention.
TEST(HybridConfig, LayerTypesAndInterval) {
  std::ifstream in(kFixtures / "qwen3_next" / "hf" / "config.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto c = models::parse_hf_config_text(text, "next/config.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->linear_layer, (std::vector<bool>{true, false, true}));
  EXPECT_TRUE(c->lin_grouped && c->norm_plus_one && c->attn_output_gate && c->shared_gate);
  const size_t at = text.find("\"layer_types\"");
  ASSERT_NE(at, std::string::npos);
  std::string no_types = text;
  no_types.replace(at, std::string("\"layer_types\"").size(), "\"full_attention_interval\": 2, \"unused_types\"");
  c = models::parse_hf_config_text(no_types, "next/config.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->linear_layer, (std::vector<bool>{true, false, true}));
  no_types.replace(no_types.find("\"full_attention_interval\": 2"), 28, "\"full_attention_interval\": 4");
  c = models::parse_hf_config_text(no_types, "next/config.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->linear_layer, (std::vector<bool>{true, true, true}));
  std::string bad = text;
  bad.replace(bad.find("\"full_attention\""), 16, "\"sliding_attention\"");
  EXPECT_NE(models::parse_hf_config_text(bad, "next/config.json")
                .status()
                .message()
                .find("next/config.json: layer_types: entry 1 is \"sliding_attention\""),
            std::string::npos);
}

// Per-expert bit maps (8-bit, 2-bit and pruned experts) on the tiny hybrid: every device gives
// the same bits.
TEST(TinyTest, Qwen35HybridWithABitMap) {
  models::ExportFormat f;
  f.bits = 4;
  f.group_size = 64;
  f.expert_bits[0] = {{0, 8}, {1, 0}, {2, 2}};
  f.expert_bits[3] = {{5, 8}, {6, 0}};
  auto c = models::tiny_test_config("qwen3_5_moe");
  ASSERT_TRUE(c.is_ok());
  auto w = models::random_weights(*c, f, 7);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  const fs::path out = scratch("tiny35_bits");
  ASSERT_TRUE(models::write_model(out.string(), *c, f, *w).is_ok());
  const auto g = run_everywhere(out, {9, 8, 7, 6, 5, 4}, 6, nullptr);
  EXPECT_EQ(g.tokens.size(), 6u);
}

// mlx-lm's conversion of a Qwen3.5 checkpoint (its sanitize): the text model under
// language_model.model., lm_head under language_model., the vision model as vision_tower.,
// convs as [C, K, 1] and the zero-centred norms stored as 1 + w. It exports to the program and
// weights of the transformers layout: the same logits, bit for bit.
TEST(HfFixture, Qwen35MlxLayoutGivesTheSameBits) {
  const fs::path d = copy_fixture("qwen3_5_moe", "mlx_layout");
  edit_tensors(d, [](auto& ts) {
    auto starts = [](const std::string& n, const char* p) { return n.rfind(p, 0) == 0; };
    auto ends = [](const std::string& n, const std::string& x) {
      return n.size() >= x.size() && n.compare(n.size() - x.size(), x.size(), x) == 0;
    };
    for (auto& [name, t] : ts) {
      const bool norm = ends(name, "layernorm.weight") || ends(name, "q_norm.weight") || ends(name, "k_norm.weight") ||
                        name == "model.language_model.norm.weight";
      if (norm) {  // 1 + w in f32, as HF computes it
        Tensor f = Tensor::uninitialized(DType::kF32, t.shape()).value();
        const std::vector<double> w = t.to_doubles();
        for (int64_t i = 0; i < t.numel(); ++i)
          f.mutable_data_as<float>()[i] = 1.0f + static_cast<float>(w[static_cast<size_t>(i)]);
        t = f;
      }
      if (ends(name, "conv1d.weight")) t = t.reshaped({t.dim(0), t.dim(2), 1}).value();
      if (starts(name, "model.language_model."))
        name = "language_model.model." + name.substr(21);
      else if (starts(name, "model.visual."))
        name = "vision_tower." + name.substr(13);
      else if (name == "lm_head.weight")
        name = "language_model.lm_head.weight";
    }
  });
  const Reference ref = read_reference(kFixtures / "qwen3_5_moe");
  std::vector<std::vector<Tensor>> logits;
  for (const fs::path& src : {kFixtures / "qwen3_5_moe" / "hf", d}) {
    const fs::path out = scratch("mlx_layout_out_" + std::to_string(logits.size()));
    models::ExportOptions o;
    o.max_seq = 64;
    Status st = models::export_hf(src.string(), out.string(), o);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    const auto g = run_everywhere(out, ref.prompt, static_cast<int64_t>(ref.generated.size()), &ref.generated);
    EXPECT_EQ(g.tokens, ref.generated);
    logits.push_back(g.logits);
  }
  ASSERT_EQ(logits[0].size(), logits[1].size());
  for (size_t i = 0; i < logits[0].size(); ++i)
    EXPECT_EQ(std::memcmp(logits[0][i].data(), logits[1][i].data(), logits[0][i].nbytes()), 0) << "step " << i;
}

// An MLX-quantized Qwen3-Next keeps in_proj_qkvz / in_proj_ba head-grouped: the export moves
// their codes, scales and biases row by row into our [q | k | v], z, b, a (no re-quantizing, at
// their own width even where it is not the config's).
// The fixture without its shared expert (48 wide, no group of 32 divides it).
TEST(HfFixture, Qwen3NextMlxGroupedCodesMoveAsTheyAre) {
  const fs::path d = copy_fixture("qwen3_next", "mlx_grouped");
  edit_config(d, "\"shared_expert_intermediate_size\": 48", "\"shared_expert_intermediate_size\": 0");
  edit_config(d, "\"model_type\": \"qwen3_next\"",
              "\"model_type\": \"qwen3_next\", \"quantization\": {\"group_size\": 32, \"bits\": 8}");
  std::map<std::string, Tensor> codes;  // in_proj codes, as written
  edit_tensors(d, [&](auto& ts) {
    std::vector<std::pair<std::string, Tensor>> kept;
    for (auto& [name, t] : ts) {
      if (name.find("shared_expert") != std::string::npos) continue;
      const bool grouped =
          name.find("in_proj_qkvz.weight") != std::string::npos || name.find("in_proj_ba.weight") != std::string::npos;
      if (!grouped) {
        kept.emplace_back(name, t);
        continue;
      }
      Tensor f = Tensor::uninitialized(DType::kF32, t.shape()).value();
      const std::vector<double> v = t.to_doubles();
      for (size_t i = 0; i < v.size(); ++i) f.mutable_data_as<float>()[i] = static_cast<float>(v[i]);
      auto q = affine_quantize(f, 4, 64, DType::kBF16);  // not the config's 8 / 32: a per-path width
      ASSERT_TRUE(q.is_ok());
      const std::string stem = name.substr(0, name.size() - 7);  // without ".weight"
      codes[name] = q->w;
      kept.emplace_back(name, q->w);
      kept.emplace_back(stem + ".scales", q->scales);
      kept.emplace_back(stem + ".biases", q->biases);
    }
    ts = kept;
  });
  const fs::path out = scratch("mlx_grouped_out");
  models::ExportOptions o;
  o.max_seq = 64;
  Status st = models::export_hf(d.string(), out.string(), o);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  // HF's regrouping: in_proj_qkvz viewed [hk = 2, q 16 | k 16 | v 2 x 16 | z 2 x 16] rows of 8 words
  // (64 inputs at 4 bits); ours is [q heads | k heads | v heads] then z.
  auto w = SafetensorsFile::open((out / "weights.safetensors").string());
  ASSERT_TRUE(w.is_ok());
  const Tensor src = codes.at("model.layers.0.linear_attn.in_proj_qkvz.weight");
  const Tensor qkv = (*w)->tensor("layers.0.lin.qkv.weight").value();
  const int64_t words = 8, group = 96;  // 64 inputs x 4 bits; rows per key-head group
  std::vector<int64_t> rows;
  for (int64_t part : {0, 16})
    for (int64_t g = 0; g < 2; ++g)
      for (int64_t i = 0; i < 16; ++i) rows.push_back(g * group + part + i);
  for (int64_t g = 0; g < 2; ++g)
    for (int64_t i = 0; i < 32; ++i) rows.push_back(g * group + 32 + i);
  ASSERT_EQ(qkv.numel(), static_cast<int64_t>(rows.size()) * words);
  for (size_t r = 0; r < rows.size(); ++r)
    EXPECT_EQ(std::memcmp(qkv.data_as<uint32_t>() + r * words, src.data_as<uint32_t>() + rows[r] * words, words * 4), 0)
        << "row " << r;
  const auto g = run_everywhere(out, {3, 17, 42, 99}, 4, nullptr);
  EXPECT_EQ(g.tokens.size(), 4u);
}

// The seed's CI gate in our form: the tiny Qwen3.5 hybrid (export --tiny-test qwen3_5_moe,
// 4-bit linears), a prompt of 4 tokens (over the sort cutoff: the sorted expert path) and 5
// new tokens (decode steps: the unsorted path) give these ids on every device. The ids pin the
// whole numerics contract: any change to an order or a routine shows here first.
TEST(TinyTest, Qwen35HybridGeneratesTheFixedIds) {
  models::ExportFormat f;
  f.bits = 4;
  f.group_size = 64;
  auto c = models::tiny_test_config("qwen3_5_moe");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  auto w = models::random_weights(*c, f, 2026);  // the CLI's seed
  ASSERT_TRUE(w.is_ok());
  const fs::path out = scratch("tiny35");
  ASSERT_TRUE(models::write_model(out.string(), *c, f, *w).is_ok());
  auto program = Program::load((out / "program.sbp").string(), LoadOptions{{(out / "weights.safetensors").string()}});
  ASSERT_TRUE(program.is_ok());
  int64_t cutoff = -1;
  EXPECT_TRUE((*program)->attribute("moe.sort_cutoff", &cutoff));
  EXPECT_EQ(cutoff, 3) << "a 4-token prompt must take the sorted path";
  const auto g = run_everywhere(out, {1, 2, 3, 4}, 5, nullptr);
  EXPECT_EQ(g.tokens, (std::vector<int32_t>{234, 185, 204, 174, 33}));
  EXPECT_EQ(models::tiny_test_config("llama").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace switchboard
