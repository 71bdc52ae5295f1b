#include "engine/chat/tool_calls.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace heavykv {
namespace {

constexpr std::string_view kOpenTag = "<tool_call>";
constexpr std::string_view kCloseTag = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";

bool IsWs(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

size_t WsPrefix(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && IsWs(s[i])) ++i;
  return i;
}

// The start of the trailing spaces of `s`.
size_t WsSuffixStart(std::string_view s) {
  size_t i = s.size();
  while (i > 0 && IsWs(s[i - 1])) --i;
  return i;
}

// The longest proper suffix of `s` that is a prefix of `tag` (text that may yet become it).
size_t PartialTagSuffix(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n) {
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

enum class Match { kMore, kFail, kOk };

// Matches fixed text at a position of what has arrived so far: kMore while it ran out first.
struct Cursor {
  std::string_view s;
  size_t i = 0;

  void Ws() { i += WsPrefix(s.substr(i)); }
  Match Lit(std::string_view lit) {
    const size_t n = std::min(lit.size(), s.size() - i);
    if (s.substr(i, n) != lit.substr(0, n)) return Match::kFail;
    if (n < lit.size()) return Match::kMore;
    i += n;
    return Match::kOk;
  }
  // The byte at i + k, or 0 when it has not arrived.
  char Peek(size_t k = 0) const { return i + k < s.size() ? s[i + k] : 0; }
};

#define HEAVYKV_MATCH(expr)                   \
  do {                                        \
    const Match m_ = (expr);                  \
    if (m_ != Match::kOk) return {m_, 0, ""}; \
  } while (0)

struct OpenMatch {
  Match match;
  size_t consumed;
  std::string name;
};

// `{"name": "N"` (optionally `"type": "function",` first), N one of `names`.
OpenMatch MatchCallOpen(std::string_view s, const std::vector<std::string>& names) {
  Cursor c{s};
  c.Ws();
  HEAVYKV_MATCH(c.Lit("{"));
  c.Ws();
  if (c.Peek(1) == 0) return {Match::kMore, 0, ""};
  if (c.Peek() == '"' && c.Peek(1) == 't') {
    HEAVYKV_MATCH(c.Lit("\"type\""));
    c.Ws();
    HEAVYKV_MATCH(c.Lit(":"));
    c.Ws();
    HEAVYKV_MATCH(c.Lit("\"function\""));
    c.Ws();
    HEAVYKV_MATCH(c.Lit(","));
    c.Ws();
  }
  HEAVYKV_MATCH(c.Lit("\"name\""));
  c.Ws();
  HEAVYKV_MATCH(c.Lit(":"));
  c.Ws();
  HEAVYKV_MATCH(c.Lit("\""));
  const size_t end = s.find('"', c.i);
  const std::string_view name =
      s.substr(c.i, end == std::string_view::npos ? s.size() - c.i : end - c.i);
  if (name.find('\\') != std::string_view::npos) return {Match::kFail, 0, ""};
  if (end == std::string_view::npos) {
    const bool prefix = std::any_of(names.begin(), names.end(), [&](const std::string& n) {
      return std::string_view(n).starts_with(name);
    });
    return {prefix ? Match::kMore : Match::kFail, 0, ""};
  }
  if (std::find(names.begin(), names.end(), name) == names.end()) return {Match::kFail, 0, ""};
  return {Match::kOk, end + 1, std::string(name)};
}
#undef HEAVYKV_MATCH

// `, "arguments":` or `, "parameters":` and the spaces after it.
Match MatchArgsKey(std::string_view s, size_t* consumed) {
  Cursor c{s};
  c.Ws();
  if (const Match m = c.Lit(","); m != Match::kOk) return m;
  c.Ws();
  if (c.Peek(1) == 0) return Match::kMore;
  const Match key = c.Peek(1) == 'p' ? c.Lit("\"parameters\"") : c.Lit("\"arguments\"");
  if (key != Match::kOk) return key;
  c.Ws();
  if (const Match m = c.Lit(":"); m != Match::kOk) return m;
  c.Ws();
  if (c.i == s.size()) return Match::kMore;  // the value's first byte decides
  *consumed = c.i;
  return Match::kOk;
}

}  // namespace

ToolCallFormat DetectToolCallFormat(std::string_view chat_template) {
  const auto has = [&](std::string_view s) {
    return chat_template.find(s) != std::string_view::npos;
  };
  if (has(kOpenTag)) return ToolCallFormat::kHermes;
  if (has(kPythonTag) || has("\"parameters\": dictionary of argument name")) {
    return ToolCallFormat::kLlama3;
  }
  return ToolCallFormat::kGeneric;
}

const char* ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return "qwen";
    case ToolCallFormat::kLlama3:
      return "llama3";
    case ToolCallFormat::kGeneric:
      return "generic";
  }
  return "generic";
}

ToolCallStreamParser::ToolCallStreamParser(ToolCallFormat format, std::vector<std::string> names,
                                           uint64_t seed)
    : format_(format),
      names_(std::move(names)),
      rng_(seed),
      state_(format == ToolCallFormat::kHermes ? State::kText : State::kStart) {}

std::string ToolCallStreamParser::NewId() {
  static constexpr char kAlnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlnum[rng_() % (sizeof(kAlnum) - 1)];
  return id;
}

ToolCallStreamDelta ToolCallStreamParser::Feed(std::string_view text) {
  ToolCallStreamDelta out;
  buf_.append(text.data(), text.size());
  Step(out, /*final=*/false);
  return out;
}

ToolCallStreamDelta ToolCallStreamParser::Finish() {
  ToolCallStreamDelta out;
  Step(out, /*final=*/true);
  return out;
}

void ToolCallStreamParser::Step(ToolCallStreamDelta& out, bool final) {
  for (;;) {
    bool progress = false;
    switch (state_) {
      case State::kText:
        progress = StepText(out, final);
        break;
      case State::kStart:
        progress = StepStart(out, final);
        break;
      case State::kOpen:
        progress = StepOpen(out, final);
        break;
      case State::kArgsKey:
        progress = StepArgsKey(out, final);
        break;
      case State::kArgs:
        progress = StepArgs(out);
        break;
      case State::kCallTail:
        progress = StepCallTail(final);
        break;
      case State::kNext:
        progress = StepNext(out, final);
        break;
      case State::kContent:
        out.content += raw_;
        out.content += buf_;
        raw_.clear();
        buf_.clear();
        break;
    }
    if (!progress) return;
  }
}

bool ToolCallStreamParser::StepText(ToolCallStreamDelta& out, bool final) {
  if (drop_ws_) {
    buf_.erase(0, WsPrefix(buf_));
    if (buf_.empty()) return false;
    drop_ws_ = false;
    // A close tag right after a call's object ends that call block.
    if (buf_.starts_with(kCloseTag)) {
      buf_.erase(0, kCloseTag.size());
      drop_ws_ = true;
      return true;
    }
    if (kCloseTag.starts_with(buf_)) {  // may still become the close tag
      if (final) buf_.clear();          // the call was cut short inside it
      drop_ws_ = true;
      return false;
    }
  }
  const size_t pos = buf_.find(kOpenTag);
  if (pos != std::string::npos) {
    const std::string_view pre = std::string_view(buf_).substr(0, pos);
    const size_t ws = WsSuffixStart(pre);
    if (ws > 0) {
      out.content += held_ws_;
      out.content += pre.substr(0, ws);
      held_ws_.clear();
    }
    raw_ = held_ws_;
    raw_.append(pre.substr(ws));
    raw_.append(kOpenTag);
    held_ws_.clear();
    buf_.erase(0, pos + kOpenTag.size());
    state_ = State::kOpen;
    return true;
  }
  const size_t keep = final ? 0 : PartialTagSuffix(buf_, kOpenTag);
  const std::string_view avail = std::string_view(buf_).substr(0, buf_.size() - keep);
  const size_t ws = WsSuffixStart(avail);
  if (ws > 0) {
    out.content += held_ws_;
    out.content += avail.substr(0, ws);
    held_ws_.clear();
  }
  held_ws_.append(avail.substr(ws));
  buf_.erase(0, avail.size());
  if (final) {
    out.content += held_ws_;
    held_ws_.clear();
  }
  return false;
}

bool ToolCallStreamParser::StepStart(ToolCallStreamDelta& out, bool final) {
  Cursor c{buf_};
  c.Ws();
  bool more = false;
  if (c.Peek() == '<') {
    const Match m = c.Lit(kPythonTag);
    if (m == Match::kMore) more = true;
    if (m == Match::kOk) c.Ws();
  }
  if (!more && c.Peek() == '[' && !in_list_) {
    in_list_ = true;
    c.i++;
    c.Ws();
  }
  if (!more && c.Peek() == '{') {
    raw_ = buf_.substr(0, c.i);
    buf_.erase(0, c.i);
    state_ = State::kOpen;
    return true;
  }
  if (!final && (more || c.i == buf_.size())) {
    in_list_ = false;  // decided again once more text is here
    return false;
  }
  in_list_ = false;
  state_ = State::kContent;
  return true;
}

bool ToolCallStreamParser::StepOpen(ToolCallStreamDelta& out, bool final) {
  OpenMatch m = MatchCallOpen(buf_, names_);
  if (m.match == Match::kMore && final) m.match = Match::kFail;
  if (m.match == Match::kMore) return false;
  if (m.match == Match::kFail) {
    if (format_ == ToolCallFormat::kHermes) {
      out.content += raw_;  // the tag was text; what follows it is scanned again
      raw_.clear();
      state_ = State::kText;
    } else {
      state_ = State::kContent;  // raw_ and buf_ go out as content
    }
    return true;
  }
  raw_.clear();
  buf_.erase(0, m.consumed);
  out.tool_calls.push_back({num_calls_, NewId(), std::move(m.name), ""});
  ++num_calls_;
  state_ = State::kArgsKey;
  return true;
}

bool ToolCallStreamParser::StepArgsKey(ToolCallStreamDelta& out, bool final) {
  size_t consumed = 0;
  Match m = MatchArgsKey(buf_, &consumed);
  if (m == Match::kMore && final) m = Match::kFail;
  if (m == Match::kMore) return false;
  depth_ = 1;  // inside the call object
  in_string_ = escaped_ = false;
  if (m == Match::kOk && buf_[consumed] == '{') {
    buf_.erase(0, consumed);
    depth_ = 0;
    state_ = State::kArgs;
    return true;
  }
  EmitArgs(out, "{}");  // no arguments object: the tail scan skips whatever stands there
  state_ = State::kCallTail;
  return true;
}

void ToolCallStreamParser::EmitArgs(ToolCallStreamDelta& out, std::string_view fragment) {
  const int index = num_calls_ - 1;
  if (out.tool_calls.empty() || out.tool_calls.back().index != index) {
    out.tool_calls.push_back({index, "", "", ""});
  }
  out.tool_calls.back().arguments.append(fragment.data(), fragment.size());
}

bool ToolCallStreamParser::ScanJson(char ch) {
  if (in_string_) {
    if (escaped_) {
      escaped_ = false;
    } else if (ch == '\\') {
      escaped_ = true;
    } else if (ch == '"') {
      in_string_ = false;
    }
  } else if (ch == '"') {
    in_string_ = true;
  } else if (ch == '{' || ch == '[') {
    ++depth_;
  } else if (ch == '}' || ch == ']') {
    return --depth_ == 0;
  }
  return false;
}

bool ToolCallStreamParser::StepArgs(ToolCallStreamDelta& out) {
  std::string fragment;
  size_t i = 0;
  bool done = false;
  for (; i < buf_.size() && !done; ++i) {
    const char ch = buf_[i];
    if (!in_string_ && IsWs(ch)) continue;  // compact arguments: spaces outside strings go
    fragment += ch;
    done = ScanJson(ch);
  }
  buf_.erase(0, i);
  if (!fragment.empty()) EmitArgs(out, fragment);
  if (!done) return false;
  depth_ = 1;  // back inside the call object
  state_ = State::kCallTail;
  return true;
}

bool ToolCallStreamParser::StepCallTail(bool final) {
  size_t i = 0;
  bool done = false;
  for (; i < buf_.size() && !done; ++i) done = ScanJson(buf_[i]);
  buf_.erase(0, i);
  if (!done) {
    if (final) buf_.clear();
    return false;
  }
  if (format_ == ToolCallFormat::kHermes) {
    drop_ws_ = true;  // then the close tag, and the spaces after it
    state_ = State::kText;
  } else {
    state_ = State::kNext;
  }
  return true;
}

bool ToolCallStreamParser::StepNext(ToolCallStreamDelta& out, bool final) {
  Cursor c{buf_};
  c.Ws();
  if (c.Peek() == ';' || c.Peek() == ',') {
    c.i++;
    c.Ws();
  }
  if (c.Peek() == '{') {
    raw_ += buf_.substr(0, c.i);
    buf_.erase(0, c.i);
    state_ = State::kOpen;
    return true;
  }
  if (c.Peek() == ']' && in_list_) {
    in_list_ = false;
    c.i++;
    buf_.erase(0, c.i);  // the list's end: what follows is content
    raw_.clear();
    state_ = State::kContent;
    return true;
  }
  if (c.i == buf_.size()) {  // only spaces and separators so far
    if (final) buf_.clear();
    return false;
  }
  raw_.clear();
  state_ = State::kContent;  // other text after the calls: content
  return true;
}

ParsedToolCalls ParseToolCalls(ToolCallFormat format, std::string_view text,
                               const std::vector<std::string>& names, uint64_t seed) {
  ToolCallStreamParser parser(format, names, seed);
  ParsedToolCalls out;
  for (const ToolCallStreamDelta& d : {parser.Feed(text), parser.Finish()}) {
    out.content += d.content;
    for (const ToolCallDelta& t : d.tool_calls) {
      if (size_t(t.index) >= out.calls.size()) out.calls.resize(t.index + 1);
      ToolCall& call = out.calls[t.index];
      if (!t.id.empty()) call.id = t.id;
      if (!t.name.empty()) call.name = t.name;
      call.arguments += t.arguments;
    }
  }
  if (!out.calls.empty() && WsPrefix(out.content) == out.content.size()) out.content.clear();
  return out;
}

std::string ToolCallGrammarJson(ToolCallFormat format, const std::vector<ToolSpec>& tools,
                                bool parallel) {
  nlohmann::ordered_json j;
  j["format"] = ToolCallFormatName(format);
  j["tools"] = nlohmann::ordered_json::array();
  for (const ToolSpec& t : tools) {
    nlohmann::ordered_json tool;
    tool["name"] = t.name;
    tool["parameters"] = t.parameters.empty()
                             ? nlohmann::ordered_json::object()
                             : nlohmann::ordered_json::parse(t.parameters, nullptr, false);
    if (tool["parameters"].is_discarded()) tool["parameters"] = nlohmann::ordered_json::object();
    j["tools"].push_back(std::move(tool));
  }
  j["parallel"] = parallel;
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

absl::StatusOr<grammar::ConstraintSpec> ToolCallConstraint(ToolCallFormat format,
                                                           const std::vector<ToolSpec>& tools,
                                                           const ToolChoice& choice,
                                                           bool parallel) {
  grammar::ConstraintSpec spec;
  switch (choice.mode) {
    case ToolChoice::Mode::kNone:
      return spec;
    case ToolChoice::Mode::kAuto:
      if (tools.empty() || format != ToolCallFormat::kHermes) return spec;
      spec.kind = grammar::ConstraintSpec::Kind::kToolCalls;
      spec.text = ToolCallGrammarJson(format, tools, parallel);
      spec.triggers = {std::string(kOpenTag)};
      spec.trigger_in_grammar = true;
      return spec;
    case ToolChoice::Mode::kRequired:
      if (tools.empty()) {
        return absl::InvalidArgumentError("tool_choice \"required\" needs tools");
      }
      spec.kind = grammar::ConstraintSpec::Kind::kToolCalls;
      spec.text = ToolCallGrammarJson(format, tools, parallel);
      return spec;
    case ToolChoice::Mode::kNamed:
      for (const ToolSpec& t : tools) {
        if (t.name != choice.name) continue;
        spec.kind = grammar::ConstraintSpec::Kind::kToolCalls;
        spec.text = ToolCallGrammarJson(format, {t}, /*parallel=*/false);
        return spec;
      }
      return absl::InvalidArgumentError(absl::StrCat("tool_choice names the function `",
                                                     choice.name, "`, which is not in tools"));
  }
  return spec;
}

}  // namespace heavykv
