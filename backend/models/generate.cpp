// Greedy generation over a decoder program's session (prefill, then one step per token).
#include <chrono>

#include "switchboard/model.h"

namespace switchboard::models {

Result<Generation> generate(Session& session, const std::vector<int32_t>& prompt, int64_t new_tokens,
                            bool keep_logits, const std::vector<int32_t>* forced) {
  SB_CHECK_OR_RETURN(!prompt.empty(), StatusCode::kInvalidArgument, "the prompt is empty");
  SB_CHECK_OR_RETURN(new_tokens >= 0, StatusCode::kInvalidArgument, "new_tokens %lld < 0", (long long)new_tokens);
  SB_CHECK_OR_RETURN(!forced || static_cast<int64_t>(forced->size()) >= new_tokens, StatusCode::kInvalidArgument,
                     "forced tokens: %zu for %lld steps", forced ? forced->size() : size_t{0}, (long long)new_tokens);
  SB_RETURN_IF_ERROR(session.reset());
  Generation g;
  std::vector<int32_t> feed = prompt;
  int64_t pos = 0;
  for (int64_t step = 0; step < new_tokens; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const uint64_t d0 = session.device_dispatches(), a0 = buffer_allocations();
    SB_ASSIGN_OR_RETURN(Tensor tokens, Tensor::from_vector(DType::kI32, {static_cast<int64_t>(feed.size())}, feed));
    SB_RETURN_IF_ERROR(session.set_input("tokens", tokens));
    SB_RETURN_IF_ERROR(session.set_input_value("pos", pos));
    SB_RETURN_IF_ERROR(session.execute());
    SB_ASSIGN_OR_RETURN(Tensor next, session.output("next_token"));
    if (keep_logits) {
      SB_ASSIGN_OR_RETURN(Tensor logits, session.output("logits"));
      g.logits.push_back(logits.clone());
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    (step == 0 ? g.prefill_seconds : g.decode_seconds) += s;
    const double us = session.last_device_time_us();
    double& dev = step == 0 ? g.prefill_device_us : g.decode_device_us;
    dev = us < 0 || dev < 0 ? -1 : dev + us;
    const double rec = session.last_record_time_us();
    if (step > 0) g.decode_record_us = rec < 0 || g.decode_record_us < 0 ? -1 : g.decode_record_us + rec;
    else
      g.prefill_record_us = rec;
    (step == 0 ? g.prefill_dispatches : g.decode_dispatches) += session.device_dispatches() - d0;
    if (step > 0) g.decode_replays += session.last_execute_replayed() ? 1 : 0;
    if (step > 0) g.decode_kernel_us += session.last_kernel_time_us();
    if (step > 0) g.decode_allocations += buffer_allocations() - a0;
    g.tokens.push_back(next.data_as<int32_t>()[0]);
    pos += static_cast<int64_t>(feed.size());
    feed.assign(1, forced ? (*forced)[static_cast<size_t>(step)] : g.tokens.back());
  }
  return g;
}

}  // namespace switchboard::models
