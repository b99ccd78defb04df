// `switchboard bench model`: prefill and decode of a whole exported model, with peak RSS
// and the decode roofline (weight + KV bytes one token reads / DRAM bandwidth measured in
// the same run).
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "cli.h"
#include "switchboard/builder.h"
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

// The synthetic shape's first o.layers layers, built and filled in memory: a per-layer
// comparison needs no 17 GB export (the weights are the ones `export --synthetic` writes).
Result<std::shared_ptr<const Program>> synthetic_model(const BenchModelOptions& o) {
  SB_ASSIGN_OR_RETURN(models::ModelConfig c, models::synthetic_config(o.synthetic));
  if (o.layers > 0 && o.layers < c.layers) {
    c.layers = o.layers;
    c.moe_layer.resize(static_cast<size_t>(c.layers));
    if (!c.linear_layer.empty()) c.linear_layer.resize(static_cast<size_t>(c.layers));
  }
  c.max_seq = o.max_seq > 0 ? o.max_seq : o.prompt_len + o.gen;
  models::ExportFormat f;
  auto dtype = dtype_from_name(o.dtype);
  if (!dtype) return make_error(StatusCode::kInvalidArgument, "--dtype %s: f32, f16 or bf16", o.dtype.c_str());
  f.dtype = *dtype;
  f.bits = o.bits;
  f.group_size = o.group_size;
  SB_RETURN_IF_ERROR(models::check_config(c));
  SB_RETURN_IF_ERROR(models::check_format(c, f));
  ProgramBuilder b;
  SB_RETURN_IF_ERROR(models::build_decoder(c, f, b));
  SB_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, b.serialize());
  LoadOptions lo;
  SB_ASSIGN_OR_RETURN(lo.constants, models::collect_weights([&](const models::WeightSink& sink) {
    return models::synthetic_weights(c, f, 2026, nullptr, sink);
  }));
  return Program::from_bytes(std::move(bytes), strformat("synthetic %s, %lld layers", o.synthetic.c_str(),
                                                         static_cast<long long>(c.layers)),
                             lo);
}

// Tokens a second of each prefill, in run order.
std::vector<double> prefill_rates(int64_t tokens, const std::vector<double>& seconds) {
  std::vector<double> r;
  for (double s : seconds) r.push_back(s > 0 ? static_cast<double>(tokens) / s : 0.0);
  return r;
}

}  // namespace

int run_bench_model(const BenchModelOptions& o) {
  if (o.threads > 0) set_cpu_threads(o.threads);
  auto program = o.synthetic.empty() ? load_model(o.program) : synthetic_model(o);
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
  // Warm-up (first use of each weight table repacks it on the CPU; a GPU's first recorded decode
  // step creates the buffers it keeps for its replays), then the timed run.
  const std::vector<int32_t> warm(prompt.begin(), prompt.begin() + std::min<int64_t>(o.prompt_len, 16));
  if (auto g = models::generate(**session, warm, 3, false); !g) return fail(g.status());
  // The prompt's prefill alone a few times (the first at a length allocates its buffers), then the
  // generation; the prefill figures are medians over all of them.
  std::vector<double> prefill_s, prefill_gpu_us, prefill_rec_us;
  for (int r = 0; r < o.prefill_runs; ++r) {
    auto pg = models::generate(**session, prompt, 1, false);
    if (!pg) return fail(pg.status());
    prefill_s.push_back(pg->prefill_seconds);
    prefill_gpu_us.push_back(pg->prefill_device_us);
    prefill_rec_us.push_back(pg->prefill_record_us);
  }
  const double dram_before = measure_dram_gbps();
  auto g = models::generate(**session, prompt, o.gen, false);
  if (!g) return fail(g.status());
  prefill_s.push_back(g->prefill_seconds);
  prefill_gpu_us.push_back(g->prefill_device_us);
  prefill_rec_us.push_back(g->prefill_record_us);
  const double prefill_seconds = median(prefill_s), prefill_device_us = median(prefill_gpu_us);
  const double dram = std::max(dram_before, measure_dram_gbps());
  const int64_t steps = o.gen - 1;
  const double decode_tps = steps > 0 ? static_cast<double>(steps) / g->decode_seconds : 0;
  // A decode step at position q reads every weight once plus q cached positions.
  const double mean_pos = static_cast<double>(o.prompt_len) + static_cast<double>(steps - 1) / 2.0;
  const double bytes_per_token = static_cast<double>(weight_bytes) + mean_pos * static_cast<double>(kv_bytes);
  const double roofline_tps = dram * 1e9 / bytes_per_token;
  nlohmann::json j = {{"benchmark", "model"},
                      {"program", o.synthetic.empty() ? o.program : "synthetic " + o.synthetic},
                      {"layers", attribute(p, "model.layers")},
                      {"device", (*session)->device_name()},
                      {"threads", cpu_threads()},
                      {"prompt_len", o.prompt_len},
                      {"gen", o.gen},
                      {"prefill_seconds", prefill_seconds},
                      {"prefill_tok_s", static_cast<double>(o.prompt_len) / prefill_seconds},
                      {"prefill_runs", prefill_s.size()},
                      {"prefill_tok_s_runs", prefill_rates(o.prompt_len, prefill_s)},
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
    j["prefill_gpu_tok_s"] = static_cast<double>(o.prompt_len) / (prefill_device_us * 1e-6);
    j["decode_gpu_tok_s"] = gpu_tps;
    j["dispatches_per_decode_token"] = static_cast<double>(g->decode_dispatches) / static_cast<double>(steps);
    j["prefill_dispatches"] = g->prefill_dispatches;
    // Host time recording a prefill's dispatches (median; the GPU runs the earlier slices meanwhile).
    j["prefill_record_us"] = median(prefill_rec_us);
    // Host time a decode token adds beyond its kernels (recording, submission, waits).
    j["decode_host_us_per_token"] = (g->decode_seconds * 1e6 - g->decode_device_us) / static_cast<double>(steps);
    // Host time recording a decode token's dispatches (overlaps the GPU after the first slice).
    // With replays: the host time submitting the recorded work.
    j["decode_record_us_per_token"] = g->decode_record_us / static_cast<double>(steps);
    j["decode_replayed_steps"] = g->decode_replays;
    if (gbps > 0) j["gpu_decode_roofline_ratio"] = gpu_tps / (gbps * 1e9 / bytes_per_token);
  }
  if ((*session)->device_name() == "cpu" && steps > 0) {
    // A CPU decode token's time outside its op kernels: the interpreter, plus feeding the token.
    const double wall_us = g->decode_seconds * 1e6;
    j["decode_kernel_us_per_token"] = g->decode_kernel_us / static_cast<double>(steps);
    j["decode_interpreter_share"] = wall_us > 0 ? 1.0 - g->decode_kernel_us / wall_us : 0.0;
    // Buffers the decode steps took from the system allocator (the pool serves repeated shapes).
    j["decode_allocations_per_token"] = static_cast<double>(g->decode_allocations) / static_cast<double>(steps);
  }
  std::printf("%s\n", o.json ? j.dump().c_str() : j.dump(2).c_str());
  return 0;
}

}  // namespace switchboard::cli
