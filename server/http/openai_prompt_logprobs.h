// vLLM's prompt_logprobs in an OpenAI response (its extension; docs/ARCHITECTURE.md "Prompt
// logprobs and echo"): one entry per prompt token, null for the first (nothing predicts it), then
// a dict keyed by token id (as a string) of {logprob, rank, decoded_token} for the prompt token
// and its position's most likely tokens:
//   [null, {"450": {"logprob": -2.1, "rank": 3, "decoded_token": " The"},
//           "263": {"logprob": -0.9, "rank": 1, "decoded_token": " a"}}, ...]
// The prompt token's rank is 1 + the tokens more likely than it; a top token's is its place among
// them (1 the most likely).
#pragma once

#include <cstdint>

#include "engine/serving/engine.h"
#include "nlohmann/json.hpp"

namespace heavykv::server {

// `prompt` as the engine scored it, with at most `top_n` top tokens per position.
nlohmann::json PromptLogprobsJson(const PromptLogprobs& prompt, int32_t top_n);

}  // namespace heavykv::server
