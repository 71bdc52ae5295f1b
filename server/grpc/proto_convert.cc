#include "server/grpc/proto_convert.h"

#include <algorithm>

namespace heavykv::server {

namespace {

void CopyConstraint(const v1::Constraint& c, grammar::ConstraintSpec& out) {
  using Kind = grammar::ConstraintSpec::Kind;
  out.strict = c.strict();
  switch (c.kind_case()) {
    case v1::Constraint::kJsonObject:
      if (c.json_object()) out.kind = Kind::kJsonObject;
      break;
    case v1::Constraint::kJsonSchema:
      out.kind = Kind::kJsonSchema;
      out.text = c.json_schema();
      break;
    case v1::Constraint::kRegex:
      out.kind = Kind::kRegex;
      out.text = c.regex();
      break;
    case v1::Constraint::kChoice:
      out.kind = Kind::kChoice;
      out.choices.assign(c.choice().choices().begin(), c.choice().choices().end());
      break;
    case v1::Constraint::kGrammar:
      out.kind = Kind::kGbnf;
      out.text = c.grammar();
      break;
    case v1::Constraint::KIND_NOT_SET:
      break;
  }
}

// The fields GenerateRequest and ChatRequest share.
template <typename Request>
void CopyGenerationFields(const Request& q, GenerationRequest* out) {
  GenerationRequest& r = *out;
  r.request_id = q.request_id();
  if (q.has_max_new_tokens()) r.max_new_tokens = q.max_new_tokens();
  const v1::SamplingParams& s = q.sampling();
  if (s.has_temperature()) r.temperature = s.temperature();
  if (s.has_top_p()) r.top_p = s.top_p();
  if (s.has_top_k()) r.top_k = s.top_k();
  if (s.has_seed()) r.seed = s.seed();
  if (s.has_min_p()) r.min_p = s.min_p();
  if (s.has_presence_penalty()) r.presence_penalty = s.presence_penalty();
  if (s.has_frequency_penalty()) r.frequency_penalty = s.frequency_penalty();
  if (s.has_repetition_penalty()) r.repetition_penalty = s.repetition_penalty();
  if (s.has_penalty_last_n()) r.penalty_last_n = s.penalty_last_n();
  // A proto map's order is unspecified: by id, so a request reads the same every time.
  r.logit_bias.assign(s.logit_bias().begin(), s.logit_bias().end());
  std::sort(r.logit_bias.begin(), r.logit_bias.end());
  r.min_tokens = s.min_tokens();
  r.stop.assign(q.stop().begin(), q.stop().end());
  r.stop_token_ids.assign(q.stop_token_ids().begin(), q.stop_token_ids().end());
  r.ignore_eos = q.ignore_eos();
  const v1::KvParams& kv = q.kv();
  if (kv.has_policy()) r.policy = kv.policy();
  if (kv.budget_case() == v1::KvParams::kBudgetTokens) r.budget_tokens = kv.budget_tokens();
  if (kv.budget_case() == v1::KvParams::kBudgetFraction) r.budget_fraction = kv.budget_fraction();
  if (kv.has_recent_fraction()) r.recent_fraction = kv.recent_fraction();
  if (kv.has_dtype()) r.kv_dtype = kv.dtype();
  r.logprobs = q.logprobs();
  r.top_logprobs = q.top_logprobs();
  if (q.has_skip_special_tokens()) r.skip_special_tokens = q.skip_special_tokens();
  if (q.has_constraint()) CopyConstraint(q.constraint(), r.constraint);
  if (q.n() != 0) r.n = q.n();  // unset: one choice
  if (q.has_prompt_logprobs()) r.prompt_logprobs = q.prompt_logprobs();
}

void AppendTop(const std::vector<TokenLogprob>& step, v1::TopLogprobs* t) {
  for (const TokenLogprob& c : step) {
    t->add_token_ids(c.token);
    t->add_logprobs(c.logprob);
  }
}

}  // namespace

absl::StatusOr<GenerationRequest> FromProto(const v1::GenerateRequest& q) {
  GenerationRequest r;
  CopyGenerationFields(q, &r);
  switch (q.input_case()) {
    case v1::GenerateRequest::kPrompt:
      r.prompt = q.prompt();
      break;
    case v1::GenerateRequest::kPromptTokenIds:
      r.prompt_token_ids.assign(q.prompt_token_ids().ids().begin(),
                                q.prompt_token_ids().ids().end());
      break;
    case v1::GenerateRequest::INPUT_NOT_SET:
      return absl::InvalidArgumentError(
          "the request has no input: set prompt (UTF-8 text) or prompt_token_ids");
  }
  return r;
}

absl::StatusOr<GenerationRequest> FromProto(const v1::ChatRequest& q) {
  GenerationRequest r;
  CopyGenerationFields(q, &r);
  std::vector<ChatMessage>& messages = r.messages.emplace();
  messages.reserve(q.messages_size());
  for (const v1::ChatMessage& m : q.messages()) messages.push_back({m.role(), m.content()});
  if (q.has_add_generation_prompt()) r.add_generation_prompt = q.add_generation_prompt();
  return r;
}

v1::FinishReason FinishReasonFromName(const std::string& name) {
  if (name == "length") return v1::FINISH_REASON_LENGTH;
  if (name == "stop") return v1::FINISH_REASON_STOP;
  if (name == "eos") return v1::FINISH_REASON_EOS;
  if (name == "cancelled") return v1::FINISH_REASON_CANCELLED;
  return v1::FINISH_REASON_UNSPECIFIED;
}

std::string FinishReasonName(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_EOS:
      return "eos";
    case v1::FINISH_REASON_CANCELLED:
      return "cancelled";
    default:
      return "";
  }
}

void AppendDelta(const GenerationDelta& d, v1::GenerateResponse* out) {
  if (d.prompt != nullptr) {  // once, on the first message (the first logprob is NaN)
    v1::PromptLogprobs* p = out->mutable_prompt_logprobs();
    p->mutable_token_ids()->Add(d.prompt->token_ids.begin(), d.prompt->token_ids.end());
    p->mutable_logprobs()->Add(d.prompt->logprobs.begin(), d.prompt->logprobs.end());
    p->mutable_ranks()->Add(d.prompt->ranks.begin(), d.prompt->ranks.end());
    for (const std::vector<TokenLogprob>& step : d.prompt->top) AppendTop(step, p->add_top());
  }
  for (int32_t id : d.token_ids) out->add_token_ids(id);
  out->mutable_text()->append(d.text);
  for (float lp : d.logprobs) out->add_logprobs(lp);
  for (const std::vector<TokenLogprob>& step : d.top_logprobs) {
    AppendTop(step, out->add_top_logprobs());
  }
  out->set_index(d.index);
  if (d.choice_finished) out->set_finish_reason(FinishReasonFromName(d.finish_reason));
  if (!d.finished) return;
  v1::Usage* u = out->mutable_usage();
  u->set_prompt_tokens(d.usage.prompt_tokens);
  u->set_completion_tokens(d.usage.completion_tokens);
  u->set_kv_tokens_kept(d.usage.kv_tokens_kept);
  u->set_kv_tokens_evicted(d.usage.kv_tokens_evicted);
  u->set_peak_pages(d.usage.peak_pages);
  u->set_policy(d.usage.policy);
  u->set_kv_budget_tokens(d.usage.kv_budget_tokens);
  u->set_kv_dtype(d.usage.kv_dtype);
  u->set_cached_tokens(d.usage.cached_tokens);
  v1::Timings* t = out->mutable_timings();
  t->set_queue_seconds(d.timings.queue_seconds);
  t->set_time_to_first_token_seconds(d.timings.time_to_first_token_seconds);
  t->set_total_seconds(d.timings.total_seconds);
}

void ToProto(const ModelInfo& info, v1::ModelInfo* out) {
  out->set_architecture(info.architecture);
  out->set_context_length(info.context_length);
  out->set_vocab_size(info.vocab_size);
  out->set_num_layers(info.num_layers);
  out->set_num_heads(info.num_heads);
  out->set_num_kv_heads(info.num_kv_heads);
  out->set_head_dim(info.head_dim);
  for (const std::string& p : info.policies) out->add_policies(p);
  out->set_pages_total(info.pages_total);
  out->set_block_size(info.block_size);
  out->set_page_bytes(info.page_bytes);
  out->set_pool_bytes(info.page_bytes * info.pages_total);
  out->set_tokenizer(info.tokenizer);
  out->set_chat(info.chat);
}

void ToProto(const CacheStats& s, v1::CacheStats* out) {
  out->set_pages_total(s.pages_total);
  out->set_pages_used(s.pages_used);
  out->set_sequences_running(s.sequences_running);
  out->set_sequences_waiting(s.sequences_waiting);
  out->set_tokens_evicted(s.tokens_evicted);
  out->set_preemptions(s.preemptions);
  out->set_kv_dtype(s.kv_dtype);
  out->set_bytes_per_token(s.bytes_per_token);
  out->set_pages_demoted(s.pages_demoted);
  out->set_pages_packed(s.pages_packed);
  out->set_cached_pages(s.cached_pages);
  out->set_prefix_lookups(s.prefix_lookups);
  out->set_prefix_hits(s.prefix_hits);
  out->set_prefix_hit_tokens(s.prefix_hit_tokens);
  out->set_prefix_reclaimed_pages(s.prefix_reclaimed_pages);
}

}  // namespace heavykv::server
