// HttpServer (server/http/http_server.h) in process, spoken to over raw loopback sockets: keep-alive
// and pipelining, chunked request bodies, Expect: 100-continue, the deadlines (408, idle close),
// the connection caps (429 per client address, 503 in all), streamed responses and their abort
// when the client goes or the server stops, HEAD, HTTP/1.0 and a throwing handler.
#include "server/http/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace heavykv::server {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A connected loopback socket from `source` (any 127.x.y.z), or -1.
int Connect(int port, const char* source = "127.0.0.1") {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in src{};
  src.sin_family = AF_INET;
  inet_pton(AF_INET, source, &src.sin_addr);
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src) != 0 ||
      connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof dst) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, const std::string& bytes) {
  return send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == ssize_t(bytes.size());
}

// Reads what arrives within `timeout` (or until the peer closes); `closed` says whether it did.
std::string ReadFor(int fd, std::chrono::milliseconds timeout, bool* closed = nullptr,
                    size_t enough = SIZE_MAX) {
  std::string out;
  const auto until = Clock::now() + timeout;
  if (closed != nullptr) *closed = false;
  while (out.size() < enough) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    if (left.count() <= 0) break;
    pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
    char buf[4096];
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      if (closed != nullptr) *closed = true;
      break;
    }
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// One response from `raw` at `at` (Content-Length or chunked); advances `at`. Status 0 if
// incomplete.
struct Parsed {
  int status = 0;
  std::string head, body;
};
Parsed NextResponse(const std::string& raw, size_t& at) {
  Parsed r;
  const size_t end = raw.find("\r\n\r\n", at);
  if (end == std::string::npos || raw.size() < at + 12) return r;
  r.head = raw.substr(at, end + 2 - at);
  size_t pos = end + 4;
  const size_t cl = r.head.find("Content-Length: ");
  if (cl != std::string::npos) {
    const size_t n = std::stoul(r.head.substr(cl + 16));
    if (raw.size() < pos + n) return r;
    r.body = raw.substr(pos, n);
    pos += n;
  } else if (r.head.find("Transfer-Encoding: chunked") != std::string::npos) {
    for (;;) {
      const size_t eol = raw.find("\r\n", pos);
      if (eol == std::string::npos) return r;
      const size_t n = std::stoul(raw.substr(pos, eol - pos), nullptr, 16);
      pos = eol + 2;
      if (raw.size() < pos + n + 2) return r;
      r.body += raw.substr(pos, n);
      pos += n + 2;
      if (n == 0) break;
    }
  } else {
    r.body = raw.substr(pos);
    pos = raw.size();
  }
  r.status = std::stoi(raw.substr(at + 9, 3));
  at = pos;
  return r;
}

std::string HeaderOf(const Parsed& r, const std::string& name) {
  const size_t at = r.head.find("\r\n" + name + ": ");
  if (at == std::string::npos) return "";
  const size_t from = at + name.size() + 4;
  return r.head.substr(from, r.head.find("\r\n", from) - from);
}

class HttpServerTest : public ::testing::Test {
 protected:
  void Start(HttpServerOptions options = HttpServerOptions()) {
    HttpServer::Routes routes;
    routes.Add("/hello", "GET", [](const HttpRequest& req, std::shared_ptr<HttpExchange> ex) {
      HttpResponse res;
      res.content_type = "text/plain";
      res.body = "hello " + req.target;
      ex->Respond(std::move(res));
    });
    routes.Add("/echo", "POST", [](const HttpRequest& req, std::shared_ptr<HttpExchange> ex) {
      HttpResponse res;
      res.content_type = "text/plain";
      res.body = req.body;
      ex->Respond(std::move(res));
    });
    routes.Add("/throw", "GET", [](const HttpRequest&, std::shared_ptr<HttpExchange>) {
      throw std::runtime_error("boom");
    });
    // Three chunks from another thread, 20 ms apart; "/stream?forever" writes until aborted.
    routes.Add("/stream", "GET", [this](const HttpRequest& req, std::shared_ptr<HttpExchange> ex) {
      ex->OnAbort([this] { ++aborts_; });
      HttpResponse head;
      head.content_type = "text/event-stream";
      ex->StartStream(std::move(head));
      const bool forever = req.target.find("forever") != std::string::npos;
      writers_.emplace_back([ex, forever] {
        for (int i = 0; forever ? !ex->aborted() : i < 3; ++i) {
          ex->Write(absl::StrCat("data: ", i, "\n\n"));
          std::this_thread::sleep_for(20ms);
        }
        if (!forever) ex->End();
      });
    });
    options.cpu_threads = 2;
    absl::StatusOr<std::unique_ptr<HttpServer>> s = HttpServer::Start("127.0.0.1:0",
                                                                      std::move(routes), options);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Stop();
    for (std::thread& t : writers_) t.join();
  }
  int port() const { return server_->port(); }

  // Waits (up to 5 s) until `pred` holds.
  template <typename P>
  bool Eventually(P pred) {
    for (auto until = Clock::now() + 5s; Clock::now() < until; std::this_thread::sleep_for(5ms)) {
      if (pred()) return true;
    }
    return pred();
  }

  std::unique_ptr<HttpServer> server_;
  std::vector<std::thread> writers_;
  std::atomic<int> aborts_{0};
};

TEST_F(HttpServerTest, KeepAliveAndPipelinedRequestsAreAnsweredInOrder) {
  HttpServerOptions options;
  options.keep_alive_max_requests = 10;
  Start(options);
  const int fd = Connect(port());
  ASSERT_GE(fd, 0);
  // Three requests in one write, the last one a POST with a body.
  ASSERT_TRUE(SendAll(fd,
                      "GET /hello?1 HTTP/1.1\r\nHost: x\r\n\r\n"
                      "GET /hello?2 HTTP/1.1\r\nHost: x\r\n\r\n"
                      "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nabcde"));
  const std::string raw = ReadFor(fd, 2s, nullptr, 3 * 60);
  size_t at = 0;
  const Parsed a = NextResponse(raw, at), b = NextResponse(raw, at), c = NextResponse(raw, at);
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(a.body, "hello /hello?1");
  EXPECT_EQ(b.body, "hello /hello?2");
  EXPECT_EQ(c.body, "abcde");
  EXPECT_EQ(HeaderOf(c, "Connection"), "");  // kept alive
  // The same connection serves one more, later.
  ASSERT_TRUE(SendAll(fd, "GET /hello?4 HTTP/1.1\r\nHost: x\r\n\r\n"));
  const std::string more = ReadFor(fd, 2s, nullptr, 40);
  at = 0;
  EXPECT_EQ(NextResponse(more, at).body, "hello /hello?4");
  close(fd);
}

TEST_F(HttpServerTest, ChunkedBodiesAreReadAndBoundedExpectContinueIsAnswered) {
  HttpServerOptions options;
  options.max_body_bytes = 64;
  Start(options);
  {
    const int fd = Connect(port());
    ASSERT_TRUE(SendAll(fd,
                        "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                        "3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n"));
    const std::string raw = ReadFor(fd, 2s, nullptr, 60);
    size_t at = 0;
    const Parsed r = NextResponse(raw, at);
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.body, "abcdefg");
    close(fd);
  }
  {  // A chunked body that grows past the limit: 413, then the connection ends.
    const int fd = Connect(port());
    ASSERT_TRUE(SendAll(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
                                std::string("40\r\n") + std::string(64, 'a') + "\r\n" +
                                "40\r\n" + std::string(64, 'b') + "\r\n0\r\n\r\n"));
    bool closed = false;
    const std::string raw = ReadFor(fd, 3s, &closed);
    EXPECT_EQ(raw.substr(0, 12), "HTTP/1.1 413");
    EXPECT_TRUE(closed);
    close(fd);
  }
  {  // Expect: 100-continue: "100 Continue" before the body is sent, then the answer.
    const int fd = Connect(port());
    ASSERT_TRUE(SendAll(fd,
                        "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
                        "Expect: 100-continue\r\n\r\n"));
    EXPECT_EQ(ReadFor(fd, 2s, nullptr, 25), "HTTP/1.1 100 Continue\r\n\r\n");
    ASSERT_TRUE(SendAll(fd, "wxyz"));
    const std::string raw = ReadFor(fd, 2s, nullptr, 60);
    size_t at = 0;
    EXPECT_EQ(NextResponse(raw, at).body, "wxyz");
    close(fd);
  }
  {  // ... and the final status instead when the body is too large; other expectations 417.
    const int fd = Connect(port());
    ASSERT_TRUE(SendAll(fd,
                        "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n"
                        "Expect: 100-continue\r\n\r\n"));
    EXPECT_EQ(ReadFor(fd, 2s).substr(0, 12), "HTTP/1.1 413");
    close(fd);
    const int fd2 = Connect(port());
    ASSERT_TRUE(SendAll(fd2, "GET /hello HTTP/1.1\r\nHost: x\r\nExpect: teapot\r\n\r\n"));
    EXPECT_EQ(ReadFor(fd2, 2s).substr(0, 12), "HTTP/1.1 417");
    close(fd2);
  }
}

TEST_F(HttpServerTest, DeadlinesAnswer408AndCloseIdleConnections) {
  HttpServerOptions options;
  options.header_timeout = absl::Milliseconds(300);
  options.body_timeout = absl::Milliseconds(300);
  options.idle_timeout = absl::Milliseconds(300);
  options.keep_alive_max_requests = 10;
  Start(options);
  const int silent = Connect(port());
  const int half_head = Connect(port());
  const int half_body = Connect(port());
  const int kept = Connect(port());
  ASSERT_TRUE(SendAll(half_head, "GET /hello HTTP/1.1\r\nHos"));
  ASSERT_TRUE(SendAll(half_body, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc"));
  ASSERT_TRUE(SendAll(kept, "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"));
  for (int fd : {silent, half_head, half_body}) {
    bool closed = false;
    const std::string raw = ReadFor(fd, 5s, &closed);
    size_t at = 0;
    const Parsed r = NextResponse(raw, at);
    EXPECT_EQ(r.status, 408) << raw;
    EXPECT_EQ(r.body, "408 Request Timeout\n");
    EXPECT_EQ(HeaderOf(r, "Connection"), "close");
    EXPECT_TRUE(closed);
    close(fd);
  }
  // The kept-alive connection gets its answer, then is closed silently once idle.
  bool closed = false;
  const std::string raw = ReadFor(kept, 5s, &closed);
  size_t at = 0;
  EXPECT_EQ(NextResponse(raw, at).status, 200);
  EXPECT_EQ(at, raw.size()) << "bytes after the response: " << raw.substr(at);
  EXPECT_TRUE(closed);
  close(kept);
  EXPECT_TRUE(Eventually([&] { return server_->Stats().open_connections == 0; }));
  const HttpServerStats s = server_->Stats();
  EXPECT_EQ(s.timeouts_header, 2);
  EXPECT_EQ(s.timeouts_body, 1);
  EXPECT_EQ(s.timeouts_idle, 1);
}

TEST_F(HttpServerTest, ConnectionCapsAnswer429PerClientAnd503InAll) {
  HttpServerOptions options;
  options.max_connections = 3;
  options.max_connections_per_client = 2;
  Start(options);
  std::vector<int> held = {Connect(port(), "127.0.0.1"), Connect(port(), "127.0.0.1")};
  ASSERT_TRUE(Eventually([&] { return server_->Stats().open_connections == 2; }));
  const int third = Connect(port(), "127.0.0.1");
  bool closed = false;
  std::string raw = ReadFor(third, 3s, &closed);
  size_t at = 0;
  Parsed r = NextResponse(raw, at);
  EXPECT_EQ(r.status, 429);
  EXPECT_EQ(r.body, "429 Too Many Requests\n");
  EXPECT_TRUE(closed);
  close(third);
  // Another address still gets in and is served ...
  held.push_back(Connect(port(), "127.0.0.2"));
  ASSERT_TRUE(SendAll(held.back(), "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"));
  raw = ReadFor(held.back(), 2s, nullptr, 40);
  at = 0;
  EXPECT_EQ(NextResponse(raw, at).status, 200);
  // ... until the server holds max_connections in all.
  const int fourth = Connect(port(), "127.0.0.3");
  raw = ReadFor(fourth, 3s, &closed);
  at = 0;
  r = NextResponse(raw, at);
  EXPECT_EQ(r.status, 503);
  EXPECT_TRUE(closed);
  close(fourth);
  for (int fd : held) close(fd);
  EXPECT_TRUE(Eventually([&] { return server_->Stats().open_connections == 0; }));
  EXPECT_EQ(server_->Stats().refused_per_client, 1);
  EXPECT_EQ(server_->Stats().refused_max_connections, 1);
  // Closed connections give their places back.
  const int again = Connect(port(), "127.0.0.1");
  ASSERT_TRUE(SendAll(again, "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"));
  raw = ReadFor(again, 2s, nullptr, 40);
  at = 0;
  EXPECT_EQ(NextResponse(raw, at).status, 200);
  close(again);
}

TEST_F(HttpServerTest, StreamsAreChunkedAndAbortedWhenTheClientGoesOrTheServerStops) {
  Start();
  {
    const int fd = Connect(port());
    ASSERT_TRUE(SendAll(fd, "GET /stream HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
    bool closed = false;
    const std::string raw = ReadFor(fd, 5s, &closed);
    size_t at = 0;
    const Parsed r = NextResponse(raw, at);
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(HeaderOf(r, "Transfer-Encoding"), "chunked");
    EXPECT_EQ(r.body, "data: 0\n\ndata: 1\n\ndata: 2\n\n");
    EXPECT_TRUE(closed);
    close(fd);
  }
  EXPECT_EQ(aborts_.load(), 0);
  {  // The client hangs up mid-stream: the exchange is aborted.
    const int fd = Connect(port());
    ASSERT_TRUE(SendAll(fd, "GET /stream?forever HTTP/1.1\r\nHost: x\r\n\r\n"));
    EXPECT_FALSE(ReadFor(fd, 2s, nullptr, 100).empty());
    close(fd);
    EXPECT_TRUE(Eventually([&] { return aborts_.load() == 1; }));
  }
  {  // Stop() with a stream in progress aborts it too, and returns.
    const int fd = Connect(port());
    ASSERT_TRUE(SendAll(fd, "GET /stream?forever HTTP/1.1\r\nHost: x\r\n\r\n"));
    EXPECT_FALSE(ReadFor(fd, 2s, nullptr, 100).empty());
    server_->Stop();
    EXPECT_EQ(aborts_.load(), 2);
    bool closed = false;
    ReadFor(fd, 2s, &closed);
    EXPECT_TRUE(closed);
    close(fd);
  }
}

TEST_F(HttpServerTest, HeadHttp10AndAThrowingHandler) {
  HttpServerOptions options;
  options.keep_alive_max_requests = 10;
  Start(options);
  {
    const int fd = Connect(port());
    ASSERT_TRUE(SendAll(fd, "HEAD /hello HTTP/1.1\r\nHost: x\r\n\r\n"));
    const std::string raw = ReadFor(fd, 500ms);
    EXPECT_NE(raw.find("Content-Length: 12\r\n"), std::string::npos) << raw;
    EXPECT_EQ(raw.substr(raw.size() - 4), "\r\n\r\n") << "HEAD got a body: " << raw;
    close(fd);
  }
  {  // HTTP/1.0 without keep-alive: the connection ends after the response.
    const int fd = Connect(port());
    ASSERT_TRUE(SendAll(fd, "GET /hello HTTP/1.0\r\n\r\n"));
    bool closed = false;
    const std::string raw = ReadFor(fd, 2s, &closed);
    size_t at = 0;
    const Parsed r = NextResponse(raw, at);
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(HeaderOf(r, "Connection"), "close");
    EXPECT_TRUE(closed);
    close(fd);
  }
  {
    const int fd = Connect(port());
    ASSERT_TRUE(SendAll(fd, "GET /throw HTTP/1.1\r\nHost: x\r\n\r\n"));
    const std::string raw = ReadFor(fd, 2s);
    size_t at = 0;
    const Parsed r = NextResponse(raw, at);
    EXPECT_EQ(r.status, 500);
    EXPECT_EQ(r.body, "500 Internal Server Error\n");
    close(fd);
  }
}

// A thousand connections that never finish their request hold no thread: another client is
// answered while they wait (a functional bound; the load test is `heavykv bench --slow-*`).
TEST_F(HttpServerTest, ManyStalledConnectionsDoNotDelayAnother) {
  Start();
  std::vector<int> stalled;
  for (int i = 0; i < 1000; ++i) {
    const int fd = Connect(port(), i % 2 == 0 ? "127.0.0.2" : "127.0.0.3");
    ASSERT_GE(fd, 0) << i;
    if (i % 3 == 0) {
      ASSERT_TRUE(SendAll(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Le"));
    }
    stalled.push_back(fd);
  }
  ASSERT_TRUE(Eventually([&] { return server_->Stats().open_connections == 1000; }));
  for (int i = 0; i < 5; ++i) {
    const int fd = Connect(port());
    ASSERT_TRUE(SendAll(fd, "GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
    const std::string raw = ReadFor(fd, 2s);
    size_t at = 0;
    EXPECT_EQ(NextResponse(raw, at).status, 200) << "with 1000 stalled connections";
    close(fd);
  }
  for (int fd : stalled) close(fd);
  EXPECT_TRUE(Eventually([&] { return server_->Stats().open_connections == 0; }));
}

// Exact routes, and "/prefix/*" for any path under /prefix/ without an exact route, the longest
// prefix first (issue 42: GET /v1/models/{id}).
TEST(HttpRoutesTest, ExactRoutesWinThenTheLongestPrefix) {
  HttpServer::Routes routes;
  const auto handler = [](const HttpRequest&, std::shared_ptr<HttpExchange>) {};
  routes.Add("/v1/models", "GET", handler);
  routes.Add("/v1/models/*", "GET", handler);
  routes.Add("/v1/models/special", "POST", handler);
  routes.Add("/v1/*", "PUT", handler);
  const auto methods = [&](const std::string& path) -> std::string {
    const HttpServer::Routes::Methods* m = routes.Find(path);
    return m == nullptr ? "none" : m->begin()->first;
  };
  EXPECT_EQ(methods("/v1/models"), "GET");
  EXPECT_EQ(methods("/v1/models/stories"), "GET");
  EXPECT_EQ(methods("/v1/models/a/b"), "GET");
  EXPECT_EQ(methods("/v1/models/special"), "POST");  // exact
  EXPECT_EQ(methods("/v1/models/"), "PUT");          // nothing after /v1/models/: /v1/*
  EXPECT_EQ(methods("/v1/other"), "PUT");
  EXPECT_EQ(methods("/v1/"), "none");
  EXPECT_EQ(methods("/v1"), "none");
  EXPECT_EQ(methods("/v2/models/x"), "none");
  EXPECT_EQ(methods("/v1/models*"), "PUT");          // '*' is only a route's suffix
}

}  // namespace
}  // namespace heavykv::server
