// `heavykv serve`'s listening addresses (issue 42; docs/ARCHITECTURE.md, "The addresses of
// serve"): every address flag is checked alike before the model loads, and every port is bound
// exclusively, so a second server on a used port exits instead of sharing it with the first.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/server/server_harness.h"

namespace heavykv {
namespace {

using namespace heavykv::e2e;

// `heavykv serve` on the bundled model with `flags` after ServeToExit's defaults, run to its
// exit (the timeout ends a server that starts when it should not: a used port it shares).
Outcome Serve(const testing::TempDir& dir, const std::string& flags) {
  return ServeToExit(dir, testing::ModelPath(), flags);
}

TEST(ServeFlagsTest, BadAddressesAreFlagErrorsNamingTheFlag) {
  testing::TempDir dir;
  struct Case {
    std::string flags;
    std::string says;  // in the message, after "error: --flag 'value': "
  };
  const std::vector<Case> cases = {
      {"--listen 127.0.0.1:99999", "port 99999 is not in 0-65535"},
      {"--listen localhost", "no port"},
      {"--listen ''", "no port"},
      {"--listen 127.0.0.1:", "no port"},
      {"--listen :50051", "no host"},
      {"--listen ::1:50051", "must be in brackets"},
      {"--listen '[::1]'", "no port"},
      {"--listen '[::1:50051'", "no ']'"},
      {"--listen '[example.com]:1'", "not an IPv6 address"},
      {"--listen 127.0.0.1:-1", "is not in 0-65535"},
      {"--listen '127.0.0.1: 80'", "is not in 0-65535"},
      {"--listen 127.0.0.1:+80", "is not in 0-65535"},
      {"--listen 'bad_host!:80'", "not an IP address or a DNS name"},
      {"--http-address 127.0.0.1:65536", "port 65536 is not in 0-65535"},
      {"--http-address localhost", "no port"},
      {"--http-address example.com:8000", "not an IP address or localhost"},
      {"--metrics-address 0.0.0.0:abc", "port abc is not in 0-65535"},
      {"--metrics-address 127.0.0.1", "no port"},
  };
  for (const Case& c : cases) {
    const Outcome o = Serve(dir, c.flags);
    const std::string flag = c.flags.substr(0, c.flags.find(' '));
    EXPECT_EQ(o.code, "2\n") << c.flags << ": " << o.out;
    EXPECT_EQ(o.out.rfind("error: " + flag + " '", 0), 0u) << c.flags << ": " << o.out;
    EXPECT_NE(o.out.find(c.says), std::string::npos) << c.flags << ": " << o.out;
    EXPECT_NE(o.out.find("host:port (port 0-65535"), std::string::npos) << o.out;
    EXPECT_EQ(o.out.find("listening"), std::string::npos) << c.flags << ": " << o.out;
    EXPECT_LT(o.out.size(), 400u) << c.flags << ": " << o.out;  // one line, loaded nothing
  }
}

// A second server on a port the first one holds exits 1 with the bind's reason, for each of the
// three ports; the first one keeps serving every request (gRPC once let both listen, with
// SO_REUSEPORT, and split the clients between them).
TEST(ServeAddressTest, ASecondServerOnAUsedPortExits1) {
  ServerProcess first({"--model", testing::ModelPath(), "--tokenizer", testing::TokenizerPath(),
                       "--threads", "1"});
  ASSERT_TRUE(first.ok() && first.http_port() > 0) << first.log();
  testing::TempDir dir;
  const std::string used_grpc = first.address();
  const std::string used_http = "127.0.0.1:" + std::to_string(first.http_port());
  const std::string used_metrics = "127.0.0.1:" + std::to_string(first.metrics_port());
  for (const auto& [flags, flag] :
       {std::pair{"--listen " + used_grpc, std::string("--listen")},
        std::pair{"--http-address " + used_http, std::string("--http-address")},
        std::pair{"--metrics-address " + used_metrics, std::string("--metrics-address")}}) {
    const Outcome o = Serve(dir, flags);
    EXPECT_EQ(o.code, "1\n") << flags << ": " << o.out;
    EXPECT_NE(o.out.find("Address already in use; choose another " + flag), std::string::npos)
        << flags << ": " << o.out;
    EXPECT_EQ(o.out.find("listening"), std::string::npos) << flags << ": " << o.out;
  }
  // Every request reaches the first server, which is the only one left.
  for (int i = 0; i < 6; ++i) {
    Streamed g = Generate(first.stub(), Greedy("Once upon a time", 4));
    EXPECT_TRUE(g.status.ok()) << g.status.error_message();
  }
  EXPECT_EQ(first.Metrics()["heavykv_request_success_total{finish_reason=\"length\"}"], 6);
}

}  // namespace
}  // namespace heavykv
