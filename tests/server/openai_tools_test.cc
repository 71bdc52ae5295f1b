// Tool calling and reasoning on the OpenAI chat API (server/http/openai_tools.h): the request
// fields into GenerationRequest (the template's tools and kwargs, the messages' tool fields, the
// constraint of tool_choice), bad ones refused naming the field, and the output parsed into the
// response's message and the stream's deltas.
#include "server/http/openai_tools.h"

#include <gtest/gtest.h>

#include <string>

#include "server/http/http_status.h"
#include "server/http/openai_json.h"

namespace heavykv::server {
namespace {

using nlohmann::json;

const OpenAiServed kQwen{"tiny", 512, ToolCallFormat::kHermes};

absl::StatusOr<OpenAiRequest> Chat(const std::string& body) {
  return ParseGenerationBody(ApiKind::kChat, body, kQwen);
}

constexpr char kTools[] = R"("tools":[{"type":"function","function":{"name":"get_weather",
    "description":"Weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},
    "required":["city"]}}},{"type":"function","function":{"name":"get_time"}}])";

TEST(OpenAiToolsTest, ToolsReachTheTemplateAsSent) {
  auto q = Chat(std::string(R"({"messages":[{"role":"user","content":"Hi"}],)") + kTools +
                R"(,"chat_template_kwargs":{"enable_thinking":false,"x":[1,{"b":1,"a":2}]}})");
  ASSERT_TRUE(q.ok()) << q.status();
  const GenerationRequest& r = q->generation;
  // The client's key order (type before function, description before parameters) is kept.
  EXPECT_EQ(r.chat_tools,
            R"([{"type":"function","function":{"name":"get_weather","description":"Weather",)"
            R"("parameters":{"type":"object","properties":{"city":{"type":"string"}},)"
            R"("required":["city"]}}},{"type":"function","function":{"name":"get_time"}}])");
  EXPECT_EQ(r.chat_template_kwargs, R"({"enable_thinking":false,"x":[1,{"b":1,"a":2}]})");
  ASSERT_EQ(q->tools.tools.size(), 2u);
  EXPECT_EQ(q->tools.tools[1].name, "get_time");
  EXPECT_EQ(q->tools.tools[1].parameters, "");
  // tool_choice defaults to auto with tools: for Qwen a lazy constraint from <tool_call>.
  EXPECT_EQ(q->tools.choice.mode, ToolChoice::Mode::kAuto);
  EXPECT_TRUE(q->tools.parallel);
  EXPECT_EQ(r.constraint.kind, grammar::ConstraintSpec::Kind::kToolCalls);
  EXPECT_EQ(r.constraint.triggers, std::vector<std::string>{"<tool_call>"});
}

TEST(OpenAiToolsTest, ToolChoices) {
  const std::string head = std::string(R"({"messages":[{"role":"user","content":"Hi"}],)") + kTools;
  auto none = Chat(head + R"(,"tool_choice":"none"})");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->tools.choice.mode, ToolChoice::Mode::kNone);
  EXPECT_FALSE(none->generation.constraint.active());
  EXPECT_FALSE(none->generation.chat_tools.empty());  // still rendered (vLLM's default)

  auto required = Chat(head + R"(,"tool_choice":"required","parallel_tool_calls":false})");
  ASSERT_TRUE(required.ok());
  EXPECT_FALSE(required->tools.parallel);
  EXPECT_TRUE(required->generation.constraint.triggers.empty());
  EXPECT_EQ(json::parse(required->generation.constraint.text)["parallel"], false);

  auto named = Chat(head + R"(,"tool_choice":{"type":"function","function":{"name":"get_time"}}})");
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->tools.choice.name, "get_time");
  EXPECT_EQ(json::parse(named->generation.constraint.text)["tools"].size(), 1u);

  auto plain = Chat(R"({"messages":[{"role":"user","content":"Hi"}]})");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->tools.choice.mode, ToolChoice::Mode::kNone);
  EXPECT_EQ(plain->generation.chat_tools, "");
  EXPECT_FALSE(plain->generation.constraint.active());
}

// tool_choice and the constraint fields: required / named cannot share the output with another
// constraint; under auto the other one governs it.
TEST(OpenAiToolsTest, ToolChoiceWithResponseFormat) {
  const std::string head = std::string(R"({"messages":[{"role":"user","content":"Hi"}],)") + kTools;
  auto required =
      Chat(head + R"(,"tool_choice":"required","response_format":{"type":"json_object"}})");
  ASSERT_FALSE(required.ok());
  EXPECT_EQ(json::parse(ErrorBody(required.status()))["error"]["param"], "response_format");
  auto json_auto = Chat(head + R"(,"response_format":{"type":"json_object"}})");
  ASSERT_TRUE(json_auto.ok()) << json_auto.status();
  EXPECT_EQ(json_auto->generation.constraint.kind, grammar::ConstraintSpec::Kind::kJsonObject);
  EXPECT_EQ(json_auto->tools.choice.mode, ToolChoice::Mode::kAuto);
  auto text = Chat(head + R"(,"response_format":{"type":"text"}})");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->generation.constraint.kind, grammar::ConstraintSpec::Kind::kToolCalls);
  EXPECT_EQ(text->constraint_param, "tools");
}

TEST(OpenAiToolsTest, HistoryWithToolCalls) {
  auto q = Chat(R"({"messages":[{"role":"user","content":"Weather?"},
      {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",
       "function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}},
       {"id":"c2","type":"function","function":{"name":"get_time","arguments":{"tz":"UTC"}}}]},
      {"role":"tool","tool_call_id":"c1","name":"get_weather","content":"21 C"},
      {"role":"assistant","content":null,"reasoning_content":"Done."}]})");
  ASSERT_TRUE(q.ok()) << q.status();
  const std::vector<ChatMessage>& m = *q->generation.messages;
  ASSERT_EQ(m.size(), 4u);
  EXPECT_FALSE(m[1].content_null);  // "", as vLLM renders it (Qwen3's template fails on None)
  EXPECT_EQ(m[1].content, "");
  ASSERT_EQ(m[1].tool_calls.size(), 2u);
  EXPECT_EQ(m[1].tool_calls[0].id, "c1");
  EXPECT_EQ(m[1].tool_calls[0].name, "get_weather");
  EXPECT_EQ(m[1].tool_calls[0].arguments, "{\"city\": \"Paris\"}");
  EXPECT_EQ(m[1].tool_calls[1].arguments, R"({"tz":"UTC"})");
  EXPECT_EQ(m[2].tool_call_id, "c1");
  EXPECT_EQ(m[2].name, "get_weather");
  EXPECT_EQ(m[2].content, "21 C");
  EXPECT_FALSE(m[3].content_null);  // no calls: the empty text, as before
  EXPECT_EQ(m[3].reasoning_content, "Done.");
}

TEST(OpenAiToolsTest, BadToolFieldsNameTheField) {
  const std::string user = R"({"messages":[{"role":"user","content":"Hi"}])";
  const std::pair<std::string, std::string> cases[] = {
      {user + R"(,"tools":{}})", "tools"},
      {user + R"(,"tools":[{"type":"retrieval"}]})", "tools[0].type"},
      {user + R"(,"tools":[{"type":"function"}]})", "tools[0].function"},
      {user + R"(,"tools":[{"type":"function","function":{"name":"a b"}}]})",
       "tools[0].function.name"},
      {user + R"(,"tools":[{"type":"function","function":{"name":"a"}},)"
              R"({"type":"function","function":{"name":"a"}}]})",
       "tools[1].function.name"},
      {user + R"(,"tools":[{"type":"function","function":{"name":"a","parameters":[]}}]})",
       "tools[0].function.parameters"},
      {user + R"(,"tools":[{"type":"function","function":{"name":"a","description":1}}]})",
       "tools[0].function.description"},
      {user + R"(,"tool_choice":"required"})", "tool_choice"},
      {user + "," + kTools + R"(,"tool_choice":"sometimes"})", "tool_choice"},
      {user + "," + kTools + R"(,"tool_choice":{"type":"function","function":{"name":"nope"}}})",
       "tool_choice"},
      {user + "," + kTools + R"(,"parallel_tool_calls":"yes"})", "parallel_tool_calls"},
      {user + R"(,"chat_template_kwargs":[1]})", "chat_template_kwargs"},
      {R"({"messages":[{"role":"assistant","tool_calls":{}}]})", "messages[0].tool_calls"},
      {R"({"messages":[{"role":"assistant","tool_calls":[{"function":{}}]}]})",
       "messages[0].tool_calls[0].function.name"},
      {R"({"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f",)"
       R"("arguments":"{bad"}}]}]})",
       "messages[0].tool_calls[0].function.arguments"},
      {R"({"messages":[{"role":"tool","tool_call_id":7,"content":"x"}]})",
       "messages[0].tool_call_id"},
  };
  for (const auto& [body, param] : cases) {
    absl::StatusOr<OpenAiRequest> q = Chat(body);
    ASSERT_FALSE(q.ok()) << body;
    EXPECT_EQ(q.status().code(), absl::StatusCode::kInvalidArgument) << body;
    EXPECT_EQ(json::parse(ErrorBody(q.status()))["error"]["param"], param) << body;
  }
  // A body nested past 256 levels is refused before any of it is written out again.
  const std::string deep = std::string(R"({"messages":[],"tools":[{"type":"function","function":)"
                                       R"({"name":"f","parameters":{"a":)") +
                           std::string(100000, '[') + std::string(100000, ']') + "}}}]}";
  EXPECT_EQ(Chat(deep).status().code(), absl::StatusCode::kInvalidArgument);
  // Completions take no tools.
  auto c = ParseGenerationBody(ApiKind::kCompletion,
                               std::string(R"({"prompt":"x",)") + kTools + "}", kQwen);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(json::parse(ErrorBody(c.status()))["error"]["param"], "tools");
}

TEST(OpenAiToolsTest, ConstraintsStartAfterAnOpenReasoningBlock) {
  grammar::ConstraintSpec spec;
  spec.kind = grammar::ConstraintSpec::Kind::kToolCalls;
  ChatOutputOptions o;
  o.reasoning = true;
  ConstrainAfterReasoning(o, spec);  // the model may or may not think: from the first byte
  EXPECT_TRUE(spec.triggers.empty());
  o.starts_in_reasoning = true;
  ConstrainAfterReasoning(o, spec);
  EXPECT_EQ(spec.triggers, std::vector<std::string>{"</think>"});
  EXPECT_FALSE(spec.trigger_in_grammar);
  grammar::ConstraintSpec lazy;
  lazy.kind = grammar::ConstraintSpec::Kind::kToolCalls;
  lazy.triggers = {"<tool_call>"};
  lazy.trigger_in_grammar = true;
  ConstrainAfterReasoning(o, lazy);
  EXPECT_EQ(lazy.triggers, std::vector<std::string>{"<tool_call>"});
  grammar::ConstraintSpec none;
  ConstrainAfterReasoning(o, none);
  EXPECT_FALSE(none.active());

  // The Qwen3 template's generation prompt opens no block; DeepSeek-R1's style does.
  auto qwen3 = ChatTemplate::Parse(
      "{{ '<|im_start|>assistant\n' }}{% if enable_thinking is false %}"
      "{{ '<think>\n\n</think>\n\n' }}{% endif %}");
  ASSERT_TRUE(qwen3.ok());
  GenerationRequest r;
  r.messages.emplace();
  EXPECT_TRUE(ChatOutputOptionsFor(&*qwen3, r, {}, 1).reasoning);
  EXPECT_FALSE(ChatOutputOptionsFor(&*qwen3, r, {}, 1).starts_in_reasoning);
  auto r1 = ChatTemplate::Parse("{{ '<｜Assistant｜><think>\n' }}{# </think> #}");
  ASSERT_TRUE(r1.ok());
  EXPECT_TRUE(ChatOutputOptionsFor(&*r1, r, {}, 1).starts_in_reasoning);
}

ChatOutput QwenOutput(bool reasoning) {
  ChatOutputOptions o;
  o.reasoning = reasoning;
  o.tools = true;
  o.format = ToolCallFormat::kHermes;
  o.names = {"get_weather"};
  o.seed = 3;
  return ChatOutput(o);
}

constexpr char kQwenCall[] =
    "<think>\nNeed weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", "
    "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

TEST(OpenAiToolsTest, WholeMessageWithReasoningAndCalls) {
  ChatOutput out = QwenOutput(true);
  ChatOutputDelta whole = out.Feed(kQwenCall);
  whole.Append(out.Finish());
  const json m = ChatMessageJson(out, whole);
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_TRUE(m["content"].is_null());
  EXPECT_EQ(m["reasoning_content"], "\nNeed weather.\n");
  ASSERT_EQ(m["tool_calls"].size(), 1u);
  EXPECT_EQ(m["tool_calls"][0]["type"], "function");
  EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], R"({"city":"Paris"})");
  EXPECT_EQ(m["tool_calls"][0]["id"].get<std::string>().substr(0, 5), "call_");
  EXPECT_EQ(ChatFinishReason("eos", out), "tool_calls");
  EXPECT_EQ(ChatFinishReason("length", out), "length");

  ChatOutput plain = QwenOutput(false);
  ChatOutputDelta text = plain.Feed("Just text.");
  text.Append(plain.Finish());
  const json p = ChatMessageJson(plain, text);
  EXPECT_EQ(p, json::parse(R"({"role":"assistant","content":"Just text."})"));
  EXPECT_EQ(ChatFinishReason("eos", plain), "stop");
}

TEST(OpenAiToolsTest, StreamDeltasSpellTheWholeMessage) {
  ChatOutput out = QwenOutput(true);
  std::string reasoning, arguments, id, name;
  int first_deltas = 0;
  const std::string text = kQwenCall;
  for (size_t i = 0; i <= text.size(); ++i) {
    const json d = ChatDeltaJson(i < text.size() ? out.Feed(text.substr(i, 1)) : out.Finish());
    EXPECT_FALSE(d.contains("content")) << d;
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (!d.contains("tool_calls")) continue;
    for (const json& t : d["tool_calls"]) {
      EXPECT_EQ(t["index"], 0);
      if (t.contains("id")) {
        ++first_deltas;
        id = t["id"];
        name = t["function"]["name"];
        EXPECT_EQ(t["type"], "function");
      } else {
        EXPECT_FALSE(t["function"].contains("name"));
      }
      arguments += t["function"]["arguments"].get<std::string>();
    }
  }
  EXPECT_EQ(first_deltas, 1);
  EXPECT_EQ(reasoning, "\nNeed weather.\n");
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(arguments, R"({"city":"Paris"})");
  EXPECT_EQ(id.size(), 29u);
}

}  // namespace
}  // namespace heavykv::server
