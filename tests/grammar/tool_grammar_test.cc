// engine/grammar/tool_grammar.h: the grammar of each tool-call format accepts the calls that
// engine/chat/tool_calls.h parses back (names fixed per tool, arguments by the tool's schema) and
// refuses other names, bad arguments and text outside the wrapper.
#include "engine/grammar/tool_grammar.h"

#include <string>
#include <vector>

#include "engine/chat/tool_calls.h"
#include "engine/grammar/json_schema.h"
#include "gtest/gtest.h"

namespace heavykv::grammar {
namespace {

const std::vector<ToolSpec> kTools = {
    {"get_weather",
     R"({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
         "additionalProperties": false})"},
    {"get_time", ""}};

// Until engine/grammar/json_schema.cc is on main its stand-in refuses every schema.
bool JsonSchemaCompiles() {
  GrammarBuilder b;
  return CompileJsonSchema(b, R"({"type": "string"})", {}).status().code() !=
         absl::StatusCode::kUnimplemented;
}

Grammar Compile(ToolCallFormat format, bool parallel) {
  GrammarBuilder b;
  absl::StatusOr<GrammarBuilder::Expr> e =
      CompileToolCalls(b, ToolCallGrammarJson(format, kTools, parallel), {});
  EXPECT_TRUE(e.ok()) << e.status();
  const RuleId root = b.DeclareRule("root");
  b.DefineRule(root, *e);
  absl::StatusOr<Grammar> g = std::move(b).Build(root);
  EXPECT_TRUE(g.ok()) << g.status();
  return *std::move(g);
}

TEST(ToolGrammarTest, Qwen) {
  if (!JsonSchemaCompiles()) GTEST_SKIP() << "the JSON Schema compiler is not merged yet";
  const Grammar one = Compile(ToolCallFormat::kHermes, false);
  const std::string weather =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\"}}\n</tool_call>";
  const std::string time = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
  EXPECT_TRUE(Matches(one, weather));
  EXPECT_TRUE(Matches(one, time));
  EXPECT_FALSE(Matches(one, weather + "\n" + time));
  EXPECT_FALSE(Matches(one, "<tool_call>\n{\"name\": \"rm\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(Matches(
      one,
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"town\": \"X\"}}\n</tool_call>"));
  EXPECT_FALSE(Matches(one, "Sure. " + weather));
  const Grammar many = Compile(ToolCallFormat::kHermes, true);
  EXPECT_TRUE(Matches(many, weather + "\n" + time));
  // What the grammar accepts, the parser reads back as calls.
  const ParsedToolCalls p = ParseToolCalls(ToolCallFormat::kHermes, weather + "\n" + time,
                                           {"get_weather", "get_time"}, 1);
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].arguments, R"({"city":"Paris"})");
}

TEST(ToolGrammarTest, Llama3AndGeneric) {
  if (!JsonSchemaCompiles()) GTEST_SKIP() << "the JSON Schema compiler is not merged yet";
  const Grammar llama = Compile(ToolCallFormat::kLlama3, true);
  EXPECT_TRUE(Matches(llama, "{\"name\": \"get_time\", \"parameters\": {\"tz\": \"UTC\"}}"));
  EXPECT_TRUE(Matches(llama,
                      "{\"name\": \"get_time\", \"parameters\": {}}; {\"name\": "
                      "\"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}"));
  EXPECT_FALSE(Matches(llama, "{\"name\": \"get_time\", \"arguments\": {}}"));
  const Grammar generic = Compile(ToolCallFormat::kGeneric, true);
  EXPECT_TRUE(Matches(generic, "[{\"name\": \"get_time\", \"arguments\": {}}]"));
  EXPECT_FALSE(Matches(generic, "{\"name\": \"get_time\", \"arguments\": {}}"));
  const Grammar single = Compile(ToolCallFormat::kGeneric, false);
  EXPECT_TRUE(Matches(single, "{\"name\": \"get_time\", \"arguments\": {}}"));
}

// Every format's grammar and its parser agree: what the grammar accepts parses back into the
// calls it spells, arguments compacted.
TEST(ToolGrammarTest, WhatTheGrammarAcceptsParsesBack) {
  if (!JsonSchemaCompiles()) GTEST_SKIP() << "the JSON Schema compiler is not merged yet";
  const std::vector<std::string> names = {"get_weather", "get_time"};
  const std::pair<ToolCallFormat, std::string> cases[] = {
      {ToolCallFormat::kHermes,
       "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n"
       "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"},
      {ToolCallFormat::kLlama3,
       "{\"name\": \"get_time\", \"parameters\": {}}; {\"name\": \"get_weather\", "
       "\"parameters\": {\"city\": \"Oslo\"}}"},
      {ToolCallFormat::kGeneric,
       "[{\"name\": \"get_time\", \"arguments\": {}}, {\"name\": \"get_weather\", "
       "\"arguments\": {\"city\": \"Oslo\"}}]"}};
  for (const auto& [format, text] : cases) {
    EXPECT_TRUE(Matches(Compile(format, true), text)) << text;
    const ParsedToolCalls p = ParseToolCalls(format, text, names, 1);
    EXPECT_EQ(p.content, "") << text;
    ASSERT_EQ(p.calls.size(), 2u) << text;
    EXPECT_EQ(p.calls[0].name, "get_time");
    EXPECT_EQ(p.calls[0].arguments, "{}");
    EXPECT_EQ(p.calls[1].name, "get_weather");
    EXPECT_EQ(p.calls[1].arguments, R"({"city":"Oslo"})");
  }
}

TEST(ToolGrammarTest, BadSpecsNameTheField) {
  for (const auto& [spec, param] : std::vector<std::pair<std::string, std::string>>{
           {"[]", ""},
           {R"({"format": "xml", "tools": [{"name": "a"}]})", "/format"},
           {R"({"format": "qwen", "tools": []})", "/tools"},
           {R"({"format": "qwen", "tools": [{"name": ""}]})", "/tools/0/name"}}) {
    GrammarBuilder b;
    absl::StatusOr<GrammarBuilder::Expr> e = CompileToolCalls(b, spec, {});
    ASSERT_FALSE(e.ok()) << spec;
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(std::string(e.status().GetPayload("param").value_or(absl::Cord())), param) << spec;
  }
}

}  // namespace
}  // namespace heavykv::grammar
