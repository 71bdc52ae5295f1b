// A model's chat template (GGUF `tokenizer.chat_template`, Jinja) turned into the prompt text,
// byte for byte as Hugging Face transformers renders it: jinja2 with trim_blocks=True,
// lstrip_blocks=True and the loopcontrols extension, the globals raise_exception and
// strftime_now, and HF's tojson (json.dumps with ensure_ascii=False).
//
// The interpreter covers the Jinja subset real chat templates use: text, {{ }}, {% %}, {# #}
// with `-`/`+` whitespace control; if/elif/else, for (tuple targets, `if` filter, else,
// break/continue, `loop.*`), set (names, tuples, `ns.attr` on a namespace(), block set), macro
// (positional/keyword parameters with defaults; no varargs, kwargs or caller);
// Python-like expressions with literals, attribute/item access, slicing, arithmetic, `~`,
// comparisons, and/or/not, in, inline if; the common filters, tests and str/dict methods
// (chat_template_builtins.h lists them). Refused at Parse time: call/filter blocks,
// raw blocks, include/import/extends and `recursive` loops. Differences from Python that remain:
// ints are 64-bit (overflow is an error, not a big int), upper/lower/title map ASCII letters
// only, range() is a list (its repr is a list's), and loop.cycle/changed are absent.
//
// Usage:
//   absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(source);
//   absl::StatusOr<std::string> prompt = t->Render(messages, {.bos_token = "<s>"});
//
// A template is immutable after Parse; Render is const and safe to call from several threads.
// Every render is bounded (ChatRenderLimits): a hostile template fails with RESOURCE_EXHAUSTED
// instead of hanging or exhausting memory.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace heavykv {

namespace jinja {
struct Node;
}  // namespace jinja

// One tool call of an assistant turn, as OpenAI's API sends it.
struct ChatToolCall {
  std::string id;
  std::string type = "function";
  std::string name;
  // JSON text (OpenAI's function.arguments). The template sees the value it holds (a dict), as
  // vLLM passes it: templates write `tool_call.arguments | tojson`. Empty: {}.
  std::string arguments;
};

// One message as transformers passes it to the template: a dict with role and content, and
// tool_calls, tool_call_id, name and reasoning_content only where they are set.
struct ChatMessage {
  // {role, content} as before tools existed, without -Wmissing-field-initializers noise.
  ChatMessage() = default;
  ChatMessage(std::string role, std::string content)
      : role(std::move(role)), content(std::move(content)) {}

  std::string role;
  std::string content;
  bool content_null = false;  // content is None (an assistant turn that only calls tools)
  std::vector<ChatToolCall> tool_calls;  // [{id, type, function: {name, arguments}}]
  std::optional<std::string> tool_call_id;  // role "tool": the call it answers
  std::optional<std::string> name;
  std::optional<std::string> reasoning_content;
};

// The work one Render may do.
struct ChatRenderLimits {
  int64_t max_output_bytes = 4 << 20;  // the prompt, and any one string or list built
  // Expression evaluations and loop iterations (8 each): about a second of work at most, and
  // a hundred times what a thousand-message conversation takes with the largest templates.
  int64_t max_steps = 4'000'000;
  int max_depth = 200;  // nesting of statements and expressions (also at Parse)
};

struct ChatRenderOptions {
  std::string bos_token;
  std::string eos_token;
  bool add_generation_prompt = true;
  // More top-level variables (e.g. enable_thinking=false), strings or bools.
  std::map<std::string, std::string> extra_strings;
  std::map<std::string, bool> extra_bools;
  // `tools`: JSON text of a list of OpenAI tool dicts ({type: "function", function: {name,
  // description, parameters}}); empty: None.
  std::string tools_json;
  // More top-level variables of any JSON type (vLLM's chat_template_kwargs): JSON text of an
  // object, set after every other variable except `messages` and `tools` (which it cannot
  // replace); empty: none.
  std::string extra_json;
  // What strftime_now() formats (UTC); the current time when unset. Tests fix it.
  std::optional<absl::Time> now;
  ChatRenderLimits limits;
};

class ChatTemplate {
 public:
  // Parses once; INVALID_ARGUMENT naming the line and column for a syntax error or a construct
  // outside the subset above.
  static absl::StatusOr<ChatTemplate> Parse(std::string_view source,
                                            const ChatRenderLimits& limits = {});

  // Renders with the variables messages (ChatMessage's dicts), bos_token, eos_token,
  // add_generation_prompt, tools (opts.tools_json or None), documents=None and opts' extras.
  // INVALID_ARGUMENT with raise_exception's message, naming the line of a runtime error
  // (wrong types, calling undefined, ...), or for JSON text in opts or in a tool call's
  // arguments that does not parse (or is not the type named above); RESOURCE_EXHAUSTED past
  // opts.limits.
  absl::StatusOr<std::string> Render(const std::vector<ChatMessage>& messages,
                                     const ChatRenderOptions& opts) const;

  // The template's text, as given to Parse (the tool-call and reasoning formats are detected
  // from it: engine/chat/tool_calls.h, reasoning.h).
  const std::string& source() const;

 private:
  struct Program;
  explicit ChatTemplate(std::shared_ptr<const Program> program) : program_(std::move(program)) {}
  std::shared_ptr<const Program> program_;
};

}  // namespace heavykv
