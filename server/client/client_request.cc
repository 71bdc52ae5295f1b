#include "server/client/client_request.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "memory/eviction_policy.h"

namespace heavykv::cli {

void AddRequestFlags(FlagSet& flags, RequestFlags* f) {
  flags.Int("max-tokens", &f->max_tokens, "max_new_tokens");
  flags.Double("temperature", &f->temperature, "0 = greedy (unset: server default)");
  flags.Double("top-p", &f->top_p, "nucleus sampling (unset: server default)");
  flags.Int("top-k", &f->top_k, "top-k sampling; 0 = off (unset: server default)");
  flags.Int("seed", &f->seed, "sampling seed (unset: random)");
  f->sampling.Register(flags);
  flags.String("policy", &f->policy,
               "KV policy: full, window, sink, h2o, tova, scissorhands, knorm, snapkv, as "
               "name[:key=value]... (unset: server default)");
  flags.String("kv-budget", &f->kv_budget, "KV tokens kept per head: a count or a fraction");
  flags.Double("recent-fraction", &f->recent_fraction,
               "h2o, scissorhands, snapkv: share of the budget for recent tokens");
  flags.String("stop", &f->stop, "comma-separated stop strings");
  flags.Bool("ignore-eos", &f->ignore_eos, "keep generating past end-of-sequence");
  flags.Bool("logprobs", &f->logprobs, "ask for the sampled tokens' log-probabilities");
  flags.Int("top-logprobs", &f->top_logprobs, "with --logprobs: the N most likely tokens too");
  flags.Int("prompt-logprobs", &f->prompt_logprobs,
            "the prompt tokens' log-probabilities, with the N most likely tokens at each (0: "
            "none of those); with it --max-tokens 0 scores the prompt alone");
  flags.Bool("keep-special-tokens", &f->keep_special_tokens,
             "keep control tokens (<|im_end|>, </s>) in the text: skip_special_tokens=false");
  flags.Int("n", &f->n, "choices: the prompt runs once and forks into N sequences");
}

namespace {

// The fields GenerateRequest and ChatRequest share.
template <typename Request>
absl::Status FillSharedFields(const FlagSet& flags, const RequestFlags& f, Request* out) {
  out->set_max_new_tokens(static_cast<int32_t>(f.max_tokens));
  v1::SamplingParams* s = out->mutable_sampling();
  if (flags.IsSet("temperature")) s->set_temperature(static_cast<float>(f.temperature));
  if (flags.IsSet("top-p")) s->set_top_p(static_cast<float>(f.top_p));
  if (flags.IsSet("top-k")) s->set_top_k(static_cast<int32_t>(f.top_k));
  if (flags.IsSet("seed")) s->set_seed(static_cast<uint64_t>(f.seed));
  GenerationRequest api;  // the sampling API's flags, as the engine's request holds them
  if (absl::Status st = f.sampling.Fill(flags, api); !st.ok()) return st;
  if (api.min_p) s->set_min_p(*api.min_p);
  if (api.presence_penalty) s->set_presence_penalty(*api.presence_penalty);
  if (api.frequency_penalty) s->set_frequency_penalty(*api.frequency_penalty);
  if (api.repetition_penalty) s->set_repetition_penalty(*api.repetition_penalty);
  if (api.penalty_last_n) s->set_penalty_last_n(*api.penalty_last_n);
  // A map keeps the last bias of an id, as the engine does with a list.
  for (const auto& [id, bias] : api.logit_bias) (*s->mutable_logit_bias())[id] = bias;
  s->set_min_tokens(api.min_tokens);
  v1::KvParams* kv = out->mutable_kv();
  if (!f.policy.empty()) kv->set_policy(f.policy);
  if (!f.kv_budget.empty()) {
    absl::StatusOr<KvBudget> b = KvBudget::Parse(f.kv_budget);
    if (!b.ok()) return b.status();
    if (b->is_fraction) {
      kv->set_budget_fraction(b->value);
    } else {
      kv->set_budget_tokens(static_cast<int32_t>(b->value));
    }
  }
  if (flags.IsSet("recent-fraction")) kv->set_recent_fraction(f.recent_fraction);
  for (const std::string& stop : SplitList(f.stop)) out->add_stop(stop);
  out->set_ignore_eos(f.ignore_eos);
  out->set_logprobs(f.logprobs);
  out->set_top_logprobs(static_cast<int32_t>(f.top_logprobs));
  if (f.keep_special_tokens) out->set_skip_special_tokens(false);
  if (f.n != 1) out->set_n(static_cast<int32_t>(f.n));
  if (flags.IsSet("prompt-logprobs")) {
    out->set_prompt_logprobs(static_cast<int32_t>(f.prompt_logprobs));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status FillRequest(const FlagSet& flags, const RequestFlags& f, v1::GenerateRequest* out) {
  return FillSharedFields(flags, f, out);
}

absl::Status FillRequest(const FlagSet& flags, const RequestFlags& f, v1::ChatRequest* out) {
  return FillSharedFields(flags, f, out);
}

void AddConnectionFlags(FlagSet& flags, ConnectionFlags* f) {
  flags.String("server", &f->address, "heavykv serve address host:port");
  server::AddClientTlsFlags(flags, &f->tls);
  flags.String("api-key", &f->api_key,
               "API key sent as `authorization: Bearer KEY` (unset: env HEAVYKV_API_KEY)");
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> Connect(ConnectionFlags* f, bool own_connection,
                                                       int window_bytes) {
  if (f->api_key.empty()) {
    if (const char* env = std::getenv("HEAVYKV_API_KEY"); env != nullptr) f->api_key = env;
  }
  return server::ClientChannel(f->address, f->tls, own_connection, window_bytes);
}

void Authorize(const ConnectionFlags& f, grpc::ClientContext* context) {
  if (!f.api_key.empty()) context->AddMetadata("authorization", "Bearer " + f.api_key);
}

std::string StatusCodeName(grpc::StatusCode code) {
  // clang-format off
  static constexpr const char* kNames[] = {
      "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
      "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
      "UNAUTHENTICATED"};
  // clang-format on
  const int c = static_cast<int>(code);
  return c >= 0 && c < 17 ? kNames[c] : absl::StrCat("CODE_", c);
}

}  // namespace heavykv::cli
