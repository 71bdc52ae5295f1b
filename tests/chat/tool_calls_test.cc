// engine/chat/tool_calls.h: each format parsed whole and streamed (split at every byte boundary
// and byte by byte, the same content and calls), names outside the request's tools left as
// content, the id shape, the format detection from the real templates, and the constraint of
// each tool_choice.
#include "engine/chat/tool_calls.h"

#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace heavykv {
namespace {

using ::heavykv::testing::SourcePath;

const std::vector<std::string> kNames = {"get_weather", "get_time"};

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Streams `pieces` and gathers the deltas; checks the delta shape on the way: a call's first
// delta has its id and name, later ones neither, indices in order.
ParsedToolCalls Stream(ToolCallFormat format, const std::vector<std::string>& pieces) {
  ToolCallStreamParser parser(format, kNames, /*seed=*/7);
  ParsedToolCalls out;
  auto gather = [&](const ToolCallStreamDelta& d) {
    out.content += d.content;
    for (const ToolCallDelta& t : d.tool_calls) {
      if (size_t(t.index) == out.calls.size()) {
        EXPECT_FALSE(t.id.empty());
        EXPECT_FALSE(t.name.empty());
        out.calls.push_back({t.id, t.name, ""});
      } else {
        EXPECT_EQ(size_t(t.index), out.calls.size() - 1) << "deltas of an earlier call";
        EXPECT_TRUE(t.id.empty());
        EXPECT_TRUE(t.name.empty());
      }
      out.calls[t.index].arguments += t.arguments;
    }
  };
  for (const std::string& p : pieces) gather(parser.Feed(p));
  gather(parser.Finish());
  if (!out.calls.empty() && out.content.find_first_not_of(" \n\t\r") == std::string::npos) {
    out.content.clear();
  }
  return out;
}

void ExpectSame(const ParsedToolCalls& a, const ParsedToolCalls& b, const std::string& where) {
  EXPECT_EQ(a.content, b.content) << where;
  ASSERT_EQ(a.calls.size(), b.calls.size()) << where;
  for (size_t i = 0; i < a.calls.size(); ++i) {
    EXPECT_EQ(a.calls[i].id, b.calls[i].id) << where;
    EXPECT_EQ(a.calls[i].name, b.calls[i].name) << where;
    EXPECT_EQ(a.calls[i].arguments, b.calls[i].arguments) << where;
  }
}

// Whole, split in two at every byte, and byte by byte: all the same.
ParsedToolCalls ParseEveryWay(ToolCallFormat format, const std::string& text) {
  const ParsedToolCalls whole = ParseToolCalls(format, text, kNames, 7);
  ExpectSame(Stream(format, {text}), whole, "one piece: " + text);
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    ExpectSame(Stream(format, {text.substr(0, cut), text.substr(cut)}), whole,
               "cut at " + std::to_string(cut) + ": " + text);
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  ExpectSame(Stream(format, bytes), whole, "byte by byte: " + text);
  return whole;
}

TEST(ToolCallsTest, HermesCalls) {
  const ParsedToolCalls p = ParseEveryWay(
      ToolCallFormat::kHermes,
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": "
      "[1, 2], \"note\": \"a } \\\" {\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", "
      "\"arguments\": {}}\n</tool_call>");
  EXPECT_EQ(p.content, "");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, R"({"city":"Paris","days":[1,2],"note":"a } \" {"})");
  EXPECT_EQ(p.calls[1].name, "get_time");
  EXPECT_EQ(p.calls[1].arguments, "{}");
  EXPECT_NE(p.calls[0].id, p.calls[1].id);
  for (const ToolCall& c : p.calls) {
    ASSERT_EQ(c.id.size(), 29u);
    EXPECT_EQ(c.id.substr(0, 5), "call_");
    for (char ch : c.id.substr(5)) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(ch)));
  }
}

TEST(ToolCallsTest, HermesContentAroundCalls) {
  const ParsedToolCalls p = ParseEveryWay(
      ToolCallFormat::kHermes,
      "Let me check.\n\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}"
      "\n</tool_call>\nDone < 5 <tool");
  EXPECT_EQ(p.content, "Let me check.Done < 5 <tool");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments, R"({"tz":"UTC"})");
}

TEST(ToolCallsTest, HermesUnknownNamesAndBadObjectsAreContent) {
  for (const std::string text :
       {"<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>",
        "Say <tool_call> out loud", "<tool_call>\nnot json\n</tool_call>",
        "<tool_call>{\"name\": \"get_weather_x\"}</tool_call>", "plain text\n  with spaces  "}) {
    const ParsedToolCalls p = ParseEveryWay(ToolCallFormat::kHermes, text);
    EXPECT_EQ(p.content, text);
    EXPECT_TRUE(p.calls.empty()) << text;
  }
}

TEST(ToolCallsTest, HermesCutShort) {
  const ParsedToolCalls p = ParseEveryWay(
      ToolCallFormat::kHermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"ci");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments, "{\"ci");
  const ParsedToolCalls q =
      ParseEveryWay(ToolCallFormat::kHermes, "<tool_call>\n{\"name\": \"get_weather\"");
  ASSERT_EQ(q.calls.size(), 1u);
  EXPECT_EQ(q.calls[0].arguments, "{}");
}

TEST(ToolCallsTest, Llama3Calls) {
  const ParsedToolCalls a =
      ParseEveryWay(ToolCallFormat::kLlama3,
                    "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}");
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_EQ(a.calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(a.content, "");
  const ParsedToolCalls b = ParseEveryWay(
      ToolCallFormat::kLlama3,
      "<|python_tag|>{\"type\": \"function\", \"name\": \"get_time\", \"parameters\": {}}; "
      "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}");
  ASSERT_EQ(b.calls.size(), 2u);
  EXPECT_EQ(b.calls[0].name, "get_time");
  EXPECT_EQ(b.calls[1].arguments, R"({"city":"Oslo"})");
  EXPECT_EQ(b.content, "");
}

TEST(ToolCallsTest, Llama3TextIsContent) {
  for (const std::string text :
       {"The weather is fine.", "{\"name\": \"other\", \"parameters\": {}}", "  {not json",
        "{\"city\": \"Paris\"}", ""}) {
    const ParsedToolCalls p = ParseEveryWay(ToolCallFormat::kLlama3, text);
    EXPECT_EQ(p.content, text);
    EXPECT_TRUE(p.calls.empty()) << text;
  }
}

TEST(ToolCallsTest, GenericObjectAndList) {
  const ParsedToolCalls a = ParseEveryWay(
      ToolCallFormat::kGeneric, " {\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}} ");
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_EQ(a.calls[0].arguments, R"({"tz":"CET"})");
  const ParsedToolCalls b =
      ParseEveryWay(ToolCallFormat::kGeneric,
                    "[{\"name\": \"get_time\", \"arguments\": {}}, {\"name\": \"get_weather\", "
                    "\"arguments\": {\"city\": \"Rome\"}}]");
  ASSERT_EQ(b.calls.size(), 2u);
  EXPECT_EQ(b.calls[1].arguments, R"({"city":"Rome"})");
  EXPECT_EQ(b.content, "");
  const ParsedToolCalls c = ParseEveryWay(ToolCallFormat::kGeneric, "[1, 2, 3]");
  EXPECT_EQ(c.content, "[1, 2, 3]");
  EXPECT_TRUE(c.calls.empty());
}

// Texts assembled at random from pieces that start, break and finish calls, streamed in random
// pieces: always what the whole text parses to.
TEST(ToolCallsTest, RandomTextsStreamAsTheyParse) {
  const std::vector<std::string> hermes = {
      "<tool_call>", "</tool_call>", "\n", " ", "<tool", "Hello", "{", "}", "\"name\": ",
      "\"get_time\"", "\"rm\"", ", \"arguments\": ", "{\"a\": [1, \"}\"]}",
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"X\"}}\n</tool_call>"};
  const std::vector<std::string> bare = {
      "<|python_tag|>", "[", "]", ";", ",", " ", "\n", "text", "{", "}", "\"name\": ",
      "\"type\": \"function\", ", "\"get_time\"", ", \"parameters\": ", ", \"arguments\": ",
      "{\"x\": \"\\\"\"}", "{\"name\": \"get_weather\", \"parameters\": {}}"};
  std::mt19937 rng(43);
  for (const ToolCallFormat format :
       {ToolCallFormat::kHermes, ToolCallFormat::kLlama3, ToolCallFormat::kGeneric}) {
    const std::vector<std::string>& pool = format == ToolCallFormat::kHermes ? hermes : bare;
    int with_calls = 0, with_content = 0;
    for (int n = 0; n < 400; ++n) {
      std::string text;
      for (int k = rng() % 8; k >= 0; --k) text += pool[rng() % pool.size()];
      const ParsedToolCalls whole = ParseToolCalls(format, text, kNames, 7);
      with_calls += !whole.calls.empty();
      with_content += !whole.content.empty();
      for (int split = 0; split < 4; ++split) {
        std::vector<std::string> pieces;
        for (size_t at = 0; at < text.size();) {
          const size_t len = 1 + rng() % 6;
          pieces.push_back(text.substr(at, len));
          at += len;
        }
        ExpectSame(Stream(format, pieces), whole, text);
      }
    }
    EXPECT_GT(with_calls, 20) << ToolCallFormatName(format);  // the mix has both
    EXPECT_GT(with_content, 100) << ToolCallFormatName(format);
  }
}

TEST(ToolCallsTest, IdsFollowTheSeed) {
  const std::string text = "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>";
  EXPECT_EQ(ParseToolCalls(ToolCallFormat::kHermes, text, kNames, 1).calls[0].id,
            ParseToolCalls(ToolCallFormat::kHermes, text, kNames, 1).calls[0].id);
  EXPECT_NE(ParseToolCalls(ToolCallFormat::kHermes, text, kNames, 1).calls[0].id,
            ParseToolCalls(ToolCallFormat::kHermes, text, kNames, 2).calls[0].id);
}

TEST(ToolCallsTest, FormatsOfTheRealTemplates) {
  const auto format = [](const std::string& name) {
    return DetectToolCallFormat(
        ReadText(SourcePath("tests/data/chat_templates/" + name + ".jinja")));
  };
  EXPECT_EQ(format("qwen2.5"), ToolCallFormat::kHermes);
  EXPECT_EQ(format("qwen3"), ToolCallFormat::kHermes);
  EXPECT_EQ(format("llama3.1"), ToolCallFormat::kLlama3);
  EXPECT_EQ(format("llama3.2"), ToolCallFormat::kLlama3);
  EXPECT_EQ(format("mistral-v0.1"), ToolCallFormat::kGeneric);
  EXPECT_STREQ(ToolCallFormatName(ToolCallFormat::kHermes), "qwen");
}

TEST(ToolCallsTest, ConstraintOfEachToolChoice) {
  const std::vector<ToolSpec> tools = {
      {"get_weather", R"({"type": "object", "properties": {"city": {"type": "string"}}})"},
      {"get_time", ""}};
  using Kind = grammar::ConstraintSpec::Kind;
  using Mode = ToolChoice::Mode;

  auto none = ToolCallConstraint(ToolCallFormat::kHermes, tools, {Mode::kNone, ""}, true);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->kind, Kind::kNone);

  auto required = ToolCallConstraint(ToolCallFormat::kHermes, tools, {Mode::kRequired, ""}, true);
  ASSERT_TRUE(required.ok());
  EXPECT_EQ(required->kind, Kind::kToolCalls);
  EXPECT_TRUE(required->triggers.empty());
  const nlohmann::json j = nlohmann::json::parse(required->text);
  EXPECT_EQ(j["format"], "qwen");
  EXPECT_EQ(j["parallel"], true);
  ASSERT_EQ(j["tools"].size(), 2u);
  EXPECT_EQ(j["tools"][0]["name"], "get_weather");
  EXPECT_EQ(j["tools"][0]["parameters"]["properties"]["city"]["type"], "string");
  EXPECT_EQ(j["tools"][1]["parameters"], nlohmann::json::object());

  auto named = ToolCallConstraint(ToolCallFormat::kLlama3, tools, {Mode::kNamed, "get_time"}, true);
  ASSERT_TRUE(named.ok());
  const nlohmann::json n = nlohmann::json::parse(named->text);
  EXPECT_EQ(n["format"], "llama3");
  EXPECT_EQ(n["parallel"], false);
  ASSERT_EQ(n["tools"].size(), 1u);
  EXPECT_EQ(n["tools"][0]["name"], "get_time");

  auto missing = ToolCallConstraint(ToolCallFormat::kHermes, tools, {Mode::kNamed, "nope"}, true);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);

  auto auto_hermes = ToolCallConstraint(ToolCallFormat::kHermes, tools, {Mode::kAuto, ""}, false);
  ASSERT_TRUE(auto_hermes.ok());
  EXPECT_EQ(auto_hermes->kind, Kind::kToolCalls);
  EXPECT_EQ(auto_hermes->triggers, std::vector<std::string>{"<tool_call>"});
  EXPECT_TRUE(auto_hermes->trigger_in_grammar);

  auto auto_llama = ToolCallConstraint(ToolCallFormat::kLlama3, tools, {Mode::kAuto, ""}, false);
  ASSERT_TRUE(auto_llama.ok());
  EXPECT_EQ(auto_llama->kind, Kind::kNone);
}

}  // namespace
}  // namespace heavykv
