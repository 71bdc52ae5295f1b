// The log-probability objects of OpenAI responses, without any I/O: the per-token logprobs of
// completions (the legacy shape, with echo's prompt first) and chats, and vLLM's prompt_logprobs.
// openai_json.h puts them into responses and stream chunks.
#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "engine/serving/engine.h"
#include "nlohmann/json.hpp"

namespace heavykv::server {

enum class ApiKind { kCompletion, kChat };

// The logprobs of a response's tokens in its API's shape, gathered delta by delta (with echo, the
// prompt's first):
//   completion (legacy): {tokens: [str], token_logprobs: [num], top_logprobs: [{str: num}] (the
//     top n and the sampled token, as vLLM), text_offset: [code points into the text]}
//   chat: {content: [{token, logprob, bytes: [int], top_logprobs: [{token, logprob, bytes}]}]}
// A token's string is its bytes (U+FFFD for part of a character; `bytes` has them exactly), or
// "token_id:N" without a tokenizer (LogprobTokenString).
std::string LogprobTokenString(const std::string& bytes, int32_t token);

class LogprobsJson {
 public:
  LogprobsJson(ApiKind kind, bool enabled) : kind_(kind), enabled_(enabled) {}
  bool enabled() const { return enabled_; }
  // Completions' echo: adds the prompt's tokens (the first with null logprob and top_logprobs),
  // with at most `top_n` top tokens each; `text` is the echoed prompt text, which the text of
  // later deltas follows. Before any Add.
  void AddPrompt(const PromptLogprobs& prompt, int32_t top_n, absl::string_view text);
  // Adds the tokens of `d`, whose text follows all text added before.
  void Add(const GenerationDelta& d);
  // What was added since the last Take, for choices[0].logprobs; null when not enabled.
  nlohmann::json Take();

 private:
  void Start();  // pending_ = the empty lists, unless it holds some

  ApiKind kind_;
  bool enabled_;
  nlohmann::json pending_;
  int64_t text_chars_ = 0;  // code points of the text added so far
};

// vLLM's prompt_logprobs (its extension; docs/ARCHITECTURE.md "Prompt logprobs and echo") of
// `prompt` as the engine scored it: one entry per prompt token, null for the first (nothing
// predicts it), then a dict keyed by token id (as a string) of {logprob, rank, decoded_token} for
// the prompt token and its position's `top_n` most likely tokens (at most):
//   [null, {"450": {"logprob": -2.1, "rank": 3, "decoded_token": " The"},
//           "263": {"logprob": -0.9, "rank": 1, "decoded_token": " a"}}, ...]
// The prompt token's rank is 1 + the tokens more likely than it; a top token's is its place among
// them (1 the most likely).
nlohmann::json PromptLogprobsJson(const PromptLogprobs& prompt, int32_t top_n);

}  // namespace heavykv::server
