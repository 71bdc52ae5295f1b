// Tool calls in a chat model's output (OpenAI's `tools`): the format a chat template teaches its
// model, the parsers that turn the generated text into content and calls (whole, or delta by
// delta as it streams), and the constraint that enforces tool_choice (engine/grammar).
//
//   ToolCallFormat format = DetectToolCallFormat(chat_template.source());
//   ToolCallStreamParser parser(format, {"get_weather"}, seed);
//   for each text delta:  ToolCallStreamDelta d = parser.Feed(delta.text);  -> content, calls
//   at the end:           ToolCallStreamDelta d = parser.Finish();
//   (or ParseToolCalls(format, text, names, seed) for the whole text at once: the same result)
//
// The formats:
//   kHermes (Qwen2.5, Qwen3, Hermes): calls as `<tool_call>\n{"name": N, "arguments": {...}}\n
//     </tool_call>`, any number of them, with content around them.
//   kLlama3 (Llama 3.1, 3.2): the whole message is `{"name": N, "parameters": {...}}`, optionally
//     after `<|python_tag|>` and with "type": "function" first; several separated by `;`.
//   kGeneric (any other template): the whole message is one such object (with "arguments" or
//     "parameters") or a JSON list of them.
// A call counts only when its name is one of the request's tools: anything else is content. Its
// arguments are the JSON object the model wrote, compacted (no whitespace outside strings); a
// call cut short (max_tokens) keeps what was written. Whitespace that touches a kHermes call
// block is dropped. Text after the arguments object inside a call is dropped.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/grammar/constraint_spec.h"

namespace heavykv {

enum class ToolCallFormat { kHermes, kLlama3, kGeneric };

// From the template text: kHermes when it writes `<tool_call>`, kLlama3 when it writes
// `<|python_tag|>` or Llama 3's `"parameters"` instruction, else kGeneric.
ToolCallFormat DetectToolCallFormat(std::string_view chat_template);
// "qwen", "llama3", "generic": ToolCallGrammar's "format".
const char* ToolCallFormatName(ToolCallFormat format);

struct ToolCall {
  std::string id;  // "call_" and 24 letters and digits
  std::string name;
  std::string arguments;  // compact JSON text
};

// One OpenAI tool-call delta (choices[0].delta.tool_calls[k]): the first of a call has its id
// and name (and type "function"), the later ones argument fragments whose concatenation is the
// call's arguments.
struct ToolCallDelta {
  int index = 0;
  std::string id;    // set on a call's first delta only
  std::string name;  // set on a call's first delta only
  std::string arguments;
};

struct ToolCallStreamDelta {
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return content.empty() && tool_calls.empty(); }
};

// Feeds a model's output text through the format's parser. Text that may still become part of a
// call (the start of an opening tag, a call object before its name is known) is held back until
// it is known, so deltas never take back what they said. Splitting the same text at any byte
// boundaries gives the same content and calls. Not thread-safe; one per response.
class ToolCallStreamParser {
 public:
  // `names`: the request's tools. `seed` makes the ids (the same seed, the same ids).
  ToolCallStreamParser(ToolCallFormat format, std::vector<std::string> names, uint64_t seed);

  ToolCallStreamDelta Feed(std::string_view text);
  // The end of the output: what was held back is content unless it was a call.
  ToolCallStreamDelta Finish();

  int num_calls() const { return num_calls_; }

 private:
  enum class State {
    kText,      // kHermes: content, looking for <tool_call>
    kStart,     // bare JSON formats: before the first non-space byte
    kOpen,      // a call object before its name is known (held in raw_)
    kArgsKey,   // after the name: `, "arguments":` (or "parameters")
    kArgs,      // inside the arguments object, streamed compacted
    kCallTail,  // after the arguments: the rest of the call object, then its close
    kNext,      // bare JSON: after a call, `;` / `,` then another, or the end
    kContent,   // everything left is content
  };
  void Step(ToolCallStreamDelta& out, bool final);
  bool StepText(ToolCallStreamDelta& out, bool final);
  bool StepStart(ToolCallStreamDelta& out, bool final);
  bool StepOpen(ToolCallStreamDelta& out, bool final);
  bool StepArgsKey(ToolCallStreamDelta& out, bool final);
  bool StepArgs(ToolCallStreamDelta& out);
  bool StepCallTail(bool final);
  bool StepNext(ToolCallStreamDelta& out, bool final);
  void EmitArgs(ToolCallStreamDelta& out, std::string_view fragment);
  std::string NewId();

  const ToolCallFormat format_;
  const std::vector<std::string> names_;
  std::mt19937_64 rng_;
  State state_;
  std::string buf_;       // fed and not yet consumed
  std::string raw_;       // kOpen: the consumed text of a call not yet known to be one
  std::string held_ws_;   // kText: spaces before what may be a tag (dropped if it is one)
  bool drop_ws_ = false;  // kText: just after a call block: its following spaces are dropped
  bool in_list_ = false;  // bare JSON: inside `[...]`
  int num_calls_ = 0;
  // kArgs / kCallTail: the JSON scan of the object. ScanJson takes one more byte and says
  // whether it closed the outermost bracket.
  bool ScanJson(char ch);
  int depth_ = 0;
  bool in_string_ = false, escaped_ = false;
};

struct ParsedToolCalls {
  std::string content;  // empty when it is only spaces and there are calls
  std::vector<ToolCall> calls;
};

// The whole output at once: Feed(text) then Finish(), gathered.
ParsedToolCalls ParseToolCalls(ToolCallFormat format, std::string_view text,
                               const std::vector<std::string>& names, uint64_t seed);

// A request's tool, as the grammar needs it.
struct ToolSpec {
  std::string name;
  std::string parameters;  // a JSON Schema (JSON text); empty: any object
};

// OpenAI's tool_choice.
struct ToolChoice {
  enum class Mode { kNone, kAuto, kRequired, kNamed };
  Mode mode = Mode::kAuto;
  std::string name;  // kNamed
};

// The ToolCallGrammar JSON (ConstraintSpec::kToolCalls's text; engine/grammar/tool_grammar.h
// compiles it):
//   {"format": "qwen" | "llama3" | "generic",
//    "tools": [{"name": N, "parameters": <JSON Schema>}, ...],
//    "parallel": true | false}
// kHermes: `<tool_call>\n{"name": N, "arguments": ARGS}\n</tool_call>`, several separated by "\n"
// when parallel. kLlama3: `{"name": N, "parameters": ARGS}`, several separated by "; ".
// kGeneric: `{"name": N, "arguments": ARGS}`, several as a JSON list `[A, B]`.
std::string ToolCallGrammarJson(ToolCallFormat format, const std::vector<ToolSpec>& tools,
                                bool parallel);

// The constraint of a tool_choice: kNone for "none"; for "required" or a named tool (only that
// tool) the output must be calls (kToolCalls, not lazy); for "auto", calls are free to start but
// checked from the format's opening trigger on (kHermes: "<tool_call>", trigger_in_grammar), and
// unconstrained (kNone) where the format has no trigger (kLlama3, kGeneric: bare JSON).
// INVALID_ARGUMENT for a named tool not among `tools`, or "required" without tools.
absl::StatusOr<grammar::ConstraintSpec> ToolCallConstraint(ToolCallFormat format,
                                                           const std::vector<ToolSpec>& tools,
                                                           const ToolChoice& choice, bool parallel);

}  // namespace heavykv
