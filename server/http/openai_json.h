// The OpenAI HTTP API's JSON, without any I/O: request bodies -> GenerationRequest, and the
// response, stream chunk, usage, model list and tokenizer bodies. The field mapping and the
// shapes are in docs/ARCHITECTURE.md ("OpenAI HTTP API"); openai_http.h serves them.
//
//   absl::StatusOr<OpenAiRequest> q = ParseGenerationBody(ApiKind::kChat, body, limits);
//   if (!q.ok()) -> 400 with ErrorBody(q.status())   (server/http/http_status.h; `param` names the field)
//   ...Engine::Submit(q->generation, ...)
//   std::string event = SseEvent(StreamChunkJson(meta, delta_text, std::nullopt, false, false));
//
// Parse errors are INVALID_ARGUMENT with the field in the status's param payload (WithParam);
// a model other than the served one is NOT_FOUND ("model_not_found"). Never throws.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/status/statusor.h"
#include "engine/serving/engine.h"
#include "nlohmann/json.hpp"
#include "server/http/openai_logprobs.h"
#include "server/http/openai_tools.h"

namespace heavykv::server {

// What a request body is checked against.
struct OpenAiServed {
  std::string model;                 // the served model's name (`model` must be absent or this)
  int32_t max_new_tokens_limit = 0;  // a chat without max_tokens asks for this, to the context
  // The chat template's tool-call format: the constraint of tool_choice follows it.
  ToolCallFormat tool_call_format = ToolCallFormat::kGeneric;
};

struct OpenAiRequest {
  GenerationRequest generation;  // request_id and client are left for the caller
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  ChatTools tools;             // a chat's tools, tool_choice and parallel_tool_calls
  // The field generation.constraint came from (response_format, json_schema, ...): where the
  // engine's compile errors point (openai_constraint.h).
  std::string constraint_param;
  // Completions' echo: the response's text (and with logprobs its tokens) starts with the
  // prompt's. generation.prompt_logprobs asks the engine for what it needs.
  bool echo = false;
  // vLLM's prompt_logprobs: the response's per-prompt-token dicts, with this many top tokens.
  std::optional<int32_t> prompt_logprobs;
};

absl::StatusOr<OpenAiRequest> ParseGenerationBody(ApiKind kind, absl::string_view body,
                                                  const OpenAiServed& served);

// POST /tokenize: {"prompt": text, "add_special_tokens": true}, or as vLLM a chat:
// {"messages": [...], "add_generation_prompt": true, "tools", "chat_template_kwargs"},
// tokenized as a chat completion's prompt.
struct TokenizeBody {
  std::string prompt;
  bool add_special_tokens = true;
  // A chat: messages set, with add_generation_prompt, chat_tools and chat_template_kwargs.
  std::optional<GenerationRequest> chat;
};
absl::StatusOr<TokenizeBody> ParseTokenizeBody(absl::string_view body, const OpenAiServed& served);
// POST /detokenize: {"tokens": [ids]}.
absl::StatusOr<std::vector<int32_t>> ParseDetokenizeBody(absl::string_view body,
                                                         const OpenAiServed& served);

// What every response and chunk of one request repeats.
struct ResponseMeta {
  ApiKind kind = ApiKind::kCompletion;
  std::string id;       // cmpl-N / chatcmpl-N
  int64_t created = 0;  // Unix seconds
  std::string model;
};

// OpenAI's finish_reason for the engine's: length, stop (stop and eos), abort (cancelled).
std::string OpenAiFinishReason(const std::string& engine_reason);

// {prompt_tokens, completion_tokens, total_tokens, kv: {policy, budget_tokens, tokens_kept,
// tokens_evicted, peak_pages}}.
nlohmann::json UsageJson(const GenerationUsage& usage);

// One choice of a whole response: {index, text | message, logprobs, finish_reason (OpenAI's
// for the engine's `finish_reason`)}, and a completion's `prompt_logprobs` (vLLM's:
// PromptLogprobsJson, openai_logprobs.h; null unless asked for).
nlohmann::json ChoiceJson(ApiKind kind, int32_t index, const std::string& text,
                          const std::string& finish_reason, const nlohmann::json& logprobs,
                          const nlohmann::json& prompt_logprobs = nullptr);
// The whole (non-streaming) response of `choices` (ChoiceJson, in index order) and `usage`;
// a chat's `prompt_logprobs` is the response's (vLLM's place for it).
nlohmann::json ResponseJson(const ResponseMeta& meta, nlohmann::json choices,
                            const GenerationUsage& usage,
                            const nlohmann::json& prompt_logprobs = nullptr);
// The same for one choice: `text` is the generated text (after the prompt's with echo), `last`
// the finished delta, `logprobs` choices[0].logprobs (null unless asked for).
nlohmann::json ResponseJson(const ResponseMeta& meta, const std::string& text,
                            const GenerationDelta& last,
                            const nlohmann::json& logprobs = nullptr,
                            const nlohmann::json& prompt_logprobs = nullptr);

// One stream chunk of choice `index`: completion `text`, or a chat delta (with the role when
// `first`). `finish_reason` is null until the choice's last chunk; `include_usage` adds
// "usage": null; `logprobs` are those of the chunk's tokens (null unless asked for).
nlohmann::json StreamChunkJson(const ResponseMeta& meta, absl::string_view text,
                               const std::optional<std::string>& finish_reason, bool first,
                               bool include_usage, const nlohmann::json& logprobs = nullptr,
                               int32_t index = 0);
// The usage chunk sent before [DONE] with stream_options.include_usage: choices [] and usage.
nlohmann::json UsageChunkJson(const ResponseMeta& meta, const GenerationUsage& usage);

// "data: <json on one line>\n\n" (invalid UTF-8 replaced by U+FFFD, never thrown on).
std::string SseEvent(const nlohmann::json& chunk);
inline constexpr absl::string_view kSseDone = "data: [DONE]\n\n";

// `value` as compact JSON text (invalid UTF-8 replaced, never thrown on).
std::string JsonText(const nlohmann::json& value);

// GET /v1/models: the list of the one model; GET /v1/models/{id}: that model object alone.
nlohmann::json ModelsJson(const std::string& model, int64_t created, int32_t max_model_len);
nlohmann::json ModelJson(const std::string& model, int64_t created, int32_t max_model_len);

}  // namespace heavykv::server
