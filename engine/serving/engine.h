// Engine: the serving core. Requests are submitted from any thread; one tokenizer thread turns
// text prompts into tokens, and one engine thread runs the continuous-batching loop (Scheduler
// plans a step, ModelRunner executes it, the engine samples, detokenizes and streams deltas back)
// over the shared KvCache.
//
//   auto engine = Engine::Create(std::move(model), std::move(tokenizer), options);
//   auto handle = engine->Submit(request, [](const GenerationDelta& d) { ... });
//   ...handle->Cancel();   // client gone: pages are freed at the next step
//
// Callbacks run on the engine's threads (the engine thread; the tokenizer thread for a request
// refused or cancelled before its prompt was tokenized), in order, one at a time per request;
// they must not block (queue the delta and return). The last delta of a request has `finished`
// set, exactly once, whatever the outcome (length, stop, eos, cancelled, error, rejected).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/chat/chat_template.h"
#include "engine/grammar/constraint_spec.h"
#include "engine/model/model.h"
#include "engine/runner/step_runner.h"
#include "engine/serving/sampler.h"
#include "engine/tokenizer/text_tokenizer.h"
#include "memory/eviction_policy.h"

namespace heavykv {

// Events for metrics, called on the engine's threads (must be cheap and thread-safe).
// The server turns them into Prometheus series; the engine itself knows no metrics library.
class EngineObserver {
 public:
  virtual ~EngineObserver() = default;
  virtual void OnStep(int32_t iteration_tokens) {}
  virtual void OnPromptTokens(int32_t n) {}
  virtual void OnGenerationTokens(int32_t n) {}
  virtual void OnFirstToken(double seconds_since_arrival) {}
  virtual void OnInterToken(double seconds) {}
  virtual void OnQueued(double queue_seconds) {}
  // `policy`: the policy's base name ("snapkv", never its parameters), a bounded label set.
  virtual void OnEvicted(const std::string& policy, int64_t tokens) {}
  virtual void OnPreemption() {}
  virtual void OnRequestFinished(const std::string& finish_reason, double e2e_seconds) {}
};

struct EngineOptions {
  EngineObserver* observer = nullptr;  // not owned; may be null
  int32_t block_size = 16;
  int32_t num_pages = 0;             // KV pool size in pages (required)
  int32_t max_step_tokens = 512;     // tokens per forward step (decode + prefill chunks)
  int32_t max_running = 64;          // sequences in the running batch
  int32_t max_waiting = 256;         // queue limit; beyond it Submit returns RESOURCE_EXHAUSTED
  int32_t max_prompt_tokens = 0;     // 0: the model's context length - 1
  int64_t max_prompt_bytes = 0;      // 0: max_prompt_tokens x the tokenizer's longest piece
  int32_t max_new_tokens_limit = 0;  // 0: the model's context length
  double full_overcommit = 1.0;      // see SchedulerConfig::full_overcommit
  bool fair_share = true;            // see SchedulerConfig::fair_share
  std::string default_policy = "full";
  std::string default_budget = "1";  // KvBudget text: tokens or a fraction of the max length
  double default_recent_fraction = 0.5;
  // Eviction granularity of the policies that do not name one (spec key granularity=...).
  EvictGranularity evict_granularity = EvictGranularity::kToken;
  // Layer budgets of the policies that do not name them (spec key layers=...; cpu only).
  LayerBudgets layer_budgets = LayerBudgets::kUniform;
  int threads = 0;  // 0: every core
  std::string device = "cpu";  // cpu or cuda: where the forward passes and the KV pool live
  std::string kv_dtype = "auto";  // kKvDtypeNames: the cached K/V (see KvDtype)
  GpuWeights gpu_weights = GpuWeights::kBf16;  // --gpu-weights (CUDA only)
  // Automatic prefix caching (docs/ARCHITECTURE.md "Prefix caching"; the CPU backend): prompt
  // blocks stay in the pool after their request and later prompts that start with them skip
  // their prefill. `prefix_cache_share_tenants`: requests of different tenants (API keys) may
  // reuse each other's prefixes.
  bool prefix_cache = true;
  bool prefix_cache_share_tenants = false;
  // What renders chat requests (GenerationRequest::messages): the model's
  // tokenizer.chat_template or `serve --chat-template`. Null: chat requests fail with
  // FAILED_PRECONDITION.
  std::shared_ptr<const ChatTemplate> chat_template;
  // Longest chat accepted: messages, and bytes over all roles and contents (the rendered prompt
  // is held to max_prompt_bytes as well).
  int32_t max_chat_messages = 1024;
  // Most choices a request may ask for (GenerationRequest::n; `serve --max-n`), and never more
  // than max_waiting.
  int32_t max_n = 16;
  // A request held (RequestHandle::Hold) for longer than this without a break is cancelled: its
  // last delta says "cancelled" with DEADLINE_EXCEEDED (`serve --stream-stall-timeout`).
  absl::Duration stall_timeout = absl::Seconds(30);
};

// What a client may set; unset optionals take the server's defaults (vLLM/TGI semantics).
struct GenerationRequest {
  std::string request_id;                     // at most kMaxRequestIdBytes
  // Who sent it (a connection, an API key): the scheduler shares the batch fairly between
  // clients when one floods it. Empty: one anonymous client.
  std::string client;
  // Whose cached prompt prefixes it may reuse (docs/ARCHITECTURE.md "Prefix caching"): the
  // fronts set the API key's hash when keys are on; empty: the one shared tenant. At most
  // kMaxClientKeyBytes.
  std::string tenant;
  std::optional<std::string> prompt;          // text, encoded with the tokenizer's add_bos
  // A chat, used when prompt is unset and this is: rendered with EngineOptions::chat_template
  // (bos_token, eos_token, add_generation_prompt) on the tokenizer thread, then encoded with
  // special tokens parsed and BOS added as the tokenizer says unless the template wrote it.
  std::optional<std::vector<ChatMessage>> messages;
  bool add_generation_prompt = true;
  // With messages: the template's `tools` (JSON text of a list of OpenAI tool dicts; empty:
  // None) and more template variables (chat_template_kwargs: JSON text of an object; empty:
  // none), as ChatRenderOptions::tools_json and extra_json take them.
  std::string chat_tools;
  std::string chat_template_kwargs;
  std::vector<int32_t> prompt_token_ids;      // used when neither is set
  // Control tokens (EOS, <|im_end|>, ...) are left out of the streamed text (vLLM's default).
  bool skip_special_tokens = true;
  int32_t max_new_tokens = 16;
  // max_new_tokens is an upper bound, lowered to what the context leaves after the prompt
  // (OpenAI chat without max_tokens); the request still needs room for one new token.
  bool max_new_tokens_to_context = false;
  std::optional<float> temperature, top_p;
  std::optional<int32_t> top_k;
  std::optional<uint64_t> seed;
  // The sampling API (docs/ARCHITECTURE.md "The sampling API"; issue 44). Unset: off.
  // min_p: [0, 1]. presence/frequency (OpenAI): [-2, 2], over the generated tokens.
  // repetition_penalty (vLLM / Hugging Face): (0, 10], over prompt and generated tokens, or the
  // last penalty_last_n of them (llama.cpp's repeat_last_n; -1 or unset: all, 0: none).
  std::optional<float> min_p, presence_penalty, frequency_penalty, repetition_penalty;
  std::optional<int32_t> penalty_last_n;
  // (token id, bias in [-100, 100]) added to the logit; at most kMaxLogitBias entries, ids in
  // the vocabulary. The last entry of an id wins.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // End-of-generation and stop tokens are banned until this many tokens were generated (vLLM).
  int32_t min_tokens = 0;
  // Choices: the prompt is prefilled once and forks into n sequences (1 to
  // EngineOptions::max_n). Deltas carry their choice's `index`.
  int32_t n = 1;
  // The prompt's own log-probabilities (vLLM's prompt_logprobs, OpenAI's echo with logprobs):
  // -1 none; 0 each prompt token's; N > 0 also the N most likely tokens at each position (at
  // most kMaxTopLogprobs). Sent once, on the first delta of choice 0 (GenerationDelta::prompt).
  // Such a request never takes a cached prefix (every prompt position is computed). With
  // max_new_tokens 0 (allowed only here) it scores the prompt and ends with "length".
  int32_t prompt_logprobs = -1;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  std::optional<std::string> policy;
  std::optional<int32_t> budget_tokens;
  std::optional<double> budget_fraction;
  std::optional<double> recent_fraction;
  // The K/V row type: "auto" (or unset) the pool's, its own name, or "int8" / "int4" where
  // narrower than the pool's pages (SequenceKv::quant); others INVALID_ARGUMENT.
  std::optional<std::string> kv_dtype;
  bool logprobs = false;
  // With logprobs: also the top_logprobs most likely tokens at each step (0 to
  // kMaxTopLogprobs), as OpenAI's top_logprobs.
  int32_t top_logprobs = 0;
  std::optional<absl::Time> deadline;
  // Structured output (docs/ARCHITECTURE.md "Structured outputs"): the output must match it.
  // Compiled in Submit on the caller's thread (cached by spec): INVALID_ARGUMENT there when it
  // does not compile, RESOURCE_EXHAUSTED past a compile limit. Ends with "stop" when the
  // grammar is complete, "length" at max_new_tokens (even inside it), "error" when no token
  // fits. Needs a tokenizer.
  grammar::ConstraintSpec constraint;
};

struct GenerationUsage {
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t kv_tokens_kept = 0;      // per (layer, kv head) at the end
  int64_t kv_tokens_evicted = 0;   // per (layer, kv head), summed over the request
  int32_t peak_pages = 0;
  std::string policy;              // as resolved: the request's or the server default
  int32_t kv_budget_tokens = 0;    // resolved budget per (layer, kv head); 0 for "full"
  std::string kv_dtype;            // the K/V row type it ran with (fp32, bf16, int8, int4)
  // Prompt tokens taken from the prefix cache instead of computed (OpenAI's
  // prompt_tokens_details.cached_tokens), at its first admission.
  int32_t cached_tokens = 0;
};

struct GenerationTimings {
  double queue_seconds = 0;
  double time_to_first_token_seconds = 0;
  double total_seconds = 0;
};

// One candidate token at a step, for top_logprobs.
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
  std::string bytes;  // the token's text as decoded after the previous token (may be part of a
                      // UTF-8 character); empty without a tokenizer
};

// The prompt's own log-probabilities (GenerationRequest::prompt_logprobs): per prompt token, its
// log-probability given the tokens before it (NaN for the first, which has none), its bytes as
// TokenLogprob::bytes, its rank (vLLM's: 1 + the tokens strictly more likely; 0 for the first),
// and with prompt_logprobs > 0 the most likely tokens at that position (empty for the first).
struct PromptLogprobs {
  std::vector<int32_t> token_ids;
  std::vector<std::string> token_bytes;
  std::vector<float> logprobs;
  std::vector<int32_t> ranks;
  std::vector<std::vector<TokenLogprob>> top;
};

struct GenerationDelta {
  // The choice this delta belongs to, 0 to n - 1 (GenerationRequest::n).
  int32_t index = 0;
  // With prompt_logprobs >= 0: once, on choice 0's first delta, before any generated token.
  std::shared_ptr<const PromptLogprobs> prompt;
  std::vector<int32_t> token_ids;
  std::string text;              // never ends inside a UTF-8 character
  // With logprobs, one entry per token of token_ids: its log-probability under the model
  // (before temperature and truncation), its bytes as TokenLogprob::bytes, and (top_logprobs > 0)
  // the most likely tokens of that step, most likely first (ties: the lower id).
  std::vector<float> logprobs;
  std::vector<std::string> token_bytes;
  std::vector<std::vector<TokenLogprob>> top_logprobs;
  // `finished`: the request's last delta (every choice has ended), exactly once.
  // `choice_finished`: this choice's last delta, with its finish_reason (and error/status); for
  // n = 1 both are set on the same delta. A choice that ends before the others sends its own.
  bool finished = false;
  bool choice_finished = false;
  // On a choice's last delta: length, stop (also: a constraint's grammar matched whole), eos,
  // cancelled, error, or rejected (the request failed a check that needed its prompt's tokens,
  // after Submit had accepted it: `status` says why).
  std::string finish_reason;
  std::string error;             // with finish_reason "error"
  absl::Status status;           // with "rejected": INVALID_ARGUMENT and what to change; with
                                 // "cancelled": DEADLINE_EXCEEDED when the deadline stopped it
  GenerationUsage usage;         // on the last delta: the prompt once, the choices' completion
                                 // tokens summed, peak_pages the request's (all choices)
  GenerationTimings timings;     // on the last delta
};

struct CacheStats {
  int32_t pages_total = 0;
  int32_t pages_used = 0;
  int32_t sequences_running = 0;
  int32_t sequences_waiting = 0;
  // Requests held (RequestHandle::Hold: their client is not reading), running or waiting.
  int32_t sequences_held = 0;
  int64_t tokens_evicted = 0;
  int64_t preemptions = 0;
  std::string kv_dtype;         // KvElementName of the pool: fp32, bf16, int8 or int4
  int64_t bytes_per_token = 0;  // KvBytesPerPoolToken of the pool's shape
  // Of pages_used, the packed pages (docs/ARCHITECTURE.md "Packed pages") of demoted stores
  // (policies with demote=) and of requests with their own kv_dtype.
  int32_t pages_demoted = 0;
  int32_t pages_packed = 0;
  // Prefix caching: pages the cache holds (reclaimed when the pool needs them; those that
  // running full-cache sequences share read-only are also in pages_used, once), and its
  // counters since start (KvCache's PrefixStats).
  int32_t cached_pages = 0;
  int64_t prefix_lookups = 0;
  int64_t prefix_hits = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t prefix_reclaimed_pages = 0;
};

struct ModelInfo {
  std::string architecture = "llama";
  int32_t context_length = 0;
  int32_t vocab_size = 0;
  int32_t num_layers = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  std::vector<std::string> policies;
  int32_t pages_total = 0;
  int32_t block_size = 0;
  int64_t page_bytes = 0;
  std::string tokenizer;  // TextTokenizer::Describe(); empty without one
  bool chat = false;      // a chat template is loaded
  // That template (null without one), for the fronts to read the tool-call and reasoning formats
  // of its output from (engine/chat/tool_calls.h, reasoning.h). Not in the gRPC ModelInfo.
  std::shared_ptr<const ChatTemplate> chat_template;
  // The request limits as resolved (EngineOptions' zeros replaced by what they mean).
  int32_t max_prompt_tokens = 0;
  int64_t max_prompt_bytes = 0;  // 0: no tokenizer (token ids only)
  int32_t max_new_tokens_limit = 0;
  // The runner's weights in device memory per format (StepRunner::DeviceWeightBytes; empty on
  // the CPU). Not in the gRPC ModelInfo message; `serve` logs it at start.
  std::vector<std::pair<std::string, int64_t>> device_weight_bytes;
};

// The seed choice `index` of a request seeded `seed` samples with (GenerationRequest::n): the
// seed itself for choice 0 (n = 1 is the request it always was), a SplitMix64 of (seed, index)
// for the others, so a seeded request gives the same n texts every time.
uint64_t ChoiceSeed(uint64_t seed, int32_t index);

class RequestHandle {
 public:
  virtual ~RequestHandle() = default;
  // Asks the engine to stop the request; its pages are freed at the next step and its last
  // delta says "cancelled". Safe from any thread, any number of times.
  virtual void Cancel() = 0;
  // Backpressure (docs/ARCHITECTURE.md "Backpressure"): while held, the request gets no new
  // tokens. It stays out of the batch with its pages kept, and is not counted against
  // max_running; when the pool needs its pages for a request that is not held, it is preempted
  // (recomputed from its tokens once admitted again). Hold(false) lets it go on from the next
  // step. Held for longer than EngineOptions::stall_timeout at a stretch, it is cancelled.
  // Safe from any thread (it never blocks: the fronts call it from the engine's callback).
  virtual void Hold(bool held) = 0;
};

class Engine {
 public:
  virtual ~Engine() = default;
  // `tokenizer` may be null (token ids only).
  static absl::StatusOr<std::unique_ptr<Engine>> Create(
      Model model, std::shared_ptr<const TextTokenizer> tokenizer, const EngineOptions& options);

  // Checks and queues a request. INVALID_ARGUMENT (with what to change) for a bad request,
  // RESOURCE_EXHAUSTED when the queue is full, UNAVAILABLE while shutting down. On success
  // `on_delta` will be called until a finished delta. A text prompt is tokenized on the engine's
  // tokenizer thread, never the caller's: checks that need its tokens (prompt length, context,
  // pool, a chat template's error) then fail with a finished delta of finish_reason "rejected"
  // and its `status`. Cancel and the deadline stop the tokenizing too. A chat without a chat
  // template fails here with FAILED_PRECONDITION.
  virtual absl::StatusOr<std::shared_ptr<RequestHandle>> Submit(
      const GenerationRequest& request, std::function<void(const GenerationDelta&)> on_delta) = 0;

  // Token ids of `text` as a prompt (`add_special`: BOS/EOS as the tokenizer adds them; special
  // tokens written in the text are parsed), or INVALID_ARGUMENT without a tokenizer, for bad
  // UTF-8 or for more than the prompt byte limit. Runs on the caller's thread.
  virtual absl::StatusOr<std::vector<int32_t>> Tokenize(const std::string& text,
                                                        bool add_special = true) const = 0;
  // The prompt tokens a chat request would get (`chat`'s messages, add_generation_prompt,
  // chat_tools and chat_template_kwargs; its other fields are not looked at): rendered with the
  // chat template, then encoded as Submit does (FAILED_PRECONDITION without a template,
  // INVALID_ARGUMENT as Submit refuses the chat). Runs on the caller's thread.
  virtual absl::StatusOr<std::vector<int32_t>> TokenizeChat(
      const GenerationRequest& chat) const = 0;
  // Tokenize on the engine's tokenizer thread: `done` is called there exactly once, with
  // CANCELLED once `*cancelled` is set, DEADLINE_EXCEEDED past `deadline`, UNAVAILABLE while
  // shutting down.
  virtual void TokenizeAsync(std::string text, bool add_special,
                             std::shared_ptr<const std::atomic<bool>> cancelled, absl::Time deadline,
                             std::function<void(absl::StatusOr<std::vector<int32_t>>)> done) = 0;

  // The text of `ids` (special tokens included unless `skip_special_tokens`), as one stream
  // decodes it; INVALID_ARGUMENT without a tokenizer, for an id outside the vocabulary or more
  // than the prompt token limit. Runs on the caller's thread.
  virtual absl::StatusOr<std::string> Detokenize(const std::vector<int32_t>& ids,
                                                 bool skip_special_tokens) const = 0;

  virtual ModelInfo Info() const = 0;
  virtual CacheStats Stats() const = 0;

  // Stops accepting requests, lets running ones finish for up to `grace`, then cancels the rest
  // and joins the engine thread.
  virtual void Shutdown(absl::Duration grace) = 0;
};

}  // namespace heavykv
