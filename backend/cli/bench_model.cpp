// `switchboard bench model`: prefill and decode of a whole exported model, with peak RSS
// and the decode roofline (weight + KV bytes one token reads / DRAM bandwidth measured in
// the same run).
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "cli.h"
#include "switchboard/model.h"

namespace switchboard::cli {

namespace {

int fail(const Status& st) {
  std::fprintf(stderr, "switchboard bench model: %s\n", st.to_string().c_str());
  return 1;
}

int64_t attribute(const Program& p, const char* name) {
  int64_t v = 0;
  return p.attribute(name, &v) ? v : -1;
}

double peak_rss_mib() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;  // Linux reports KiB
}

}  // namespace

int run_bench_model(const BenchModelOptions& o) {
  if (o.threads > 0) set_cpu_threads(o.threads);
  auto program = load_model(o.program);
  if (!program) return fail(program.status());
  const Program& p = **program;
  const int64_t vocab = attribute(p, "model.vocab"), max_seq = attribute(p, "model.max_seq");
  const int64_t weight_bytes = attribute(p, "model.decode_weight_bytes");
  const int64_t kv_bytes = attribute(p, "model.kv_bytes_per_position");
  if (vocab <= 0 || max_seq <= 0 || weight_bytes < 0 || kv_bytes < 0)
    return fail(make_error(StatusCode::kInvalidArgument, "%s: not a model program (model.* attributes missing)",
                           o.program.c_str()));
  if (o.prompt_len + o.gen - 1 > max_seq)
    return fail(make_error(StatusCode::kInvalidArgument, "--prompt-len %lld + --gen %lld exceed max_seq %lld",
                           (long long)o.prompt_len, (long long)o.gen, (long long)max_seq));
  auto session = Session::create(*program, SessionOptions{o.device, true});
  if (!session) return fail(session.status());
  std::mt19937 rng(7);
  std::vector<int32_t> prompt(static_cast<size_t>(o.prompt_len));
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  // Warm-up (first use of each weight table repacks it on the CPU), then the timed run.
  const std::vector<int32_t> warm(prompt.begin(), prompt.begin() + std::min<int64_t>(o.prompt_len, 16));
  if (auto g = models::generate(**session, warm, 2, false); !g) return fail(g.status());
  const double dram_before = measure_dram_gbps();
  auto g = models::generate(**session, prompt, o.gen, false);
  if (!g) return fail(g.status());
  const double dram = std::max(dram_before, measure_dram_gbps());
  const int64_t steps = o.gen - 1;
  const double decode_tps = steps > 0 ? static_cast<double>(steps) / g->decode_seconds : 0;
  // A decode step at position q reads every weight once plus q cached positions.
  const double mean_pos = static_cast<double>(o.prompt_len) + static_cast<double>(steps - 1) / 2.0;
  const double bytes_per_token = static_cast<double>(weight_bytes) + mean_pos * static_cast<double>(kv_bytes);
  const double roofline_tps = dram * 1e9 / bytes_per_token;
  nlohmann::json j = {{"benchmark", "model"},
                      {"program", o.program},
                      {"device", (*session)->device_name()},
                      {"threads", cpu_threads()},
                      {"prompt_len", o.prompt_len},
                      {"gen", o.gen},
                      {"prefill_seconds", g->prefill_seconds},
                      {"prefill_tok_s", static_cast<double>(o.prompt_len) / g->prefill_seconds},
                      {"decode_steps", steps},
                      {"decode_seconds", g->decode_seconds},
                      {"decode_tok_s", decode_tps},
                      {"decode_bytes_per_token", bytes_per_token},
                      {"dram_gbps", dram},
                      {"decode_roofline_tok_s", roofline_tps},
                      {"decode_roofline_ratio", steps > 0 ? decode_tps / roofline_tps : 0.0},
                      {"peak_rss_mib", peak_rss_mib()}};
  if ((*session)->device_name() != "cpu" && g->decode_device_us > 0 && steps > 0) {
    // On a GPU the roofline is its own memory; the time, its kernels' (timestamps).
    const double gbps = measure_device_bandwidth((*session)->device_name(), 0).gbps;
    const double gpu_tps = static_cast<double>(steps) / (g->decode_device_us * 1e-6);
    j["device_gbps"] = gbps;
    j["prefill_gpu_tok_s"] = static_cast<double>(o.prompt_len) / (g->prefill_device_us * 1e-6);
    j["decode_gpu_tok_s"] = gpu_tps;
    if (gbps > 0) j["gpu_decode_roofline_ratio"] = gpu_tps / (gbps * 1e9 / bytes_per_token);
  }
  std::printf("%s\n", o.json ? j.dump().c_str() : j.dump(2).c_str());
  return 0;
}

}  // namespace switchboard::cli
