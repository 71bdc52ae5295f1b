// The structured-output fields of OpenAI-style bodies (server/http/openai_constraint.h): every
// peer's spelling maps to one ConstraintSpec; malformed ones and two at once are 400s naming
// the field; the sampling fields heavykv does not serve yet are refused by name.
#include "server/http/openai_constraint.h"

#include <gtest/gtest.h>

#include "server/http/http_status.h"
#include "server/http/openai_json.h"

namespace heavykv::server {
namespace {

using nlohmann::json;
using Kind = grammar::ConstraintSpec::Kind;

const OpenAiServed kServed{"tiny", 512};

absl::StatusOr<OpenAiRequest> Chat(const std::string& body) {
  return ParseGenerationBody(ApiKind::kChat, body, kServed);
}
std::string Param(const absl::Status& s) {
  return json::parse(ErrorBody(s))["error"]["param"].get<std::string>();
}
const char kMessages[] = R"("messages": [{"role": "user", "content": "hi"}])";

TEST(OpenAiConstraintTest, EveryPeersSpellingMapsToOneSpec) {
  struct Case {
    std::string fields;
    Kind kind;
    std::string text;
    std::string param;
  };
  const std::string schema = R"({"type":"object","properties":{"a":{"type":"integer"}}})";
  const std::vector<Case> cases = {
      {R"("response_format": {"type": "text"})", Kind::kNone, "", ""},
      {R"("response_format": {"type": "json_object"})", Kind::kJsonObject, "", "response_format"},
      {R"("response_format": {"type": "json_object", "schema": )" + schema + "}",
       Kind::kJsonSchema, schema, "response_format"},
      {R"("response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": )" +
           schema + "}}",
       Kind::kJsonSchema, schema, "response_format"},
      {R"("response_format": {"type": "json_schema", "json_schema": {"name": "x"}})",
       Kind::kJsonSchema, "{}", "response_format"},
      {R"("json_schema": )" + schema, Kind::kJsonSchema, schema, "json_schema"},
      {R"("guided_json": )" + json(schema).dump(), Kind::kJsonSchema, schema, "guided_json"},
      {R"("grammar": "root ::= \"a\"")", Kind::kGbnf, "root ::= \"a\"", "grammar"},
      {R"("guided_regex": "[0-9]+")", Kind::kRegex, "[0-9]+", "guided_regex"},
      {R"("structured_outputs": {"regex": "[0-9]+"})", Kind::kRegex, "[0-9]+",
       "structured_outputs.regex"},
      {R"("structured_outputs": {"json": )" + schema + "}", Kind::kJsonSchema, schema,
       "structured_outputs.json"},
      {R"("structured_outputs": {"grammar": "root ::= \"b\""})", Kind::kGbnf, "root ::= \"b\"",
       "structured_outputs.grammar"},
      {R"("structured_outputs": {"json_object": true})", Kind::kJsonObject, "",
       "structured_outputs.json_object"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<OpenAiRequest> q = Chat(absl::StrCat("{", kMessages, ", ", c.fields, "}"));
    ASSERT_TRUE(q.ok()) << c.fields << ": " << q.status();
    EXPECT_EQ(q->generation.constraint.kind, c.kind) << c.fields;
    EXPECT_EQ(q->generation.constraint.text, c.text) << c.fields;
    EXPECT_EQ(q->constraint_param, c.param) << c.fields;
  }
  absl::StatusOr<OpenAiRequest> q = Chat(absl::StrCat(
      "{", kMessages, R"(, "guided_choice": ["yes", "no"], "guided_decoding_backend": "xgrammar"})"));
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->generation.constraint.kind, Kind::kChoice);
  EXPECT_EQ(q->generation.constraint.choices, (std::vector<std::string>{"yes", "no"}));
  q = Chat(absl::StrCat("{", kMessages, R"(, "response_format": {"type": "json_schema",
      "json_schema": {"name": "x", "strict": true, "schema": {"type": "object"}}}})"));
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_TRUE(q->generation.constraint.strict);
  // Completions take the same fields.
  q = ParseGenerationBody(ApiKind::kCompletion,
                          R"({"prompt": "x", "response_format": {"type": "json_object"}})", kServed);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->generation.constraint.kind, Kind::kJsonObject);
}

TEST(OpenAiConstraintTest, MalformedFieldsAndTwoConstraintsAreRefusedByName) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"("response_format": "json")", "response_format"},
      {R"("response_format": {"type": "yaml"})", "response_format.type"},
      {R"("response_format": {"type": "json_schema"})", "response_format.json_schema"},
      {R"("response_format": {"type": "json_schema", "json_schema": {"schema": 3}})",
       "response_format.json_schema.schema"},
      {R"("response_format": {"type": "json_schema", "json_schema": {"strict": "yes"}})",
       "response_format.json_schema.strict"},
      {R"("guided_json": "{not json")", "guided_json"},
      {R"("guided_choice": [])", "guided_choice"},
      {R"("guided_choice": ["a", 1])", "guided_choice"},
      {R"("grammar": "")", "grammar"},
      {R"("structured_outputs": {"regex": "a", "choice": ["b"]})", "structured_outputs"},
      {R"("structured_outputs": {"structural_tag": "{}"})", "structured_outputs.structural_tag"},
      {R"("structured_outputs": {"yaml": "a"})", "structured_outputs.yaml"},
      {R"("json_schema": {}, "grammar": "root ::= \"a\"")", "grammar"},
      {R"("response_format": {"type": "json_object"}, "guided_regex": "a")", "guided_regex"},
      {R"("guided_whitespace_pattern": " ")", "guided_whitespace_pattern"},
      {R"("logit_bias": [1])", "logit_bias"},
      {R"("typical_p": 0.9)", "typical_p"},
      {R"("mirostat": 2)", "mirostat"},
  };
  for (const auto& [fields, param] : cases) {
    absl::StatusOr<OpenAiRequest> q = Chat(absl::StrCat("{", kMessages, ", ", fields, "}"));
    ASSERT_FALSE(q.ok()) << fields;
    EXPECT_TRUE(absl::IsInvalidArgument(q.status())) << fields;
    EXPECT_EQ(Param(q.status()), param) << fields << ": " << q.status();
  }
  // Neutral values of the refused sampling fields are fine.
  absl::StatusOr<OpenAiRequest> q = Chat(absl::StrCat(
      "{", kMessages, R"(, "logit_bias": {}, "typical_p": 1, "mirostat": 0})"));
  EXPECT_TRUE(q.ok()) << q.status();
}

}  // namespace
}  // namespace heavykv::server
