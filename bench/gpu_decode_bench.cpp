// Per-op cost of the decode-step kernels on a device: a program of R copies of one op
// (distinct weights per copy, so weights are not cache-resident across copies), device
// time from the device's timestamps divided by R. That is the op's kernel time plus
// its share of launch and barrier cost, which is what a decode step pays per op. Copies
// that do not chain (`chained` false) run side by side on the GPU, so their figure is a
// throughput: `--reps 1` gives one op's latency, what a model's decode step waits for.
// Run: build/release/bin/gpu_decode_bench --device vulkan [--reps 16] [--iters 20] [--case NAME-PART]
// Prints one JSON object per case.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "switchboard/builder.h"
#include "switchboard/switchboard.h"

using namespace switchboard;

namespace {

using bench::random_words;

// Normal values of `scale`, f32 or bf16 (truncated: any values do for timing).
Tensor filled(DType dt, Shape s, uint64_t seed, float scale) {
  Tensor t = Tensor::zeros(dt, s).value();
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> d(0.f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float v = d(rng);
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    if (dt == DType::kF32) t.mutable_data_as<float>()[i] = v;
    else t.mutable_data_as<uint16_t>()[i] = static_cast<uint16_t>(bits >> 16);
  }
  return t;
}

// The program's inputs: x [1, width], and for the expert ops rhs [8] (8 random experts
// of 64) and lhs [8] (pair p reads row p of the down projection's [8, 768] input).
struct In {
  TensorRef x, rhs, lhs;
};

struct Case {
  std::string name;
  double bytes_per_op = 0;  // weight bytes one op reads
  // Adds op copy r to b (its constants into `c`, named per copy), returns its output.
  std::function<TensorRef(ProgramBuilder&, int, const In&, std::map<std::string, Tensor>&)> op;
  bool chained = false;  // op r consumes op r-1's output (else every op reads the inputs)
  bool indices = false;  // the program has rhs/lhs inputs
  Shape x_shape = {1, 2048};
};

// Quantized 4-bit, group-64 experts [E, N, K] as constants named <p>w/s/b<r>.
QuantizedExperts experts(ProgramBuilder& b, std::map<std::string, Tensor>& c, const std::string& p, int r, int64_t e,
                         int64_t n, int64_t k) {
  const std::string id = std::to_string(r);
  c[p + "w" + id] = random_words(e * n * k / 8, 7 + r).reshaped({e, n, k / 8}).value();
  c[p + "s" + id] = filled(DType::kBF16, {e, n, k / 64}, 11 + r, 0.01f);
  c[p + "b" + id] = filled(DType::kBF16, {e, n, k / 64}, 13 + r, 0.01f);
  return {b.constant(p + "w" + id, DType::kU32, {e, n, k / 8}), b.constant(p + "s" + id, DType::kBF16, {e, n, k / 64}),
          b.constant(p + "b" + id, DType::kBF16, {e, n, k / 64}), 4, 64, {}};
}

std::vector<Case> cases() {
  std::vector<Case> v;
  v.push_back({"add_1x2048 (dispatch cost)", 0,
               [](ProgramBuilder& b, int r, const In& in, std::map<std::string, Tensor>& c) {
                 return b.add(in.x, in.x);
               },
               true});
  v.push_back({"rms_norm_1x2048", 0,
               [](ProgramBuilder& b, int r, const In& in, std::map<std::string, Tensor>& c) {
                 c["nw" + std::to_string(r)] = filled(DType::kF32, {2048}, r, 1.f);
                 return b.rms_norm(in.x, b.constant("nw" + std::to_string(r), DType::kF32, {2048}));
               },
               true});
  // The decoder's fused residual add + RMSNorm (order Tree32) and its Rope with the per-head
  // q norm (Qwen3: 32 heads of 128), at decode and across a 512-token prefill; the sequential
  // RmsNorm beside them.
  for (int64_t m : {int64_t{1}, int64_t{512}}) {
    const std::string rows = std::to_string(m);
    v.push_back(
        {"add_rms_norm_tree_" + rows + "x2048",
         0,
         [](ProgramBuilder& b, int r, const In& in, std::map<std::string, Tensor>& c) {
           c["tw" + std::to_string(r)] = filled(DType::kF32, {2048}, r, 1.f);
           return b.add_rms_norm(in.x, in.x, b.constant("tw" + std::to_string(r), DType::kF32, {2048}), 1e-6f).out;
         },
         true,
         false,
         {m, 2048}});
    v.push_back({"rms_norm_sequential_" + rows + "x2048",
                 0,
                 [](ProgramBuilder& b, int r, const In& in, std::map<std::string, Tensor>& c) {
                   c["sw" + std::to_string(r)] = filled(DType::kF32, {2048}, r, 1.f);
                   return b.rms_norm(in.x, b.constant("sw" + std::to_string(r), DType::kF32, {2048}));
                 },
                 true,
                 false,
                 {m, 2048}});
    v.push_back({"rope_norm_" + rows + "x32x128",
                 0,
                 [m](ProgramBuilder& b, int r, const In& in, std::map<std::string, Tensor>& c) {
                   const std::string id = std::to_string(r);
                   c["rw" + id] = filled(DType::kF32, {128}, r, 1.f);
                   c["rc" + id] = filled(DType::kF32, {640, 64}, r + 1, 1.f);
                   c["rs" + id] = filled(DType::kF32, {640, 64}, r + 2, 1.f);
                   TensorRef y = b.rope(b.reshape(in.x, {m, 32, 128}), b.constant("rc" + id, DType::kF32, {640, 64}),
                                        b.constant("rs" + id, DType::kF32, {640, 64}), 0,
                                        b.constant("rw" + id, DType::kF32, {128}), 1e-6f);
                   return b.reshape(y, {m, 4096});
                 },
                 true,
                 false,
                 {m, 4096}});
  }
  v.push_back({"router_softmax_top8_of_128", 0,
               [](ProgramBuilder& b, int r, const In& in, std::map<std::string, Tensor>& c) {
                 RouterSpec spec;
                 spec.k = 8;
                 spec.renormalize = true;
                 c["lg" + std::to_string(r)] = filled(DType::kF32, {1, 128}, 17 + r, 1.f);
                 return b.router(b.constant("lg" + std::to_string(r), DType::kF32, {1, 128}), spec).weights;
               }});
  v.push_back({"matmul_router_1x2048x128_f32", 128.0 * 2048 * 4,
               [](ProgramBuilder& b, int r, const In& in, std::map<std::string, Tensor>& c) {
                 c["rw" + std::to_string(r)] = filled(DType::kF32, {128, 2048}, 19 + r, 0.02f);
                 return b.matmul(in.x, b.constant("rw" + std::to_string(r), DType::kF32, {128, 2048}));
               }});
  // Prefill GEMMs on matmul_tile: the routers' logits (n = 128) and a dense projection, 512 bf16 rows.
  for (int64_t n : {int64_t{128}, int64_t{2048}})
    v.push_back({"matmul_tile_512x2048x" + std::to_string(n) + "_bf16", 2.0 * n * 2048,
                 [n](ProgramBuilder& b, int r, const In& in, std::map<std::string, Tensor>& c) {
                   const std::string id = std::to_string(r);
                   c["mx" + id] = filled(DType::kBF16, {512, 2048}, 23 + r, 1.f);
                   c["mw" + id] = filled(DType::kBF16, {n, 2048}, 29 + r, 0.02f);
                   return b.matmul(b.constant("mx" + id, DType::kBF16, {512, 2048}),
                                   b.constant("mw" + id, DType::kBF16, {n, 2048}), true);
                 }});
  // Qwen3-30B-A3B decode: 8 of 64 experts (distinct per copy), gate/up and down shapes.
  const double gate_bytes = 8.0 * 768 * 2048 * (0.5 + 4.0 / 64);
  v.push_back({"qmm_gate_8x768x2048_4bit", gate_bytes,
               [](ProgramBuilder& b, int r, const In& in, std::map<std::string, Tensor>& c) {
                 GatherOptions o;
                 o.rhs_indices = in.rhs;
                 return b.gather_qmm(in.x, experts(b, c, "g", r, 64, 768, 2048), o);
               },
               false, true});
  v.push_back({"qmm_down_8x2048x768_4bit", gate_bytes,
               [](ProgramBuilder& b, int r, const In& in, std::map<std::string, Tensor>& c) {
                 GatherOptions o;
                 o.rhs_indices = in.rhs;
                 o.lhs_indices = in.lhs;
                 return b.gather_qmm(in.x, experts(b, c, "d", r, 64, 2048, 768), o);
               },
               false, true, {8, 768}});
  // A whole Qwen3-30B-A3B MoE block as decode runs it, chained (layer r reads layer r-1's
  // output): RMSNorm, router logits, softmax top-8 of 128, gate/up/SwiGLU, down + combine.
  // Its device time per op is the decode cost of one MoE layer, launches and waits included.
  v.push_back({"moe_layer_qwen3_30b_4bit (chained)", 8.0 * 3 * 768 * 2048 * (0.5 + 4.0 / 64) + 128.0 * 2048 * 4,
               [](ProgramBuilder& b, int r, const In& in, std::map<std::string, Tensor>& c) {
                 const std::string id = std::to_string(r);
                 c["mn" + id] = filled(DType::kF32, {2048}, 23 + r, 1.f);
                 c["mr" + id] = filled(DType::kF32, {128, 2048}, 29 + r, 0.02f);
                 TensorRef h = b.rms_norm(in.x, b.constant("mn" + id, DType::kF32, {2048}));
                 RouterSpec spec;
                 spec.k = 8;
                 spec.renormalize = true;
                 RouterOut ro = b.router(b.matmul(h, b.constant("mr" + id, DType::kF32, {128, 2048})), spec);
                 MoeExperts e{experts(b, c, "mg", r, 128, 768, 2048), experts(b, c, "mu", r, 128, 768, 2048),
                              experts(b, c, "md", r, 128, 2048, 768)};
                 return b.moe_experts(h, ro.weights, ro.indices, e);
               },
               true});
  // Qwen3-30B-A3B's routed experts over a 512-token prefill (top-8 of 128, routing drawn at random,
  // distinct per copy): the sorted tiles' kernels alone (int8 MMA where the device has them).
  v.push_back({"moe_experts_prefill_512_qwen3_30b_4bit",
               128.0 * 3 * 768 * 2048 * (0.5 + 4.0 / 64),
               [](ProgramBuilder& b, int r, const In& in, std::map<std::string, Tensor>& c) {
                 const std::string id = std::to_string(r);
                 std::vector<int32_t> idx(512 * 8), all(128);
                 std::mt19937 rng(static_cast<uint32_t>(43 + r));
                 for (int32_t e = 0; e < 128; ++e) all[e] = e;
                 for (int row = 0; row < 512; ++row) {
                   std::shuffle(all.begin(), all.end(), rng);
                   std::copy(all.begin(), all.begin() + 8, idx.begin() + row * 8);
                 }
                 c["pi" + id] = Tensor::from_vector<int32_t>(DType::kI32, {512, 8}, idx).value();
                 c["pr" + id] = filled(DType::kF32, {512, 8}, 47 + r, 0.1f);
                 MoeExperts e{experts(b, c, "pg", r, 128, 768, 2048), experts(b, c, "pu", r, 128, 768, 2048),
                              experts(b, c, "pd", r, 128, 2048, 768)};
                 return b.moe_experts(in.x, b.constant("pr" + id, DType::kF32, {512, 8}),
                                      b.constant("pi" + id, DType::kI32, {512, 8}), e);
               },
               false,
               false,
               {512, 2048}});
  // Qwen3.5-35B-A3B's GatedDeltaRule over a 512-token prefill (16 key heads, 32 value heads of
  // 128; f32 rows; a state per copy): the row-by-row recurrence and its per-row terms.
  v.push_back({"gated_delta_rule_prefill_512_qwen35",
               0,
               [](ProgramBuilder& b, int r, const In& in, std::map<std::string, Tensor>& c) {
                 const std::string id = std::to_string(r);
                 c["da" + id] = filled(DType::kF32, {512, 32}, 53 + r, 1.f);
                 c["db" + id] = filled(DType::kF32, {512, 32}, 59 + r, 1.f);
                 c["dl" + id] = filled(DType::kF32, {32}, 61 + r, 0.5f);
                 c["dd" + id] = filled(DType::kF32, {32}, 67 + r, 0.5f);
                 return b.gated_delta_rule(
                     in.x, b.constant("da" + id, DType::kF32, {512, 32}), b.constant("db" + id, DType::kF32, {512, 32}),
                     b.constant("dl" + id, DType::kF32, {32}), b.constant("dd" + id, DType::kF32, {32}),
                     b.mutable_buffer("ds" + id, DType::kF32, {32, 128, 128}), 0, 0.088388346f);
               },
               false,
               false,
               {512, 2 * 16 * 128 + 32 * 128}});
  v.push_back({"qmm_qproj_4096x2048_4bit", 4096.0 * 2048 * (0.5 + 4.0 / 64),
               [](ProgramBuilder& b, int r, const In& in, std::map<std::string, Tensor>& c) {
                 return b.gather_qmm(in.x, experts(b, c, "q", r, 1, 4096, 2048));
               }});
  // Qwen3-30B-A3B attention at decode and in prefills of 64 and 512 rows (32 query heads, 4 KV
  // heads of 128, bf16, 576 keys of a 640-key cache), as the Attention op and as the decoder's
  // decomposed ops (the mask, made once per step and shared by the layers, is a constant here).
  // Distinct caches per copy.
  for (DType dt : {DType::kBF16, DType::kF32})
  for (int64_t m : {int64_t{1}, int64_t{64}, int64_t{512}}) {
    const int64_t pos = 576 - m;
    auto operands = [m, dt](ProgramBuilder& b, int r, std::map<std::string, Tensor>& c, TensorRef* q, TensorRef* kc,
                        TensorRef* vc) {
      const std::string id = std::to_string(r);
      c["aq" + id] = filled(dt, {m, 32, 128}, 31 + r, 1.f);
      c["ak" + id] = filled(dt, {4, 640, 128}, 37 + r, 1.f);
      c["av" + id] = filled(dt, {4, 640, 128}, 41 + r, 1.f);
      *q = b.constant("aq" + id, dt, {m, 32, 128});
      *kc = b.constant("ak" + id, dt, {4, 640, 128});
      *vc = b.constant("av" + id, dt, {4, 640, 128});
    };
    const std::string shape = "_m" + std::to_string(m) + "_len576_q32_kv4_" + dtype_name(dt);
    v.push_back({"attention_op" + shape, 2.0 * 4 * 576 * 128 * 2,
                 [operands, pos](ProgramBuilder& b, int r, const In&, std::map<std::string, Tensor>& c) {
                   TensorRef q, kc, vc;
                   operands(b, r, c, &q, &kc, &vc);
                   return b.attention(q, kc, vc, pos, 0.08837890625f);
                 }});
    v.push_back({"attention_op_decomposed_order" + shape, 2.0 * 4 * 576 * 128 * 2,
                 [operands, pos](ProgramBuilder& b, int r, const In&, std::map<std::string, Tensor>& c) {
                   TensorRef q, kc, vc;
                   operands(b, r, c, &q, &kc, &vc);
                   return b.attention_decomposed_order(q, kc, vc, pos, 0.08837890625f, -1.0e30f);
                 }});
    v.push_back({"attention_decomposed" + shape, 2.0 * 4 * 576 * 128 * 2,
                 [operands, pos, m, dt](ProgramBuilder& b, int r, const In&, std::map<std::string, Tensor>& c) {
                   TensorRef q, kc, vc;
                   operands(b, r, c, &q, &kc, &vc);
                   c["am" + std::to_string(r)] = Tensor::zeros(dt, {m, 576}).value();
                   TensorRef mask = b.constant("am" + std::to_string(r), dt, {m, 576});
                   TensorRef keys = b.slice(kc, 1, 0, pos + m), values = b.slice(vc, 1, 0, pos + m);
                   TensorRef sc = b.batch_matmul(b.transpose(q, {1, 0, 2}), keys);
                   sc = b.add(b.mul(sc, b.full({1}, dt, 0.08837890625)), mask);
                   TensorRef o = b.batch_matmul(b.softmax(sc), values, false);
                   return b.reshape(b.transpose(o, {1, 0, 2}), {m, 32 * 128});
                 }});
  }
  return v;
}

int run(const std::string& device, int reps, int iters, const std::string& only) {
  for (const Case& cs : cases()) {
    if (cs.name.find(only) == std::string::npos) continue;
    ProgramBuilder b;
    std::map<std::string, Tensor> consts;
    In in{b.input("x", DType::kF32, {cs.x_shape[0], cs.x_shape[1]}), {}, {}};
    if (cs.indices) in.rhs = b.input("rhs", DType::kI32, {8}), in.lhs = b.input("lhs", DType::kI32, {8});
    TensorRef cur = in.x;
    for (int r = 0; r < reps; ++r) {
      In ri = in;
      if (cs.chained) ri.x = cur;
      TensorRef y = cs.op(b, r, ri, consts);
      if (cs.chained) cur = y;
      else b.output("y" + std::to_string(r), y);
    }
    if (cs.chained) b.output("y", cur);
    auto bytes = b.serialize();
    if (!bytes) return std::fprintf(stderr, "%s: %s\n", cs.name.c_str(), bytes.status().to_string().c_str()), 1;
    LoadOptions lo;
    lo.constants.assign(consts.begin(), consts.end());
    auto program = Program::from_bytes(std::move(bytes).value(), "gpu_decode_bench", lo);
    if (!program) return std::fprintf(stderr, "%s\n", program.status().to_string().c_str()), 1;
    auto session = Session::create(*program, SessionOptions{device, false});
    if (!session) return std::fprintf(stderr, "%s\n", session.status().to_string().c_str()), 1;
    Session& s = **session;
    (void)s.set_input("x", filled(DType::kF32, cs.x_shape, 3, 1.f));
    std::mt19937 rng(5);
    std::vector<double> device_us, wall_us;
    for (int i = 0; i < iters + 1; ++i) {
      std::vector<int32_t> rhs(8), lhs(8);
      for (int j = 0; j < 8; ++j) rhs[j] = static_cast<int32_t>(rng() % 64), lhs[j] = j;
      if (cs.indices) {
        (void)s.set_input("rhs", Tensor::from_vector<int32_t>(DType::kI32, {8}, rhs).value());
        (void)s.set_input("lhs", Tensor::from_vector<int32_t>(DType::kI32, {8}, lhs).value());
      }
      auto t0 = std::chrono::steady_clock::now();
      if (Status st = s.execute(); !st) return std::fprintf(stderr, "%s\n", st.to_string().c_str()), 1;
      const double wall = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      if (i == 0) continue;  // warm-up: uploads, pipelines
      device_us.push_back(s.last_device_time_us() / reps);
      wall_us.push_back(wall / reps);
    }
    std::sort(device_us.begin(), device_us.end());
    std::sort(wall_us.begin(), wall_us.end());
    const double dev = device_us[device_us.size() / 2], wall = wall_us[wall_us.size() / 2];
    nlohmann::json j = {{"benchmark", "gpu_decode"}, {"case", cs.name}, {"device", s.device_name()},
                        {"ops_per_execute", reps}, {"wall_us_per_op", wall}};
    if (dev > 0) {
      j["device_us_per_op"] = dev;
      if (cs.bytes_per_op > 0) j["weight_gbps"] = cs.bytes_per_op / (dev * 1e-6) / 1e9;
    }
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string device = "vulkan";
  int reps = 16, iters = 20;
  std::string only;  // --case: run the cases whose name contains it
  const char* usage = "usage: gpu_decode_bench [--device D] [--reps N] [--iters N] [--case NAME-PART]\n";
  for (int i = 1; i < argc; i += 2) {
    const bool valued = i + 1 < argc;
    if (valued && !std::strcmp(argv[i], "--device")) device = argv[i + 1];
    else if (valued && !std::strcmp(argv[i], "--reps")) reps = std::max(1, std::atoi(argv[i + 1]));
    else if (valued && !std::strcmp(argv[i], "--iters")) iters = std::max(1, std::atoi(argv[i + 1]));
    else if (valued && !std::strcmp(argv[i], "--case")) only = argv[i + 1];
    else {  // --help, an unknown flag or one without its value: the usage, not a run of every case
      const bool help = !std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h");
      std::fputs(usage, help ? stdout : stderr);
      return help ? 0 : 2;
    }
  }
  return run(device, reps, iters, only);
}
