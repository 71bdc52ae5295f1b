// RequestValidator: checks a GenerationRequest against the model and the server's limits and
// resolves every unset field to the server's default. Every rejection is INVALID_ARGUMENT with a
// message that says what to change.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/engine.h"
#include "engine/model.h"
#include "engine/scheduler.h"
#include "engine/sampler.h"
#include "engine/tokenizer.h"

namespace heavykv {

struct ResolvedRequest {
  std::string request_id;
  std::vector<int32_t> prompt;  // token ids, BOS first
  int32_t max_new_tokens = 0;
  SamplingParams sampling;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  std::string policy;
  int32_t budget_tokens = 0;  // resolved against prompt + max_new_tokens; unused for "full"
  double recent_fraction = 0.5;
  bool logprobs = false;
  std::optional<absl::Time> deadline;
  absl::Time arrival;
};

// Checks the server defaults of `options` (policy, budget, recent fraction).
absl::Status ValidateDefaults(const EngineOptions& options);

class RequestValidator {
 public:
  // `tokenizer` may be null (token ids only). `scheduler` (read only, thread-safe queries) tells
  // whether a request could ever fit the KV pool, even alone.
  RequestValidator(const ModelConfig& config, const Tokenizer* tokenizer,
                   const EngineOptions& options, const Scheduler* scheduler);

  absl::StatusOr<ResolvedRequest> Resolve(const GenerationRequest& request) const;
  // BOS + the encoding of `text`; INVALID_ARGUMENT without a tokenizer or for invalid UTF-8.
  absl::StatusOr<std::vector<int32_t>> Encode(const std::string& text) const;

 private:
  ModelConfig config_;
  const Tokenizer* tokenizer_;
  EngineOptions options_;
  const Scheduler* scheduler_;
};

}  // namespace heavykv
