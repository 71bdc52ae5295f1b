#include "engine/serving/request_validation.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "engine/runner/step_runner.h"
#include "engine/serving/generator.h"
#include "engine/serving/request_field.h"
#include "engine/tokenizer/text_stream.h"
#include "memory/kv_cache.h"
#include "memory/eviction_policy.h"

namespace heavykv {
namespace {

absl::Status Invalid(absl::string_view what) { return absl::InvalidArgumentError(what); }
// A refusal about one request field: `field` is its heavykv.v1 path (request_field.h).
absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return WithRequestField(absl::InvalidArgumentError(what), field);
}

// The field that holds a request's prompt, whichever form it has.
absl::string_view PromptField(const GenerationRequest& q) {
  return q.messages.has_value() ? "messages"
         : q.prompt.has_value() ? "prompt"
                                : "prompt_token_ids";
}

// OK for a valid policy spec (eviction_policy.h MakePolicy); a message naming the choices, with
// the client's text escaped and cut, otherwise.
absl::Status CheckPolicySpec(const std::string& spec, absl::string_view what) {
  if (ValidPolicySpec(spec)) return absl::OkStatus();
  const absl::string_view name = absl::string_view(spec).substr(0, spec.find(':'));
  bool known = false;
  for (absl::string_view p : kPolicyNames) known = known || p == name;
  if (!known) {
    return Invalid(absl::StrCat("unknown ", what, " \"", EscapedPrefix(spec), "\"; choose one of: ",
                                absl::StrJoin(kPolicyNames, ", ")));
  }
  return Invalid(absl::StrCat(
      "invalid parameters in ", what, " \"", EscapedPrefix(spec),
      "\": snapkv takes :window=N:kernel=N (odd):decode=h2o|window, scissorhands :history=N; "
      "every policy but full :granularity=token|page and :layers=uniform|pyramid|squeeze; "
      "h2o, tova, scissorhands, knorm and snapkv (token granularity, uniform layers) "
      ":demote=int8|int4 and :demote_budget=N"));
}

}  // namespace

std::string EscapedPrefix(std::string_view s, size_t max_bytes) {
  const bool cut = s.size() > max_bytes;
  std::string out = absl::CHexEscape(absl::string_view(s.data(), cut ? max_bytes : s.size()));
  if (cut) out += "...";
  return out;
}

absl::Status ValidateDefaults(const EngineOptions& o) {
  if (absl::Status s = CheckPolicySpec(o.default_policy, "default KV policy"); !s.ok()) return s;
  if (!KvBudget::Parse(o.default_budget).ok()) {
    return Invalid(absl::StrCat("default KV budget \"", o.default_budget,
                                "\" must be a token count or a fraction in (0, 1]"));
  }
  if (!(o.default_recent_fraction > 0 && o.default_recent_fraction <= 1)) {
    return Invalid("default h2o recent fraction must be in (0, 1]");
  }
  return absl::OkStatus();
}

RequestValidator::RequestValidator(const ModelConfig& config, const TextTokenizer* tokenizer,
                                   const EngineOptions& options, const Scheduler* scheduler)
    : config_(config), tokenizer_(tokenizer), options_(options), scheduler_(scheduler) {
  if (options_.max_prompt_bytes > 0) {
    max_prompt_bytes_ = options_.max_prompt_bytes;
  } else if (tokenizer_ != nullptr) {
    size_t longest = 1;
    for (int32_t id = 0; id < tokenizer_->vocab_size(); ++id) {
      longest = std::max(longest, tokenizer_->piece(id).size());
    }
    max_prompt_bytes_ = int64_t(max_prompt_tokens()) * int64_t(longest);
  }
  if (tokenizer_ != nullptr) {
    const auto special_text = [&](int32_t id) {
      return id >= 0 && id < tokenizer_->vocab_size() ? tokenizer_->Decode(-1, id) : std::string();
    };
    bos_text_ = special_text(tokenizer_->bos_id());
    eos_text_ = special_text(tokenizer_->eos_id());
  }
  // One pass over the vocabulary here, so that no request pays for it (min_tokens).
  for (int32_t id = 0; id < config_.vocab_size; ++id) {
    if (EndsSequence(tokenizer_, config_, id)) end_of_generation_ids_.push_back(id);
  }
}

int32_t RequestValidator::max_prompt_tokens() const {
  return options_.max_prompt_tokens > 0 ? options_.max_prompt_tokens : config_.seq_len - 1;
}

absl::Status RequestValidator::CheckText(const std::string& text, absl::string_view what) const {
  if (tokenizer_ == nullptr) {
    return Invalid(what, "this server has no tokenizer: send token ids (prompt_token_ids) "
                         "instead of text");
  }
  if (int64_t(text.size()) > max_prompt_bytes_) {
    return Invalid(what, absl::StrCat("the ", what, " has ", text.size(),
                                " bytes; this server takes at most ", max_prompt_bytes_,
                                " (it could not fit ", max_prompt_tokens(),
                                " tokens otherwise): shorten it"));
  }
  if (TextStream::Sanitize(text) != text) {
    return Invalid(what, absl::StrCat("the ", what, " is not valid UTF-8"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> RequestValidator::Encode(
    const std::string& text, bool add_special, const std::function<bool()>& should_stop) const {
  if (absl::Status s = CheckText(text, "text"); !s.ok()) return s;
  return EncodeChecked(text, add_special && tokenizer_->add_bos(),
                       add_special && tokenizer_->add_eos(), should_stop);
}

absl::StatusOr<std::vector<int32_t>> RequestValidator::EncodeChecked(
    const std::string& text, bool bos, bool eos, const std::function<bool()>& should_stop) const {
  std::optional<std::vector<int32_t>> ids =
      tokenizer_->Encode(text, bos, eos, should_stop, /*parse_special=*/true);
  if (!ids.has_value()) return absl::CancelledError("tokenizing was stopped");
  return *std::move(ids);
}

absl::StatusOr<std::string> RequestValidator::RenderChat(const GenerationRequest& q) const {
  ChatRenderOptions opts;
  opts.bos_token = bos_text_;
  opts.eos_token = eos_text_;
  opts.add_generation_prompt = q.add_generation_prompt;
  opts.tools_json = q.chat_tools;
  opts.extra_json = q.chat_template_kwargs;
  // A rendering longer than the prompt limit is the client's to shorten (INVALID_ARGUMENT from
  // PromptTokens); the render's own bound only stops a template that runs away.
  opts.limits.max_output_bytes = std::max(opts.limits.max_output_bytes, max_prompt_bytes_ + 1);
  return options_.chat_template->Render(*q.messages, opts);
}

absl::Status RequestValidator::Precheck(const GenerationRequest& q) const {
  if (q.request_id.size() > kMaxRequestIdBytes) {
    return Invalid("request_id", absl::StrCat("request_id has ", q.request_id.size(),
                                              " bytes; at most ",
                                kMaxRequestIdBytes, " are accepted"));
  }
  if (q.client.size() > kMaxClientKeyBytes) return Invalid("the client key is too long");
  if (q.tenant.size() > kMaxClientKeyBytes) return Invalid("the tenant key is too long");
  // n choices: each is a sequence of its own once forked, so the queue bounds them too.
  const int32_t max_n = std::max(1, std::min(options_.max_n, std::max(1, options_.max_waiting)));
  if (q.n < 1 || q.n > max_n) {
    return Invalid("n", absl::StrCat("n must be in [1, ", max_n, "] (serve --max-n, --max-waiting), got ",
                                     q.n));
  }
  if (q.prompt.has_value()) {
    if (q.prompt->empty()) return Invalid("prompt", "the prompt is empty: send some text");
    if (absl::Status s = CheckText(*q.prompt, "prompt"); !s.ok()) return s;
  } else if (q.messages.has_value()) {
    if (absl::Status s = CheckChat(q); !s.ok()) return s;
  } else {
    if (q.prompt_token_ids.empty()) {
      return Invalid("prompt", "the request has no prompt: set prompt or prompt_token_ids");
    }
    if (q.prompt_token_ids.size() > size_t(max_prompt_tokens())) {
      return Invalid("prompt_token_ids", absl::StrCat("the prompt has ", q.prompt_token_ids.size(),
                                  " tokens; this server takes at most ", max_prompt_tokens(),
                                  ": shorten it"));
    }
    for (int32_t id : q.prompt_token_ids) {
      if (id < 0 || id >= config_.vocab_size) {
        return Invalid("prompt_token_ids", absl::StrCat("prompt token id ", id, " is outside the vocabulary [0, ",
                                    config_.vocab_size, ")"));
      }
    }
  }
  const int32_t limit =
      options_.max_new_tokens_limit > 0 ? options_.max_new_tokens_limit : config_.seq_len;
  if (q.prompt_logprobs < -1 || q.prompt_logprobs > kMaxTopLogprobs) {
    return Invalid("prompt_logprobs", absl::StrCat("prompt_logprobs must be in [-1, ",
                                                   kMaxTopLogprobs, "] (-1 = off)"));
  }
  // 0 only scores the prompt, which only a request that asks for its logprobs can want.
  const int32_t min_new_tokens = q.prompt_logprobs >= 0 ? 0 : 1;
  if (q.max_new_tokens < min_new_tokens || q.max_new_tokens > limit) {
    return Invalid("max_new_tokens",
                   absl::StrCat("max_new_tokens must be in [", min_new_tokens, ", ", limit,
                                "], got ", q.max_new_tokens,
                                min_new_tokens == 1 && q.max_new_tokens == 0
                                    ? " (0, scoring the prompt alone, needs prompt_logprobs)"
                                    : ""));
  }
  if (q.temperature && !(std::isfinite(*q.temperature) && *q.temperature >= 0)) {
    return Invalid("sampling.temperature", "temperature must be >= 0 (0 = greedy)");
  }
  if (q.top_p && !(*q.top_p > 0 && *q.top_p <= 1)) {
    return Invalid("sampling.top_p", "top_p must be in (0, 1]");
  }
  if (q.top_k && (*q.top_k < 0 || *q.top_k > config_.vocab_size)) {
    return Invalid("sampling.top_k", absl::StrCat("top_k must be in [0, ", config_.vocab_size, "] (0 = off)"));
  }
  if (absl::Status s = CheckSamplingApi(q, config_.vocab_size); !s.ok()) return s;
  if (q.top_logprobs < 0 || q.top_logprobs > kMaxTopLogprobs) {
    return Invalid("top_logprobs",
                   absl::StrCat("top_logprobs must be in [0, ", kMaxTopLogprobs, "]"));
  }
  if (q.top_logprobs > 0 && !q.logprobs) {
    return Invalid("top_logprobs", "top_logprobs needs logprobs: ask for logprobs too");
  }
  if (q.stop.size() > kMaxStopStrings) {
    return Invalid("stop", absl::StrCat("the request has ", q.stop.size(), " stop strings; at most ",
                                kMaxStopStrings, " are accepted"));
  }
  for (const std::string& s : q.stop) {
    if (s.empty()) return Invalid("stop", "stop strings must not be empty");
    if (s.size() > kMaxStopStringBytes) {
      return Invalid("stop", absl::StrCat("a stop string has ", s.size(), " bytes; at most ",
                                  kMaxStopStringBytes, " are accepted"));
    }
    if (TextStream::Sanitize(s) != s) return Invalid("stop", "stop strings must be valid UTF-8");
  }
  if (q.stop_token_ids.size() > kMaxStopTokenIds) {
    return Invalid("stop_token_ids", absl::StrCat("the request has ", q.stop_token_ids.size(),
                                " stop token ids; at most ", kMaxStopTokenIds, " are accepted"));
  }
  for (int32_t id : q.stop_token_ids) {
    if (id < 0 || id >= config_.vocab_size) {
      return Invalid("stop_token_ids", absl::StrCat("stop token id ", id, " is outside the vocabulary [0, ",
                                  config_.vocab_size, ")"));
    }
  }
  if (q.policy.has_value()) {
    if (absl::Status s = CheckPolicySpec(*q.policy, "KV policy"); !s.ok()) {
      return WithRequestField(s, "kv.policy");
    }
  }
  if (q.kv_dtype.has_value()) {
    absl::StatusOr<KvDtype> dtype = ParseKvDtype(*q.kv_dtype);
    if (!dtype.ok()) {
      return Invalid("kv.dtype", absl::StrCat("kv.dtype \"", EscapedPrefix(*q.kv_dtype),
                                  "\" is not one of: ", kKvDtypeNames));
    }
  }
  if (q.recent_fraction && !(*q.recent_fraction > 0 && *q.recent_fraction <= 1)) {
    return Invalid("kv.recent_fraction", "kv.recent_fraction must be in (0, 1]");
  }
  if (q.budget_tokens.has_value() && q.budget_fraction.has_value()) {
    return Invalid("kv.budget_tokens", "set kv.budget_tokens or kv.budget_fraction, not both");
  }
  if (q.budget_tokens.has_value() && *q.budget_tokens < 1) {
    return Invalid("kv.budget_tokens", "kv.budget_tokens must be >= 1");
  }
  if (q.budget_fraction.has_value() && !(*q.budget_fraction > 0 && *q.budget_fraction <= 1)) {
    return Invalid("kv.budget_fraction", "kv.budget_fraction must be in (0, 1]");
  }
  return absl::OkStatus();
}

absl::Status CheckSamplingApi(const GenerationRequest& q, int32_t vocab_size) {
  // Written as !(in range) so that NaN, which compares false, is refused too; inf is out of
  // every range.
  const auto in = [](const std::optional<float>& v, float lo, float hi) {
    return !v.has_value() || (*v >= lo && *v <= hi);
  };
  if (!in(q.min_p, 0, 1)) {
    return Invalid("sampling.min_p", "min_p must be in [0, 1] (0 = off)");
  }
  if (!in(q.presence_penalty, -2, 2)) {
    return Invalid("sampling.presence_penalty", "presence_penalty must be in [-2, 2] (0 = off)");
  }
  if (!in(q.frequency_penalty, -2, 2)) {
    return Invalid("sampling.frequency_penalty",
                   "frequency_penalty must be in [-2, 2] (0 = off)");
  }
  if (!in(q.repetition_penalty, 0, 10) || q.repetition_penalty == 0.0f) {
    return Invalid("sampling.repetition_penalty",
                   "repetition_penalty must be in (0, 10] (1 = off; above 1 penalises repeats)");
  }
  if (q.penalty_last_n.has_value() && *q.penalty_last_n < -1) {
    return Invalid("sampling.penalty_last_n",
                   // The path, so that each front writes its own name (repeat_last_n in HTTP).
                   "sampling.penalty_last_n must be >= -1 (-1 = every token seen, 0 = none)");
  }
  if (q.logit_bias.size() > kMaxLogitBias) {
    return Invalid("sampling.logit_bias", absl::StrCat("logit_bias has ", q.logit_bias.size(),
                                                       " entries; at most ", kMaxLogitBias,
                                                       " are accepted"));
  }
  for (const auto& [id, bias] : q.logit_bias) {
    if (id < 0 || id >= vocab_size) {
      return Invalid("sampling.logit_bias",
                     absl::StrCat("logit_bias token id ", id, " is outside the vocabulary [0, ",
                                  vocab_size, ")"));
    }
    if (!(bias >= -100 && bias <= 100)) {
      return Invalid("sampling.logit_bias",
                     absl::StrCat("logit_bias of token ", id, " must be in [-100, 100]"));
    }
  }
  if (q.min_tokens < 0 || q.min_tokens > q.max_new_tokens) {
    return Invalid("sampling.min_tokens",
                   absl::StrCat("min_tokens must be in [0, max_new_tokens (", q.max_new_tokens,
                                ")], got ", q.min_tokens));
  }
  return absl::OkStatus();
}

void ResolveSamplingApi(const GenerationRequest& q, std::span<const int32_t> end_ids,
                        SamplingParams& out) {
  out.min_p = q.min_p.value_or(0.0f);
  out.presence_penalty = q.presence_penalty.value_or(0.0f);
  out.frequency_penalty = q.frequency_penalty.value_or(0.0f);
  out.repetition_penalty = q.repetition_penalty.value_or(1.0f);
  out.penalty_last_n = q.penalty_last_n.value_or(-1);
  out.logit_bias = q.logit_bias;
  out.min_tokens = q.min_tokens;
  out.banned_until_min.clear();
  if (q.min_tokens > 0) {
    // What would end the request early: its stop tokens, and the end-of-generation tokens
    // unless ignore_eos makes them ordinary tokens (vLLM's rule).
    if (!q.ignore_eos) out.banned_until_min.assign(end_ids.begin(), end_ids.end());
    out.banned_until_min.insert(out.banned_until_min.end(), q.stop_token_ids.begin(),
                                q.stop_token_ids.end());
  }
}

absl::Status RequestValidator::CheckChat(const GenerationRequest& q) const {
  const std::vector<ChatMessage>& messages = *q.messages;
  if (options_.chat_template == nullptr) {
    return WithRequestField(
        absl::FailedPreconditionError(
            "this server has no chat template (the model has no tokenizer.chat_template): start "
            "it with --chat-template FILE, or send a prompt (Generate)"),
        "messages");
  }
  if (tokenizer_ == nullptr) {
    return WithRequestField(
        absl::FailedPreconditionError(
            "this server has no tokenizer: send token ids (prompt_token_ids) to Generate"),
        "messages");
  }
  if (messages.empty()) return Invalid("messages", "the chat has no messages: send at least one");
  if (messages.size() > size_t(options_.max_chat_messages)) {
    return Invalid("messages", absl::StrCat("the chat has ", messages.size(), " messages; at most ",
                                options_.max_chat_messages, " are accepted"));
  }
  // The tools and template variables count with the messages: the template writes them out.
  int64_t bytes = int64_t(q.chat_tools.size() + q.chat_template_kwargs.size());
  if (TextStream::Sanitize(q.chat_tools) != q.chat_tools) {
    return Invalid("tools", "the tools are not valid UTF-8");
  }
  if (TextStream::Sanitize(q.chat_template_kwargs) != q.chat_template_kwargs) {
    return Invalid("chat_template_kwargs", "chat_template_kwargs is not valid UTF-8");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    std::vector<const std::string*> fields;  // besides role and content
    for (const auto* f : {&m.tool_call_id, &m.name, &m.reasoning_content}) {
      if (f->has_value()) fields.push_back(&**f);
    }
    for (const ChatToolCall& c : m.tool_calls) {
      for (const std::string* f : {&c.id, &c.type, &c.name, &c.arguments}) fields.push_back(f);
    }
    for (const std::string* f : fields) {
      bytes += int64_t(f->size());
      if (TextStream::Sanitize(*f) != *f) {
        return Invalid(absl::StrCat("messages[", i, "]"),
                       absl::StrCat("message ", i, " is not valid UTF-8"));
      }
    }
    if (m.role.empty() || m.role.size() > kMaxChatRoleBytes) {
      return Invalid(absl::StrCat("messages[", i, "].role"),
                     absl::StrCat("message ", i, ": the role must have 1 to ", kMaxChatRoleBytes,
                                  " bytes (user, assistant, system, ...)"));
    }
    bytes += int64_t(m.role.size() + m.content.size());
    if (bytes > max_prompt_bytes_) {
      return Invalid("messages", absl::StrCat("the chat has more than ", max_prompt_bytes_,
                                  " bytes; this server takes at most that (it could not fit ",
                                  max_prompt_tokens(), " tokens otherwise): shorten it"));
    }
    if (TextStream::Sanitize(m.role) != m.role || TextStream::Sanitize(m.content) != m.content) {
      return Invalid(absl::StrCat("messages[", i, "]"),
                     absl::StrCat("message ", i, " is not valid UTF-8"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> RequestValidator::PromptTokens(
    const GenerationRequest& q, const std::function<bool()>& should_stop) const {
  // Precheck has checked the text (tokenizer, bytes, UTF-8): only the tokenizing is left.
  if (q.prompt.has_value()) {
    return EncodeChecked(*q.prompt, tokenizer_->add_bos(), tokenizer_->add_eos(), should_stop);
  }
  if (q.messages.has_value()) {
    absl::StatusOr<std::string> text = RenderChat(q);
    if (!text.ok()) {  // the template refused the conversation
      return RequestFieldOf(text.status()).empty() ? WithRequestField(text.status(), "messages")
                                                   : text.status();
    }
    if (int64_t(text->size()) > max_prompt_bytes_) {
      return Invalid("messages", absl::StrCat("the chat's prompt has ", text->size(),
                                  " bytes; this server takes at most ", max_prompt_bytes_,
                                  ": shorten the chat"));
    }
    if (text->empty()) return Invalid("messages", "the chat template rendered an empty prompt");
    // The template writes BOS itself when the model wants it (Llama, Mistral): add it only
    // when it did not (llama.cpp's rule; never two). A BOS the template wrote first is that
    // token, not its text: a llama2.c tokenizer parses no special tokens, and would spell out its
    // "\n<s>\n" and start the prompt without BOS.
    if (!bos_text_.empty() && absl::StartsWith(*text, bos_text_)) {
      return EncodeChecked(text->substr(bos_text_.size()), /*bos=*/true, /*eos=*/false,
                           should_stop);
    }
    return EncodeChecked(*text, tokenizer_->add_bos(), /*eos=*/false, should_stop);
  }
  // Precheck refused an empty prompt_token_ids, so the prompt is never empty.
  return PromptWithBos(config_, q.prompt_token_ids);
}

absl::StatusOr<ResolvedRequest> RequestValidator::Resolve(const GenerationRequest& q) const {
  if (absl::Status s = Precheck(q); !s.ok()) return s;
  absl::StatusOr<std::vector<int32_t>> prompt = PromptTokens(q);
  if (!prompt.ok()) return prompt.status();
  return Resolve(q, *std::move(prompt));
}

absl::StatusOr<ResolvedRequest> RequestValidator::Resolve(const GenerationRequest& q,
                                                          std::vector<int32_t> prompt) const {
  ResolvedRequest r;
  r.arrival = absl::Now();
  r.request_id = q.request_id;
  r.client = q.client;
  r.tenant = q.tenant;
  r.prompt = std::move(prompt);
  const int32_t n = static_cast<int32_t>(r.prompt.size());
  if (n > max_prompt_tokens()) {
    return Invalid(PromptField(q), absl::StrCat("the prompt has ", n,
                                                " tokens; this server takes at most ",
                                                max_prompt_tokens(), ": shorten it"));
  }
  int32_t max_new_tokens = q.max_new_tokens;
  if (q.max_new_tokens_to_context && n < config_.seq_len) {
    max_new_tokens = std::min(max_new_tokens, config_.seq_len - n);
  }
  r.max_new_tokens = max_new_tokens;

  r.sampling.temperature = q.temperature.value_or(1.0f);
  r.sampling.top_p = q.top_p.value_or(1.0f);
  r.sampling.top_k = q.top_k.value_or(0);
  r.sampling.seed = q.seed.has_value() ? *q.seed : std::random_device{}();
  ResolveSamplingApi(q, end_of_generation_ids_, r.sampling);
  r.stop = q.stop;
  r.stop_token_ids = q.stop_token_ids;
  r.ignore_eos = q.ignore_eos;
  r.logprobs = q.logprobs;
  r.top_logprobs = q.top_logprobs;
  r.prompt_logprobs = q.prompt_logprobs;
  r.skip_special_tokens = q.skip_special_tokens;
  r.deadline = q.deadline;
  r.n = q.n;
  r.policy = q.policy.value_or(options_.default_policy);
  r.recent_fraction = q.recent_fraction.value_or(options_.default_recent_fraction);

  // A fraction is of the sequence's length, or of the context for one that runs past it.
  const int64_t total = int64_t(n) + r.max_new_tokens;
  const int32_t max_total = static_cast<int32_t>(std::min<int64_t>(total, INT32_MAX));
  const int32_t resolve_len = std::min(max_total, config_.seq_len);
  if (q.budget_tokens.has_value()) {
    r.budget_tokens = *q.budget_tokens;
  } else if (q.budget_fraction.has_value()) {
    r.budget_tokens = KvBudget{true, *q.budget_fraction}.Resolve(resolve_len);
  } else {
    r.budget_tokens = KvBudget::Parse(options_.default_budget)->Resolve(resolve_len);
  }
  // The request's policy (its spec was checked before), for the checks below and the engine.
  absl::StatusOr<std::unique_ptr<EvictionPolicy>> policy =
      MakePolicy(r.policy, r.recent_fraction, options_.evict_granularity, options_.layer_budgets);
  if (!policy.ok()) return policy.status();
  r.kv_policy = *std::move(policy);
  const EvictionPolicy* kv_policy = r.kv_policy.get();
  // The row type: the pool's, or one narrower than its pages (packed pages, CheckFormat).
  const std::string pool_dtype = KvElementName(scheduler_->cache().shape());
  r.kv_dtype = pool_dtype;
  if (q.kv_dtype.has_value()) {
    const KvDtype dtype = *ParseKvDtype(*q.kv_dtype);  // Precheck parsed it
    const std::string name = dtype == KvDtype::kAuto ? pool_dtype : *q.kv_dtype;
    if (name != pool_dtype) {
      if (dtype != KvDtype::kInt8 && dtype != KvDtype::kInt4) {
        return Invalid("kv.dtype", absl::StrCat("kv.dtype ", name, ": this server's K/V pages are ",
                                    pool_dtype, "; a request may ask for auto, ", pool_dtype,
                                    " or a narrower int8 or int4"));
      }
      r.kv_quant = dtype == KvDtype::kInt8 ? KvQuant::kInt8 : KvQuant::kInt4;
      r.kv_dtype = name;
    }
  }
  if (total > config_.seq_len) {
    // Past the context only as an endless stream (window, sink; StreamsPastContext). The prompt
    // is within the context, so only decode steps (one token) run past it.
    SequenceKv probe;
    probe.policy = kv_policy;
    probe.budget = r.budget_tokens;
    if (options_.device != "cpu") {
      return Invalid("max_new_tokens", absl::StrCat(
          "prompt (", n, " tokens) + max_new_tokens (", r.max_new_tokens,
          ") exceeds the context length ", config_.seq_len,
          "; streaming past it (window, sink) runs on --device cpu only"));
    }
    if (!StreamsPastContext(probe, 1, config_.seq_len)) {
      return Invalid(n < config_.seq_len ? "max_new_tokens" : PromptField(q), absl::StrCat(
          "prompt (", n, " tokens) + max_new_tokens (", r.max_new_tokens,
          ") exceeds the context length ", config_.seq_len,
          n < config_.seq_len
              ? absl::StrCat(": lower max_new_tokens to at most ", config_.seq_len - n,
                             ", or stream past the context with the window or sink policy and a "
                             "KV budget under it")
              : std::string(": shorten the prompt")));
    }
  }
  if (kv_policy != nullptr && kv_policy->name() == "sink" && r.budget_tokens < max_total &&
      r.budget_tokens <= kNumSinkTokens) {
    return Invalid("kv.budget_tokens",
                   absl::StrCat("the sink policy needs a KV budget (kv.budget_tokens) over ",
                                kNumSinkTokens, " tokens"));
  }

  // A request that could not fit in the whole pool even alone would wait forever.
  int32_t need = 0, have = 0;
  if (!scheduler_->Fits(max_total, kv_policy, r.budget_tokens, &need, &have, r.kv_quant)) {
    // What would make it fit: a shorter generation, or a smaller budget (one of an evicting
    // policy; a full cache keeps everything, whatever budget it was given).
    const bool budgeted = kv_policy != nullptr && r.budget_tokens < max_total;
    return Invalid("max_new_tokens",
                   absl::StrCat("this request needs ", need,
                                " KV pages; the pool can give one request ", have,
                                ": lower max_new_tokens",
                                budgeted ? absl::StrCat(", or its KV budget (now ",
                                                        r.budget_tokens, " tokens)")
                                : kv_policy != nullptr
                                    ? ", or set a KV budget (kv.budget_tokens) under the "
                                      "sequence's length"
                                    : ", or choose an evicting KV policy (kv.policy) with a KV "
                                      "budget (kv.budget_tokens)"));
  }
  return r;
}

}  // namespace heavykv
