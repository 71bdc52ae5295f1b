// The OpenAI API's JSON <-> GenerationRequest conversion (server/http/openai_json.h) and the one
// mapping of an absl::Status to an HTTP status and error object (server/http/http_status.h).
#include "server/http/openai_json.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

#include "engine/serving/request_field.h"
#include "server/http/cors.h"
#include "server/http/http_status.h"
#include "server/http/openai_names.h"
#include "server/http/openai_unknown_fields.h"
#include "server/http/openai_logprobs.h"

namespace heavykv::server {
namespace {

using nlohmann::json;

const OpenAiServed kServed{"tiny", 512};

absl::StatusOr<OpenAiRequest> Completion(const std::string& body) {
  return ParseGenerationBody(ApiKind::kCompletion, body, kServed);
}
absl::StatusOr<OpenAiRequest> Chat(const std::string& body) {
  return ParseGenerationBody(ApiKind::kChat, body, kServed);
}
// The error object's fields for a refused body.
json Error(const absl::Status& s) { return json::parse(ErrorBody(s))["error"]; }

TEST(OpenAiJsonTest, CompletionFieldsMapToTheGenerationRequest) {
  auto q = Completion(R"({"model":"tiny","prompt":"Once","max_tokens":7,"temperature":0,
      "top_p":0.5,"top_k":3,"seed":42,"stop":["a","b"],"n":1,"stream":true,
      "stream_options":{"include_usage":true},"user":"u","unknown_field":{"x":1},
      "kv_policy":"h2o","kv_budget":64,"kv_recent_fraction":0.25,"ignore_eos":true,
      "stop_token_ids":[2,3],"skip_special_tokens":false})");
  ASSERT_TRUE(q.ok()) << q.status();
  const GenerationRequest& r = q->generation;
  EXPECT_EQ(r.prompt, "Once");
  EXPECT_FALSE(r.messages.has_value());
  EXPECT_EQ(r.max_new_tokens, 7);
  EXPECT_FALSE(r.max_new_tokens_to_context);
  EXPECT_EQ(r.temperature, 0.0f);
  EXPECT_EQ(r.top_p, 0.5f);
  EXPECT_EQ(r.top_k, 3);
  EXPECT_EQ(r.seed, 42u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(q->stream);
  EXPECT_TRUE(q->include_usage);
  EXPECT_EQ(r.policy, "h2o");
  EXPECT_EQ(r.budget_tokens, 64);
  EXPECT_FALSE(r.budget_fraction.has_value());
  EXPECT_EQ(r.recent_fraction, 0.25);
  EXPECT_TRUE(r.ignore_eos);
  EXPECT_EQ(r.stop_token_ids, (std::vector<int32_t>{2, 3}));
  EXPECT_FALSE(r.skip_special_tokens);
}

TEST(OpenAiJsonTest, DefaultsAndPromptForms) {
  auto q = Completion(R"({"prompt":"x"})");  // no model: the served one
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->generation.max_new_tokens, 16);  // OpenAI's completion default
  EXPECT_FALSE(q->generation.temperature.has_value());
  EXPECT_FALSE(q->generation.top_k.has_value());
  EXPECT_TRUE(q->generation.skip_special_tokens);
  EXPECT_FALSE(q->stream);
  EXPECT_EQ(Completion(R"({"prompt":[1,2,3]})")->generation.prompt_token_ids,
            (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(Completion(R"({"prompt":[[5,6]]})")->generation.prompt_token_ids,
            (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(Completion(R"({"prompt":["one"]})")->generation.prompt, "one");
  EXPECT_EQ(Completion(R"({"prompt":"x","stop":"end"})")->generation.stop,
            (std::vector<std::string>{"end"}));
  EXPECT_FALSE(Completion(R"({"prompt":"x","top_k":-1})")->generation.top_k.has_value());
  EXPECT_EQ(Completion(R"({"prompt":"x","max_tokens":8.0})")->generation.max_new_tokens, 8);
  EXPECT_EQ(Completion(R"({"prompt":"x","max_tokens":8,"max_completion_tokens":9})")
                ->generation.max_new_tokens,
            9);
  EXPECT_EQ(Completion(R"({"prompt":"x","seed":-1})")->generation.seed, ~uint64_t(0));
  // kv_budget as --kv-budget reads it: (0, 1] a fraction, above it whole tokens.
  EXPECT_EQ(Completion(R"({"prompt":"x","kv_budget":0.25})")->generation.budget_fraction, 0.25);
  EXPECT_EQ(Completion(R"({"prompt":"x","kv_budget":1})")->generation.budget_fraction, 1.0);
  EXPECT_EQ(Completion(R"({"prompt":"x","kv_budget":2})")->generation.budget_tokens, 2);
  // Unsupported fields at their "off" values are accepted.
  EXPECT_TRUE(Completion(R"({"prompt":"x","echo":false,"logprobs":null,"presence_penalty":0,
      "frequency_penalty":0.0,"tools":[],"n":null,"best_of":1})")
                  .ok());
}

TEST(OpenAiJsonTest, ChatMessagesAndDefaults) {
  auto q = Chat(R"({"model":"tiny","messages":[{"role":"system","content":"Be brief."},
      {"role":"user","content":[{"type":"text","text":"Hi "},{"type":"text","text":"there"}]},
      {"role":"assistant","content":null}],"add_generation_prompt":false})");
  ASSERT_TRUE(q.ok()) << q.status();
  const GenerationRequest& r = q->generation;
  ASSERT_TRUE(r.messages.has_value());
  ASSERT_EQ(r.messages->size(), 3u);
  EXPECT_EQ((*r.messages)[0].role, "system");
  EXPECT_EQ((*r.messages)[0].content, "Be brief.");
  EXPECT_EQ((*r.messages)[1].content, "Hi there");
  EXPECT_EQ((*r.messages)[2].content, "");
  EXPECT_FALSE(r.add_generation_prompt);
  EXPECT_FALSE(r.prompt.has_value());
  // No max_tokens: as long as the context allows (vLLM).
  EXPECT_EQ(r.max_new_tokens, 512);
  EXPECT_TRUE(r.max_new_tokens_to_context);
  EXPECT_TRUE(Chat(R"({"messages":[]})").ok());  // the engine refuses an empty chat
}

TEST(OpenAiJsonTest, BadBodiesAreInvalidArgumentNamingTheField) {
  struct Case {
    ApiKind kind;
    std::string body;
    std::string param;  // "" for null
  };
  const Case cases[] = {
      {ApiKind::kCompletion, "{bad", ""},
      {ApiKind::kCompletion, "[1,2]", ""},
      {ApiKind::kCompletion, "", ""},
      {ApiKind::kCompletion, R"({"prompt":"x","n":0})", "n"},
      {ApiKind::kCompletion, R"({"prompt":"x","best_of":3})", "best_of"},
      {ApiKind::kCompletion, R"({"prompt":"x","max_tokens":-1})", "max_tokens"},
      {ApiKind::kCompletion, R"({"prompt":"x","max_tokens":0})", "max_tokens"},
      {ApiKind::kCompletion, R"({"prompt":"x","max_tokens":1.5})", "max_tokens"},
      {ApiKind::kCompletion, R"({"prompt":"x","max_tokens":"7"})", "max_tokens"},
      {ApiKind::kCompletion, R"({"prompt":"x","temperature":"hot"})", "temperature"},
      {ApiKind::kCompletion, R"({"prompt":"x","stop":[1]})", "stop"},
      {ApiKind::kCompletion, R"({"prompt":"x","stream":"yes"})", "stream"},
      {ApiKind::kCompletion, R"({"prompt":"x","stream_options":{"include_usage":1}})",
       "stream_options.include_usage"},
      {ApiKind::kChat, R"({"messages":[],"echo":true})", "echo"},
      {ApiKind::kCompletion, R"({"prompt":"x","prompt_logprobs":21})", "prompt_logprobs"},
      {ApiKind::kCompletion, R"({"prompt":"x","prompt_logprobs":1,"stream":true})",
       "prompt_logprobs"},
      {ApiKind::kCompletion, R"({"prompt":"x","logprobs":21})", "logprobs"},
      {ApiKind::kCompletion, R"({"prompt":"x","logprobs":true})", "logprobs"},
      {ApiKind::kChat, R"({"messages":[],"logprobs":2})", "logprobs"},
      {ApiKind::kChat, R"({"messages":[],"top_logprobs":2})", "top_logprobs"},
      {ApiKind::kChat, R"({"messages":[],"logprobs":true,"top_logprobs":21})", "top_logprobs"},
      {ApiKind::kCompletion, R"({"prompt":"x","presence_penalty":"high"})", "presence_penalty"},
      {ApiKind::kCompletion, R"({"prompt":"x","kv_budget":0})", "kv_budget"},
      {ApiKind::kCompletion, R"({"prompt":"x","kv_budget":2.5})", "kv_budget"},
      {ApiKind::kCompletion, R"({"prompt":"x","kv_policy":3})", "kv_policy"},
      {ApiKind::kCompletion, R"({"prompt":"x","stop_token_ids":[-1]})", "stop_token_ids"},
      {ApiKind::kCompletion, R"({"prompt":"x","top_k":-2})", "top_k"},
      {ApiKind::kCompletion, R"({"prompt":"x","seed":1.5})", "seed"},
      {ApiKind::kCompletion, R"({})", "prompt"},
      {ApiKind::kCompletion, R"({"prompt":[]})", "prompt"},
      {ApiKind::kCompletion, R"({"prompt":["a","b"]})", "prompt"},
      {ApiKind::kCompletion, R"({"prompt":[1,-2]})", "prompt"},
      {ApiKind::kCompletion, R"({"prompt":[1,"a"]})", "prompt"},
      {ApiKind::kCompletion, R"({"prompt":{"text":"x"}})", "prompt"},
      {ApiKind::kChat, R"({"prompt":"x"})", "messages"},
      {ApiKind::kChat, R"({"messages":"hi"})", "messages"},
      {ApiKind::kChat, R"({"messages":["hi"]})", "messages[0]"},
      {ApiKind::kChat, R"({"messages":[{"content":"hi"}]})", "messages[0].role"},
      {ApiKind::kChat, R"({"messages":[{"role":"user","content":7}]})", "messages[0].content"},
      {ApiKind::kChat, R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})",
       "messages[0].content"},
      {ApiKind::kChat, R"({"messages":[{"role":"user","content":[{"type":5}]}]})",
       "messages[0].content"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<OpenAiRequest> q = ParseGenerationBody(c.kind, c.body, kServed);
    ASSERT_FALSE(q.ok()) << c.body;
    EXPECT_EQ(q.status().code(), absl::StatusCode::kInvalidArgument) << c.body;
    const json e = Error(q.status());
    EXPECT_EQ(e["type"], "invalid_request_error") << c.body;
    EXPECT_EQ(e["code"], "invalid_argument") << c.body;
    EXPECT_EQ(e["param"], c.param.empty() ? json(nullptr) : json(c.param)) << c.body;
    EXPECT_FALSE(e["message"].get<std::string>().empty()) << c.body;
  }
  // The parse error says where, and never echoes the body.
  const std::string message(Completion("{\"secret\": nope}").status().message());
  EXPECT_EQ(message.find("secret"), std::string::npos) << message;
  EXPECT_EQ(message.find("nope"), std::string::npos) << message;
}

TEST(OpenAiJsonTest, AnotherModelIsNotFound) {
  auto q = Completion(R"({"model":"gpt-4","prompt":"x"})");
  ASSERT_EQ(q.status().code(), absl::StatusCode::kNotFound);
  const json e = Error(q.status());
  EXPECT_EQ(e["code"], "model_not_found");
  EXPECT_EQ(e["param"], "model");
  EXPECT_EQ(e["type"], "not_found_error");
  EXPECT_EQ(ToHttpError(q.status().code()).status, 404);
}

TEST(OpenAiJsonTest, TokenizeAndDetokenizeBodies) {
  auto t = ParseTokenizeBody(R"({"model":"tiny","prompt":"Hi","add_special_tokens":false})",
                             kServed);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->prompt, "Hi");
  EXPECT_FALSE(t->add_special_tokens);
  EXPECT_TRUE(ParseTokenizeBody(R"({"prompt":"Hi"})", kServed)->add_special_tokens);
  EXPECT_EQ(ParseTokenizeBody(R"({})", kServed).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*ParseDetokenizeBody(R"({"tokens":[1,2]})", kServed), (std::vector<int32_t>{1, 2}));
  EXPECT_FALSE(ParseDetokenizeBody(R"({"tokens":[1,"a"]})", kServed).ok());
  EXPECT_FALSE(ParseDetokenizeBody(R"({"tokens":null})", kServed).ok());
  // A chat, as vLLM's /tokenize takes it.
  auto chat = ParseTokenizeBody(
      R"({"messages":[{"role":"user","content":"Hi"}],"add_generation_prompt":false})", kServed);
  ASSERT_TRUE(chat.ok()) << chat.status();
  ASSERT_TRUE(chat->chat.has_value());
  EXPECT_EQ(chat->chat->messages->at(0).content, "Hi");
  EXPECT_FALSE(chat->chat->add_generation_prompt);
  EXPECT_TRUE(ParseTokenizeBody(R"({"messages":[]})", kServed)->chat->add_generation_prompt);
  // With the tools and kwargs a chat completion renders.
  auto tools = ParseTokenizeBody(
      R"({"messages":[],"tools":[{"type":"function","function":{"name":"f"}}],)"
      R"("chat_template_kwargs":{"enable_thinking":false}})",
      kServed);
  ASSERT_TRUE(tools.ok()) << tools.status();
  EXPECT_EQ(tools->chat->chat_tools, R"([{"type":"function","function":{"name":"f"}}])");
  EXPECT_EQ(tools->chat->chat_template_kwargs, R"({"enable_thinking":false})");
  EXPECT_EQ(Error(ParseTokenizeBody(R"({"messages":[{"role":1}]})", kServed).status())["param"],
            "messages[0].role");
  EXPECT_EQ(Error(ParseTokenizeBody(R"({"messages":[],"prompt":"x"})", kServed).status())["param"],
            "prompt");
}

// logprobs: an integer (how many top tokens) in the legacy completion API; a flag and
// top_logprobs in chat.
TEST(OpenAiJsonTest, LogprobsFields) {
  auto c = Completion(R"({"prompt":"x","logprobs":3})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->generation.logprobs);
  EXPECT_EQ(c->generation.top_logprobs, 3);
  c = Completion(R"({"prompt":"x","logprobs":0})");
  EXPECT_TRUE(c->generation.logprobs);
  EXPECT_EQ(c->generation.top_logprobs, 0);
  c = Completion(R"({"prompt":"x","logprobs":null})");
  EXPECT_FALSE(c->generation.logprobs);
  auto h = Chat(R"({"messages":[],"logprobs":true,"top_logprobs":20})");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_TRUE(h->generation.logprobs);
  EXPECT_EQ(h->generation.top_logprobs, 20);
  h = Chat(R"({"messages":[],"logprobs":false,"top_logprobs":0})");
  EXPECT_FALSE(h->generation.logprobs);
}

// Two deltas (the second token ends inside a character, the third completes it) in each API's
// shape, the offsets counting characters.
TEST(OpenAiJsonTest, LogprobsShapes) {
  std::vector<GenerationDelta> deltas(3);
  deltas[0].token_ids = {5};
  deltas[0].text = "h\xC3\xA9";  // "hé": two characters
  deltas[0].logprobs = {-0.5f};
  deltas[0].token_bytes = {"h\xC3\xA9"};
  deltas[0].top_logprobs = {{{5, -0.5f, "h\xC3\xA9"}, {9, -1.5f, "x"}}};
  deltas[1].token_ids = {7};
  deltas[1].logprobs = {-2.0f};
  deltas[1].token_bytes = {"\xE2"};
  deltas[1].top_logprobs = {{{8, -1.0f, "y"}, {7, -2.0f, "\xE2"}}};
  deltas[2].token_ids = {6};
  deltas[2].text = "\xE2\x82\xAC";  // the euro sign
  deltas[2].logprobs = {-0.25f};
  deltas[2].token_bytes = {"\x82\xAC"};
  deltas[2].top_logprobs = {{{6, -0.25f, "\x82\xAC"}, {3, -3.0f, ""}}};

  LogprobsJson legacy(ApiKind::kCompletion, true);
  for (const GenerationDelta& d : deltas) legacy.Add(d);
  const json l = json::parse(JsonText(legacy.Take()));
  EXPECT_EQ(l["tokens"], json::parse(R"(["h\u00e9", "\ufffd", "\ufffd\ufffd"])"));
  EXPECT_EQ(l["token_logprobs"], json::parse("[-0.5, -2.0, -0.25]"));
  EXPECT_EQ(l["text_offset"], json::parse("[0, 2, 2]"));
  EXPECT_EQ(l["top_logprobs"][0], json::parse(R"({"h\u00e9": -0.5, "x": -1.5})"));
  EXPECT_EQ(l["top_logprobs"][2]["token_id:3"], -3.0);  // no bytes: named by its id

  LogprobsJson chat(ApiKind::kChat, true);
  chat.Add(deltas[0]);
  const json first = chat.Take();
  ASSERT_EQ(first["content"].size(), 1u);
  EXPECT_EQ(first["content"][0]["bytes"], json::parse("[104, 195, 169]"));
  EXPECT_EQ(first["content"][0]["logprob"], -0.5);
  EXPECT_EQ(first["content"][0]["top_logprobs"][1],
            json::parse(R"({"token":"x","logprob":-1.5,"bytes":[120]})"));
  chat.Add(deltas[1]);
  chat.Add(deltas[2]);
  const json rest = chat.Take();
  ASSERT_EQ(rest["content"].size(), 2u);
  EXPECT_EQ(rest["content"][0]["bytes"], json::parse("[226]"));
  EXPECT_EQ(chat.Take(), json::parse(R"({"content": []})"));
  EXPECT_EQ(LogprobsJson(ApiKind::kChat, false).Take(), json(nullptr));

  GenerationDelta last;
  last.finished = true;
  last.finish_reason = "length";
  const ResponseMeta meta{ApiKind::kChat, "chatcmpl-1", 1, "tiny"};
  EXPECT_EQ(ResponseJson(meta, "h", last, first)["choices"][0]["logprobs"], first);
  EXPECT_EQ(StreamChunkJson(meta, "h", std::nullopt, false, false, rest)["choices"][0]["logprobs"],
            rest);
}

// The engine names heavykv.v1 fields; the error object names OpenAI's (openai_names.h): the
// field as `param`, and whole names only in the message.
TEST(OpenAiJsonTest, EngineFieldsGetOpenAiNames) {
  const absl::Status engine = WithRequestField(
      absl::InvalidArgumentError("max_new_tokens must be in [1, 512], got 100000"),
      "max_new_tokens");
  EXPECT_EQ(Error(engine)["param"], "max_tokens");
  EXPECT_EQ(Error(engine)["message"], "max_tokens must be in [1, 512], got 100000");
  // The front's own param wins; a field both APIs share keeps its name; none is null.
  EXPECT_EQ(Error(WithParam(engine, "max_completion_tokens"))["param"], "max_completion_tokens");
  EXPECT_EQ(Error(WithRequestField(absl::InvalidArgumentError("x"), "messages[2].role"))["param"],
            "messages[2].role");
  EXPECT_TRUE(Error(absl::InvalidArgumentError("x"))["param"].is_null());
  EXPECT_EQ(OpenAiParam("kv.recent_fraction"), "kv_recent_fraction");
  EXPECT_EQ(OpenAiParam("kv.budget_fraction"), "kv_budget");
  EXPECT_EQ(OpenAiParam("sampling.top_k"), "top_k");
  EXPECT_EQ(OpenAiParam("prompt_token_ids"), "prompt");
  EXPECT_EQ(OpenAiMessage("kv.recent_fraction must be in (0, 1]."),
            "kv_recent_fraction must be in (0, 1].");
  EXPECT_EQ(OpenAiMessage("lower max_new_tokens, or its budget"), "lower max_tokens, or its budget");
  // Not inside a longer name.
  EXPECT_EQ(OpenAiMessage("--max-new-tokens-limit, my_max_new_tokens, max_new_tokens_x, "
                          "kv.policy.name"),
            "--max-new-tokens-limit, my_max_new_tokens, max_new_tokens_x, kv.policy.name");
  EXPECT_EQ(OpenAiMessage("this server has no tokenizer: send token ids (prompt_token_ids) "
                          "instead of text"),
            "this server has no tokenizer: send token ids (\"prompt\": [ids]) instead of text");
  EXPECT_EQ(OpenAiMessage("or send a prompt (Generate)"), "or send a prompt to /v1/completions");
}

TEST(OpenAiJsonTest, CorsOrigins) {
  EXPECT_FALSE(ParseCorsOrigins("")->enabled());
  const absl::StatusOr<CorsPolicy> any = ParseCorsOrigins("*");
  ASSERT_TRUE(any.ok());
  EXPECT_EQ(any->AllowOrigin("https://x.example"), "*");
  EXPECT_EQ(any->AllowOrigin(""), "");  // not a browser's cross-origin request
  const absl::StatusOr<CorsPolicy> list =
      ParseCorsOrigins(" https://App.example.com , http://localhost:3000,http://[::1]:8080");
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->AllowOrigin("https://app.example.com"), "https://app.example.com");
  EXPECT_EQ(list->AllowOrigin("http://localhost:3000"), "http://localhost:3000");
  EXPECT_EQ(list->AllowOrigin("http://[::1]:8080"), "http://[::1]:8080");
  EXPECT_EQ(list->AllowOrigin("http://app.example.com"), "");   // another scheme
  EXPECT_EQ(list->AllowOrigin("http://localhost:3001"), "");    // another port
  EXPECT_EQ(list->AllowOrigin("https://app.example.com.evil"), "");
  EXPECT_EQ(list->AllowOrigin("null"), "");
  for (const char* bad : {"app.example.com", "https://app.example.com/", "ftp://x.example",
                          "https://x.example:0", "https://x.example:99999", "https://",
                          "*,https://x.example", "https://x.example/path", "http://a b"}) {
    const absl::StatusOr<CorsPolicy> refused = ParseCorsOrigins(bad);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(refused.status().message().find("--http-cors-origins"), std::string::npos) << bad;
  }
}

TEST(OpenAiJsonTest, StatusMapping) {
  const std::pair<absl::StatusCode, int> map[] = {
      {absl::StatusCode::kInvalidArgument, 400},  {absl::StatusCode::kFailedPrecondition, 400},
      {absl::StatusCode::kOutOfRange, 400},       {absl::StatusCode::kUnauthenticated, 401},
      {absl::StatusCode::kPermissionDenied, 403}, {absl::StatusCode::kNotFound, 404},
      {absl::StatusCode::kResourceExhausted, 429}, {absl::StatusCode::kUnavailable, 503},
      {absl::StatusCode::kDeadlineExceeded, 504}, {absl::StatusCode::kInternal, 500},
      {absl::StatusCode::kUnknown, 500},          {absl::StatusCode::kCancelled, 500},
  };
  for (const auto& [code, http] : map) EXPECT_EQ(ToHttpError(code).status, http) << int(code);
  const json e = Error(absl::ResourceExhaustedError("the queue is full"));
  EXPECT_EQ(e, json::parse(R"({"message":"the queue is full","type":"rate_limit_error",
                              "param":null,"code":"resource_exhausted"})"));
}

TEST(OpenAiJsonTest, ResponseShapes) {
  GenerationDelta last;
  last.finished = true;
  last.finish_reason = "eos";
  last.usage.prompt_tokens = 3;
  last.usage.completion_tokens = 4;
  last.usage.policy = "h2o";
  last.usage.kv_budget_tokens = 32;
  last.usage.kv_dtype = "int8";
  last.usage.kv_tokens_kept = 7;
  last.usage.kv_tokens_evicted = 0;
  last.usage.peak_pages = 1;
  last.usage.cached_tokens = 2;
  const ResponseMeta completion{ApiKind::kCompletion, "cmpl-1", 1700000000, "tiny"};
  EXPECT_EQ(ResponseJson(completion, "abc", last), json::parse(R"({
      "id":"cmpl-1","object":"text_completion","created":1700000000,"model":"tiny",
      "choices":[{"index":0,"text":"abc","logprobs":null,"finish_reason":"stop"}],
      "usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7,
               "prompt_tokens_details":{"cached_tokens":2},
               "kv":{"policy":"h2o","dtype":"int8","budget_tokens":32,"tokens_kept":7,
                     "tokens_evicted":0,
                     "peak_pages":1}}})"));
  const ResponseMeta chat{ApiKind::kChat, "chatcmpl-2", 5, "tiny"};
  last.finish_reason = "length";
  const json c = ResponseJson(chat, "hi", last);
  EXPECT_EQ(c["object"], "chat.completion");
  EXPECT_EQ(c["choices"][0]["message"], json::parse(R"({"role":"assistant","content":"hi"})"));
  EXPECT_EQ(c["choices"][0]["finish_reason"], "length");

  EXPECT_EQ(StreamChunkJson(chat, "", std::nullopt, /*first=*/true, /*include_usage=*/true),
            json::parse(R"({"id":"chatcmpl-2","object":"chat.completion.chunk","created":5,
      "model":"tiny","choices":[{"index":0,"delta":{"role":"assistant","content":""},
      "logprobs":null,"finish_reason":null}],"usage":null})"));
  EXPECT_EQ(StreamChunkJson(chat, "", std::string("stop"), false, false)["choices"][0],
            json::parse(R"({"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"})"));
  EXPECT_EQ(StreamChunkJson(completion, "x", std::nullopt, false, false)["choices"][0]["text"], "x");
  const json u = UsageChunkJson(chat, last.usage);
  EXPECT_EQ(u["choices"], json::array());
  EXPECT_EQ(u["usage"]["total_tokens"], 7);
  EXPECT_EQ(OpenAiFinishReason("cancelled"), "abort");

  // One line per event; invalid UTF-8 never throws.
  const std::string event = SseEvent(StreamChunkJson(completion, "a\nb\xff", std::nullopt, false,
                                                     false));
  EXPECT_EQ(event.substr(0, 6), "data: ");
  EXPECT_EQ(event.find('\n'), event.size() - 2);
  EXPECT_EQ(event.substr(event.size() - 2), "\n\n");
  EXPECT_EQ(std::string(kSseDone), "data: [DONE]\n\n");
  EXPECT_EQ(ModelsJson("tiny", 9, 512)["data"][0]["max_model_len"], 512);
}

// ---- The sampling API (issue 44) ----

TEST(OpenAiJsonTest, SamplingApiFieldsAreServed) {
  auto q = Completion(R"({"prompt":"x","presence_penalty":0.5,"frequency_penalty":-0.25,
      "repetition_penalty":1.2,"min_p":0.05,"min_tokens":3,
      "logit_bias":{"50":-100,"7":2.5}})");
  ASSERT_TRUE(q.ok()) << q.status();
  const GenerationRequest& r = q->generation;
  EXPECT_EQ(r.presence_penalty, 0.5f);
  EXPECT_EQ(r.frequency_penalty, -0.25f);
  EXPECT_EQ(r.repetition_penalty, 1.2f);
  EXPECT_FALSE(r.penalty_last_n.has_value());  // vLLM's: every token seen
  EXPECT_EQ(r.min_p, 0.05f);
  EXPECT_EQ(r.min_tokens, 3);
  EXPECT_EQ(r.logit_bias, (std::vector<std::pair<int32_t, float>>{{50, -100.0f}, {7, 2.5f}}));
  // Chat reads the same.
  q = Chat(R"({"messages":[],"presence_penalty":1,"logit_bias":{"3":1}})");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->generation.presence_penalty, 1.0f);
  EXPECT_EQ(q->generation.logit_bias.size(), 1u);
}

TEST(OpenAiJsonTest, LlamaCppNamesAreServed) {
  // repeat_penalty: llama.cpp's window of 64 unless repeat_last_n says otherwise.
  auto q = Completion(R"({"prompt":"x","repeat_penalty":1.1})");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->generation.repetition_penalty, 1.1f);
  EXPECT_EQ(q->generation.penalty_last_n, 64);
  q = Completion(R"({"prompt":"x","repeat_penalty":1.1,"repeat_last_n":-1})");
  EXPECT_EQ(q->generation.penalty_last_n, -1);
  q = Completion(R"({"prompt":"x","repeat_last_n":0,"repeat_penalty":1.1})");
  EXPECT_EQ(q->generation.penalty_last_n, 0);
  EXPECT_FALSE(Completion(R"({"prompt":"x","repeat_penalty":1.1,"repetition_penalty":1.2})").ok());
  // n_probs: top logprobs, logprobs on.
  q = Chat(R"({"messages":[],"n_probs":5})");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_TRUE(q->generation.logprobs);
  EXPECT_EQ(q->generation.top_logprobs, 5);
  EXPECT_FALSE(Completion(R"({"prompt":"x","n_probs":0})")->generation.logprobs);
  // n_predict: max_tokens; -1 until the limit; max_tokens wins when both are sent.
  EXPECT_EQ(Completion(R"({"prompt":"x","n_predict":9})")->generation.max_new_tokens, 9);
  q = Completion(R"({"prompt":"x","n_predict":-1})");
  EXPECT_EQ(q->generation.max_new_tokens, 512);
  EXPECT_TRUE(q->generation.max_new_tokens_to_context);
  EXPECT_EQ(Completion(R"({"prompt":"x","n_predict":9,"max_tokens":4})")
                ->generation.max_new_tokens, 4);
  EXPECT_EQ(Completion(R"({"prompt":"x"})")->generation.max_new_tokens, 16);
}

TEST(OpenAiJsonTest, UnservedSamplingFieldsAreRefusedByName) {
  const std::pair<std::string, std::string> cases[] = {
      {R"("typical_p":0.9)", "typical_p"},
      {R"("length_penalty":2)", "length_penalty"},
      {R"("mirostat":2)", "mirostat"},
      {R"("tfs_z":0.5)", "tfs_z"},
      {R"("dynatemp_range":0.5)", "dynatemp_range"},
      {R"("dry_multiplier":0.8)", "dry_multiplier"},
      {R"("xtc_probability":0.5)", "xtc_probability"},
      {R"("top_n_sigma":1.5)", "top_n_sigma"},
      {R"("penalize_nl":true)", "penalize_nl"},
      {R"("bad_words":["x"])", "bad_words"},
      {R"("allowed_token_ids":[1,2])", "allowed_token_ids"},
      {R"("logits_processors":["x"])", "logits_processors"},
      {R"("samplers":["top_k"])", "samplers"},
      {R"("include_stop_str_in_output":true)", "include_stop_str_in_output"},
      {R"("truncate_prompt_tokens":10)", "truncate_prompt_tokens"},
      {R"("functions":[{"name":"f"}])", "functions"},
      {R"("function_call":"auto")", "function_call"},
      {R"("reasoning_effort":"high")", "reasoning_effort"},
      {R"("prediction":{"type":"content","content":"x"})", "prediction"},
      {R"("audio":{"voice":"x"})", "audio"},
      {R"("modalities":["text","audio"])", "modalities"},
      {R"("web_search_options":{"search_context_size":"low"})", "web_search_options"},
      {R"("n_predict":0)", "n_predict"},
      {R"("logit_bias":[[1,2]])", "logit_bias"},
      {R"("logit_bias":{"abc":1})", "logit_bias"},
      {R"("logit_bias":{"-1":1})", "logit_bias"},
      {R"("logit_bias":{" 1":1})", "logit_bias"},
      {R"("logit_bias":{"99999999999":1})", "logit_bias"},
      {R"("logit_bias":{"1":"big"})", "logit_bias"},
      {R"("min_tokens":-1)", "min_tokens"},
      {R"("min_p":"low")", "min_p"},
  };
  for (const auto& [field, param] : cases) {
    absl::StatusOr<OpenAiRequest> q = Chat(absl::StrCat(R"({"messages":[],)", field, "}"));
    ASSERT_FALSE(q.ok()) << field;
    EXPECT_EQ(q.status().code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_EQ(Error(q.status())["param"], param) << field << ": " << q.status();
  }
  // The message says what is served.
  EXPECT_EQ(Error(Completion(R"({"prompt":"x","typical_p":0.5})").status())["message"],
            "typical_p is not served: send 1 or leave it out");
  // Their "off" values, the parameters of samplers that are off, and the fields that change no
  // output are accepted.
  auto q = Chat(R"({"messages":[],"typical_p":1,"length_penalty":1,"mirostat":0,"tfs_z":1,
      "mirostat_tau":5,"mirostat_eta":0.1,"dynatemp_range":0,"dry_multiplier":0,"dry_base":1.75,
      "xtc_probability":0,"xtc_threshold":0.1,"top_n_sigma":-1,"penalize_nl":false,
      "bad_words":[],"allowed_token_ids":[],"logits_processors":[],"samplers":[],
      "include_stop_str_in_output":false,"modalities":["text"],"guided_decoding_backend":"xgrammar",
      "user":"u","store":false,"metadata":{"a":"b"},"service_tier":"auto","cache_prompt":true,
      "id_slot":-1,"parallel_tool_calls":true})");
  EXPECT_TRUE(q.ok()) << q.status();
}

TEST(OpenAiJsonTest, EngineRangeErrorsNameTheHttpField) {
  EXPECT_EQ(OpenAiParam("sampling.min_p"), "min_p");
  EXPECT_EQ(OpenAiParam("sampling.presence_penalty"), "presence_penalty");
  EXPECT_EQ(OpenAiParam("sampling.frequency_penalty"), "frequency_penalty");
  EXPECT_EQ(OpenAiParam("sampling.repetition_penalty"), "repetition_penalty");
  EXPECT_EQ(OpenAiParam("sampling.penalty_last_n"), "repeat_last_n");
  EXPECT_EQ(OpenAiParam("sampling.logit_bias"), "logit_bias");
  EXPECT_EQ(OpenAiParam("sampling.min_tokens"), "min_tokens");
  EXPECT_EQ(OpenAiMessage("sampling.penalty_last_n must be >= -1"), "repeat_last_n must be >= -1");
}

TEST(OpenAiJsonTest, UnknownFieldsAreReportedOnceAndBounded) {
  UnknownFieldLog log;
  const auto body = [](const std::string& text) { return nlohmann::ordered_json::parse(text); };
  EXPECT_EQ(log.Take(body(R"({"prompt":"x","foo":1,"temperature":0,"bar\n":2,"n_probs":1})")),
            (std::vector<std::string>{"foo", "bar\\n"}));
  EXPECT_TRUE(log.Take(body(R"({"foo":1,"bar\n":2})")).empty());  // already reported
  EXPECT_EQ(log.Take(body(R"({"foo":1,"baz":2})")), (std::vector<std::string>{"baz"}));
  // Every field the parsers read is known.
  for (const char* known : {"model", "messages", "max_tokens", "logit_bias", "repeat_penalty",
                            "response_format", "guided_json", "tool_choice", "chat_template_kwargs",
                            "kv_policy", "stream_options", "user", "mirostat_eta"}) {
    EXPECT_TRUE(IsKnownBodyField(known)) << known;
  }
  // At most kMaxNames names are ever remembered (and reported).
  size_t reported = 3;
  for (int i = 0; i < 1000; ++i) {
    reported += log.Take(body(absl::StrCat(R"({"unknown_)", i, R"(":1})"))).size();
  }
  EXPECT_EQ(reported, UnknownFieldLog::kMaxNames);
}

TEST(OpenAiJsonTest, EchoAndPromptLogprobsAskTheEngineForThePromptsScores) {
  auto q = Completion(R"({"prompt":"x","echo":true})");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_TRUE(q->echo);
  EXPECT_EQ(q->generation.prompt_logprobs, -1);  // the text alone needs no scores
  q = Completion(R"({"prompt":"x","echo":true,"logprobs":3})");
  EXPECT_EQ(q->generation.prompt_logprobs, 3);
  // max_tokens 0 scores the prompt alone: the engine ends after it.
  q = Completion(R"({"prompt":"x","echo":true,"max_tokens":0})");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->generation.max_new_tokens, 0);
  EXPECT_EQ(q->generation.prompt_logprobs, 0);
  // The engine is asked once, for the most top tokens either field wants.
  q = Completion(R"({"prompt":"x","echo":true,"logprobs":1,"prompt_logprobs":4})");
  EXPECT_EQ(q->generation.prompt_logprobs, 4);
  EXPECT_EQ(q->prompt_logprobs, 4);
  q = Chat(R"({"messages":[],"prompt_logprobs":0,"max_tokens":0})");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_FALSE(q->echo);
  EXPECT_EQ(q->prompt_logprobs, 0);
  EXPECT_EQ(q->generation.max_new_tokens, 0);
  EXPECT_EQ(Completion(R"({"prompt":"x","prompt_logprobs":null})")->prompt_logprobs,
            std::nullopt);
}

// Two prompt tokens ("", "Hi") and the scores of the second: "Hi" at -0.5, rank 2 after "Yo".
PromptLogprobs TwoTokenPrompt() {
  PromptLogprobs p;
  p.token_ids = {1, 40};
  p.token_bytes = {"", "Hi"};
  p.logprobs = {std::nanf(""), -0.5f};
  p.ranks = {0, 2};
  p.top = {{}, {{41, -0.25f, "Yo"}, {40, -0.5f, "Hi"}}};
  return p;
}

TEST(OpenAiJsonTest, EchoedLogprobsCoverThePromptThenTheCompletion) {
  LogprobsJson l(ApiKind::kCompletion, true);
  l.AddPrompt(TwoTokenPrompt(), /*top_n=*/1, "Hi");
  GenerationDelta d;
  d.token_ids = {50};
  d.text = " there";
  d.logprobs = {-1.0f};
  d.token_bytes = {" there"};
  l.Add(d);
  EXPECT_EQ(l.Take(), json::parse(R"({"tokens":["token_id:1","Hi"," there"],
      "token_logprobs":[null,-0.5,-1.0],"top_logprobs":[null,{"Yo":-0.25,"Hi":-0.5},
      {" there":-1.0}],"text_offset":[0,0,2]})"));
}

TEST(OpenAiJsonTest, PromptLogprobsAreVllmsDictsByTokenId) {
  const PromptLogprobs p = TwoTokenPrompt();
  EXPECT_EQ(PromptLogprobsJson(p, 2), json::parse(R"([null,
      {"40":{"logprob":-0.5,"rank":2,"decoded_token":"Hi"},
       "41":{"logprob":-0.25,"rank":1,"decoded_token":"Yo"}}])"));
  EXPECT_EQ(PromptLogprobsJson(p, 0),
            json::parse(R"([null,{"40":{"logprob":-0.5,"rank":2,"decoded_token":"Hi"}}])"));
  // A completion's choice holds them; a chat's response.
  GenerationDelta last;
  last.finish_reason = "length";
  const json c = ResponseJson({ApiKind::kCompletion, "cmpl-1", 5, "tiny"}, "Hi", last, nullptr,
                              PromptLogprobsJson(p, 0));
  EXPECT_EQ(c["choices"][0]["prompt_logprobs"][0], nullptr);
  EXPECT_FALSE(c.contains("prompt_logprobs"));
  const json h = ResponseJson({ApiKind::kChat, "chatcmpl-1", 5, "tiny"}, "", last, nullptr,
                              PromptLogprobsJson(p, 0));
  EXPECT_EQ(h["prompt_logprobs"].size(), 2u);
  EXPECT_FALSE(h["choices"][0].contains("prompt_logprobs"));
  EXPECT_FALSE(ResponseJson({ApiKind::kChat, "chatcmpl-1", 5, "tiny"}, "", last)
                   .contains("prompt_logprobs"));
}

}  // namespace
}  // namespace heavykv::server
