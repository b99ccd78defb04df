// `switchboard export | run | validate`: whole models from Hugging Face checkpoints (or
// the tiny test model) to greedy tokens, on one device or two side by side.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <unistd.h>

#include "cli.h"
#include "file_io.h"
#include "switchboard/model.h"

namespace switchboard::cli {
namespace {

namespace fs = std::filesystem;

int fail(const char* cmd, const Status& st) {
  std::fprintf(stderr, "switchboard %s: %s\n", cmd, st.to_string().c_str());
  return 1;
}

// One line redrawn in place on a terminal; every 10% on a log.
void progress_bar(size_t done, size_t total) {
  static int last = -1;
  const int pct = total ? static_cast<int>(100 * done / total) : 100;
  const bool tty = isatty(STDERR_FILENO) != 0;
  if (pct == last || (!tty && pct % 10 != 0 && done != total)) return;
  last = pct;
  const int width = 30, fill = pct * width / 100;
  std::fprintf(stderr, "%sconverting [%s%s] %3d%% (%zu/%zu tensors)%s", tty ? "\r" : "", std::string(fill, '#').c_str(),
               std::string(width - fill, ' ').c_str(), pct, done, total, tty && done != total ? "" : "\n");
  if (done == total) last = -1;
}

Result<std::vector<int32_t>> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 0 || v > INT32_MAX)
      return make_error(StatusCode::kInvalidArgument, "--prompt-ids: '%s' is not a token id", clip(item).c_str());
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) return make_error(StatusCode::kInvalidArgument, "--prompt-ids: no ids");
  return ids;
}

std::string ids_str(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + "]";
}

}  // namespace

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

Result<std::shared_ptr<const Program>> load_model(const std::string& path) {
  fs::path program = path, weights;
  if (fs::is_directory(program)) program /= "program.sbp";
  weights = program.parent_path() / "weights.safetensors";
  return Program::load(program.string(), LoadOptions{{weights.string()}});
}

Status check_prompt(const Program& p, const std::vector<int32_t>& prompt, int64_t new_tokens) {
  int64_t vocab = 0, max_seq = 0;
  if (!p.attribute("model.vocab", &vocab) || !p.attribute("model.max_seq", &max_seq))
    return make_error(StatusCode::kInvalidArgument, "not a model program (no model.vocab / model.max_seq attributes)");
  for (int32_t id : prompt)
    if (id >= vocab)
      return make_error(StatusCode::kInvalidArgument, "--prompt-ids: %d is outside the vocabulary (%lld)", id,
                        (long long)vocab);
  if (static_cast<int64_t>(prompt.size()) + new_tokens > max_seq + 1)
    return make_error(StatusCode::kInvalidArgument, "%zu prompt + %lld new tokens exceed the program's max_seq %lld",
                      prompt.size(), (long long)new_tokens, (long long)max_seq);
  return Status::ok();
}

int run_export(const ExportCliOptions& o) {
  models::ExportOptions e;
  e.max_seq = o.max_seq;
  e.progress = progress_bar;
  auto dtype = dtype_from_name(o.dtype);
  if (!dtype) return fail("export", make_error(StatusCode::kInvalidArgument, "--dtype %s: f32, f16 or bf16", o.dtype.c_str()));
  e.format.dtype = *dtype;
  e.format.bits = o.bits;
  e.format.group_size = o.group_size;
  if (!o.bit_map.empty()) {
    if (o.bits == 0) return fail("export", make_error(StatusCode::kInvalidArgument, "--bit-map needs --bits"));
    if (Status st = models::read_bit_map(o.bit_map, &e.format); !st.is_ok()) return fail("export", st);
  }
  Status st;
  if (o.tiny_test) {
    auto tiny = models::tiny_test_config(o.tiny_family);
    if (!tiny) return fail("export", tiny.status());
    models::ModelConfig c = *tiny;
    if (o.max_seq > 0) c.max_seq = o.max_seq;
    st = models::check_config(c);
    if (st.is_ok()) st = models::check_format(c, e.format);
    if (st.is_ok()) {
      st = models::write_model(o.out, c, e.format, [&](const models::WeightSink& sink) {
        return models::random_weights(c, e.format, 2026, sink);
      });
    }
  } else if (!o.synthetic.empty()) {
    auto c = models::synthetic_config(o.synthetic);
    st = c ? Status::ok() : c.status();
    if (st.is_ok() && o.max_seq > 0) c->max_seq = o.max_seq;
    if (st.is_ok() && o.layers > 0 && o.layers < c->layers) {
      c->layers = o.layers;
      c->moe_layer.resize(static_cast<size_t>(c->layers));
      if (!c->linear_layer.empty()) c->linear_layer.resize(static_cast<size_t>(c->layers));
    }
    if (st.is_ok() && o.bits == 0) st = make_error(StatusCode::kInvalidArgument, "--synthetic needs --bits");
    if (st.is_ok()) st = models::check_config(*c);
    if (st.is_ok()) st = models::check_format(*c, e.format);
    if (st.is_ok()) {
      st = models::write_model(o.out, *c, e.format, [&](const models::WeightSink& sink) {
        return models::synthetic_weights(*c, e.format, 2026, progress_bar, sink);
      });
    }
  } else {
    st = models::export_hf(o.hf_dir, o.out, e);
  }
  if (!st.is_ok()) return fail("export", st);
  std::printf("wrote %s/program.sbp and %s/weights.safetensors\n", o.out.c_str(), o.out.c_str());
  return 0;
}

int run_run(const RunOptions& o) {
  auto prompt = parse_ids(o.prompt_ids);
  if (!prompt) return fail("run", prompt.status());
  auto program = load_model(o.program);
  if (!program) return fail("run", program.status());
  if (Status st = check_prompt(**program, *prompt, o.max_new_tokens); !st.is_ok()) return fail("run", st);
  auto session = Session::create(*program, SessionOptions{o.device, true});
  if (!session) return fail("run", session.status());
  auto g = models::generate(**session, *prompt, o.max_new_tokens, false);
  if (!g) return fail("run", g.status());
  std::printf("device: %s\n", (*session)->device_name().c_str());
  std::printf("Generated token ids: %s\n", ids_str(g->tokens).c_str());
  const double prefill_tps = static_cast<double>(prompt->size()) / g->prefill_seconds;
  const int64_t decoded = std::max<int64_t>(0, o.max_new_tokens - 1);  // the prefill makes the first token
  std::printf("prefill: %zu tokens in %.2f ms = %.1f tok/s\n", prompt->size(), g->prefill_seconds * 1e3, prefill_tps);
  if (decoded > 0)
    std::printf("decode: %lld tokens in %.2f ms = %.1f tok/s\n", (long long)decoded, g->decode_seconds * 1e3,
                static_cast<double>(decoded) / g->decode_seconds);
  return 0;
}

int run_validate(const ValidateOptions& o) {
  auto prompt = parse_ids(o.prompt_ids);
  if (!prompt) return fail("validate", prompt.status());
  struct Side {
    std::string program, device;
    std::shared_ptr<const Program> p;
    std::unique_ptr<Session> s;
    std::vector<double> prefill, decode;
    models::Generation g;
  };
  Side sides[2] = {{o.program_a, o.device_a}, {o.program_b.empty() ? o.program_a : o.program_b, o.device_b}};
  for (Side& side : sides) {
    auto p = load_model(side.program);
    if (!p) return fail("validate", p.status());
    side.p = *p;
    if (Status st = check_prompt(*side.p, *prompt, o.max_new_tokens); !st.is_ok()) return fail("validate", st);
    auto s = Session::create(side.p, SessionOptions{side.device, true});
    if (!s) return fail("validate", s.status());
    side.s = std::move(s).value();
    for (int run = 0; run < std::max(1, o.runs); ++run) {
      auto g = models::generate(*side.s, *prompt, o.max_new_tokens, true);
      if (!g) return fail("validate", g.status());
      side.prefill.push_back(static_cast<double>(prompt->size()) / g->prefill_seconds);
      if (o.max_new_tokens > 1) side.decode.push_back(static_cast<double>(o.max_new_tokens - 1) / g->decode_seconds);
      side.g = std::move(g).value();
    }
  }
  const auto &a = sides[0].g, &b = sides[1].g;
  int64_t diverge = -1, bitwise = 0;
  double worst = 0;
  for (size_t i = 0; i < a.tokens.size(); ++i) {
    if (diverge < 0 && a.tokens[i] != b.tokens[i]) diverge = static_cast<int64_t>(i);
    if (diverge >= 0) continue;  // after a divergence the inputs differ: nothing to compare
    const Tensor &la = a.logits[i], &lb = b.logits[i];
    if (la.shape() != lb.shape())
      return fail("validate", make_error(StatusCode::kInvalidArgument, "the programs' logits differ in shape: %s vs %s",
                                         shape_str(la.shape()).c_str(), shape_str(lb.shape()).c_str()));
    bitwise += std::memcmp(la.data(), lb.data(), la.nbytes()) == 0;
    for (int64_t v = 0; v < la.numel(); ++v)
      worst = std::max(worst, std::fabs(static_cast<double>(la.data_as<float>()[v]) - lb.data_as<float>()[v]));
  }
  for (int i = 0; i < 2; ++i)
    std::printf("%s: %s on %s: tokens %s; median prefill %.1f tok/s, decode %.1f tok/s\n", i ? "B" : "A",
                sides[i].program.c_str(), sides[i].s->device_name().c_str(), ids_str(sides[i].g.tokens).c_str(),
                median(sides[i].prefill), median(sides[i].decode));
  const size_t compared = diverge < 0 ? a.tokens.size() : static_cast<size_t>(diverge);
  std::printf("logits: %lld of %zu steps bitwise equal, max |A - B| = %.3g\n", (long long)bitwise, compared, worst);
  if (diverge >= 0) {
    std::printf("tokens: first divergence at step %lld: A %d, B %d\n", (long long)diverge, a.tokens[diverge],
                b.tokens[diverge]);
    return 2;
  }
  std::printf("tokens: identical (%zu)\n", a.tokens.size());
  return 0;
}

}  // namespace switchboard::cli
