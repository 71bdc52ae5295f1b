// Tool calling and reasoning on the OpenAI chat API (docs/ARCHITECTURE.md "OpenAI HTTP API"):
// the request fields (tools, tool_choice, parallel_tool_calls, chat_template_kwargs, and the
// messages' tool_calls, tool_call_id, name, reasoning_content), and the output parsed back into
// message.reasoning_content / message.tool_calls, whole or as stream deltas.
//
//   ChatOutput out(ChatOutputOptionsFor(info.chat_template.get(), request));
//   for each engine delta: ChatOutputDelta d = out.Feed(delta.text);   -> ChatDeltaJson(d)
//   at the end:            d = out.Finish();  finish_reason = ChatFinishReason(reason, out)
//
// The engine renders `tools` and the kwargs into the prompt (the request's GenerationRequest
// chat_tools / chat_template_kwargs) and enforces `constraint` (tool_choice "required" or a named
// tool); this file only reads the API and parses the text. tool_choice "none" still renders the
// tools into the prompt (vLLM's default) but no call is parsed from the output.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "engine/chat/chat_template.h"
#include "engine/chat/reasoning.h"
#include "engine/chat/tool_calls.h"
#include "engine/serving/engine.h"
#include "nlohmann/json.hpp"

namespace heavykv::server {

// A chat request's tool fields, as parsed (OpenAiRequest::tools).
struct ChatTools {
  std::vector<ToolSpec> tools;  // name and parameters schema, in the request's order
  ToolChoice choice{ToolChoice::Mode::kNone, ""};
  bool parallel = true;  // parallel_tool_calls
};

// One message's tool_calls, tool_call_id, name and reasoning_content into `message` (`where`:
// "messages[i]", for errors). A tool call's arguments must be JSON text of an object (an object
// is taken too). INVALID_ARGUMENT naming the field.
absl::Status ReadMessageToolFields(const nlohmann::ordered_json& m, const std::string& where,
                                   ChatMessage& message);

// tools, tool_choice, parallel_tool_calls and chat_template_kwargs of a chat body into `tools`
// and r (chat_tools, chat_template_kwargs, constraint for `format`). INVALID_ARGUMENT naming the
// field: a tool that is not {type: "function", function: {name, description?, parameters?}}, a
// name outside [A-Za-z0-9_-]{1,64} or twice, a tool_choice naming no tool, or any other than
// "none" without tools.
absl::Status ReadToolFields(const nlohmann::ordered_json& body, ToolCallFormat format,
                            ChatTools& tools, GenerationRequest& r);

struct ChatOutputOptions {
  bool reasoning = false;            // split <think> blocks (TemplateUsesThinkTags)
  bool starts_in_reasoning = false;  // the prompt opened one (PromptOpensReasoning)
  bool tools = false;                // parse tool calls (tools sent, tool_choice not "none")
  ToolCallFormat format = ToolCallFormat::kGeneric;
  std::vector<std::string> names;
  uint64_t seed = 0;  // the call ids'
};

// What `request` with `tools` needs parsed from its output under `chat_template` (may be null:
// nothing). Renders the template's generation prompt once to see whether it opens a reasoning
// block (the request's kwargs included, e.g. enable_thinking).
ChatOutputOptions ChatOutputOptionsFor(const ChatTemplate* chat_template,
                                       const GenerationRequest& request, const ChatTools& tools,
                                       uint64_t seed);

// A constraint that would start at the output's first byte starts after the reasoning instead
// (issue 43: "a constraint applies after the reasoning") when the prompt opened a reasoning block:
// its trigger is "</think>" (not part of what it matches). A template that leaves it to the model
// whether to think (Qwen3's hybrid) gets the constraint from the first byte: a trigger that never
// came would leave the output free.
void ConstrainAfterReasoning(const ChatOutputOptions& options, grammar::ConstraintSpec& spec);

struct ChatOutputDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
  // `next` after this one (a call's argument fragments join its last delta).
  void Append(ChatOutputDelta next);
};

// The output's parsers in a row: reasoning first, then tool calls in what follows it.
class ChatOutput {
 public:
  explicit ChatOutput(ChatOutputOptions options);
  // Whether any parsing is on (else Feed returns the text as content).
  bool active() const { return options_.reasoning || options_.tools; }
  bool reasoning() const { return options_.reasoning; }
  ChatOutputDelta Feed(std::string_view text);
  ChatOutputDelta Finish();
  int num_calls() const { return tool_parser_ ? tool_parser_->num_calls() : 0; }

 private:
  void Content(std::string_view text, ChatOutputDelta& out, bool final);

  ChatOutputOptions options_;
  std::optional<ReasoningStreamParser> reasoning_parser_;
  std::optional<ToolCallStreamParser> tool_parser_;
};

// choices[0].message of a whole response: {role, content (null when only calls or reasoning came),
// reasoning_content (with a reasoning template; null when none), tool_calls (when calls were
// made): [{id, type: "function", function: {name, arguments}}]}.
nlohmann::json ChatMessageJson(const ChatOutput& output, const ChatOutputDelta& whole);
// choices[0].delta of a stream chunk: content, reasoning_content and tool_calls where the delta
// has them ([{index, id, type, function: {name, arguments}}] first, then {index, function:
// {arguments}}).
nlohmann::json ChatDeltaJson(const ChatOutputDelta& delta);
// "tool_calls" when the output made calls and ended by itself (stop, eos), else OpenAI's reason.
std::string ChatFinishReason(const std::string& engine_reason, const ChatOutput& output);

}  // namespace heavykv::server
