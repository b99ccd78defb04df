// `switchboard demo`: a 4-bit MoE layer built with the builder, saved, loaded
// back and run for M = 1 and M = 8 tokens from one program.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <tuple>

#include "cli.h"
#include "quantize.h"
#include "safetensors.h"
#include "switchboard/builder.h"
#include "switchboard/switchboard.h"

namespace switchboard::cli {
namespace {

constexpr int64_t kHidden = 64, kFfn = 128, kExperts = 8, kTopK = 2;

// A Qwen3-style MoE layer: router logits = x @ router^T, softmax -> top-2
// (renormalized), 4-bit experts (gate, up, down) with SwiGLU, weighted combine.
// The token count is dynamic, so the program holds both the unsorted (decode)
// and sorted (prefill) lowerings behind one If on M.
Status build_moe_layer(ProgramBuilder& b) {
  TensorRef x = b.input("x", DType::kF32, {Dim::dynamic(1, 512), kHidden});
  TensorRef router = b.constant("router.weight", DType::kF32, {kExperts, kHidden});
  auto proj = [&](const std::string& name, int64_t n, int64_t k) {
    return QuantizedExperts{b.constant(name + ".weight", DType::kU32, {kExperts, n, k / 8}),
                            b.constant(name + ".scales", DType::kBF16, {kExperts, n, k / 64}),
                            b.constant(name + ".biases", DType::kBF16, {kExperts, n, k / 64}), 4, 64, {}};
  };
  MoeExperts experts{proj("experts.gate", kFfn, kHidden), proj("experts.up", kFfn, kHidden),
                     proj("experts.down", kHidden, kFfn)};
  RouterOut r = b.router(b.matmul(x, router), RouterSpec{RouterKind::kSoftmaxTopK, kTopK, true});
  b.output("y", b.moe_experts(x, r.weights, r.indices, experts));
  b.output("experts", r.indices);
  return b.status();
}

Result<std::vector<std::pair<std::string, Tensor>>> make_weights() {
  std::mt19937 rng(42);
  std::normal_distribution<float> dist(0.f, 0.1f);
  auto random = [&](Shape shape) {
    Tensor t = Tensor::zeros(DType::kF32, shape).value();
    for (int64_t i = 0; i < t.numel(); ++i) t.mutable_data_as<float>()[i] = dist(rng);
    return t;
  };
  std::vector<std::pair<std::string, Tensor>> w;
  w.emplace_back("router.weight", random({kExperts, kHidden}));
  // Each projection quantized with MLX's affine quantizer, 4-bit, group 64.
  for (auto [name, n, k] : {std::tuple{"experts.gate", kFfn, kHidden}, std::tuple{"experts.up", kFfn, kHidden},
                            std::tuple{"experts.down", kHidden, kFfn}}) {
    SB_ASSIGN_OR_RETURN(QuantizedRows q, affine_quantize(random({kExperts * n, k}), 4, 64, DType::kBF16));
    SB_ASSIGN_OR_RETURN(Tensor codes, q.w.reshaped({kExperts, n, k / 8}));
    SB_ASSIGN_OR_RETURN(Tensor scales, q.scales.reshaped({kExperts, n, k / 64}));
    SB_ASSIGN_OR_RETURN(Tensor biases, q.biases.reshaped({kExperts, n, k / 64}));
    w.emplace_back(std::string(name) + ".weight", codes);
    w.emplace_back(std::string(name) + ".scales", scales);
    w.emplace_back(std::string(name) + ".biases", biases);
  }
  return w;
}

int fail(const Status& st) {
  std::fprintf(stderr, "switchboard demo: %s\n", st.to_string().c_str());
  return 1;
}

}  // namespace

int run_demo(const DemoOptions& opts) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path dir = opts.save_dir.empty() ? fs::temp_directory_path() / "switchboard-demo" : fs::path(opts.save_dir);
  fs::create_directories(dir, ec);
  if (ec) return fail(make_error(StatusCode::kIoError, "%s: %s", dir.c_str(), ec.message().c_str()));
  const std::string program_path = (dir / "program.sbp").string(), weights_path = (dir / "weights.safetensors").string();

  ProgramBuilder b;
  if (Status st = build_moe_layer(b); !st.is_ok()) return fail(st);
  if (Status st = b.save(program_path); !st.is_ok()) return fail(st);
  auto weights = make_weights();
  if (!weights) return fail(weights.status());
  if (Status st = write_safetensors(weights_path, *weights); !st.is_ok()) return fail(st);
  std::printf("saved %s and %s\n", program_path.c_str(), weights_path.c_str());

  auto program = Program::load(program_path, LoadOptions{{weights_path}});
  if (!program) return fail(program.status());
  auto session = Session::create(*program, SessionOptions{opts.device, true});
  if (!session) return fail(session.status());
  std::printf("device: %s\n", (*session)->device_name().c_str());

  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (int64_t m : {1, 8}) {  // M = 1 takes the unsorted path, M = 8 the sorted one
    Tensor x = Tensor::zeros(DType::kF32, {m, kHidden}).value();
    for (int64_t i = 0; i < x.numel(); ++i) x.mutable_data_as<float>()[i] = dist(rng);
    if (Status st = (*session)->set_input("x", x); !st.is_ok()) return fail(st);
    auto t0 = std::chrono::steady_clock::now();
    if (Status st = (*session)->execute(); !st.is_ok()) return fail(st);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    Tensor y = (*session)->output("y").value(), experts = (*session)->output("experts").value();
    std::printf("M=%lld: y %s in %.3f ms\n", (long long)m, shape_str(y.shape()).c_str(), ms);
    for (int64_t r = 0; r < m; ++r)
      std::printf("  token %lld: experts %d %d, y[0:4] = %+.6f %+.6f %+.6f %+.6f\n", (long long)r,
                  experts.data_as<int32_t>()[r * kTopK], experts.data_as<int32_t>()[r * kTopK + 1],
                  y.data_as<float>()[r * kHidden], y.data_as<float>()[r * kHidden + 1], y.data_as<float>()[r * kHidden + 2],
                  y.data_as<float>()[r * kHidden + 3]);
  }
  return 0;
}

}  // namespace switchboard::cli
