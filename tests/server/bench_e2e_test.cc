// End-to-end tests of `heavykv bench`'s loads for issue 41 at tiny sizes, against the real
// server on the bundled model: overflowing connections (a request and 200 KB more, then close)
// with a GET /health probe and a metrics scrape, and streams that stop reading for a while. They
// check that bench runs these loads and reports them, not how the server copes (its stress tests
// do that): a stall of 2 s is within every deadline the server has.
#include <gtest/gtest.h>

#include <string>

#include "nlohmann/json.hpp"
#include "tests/server/server_harness.h"

namespace heavykv {
namespace {

using namespace heavykv::e2e;
using nlohmann::json;

class BenchE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess({"--model", testing::ModelPath(), "--tokenizer",
                                 testing::TokenizerPath(), "--threads", "1"});
  }
  static void TearDownTestSuite() { delete server_; }
  void SetUp() override {
    ASSERT_TRUE(server_->ok() && server_->http_port() > 0) << server_->log();
  }

  // bench against the server with a small measured load and `flags`.
  static std::string Bench(const std::string& flags) {
    return RunCapture(Bin() + " bench --server " + server_->address() +
                      " --concurrency 2 --requests 4 --prompt-tokens 8 --max-tokens 8 " + flags);
  }
  static std::string HttpUrl() {
    return "http://127.0.0.1:" + std::to_string(server_->http_port());
  }

  static ServerProcess* server_;
};
ServerProcess* BenchE2eTest::server_ = nullptr;

TEST_F(BenchE2eTest, OverflowConnectionsAreCountedProbedAndFollowedByAScrape) {
  const std::string metrics =
      "http://127.0.0.1:" + std::to_string(server_->metrics_port()) + "/metrics";
  const json out =
      json::parse(Bench("--http " + HttpUrl() +
                        " --overflow-connections 20 --overflow-concurrency 4 --slow-sources 2 "
                        "--probe-path /health --probe-interval-ms 50 --metrics-url " +
                        metrics + " --settle-seconds 3 --json"),
                  nullptr, false);
  ASSERT_TRUE(out.is_object()) << out;
  EXPECT_EQ(out["ok"], 4) << out;
  const json& o = out["overflow"];
  EXPECT_EQ(o["connections"], 20) << out;
  EXPECT_EQ(o["concurrency"], 4) << out;
  EXPECT_EQ(o["extra_bytes"], 200 * 1024) << out;
  EXPECT_EQ(o["opened"].get<int>() + o["connect_failures"].get<int>(), 20) << out;
  int answered = 0;
  for (const auto& [status, n] : o["responses"].items()) answered += n.get<int>();
  EXPECT_EQ(answered, o["opened"]) << out;  // every connection that opened ended once
  for (const char* key : {"sent_all", "send_stalled", "closed_by_server", "seconds"}) {
    EXPECT_TRUE(o[key].is_number()) << key << ": " << out;
  }
  const json& probe = out["probe"];
  EXPECT_EQ(probe["path"], "/health") << out;
  EXPECT_GE(probe["sent"], 20) << out;  // for 3 s after the overflow at least, every 50 ms
  EXPECT_GT(probe["latency_ms"]["p99"], 0) << out;
  const json& m = out["metrics"];
  EXPECT_EQ(m["url"], metrics) << out;
  EXPECT_TRUE(m["idle"].is_boolean()) << out;
  EXPECT_TRUE(m.contains("settled_seconds")) << out;
  for (const char* series : {"heavykv_http_open_connections", "heavykv_requests_running",
                             "heavykv_requests_waiting", "heavykv_kv_pages_used"}) {
    EXPECT_TRUE(m["values"][series].is_number()) << series << ": " << out;
  }
  EXPECT_NE(Bench("--overflow-connections 1 2>&1").find("--overflow-connections needs --http"),
            std::string::npos);

  // --requests 0: the overflow alone.
  const json alone =
      json::parse(RunCapture(Bin() + " bench --server " + server_->address() + " --http " +
                             HttpUrl() + " --requests 0 --overflow-connections 2 --json"),
                  nullptr, false);
  ASSERT_TRUE(alone.is_object()) << alone;
  EXPECT_EQ(alone["requests"], 0) << alone;
  EXPECT_EQ(alone["overflow"]["connections"], 2) << alone;
}

// Stalled streams over gRPC and over HTTP: each reads 2 events, stops for 2 s, reads the rest,
// and its text is compared with the same request read at once.
TEST_F(BenchE2eTest, StalledStreamsResumeAndAreComparedWithTheReference) {
  const std::string stall = " --stall-streams 2 --stall-seconds 2 --stall-max-tokens 96";
  const json grpc = json::parse(
      Bench(stall + " --server-pid " + std::to_string(server_->pid()) + " --json"), nullptr, false);
  ASSERT_TRUE(grpc.is_object()) << grpc;
  EXPECT_EQ(grpc["ok"], 4) << grpc;
  const json& s = grpc["stall"];
  EXPECT_EQ(s["streams"], 2) << grpc;
  EXPECT_EQ(s["api"], "grpc") << grpc;
  EXPECT_EQ(s["stall_seconds"], 2) << grpc;
  EXPECT_EQ(s["top_logprobs"], 20) << grpc;
  EXPECT_EQ(s["reference_tokens"], 96) << grpc;
  EXPECT_EQ(s["matched"].get<int>() + s["differed"].get<int>() + s["cancelled"].get<int>() +
                s["failed"].get<int>(),
            2)
      << grpc;
  EXPECT_EQ(s["matched"], 2) << grpc;  // 2 s is within any server's deadlines
  EXPECT_GE(s["resume_ms"]["max"], 0) << grpc;
  EXPECT_GT(grpc["server"]["peak"]["rss_mb"], 0) << grpc;

  const std::string table = Bench("--http " + HttpUrl() + stall);
  EXPECT_NE(table.find("stalled streams 2 over HTTP (96 tokens, top 20 logprobs), 2 paused"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("2 matched the reference (96 tokens)"), std::string::npos) << table;
}

}  // namespace
}  // namespace heavykv
