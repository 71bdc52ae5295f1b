// Reasoning in a chat model's output (Qwen3, DeepSeek-R1: `<think>...</think>` before the
// answer), split from the answer as vLLM and DeepSeek's API return it: reasoning_content and
// content.
//
//   if (TemplateUsesThinkTags(chat_template.source())) {
//     ReasoningStreamParser parser(PromptOpensReasoning(rendered_prompt));
//     for each text delta: ReasoningDelta d = parser.Feed(delta.text);  -> reasoning, content
//     at the end:          ReasoningDelta d = parser.Finish();
//   }
//
// The output's reasoning is what stands between `<think>` and `</think>`, when the output starts
// with `<think>` (after spaces), or everything up to `</think>` when the prompt already opened it
// (the template wrote `<think>` at the end of the generation prompt: DeepSeek-R1, Qwen3's
// thinking models). An output cut short inside the reasoning is all reasoning. The tags and the
// spaces that follow `</think>` are in neither part; the reasoning keeps its own bytes.
#pragma once

#include <string>
#include <string_view>

namespace heavykv {

// Whether the template writes `<think>` and `</think>`: only then is output split.
bool TemplateUsesThinkTags(std::string_view chat_template);
// Whether the prompt ends inside a reasoning block: its last `<think>` has no `</think>` after
// it and only spaces follow it.
bool PromptOpensReasoning(std::string_view prompt);

struct ReasoningDelta {
  std::string reasoning;
  std::string content;
  bool empty() const { return reasoning.empty() && content.empty(); }
};

// Splits output fed in pieces; text that may be the start of a tag is held until it is known.
// Splitting the same text anywhere gives the same parts. Not thread-safe; one per response.
class ReasoningStreamParser {
 public:
  explicit ReasoningStreamParser(bool starts_in_reasoning);

  ReasoningDelta Feed(std::string_view text);
  ReasoningDelta Finish();  // the end of the output: what was held goes out

  bool in_reasoning() const { return state_ == State::kReasoning; }
  // A reasoning block was opened (by the prompt or the output), even an empty one.
  bool opened() const { return opened_; }

 private:
  enum class State { kStart, kReasoning, kAfter, kContent };
  void Step(ReasoningDelta& out, bool final);

  State state_;
  bool opened_;
  std::string buf_;  // fed and not yet given out
};

struct ReasoningSplit {
  std::string reasoning;  // empty when there was none
  std::string content;
  bool has_reasoning = false;  // a reasoning block was opened (its text may be empty)
};
// The whole output at once: Feed(text) then Finish(), gathered.
ReasoningSplit SplitReasoning(std::string_view text, bool starts_in_reasoning);

}  // namespace heavykv
