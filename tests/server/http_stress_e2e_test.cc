// The OpenAI HTTP front under connection load (issue 33), against the real binary on loopback:
// thousands of idle connections (half a request header, or nothing) held open by other clients
// must not keep a client from GET /v1/models or streamed completions from finishing, and leave
// nothing behind (KV pages, connections, threads) once they close. Where `serve --help` lists the
// connection caps, a client over its cap gets 429 and any client over the total cap 503, each
// with an OpenAI error body, while other clients are still served.
//
// The bounds are functional, not timings: a front with a thread per connection keeps the probe
// waiting for tens of seconds behind the flood, far past the 3 s allowed here.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "nlohmann/json.hpp"
#include "server/client/http_flood.h"
#include "server/client/process_sample.h"
#include "server/client/tcp_client.h"
#include "tests/server/server_harness.h"

namespace heavykv {
namespace {

using namespace std::chrono_literals;
using namespace heavykv::e2e;
using Clock = std::chrono::steady_clock;

// A blocking connection from `source` (an address of 127.0.0.0/8) to 127.0.0.1:port; -1 on
// failure.
int ConnectFrom(const std::string& source, int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in from{};
  from.sin_family = AF_INET;
  inet_pton(AF_INET, source.c_str(), &from.sin_addr);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from) != 0 ||
      connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

struct Answer {
  std::string bytes;    // all the server sent
  bool closed = false;  // the server closed the connection (not our deadline)
  Clock::duration took{};
  int status() const { return cli::ResponseStatus(bytes); }
  std::string body() const {
    const size_t at = bytes.find("\r\n\r\n");
    return at == std::string::npos ? "" : bytes.substr(at + 4);
  }
};

// Sends `request` on `fd` (none when empty) and reads until the server closes the connection or
// `limit` passes since the call; closes `fd`.
Answer Exchange(int fd, const std::string& request, std::chrono::milliseconds limit) {
  const Clock::time_point start = Clock::now(), until = start + limit;
  Answer a;
  if (fd >= 0 && (request.empty() || send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
                                         static_cast<ssize_t>(request.size()))) {
    for (;;) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now());
      pollfd p = {fd, POLLIN, 0};
      if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
      char buf[4096];
      const ssize_t n = recv(fd, buf, sizeof buf, 0);
      if (n <= 0) {
        a.closed = true;
        break;
      }
      a.bytes.append(buf, static_cast<size_t>(n));
    }
  }
  a.took = Clock::now() - start;
  if (fd >= 0) close(fd);
  return a;
}

const std::string kModels = "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

// Whether something (bytes or the end of the stream) is waiting on `fd`.
bool Readable(int fd) {
  pollfd p = {fd, POLLIN | POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0;
}

int64_t Threads(pid_t pid) {
  absl::StatusOr<cli::ProcessSample> s = cli::SampleProcess(pid);
  return s.ok() ? s->threads : -1;
}

TEST(HttpStressTest, SlowConnectionsDoNotStarveOtherClients) {
  // Before the server starts: it inherits the limit, and needs a file per connection too.
  const int64_t files = cli::RaiseFileLimit();
  const int slow = static_cast<int>(std::min<int64_t>(2000, files / 3));
  constexpr int kStreams = 16, kProbes = 10;
  ServerProcess server(
      {"--model", testing::ModelPath(), "--tokenizer", testing::TokenizerPath(), "--threads", "1"});
  ASSERT_TRUE(server.ok() && server.http_port() > 0) << server.log();
  const int port = server.http_port();
  ASSERT_EQ(Exchange(ConnectFrom("127.0.0.1", port), kModels, 10s).status(), 200);
  const int64_t threads_before = Threads(server.pid());

  // Two other clients (source addresses) hold the idle connections.
  absl::StatusOr<cli::TcpTarget> target =
      cli::ResolveHttpUrl("http://127.0.0.1:" + std::to_string(port));
  ASSERT_TRUE(target.ok()) << target.status();
  cli::SlowFlood half({*target, slow / 2, cli::SlowKind::kHalfHeader, {"127.0.0.2"}});
  cli::SlowFlood silent({*target, slow - slow / 2, cli::SlowKind::kSilent, {"127.0.0.3"}});
  ASSERT_TRUE(half.Start().ok());
  ASSERT_TRUE(silent.Start().ok());
  EXPECT_TRUE(half.WaitOpen(slow / 2, 20s)) << half.stats().open_now << " open";
  EXPECT_TRUE(silent.WaitOpen(slow - slow / 2, 20s)) << silent.stats().open_now << " open";

  // Streamed completions and probes of another client (127.0.0.1) meanwhile.
  const std::string completion_body =
      R"({"prompt":"Once upon a time","max_tokens":48,"temperature":0,"stream":true})";
  const std::string completion =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: "
      "application/json\r\nContent-Length: " +
      std::to_string(completion_body.size()) + "\r\n\r\n" + completion_body;
  std::vector<Answer> streams(kStreams);
  std::vector<std::thread> clients;
  for (int i = 0; i < kStreams; ++i) {
    clients.emplace_back(
        [&, i] { streams[i] = Exchange(ConnectFrom("127.0.0.1", port), completion, 25s); });
  }
  for (int i = 0; i < kProbes; ++i) {
    const Answer a = Exchange(ConnectFrom("127.0.0.1", port), kModels, 3s);
    EXPECT_TRUE(a.status() == 200 && a.closed)
        << "probe " << i << ": no whole answer within 3 s (" << slow
        << " idle connections of other clients): " << a.bytes.substr(0, 200);
    std::this_thread::sleep_for(200ms);
  }
  for (std::thread& t : clients) t.join();
  for (int i = 0; i < kStreams; ++i) {
    EXPECT_TRUE(streams[i].status() == 200 &&
                streams[i].bytes.find("data: [DONE]") != std::string::npos)
        << "stream " << i
        << " did not end with data: [DONE] within 25 s: " << streams[i].bytes.substr(0, 200);
  }
  const cli::SlowFloodStats half_stats = half.Stop(), silent_stats = silent.Stop();
  EXPECT_GT(half_stats.open_mean, 0);
  EXPECT_GT(silent_stats.open_mean, 0);

  // Nothing is left behind.
  EXPECT_TRUE(
      WaitUntil([&] { return MetricSum(server.Metrics(), "heavykv_kv_pages_used") == 0; }, 10s))
      << MetricSum(server.Metrics(), "heavykv_kv_pages_used") << " pages used (-1: no metric)";
  if (MetricSum(server.Metrics(), "heavykv_http_open_connections") >= 0) {
    EXPECT_TRUE(WaitUntil(
        [&] { return MetricSum(server.Metrics(), "heavykv_http_open_connections") == 0; }, 5s))
        << MetricSum(server.Metrics(), "heavykv_http_open_connections") << " connections open";
  }
  EXPECT_TRUE(WaitUntil([&] { return Threads(server.pid()) <= threads_before; }, 10s))
      << Threads(server.pid()) << " threads, " << threads_before << " before the flood";
  EXPECT_EQ(Exchange(ConnectFrom("127.0.0.1", port), kModels, 10s).status(), 200);
}

// The caps, where this build's server has them.
TEST(HttpStressTest, CapsRefuseWithStatusAndErrorBody) {
  const std::string help = RunCapture(Bin() + " serve --help 2>&1");
  if (help.find("--http-max-connections-per-client") == std::string::npos) {
    GTEST_SKIP() << "serve has no --http-max-connections-per-client";
  }
  ServerProcess server({"--model", testing::ModelPath(), "--tokenizer", testing::TokenizerPath(),
                        "--threads", "1", "--http-max-connections-per-client", "8",
                        "--http-max-connections", "20"});
  ASSERT_TRUE(server.ok() && server.http_port() > 0) << server.log();
  const int port = server.http_port();
  // A refusal: the status, an OpenAI error body, and the connection closed.
  const auto expect_refused = [](const Answer& a, int status, const std::string& what) {
    EXPECT_EQ(a.status(), status) << what << ": " << a.bytes;
    EXPECT_TRUE(a.closed) << what << " was not closed";
    const std::string body = a.body();
    const size_t open = body.find('{'), close = body.rfind('}');
    ASSERT_TRUE(open != std::string::npos && close != std::string::npos) << what << ": " << body;
    const nlohmann::json j = nlohmann::json::parse(body.substr(open, close - open + 1), nullptr,
                                                   /*allow_exceptions=*/false);
    ASSERT_TRUE(j.is_object() && j.contains("error") && j["error"].is_object()) << body;
    EXPECT_TRUE(j["error"].contains("message")) << body;
  };
  const auto expect_held = [](const std::vector<int>& fds, const std::string& what) {
    std::this_thread::sleep_for(500ms);
    for (size_t i = 0; i < fds.size(); ++i) {
      EXPECT_GE(fds[i], 0) << what << " " << i << " did not connect";
      EXPECT_FALSE(fds[i] >= 0 && Readable(fds[i])) << what << " " << i << " was answered";
    }
  };

  std::vector<int> held;  // silent connections
  for (int i = 0; i < 8; ++i) held.push_back(ConnectFrom("127.0.0.1", port));
  expect_held(held, "127.0.0.1's connection");
  expect_refused(Exchange(ConnectFrom("127.0.0.1", port), "", 5s), 429, "127.0.0.1's ninth");
  EXPECT_EQ(Exchange(ConnectFrom("127.0.0.2", port), kModels, 5s).status(), 200)
      << "another client is still served";

  std::this_thread::sleep_for(200ms);  // the refused and the answered connection are closed
  std::vector<int> more;               // up to 20 in all, 4 each from 127.0.0.3 .. 127.0.0.5
  for (int i = 0; i < 12; ++i) {
    more.push_back(ConnectFrom("127.0.0." + std::to_string(3 + i / 4), port));
  }
  expect_held(more, "connection");
  expect_refused(Exchange(ConnectFrom("127.0.0.6", port), "", 5s), 503, "the 21st connection");
  EXPECT_GE(MetricSum(server.Metrics(), "heavykv_http_refused_connections_total"), 2);

  for (int fd : held) close(fd);
  for (int fd : more) close(fd);
  if (MetricSum(server.Metrics(), "heavykv_http_open_connections") >= 0) {
    EXPECT_TRUE(WaitUntil(
        [&] { return MetricSum(server.Metrics(), "heavykv_http_open_connections") == 0; }, 5s));
  }
}

}  // namespace
}  // namespace heavykv
