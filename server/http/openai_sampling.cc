#include "server/http/openai_sampling.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "engine/serving/request_validation.h"

namespace heavykv::server {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
// llama.cpp's repeat_last_n when only repeat_penalty is sent.
constexpr int32_t kLlamaCppRepeatLastN = 64;

std::optional<float> Float(Fields& f, const char* key) {
  const std::optional<double> v = f.Number(key);
  return v ? std::optional<float>(float(*v)) : std::nullopt;
}

// OpenAI's logit_bias: {"50256": -100, ...}. The ids' range and the biases' are the engine's
// to check; here only the shape (ids written as decimal integers, biases numbers).
void ReadLogitBias(Fields& f, GenerationRequest& r) {
  const Fields::Json* bias = f.Get("logit_bias");
  if (bias == nullptr) return;
  if (!bias->is_object()) {
    return f.Fail("logit_bias", "must be an object {\"token id\": bias}");
  }
  for (const auto& [key, value] : bias->items()) {
    int32_t id = 0;
    const bool digits = !key.empty() && key.size() <= 10 &&
                        std::all_of(key.begin(), key.end(), absl::ascii_isdigit);
    if (!digits || !absl::SimpleAtoi(key, &id)) {
      return f.Fail("logit_bias", absl::StrCat("keys must be token ids (\"50256\"), got \"",
                                               EscapedPrefix(key), "\""));
    }
    if (!value.is_number()) {
      return f.Fail("logit_bias", absl::StrCat("of token ", id, " must be a number"));
    }
    r.logit_bias.emplace_back(id, value.get<float>());
    // The engine refuses more than kMaxLogitBias entries; no need to keep reading past that.
    if (r.logit_bias.size() > kMaxLogitBias) return;
  }
}

// The fields that would change the output and are not served: each refused by name.
void RefuseUnserved(Fields& f) {
  const auto not_default = [&](const char* key, double off) {
    const std::optional<double> v = f.Number(key);
    if (v && *v != off) f.Fail(key, absl::StrCat("is not served: send ", off, " or leave it out"));
  };
  not_default("typical_p", 1);
  not_default("length_penalty", 1);
  not_default("tfs_z", 1);
  // mirostat_tau, mirostat_eta, dry_base, ... only matter with these on.
  not_default("mirostat", 0);
  not_default("dynatemp_range", 0);
  not_default("dry_multiplier", 0);
  not_default("xtc_probability", 0);
  if (auto v = f.Number("top_n_sigma"); v && *v > 0) {
    f.Fail("top_n_sigma", "is not served: send -1 or leave it out");
  }
  for (const char* key : {"penalize_nl", "include_stop_str_in_output"}) {
    if (auto v = f.Bool(key); v && *v) f.Fail(key, "is not served: send false or leave it out");
  }
  for (const char* key : {"bad_words", "allowed_token_ids", "logits_processors", "samplers",
                          "truncate_prompt_tokens", "reasoning_effort", "prediction", "audio",
                          "web_search_options"}) {
    f.Unsupported(key, "is not served: leave it out");
  }
  for (const char* key : {"functions", "function_call"}) {
    f.Unsupported(key, "is OpenAI's legacy tool API: send tools and tool_choice");
  }
  if (const Fields::Json* m = f.Get("modalities")) {
    const bool text = m->is_array() && std::all_of(m->begin(), m->end(), [](const auto& e) {
                        return e.is_string() && e.template get<std::string>() == "text";
                      });
    if (!text) f.Fail("modalities", "is served as [\"text\"] only");
  }
}

}  // namespace

void ReadSamplingFields(Fields& f, GenerationRequest& r) {
  if (auto v = Float(f, "min_p")) r.min_p = *v;
  if (auto v = Float(f, "presence_penalty")) r.presence_penalty = *v;
  if (auto v = Float(f, "frequency_penalty")) r.frequency_penalty = *v;
  if (auto v = Float(f, "repetition_penalty")) r.repetition_penalty = *v;
  if (auto v = Float(f, "repeat_penalty")) {
    if (r.repetition_penalty && *r.repetition_penalty != *v) {
      f.Fail("repeat_penalty", "and repetition_penalty differ: send one");
    }
    r.repetition_penalty = *v;
    r.penalty_last_n = kLlamaCppRepeatLastN;
  }
  // Range checked by the engine (penalty_last_n >= -1), which names repeat_last_n for HTTP.
  if (auto v = f.Int("repeat_last_n", std::numeric_limits<int32_t>::min(), kInt32Max)) {
    r.penalty_last_n = int32_t(*v);
  }
  if (auto v = f.Int("min_tokens", 0, kInt32Max)) r.min_tokens = int32_t(*v);
  ReadLogitBias(f, r);
  if (auto n = f.Int("n_probs", 0, kMaxTopLogprobs); n && *n > 0) {
    r.logprobs = true;
    r.top_logprobs = int32_t(*n);
  }
  RefuseUnserved(f);
}

}  // namespace heavykv::server
