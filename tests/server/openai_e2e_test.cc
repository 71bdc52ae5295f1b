// End-to-end tests of the OpenAI HTTP API (`heavykv serve --http-address`): the real binary on
// loopback ports, spoken to over raw HTTP/1.1 sockets (so the SSE bytes are checked exactly as
// they are sent) and compared with gRPC on the same server. Four servers: the bundled
// stories260K model (no chat template; once more with API keys), a slow random model (a
// 2000-token request is still running when a test disconnects), and a small qwen2 GGUF with a
// ChatML template (chats).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/server/server_harness.h"

namespace heavykv {
namespace {

using namespace std::chrono_literals;
using namespace heavykv::e2e;
using nlohmann::json;

struct HttpResponse {
  int status = 0;
  std::string head;  // status line and headers
  std::string body;  // de-chunked
};

// The body of a chunked transfer, or "" when malformed.
std::string Dechunk(const std::string& raw) {
  std::string out;
  size_t at = 0;
  for (;;) {
    const size_t eol = raw.find("\r\n", at);
    if (eol == std::string::npos) return "";
    const size_t n = std::stoul(raw.substr(at, eol - at), nullptr, 16);
    if (n == 0) return out;
    if (raw.size() < eol + 2 + n + 2 || raw.compare(eol + 2 + n, 2, "\r\n") != 0) return "";
    out += raw.substr(eol + 2, n);
    at = eol + 2 + n + 2;
  }
}

// One HTTP/1.1 request on its own connection (closed after the response).
HttpResponse Http(int port, const std::string& method, const std::string& path,
                  const std::string& body = "", const std::string& headers = "") {
  const std::string request = method + " " + path +
                              " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                              "Content-Type: application/json\r\nContent-Length: " +
                              std::to_string(body.size()) + "\r\n" + headers + "\r\n" + body;
  const std::string raw = HttpExchange(port, request, 60s);
  HttpResponse r;
  const size_t end = raw.find("\r\n\r\n");
  if (raw.size() < 12 || end == std::string::npos) return r;
  r.status = std::stoi(raw.substr(9, 3));
  r.head = raw.substr(0, end + 2);
  r.body = raw.substr(end + 4);
  if (r.head.find("Transfer-Encoding: chunked") != std::string::npos) r.body = Dechunk(r.body);
  return r;
}

HttpResponse Post(int port, const std::string& path, const json& body,
                  const std::string& headers = "") {
  return Http(port, "POST", path, body.dump(), headers);
}

// The events of an SSE body, checked byte by byte: each is "data: <one line>\n\n" and the last
// is "data: [DONE]\n\n". Returns the JSON of every event but [DONE].
std::vector<json> SseEvents(const std::string& body) {
  std::vector<json> events;
  size_t at = 0;
  bool done = false;
  while (at < body.size()) {
    EXPECT_FALSE(done) << "bytes after [DONE]: " << body.substr(at);
    EXPECT_EQ(body.compare(at, 6, "data: "), 0) << body.substr(at);
    const size_t end = body.find("\n\n", at);
    if (end == std::string::npos) {
      ADD_FAILURE() << "an event without its blank line: " << body.substr(at);
      break;
    }
    const std::string data = body.substr(at + 6, end - at - 6);
    EXPECT_EQ(data.find('\n'), std::string::npos) << data;
    if (data == "[DONE]") {
      done = true;
    } else {
      events.push_back(json::parse(data));
    }
    at = end + 2;
  }
  EXPECT_TRUE(done) << "no data: [DONE]";
  EXPECT_EQ(body.substr(body.size() >= 14 ? body.size() - 14 : 0), "data: [DONE]\n\n");
  return events;
}

class OpenAiE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    keys_ = dir_->File("keys");
    std::ofstream(keys_) << "sk-test-key\n";
    fast_ = new ServerProcess({"--model", testing::ModelPath(), "--tokenizer",
                               testing::TokenizerPath(), "--max-prompt-tokens", "64", "--threads",
                               "1", "--served-model-name", "stories"});
    const std::string slow_model = dir_->File("slow.bin");
    RunCapture(Bin() +
               " make-model --dim 256 --hidden-dim 768 --layers 4 --heads 8 --kv-heads 4 "
               "--vocab 512 --seq-len 2048 --out " + slow_model + " 2>&1");
    slow_ = new ServerProcess({"--model", slow_model, "--tokenizer", testing::TokenizerPath(),
                               "--threads", "1", "--max-running", "1", "--kv-pages", "512"});
    keyed_ = new ServerProcess({"--model", testing::ModelPath(), "--tokenizer",
                                testing::TokenizerPath(), "--threads", "1", "--api-key-file",
                                keys_});
    const std::string vocab = testing::SourcePath("../shared/gguf/qwen-vocab.gguf");
    chat_model_ = dir_->File("chat.gguf");
    if (std::ifstream(vocab).good()) {
      RunCapture(Bin() +
                 " make-model --format gguf --arch qwen2 --dim 64 --hidden-dim 128 --layers 2 "
                 "--heads 4 --kv-heads 2 --seq-len 512 --vocab-from " + vocab + " --out " +
                 chat_model_ + " 2>&1");
      chat_ = new ServerProcess({"--model", chat_model_, "--threads", "1"});
    }
  }
  static void TearDownTestSuite() {
    delete fast_;
    delete slow_;
    delete keyed_;
    delete chat_;
    delete dir_;
  }
  void SetUp() override {
    ASSERT_TRUE(fast_->ok() && fast_->http_port() > 0) << fast_->log();
    ASSERT_TRUE(slow_->ok() && slow_->http_port() > 0) << slow_->log();
    ASSERT_TRUE(keyed_->ok() && keyed_->http_port() > 0) << keyed_->log();
  }
  // The chat server, or a skip when ../shared/gguf/qwen-vocab.gguf is absent.
  ServerProcess* ChatServer() {
    if (chat_ == nullptr) return nullptr;
    EXPECT_TRUE(chat_->ok() && chat_->http_port() > 0) << chat_->log();
    return chat_;
  }

  static testing::TempDir* dir_;
  static std::string keys_, chat_model_;
  static ServerProcess* fast_;
  static ServerProcess* slow_;
  static ServerProcess* keyed_;  // with --api-key-file
  static ServerProcess* chat_;
};
testing::TempDir* OpenAiE2eTest::dir_ = nullptr;
std::string OpenAiE2eTest::keys_, OpenAiE2eTest::chat_model_;
ServerProcess* OpenAiE2eTest::fast_ = nullptr;
ServerProcess* OpenAiE2eTest::slow_ = nullptr;
ServerProcess* OpenAiE2eTest::keyed_ = nullptr;
ServerProcess* OpenAiE2eTest::chat_ = nullptr;

// Prefix caching through both fronts (one tenant without API keys): a prompt gRPC sent is a
// cached prefix for HTTP, which gets the same text and reports the reused prompt tokens as
// OpenAI's usage.prompt_tokens_details.cached_tokens; gRPC reports its own in Usage.
TEST_F(OpenAiE2eTest, APromptSentOverGrpcIsACachedPrefixForHttp) {
  std::string prompt;
  for (int i = 0; i < 3; ++i) prompt += "Once upon a time, there was a girl named Mia. ";
  const Streamed grpc = Generate(fast_->stub(), Greedy(prompt, 20));
  ASSERT_TRUE(grpc.status.ok()) << grpc.status.error_message();
  EXPECT_GT(grpc.last.usage().prompt_tokens(), 33);  // at least two whole blocks before the last
  const json request = {{"prompt", prompt}, {"max_tokens", 20}, {"temperature", 0}};
  const HttpResponse r = Post(fast_->http_port(), "/v1/completions", request);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["text"], grpc.text);
  const int cached = j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>();
  EXPECT_GT(cached, 0);
  EXPECT_EQ(cached % 16, 0);  // whole blocks
  EXPECT_LT(cached, grpc.last.usage().prompt_tokens());
  const Streamed again = Generate(fast_->stub(), Greedy(prompt, 20));
  EXPECT_EQ(again.last.usage().cached_tokens(), cached);
  EXPECT_EQ(again.text, grpc.text);
}

TEST_F(OpenAiE2eTest, CompletionTextEqualsGrpcGenerate) {
  const Streamed grpc = Generate(fast_->stub(), Greedy("Once upon a time", 40));
  ASSERT_TRUE(grpc.status.ok()) << grpc.status.error_message();

  const json request = {{"model", "stories"}, {"prompt", "Once upon a time"}, {"max_tokens", 40},
                       {"temperature", 0}};
  const HttpResponse r = Post(fast_->http_port(), "/v1/completions", request);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.head.find("Content-Type: application/json"), std::string::npos) << r.head;
  const json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "stories");
  EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_EQ(j["choices"][0]["text"], grpc.text);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], grpc.last.usage().prompt_tokens());
  EXPECT_EQ(j["usage"]["completion_tokens"], 40);
  EXPECT_EQ(j["usage"]["total_tokens"], grpc.last.usage().prompt_tokens() + 40);
  EXPECT_EQ(j["usage"]["kv"]["policy"], "full");
  EXPECT_TRUE(fast_->WaitForLog("request " + j["id"].get<std::string>() + " finished: "))
      << fast_->log();

  // Streamed: the same text.
  json streamed = request;
  streamed["stream"] = true;
  const HttpResponse s = Post(fast_->http_port(), "/v1/completions", streamed);
  ASSERT_EQ(s.status, 200) << s.body;
  EXPECT_NE(s.head.find("Content-Type: text/event-stream"), std::string::npos) << s.head;
  std::string text;
  // Deltas ready together go out as one chunk: one or more, the last with the finish reason.
  const std::vector<json> events = SseEvents(s.body);
  ASSERT_GE(events.size(), 1u);
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i]["object"], "text_completion");
    EXPECT_EQ(events[i]["id"], events[0]["id"]);
    EXPECT_FALSE(events[i].contains("usage"));  // not asked for
    text += events[i]["choices"][0]["text"].get<std::string>();
    EXPECT_EQ(events[i]["choices"][0]["finish_reason"],
              i + 1 == events.size() ? json("length") : json(nullptr));
  }
  EXPECT_EQ(text, grpc.text);
  EXPECT_EQ(fast_->WaitIdle().pages_used(), 0);
}

TEST_F(OpenAiE2eTest, StreamWithUsageEndsWithTheUsageChunkThenDone) {
  const json request = {{"prompt", "Once upon a time"}, {"max_tokens", 12}, {"temperature", 0},
                        {"stream", true}, {"stream_options", {{"include_usage", true}}},
                        {"kv_policy", "h2o"}, {"kv_budget", 8}};
  const HttpResponse s = Post(fast_->http_port(), "/v1/completions", request);
  ASSERT_EQ(s.status, 200) << s.body;
  const std::vector<json> events = SseEvents(s.body);
  ASSERT_GE(events.size(), 2u);
  for (size_t i = 0; i + 1 < events.size(); ++i) EXPECT_TRUE(events[i]["usage"].is_null());
  const json& usage = events.back();
  EXPECT_EQ(usage["choices"], json::array());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 12);
  EXPECT_EQ(usage["usage"]["kv"]["policy"], "h2o");
  EXPECT_EQ(usage["usage"]["kv"]["dtype"], "fp32");
  EXPECT_EQ(usage["usage"]["kv"]["budget_tokens"], 8);
  EXPECT_EQ(usage["usage"]["kv"]["tokens_kept"], 8);
  // kv_dtype per request: int4 rows on packed pages of the same pool.
  json int4 = request;
  int4["kv_dtype"] = "int4";
  int4["stream"] = false;
  int4.erase("stream_options");
  const HttpResponse r = Post(fast_->http_port(), "/v1/completions", int4);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  EXPECT_EQ(j["usage"]["kv"]["dtype"], "int4");
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);
}

// The text of a completions SSE body (every chunk's choices[0].text).
std::string SseText(const std::string& body) {
  std::string text;
  for (const json& e : SseEvents(body)) {
    if (!e["choices"].empty()) text += e["choices"][0]["text"].get<std::string>();
  }
  return text;
}

// The event-driven front (issue 33) keeps a connection across a stream: a streamed and a plain
// completion sent in one write on one connection (pipelined) are answered in order, the stream
// chunked and complete, the second after it; an HTTP/1.0 client (no chunked encoding) gets the
// stream as the body up to the close. All three carry the same greedy text.
TEST_F(OpenAiE2eTest, PipelinedRequestsAndHttp10StreamsGetWholeAnswers) {
  json request = {{"prompt", "Once upon a time"}, {"max_tokens", 10}, {"temperature", 0},
                  {"stream", true}};
  const std::string streamed = request.dump();
  request["stream"] = false;
  const std::string plain = request.dump();
  const auto post = [](const std::string& version, const std::string& body,
                       const std::string& extra) {
    return "POST /v1/completions " + version + "\r\nHost: 127.0.0.1\r\n" + extra +
           "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
           "\r\n\r\n" + body;
  };
  const std::string raw =
      HttpExchange(fast_->http_port(), post("HTTP/1.1", streamed, "") +
                                           post("HTTP/1.1", plain, "Connection: close\r\n"),
                   60s);
  // First response: chunked SSE; the second starts where its last chunk ends.
  const size_t head_end = raw.find("\r\n\r\n");
  ASSERT_NE(head_end, std::string::npos) << raw;
  EXPECT_EQ(raw.substr(0, 12), "HTTP/1.1 200");
  EXPECT_NE(raw.substr(0, head_end).find("Transfer-Encoding: chunked"), std::string::npos);
  EXPECT_EQ(raw.substr(0, head_end).find("Connection: close"), std::string::npos);
  std::string sse;
  size_t at = head_end + 4;
  for (;;) {
    const size_t eol = raw.find("\r\n", at);
    ASSERT_NE(eol, std::string::npos) << raw;
    const size_t n = std::stoul(raw.substr(at, eol - at), nullptr, 16);
    at = eol + 2;
    if (n == 0) {
      at += 2;
      break;
    }
    sse += raw.substr(at, n);
    at += n + 2;
  }
  const std::string second = raw.substr(at);
  ASSERT_EQ(second.substr(0, 12), "HTTP/1.1 200") << second;
  const std::string text =
      json::parse(second.substr(second.find("\r\n\r\n") + 4))["choices"][0]["text"];
  EXPECT_FALSE(text.empty());
  EXPECT_EQ(SseText(sse), text);

  const std::string old = HttpExchange(fast_->http_port(), post("HTTP/1.0", streamed, ""), 60s);
  const size_t old_end = old.find("\r\n\r\n");
  ASSERT_NE(old_end, std::string::npos) << old;
  EXPECT_EQ(old.substr(0, old_end).find("Transfer-Encoding"), std::string::npos);
  EXPECT_NE(old.substr(0, old_end).find("Connection: close"), std::string::npos);
  EXPECT_EQ(SseText(old.substr(old_end + 4)), text);
}

// An error object with `status` and `type` (and `param` when given).
void ExpectError(const HttpResponse& r, int status, const std::string& type,
                 const json& param = json()) {
  EXPECT_EQ(r.status, status) << r.body;
  EXPECT_NE(r.head.find("Content-Type: application/json"), std::string::npos) << r.head;
  const json j = json::parse(r.body, nullptr, false);
  ASSERT_TRUE(j.contains("error")) << r.body;
  EXPECT_EQ(j["error"]["type"], type) << r.body;
  EXPECT_FALSE(j["error"]["message"].get<std::string>().empty());
  EXPECT_TRUE(j["error"].contains("code"));
  if (!param.is_null()) {
    EXPECT_EQ(j["error"]["param"], param) << r.body;
  }
}

TEST_F(OpenAiE2eTest, BadRequestsGetErrorObjectsAndTheServerStaysUp) {
  const int port = fast_->http_port();
  ExpectError(Http(port, "POST", "/v1/completions", "{bad json"), 400, "invalid_request_error");
  for (const bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "stream" : "no stream");
    auto post = [&](json body) {
      body["stream"] = stream;
      return Post(port, "/v1/completions", body);
    };
    ExpectError(post({{"prompt", "x"}, {"n", 99}}), 400, "invalid_request_error", "n");
    ExpectError(post({{"prompt", "x"}, {"max_tokens", -5}}), 400, "invalid_request_error",
                "max_tokens");
    ExpectError(post({{"prompt", "x"}, {"kv_policy", "lru"}}), 400, "invalid_request_error");
    ExpectError(post({{"prompt", "x"}, {"kv_policy", "h2o:demote=fp8"}}), 400,
                "invalid_request_error");
    ExpectError(post({{"prompt", "x"}, {"kv_dtype", "fp8"}}), 400, "invalid_request_error");
    ExpectError(post({{"prompt", {1, 512}}}), 400, "invalid_request_error");  // outside vocab
    ExpectError(post({{"prompt", ""}}), 400, "invalid_request_error");
    ExpectError(post({{"prompt", "x"}, {"max_tokens", 100000}}), 400, "invalid_request_error");
    ExpectError(post({{"prompt", "x"}, {"temperature", -1}}), 400, "invalid_request_error");
    // Refused only once tokenized (the engine's "rejected" delta): still a 400, streamed or not.
    std::string lots;
    for (int i = 0; i < 100; ++i) lots += "Once upon a time ";
    ExpectError(post({{"prompt", lots}}), 400, "invalid_request_error");
    ExpectError(post({{"prompt", "x"}, {"model", "gpt-4"}}), 404, "not_found_error", "model");
    // No chat template: FAILED_PRECONDITION, 400 as vLLM answers.
    json chat = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"stream", stream}};
    ExpectError(Post(port, "/v1/chat/completions", chat), 400, "invalid_request_error");
  }
  ExpectError(Http(port, "GET", "/v1/nothing"), 404, "not_found_error");
  ExpectError(Http(port, "GET", "/v1/completions"), 405, "invalid_request_error");
  ExpectError(Http(port, "POST", "/v1/completions", std::string(1 << 20, ' ')), 413,
              "invalid_request_error");
  ExpectError(Post(port, "/detokenize", {{"tokens", {1, 99999}}}), 400, "invalid_request_error",
              "tokens");
  // Still serving, and every page back.
  EXPECT_EQ(Post(port, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}}).status, 200);
  EXPECT_EQ(fast_->WaitIdle().pages_used(), 0);
}

// Every way the HTTP front refuses a request (issue 42), one row each: the status, the OpenAI
// `param` and a part of the message, and that no message names a gRPC field or method (the
// engine's refusals name heavykv.v1 fields; ErrorBody puts them in OpenAI's terms). A
// generation refused before its first byte answers the same streamed or not, so those rows run
// both ways. Servers: the bundled model (no chat template), the same with API keys, the chat
// model (its rows skipped without it), and one without a tokenizer, with a chat template and a
// KV pool of 8 pages.
TEST_F(OpenAiE2eTest, EveryRefusalNamesOpenAiFields) {
  ServerProcess tokenless({"--model", testing::ModelPath(), "--threads", "1", "--kv-pages", "8",
                           "--chat-template",
                           testing::SourcePath("tests/data/chat_templates/smollm2.jinja")});
  ASSERT_TRUE(tokenless.ok() && tokenless.http_port() > 0) << tokenless.log();
  enum Server { kFast, kKeyed, kChat, kTokenless };
  struct Refusal {
    Server server;
    std::string method, path;
    std::string body;  // sent as it is (JSON, or not)
    int status;
    json param;        // null: the error's param must be null
    std::string says;  // a part of the message
  };
  const auto body = [](const json& j) { return j.dump(); };
  const json hi = {{{"role", "user"}, {"content", "hi"}}};
  std::string tokens_70;  // 70 tokens in under 448 bytes (64 tokens x the longest piece, 7)
  for (int i = 0; i < 70; ++i) tokens_70 += " a";
  const std::string c = "/v1/completions", chat = "/v1/chat/completions";
  const std::vector<Refusal> refusals = {
      // The front's own checks of the JSON.
      {kFast, "POST", c, "{bad json", 400, nullptr, "not valid JSON"},
      {kFast, "POST", c, "[1]", 400, nullptr, "must be an object"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"model", "gpt-4"}}), 404, "model",
       "`gpt-4` does not exist"},
      {kFast, "POST", c, body({{"max_tokens", 4}}), 400, "prompt", "prompt is required"},
      {kFast, "POST", c, body({{"prompt", 5}}), 400, "prompt", "prompt must be a string"},
      {kFast, "POST", c, body({{"prompt", {"a", "b"}}}), 400, "prompt", "more than one prompt"},
      {kFast, "POST", c, body({{"prompt", {1, -2}}}), 400, "prompt", "integers >= 0"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"max_tokens", -5}}), 400, "max_tokens",
       "max_tokens must be an integer in [0, "},
      {kFast, "POST", c, body({{"prompt", "x"}, {"max_completion_tokens", 0}}), 400,
       "max_completion_tokens", "needs echo or prompt_logprobs"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"temperature", "hot"}}), 400, "temperature",
       "temperature must be a number"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"top_p", true}}), 400, "top_p",
       "top_p must be a number"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"top_k", 1.5}}), 400, "top_k",
       "top_k must be an integer"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"seed", "x"}}), 400, "seed",
       "seed must be an integer"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"stop", 5}}), 400, "stop",
       "stop must be a string or a list of strings"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"n", 17}}), 400, "n", "n must be in [1, 16]"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"best_of", 3}}), 400, "best_of",
       "best_of is not served beyond n"},
      {kFast, "POST", chat, body({{"messages", hi}, {"echo", true}}), 400, "echo",
       "echo is served on /v1/completions only"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"presence_penalty", 2.5}}), 400,
       "presence_penalty", "presence_penalty must be in [-2, 2]"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"typical_p", 0.5}}), 400, "typical_p",
       "typical_p is not served"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"tools", {{{"type", "function"}}}}}), 400,
       "tools", "tools are served on /v1/chat/completions only"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"logprobs", 21}}), 400, "logprobs",
       "logprobs must be an integer in [0, 20]"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"stream", "yes"}}), 400, "stream",
       "stream must be true or false"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"stream_options", 5}}), 400, "stream_options",
       "must be an object"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"stream_options", {{"include_usage", 1}}}}), 400,
       "stream_options.include_usage", "must be true or false"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"kv_policy", 5}}), 400, "kv_policy",
       "kv_policy must be a string"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"kv_dtype", 8}}), 400, "kv_dtype",
       "kv_dtype must be a string"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"kv_budget", 0}}), 400, "kv_budget",
       "kv_budget must be a fraction in (0, 1]"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"kv_budget", 2.5}}), 400, "kv_budget",
       "kv_budget over 1 must be a whole number"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"kv_recent_fraction", "x"}}), 400,
       "kv_recent_fraction", "kv_recent_fraction must be a number"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"ignore_eos", "x"}}), 400, "ignore_eos",
       "ignore_eos must be true or false"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"stop_token_ids", {-1}}}), 400,
       "stop_token_ids", "stop_token_ids must hold integers"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"skip_special_tokens", 1}}), 400,
       "skip_special_tokens", "skip_special_tokens must be true or false"},
      {kFast, "POST", chat, body({{"max_tokens", 2}}), 400, "messages", "messages is required"},
      {kFast, "POST", chat, body({{"messages", {5}}}), 400, "messages[0]",
       "messages[0] must be an object"},
      {kFast, "POST", chat, body({{"messages", {{{"content", "hi"}}}}}), 400, "messages[0].role",
       "messages[0].role must be a string"},
      {kFast, "POST", chat, body({{"messages", {{{"role", "user"}, {"content", 5}}}}}), 400,
       "messages[0].content", "must be a string or a list of parts"},
      {kFast, "POST", chat,
       body({{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}}}), 400,
       "messages[0].content", "only {\"type\": \"text\""},
      {kFast, "POST", chat, body({{"messages", hi}, {"add_generation_prompt", "x"}}), 400,
       "add_generation_prompt", "must be true or false"},
      {kFast, "POST", chat, body({{"messages", hi}, {"logprobs", 1}}), 400, "logprobs",
       "logprobs must be true or false"},
      {kFast, "POST", chat, body({{"messages", hi}, {"top_logprobs", 3}}), 400, "top_logprobs",
       "needs \"logprobs\": true"},
      // The engine's checks before tokenizing (Submit).
      {kFast, "POST", c, body({{"prompt", ""}}), 400, "prompt", "the prompt is empty"},
      {kFast, "POST", c, body({{"prompt", std::string(500, 'x')}}), 400, "prompt",
       "the prompt has 500 bytes; this server takes at most 448"},
      {kFast, "POST", c, body({{"prompt", {1, 512}}}), 400, "prompt",
       "prompt token id 512 is outside the vocabulary [0, 512)"},
      {kFast, "POST", c, body({{"prompt", json(std::vector<int>(65, 1))}}), 400, "prompt",
       "the prompt has 65 tokens; this server takes at most 64"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"max_tokens", 100000}}), 400, "max_tokens",
       "max_tokens must be in [1, 512], got 100000"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"temperature", -1}}), 400, "temperature",
       "temperature must be >= 0"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"top_p", 0}}), 400, "top_p",
       "top_p must be in (0, 1]"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"top_k", 100000}}), 400, "top_k",
       "top_k must be in [0, 512]"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"stop", json(std::vector<std::string>(33, "a"))}}),
       400, "stop", "33 stop strings; at most 32"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"stop", ""}}), 400, "stop",
       "stop strings must not be empty"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"stop", std::string(300, 'a')}}), 400, "stop",
       "a stop string has 300 bytes"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"stop_token_ids", {600}}}), 400,
       "stop_token_ids", "stop token id 600 is outside the vocabulary"},
      {kFast, "POST", c,
       body({{"prompt", "x"}, {"stop_token_ids", json(std::vector<int>(257, 1))}}), 400,
       "stop_token_ids", "257 stop token ids; at most 256"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"kv_policy", "lru"}}), 400, "kv_policy",
       "unknown KV policy \"lru\""},
      {kFast, "POST", c, body({{"prompt", "x"}, {"kv_policy", "h2o:demote=fp8"}}), 400,
       "kv_policy", "invalid parameters in KV policy"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"kv_dtype", "fp8"}}), 400, "kv_dtype",
       "kv_dtype \"fp8\" is not one of"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"kv_recent_fraction", 0}}), 400,
       "kv_recent_fraction", "kv_recent_fraction must be in (0, 1]"},
      {kFast, "POST", chat, body({{"messages", hi}}), 400, "messages",
       "start it with --chat-template FILE, or send a prompt to /v1/completions"},
      // The engine's checks after tokenizing (a "rejected" delta).
      {kFast, "POST", c, body({{"prompt", tokens_70}}), 400, "prompt",
       "tokens; this server takes at most 64: shorten it"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"kv_dtype", "bf16"}}), 400, "kv_dtype",
       "kv_dtype bf16: this server's K/V pages are fp32"},
      {kFast, "POST", c, body({{"prompt", "Once"}, {"max_tokens", 512}}), 400, "max_tokens",
       "exceeds the context length 512: lower max_tokens to at most"},
      {kFast, "POST", c, body({{"prompt", "x"}, {"kv_policy", "sink"}, {"kv_budget", 3}}), 400,
       "kv_budget", "the sink policy needs a KV budget (kv_budget) over"},
      {kTokenless, "POST", c, body({{"prompt", {1, 2, 3}}, {"max_tokens", 200}}), 400,
       "max_tokens",
       "lower max_tokens, or choose an evicting KV policy (kv_policy) with a KV budget "
       "(kv_budget)"},
      {kTokenless, "POST", c,
       body({{"prompt", {1, 2, 3}}, {"max_tokens", 200}, {"kv_policy", "h2o"}, {"kv_budget", 1}}),
       400, "max_tokens", "or set a KV budget (kv_budget) under the sequence's length"},
      {kTokenless, "POST", c,
       body({{"prompt", {1, 2, 3}},
             {"max_tokens", 200},
             {"kv_policy", "window"},
             {"kv_budget", 100}}),
       400, "max_tokens", "lower max_tokens, or its KV budget (now 100 tokens)"},
      // No tokenizer: token ids, as HTTP sends them.
      {kTokenless, "POST", c, body({{"prompt", "hi"}}), 400, "prompt",
       "this server has no tokenizer: send token ids (\"prompt\": [ids]) instead of text"},
      {kTokenless, "POST", chat, body({{"messages", hi}}), 400, "messages",
       "send token ids to /v1/completions (\"prompt\": [ids])"},
      {kTokenless, "POST", "/tokenize", body({{"prompt", "hi"}}), 400, "prompt",
       "this server has no tokenizer"},
      {kTokenless, "POST", "/detokenize", body({{"tokens", {1}}}), 400, "tokens",
       "no tokenizer: it cannot detokenize"},
      // Chats the template or the limits refuse.
      {kChat, "POST", chat, body({{"messages", json::array()}}), 400, "messages",
       "the chat has no messages"},
      {kChat, "POST", chat, body({{"messages", {{{"role", ""}, {"content", "hi"}}}}}), 400,
       "messages[0].role", "the role must have 1 to 64 bytes"},
      // The other routes.
      {kFast, "POST", "/tokenize", body({{"prompt", "a"}, {"messages", hi}}), 400, "prompt",
       "either prompt or messages"},
      {kFast, "POST", "/tokenize", body(json::object()), 400, "prompt", "is required"},
      {kFast, "POST", "/detokenize", body(json::object()), 400, "tokens", "tokens is required"},
      {kFast, "POST", "/detokenize", body({{"tokens", {1, 99999}}}), 400, "tokens",
       "outside the vocabulary"},
      {kFast, "GET", "/v1/models/gpt-4", "", 404, "model", "`gpt-4` does not exist"},
      {kFast, "GET", "/v1/nothing", "", 404, nullptr, "no such route"},
      {kFast, "GET", c, "", 405, nullptr, "does not take that method"},
      {kFast, "POST", c, std::string(1 << 20, ' '), 413, nullptr, "the request body is over"},
      {kKeyed, "POST", c, body({{"prompt", "x"}}), 401, nullptr, "missing or invalid API key"},
      {kKeyed, "GET", "/metrics", "", 401, nullptr, "missing or invalid API key"},
  };
  // Names only gRPC has: none may reach an HTTP client.
  const std::vector<std::string> grpc_only = {"max_new_tokens", "prompt_token_ids", "kv.",
                                              "sampling.", "Generate"};
  for (const Refusal& r : refusals) {
    ServerProcess* server = r.server == kFast    ? fast_
                            : r.server == kKeyed ? keyed_
                            : r.server == kChat  ? ChatServer()
                                                 : &tokenless;
    if (server == nullptr) continue;  // no chat model here
    const bool generation = r.path == c || r.path == chat;
    json parsed = json::parse(r.body, nullptr, false);
    const bool both = generation && parsed.is_object() && !parsed.contains("stream");
    for (const bool stream : {false, true}) {
      if (stream && !both) break;
      std::string sent = r.body;
      if (stream) {
        parsed["stream"] = true;
        sent = parsed.dump();
      }
      SCOPED_TRACE(r.method + " " + r.path + " " + sent.substr(0, 160));
      const HttpResponse got = Http(server->http_port(), r.method, r.path, sent);
      EXPECT_EQ(got.status, r.status) << got.body;
      const json error = json::parse(got.body, nullptr, false);
      ASSERT_TRUE(error.is_object() && error.contains("error")) << got.body;
      EXPECT_EQ(error["error"]["param"], r.param) << got.body;
      const std::string message = error["error"]["message"].get<std::string>();
      EXPECT_NE(message.find(r.says), std::string::npos) << message;
      for (const std::string& name : grpc_only) {
        EXPECT_EQ(message.find(name), std::string::npos) << name << " in: " << message;
      }
    }
  }
  EXPECT_EQ(fast_->WaitIdle().pages_used(), 0);
  EXPECT_EQ(tokenless.WaitIdle().pages_used(), 0);
}

TEST_F(OpenAiE2eTest, ModelsHealthTokenize) {
  const int port = fast_->http_port();
  const HttpResponse m = Http(port, "GET", "/v1/models");
  ASSERT_EQ(m.status, 200);
  const json models = json::parse(m.body);
  EXPECT_EQ(models["object"], "list");
  EXPECT_EQ(models["data"][0]["id"], "stories");
  EXPECT_EQ(models["data"][0]["max_model_len"], 512);
  EXPECT_EQ(Http(port, "GET", "/health").status, 200);
  const HttpResponse t = Post(port, "/tokenize", {{"prompt", "Once upon a time"}});
  ASSERT_EQ(t.status, 200) << t.body;
  const json ids = json::parse(t.body);
  EXPECT_EQ(ids["count"], ids["tokens"].size());
  EXPECT_EQ(ids["tokens"][0], 1);  // BOS
  EXPECT_EQ(ids["max_model_len"], 512);
  json without_bos = ids["tokens"];
  without_bos.erase(0);
  const HttpResponse d = Post(port, "/detokenize", {{"tokens", without_bos}});
  ASSERT_EQ(d.status, 200) << d.body;
  EXPECT_EQ(json::parse(d.body)["prompt"], " Once upon a time");
}

// The header `name`'s value in a response head, or "" (names compared as sent).
std::string HeaderOf(const HttpResponse& r, const std::string& name) {
  const size_t at = r.head.find("\r\n" + name + ": ");
  if (at == std::string::npos) return "";
  const size_t from = at + name.size() + 4;
  return r.head.substr(from, r.head.find("\r\n", from) - from);
}

// The routes clients call beside the API (issue 42): one model by id (the Node client's
// models.retrieve), /version and /metrics as vLLM serves them; with keys only /health and
// /version stay open.
TEST_F(OpenAiE2eTest, ModelByIdVersionAndMetricsOnTheApiPort) {
  const int port = fast_->http_port();
  const HttpResponse m = Http(port, "GET", "/v1/models/stories");
  ASSERT_EQ(m.status, 200) << m.body;
  const json model = json::parse(m.body);
  EXPECT_EQ(model["id"], "stories");
  EXPECT_EQ(model["object"], "model");
  EXPECT_EQ(model["owned_by"], "heavykv");
  EXPECT_EQ(model["max_model_len"], 512);
  EXPECT_EQ(model, json::parse(Http(port, "GET", "/v1/models").body)["data"][0]);
  EXPECT_EQ(Http(port, "GET", "/v1/models/stor%69es?x=1").status, 200);  // escaped, a query
  const HttpResponse other = Http(port, "GET", "/v1/models/gpt-4");
  ExpectError(other, 404, "not_found_error", "model");
  EXPECT_EQ(json::parse(other.body)["error"]["code"], "model_not_found");
  ExpectError(Http(port, "GET", "/v1/models/"), 404, "not_found_error");
  ExpectError(Http(port, "POST", "/v1/models/stories"), 405, "invalid_request_error");

  const HttpResponse v = Http(port, "GET", "/version");
  ASSERT_EQ(v.status, 200);
  EXPECT_FALSE(json::parse(v.body)["version"].get<std::string>().empty()) << v.body;

  const HttpResponse scrape = Http(port, "GET", "/metrics");
  ASSERT_EQ(scrape.status, 200);
  EXPECT_EQ(HeaderOf(scrape, "Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  const std::map<std::string, double> api = ParseMetrics(scrape.body);
  EXPECT_EQ(api.count("heavykv_kv_cache_usage_ratio"), 1u) << scrape.body.substr(0, 500);
  EXPECT_EQ(api.size(), fast_->Metrics().size());  // the metrics port's series, all of them

  const int keyed = keyed_->http_port();
  ExpectError(Http(keyed, "GET", "/metrics"), 401, "authentication_error");
  ExpectError(Http(keyed, "GET", "/v1/models/stories260K.bin"), 401, "authentication_error");
  const std::string key = "Authorization: Bearer sk-test-key\r\n";
  EXPECT_EQ(Http(keyed, "GET", "/metrics", "", key).status, 200);
  EXPECT_EQ(Http(keyed, "GET", "/v1/models/stories260K.bin", "", key).status, 200);
  EXPECT_EQ(Http(keyed, "GET", "/version").status, 200);

  // CORS is off by default: no preflight, no header.
  ExpectError(Http(port, "OPTIONS", "/v1/completions", "",
                   "Origin: https://app.example.com\r\nAccess-Control-Request-Method: POST\r\n"),
              405, "invalid_request_error");
  const HttpResponse plain = Post(port, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 1}},
                                  "Origin: https://app.example.com\r\n");
  EXPECT_EQ(plain.status, 200);
  EXPECT_EQ(plain.head.find("Access-Control"), std::string::npos) << plain.head;
}

// --http-cors-origins: preflights from a listed origin are 204 with the Access-Control-Allow-*
// headers (no key needed), others 403; every answer to a listed origin (JSON, errors, SSE)
// carries Access-Control-Allow-Origin, and nothing else does. '*' allows any origin as "*".
TEST_F(OpenAiE2eTest, CorsPreflightsAndAllowedOriginsOnly) {
  ServerProcess cors({"--model", testing::ModelPath(), "--tokenizer", testing::TokenizerPath(),
                      "--threads", "1", "--api-key-file", keys_, "--http-cors-origins",
                      "https://app.example.com,http://localhost:3000"});
  ASSERT_TRUE(cors.ok() && cors.http_port() > 0) << cors.log();
  const int port = cors.http_port();
  const std::string app = "Origin: https://app.example.com\r\n";
  const std::string key = "Authorization: Bearer sk-test-key\r\n";
  const std::string preflight = "Access-Control-Request-Method: POST\r\n"
                                "Access-Control-Request-Headers: authorization, content-type\r\n";

  const HttpResponse ok = Http(port, "OPTIONS", "/v1/chat/completions", "", app + preflight);
  EXPECT_EQ(ok.status, 204) << ok.head;
  EXPECT_EQ(HeaderOf(ok, "Access-Control-Allow-Origin"), "https://app.example.com");
  EXPECT_EQ(HeaderOf(ok, "Access-Control-Allow-Methods"), "POST, OPTIONS");
  EXPECT_EQ(HeaderOf(ok, "Access-Control-Allow-Headers"), "authorization, content-type");
  EXPECT_EQ(HeaderOf(ok, "Access-Control-Max-Age"), "600");
  EXPECT_EQ(HeaderOf(ok, "Vary"), "Origin");
  EXPECT_EQ(HeaderOf(ok, "Content-Length"), "");  // 204: no body, no length
  EXPECT_TRUE(ok.body.empty());
  const HttpResponse models =
      Http(port, "OPTIONS", "/v1/models/anything", "",
           "Origin: http://localhost:3000\r\nAccess-Control-Request-Method: GET\r\n");
  EXPECT_EQ(models.status, 204);
  EXPECT_EQ(HeaderOf(models, "Access-Control-Allow-Origin"), "http://localhost:3000");
  EXPECT_EQ(HeaderOf(models, "Access-Control-Allow-Methods"), "GET, OPTIONS");
  EXPECT_EQ(HeaderOf(models, "Access-Control-Allow-Headers"), "Authorization, Content-Type");
  ExpectError(Http(port, "OPTIONS", "/v1/completions", "",
                   "Origin: https://evil.example.com\r\n" + preflight),
              403, "permission_error");
  ExpectError(Http(port, "OPTIONS", "/v1/nothing", "", app + preflight), 404, "not_found_error");

  // Answers to the listed origin carry the header: JSON, a route's error, a stream.
  const json body = {{"prompt", "Once"}, {"max_tokens", 3}};
  const HttpResponse json_answer = Post(port, "/v1/completions", body, app + key);
  EXPECT_EQ(json_answer.status, 200) << json_answer.body;
  EXPECT_EQ(HeaderOf(json_answer, "Access-Control-Allow-Origin"), "https://app.example.com");
  const HttpResponse refused = Post(port, "/v1/completions", body, app);
  EXPECT_EQ(refused.status, 401);
  EXPECT_EQ(HeaderOf(refused, "Access-Control-Allow-Origin"), "https://app.example.com");
  json streamed = body;
  streamed["stream"] = true;
  const HttpResponse sse = Post(port, "/v1/completions", streamed, app + key);
  EXPECT_EQ(sse.status, 200);
  EXPECT_EQ(HeaderOf(sse, "Content-Type"), "text/event-stream");
  EXPECT_EQ(HeaderOf(sse, "Access-Control-Allow-Origin"), "https://app.example.com");
  const std::vector<json> events = SseEvents(sse.body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(HeaderOf(Http(port, "GET", "/health", "", app), "Access-Control-Allow-Origin"),
            "https://app.example.com");
  // Another origin, or none: no header (the browser then keeps the answer from the page).
  for (const std::string& origin : {std::string("Origin: https://evil.example.com\r\n"),
                                    std::string()}) {
    const HttpResponse r = Post(port, "/v1/completions", body, origin + key);
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.head.find("Access-Control"), std::string::npos) << r.head;
  }

  ServerProcess any({"--model", testing::ModelPath(), "--threads", "1", "--http-cors-origins",
                     "*"});
  ASSERT_TRUE(any.ok() && any.http_port() > 0) << any.log();
  const HttpResponse star = Http(any.http_port(), "OPTIONS", "/v1/completions", "",
                                 "Origin: https://x.example\r\n" + preflight);
  EXPECT_EQ(star.status, 204);
  EXPECT_EQ(HeaderOf(star, "Access-Control-Allow-Origin"), "*");
  EXPECT_EQ(HeaderOf(star, "Vary"), "");
  EXPECT_EQ(HeaderOf(Http(any.http_port(), "GET", "/version", "", "Origin: https://x.example\r\n"),
                     "Access-Control-Allow-Origin"),
            "*");
}

TEST_F(OpenAiE2eTest, DisconnectMidStreamCancelsAndReturnsThePages) {
  const std::string cancelled = "heavykv_request_success_total{finish_reason=\"cancelled\"}";
  const double cancelled_before = slow_->Metrics()[cancelled];
  const std::string body =
      json({{"prompt", {1}}, {"max_tokens", 2000}, {"ignore_eos", true}, {"temperature", 0},
            {"stream", true}})
          .dump();
  const int fd = ConnectLoopback(slow_->http_port());
  ASSERT_GE(fd, 0);
  const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                              "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" +
                              body;
  ASSERT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL), ssize_t(request.size()));
  std::string got;
  char buf[4096];
  while (got.find("data: ") == std::string::npos) {  // the stream has started
    const ssize_t n = read(fd, buf, sizeof buf);
    ASSERT_GT(n, 0) << got;
    got.append(buf, size_t(n));
  }
  EXPECT_EQ(got.rfind("HTTP/1.1 200", 0), 0u) << got;
  EXPECT_GT(slow_->Stats().pages_used(), 0);
  close(fd);
  const v1::CacheStats s = slow_->WaitIdle();
  EXPECT_EQ(s.pages_used(), 0);
  EXPECT_EQ(s.sequences_running(), 0);
  EXPECT_EQ(slow_->Metrics()[cancelled], cancelled_before + 1);
}

// The same for a request that is not streamed: the client leaves while tokens are coming.
TEST_F(OpenAiE2eTest, DisconnectDuringANonStreamedRequestCancelsIt) {
  const std::string cancelled = "heavykv_request_success_total{finish_reason=\"cancelled\"}";
  const double cancelled_before = slow_->Metrics()[cancelled];
  const std::string body =
      json({{"prompt", {1}}, {"max_tokens", 2000}, {"ignore_eos", true}, {"temperature", 0}})
          .dump();
  const int fd = ConnectLoopback(slow_->http_port());
  ASSERT_GE(fd, 0);
  const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                              std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL), ssize_t(request.size()));
  for (auto until = std::chrono::steady_clock::now() + 10s;
       slow_->Stats().pages_used() == 0 && std::chrono::steady_clock::now() < until;) {
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_GT(slow_->Stats().pages_used(), 0);
  close(fd);
  const v1::CacheStats s = slow_->WaitIdle();
  EXPECT_EQ(s.pages_used(), 0);
  EXPECT_EQ(slow_->Metrics()[cancelled], cancelled_before + 1);
}

// `heavykv bench --http` drives the HTTP API with the same requests as gRPC: every request and
// token is counted, and a key is sent where the server asks for one.
TEST_F(OpenAiE2eTest, BenchOverHttpReportsEveryRequest) {
  const std::string args =
      " --concurrency 4 --requests 8 --prompt-tokens 16 --max-tokens 16 --policy h2o "
      "--kv-budget 8 --json";
  const std::string out =
      RunCapture(Bin() + " bench --server " + fast_->address() + " --http http://127.0.0.1:" +
                 std::to_string(fast_->http_port()) + args);
  EXPECT_NE(out.find("\"ok\":8,\"failed\":0,"), std::string::npos) << out;
  EXPECT_NE(out.find("\"prompt_tokens\":128,\"completion_tokens\":128,"), std::string::npos)
      << out;
  EXPECT_NE(out.find("\"api\":\"http\""), std::string::npos) << out;
  const std::string keyed =
      RunCapture(Bin() + " bench --server " + keyed_->address() + " --api-key sk-test-key" +
                 " --http http://127.0.0.1:" + std::to_string(keyed_->http_port()) + args);
  EXPECT_NE(keyed.find("\"ok\":8,\"failed\":0,"), std::string::npos) << keyed;
  const std::string refused =
      RunCapture(Bin() + " bench --server " + fast_->address() + " --http http://127.0.0.1:" +
                 std::to_string(fast_->http_port()) + args + " --temperature -1");
  EXPECT_NE(refused.find("\"errors\":{\"http_400\":8}"), std::string::npos) << refused;
}

// `heavykv bench --slow-connections` holds idle connections from other source addresses, probes
// GET /v1/models and samples the server process; none of it shows without the flags.
TEST_F(OpenAiE2eTest, BenchHoldsSlowConnectionsAndProbes) {
  const std::string base = Bin() + " bench --server " + fast_->address() +
                           " --http http://127.0.0.1:" + std::to_string(fast_->http_port()) +
                           " --concurrency 2 --requests 4 --prompt-tokens 8 --max-tokens 8 --json";
  const json out = json::parse(RunCapture(base + " --slow-connections 6 --slow-kind silent " +
                                          "--slow-sources 2 --probe-interval-ms 50 --server-pid " +
                                          std::to_string(fast_->pid())),
                               nullptr, false);
  ASSERT_TRUE(out.is_object()) << out;
  EXPECT_EQ(out["ok"], 4) << out;
  const json& flood = out["slow_flood"];
  EXPECT_EQ(flood["connections"], 6) << out;
  EXPECT_EQ(flood["sources"], 2) << out;
  EXPECT_EQ(flood["open_min"], 6) << out;  // no front drops a silent connection within 1 s
  EXPECT_EQ(flood["closed_by"].size(), 5u) << out;
  const json& probe = out["probe"];
  EXPECT_GE(probe["sent"], 1) << out;
  EXPECT_EQ(probe["ok"], probe["sent"]) << out;
  EXPECT_GT(probe["latency_ms"]["max"], 0) << out;
  const json& server = out["server"];
  EXPECT_EQ(server["pid"], fast_->pid()) << out;
  EXPECT_GT(server["before"]["rss_mb"], 0) << out;
  EXPECT_GT(server["after"]["threads"], 0) << out;

  const std::string plain = RunCapture(base);
  EXPECT_NE(plain.find("\"ok\":4,"), std::string::npos) << plain;
  for (const char* key : {"slow_flood", "probe", "server"}) {
    EXPECT_EQ(plain.find(key), std::string::npos) << key << ": " << plain;
  }
  EXPECT_NE(RunCapture(Bin() + " bench --server " + fast_->address() + " --slow-connections 1 2>&1")
                .find("--slow-connections needs --http"),
            std::string::npos);
}

// A long streamed completion on its own connection, read until its first event: the socket
// (the caller closes it), -1 on failure.
int StartLongStream(int port) {
  const std::string body = json({{"prompt", {1}}, {"max_tokens", 2000}, {"ignore_eos", true},
                                 {"temperature", 0}, {"stream", true}})
                               .dump();
  const int fd = ConnectLoopback(port, 30s);
  if (fd < 0) return -1;
  const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                              std::to_string(body.size()) + "\r\n\r\n" + body;
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) != ssize_t(request.size())) {
    close(fd);
    return -1;
  }
  return fd;
}

// Reads from `fd` until `text` has arrived (true) or the connection ends (false).
bool ReadUntil(int fd, const std::string& text, std::string* got) {
  char buf[4096];
  while (got->find(text) == std::string::npos) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) return false;
    got->append(buf, size_t(n));
  }
  return true;
}

// A full queue is 429; on SIGTERM /health turns 503, new requests get 503, and a stream cut at
// the end of the grace ends with finish_reason "abort" and [DONE].
TEST(OpenAiDrainTest, FullQueueIs429AndDrainIs503ThenAbort) {
  testing::TempDir dir;
  const std::string model = dir.File("slow.bin");
  RunCapture(Bin() +
             " make-model --dim 256 --hidden-dim 768 --layers 4 --heads 8 --kv-heads 4 "
             "--vocab 512 --seq-len 2048 --out " + model + " 2>&1");
  ServerProcess server({"--model", model, "--tokenizer", testing::TokenizerPath(), "--threads",
                        "1", "--max-running", "1", "--max-waiting", "1", "--kv-pages", "512",
                        "--grace", "0.5"});
  ASSERT_TRUE(server.ok() && server.http_port() > 0) << server.log();
  const int port = server.http_port();

  const int running = StartLongStream(port);
  ASSERT_GE(running, 0);
  std::string got;
  ASSERT_TRUE(ReadUntil(running, "data: ", &got)) << got;
  const int waiting = StartLongStream(port);  // no first delta until the running one ends
  ASSERT_GE(waiting, 0);
  for (auto until = std::chrono::steady_clock::now() + 10s;
       server.Stats().sequences_waiting() < 1 && std::chrono::steady_clock::now() < until;) {
    std::this_thread::sleep_for(5ms);
  }
  ExpectError(Post(port, "/v1/completions", {{"prompt", {1}}, {"max_tokens", 4}}), 429,
              "rate_limit_error");
  close(waiting);

  server.Signal(SIGTERM);
  ASSERT_TRUE(server.WaitForLog("draining")) << server.log();
  ExpectError(Http(port, "GET", "/health"), 503, "service_unavailable_error");
  ExpectError(Post(port, "/v1/completions", {{"prompt", {1}}, {"max_tokens", 4}}), 503,
              "service_unavailable_error");
  ASSERT_TRUE(ReadUntil(running, "data: [DONE]\n\n", &got)) << got;
  close(running);
  EXPECT_NE(got.find("\"finish_reason\":\"abort\""), std::string::npos) << got;
  EXPECT_EQ(server.SignalAndWait(SIGTERM, 10s), 0) << server.log();
}

TEST_F(OpenAiE2eTest, ApiKeysAreRequiredExceptForHealth) {
  const int port = keyed_->http_port();
  const json body = {{"prompt", "Once"}, {"max_tokens", 2}};
  ExpectError(Post(port, "/v1/completions", body), 401, "authentication_error");
  ExpectError(Post(port, "/v1/completions", body, "Authorization: Bearer wrong\r\n"), 401,
              "authentication_error");
  ExpectError(Http(port, "GET", "/v1/models"), 401, "authentication_error");
  EXPECT_EQ(Post(port, "/v1/completions", body, "Authorization: Bearer sk-test-key\r\n").status,
            200);
  EXPECT_EQ(Http(port, "GET", "/health").status, 200);
}

TEST_F(OpenAiE2eTest, ChatEqualsGrpcChatAndStreamsTheRoleFirst) {
  ServerProcess* chat = ChatServer();
  if (chat == nullptr) GTEST_SKIP() << "../shared/gguf/qwen-vocab.gguf is absent";
  v1::ChatRequest req;
  auto* m = req.add_messages();
  m->set_role("user");
  m->set_content("Hello there");
  req.set_max_new_tokens(24);
  req.set_ignore_eos(true);
  req.mutable_sampling()->set_temperature(0);
  grpc::ClientContext context;
  auto reader = chat->stub().Chat(&context, req);
  std::string grpc_text;
  for (v1::GenerateResponse r; reader->Read(&r);) grpc_text += r.text();
  ASSERT_TRUE(reader->Finish().ok());

  json body = {{"messages", {{{"role", "user"}, {"content", "Hello there"}}}},
               {"max_tokens", 24}, {"ignore_eos", true}, {"temperature", 0}};
  const HttpResponse r = Post(chat->http_port(), "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], grpc_text);
  EXPECT_EQ(j["usage"]["completion_tokens"], 24);

  body["stream"] = true;
  const HttpResponse s = Post(chat->http_port(), "/v1/chat/completions", body);
  ASSERT_EQ(s.status, 200) << s.body;
  const std::vector<json> events = SseEvents(s.body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events[0]["choices"][0]["delta"], json::parse(R"({"role":"assistant","content":""})"));
  std::string text;
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i]["object"], "chat.completion.chunk");
    const json& delta = events[i]["choices"][0]["delta"];
    if (i > 0) {
      EXPECT_FALSE(delta.contains("role"));
    }
    if (delta.contains("content")) text += delta["content"].get<std::string>();
  }
  EXPECT_EQ(events.back()["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(text, grpc_text);

  // Without max_tokens a chat runs to the context's end (ignore_eos) instead of being refused.
  body.erase("max_tokens");
  body["stream"] = false;
  const HttpResponse full = Post(chat->http_port(), "/v1/chat/completions", body);
  ASSERT_EQ(full.status, 200) << full.body;
  const json f = json::parse(full.body);
  EXPECT_EQ(f["usage"]["total_tokens"], 512);
  // An empty chat is a bad request.
  ExpectError(Post(chat->http_port(), "/v1/chat/completions", {{"messages", json::array()}}),
              400, "invalid_request_error");
  EXPECT_EQ(chat->WaitIdle().pages_used(), 0);
}

// logprobs over HTTP are gRPC's (the engine's) for the same greedy request; the tokens spell the
// text, streamed or not; top_logprobs hold the most likely tokens, the greedy one first.
TEST_F(OpenAiE2eTest, LogprobsEqualGrpcsAndSpellTheText) {
  v1::GenerateRequest g = Greedy("Once upon a time", 16);
  g.set_logprobs(true);
  g.set_top_logprobs(3);
  const Streamed grpc = Generate(fast_->stub(), g);
  ASSERT_TRUE(grpc.status.ok()) << grpc.status.error_message();
  const std::vector<float>& grpc_lp = grpc.logprobs;
  std::vector<int32_t> grpc_top;
  for (const v1::TopLogprobs& t : grpc.top_logprobs) {
    ASSERT_EQ(t.token_ids_size(), 3);
    grpc_top.push_back(t.token_ids(0));
  }
  ASSERT_EQ(grpc_lp.size(), 16u);
  EXPECT_EQ(grpc_top, grpc.ids);  // greedy: the most likely token is the one taken

  for (const bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "stream" : "no stream");
    const json request = {{"prompt", "Once upon a time"}, {"max_tokens", 16}, {"temperature", 0},
                          {"logprobs", 3}, {"stream", stream}};
    const HttpResponse r = Post(fast_->http_port(), "/v1/completions", request);
    ASSERT_EQ(r.status, 200) << r.body;
    std::vector<json> parts;
    if (stream) {
      for (const json& e : SseEvents(r.body)) parts.push_back(e["choices"][0]);
    } else {
      parts.push_back(json::parse(r.body)["choices"][0]);
    }
    std::string text, spelled;
    std::vector<float> lp;
    std::vector<int64_t> offsets;
    for (const json& c : parts) {
      text += c["text"].get<std::string>();
      const json& l = c["logprobs"];
      ASSERT_TRUE(l.is_object()) << c;
      ASSERT_EQ(l["tokens"].size(), l["token_logprobs"].size());
      ASSERT_EQ(l["tokens"].size(), l["top_logprobs"].size());
      for (size_t i = 0; i < l["tokens"].size(); ++i) {
        offsets.push_back(l["text_offset"][i].get<int64_t>());
        EXPECT_EQ(offsets.back(), int64_t(spelled.size()));  // ASCII here: bytes are characters
        spelled += l["tokens"][i].get<std::string>();
        lp.push_back(l["token_logprobs"][i].get<float>());
        EXPECT_EQ(l["top_logprobs"][i].size(), 3u);  // the greedy token is among the top 3
        EXPECT_FLOAT_EQ(l["top_logprobs"][i][l["tokens"][i].get<std::string>()].get<float>(),
                        lp.back());
      }
    }
    EXPECT_EQ(text, grpc.text);
    EXPECT_EQ(spelled, grpc.text);
    ASSERT_EQ(lp.size(), grpc_lp.size());
    for (size_t i = 0; i < lp.size(); ++i) EXPECT_FLOAT_EQ(lp[i], grpc_lp[i]) << i;
  }
  // Without logprobs the field is null.
  const HttpResponse plain =
      Post(fast_->http_port(), "/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}});
  EXPECT_TRUE(json::parse(plain.body)["choices"][0]["logprobs"].is_null()) << plain.body;
}

// A chat's logprobs.content: one entry per token whose bytes join into the text (a real BPE
// vocabulary: tokens may end inside a character); /tokenize of the same messages gives the
// prompt the chat was served with.
TEST_F(OpenAiE2eTest, ChatLogprobsAndChatTokenize) {
  ServerProcess* chat = ChatServer();
  if (chat == nullptr) GTEST_SKIP() << "../shared/gguf/qwen-vocab.gguf is absent";
  const json messages = {{{"role", "user"}, {"content", "Grüße, 世界"}}};
  const json body = {{"messages", messages}, {"max_tokens", 20}, {"ignore_eos", true},
                     {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 2},
                     {"stream", true}, {"stream_options", {{"include_usage", true}}}};
  const HttpResponse s = Post(chat->http_port(), "/v1/chat/completions", body);
  ASSERT_EQ(s.status, 200) << s.body;
  std::string text, bytes;
  size_t entries = 0;
  json usage;
  for (const json& e : SseEvents(s.body)) {
    if (e["choices"].empty()) {
      usage = e["usage"];
      continue;
    }
    const json& c = e["choices"][0];
    if (c["delta"].contains("content")) text += c["delta"]["content"].get<std::string>();
    if (c["logprobs"].is_null()) continue;
    for (const json& t : c["logprobs"]["content"]) {
      ++entries;
      for (const json& b : t["bytes"]) bytes += static_cast<char>(b.get<int>());
      EXPECT_LE(t["logprob"].get<double>(), 0.0);
      ASSERT_EQ(t["top_logprobs"].size(), 2u);
      EXPECT_EQ(t["top_logprobs"][0]["bytes"], t["bytes"]);  // greedy
      EXPECT_GE(t["top_logprobs"][0]["logprob"], t["top_logprobs"][1]["logprob"]);
    }
  }
  EXPECT_EQ(entries, 20u);
  EXPECT_EQ(bytes, text);
  ASSERT_TRUE(usage.is_object());

  const HttpResponse t = Post(chat->http_port(), "/tokenize", {{"messages", messages}});
  ASSERT_EQ(t.status, 200) << t.body;
  EXPECT_EQ(json::parse(t.body)["count"], usage["prompt_tokens"]);
  const HttpResponse no_prompt = Post(chat->http_port(), "/tokenize",
                                      {{"messages", messages}, {"add_generation_prompt", false}});
  ASSERT_EQ(no_prompt.status, 200) << no_prompt.body;
  EXPECT_LT(json::parse(no_prompt.body)["count"], usage["prompt_tokens"]);
  ExpectError(Post(chat->http_port(), "/tokenize", {{"messages", json::array()}}), 400,
              "invalid_request_error", "messages");
  // The bundled model has no chat template: a chat cannot be tokenized there.
  ExpectError(Post(fast_->http_port(), "/tokenize", {{"messages", messages}}), 400,
              "invalid_request_error", "messages");
  EXPECT_EQ(chat->WaitIdle().pages_used(), 0);
}

// A chat message or stream delta of a request with tools holds only OpenAI's fields, each of its
// type: content a string or null, reasoning_content a string or null, tool_calls well formed.
void ExpectChatShape(const json& m, bool delta) {
  for (const auto& [key, value] : m.items()) {
    EXPECT_TRUE(key == "role" || key == "content" || key == "reasoning_content" ||
                key == "tool_calls")
        << m;
  }
  if (m.contains("content")) EXPECT_TRUE(m["content"].is_string() || m["content"].is_null()) << m;
  if (m.contains("reasoning_content")) {
    EXPECT_TRUE(m["reasoning_content"].is_string() || m["reasoning_content"].is_null()) << m;
  }
  if (!m.contains("tool_calls")) return;
  for (const json& t : m["tool_calls"]) {
    if (delta) {
      EXPECT_TRUE(t["index"].is_number_integer()) << t;
    } else {
      EXPECT_EQ(t["id"].get<std::string>().substr(0, 5), "call_") << t;
      EXPECT_EQ(t["type"], "function") << t;
      EXPECT_TRUE(t["function"]["name"].is_string()) << t;
    }
    EXPECT_TRUE(t["function"]["arguments"].is_string()) << t;
  }
}

// Tools, tool-call history and chat_template_kwargs reach the chat template (the prompt grows by
// what the Qwen3 template writes for them), the response has OpenAI's shape whatever the random
// model writes, streamed or not; tool_choice "required" or a named tool makes it a call that
// parses back (arguments by the schema); a tool_choice naming no tool is a 400 naming it.
TEST_F(OpenAiE2eTest, ChatWithToolsIsWellFormed) {
  ServerProcess* chat = ChatServer();
  if (chat == nullptr) GTEST_SKIP() << "../shared/gguf/qwen-vocab.gguf is absent";
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "description": "Get the current weather in a city.", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");
  json body = {{"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}},
               {"max_tokens", 12}, {"temperature", 0}};
  const auto prompt_tokens = [&](const json& b) {
    const HttpResponse r = Post(chat->http_port(), "/v1/chat/completions", b);
    EXPECT_EQ(r.status, 200) << r.body;
    const json j = json::parse(r.body, nullptr, false);
    return j.is_object() ? j["usage"]["prompt_tokens"].get<int>() : -1;
  };
  const int plain = prompt_tokens(body);
  json no_thinking = body;
  no_thinking["chat_template_kwargs"] = {{"enable_thinking", false}};
  EXPECT_GT(prompt_tokens(no_thinking), plain);  // <think>\n\n</think>\n\n

  body["tools"] = tools;
  const HttpResponse r = Post(chat->http_port(), "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  EXPECT_GT(j["usage"]["prompt_tokens"].get<int>(), plain + 30);  // the tools' section
  // /tokenize (vLLM's chat form, with the tools) counts the same prompt.
  const HttpResponse t = Post(chat->http_port(), "/tokenize",
                              {{"messages", body["messages"]}, {"tools", tools}});
  ASSERT_EQ(t.status, 200) << t.body;
  EXPECT_EQ(json::parse(t.body)["count"], j["usage"]["prompt_tokens"]);
  const json& message = j["choices"][0]["message"];
  EXPECT_EQ(message["role"], "assistant");
  ExpectChatShape(message, /*delta=*/false);
  EXPECT_TRUE(message.contains("reasoning_content"));  // Qwen3's template thinks
  const std::string finish = j["choices"][0]["finish_reason"];
  EXPECT_TRUE(finish == "length" || finish == "stop" || finish == "tool_calls") << finish;

  body["stream"] = true;
  const HttpResponse s = Post(chat->http_port(), "/v1/chat/completions", body);
  ASSERT_EQ(s.status, 200) << s.body;
  const std::vector<json> events = SseEvents(s.body);
  ASSERT_GE(events.size(), 2u);
  for (const json& e : events) ExpectChatShape(e["choices"][0]["delta"], /*delta=*/true);
  EXPECT_EQ(events.back()["choices"][0]["finish_reason"], finish);

  // A conversation that called a tool and got its answer renders, and is longer.
  json history = body;
  history["stream"] = false;
  history["messages"].push_back(json::parse(R"({"role": "assistant", "content": null,
      "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather",
      "arguments": "{\"city\": \"Paris\"}"}}]})"));
  history["messages"].push_back(
      json::parse(R"({"role": "tool", "tool_call_id": "call_1", "content": "21 C, clear"})"));
  EXPECT_GT(prompt_tokens(history), j["usage"]["prompt_tokens"].get<int>() + 10);

  // tool_choice "required" and a named tool hold even a random model to a call of the template's
  // format with arguments by the tool's schema; the response parses it back.
  const json enum_tools = json::parse(R"([
      {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
       "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
       "required": ["city"], "additionalProperties": false}}},
      {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
       "properties": {"tz": {"const": "UTC"}}, "required": ["tz"],
       "additionalProperties": false}}}])");
  for (const json& choice : {json("required"), json::parse(R"({"type": "function",
                                                   "function": {"name": "get_time"}})")}) {
    // Without thinking: a random model would think for all its tokens (optional_reasoning).
    json forced = {{"messages", body["messages"]}, {"tools", enum_tools},
                   {"tool_choice", choice}, {"parallel_tool_calls", false},
                   {"max_tokens", 200}, {"temperature", 0},
                   {"chat_template_kwargs", {{"enable_thinking", false}}}};
    const HttpResponse f = Post(chat->http_port(), "/v1/chat/completions", forced);
    ASSERT_EQ(f.status, 200) << f.body;
    const json fj = json::parse(f.body);
    const json& fm = fj["choices"][0]["message"];
    ExpectChatShape(fm, /*delta=*/false);
    EXPECT_EQ(fj["choices"][0]["finish_reason"], "tool_calls") << f.body;
    ASSERT_EQ(fm["tool_calls"].size(), 1u) << f.body;
    EXPECT_TRUE(fm["content"].is_null()) << f.body;
    const std::string name = fm["tool_calls"][0]["function"]["name"];
    const json args = json::parse(fm["tool_calls"][0]["function"]["arguments"].get<std::string>());
    if (choice.is_object()) EXPECT_EQ(name, "get_time");
    if (name == "get_time") {
      EXPECT_EQ(args, json::parse(R"({"tz": "UTC"})"));
    } else {
      ASSERT_EQ(name, "get_weather");
      EXPECT_TRUE(args == json::parse(R"({"city": "Paris"})") ||
                  args == json::parse(R"({"city": "Oslo"})"))
          << args;
    }
    // Streamed: the same call, id and name first, then the argument fragments.
    forced["stream"] = true;
    const HttpResponse fs = Post(chat->http_port(), "/v1/chat/completions", forced);
    ASSERT_EQ(fs.status, 200) << fs.body;
    std::string streamed_name, streamed_args;
    const std::vector<json> fe = SseEvents(fs.body);
    for (const json& e : fe) {
      const json& d = e["choices"][0]["delta"];
      ExpectChatShape(d, /*delta=*/true);
      if (!d.contains("tool_calls")) continue;
      for (const json& t : d["tool_calls"]) {
        EXPECT_EQ(t["index"], 0);
        if (t["function"].contains("name")) {
          streamed_name += t["function"]["name"].get<std::string>();
        }
        streamed_args += t["function"]["arguments"].get<std::string>();
      }
    }
    EXPECT_EQ(streamed_name, name);
    EXPECT_EQ(json::parse(streamed_args), args);
    EXPECT_EQ(fe.back()["choices"][0]["finish_reason"], "tool_calls");
  }

  json bad = body;
  bad["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_time"}}}};
  ExpectError(Post(chat->http_port(), "/v1/chat/completions", bad), 400, "invalid_request_error",
              "tool_choice");
  EXPECT_EQ(chat->WaitIdle().pages_used(), 0);
}

// A template whose generation prompt opens a reasoning block (DeepSeek-R1's way): the random
// model's output, which never closes it, is all reasoning_content, whole and streamed alike.
TEST_F(OpenAiE2eTest, ReasoningOpenedByThePromptIsReasoningContent) {
  if (ChatServer() == nullptr) GTEST_SKIP() << "../shared/gguf/qwen-vocab.gguf is absent";
  const std::string source = dir_->File("r1.jinja");
  std::ofstream(source) << "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                           "<|im_end|>\n{% endfor %}<|im_start|>assistant\n<think>\n"
                           "{# a reasoning block ends with </think> #}";
  ServerProcess r1({"--model", chat_model_, "--threads", "1", "--chat-template", source});
  ASSERT_TRUE(r1.ok() && r1.http_port() > 0) << r1.log();
  json body = {{"messages", {{{"role", "user"}, {"content", "2+2?"}}}},
               {"max_tokens", 16}, {"ignore_eos", true}, {"temperature", 0}};
  const HttpResponse r = Post(r1.http_port(), "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json m = json::parse(r.body)["choices"][0]["message"];
  ASSERT_TRUE(m["reasoning_content"].is_string()) << m;
  EXPECT_FALSE(m["reasoning_content"].get<std::string>().empty()) << m;
  EXPECT_TRUE(m["content"].is_null()) << m;

  body["stream"] = true;
  const HttpResponse s = Post(r1.http_port(), "/v1/chat/completions", body);
  ASSERT_EQ(s.status, 200) << s.body;
  std::string reasoning;
  for (const json& e : SseEvents(s.body)) {
    const json& d = e["choices"][0]["delta"];
    if (d.contains("content")) EXPECT_EQ(d["content"], "") << d;  // only the role's chunk
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
  }
  EXPECT_EQ(reasoning, m["reasoning_content"]);
  EXPECT_EQ(r1.WaitIdle().pages_used(), 0);
}

// Echo (issue 44): the completion's text starts with the prompt's; with stream the first chunk
// carries it.
TEST_F(OpenAiE2eTest, EchoPutsThePromptBeforeTheCompletion) {
  const std::string prompt = "Once upon a time";
  const json plain = {{"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0}};
  const HttpResponse a = Post(fast_->http_port(), "/v1/completions", plain);
  ASSERT_EQ(a.status, 200) << a.body;
  const std::string completion = json::parse(a.body)["choices"][0]["text"];
  json echoed = plain;
  echoed["echo"] = true;
  const HttpResponse b = Post(fast_->http_port(), "/v1/completions", echoed);
  ASSERT_EQ(b.status, 200) << b.body;
  EXPECT_EQ(json::parse(b.body)["choices"][0]["text"], prompt + completion);
  echoed["stream"] = true;
  echoed["logprobs"] = 1;
  const HttpResponse c = Post(fast_->http_port(), "/v1/completions", echoed);
  ASSERT_EQ(c.status, 200) << c.body;
  const std::vector<json> events = SseEvents(c.body);
  ASSERT_FALSE(events.empty());
  const std::string first = events[0]["choices"][0]["text"];
  EXPECT_EQ(first.substr(0, prompt.size()), prompt);
  EXPECT_EQ(events[0]["choices"][0]["logprobs"]["token_logprobs"][0], nullptr);
  std::string text;
  size_t tokens = 0;
  for (const json& e : events) {
    text += e["choices"][0]["text"].get<std::string>();
    if (!e["choices"][0]["logprobs"].is_null()) {
      tokens += e["choices"][0]["logprobs"]["tokens"].size();
    }
  }
  EXPECT_EQ(text, prompt + completion);
  // A token-id prompt echoes its text.
  const HttpResponse ids = Post(fast_->http_port(), "/v1/completions",
                                {{"prompt", {1, 403, 407}}, {"max_tokens", 1}, {"echo", true}});
  ASSERT_EQ(ids.status, 200) << ids.body;
  const Streamed grpc = Generate(fast_->stub(), Greedy(prompt, 8));
  EXPECT_EQ(tokens, size_t(grpc.last.usage().prompt_tokens()) + 8);
}

// lm-evaluation-harness's scoring call: echo, max_tokens 0, logprobs N. The prompt comes back
// with its tokens' scores (null first), the same numbers gRPC's prompt_logprobs gives.
TEST_F(OpenAiE2eTest, EchoWithMaxTokensZeroScoresThePrompt) {
  const std::string prompt = "Once upon a time there was a little girl";
  const HttpResponse r =
      Post(fast_->http_port(), "/v1/completions",
           {{"prompt", prompt}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 2}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  const json& choice = j["choices"][0];
  EXPECT_EQ(choice["text"], prompt);
  EXPECT_EQ(choice["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 0);
  const json& l = choice["logprobs"];
  const size_t n = j["usage"]["prompt_tokens"];
  ASSERT_EQ(l["tokens"].size(), n);
  ASSERT_EQ(l["token_logprobs"].size(), n);
  ASSERT_EQ(l["top_logprobs"].size(), n);
  ASSERT_EQ(l["text_offset"].size(), n);
  EXPECT_EQ(l["token_logprobs"][0], nullptr);
  EXPECT_EQ(l["top_logprobs"][0], nullptr);
  for (size_t i = 1; i < n; ++i) {
    EXPECT_LE(l["text_offset"][i - 1].get<int64_t>(), l["text_offset"][i].get<int64_t>());
    const std::string token = l["tokens"][i];
    // Each token's text is the echoed text's at its offset (ASCII here: offsets are bytes).
    EXPECT_EQ(prompt.substr(l["text_offset"][i].get<size_t>(), token.size()), token) << i;
    EXPECT_GE(l["top_logprobs"][i].size(), 2u);
    EXPECT_LE(l["top_logprobs"][i].size(), 3u);
  }
  v1::GenerateRequest q = Greedy(prompt, 0);
  q.set_prompt_logprobs(2);
  const Streamed grpc = Generate(fast_->stub(), q);
  ASSERT_TRUE(grpc.status.ok()) << grpc.status.error_message();
  EXPECT_EQ(grpc.last.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_TRUE(grpc.ids.empty());
  ASSERT_EQ(size_t(grpc.prompt_logprobs.logprobs_size()), n);
  EXPECT_TRUE(std::isnan(grpc.prompt_logprobs.logprobs(0)));
  for (size_t i = 1; i < n; ++i) {
    EXPECT_FLOAT_EQ(l["token_logprobs"][i].get<float>(), grpc.prompt_logprobs.logprobs(int(i)));
  }
}

// vLLM's prompt_logprobs: per prompt token, null first, then {"<id>": {logprob, rank,
// decoded_token}} for the prompt token and the top N.
TEST_F(OpenAiE2eTest, PromptLogprobsAreVllmsFormat) {
  const std::string prompt = "Once upon a time";
  const HttpResponse r = Post(fast_->http_port(), "/v1/completions",
                              {{"prompt", prompt}, {"max_tokens", 2}, {"prompt_logprobs", 1}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  const json& p = j["choices"][0]["prompt_logprobs"];
  v1::TokenizeRequest tq;
  tq.set_text(prompt);
  v1::TokenizeResponse ids;
  grpc::ClientContext context;
  ASSERT_TRUE(fast_->stub().Tokenize(&context, tq, &ids).ok());
  ASSERT_EQ(p.size(), size_t(ids.token_ids_size()));
  EXPECT_EQ(p[0], nullptr);
  for (size_t i = 1; i < p.size(); ++i) {
    const std::string id = std::to_string(ids.token_ids(int(i)));
    ASSERT_TRUE(p[i].contains(id)) << p[i];
    EXPECT_GE(p[i][id]["rank"].get<int>(), 1);
    EXPECT_LE(p[i][id]["logprob"].get<double>(), 0.0);
    EXPECT_TRUE(p[i][id]["decoded_token"].is_string());
    EXPECT_LE(p[i].size(), 2u);
    for (const auto& [key, entry] : p[i].items()) {
      if (key != id) EXPECT_EQ(entry["rank"], 1);
    }
  }
  EXPECT_EQ(Post(fast_->http_port(), "/v1/completions",
                 {{"prompt", prompt}, {"prompt_logprobs", 1}, {"stream", true}})
                .status,
            400);
}

// A chat's prompt_logprobs sit at the top of the response (vLLM's place); max_tokens 0 scores
// the rendered prompt alone. A streamed echo with max_tokens 0 is the prompt in one chunk.
TEST_F(OpenAiE2eTest, ChatPromptLogprobsAndAStreamedScoringEcho) {
  const HttpResponse e = Post(fast_->http_port(), "/v1/completions",
                              {{"prompt", "Once upon"}, {"max_tokens", 0}, {"echo", true},
                               {"logprobs", 0}, {"stream", true}});
  ASSERT_EQ(e.status, 200) << e.body;
  const std::vector<json> events = SseEvents(e.body);
  ASSERT_EQ(events.size(), 1u) << e.body;
  EXPECT_EQ(events[0]["choices"][0]["text"], "Once upon");
  EXPECT_EQ(events[0]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(events[0]["choices"][0]["logprobs"]["token_logprobs"][0], nullptr);

  ServerProcess* chat = ChatServer();
  if (chat == nullptr) GTEST_SKIP() << "no ../shared/gguf/qwen-vocab.gguf";
  const HttpResponse r = Post(chat->http_port(), "/v1/chat/completions",
                              {{"messages", {{{"role", "user"}, {"content", "Hi there"}}}},
                               {"max_tokens", 0},
                               {"prompt_logprobs", 1}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  ASSERT_TRUE(j.contains("prompt_logprobs")) << r.body;
  EXPECT_EQ(j["prompt_logprobs"].size(), j["usage"]["prompt_tokens"].get<size_t>());
  EXPECT_EQ(j["prompt_logprobs"][0], nullptr);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 0);
  EXPECT_FALSE(j["choices"][0].contains("prompt_logprobs"));
}

}  // namespace
}  // namespace heavykv

namespace heavykv {
namespace {

// n choices over HTTP (issue 44): one prompt, n texts under their indices, each with its own
// finish_reason; choice 0 is the request with n = 1 and the same seed; usage counts the prompt
// once and every choice's tokens; a stream interleaves the choices, each ending with its finish
// reason, then one usage chunk and [DONE].
TEST_F(OpenAiE2eTest, NChoicesShareOnePromptAndStreamByIndex) {
  const int port = fast_->http_port();
  const json one = {{"prompt", "Once upon a time"}, {"max_tokens", 10}, {"seed", 21},
                    {"temperature", 1.0}, {"ignore_eos", true}};
  json three = one;
  three["n"] = 3;
  const HttpResponse a = Post(port, "/v1/completions", one);
  const HttpResponse b = Post(port, "/v1/completions", three);
  ASSERT_EQ(a.status, 200) << a.body;
  ASSERT_EQ(b.status, 200) << b.body;
  const json ja = json::parse(a.body), jb = json::parse(b.body);
  ASSERT_EQ(jb["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(jb["choices"][i]["index"], i);
    EXPECT_EQ(jb["choices"][i]["finish_reason"], "length");
  }
  EXPECT_EQ(jb["choices"][0]["text"], ja["choices"][0]["text"]);
  EXPECT_EQ(jb["usage"]["prompt_tokens"], ja["usage"]["prompt_tokens"]);
  EXPECT_EQ(jb["usage"]["completion_tokens"], 30);

  json streamed = three;
  streamed["stream"] = true;
  streamed["stream_options"] = {{"include_usage", true}};
  const HttpResponse s = Post(port, "/v1/completions", streamed);
  ASSERT_EQ(s.status, 200) << s.body;
  const std::vector<json> events = SseEvents(s.body);
  std::map<int, std::string> texts;
  std::map<int, int> finishes;
  std::vector<int> order;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    ASSERT_EQ(events[i]["choices"].size(), 1u);
    const json& c = events[i]["choices"][0];
    texts[c["index"].get<int>()] += c["text"].get<std::string>();
    order.push_back(c["index"].get<int>());
    if (!c["finish_reason"].is_null()) ++finishes[c["index"].get<int>()];
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(texts[i], jb["choices"][i]["text"]) << i;
    EXPECT_EQ(finishes[i], 1) << i;
  }
  EXPECT_NE(std::adjacent_find(order.begin(), order.end(),
                               [](int x, int y) { return x != y; }),
            order.end())
      << "the choices did not interleave";
  EXPECT_EQ(events.back()["usage"]["completion_tokens"], 30);
  EXPECT_EQ(events.back()["choices"], json::array());
}

// Chat with n: each choice is an assistant message of its own.
TEST_F(OpenAiE2eTest, ChatNChoices) {
  ServerProcess* chat = ChatServer();
  if (chat == nullptr) GTEST_SKIP() << "no ../shared/gguf/qwen-vocab.gguf";
  const json body = {{"messages", {{{"role", "user"}, {"content", "Hello"}}}},
                     {"max_tokens", 6}, {"n", 2}, {"seed", 3}};
  const HttpResponse r = Post(chat->http_port(), "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  ASSERT_EQ(j["choices"].size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["message"]["role"], "assistant");
    EXPECT_TRUE(j["choices"][i]["message"]["content"].is_string());
  }
}

}  // namespace
}  // namespace heavykv
