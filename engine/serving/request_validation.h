// RequestValidator: checks a GenerationRequest against the model and the server's limits and
// resolves every unset field to the server's default. Every rejection is INVALID_ARGUMENT with a
// message that says what to change; a message quotes client text only as a short escaped prefix.
//
// Validation runs in two phases so that no unbounded work happens before the cheap checks:
//   Precheck(q)            sizes and counts of every field (request id, prompt bytes, stop strings,
//                          token ids, policy name), sampling ranges: O(size of the request), no
//                          tokenizing. The engine runs it on the caller's thread.
//   PromptTokens(q, stop)  the prompt's token ids: the tokenizer for text (O(n log n), stoppable),
//                          or the given ids with BOS. The engine runs it on its tokenizer thread.
//   Resolve(q, prompt)     every check that needs the prompt's length (context, budget, pool).
// Resolve(q) runs all three in order.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/model/model.h"
#include "engine/serving/engine.h"
#include "engine/serving/sampler.h"
#include "engine/serving/scheduler.h"
#include "engine/tokenizer/tokenizer.h"

namespace heavykv {

// Bounds on what one request may carry (docs/SECURITY.md). Each keeps the work and memory one
// request can cause small next to a generation; a client that needs more is doing something else.
inline constexpr size_t kMaxRequestIdBytes = 256;
inline constexpr size_t kMaxStopStrings = 32;
inline constexpr size_t kMaxStopStringBytes = 256;
inline constexpr size_t kMaxChatRoleBytes = 64;
inline constexpr size_t kMaxStopTokenIds = 256;
inline constexpr int32_t kMaxTopLogprobs = 20;  // as OpenAI and vLLM's default
inline constexpr size_t kMaxLogitBias = 4096;    // logit_bias entries of one request
inline constexpr size_t kMaxPolicyNameBytes = 64;
inline constexpr size_t kMaxClientKeyBytes = 256;

// At most `max_bytes` of `s`, C-escaped (quotes, backslashes, control and non-ASCII bytes as \xNN),
// with "..." when cut: how client text appears in error messages and logs.
std::string EscapedPrefix(std::string_view s, size_t max_bytes = 32);

struct ResolvedRequest {
  std::string request_id;
  std::string client;           // who sent it, for fair scheduling (GenerationRequest::client)
  std::string tenant;           // whose cached prefixes it may reuse (GenerationRequest::tenant)
  std::vector<int32_t> prompt;  // token ids, BOS first
  int32_t max_new_tokens = 0;
  SamplingParams sampling;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  std::string policy;  // the spec, as the request (or the server default) gave it
  // The policy object of `policy` (with the server's --evict-granularity where the spec names
  // none), built once here and shared by the engine's checks and the sequence; null for full.
  std::shared_ptr<const EvictionPolicy> kv_policy;
  int32_t budget_tokens = 0;  // resolved against prompt + max_new_tokens; unused for "full"
  // The request's own K/V row type (kv_dtype int8/int4 narrower than the pool's); kNone: the
  // pool's. kv_dtype: the type's name either way.
  KvQuant kv_quant = KvQuant::kNone;
  std::string kv_dtype;
  double recent_fraction = 0.5;
  bool logprobs = false;
  int32_t top_logprobs = 0;
  int32_t prompt_logprobs = -1;  // GenerationRequest::prompt_logprobs
  bool skip_special_tokens = true;
  std::optional<absl::Time> deadline;
  absl::Time arrival;
  int32_t n = 1;  // choices (GenerationRequest::n)
};

// The sampling API's fields of `q` (min_p, the penalties, logit_bias, min_tokens) are in range
// and finite, token ids within `vocab_size`: what Precheck checks of them, for callers that run a
// Sampler without a RequestValidator (`heavykv run`).
absl::Status CheckSamplingApi(const GenerationRequest& q, int32_t vocab_size);
// Sets those fields of `out` from `q` (unset: off). banned_until_min: `end_ids` (the tokens that
// end a generation, unless q.ignore_eos) and q's stop_token_ids, when min_tokens > 0.
void ResolveSamplingApi(const GenerationRequest& q, std::span<const int32_t> end_ids,
                        SamplingParams& out);

// Checks the server defaults of `options` (policy, budget, recent fraction).
absl::Status ValidateDefaults(const EngineOptions& options);

class RequestValidator {
 public:
  // `tokenizer` may be null (token ids only). `scheduler` (read only, thread-safe queries) tells
  // whether a request could ever fit the KV pool, even alone.
  RequestValidator(const ModelConfig& config, const TextTokenizer* tokenizer,
                   const EngineOptions& options, const Scheduler* scheduler);

  absl::Status Precheck(const GenerationRequest& request) const;
  // For a request that passed Precheck (its text is not checked again). CANCELLED when
  // `should_stop` turned true while tokenizing; for a chat, INVALID_ARGUMENT or
  // RESOURCE_EXHAUSTED from its template, INVALID_ARGUMENT when the rendered prompt is too long.
  absl::StatusOr<std::vector<int32_t>> PromptTokens(
      const GenerationRequest& request, const std::function<bool()>& should_stop = nullptr) const;
  absl::StatusOr<ResolvedRequest> Resolve(const GenerationRequest& request,
                                          std::vector<int32_t> prompt) const;
  absl::StatusOr<ResolvedRequest> Resolve(const GenerationRequest& request) const;

  // The encoding of `text` (`add_special`: with BOS/EOS as the tokenizer adds them);
  // INVALID_ARGUMENT without a tokenizer, for invalid UTF-8 or for more than max_prompt_bytes();
  // CANCELLED when `should_stop` turned true.
  absl::StatusOr<std::vector<int32_t>> Encode(const std::string& text, bool add_special = true,
                                              const std::function<bool()>& should_stop = nullptr) const;
  // The prompt text of a chat: `q.messages` rendered with the chat template, with q's
  // add_generation_prompt, chat_tools and chat_template_kwargs.
  absl::StatusOr<std::string> RenderChat(const GenerationRequest& q) const;

  int32_t max_prompt_tokens() const;
  // Longest prompt text accepted, in bytes: EngineOptions::max_prompt_bytes, or by default
  // max_prompt_tokens() times the tokenizer's longest piece (no token covers more bytes than its
  // piece, so a longer text can never fit).
  int64_t max_prompt_bytes() const { return max_prompt_bytes_; }

 private:
  // A chat template and a tokenizer exist (else FAILED_PRECONDITION); 1..max_chat_messages
  // messages with a role each, within max_prompt_bytes() in all, valid UTF-8.
  absl::Status CheckChat(const GenerationRequest& q) const;
  // The tokenizer exists, `text` is within max_prompt_bytes() and valid UTF-8; `what` names it in
  // the message ("prompt", "text").
  absl::Status CheckText(const std::string& text, absl::string_view what) const;
  // The encoding of a text CheckText accepted; BOS when `bos`, EOS when `eos`.
  absl::StatusOr<std::vector<int32_t>> EncodeChecked(const std::string& text, bool bos, bool eos,
                                                     const std::function<bool()>& should_stop) const;

  ModelConfig config_;
  const TextTokenizer* tokenizer_;
  EngineOptions options_;
  const Scheduler* scheduler_;
  int64_t max_prompt_bytes_ = 0;
  // The text of the tokenizer's BOS / EOS ("" without one): a chat template's bos_token and
  // eos_token.
  std::string bos_text_, eos_text_;
  // The ids that end a generation (EndsSequence), which min_tokens bans until it is reached.
  std::vector<int32_t> end_of_generation_ids_;
};

}  // namespace heavykv
