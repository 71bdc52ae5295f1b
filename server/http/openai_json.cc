#include "server/http/openai_json.h"

#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/serving/request_validation.h"
#include "server/http/http_status.h"
#include "server/http/openai_constraint.h"
#include "server/http/openai_fields.h"
#include "server/http/openai_sampling.h"
#include "server/http/openai_unknown_fields.h"

namespace heavykv::server {
namespace {

using nlohmann::json;
// Request bodies keep their keys in the order sent: tools and tool-call arguments reach the
// template as the client wrote them (json.loads keeps that order too).
using ojson = nlohmann::ordered_json;

absl::Status Invalid(absl::string_view param, absl::string_view message) {
  return WithParam(absl::InvalidArgumentError(message), param);
}

constexpr int kMaxBodyDepth = 256;

// The body as a JSON object. The parse error names the byte, never the request's text.
absl::StatusOr<ojson> ParseObject(absl::string_view body) {
  ojson value;
  try {
    value = ojson::parse(body.begin(), body.end());
  } catch (const ojson::parse_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request body is not valid JSON (at byte ", e.byte, ")"));
  } catch (const ojson::exception&) {
    return absl::InvalidArgumentError("the request body is not valid JSON");
  }
  if (!value.is_object()) return absl::InvalidArgumentError("the request body must be an object");
  // Fields are written out again (tools, schemas) by json's dump, which recurses once per level:
  // a body of a million nested brackets would overflow the stack.
  std::vector<std::pair<const ojson*, int>> stack = {{&value, 1}};
  while (!stack.empty()) {
    const auto [v, depth] = stack.back();
    stack.pop_back();
    if (!v->is_structured()) continue;
    if (depth > kMaxBodyDepth) {
      return absl::InvalidArgumentError(
          absl::StrCat("the request body nests arrays and objects deeper than ", kMaxBodyDepth,
                       " levels"));
    }
    for (const ojson& e : *v) stack.emplace_back(&e, depth + 1);
  }
  return value;
}

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// `model`: absent, or the served one.
absl::Status CheckModel(Fields& f, const OpenAiServed& served) {
  const std::optional<std::string> model = f.String("model");
  if (model && *model != served.model) {
    return WithParam(WithErrorCode(absl::NotFoundError(absl::StrCat(
                                       "the model `", model->substr(0, 256),
                                       "` does not exist; this server serves `", served.model, "`")),
                                   "model_not_found"),
                     "model");
  }
  return f.status();
}

// A completion's prompt: a string, token ids, or a one-element list of either.
absl::Status ReadPrompt(const ojson* prompt, GenerationRequest& r) {
  if (prompt == nullptr) return Invalid("prompt", "prompt is required (a string or token ids)");
  const ojson* p = prompt;
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) {
    p = &(*p)[0];
  }
  if (p->is_string()) {
    r.prompt = p->get<std::string>();
    return absl::OkStatus();
  }
  if (p->is_array() && !p->empty()) {
    for (const ojson& e : *p) {
      const std::optional<int64_t> id = Fields::AsInt(e, 0, kInt32Max);
      if (!id) {
        return Invalid("prompt",
                       e.is_string() || e.is_array()
                           ? "prompt holds more than one prompt; heavykv takes one per request"
                           : "prompt token ids must be integers >= 0");
      }
      r.prompt_token_ids.push_back(static_cast<int32_t>(*id));
    }
    return absl::OkStatus();
  }
  return Invalid("prompt", "prompt must be a string, a list of token ids, or a list of one of them");
}

// A chat's messages: [{role, content}], content a string, null, or a list of text parts (joined),
// with the tool fields (ReadMessageToolFields). A null content is the empty text, as vLLM hands it
// to the template (an assistant turn with tool calls has none): Qwen3's template fails on None.
absl::Status ReadMessages(const ojson* messages, GenerationRequest& r) {
  if (messages == nullptr || !messages->is_array()) {
    return Invalid("messages", "messages is required: a list of {role, content}");
  }
  std::vector<ChatMessage>& out = r.messages.emplace();
  for (size_t i = 0; i < messages->size(); ++i) {
    const ojson& m = (*messages)[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return Invalid(where, where + " must be an object {role, content}");
    const auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return Invalid(where + ".role", where + ".role must be a string");
    }
    ChatMessage message{role->get<std::string>(), ""};
    const auto content = m.find("content");
    if (content == m.end() || content->is_null()) {
      // An assistant turn with tool calls has none: the empty text.
    } else if (content->is_string()) {
      message.content = content->get<std::string>();
    } else if (content->is_array()) {
      for (const ojson& part : *content) {
        const auto type = part.is_object() ? part.find("type") : part.end();
        const auto text_it = part.is_object() ? part.find("text") : part.end();
        const bool text = part.is_object() && type != part.end() && *type == "text" &&
                          text_it != part.end() && text_it->is_string();
        if (!text) {
          return Invalid(where + ".content",
                         where + ".content: only {\"type\": \"text\", \"text\": ...} parts are "
                                 "served");
        }
        message.content += text_it->get<std::string>();
      }
    } else {
      return Invalid(where + ".content", where + ".content must be a string or a list of parts");
    }
    if (absl::Status s = ReadMessageToolFields(m, where, message); !s.ok()) return s;
    out.push_back(std::move(message));
  }
  return absl::OkStatus();
}

// echo (completions: the prompt before the completion, with logprobs its tokens' too) and vLLM's
// prompt_logprobs: both are the engine's prompt_logprobs, asked for once with the most top tokens
// either wants. max_tokens 0 is allowed with them only (a prompt scored, as lm-evaluation-harness
// asks), and makes the engine end after the prompt.
void ReadPromptScoring(ApiKind kind, Fields& f, std::optional<int64_t> max_tokens,
                       OpenAiRequest& q) {
  GenerationRequest& r = q.generation;
  if (auto v = f.Bool("echo"); v && *v) {
    if (kind == ApiKind::kChat) {
      f.Fail("echo", "is served on /v1/completions only (a chat has prompt_logprobs)");
    } else {
      q.echo = true;
      if (r.logprobs) r.prompt_logprobs = r.top_logprobs;
    }
  }
  if (auto n = f.Int("prompt_logprobs", 0, kMaxTopLogprobs)) {
    // Sent once in the whole response, as vLLM does; a stream has no place for it.
    if (q.stream) f.Fail("prompt_logprobs", "is not served with \"stream\": true");
    q.prompt_logprobs = static_cast<int32_t>(*n);
    r.prompt_logprobs = std::max(r.prompt_logprobs, *q.prompt_logprobs);
  }
  if (max_tokens && *max_tokens == 0) {
    if (!q.echo && !q.prompt_logprobs) {
      f.Fail(f.Get("max_completion_tokens") ? "max_completion_tokens" : "max_tokens",
             "must be at least 1; 0 (score the prompt alone) needs echo or prompt_logprobs");
    }
    r.prompt_logprobs = std::max(r.prompt_logprobs, 0);
  }
}

}  // namespace

absl::StatusOr<OpenAiRequest> ParseGenerationBody(ApiKind kind, absl::string_view body,
                                                  const OpenAiServed& served) {
  absl::StatusOr<ojson> parsed = ParseObject(body);
  if (!parsed.ok()) return parsed.status();
  const ojson& o = *parsed;
  WarnUnknownFields(kind, o);
  Fields f(o);
  if (absl::Status s = CheckModel(f, served); !s.ok()) return s;
  OpenAiRequest q;
  GenerationRequest& r = q.generation;
  if (absl::Status s = kind == ApiKind::kChat ? ReadMessages(f.Get("messages"), r)
                                              : ReadPrompt(f.Get("prompt"), r);
      !s.ok()) {
    return s;
  }
  if (kind == ApiKind::kChat) {
    if (auto v = f.Bool("add_generation_prompt")) r.add_generation_prompt = *v;
    if (absl::Status s = ReadToolFields(o, served.tool_call_format, q.tools, r); !s.ok()) return s;
  } else {
    f.Unsupported("tools", "are served on /v1/chat/completions only");
  }

  // 0 scores the prompt alone (echo, prompt_logprobs: ReadPromptScoring checks it).
  std::optional<int64_t> max_tokens = f.Int("max_tokens", 0, kInt32Max);
  if (auto v = f.Int("max_completion_tokens", 0, kInt32Max)) max_tokens = v;
  bool to_limit = kind == ApiKind::kChat;  // OpenAI and vLLM: until the context is full
  if (!max_tokens) {  // llama.cpp's name; its -1 is "until the limit" on both APIs
    if (auto v = f.Int("n_predict", -1, kInt32Max); v && *v != -1) {
      if (*v == 0) f.Fail("n_predict", "must be -1 (until the limit) or at least 1");
      max_tokens = v;
    } else if (v) {
      to_limit = true;
    }
  }
  if (max_tokens) {
    r.max_new_tokens = static_cast<int32_t>(*max_tokens);
  } else if (to_limit) {
    r.max_new_tokens = std::max(1, served.max_new_tokens_limit);
    r.max_new_tokens_to_context = true;
  }
  if (auto v = f.Number("temperature")) r.temperature = float(*v);
  if (auto v = f.Number("top_p")) r.top_p = float(*v);
  if (auto v = f.Int("top_k", -1, kInt32Max); v && *v > 0) r.top_k = int32_t(*v);
  if (const ojson* seed = f.Get("seed")) {
    if (seed->is_number_unsigned()) {
      r.seed = seed->get<uint64_t>();
    } else if (seed->is_number_integer()) {
      r.seed = static_cast<uint64_t>(seed->get<int64_t>());
    } else {
      f.Fail("seed", "must be an integer");
    }
  }
  if (const ojson* stop = f.Get("stop")) {
    if (stop->is_string()) {
      r.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const ojson& s : *stop) {
        if (!s.is_string()) {
          f.Fail("stop", "must be a string or a list of strings");
          break;
        }
        r.stop.push_back(s.get<std::string>());
      }
    } else {
      f.Fail("stop", "must be a string or a list of strings");
    }
  }
  // n choices share the prompt's pages (the engine bounds n: serve --max-n). best_of (vLLM:
  // sample best_of, return the n most likely) is served only as n itself.
  if (auto n = f.Int("n", 1, kInt32Max)) r.n = int32_t(*n);
  if (auto n = f.Int("best_of", 1, kInt32Max); n && *n != r.n) {
    f.Fail("best_of", "is not served beyond n: send best_of equal to n, or leave it out");
  }
  if (kind == ApiKind::kCompletion) {  // the legacy API: how many top tokens, 0 for none
    if (auto n = f.Int("logprobs", 0, kMaxTopLogprobs)) {
      r.logprobs = true;
      r.top_logprobs = static_cast<int32_t>(*n);
    }
  } else {
    if (auto v = f.Bool("logprobs")) r.logprobs = *v;
    if (auto n = f.Int("top_logprobs", 0, kMaxTopLogprobs)) {
      if (*n > 0 && !r.logprobs) f.Fail("top_logprobs", "needs \"logprobs\": true");
      r.top_logprobs = static_cast<int32_t>(*n);
    }
  }
  f.Unsupported("use_beam_search", "is not served: leave it out");
  f.Unsupported("suffix", "is not served: leave it out");
  ReadSamplingFields(f, r);  // the penalties, logit_bias, min_p, ...; refuses what is not served
  if (auto v = f.Bool("stream")) q.stream = *v;
  ReadPromptScoring(kind, f, max_tokens, q);
  if (const ojson* options = f.Get("stream_options")) {
    if (!options->is_object()) {
      f.Fail("stream_options", "must be an object");
    } else if (const auto it = options->find("include_usage");
               it != options->end() && !it->is_null()) {
      if (!it->is_boolean()) {
        f.Fail("stream_options.include_usage", "must be true or false");
      } else {
        q.include_usage = it->get<bool>();
      }
    }
  }

  if (auto v = f.String("kv_policy")) r.policy = *v;
  if (auto v = f.String("kv_dtype")) r.kv_dtype = *v;
  if (auto v = f.Number("kv_budget")) {  // as --kv-budget: (0, 1] a fraction, above a token count
    if (!(*v > 0) || !std::isfinite(*v)) {
      f.Fail("kv_budget", "must be a fraction in (0, 1] or a whole number of tokens > 1");
    } else if (*v <= 1) {
      r.budget_fraction = *v;
    } else if (*v != std::floor(*v) || *v > kInt32Max) {
      f.Fail("kv_budget", "over 1 must be a whole number of tokens (at most 2^31 - 1)");
    } else {
      r.budget_tokens = int32_t(*v);
    }
  }
  if (auto v = f.Number("kv_recent_fraction")) r.recent_fraction = *v;
  if (auto v = f.Bool("ignore_eos")) r.ignore_eos = *v;
  r.stop_token_ids = f.Ints("stop_token_ids", 0, kInt32Max);
  if (auto v = f.Bool("skip_special_tokens")) r.skip_special_tokens = *v;
  if (!f.status().ok()) return f.status();
  // The body keeps its key order: a schema's property order is the order a model writes them in.
  grammar::ConstraintSpec tools_constraint = std::move(r.constraint);
  if (absl::Status s = ReadConstraintFields(o, r.constraint, q.constraint_param); !s.ok()) {
    return s;
  }
  if (tools_constraint.active()) {
    const ToolChoice::Mode mode = q.tools.choice.mode;
    if (!r.constraint.active()) {
      r.constraint = std::move(tools_constraint);
      q.constraint_param = "tools";  // a tool's parameters schema is what may not compile
    } else if (mode == ToolChoice::Mode::kRequired || mode == ToolChoice::Mode::kNamed) {
      return Invalid(q.constraint_param,
                     absl::StrCat(q.constraint_param, " and tool_choice both constrain the "
                                  "output: send one"));
    }
    // tool_choice "auto": the other constraint governs the output; calls are still parsed.
  }
  return q;
}

absl::StatusOr<TokenizeBody> ParseTokenizeBody(absl::string_view body, const OpenAiServed& served) {
  absl::StatusOr<ojson> parsed = ParseObject(body);
  if (!parsed.ok()) return parsed.status();
  Fields f(*parsed);
  if (absl::Status s = CheckModel(f, served); !s.ok()) return s;
  TokenizeBody out;
  if (const ojson* messages = f.Get("messages")) {
    if (f.Get("prompt") != nullptr) {
      return Invalid("prompt", "send either prompt or messages, not both");
    }
    GenerationRequest& chat = out.chat.emplace();
    if (absl::Status s = ReadMessages(messages, chat); !s.ok()) return s;
    if (auto v = f.Bool("add_generation_prompt")) chat.add_generation_prompt = *v;
    ChatTools tools;  // only what the template sees: the tools and the kwargs
    if (absl::Status s = ReadToolFields(*parsed, served.tool_call_format, tools, chat); !s.ok()) {
      return s;
    }
    if (!f.status().ok()) return f.status();
    return out;
  }
  std::optional<std::string> prompt = f.String("prompt");
  if (auto v = f.Bool("add_special_tokens")) out.add_special_tokens = *v;
  if (!f.status().ok()) return f.status();
  if (!prompt) return Invalid("prompt", "prompt (a string) or messages (a chat) is required");
  out.prompt = *std::move(prompt);
  return out;
}

absl::StatusOr<std::vector<int32_t>> ParseDetokenizeBody(absl::string_view body,
                                                         const OpenAiServed& served) {
  absl::StatusOr<ojson> parsed = ParseObject(body);
  if (!parsed.ok()) return parsed.status();
  Fields f(*parsed);
  if (absl::Status s = CheckModel(f, served); !s.ok()) return s;
  if (f.Get("tokens") == nullptr) return Invalid("tokens", "tokens is required (token ids)");
  std::vector<int32_t> ids = f.Ints("tokens", 0, kInt32Max);
  if (!f.status().ok()) return f.status();
  return ids;
}

std::string OpenAiFinishReason(const std::string& engine_reason) {
  if (engine_reason == "length") return "length";
  if (engine_reason == "stop" || engine_reason == "eos") return "stop";
  return "abort";
}

nlohmann::json UsageJson(const GenerationUsage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}},
          {"kv",
           {{"policy", u.policy},
            {"dtype", u.kv_dtype},
            {"budget_tokens", u.kv_budget_tokens},
            {"tokens_kept", u.kv_tokens_kept},
            {"tokens_evicted", u.kv_tokens_evicted},
            {"peak_pages", u.peak_pages}}}};
}

namespace {

json Envelope(const ResponseMeta& meta, const char* completion_object, const char* chat_object) {
  return {{"id", meta.id},
          {"object", meta.kind == ApiKind::kChat ? chat_object : completion_object},
          {"created", meta.created},
          {"model", meta.model}};
}

}  // namespace

nlohmann::json ChoiceJson(ApiKind kind, int32_t index, const std::string& text,
                          const std::string& finish_reason, const nlohmann::json& logprobs,
                          const nlohmann::json& prompt_logprobs) {
  json choice = {{"index", index}};
  if (kind == ApiKind::kChat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = logprobs;
  choice["finish_reason"] = OpenAiFinishReason(finish_reason);
  // vLLM's place for it: the choice's in a completion, the response's in a chat.
  if (!prompt_logprobs.is_null() && kind == ApiKind::kCompletion) {
    choice["prompt_logprobs"] = prompt_logprobs;
  }
  return choice;
}

nlohmann::json ResponseJson(const ResponseMeta& meta, nlohmann::json choices,
                            const GenerationUsage& usage, const nlohmann::json& prompt_logprobs) {
  json out = Envelope(meta, "text_completion", "chat.completion");
  out["choices"] = std::move(choices);
  if (!prompt_logprobs.is_null() && meta.kind == ApiKind::kChat) {
    out["prompt_logprobs"] = prompt_logprobs;
  }
  out["usage"] = UsageJson(usage);
  return out;
}

nlohmann::json ResponseJson(const ResponseMeta& meta, const std::string& text,
                            const GenerationDelta& last, const nlohmann::json& logprobs,
                            const nlohmann::json& prompt_logprobs) {
  return ResponseJson(meta,
                      json::array({ChoiceJson(meta.kind, 0, text, last.finish_reason, logprobs,
                                              prompt_logprobs)}),
                      last.usage, prompt_logprobs);
}

nlohmann::json StreamChunkJson(const ResponseMeta& meta, absl::string_view text,
                               const std::optional<std::string>& finish_reason, bool first,
                               bool include_usage, const nlohmann::json& logprobs,
                               int32_t index) {
  json out = Envelope(meta, "text_completion", "chat.completion.chunk");
  json choice = {{"index", index}};
  if (meta.kind == ApiKind::kChat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (first || !text.empty()) delta["content"] = text;
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = logprobs;
  choice["finish_reason"] = finish_reason ? json(*finish_reason) : json(nullptr);
  out["choices"] = json::array({std::move(choice)});
  if (include_usage) out["usage"] = nullptr;
  return out;
}

nlohmann::json UsageChunkJson(const ResponseMeta& meta, const GenerationUsage& usage) {
  json out = Envelope(meta, "text_completion", "chat.completion.chunk");
  out["choices"] = json::array();
  out["usage"] = UsageJson(usage);
  return out;
}

std::string JsonText(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string SseEvent(const nlohmann::json& chunk) {
  return absl::StrCat("data: ", JsonText(chunk), "\n\n");
}

nlohmann::json ModelJson(const std::string& model, int64_t created, int32_t max_model_len) {
  return {{"id", model},
          {"object", "model"},
          {"created", created},
          {"owned_by", "heavykv"},
          {"max_model_len", max_model_len}};
}

nlohmann::json ModelsJson(const std::string& model, int64_t created, int32_t max_model_len) {
  return {{"object", "list"}, {"data", json::array({ModelJson(model, created, max_model_len)})}};
}

}  // namespace heavykv::server
