// Fuzzes the chat output parsers (engine/chat/tool_calls.h, reasoning.h) with a model's text.
// Input layout: flags byte | split seed byte | text. Flags bits 0-1: the tool-call format (0 Qwen
// / Hermes, 1 Llama 3, 2 and 3 generic); bit 2: the prompt opened a reasoning block. The text is
// parsed whole and streamed in pieces cut where the seed says; both must give the same content,
// reasoning and calls (ids, names, arguments), call ids must be "call_" and 24 letters and
// digits, and what comes out is never longer than what went in (but for "{}" per call without
// arguments).
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "engine/chat/reasoning.h"
#include "engine/chat/tool_calls.h"

namespace {

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "chat_output_fuzzer: %s\n", what);
  std::abort();
}

// Cuts `text` into pieces of 1 to 8 bytes chosen by a small LCG from `seed`.
std::vector<std::string_view> Pieces(std::string_view text, uint32_t seed) {
  std::vector<std::string_view> out;
  for (size_t at = 0; at < text.size();) {
    seed = seed * 1103515245u + 12345u;
    const size_t len = 1 + (seed >> 16) % 8;
    out.push_back(text.substr(at, len));
    at += len;
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t flags = data[0];
  const uint32_t seed = data[1];
  const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);
  const heavykv::ToolCallFormat formats[] = {
      heavykv::ToolCallFormat::kHermes, heavykv::ToolCallFormat::kLlama3,
      heavykv::ToolCallFormat::kGeneric, heavykv::ToolCallFormat::kGeneric};
  const heavykv::ToolCallFormat format = formats[flags & 3];
  const bool open = flags & 4;
  const std::vector<std::string> names = {"get_weather", "f", "get_time"};

  const heavykv::ParsedToolCalls whole = heavykv::ParseToolCalls(format, text, names, seed);
  heavykv::ToolCallStreamParser parser(format, names, seed);
  std::string content;
  std::vector<heavykv::ToolCall> calls;
  const auto gather = [&](const heavykv::ToolCallStreamDelta& d) {
    content += d.content;
    for (const heavykv::ToolCallDelta& t : d.tool_calls) {
      if (size_t(t.index) == calls.size()) {
        if (t.id.empty() || t.name.empty()) Fail("a call's first delta has no id or name");
        calls.push_back({t.id, t.name, ""});
      } else if (size_t(t.index) + 1 != calls.size() || !t.id.empty() || !t.name.empty()) {
        Fail("a later delta is not the last call's argument fragment");
      }
      calls.back().arguments += t.arguments;
    }
  };
  for (std::string_view piece : Pieces(text, seed)) gather(parser.Feed(piece));
  gather(parser.Finish());
  if (!calls.empty() && content.find_first_not_of(" \t\r\n") == std::string::npos) content.clear();
  if (content != whole.content) Fail("streamed content differs");
  if (calls.size() != whole.calls.size()) Fail("streamed calls differ");
  for (size_t i = 0; i < calls.size(); ++i) {
    const heavykv::ToolCall& c = whole.calls[i];
    if (calls[i].id != c.id || calls[i].name != c.name || calls[i].arguments != c.arguments) {
      Fail("a streamed call differs");
    }
    if (c.id.size() != 29 || c.id.compare(0, 5, "call_") != 0) Fail("a call id's shape");
    for (char ch : c.id.substr(5)) {
      if (!std::isalnum(static_cast<unsigned char>(ch))) Fail("a call id's shape");
    }
  }
  if (whole.content.size() > text.size()) Fail("more content than text");

  const heavykv::ReasoningSplit split = heavykv::SplitReasoning(text, open);
  heavykv::ReasoningStreamParser reasoning(open);
  std::string r, c;
  for (std::string_view piece : Pieces(text, seed + 1)) {
    heavykv::ReasoningDelta d = reasoning.Feed(piece);
    r += d.reasoning;
    c += d.content;
  }
  heavykv::ReasoningDelta d = reasoning.Finish();
  r += d.reasoning;
  c += d.content;
  if (r != split.reasoning || c != split.content || reasoning.opened() != split.has_reasoning) {
    Fail("streamed reasoning differs");
  }
  if (r.size() + c.size() > text.size()) Fail("more reasoning and content than text");
  return 0;
}
