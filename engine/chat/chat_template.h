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
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace heavykv {

namespace jinja {
struct Node;
}  // namespace jinja

struct ChatMessage {
  std::string role;
  std::string content;
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

  // Renders with the variables messages (a list of {role, content} dicts), bos_token,
  // eos_token, add_generation_prompt, tools=None, documents=None and opts' extras.
  // INVALID_ARGUMENT with raise_exception's message, or naming the line of a runtime error
  // (wrong types, calling undefined, ...); RESOURCE_EXHAUSTED past opts.limits.
  absl::StatusOr<std::string> Render(const std::vector<ChatMessage>& messages,
                                     const ChatRenderOptions& opts) const;

 private:
  struct Program;
  explicit ChatTemplate(std::shared_ptr<const Program> program) : program_(std::move(program)) {}
  std::shared_ptr<const Program> program_;
};

}  // namespace heavykv
