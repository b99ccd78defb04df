// `switchboard demo`: a dense-routed MoE layer built with the builder, saved,
// loaded back and run for M = 1 and M = 4 tokens from one program.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>

#include "cli.h"
#include "safetensors.h"
#include "switchboard/builder.h"
#include "switchboard/switchboard.h"

namespace switchboard::cli {
namespace {

constexpr int64_t kHidden = 64, kFfn = 128, kExperts = 4;

// y = sum_e w_e * W2_e relu(W1_e x), with w = relu(router x) / sum(relu(router x)).
Status build_moe_layer(ProgramBuilder& b) {
  TensorRef x = b.input("x", DType::kF32, {Dim::dynamic(1, 512), kHidden});
  TensorRef router = b.constant("router.weight", DType::kF32, {kExperts, kHidden});
  TensorRef eps = b.constant("router.eps", DType::kF32, {1});
  TensorRef scores = b.relu(b.matmul(x, router));
  TensorRef weights = b.div(scores, b.add(b.sum(scores, 1, true), eps));
  TensorRef y;
  for (int64_t e = 0; e < kExperts; ++e) {
    auto scope = b.tmp_scope();  // expert temporaries recycle their slots
    std::string p = "experts." + std::to_string(e);
    TensorRef w1 = b.constant(p + ".w1", DType::kF32, {kFfn, kHidden});
    TensorRef w2 = b.constant(p + ".w2", DType::kF32, {kHidden, kFfn});
    TensorRef h = b.matmul(b.relu(b.matmul(x, w1)), w2);
    TensorRef contrib = b.mul(h, b.slice(weights, 1, e, e + 1));
    y = scope.keep(y.valid() ? b.add(y, contrib) : contrib);
  }
  b.output("y", y);
  b.output("expert", b.argmax(weights, 1));
  return b.status();
}

std::vector<std::pair<std::string, Tensor>> make_weights() {
  std::mt19937 rng(42);
  std::normal_distribution<float> dist(0.f, 0.1f);
  auto random = [&](Shape shape) {
    Tensor t = Tensor::zeros(DType::kF32, shape).value();
    for (int64_t i = 0; i < t.numel(); ++i) t.mutable_data_as<float>()[i] = dist(rng);
    return t;
  };
  std::vector<std::pair<std::string, Tensor>> w;
  w.emplace_back("router.weight", random({kExperts, kHidden}));
  w.emplace_back("router.eps", Tensor::from_vector<float>(DType::kF32, {1}, {1e-6f}).value());
  for (int64_t e = 0; e < kExperts; ++e) {
    w.emplace_back("experts." + std::to_string(e) + ".w1", random({kFfn, kHidden}));
    w.emplace_back("experts." + std::to_string(e) + ".w2", random({kHidden, kFfn}));
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
  if (Status st = write_safetensors(weights_path, make_weights()); !st.is_ok()) return fail(st);
  std::printf("saved %s and %s\n", program_path.c_str(), weights_path.c_str());

  auto program = Program::load(program_path, LoadOptions{{weights_path}});
  if (!program) return fail(program.status());
  auto session = Session::create(*program, SessionOptions{opts.device});
  if (!session) return fail(session.status());
  std::printf("device: %s\n", (*session)->device_name().c_str());

  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (int64_t m : {1, 4}) {
    Tensor x = Tensor::zeros(DType::kF32, {m, kHidden}).value();
    for (int64_t i = 0; i < x.numel(); ++i) x.mutable_data_as<float>()[i] = dist(rng);
    if (Status st = (*session)->set_input("x", x); !st.is_ok()) return fail(st);
    auto t0 = std::chrono::steady_clock::now();
    if (Status st = (*session)->execute(); !st.is_ok()) return fail(st);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    Tensor y = (*session)->output("y").value(), expert = (*session)->output("expert").value();
    std::printf("M=%lld: y %s in %.3f ms\n", (long long)m, shape_str(y.shape()).c_str(), ms);
    for (int64_t r = 0; r < m; ++r)
      std::printf("  token %lld: expert %d, y[0:4] = %+.6f %+.6f %+.6f %+.6f\n", (long long)r,
                  expert.data_as<int32_t>()[r], y.data_as<float>()[r * kHidden], y.data_as<float>()[r * kHidden + 1],
                  y.data_as<float>()[r * kHidden + 2], y.data_as<float>()[r * kHidden + 3]);
  }
  return 0;
}

}  // namespace switchboard::cli
