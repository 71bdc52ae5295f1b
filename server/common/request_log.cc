#include "server/common/request_log.h"

#include <string>

#include "spdlog/spdlog.h"

namespace heavykv::server {

void LogFinished(std::string_view log_id, const GenerationDelta& d) {
  spdlog::info(
      "request {} finished: {} prompt + {} completion tokens, queue {:.3f}s, ttft {:.3f}s, "
      "total {:.3f}s, policy {} budget {}, kv kept {} evicted {}, peak pages {}, finish {}{}",
      log_id, d.usage.prompt_tokens, d.usage.completion_tokens, d.timings.queue_seconds,
      d.timings.time_to_first_token_seconds, d.timings.total_seconds, d.usage.policy,
      d.usage.kv_budget_tokens == 0 ? std::string("none")
                                    : std::to_string(d.usage.kv_budget_tokens),
      d.usage.kv_tokens_kept, d.usage.kv_tokens_evicted, d.usage.peak_pages, d.finish_reason,
      d.error.empty() ? "" : " (" + d.error + ")");
}

}  // namespace heavykv::server
