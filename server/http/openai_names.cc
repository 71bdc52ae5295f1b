#include "server/http/openai_names.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace heavykv::server {
namespace {

struct Name {
  absl::string_view grpc;    // the heavykv.v1 field path (a request_field.h payload)
  absl::string_view openai;  // the body field an OpenAI client sends instead
};

// Every request field the engine's validator names. A field HTTP carries under the same name
// (`stop`, `stop_token_ids`, `logprobs`, `top_logprobs`, `messages`, `prompt`) is not listed.
constexpr Name kOpenAiNames[] = {
    {"max_new_tokens", "max_tokens"},
    {"prompt_token_ids", "prompt"},
    {"text", "prompt"},  // Tokenize's text: /tokenize's prompt
    {"sampling.temperature", "temperature"},
    {"sampling.top_p", "top_p"},
    {"sampling.top_k", "top_k"},
    {"sampling.seed", "seed"},
    {"sampling.min_p", "min_p"},
    {"sampling.presence_penalty", "presence_penalty"},
    {"sampling.frequency_penalty", "frequency_penalty"},
    {"sampling.repetition_penalty", "repetition_penalty"},
    {"sampling.penalty_last_n", "repeat_last_n"},  // llama.cpp's name; OpenAI has none
    {"sampling.logit_bias", "logit_bias"},
    {"sampling.min_tokens", "min_tokens"},
    {"kv.policy", "kv_policy"},
    {"kv.dtype", "kv_dtype"},
    {"kv.recent_fraction", "kv_recent_fraction"},
    {"kv.budget_tokens", "kv_budget"},
    {"kv.budget_fraction", "kv_budget"},
};

// Advice that only gRPC can follow, in HTTP's terms; replaced before the names.
constexpr Name kOpenAiPhrases[] = {
    {"send token ids (prompt_token_ids) to Generate",
     "send token ids to /v1/completions (\"prompt\": [ids])"},
    {"send token ids (prompt_token_ids)", "send token ids (\"prompt\": [ids])"},
    {"set prompt or prompt_token_ids", "set prompt"},
    {"send a prompt (Generate)", "send a prompt to /v1/completions"},
};

bool NameChar(char c) { return absl::ascii_isalnum(c) || c == '_'; }

// `text` with each whole occurrence of `name` replaced: not inside a longer name (letters, digits,
// '_', or a '.' joining two names).
std::string ReplaceName(absl::string_view text, absl::string_view name, absl::string_view with) {
  std::string out;
  size_t at = 0;
  for (size_t hit; (hit = text.find(name, at)) != absl::string_view::npos;) {
    const size_t end = hit + name.size();
    const bool starts = hit == 0 || !(NameChar(text[hit - 1]) || text[hit - 1] == '.');
    const bool ends = end == text.size() || !(NameChar(text[end]) ||
                                              (text[end] == '.' && end + 1 < text.size() &&
                                               NameChar(text[end + 1])));
    absl::StrAppend(&out, text.substr(at, hit - at));
    absl::StrAppend(&out, starts && ends ? with : name);
    at = end;
  }
  absl::StrAppend(&out, text.substr(at));
  return out;
}

}  // namespace

std::string OpenAiParam(absl::string_view request_field) {
  for (const Name& n : kOpenAiNames) {
    if (n.grpc == request_field) return std::string(n.openai);
  }
  return std::string(request_field);
}

std::string OpenAiMessage(absl::string_view message) {
  std::string out(message);
  for (const Name& p : kOpenAiPhrases) out = absl::StrReplaceAll(out, {{p.grpc, p.openai}});
  // `text` is a name only as Tokenize's field; in a message it is the word.
  for (const Name& n : kOpenAiNames) {
    if (n.grpc != "text") out = ReplaceName(out, n.grpc, n.openai);
  }
  return out;
}

}  // namespace heavykv::server
