#include "engine/chat/reasoning.h"

#include <algorithm>

namespace heavykv {
namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";

bool IsWs(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

size_t WsPrefix(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && IsWs(s[i])) ++i;
  return i;
}

// The longest proper suffix of `s` that is a prefix of `tag`.
size_t PartialTagSuffix(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n) {
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace

bool TemplateUsesThinkTags(std::string_view chat_template) {
  return chat_template.find(kThinkOpen) != std::string_view::npos &&
         chat_template.find(kThinkClose) != std::string_view::npos;
}

bool PromptOpensReasoning(std::string_view prompt) {
  size_t end = prompt.size();
  while (end > 0 && IsWs(prompt[end - 1])) --end;
  return prompt.substr(0, end).ends_with(kThinkOpen);
}

ReasoningStreamParser::ReasoningStreamParser(bool starts_in_reasoning)
    : state_(starts_in_reasoning ? State::kReasoning : State::kStart),
      opened_(starts_in_reasoning) {}

ReasoningDelta ReasoningStreamParser::Feed(std::string_view text) {
  ReasoningDelta out;
  buf_.append(text.data(), text.size());
  Step(out, /*final=*/false);
  return out;
}

ReasoningDelta ReasoningStreamParser::Finish() {
  ReasoningDelta out;
  Step(out, /*final=*/true);
  return out;
}

void ReasoningStreamParser::Step(ReasoningDelta& out, bool final) {
  for (;;) {
    switch (state_) {
      case State::kStart: {  // spaces, then `<think>` or the answer
        const size_t ws = WsPrefix(buf_);
        const std::string_view rest = std::string_view(buf_).substr(ws);
        if (rest.starts_with(kThinkOpen)) {
          buf_.erase(0, ws + kThinkOpen.size());
          state_ = State::kReasoning;
          opened_ = true;
          continue;
        }
        if (!final && kThinkOpen.starts_with(rest)) return;  // not known yet
        state_ = State::kContent;
        continue;
      }
      case State::kReasoning: {
        const size_t pos = buf_.find(kThinkClose);
        if (pos != std::string::npos) {
          out.reasoning.append(buf_, 0, pos);
          buf_.erase(0, pos + kThinkClose.size());
          state_ = State::kAfter;
          continue;
        }
        const size_t keep = final ? 0 : PartialTagSuffix(buf_, kThinkClose);
        out.reasoning.append(buf_, 0, buf_.size() - keep);
        buf_.erase(0, buf_.size() - keep);
        return;
      }
      case State::kAfter:  // the spaces after `</think>` are in neither part
        buf_.erase(0, WsPrefix(buf_));
        if (buf_.empty()) return;
        state_ = State::kContent;
        continue;
      case State::kContent:
        out.content += buf_;
        buf_.clear();
        return;
    }
  }
}

ReasoningSplit SplitReasoning(std::string_view text, bool starts_in_reasoning) {
  ReasoningStreamParser parser(starts_in_reasoning);
  ReasoningSplit out;
  for (const ReasoningDelta& d : {parser.Feed(text), parser.Finish()}) {
    out.reasoning += d.reasoning;
    out.content += d.content;
  }
  out.has_reasoning = parser.opened();
  return out;
}

}  // namespace heavykv
