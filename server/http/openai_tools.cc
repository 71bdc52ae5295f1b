#include "server/http/openai_tools.h"

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "server/http/http_status.h"
#include "server/http/openai_json.h"

namespace heavykv::server {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

absl::Status Invalid(const std::string& param, const std::string& message) {
  return WithParam(absl::InvalidArgumentError(message), param);
}

// The field of an object when present and not null.
const ojson* Field(const ojson& o, const char* key) {
  if (!o.is_object()) return nullptr;
  const auto it = o.find(key);
  return it == o.end() || it->is_null() ? nullptr : &*it;
}

// OpenAI's rule for function names.
bool ValidToolName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::string Dump(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

absl::Status ReadToolChoice(const ojson& body, ChatTools& tools) {
  const ojson* choice = Field(body, "tool_choice");
  using Mode = ToolChoice::Mode;
  if (choice == nullptr) {
    tools.choice = {tools.tools.empty() ? Mode::kNone : Mode::kAuto, ""};
    return absl::OkStatus();
  }
  if (choice->is_string()) {
    const std::string s = *choice;
    if (s == "none") {
      tools.choice = {Mode::kNone, ""};
    } else if (s == "auto") {
      tools.choice = {Mode::kAuto, ""};
    } else if (s == "required") {
      tools.choice = {Mode::kRequired, ""};
    } else {
      return Invalid("tool_choice",
                     "tool_choice must be \"none\", \"auto\", \"required\" or "
                     "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
  } else {
    const ojson* type = Field(*choice, "type");
    const ojson* function = Field(*choice, "function");
    const ojson* name = function != nullptr ? Field(*function, "name") : nullptr;
    if (type == nullptr || *type != "function" || name == nullptr || !name->is_string()) {
      return Invalid("tool_choice",
                     "tool_choice must be \"none\", \"auto\", \"required\" or "
                     "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    tools.choice = {Mode::kNamed, name->get<std::string>()};
  }
  if (tools.choice.mode != Mode::kNone && tools.tools.empty()) {
    return Invalid("tool_choice", "tool_choice other than \"none\" needs tools");
  }
  if (tools.choice.mode == Mode::kNamed) {
    bool found = false;
    for (const ToolSpec& t : tools.tools) found |= t.name == tools.choice.name;
    if (!found) {
      return Invalid("tool_choice",
                     absl::StrCat("tool_choice names the function `",
                                  tools.choice.name.substr(0, 64), "`, which is not in tools"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ReadMessageToolFields(const ojson& m, const std::string& where, ChatMessage& message) {
  const std::pair<const char*, std::optional<std::string>*> strings[] = {
      {"tool_call_id", &message.tool_call_id},
      {"name", &message.name},
      {"reasoning_content", &message.reasoning_content}};
  for (const auto& [key, field] : strings) {
    const ojson* v = Field(m, key);
    if (v == nullptr) continue;
    if (!v->is_string()) {
      return Invalid(absl::StrCat(where, ".", key),
                     absl::StrCat(where, ".", key, " must be a string"));
    }
    *field = v->get<std::string>();
  }
  const ojson* calls = Field(m, "tool_calls");
  if (calls == nullptr) return absl::OkStatus();
  if (!calls->is_array()) {
    return Invalid(where + ".tool_calls", where + ".tool_calls must be a list");
  }
  for (size_t k = 0; k < calls->size(); ++k) {
    const ojson& c = (*calls)[k];
    const std::string at = absl::StrCat(where, ".tool_calls[", k, "]");
    const ojson* function = Field(c, "function");
    const ojson* name = function != nullptr ? Field(*function, "name") : nullptr;
    if (name == nullptr || !name->is_string()) {
      return Invalid(at + ".function.name",
                     at + " must be {id, type: \"function\", function: {name, arguments}}");
    }
    ChatToolCall call;
    call.name = *name;
    if (const ojson* id = Field(c, "id")) {
      if (!id->is_string()) return Invalid(at + ".id", at + ".id must be a string");
      call.id = *id;
    }
    if (const ojson* type = Field(c, "type"); type != nullptr && *type != "function") {
      return Invalid(at + ".type", at + ".type must be \"function\"");
    }
    if (const ojson* arguments = Field(*function, "arguments")) {
      if (arguments->is_object()) {
        call.arguments = Dump(*arguments);
      } else if (arguments->is_string()) {
        call.arguments = *arguments;
        if (!call.arguments.empty()) {
          const ojson parsed = ojson::parse(call.arguments, nullptr, /*allow_exceptions=*/false);
          if (parsed.is_discarded() || !parsed.is_object()) {
            return Invalid(at + ".function.arguments",
                           at + ".function.arguments must be the JSON text of an object");
          }
        }
      } else {
        return Invalid(at + ".function.arguments",
                       at + ".function.arguments must be the JSON text of an object");
      }
    }
    message.tool_calls.push_back(std::move(call));
  }
  return absl::OkStatus();
}

absl::Status ReadToolFields(const ojson& body, ToolCallFormat format, ChatTools& tools,
                            GenerationRequest& r) {
  if (const ojson* list = Field(body, "tools")) {
    if (!list->is_array()) return Invalid("tools", "tools must be a list of functions");
    absl::flat_hash_set<std::string> names;
    for (size_t i = 0; i < list->size(); ++i) {
      const ojson& t = (*list)[i];
      const std::string at = absl::StrCat("tools[", i, "]");
      const ojson* type = Field(t, "type");
      if (type == nullptr || *type != "function") {
        return Invalid(at + ".type", at + ".type must be \"function\" (the only kind served)");
      }
      const ojson* function = Field(t, "function");
      if (function == nullptr || !function->is_object()) {
        return Invalid(at + ".function", at + ".function must be {name, description, parameters}");
      }
      const ojson* name = Field(*function, "name");
      if (name == nullptr || !name->is_string() || !ValidToolName(*name)) {
        return Invalid(at + ".function.name",
                       at + ".function.name must be 1 to 64 of a-z, A-Z, 0-9, _ and -");
      }
      if (!names.insert(name->get<std::string>()).second) {
        return Invalid(at + ".function.name", at + ".function.name is used by another tool");
      }
      if (const ojson* d = Field(*function, "description"); d != nullptr && !d->is_string()) {
        return Invalid(at + ".function.description", at + ".function.description must be a string");
      }
      ToolSpec spec{name->get<std::string>(), ""};
      if (const ojson* p = Field(*function, "parameters")) {
        if (!p->is_object()) {
          return Invalid(at + ".function.parameters",
                         at + ".function.parameters must be a JSON Schema object");
        }
        spec.parameters = Dump(*p);
      }
      tools.tools.push_back(std::move(spec));
    }
    r.chat_tools = Dump(*list);  // as sent: transformers hands the template the client's dicts
  }
  if (absl::Status s = ReadToolChoice(body, tools); !s.ok()) return s;
  if (const ojson* p = Field(body, "parallel_tool_calls")) {
    if (!p->is_boolean()) {
      return Invalid("parallel_tool_calls", "parallel_tool_calls must be true or false");
    }
    tools.parallel = p->get<bool>();
  }
  if (const ojson* kwargs = Field(body, "chat_template_kwargs")) {
    if (!kwargs->is_object()) {
      return Invalid("chat_template_kwargs", "chat_template_kwargs must be an object");
    }
    if (!kwargs->empty()) r.chat_template_kwargs = Dump(*kwargs);
  }
  absl::StatusOr<grammar::ConstraintSpec> constraint =
      ToolCallConstraint(format, tools.tools, tools.choice, tools.parallel);
  if (!constraint.ok()) return WithParam(constraint.status(), "tool_choice");
  if (constraint->active()) r.constraint = *std::move(constraint);
  return absl::OkStatus();
}

ChatOutputOptions ChatOutputOptionsFor(const ChatTemplate* chat_template,
                                       const GenerationRequest& request, const ChatTools& tools,
                                       uint64_t seed) {
  ChatOutputOptions o;
  if (chat_template == nullptr || !request.messages.has_value()) return o;
  const std::string& source = chat_template->source();
  o.reasoning = TemplateUsesThinkTags(source);
  if (o.reasoning) {
    // The generation prompt is the same whatever the conversation: render a short one.
    ChatRenderOptions render;
    render.add_generation_prompt = request.add_generation_prompt;
    render.extra_json = request.chat_template_kwargs;
    absl::StatusOr<std::string> prompt = chat_template->Render({ChatMessage("user", "Hi")}, render);
    o.starts_in_reasoning = prompt.ok() && PromptOpensReasoning(*prompt);
  }
  o.tools = !tools.tools.empty() && tools.choice.mode != ToolChoice::Mode::kNone;
  o.format = DetectToolCallFormat(source);
  for (const ToolSpec& t : tools.tools) o.names.push_back(t.name);
  o.seed = seed;
  return o;
}

void ConstrainAfterReasoning(const ChatOutputOptions& options, grammar::ConstraintSpec& spec) {
  if (!options.reasoning || !options.starts_in_reasoning || !spec.active()) return;
  if (!spec.triggers.empty()) return;  // already lazy (a tool call's tag under "auto")
  spec.triggers = {"</think>"};
  spec.trigger_in_grammar = false;
}

void ChatOutputDelta::Append(ChatOutputDelta next) {
  reasoning += next.reasoning;
  content += next.content;
  for (ToolCallDelta& t : next.tool_calls) {
    if (!tool_calls.empty() && tool_calls.back().index == t.index && t.id.empty()) {
      tool_calls.back().arguments += t.arguments;
    } else {
      tool_calls.push_back(std::move(t));
    }
  }
}

ChatOutput::ChatOutput(ChatOutputOptions options) : options_(std::move(options)) {
  if (options_.reasoning) reasoning_parser_.emplace(options_.starts_in_reasoning);
  if (options_.tools) tool_parser_.emplace(options_.format, options_.names, options_.seed);
}

void ChatOutput::Content(std::string_view text, ChatOutputDelta& out, bool final) {
  if (!tool_parser_) {
    out.content.append(text.data(), text.size());
    return;
  }
  ToolCallStreamDelta d = tool_parser_->Feed(text);
  out.Append({"", std::move(d.content), std::move(d.tool_calls)});
  if (!final) return;
  ToolCallStreamDelta rest = tool_parser_->Finish();
  out.Append({"", std::move(rest.content), std::move(rest.tool_calls)});
}

ChatOutputDelta ChatOutput::Feed(std::string_view text) {
  ChatOutputDelta out;
  if (!reasoning_parser_) {
    Content(text, out, /*final=*/false);
    return out;
  }
  ReasoningDelta r = reasoning_parser_->Feed(text);
  out.reasoning = std::move(r.reasoning);
  Content(r.content, out, /*final=*/false);
  return out;
}

ChatOutputDelta ChatOutput::Finish() {
  ChatOutputDelta out;
  if (!reasoning_parser_) {
    Content("", out, /*final=*/true);
    return out;
  }
  ReasoningDelta r = reasoning_parser_->Finish();
  out.reasoning = std::move(r.reasoning);
  Content(r.content, out, /*final=*/true);
  return out;
}

namespace {

json ToolCallDeltaJson(const ToolCallDelta& t) {
  json function = json::object();
  if (!t.name.empty()) function["name"] = t.name;
  function["arguments"] = t.arguments;
  json out = {{"index", t.index}};
  if (!t.id.empty()) {
    out["id"] = t.id;
    out["type"] = "function";
  }
  out["function"] = std::move(function);
  return out;
}

}  // namespace

nlohmann::json ChatMessageJson(const ChatOutput& output, const ChatOutputDelta& whole) {
  json message = {{"role", "assistant"}};
  // Gathered per call: the deltas of one call are in order.
  std::vector<ToolCall> calls;
  for (const ToolCallDelta& t : whole.tool_calls) {
    if (size_t(t.index) >= calls.size()) calls.resize(t.index + 1);
    if (!t.id.empty()) calls[t.index].id = t.id;
    if (!t.name.empty()) calls[t.index].name = t.name;
    calls[t.index].arguments += t.arguments;
  }
  // Only calls, or only reasoning: no content (null), as OpenAI and vLLM answer.
  const bool blank = whole.content.find_first_not_of(" \t\r\n") == std::string::npos;
  const bool other = !calls.empty() || !whole.reasoning.empty();
  message["content"] = other && blank ? json(nullptr) : json(whole.content);
  if (output.reasoning()) {
    message["reasoning_content"] = whole.reasoning.empty() ? json(nullptr) : json(whole.reasoning);
  }
  if (!calls.empty()) {
    json list = json::array();
    for (const ToolCall& c : calls) {
      list.push_back({{"id", c.id},
                      {"type", "function"},
                      {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    }
    message["tool_calls"] = std::move(list);
  }
  return message;
}

nlohmann::json ChatDeltaJson(const ChatOutputDelta& delta) {
  json out = json::object();
  if (!delta.reasoning.empty()) out["reasoning_content"] = delta.reasoning;
  if (!delta.content.empty()) out["content"] = delta.content;
  if (!delta.tool_calls.empty()) {
    json list = json::array();
    for (const ToolCallDelta& t : delta.tool_calls) list.push_back(ToolCallDeltaJson(t));
    out["tool_calls"] = std::move(list);
  }
  return out;
}

std::string ChatFinishReason(const std::string& engine_reason, const ChatOutput& output) {
  if (output.num_calls() > 0 && (engine_reason == "stop" || engine_reason == "eos")) {
    return "tool_calls";
  }
  return OpenAiFinishReason(engine_reason);
}

}  // namespace heavykv::server
