#include "server/http/openai_unknown_fields.h"

#include "absl/strings/str_join.h"
#include "engine/serving/request_validation.h"
#include "spdlog/spdlog.h"

namespace heavykv::server {
namespace {

// Every body field some parser handles. A field added to a parser belongs here too, or it is
// reported as ignored (harmless, but misleading) the first time it is sent.
constexpr absl::string_view kKnownFields[] = {
    // openai_json.cc: the prompt, limits, the basic sampling and the output's form.
    "model", "messages", "prompt", "add_generation_prompt", "max_tokens", "max_completion_tokens",
    "n_predict", "temperature", "top_p", "top_k", "seed", "stop", "n", "best_of", "echo",
    "logprobs", "top_logprobs", "prompt_logprobs", "use_beam_search", "suffix", "stream",
    "stream_options", "ignore_eos", "stop_token_ids", "skip_special_tokens",
    // heavykv's own: the request's KV cache.
    "kv_policy", "kv_dtype", "kv_budget", "kv_recent_fraction",
    // openai_sampling.cc: served.
    "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "repeat_penalty",
    "repeat_last_n", "min_tokens", "logit_bias", "n_probs",
    // openai_sampling.cc: refused unless at their "off" value.
    "typical_p", "length_penalty", "tfs_z", "mirostat", "dynatemp_range", "dry_multiplier",
    "xtc_probability", "top_n_sigma", "penalize_nl", "include_stop_str_in_output", "bad_words",
    "allowed_token_ids", "logits_processors", "samplers", "truncate_prompt_tokens",
    "reasoning_effort", "prediction", "audio", "web_search_options", "functions",
    "function_call", "modalities",
    // Parameters of the refused samplers: they change nothing while those are off.
    "mirostat_tau", "mirostat_eta", "dynatemp_exponent", "dry_base", "dry_allowed_length",
    "dry_penalty_last_n", "dry_sequence_breakers", "xtc_threshold",
    // openai_constraint.cc
    "response_format", "json_schema", "guided_json", "grammar", "guided_grammar", "guided_regex",
    "guided_choice", "structured_outputs", "guided_whitespace_pattern",
    "guided_decoding_backend",  // vLLM's choice of engine: heavykv has one
    // openai_tools.cc
    "tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs",
    // Accepted and without effect on the output: bookkeeping, caching and scheduling hints.
    "user", "store", "metadata", "service_tier", "cache_prompt", "id_slot", "priority",
    "request_id",
};

}  // namespace

bool IsKnownBodyField(absl::string_view name) {
  static const absl::flat_hash_set<absl::string_view>* known =
      new absl::flat_hash_set<absl::string_view>(std::begin(kKnownFields), std::end(kKnownFields));
  return known->contains(name);
}

std::vector<std::string> UnknownFieldLog::Take(const nlohmann::ordered_json& body) {
  std::vector<std::string> out;
  if (!body.is_object()) return out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& item : body.items()) {
    const std::string& name = item.key();
    if (reported_.size() >= kMaxNames) break;
    if (IsKnownBodyField(name) || !reported_.insert(name).second) continue;
    out.push_back(EscapedPrefix(name, 64));
  }
  return out;
}

void WarnUnknownFields(ApiKind kind, const nlohmann::ordered_json& body) {
  static UnknownFieldLog* const completions = new UnknownFieldLog();
  static UnknownFieldLog* const chat = new UnknownFieldLog();
  const bool is_chat = kind == ApiKind::kChat;
  const std::vector<std::string> names = (is_chat ? chat : completions)->Take(body);
  if (names.empty()) return;
  spdlog::warn("unknown fields ignored by {}: {}",
               is_chat ? "/v1/chat/completions" : "/v1/completions", absl::StrJoin(names, ", "));
}

}  // namespace heavykv::server
