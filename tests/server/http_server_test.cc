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

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <chrono>
#include <functional>
#include <mutex>
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
      Spawn([ex, forever] {
        for (int i = 0; forever ? !ex->aborted() : i < 3; ++i) {
          ex->Write(absl::StrCat("data: ", i, "\n\n"));
          std::this_thread::sleep_for(20ms);
        }
        if (!forever) ex->End();
      });
    });
    // Answers 300 ms later, from another thread: the handler is still running while the
    // client does what it does.
    routes.Add("/slow", "GET", [this](const HttpRequest& req, std::shared_ptr<HttpExchange> ex) {
      ex->OnAbort([this] { ++aborts_; });
      Spawn([ex, target = req.target] {
        std::this_thread::sleep_for(300ms);
        HttpResponse res;
        res.content_type = "text/plain";
        res.body = "slow " + target;
        ex->Respond(std::move(res));
      });
    });
    // 64 KiB chunks as fast as the client takes them, at most 256 KiB queued (queued_bytes()),
    // until aborted; counts the OnWritten calls.
    routes.Add("/flood", "GET", [this](const HttpRequest&, std::shared_ptr<HttpExchange> ex) {
      ex->OnAbort([this] { ++aborts_; });
      ex->OnWritten([this] { ++written_calls_; });
      HttpResponse head;
      head.content_type = "application/octet-stream";
      ex->StartStream(std::move(head));
      Spawn([this, ex] {
        while (!ex->aborted()) {
          if (ex->queued_bytes() >= (256u << 10)) {
            max_queued_ = std::max<size_t>(max_queued_, ex->queued_bytes());
            std::this_thread::sleep_for(1ms);
            continue;
          }
          ex->Write(std::string(64 << 10, 'x'));
        }
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
    std::lock_guard<std::mutex> lock(writers_mu_);
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
  // A thread of a handler's: handlers run on the server's CPU pool, two at a time.
  void Spawn(std::function<void()> work) {
    std::lock_guard<std::mutex> lock(writers_mu_);
    writers_.emplace_back(std::move(work));
  }

  std::mutex writers_mu_;
  std::vector<std::thread> writers_;  // guarded by writers_mu_
  std::atomic<int> aborts_{0};
  std::atomic<int> written_calls_{0};
  std::atomic<size_t> max_queued_{0};

  // Nothing left open: no connection, no client address counted, no refusal in flight.
  bool AllClosed() {
    const HttpServerStats s = server_->Stats();
    return s.open_connections == 0 && s.open_clients == 0 && s.refusing == 0;
  }
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

// Issue 41, F1: a request followed by more bytes than the read buffer holds (200 KB) while its
// handler runs. The response is still sent, the request that could not be read whole gets 413,
// and the connection ends through its close path: slot, per-client count and exchange freed. With
// the old server the connection vanished without an answer and held its slot for good, so a
// client with a cap of 2 was shut out after two such requests.
TEST_F(HttpServerTest, BytesPipelinedPastTheBufferAreAnswered413AndFreeTheSlot) {
  HttpServerOptions options;
  options.keep_alive_max_requests = 10;
  options.max_connections_per_client = 2;
  Start(options);
  const std::string flood(200 << 10, 'A');
  for (int i = 0; i < 4; ++i) {  // more than the cap, one after another
    const int fd = Connect(port());
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(SendAll(fd, "GET /slow?" + std::to_string(i) + " HTTP/1.1\r\nHost: x\r\n\r\n"));
    // The rest may block once the server stops reading: send it from a thread.
    std::thread sender([fd, &flood] { SendAll(fd, flood); });
    bool closed = false;
    const std::string raw = ReadFor(fd, 5s, &closed);
    sender.join();
    size_t at = 0;
    const Parsed first = NextResponse(raw, at), second = NextResponse(raw, at);
    EXPECT_EQ(first.status, 200) << raw.substr(0, 200);
    EXPECT_EQ(first.body, "slow /slow?" + std::to_string(i));
    EXPECT_EQ(second.status, 413);
    EXPECT_EQ(HeaderOf(second, "Connection"), "close");
    EXPECT_TRUE(closed);
    close(fd);
    ASSERT_TRUE(Eventually([&] { return AllClosed(); })) << "request " << i;
  }
  // The same flood behind an endless stream, then the client closes: the stream is aborted.
  const int fd = Connect(port());
  ASSERT_TRUE(SendAll(fd, "GET /stream?forever HTTP/1.1\r\nHost: x\r\n\r\n"));
  std::thread sender([fd, &flood] { SendAll(fd, flood); });
  EXPECT_FALSE(ReadFor(fd, 1s, nullptr, 100).empty());
  sender.join();
  close(fd);
  EXPECT_TRUE(Eventually([&] { return aborts_.load() == 1 && AllClosed(); }));
  EXPECT_GE(server_->Stats().overflows, 5);
  // The client's address is not shut out.
  const int again = Connect(port());
  ASSERT_TRUE(SendAll(again, "GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  const std::string raw = ReadFor(again, 2s);
  size_t at = 0;
  EXPECT_EQ(NextResponse(raw, at).status, 200);
  close(again);
}

// Every way a connection ends goes through its close: afterwards no connection, client address
// or refusal is counted, and an unfinished exchange was aborted.
TEST_F(HttpServerTest, EveryWayAConnectionEndsFreesItsSlot) {
  HttpServerOptions options;
  options.keep_alive_max_requests = 10;
  options.header_timeout = absl::Milliseconds(300);
  options.body_timeout = absl::Milliseconds(300);
  options.idle_timeout = absl::Milliseconds(300);
  options.write_timeout = absl::Milliseconds(500);
  options.max_connections_per_client = 1;
  Start(options);
  int aborts = 0;
  const auto ended = [&](const char* way, int aborted) {
    aborts += aborted;
    EXPECT_TRUE(Eventually([&] { return AllClosed() && aborts_.load() == aborts; }))
        << way << ": open " << server_->Stats().open_connections << ", clients "
        << server_->Stats().open_clients << ", aborts " << aborts_.load();
  };
  {  // The client closes mid-stream.
    const int fd = Connect(port());
    ASSERT_TRUE(SendAll(fd, "GET /stream?forever HTTP/1.1\r\nHost: x\r\n\r\n"));
    EXPECT_FALSE(ReadFor(fd, 1s, nullptr, 50).empty());
    close(fd);
    ended("client close", 1);
  }
  {  // The client resets mid-stream (SO_LINGER 0: RST, no FIN).
    const int fd = Connect(port());
    ASSERT_TRUE(SendAll(fd, "GET /stream?forever HTTP/1.1\r\nHost: x\r\n\r\n"));
    EXPECT_FALSE(ReadFor(fd, 1s, nullptr, 50).empty());
    linger l{1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    close(fd);
    ended("client reset", 1);
  }
  {  // The client resets while its handler runs (nothing written yet).
    const int fd = Connect(port());
    ASSERT_TRUE(SendAll(fd, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"));
    std::this_thread::sleep_for(50ms);
    linger l{1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    close(fd);
    ended("reset while handling", 1);
  }
  for (const char* partial : {"", "GET /hello HTTP/1.1\r\nHo",
                              "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\nab"}) {
    const int fd = Connect(port());  // header, header, body deadlines: 408
    ASSERT_TRUE(partial[0] == 0 || SendAll(fd, partial));
    EXPECT_EQ(ReadFor(fd, 3s).substr(0, 12), "HTTP/1.1 408");
    close(fd);
    ended("408", 0);
  }
  {  // Idle after a kept-alive answer.
    const int fd = Connect(port());
    ASSERT_TRUE(SendAll(fd, "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"));
    bool closed = false;
    ReadFor(fd, 3s, &closed);
    EXPECT_TRUE(closed);
    close(fd);
    ended("idle", 0);
  }
  {  // A client that stops reading: the write deadline, while writes are paced by queued_bytes().
    const int fd = Connect(port());
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    ASSERT_TRUE(SendAll(fd, "GET /flood HTTP/1.1\r\nHost: x\r\n\r\n"));
    ended("write deadline", 1);
    EXPECT_LE(max_queued_.load(), size_t(256 + 64) << 10);
    EXPECT_GT(written_calls_.load(), 0);
    close(fd);
  }
  {  // Over the per-client cap: refused, then closed.
    const int first = Connect(port());
    ASSERT_TRUE(Eventually([&] { return server_->Stats().open_connections == 1; }));
    const int second = Connect(port());
    EXPECT_EQ(ReadFor(second, 3s).substr(0, 12), "HTTP/1.1 429");
    close(second);
    close(first);
    ended("refused", 0);
  }
  {  // Stop() with a handler running and a stream in progress.
    const int a = Connect(port(), "127.0.0.1");
    const int b = Connect(port(), "127.0.0.2");
    ASSERT_TRUE(SendAll(a, "GET /stream?forever HTTP/1.1\r\nHost: x\r\n\r\n"));
    EXPECT_FALSE(ReadFor(a, 1s, nullptr, 50).empty());
    ASSERT_TRUE(SendAll(b, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"));
    std::this_thread::sleep_for(50ms);
    server_->Stop();
    aborts += 2;
    EXPECT_EQ(aborts_.load(), aborts);
    EXPECT_TRUE(AllClosed());
    close(a);
    close(b);
  }
}

// A client that half-closes its socket after its requests (shutdown(SHUT_WR)) still gets every
// answer, then the server closes (issue 41: EOF is not "gone" until a write fails).
TEST_F(HttpServerTest, HalfClosedClientsGetTheirAnswers) {
  HttpServerOptions options;
  options.keep_alive_max_requests = 10;
  Start(options);
  const int fd = Connect(port());
  ASSERT_TRUE(SendAll(fd,
                      "GET /slow?1 HTTP/1.1\r\nHost: x\r\n\r\n"
                      "GET /hello?2 HTTP/1.1\r\nHost: x\r\n\r\n"));
  shutdown(fd, SHUT_WR);
  bool closed = false;
  std::string raw = ReadFor(fd, 5s, &closed);
  // An interim 100 Continue (the server's check that a closed client is not gone) comes first.
  const std::string interim = "HTTP/1.1 100 Continue\r\n\r\n";
  ASSERT_EQ(raw.substr(0, interim.size()), interim);
  raw = raw.substr(interim.size());
  size_t at = 0;
  const Parsed a = NextResponse(raw, at), b = NextResponse(raw, at);
  EXPECT_EQ(a.status, 200) << raw;
  EXPECT_EQ(a.body, "slow /slow?1");
  EXPECT_EQ(b.body, "hello /hello?2");
  EXPECT_TRUE(closed);
  close(fd);
  EXPECT_TRUE(Eventually([&] { return AllClosed(); }));
  EXPECT_EQ(aborts_.load(), 0);
}

// A client that closes (both ways) while its answer is being made is gone: the interim answer
// to its end of stream draws a reset, which aborts the exchange before any response is ready.
TEST_F(HttpServerTest, AClientThatClosesBeforeItsAnswerIsAborted) {
  Start();
  const int fd = Connect(port());
  ASSERT_TRUE(SendAll(fd, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"));
  std::this_thread::sleep_for(20ms);
  close(fd);
  EXPECT_TRUE(Eventually([&] { return aborts_.load() == 1 && AllClosed(); }));
}

// Transfer codings other than chunked are 501 (not read as chunked); a head over the limit 431.
TEST_F(HttpServerTest, UnsupportedTransferCodingIs501AndALongHead431) {
  HttpServerOptions options;
  options.max_head_bytes = 1024;
  Start(options);
  for (const char* coding : {"gzip, chunked", "gzip", "chunked, chunked"}) {
    const int fd = Connect(port());
    ASSERT_TRUE(SendAll(fd, std::string("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: ") +
                                coding + "\r\n\r\n3\r\nabc\r\n0\r\n\r\n"));
    const std::string raw = ReadFor(fd, 2s);
    EXPECT_EQ(raw.substr(0, 12), "HTTP/1.1 501") << coding << ": " << raw;
    close(fd);
  }
  const int fd = Connect(port());
  ASSERT_TRUE(SendAll(fd, "GET /hello HTTP/1.1\r\nHost: x\r\nX-Pad: " + std::string(2000, 'p') +
                              "\r\n\r\n"));
  EXPECT_EQ(ReadFor(fd, 2s).substr(0, 12), "HTTP/1.1 431");
  close(fd);
  EXPECT_TRUE(Eventually([&] { return AllClosed(); }));
}

// More requests pipelined than a connection serves (keep_alive_max_requests): the answers sent
// reach a client that reads them late, and the close is orderly (no reset that would drop them).
TEST_F(HttpServerTest, TheLastRequestsCloseLetsTheClientReadEveryAnswer) {
  HttpServerOptions options;
  options.keep_alive_max_requests = 100;
  Start(options);
  const int fd = Connect(port());
  std::string requests;
  for (int i = 0; i < 150; ++i) {
    requests += "GET /hello?" + std::to_string(i) + " HTTP/1.1\r\nHost: x\r\n\r\n";
  }
  ASSERT_TRUE(SendAll(fd, requests));
  std::this_thread::sleep_for(500ms);  // the server has answered and closed by now
  std::string raw;
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof buf, 0)) > 0) raw.append(buf, static_cast<size_t>(n));
  EXPECT_EQ(n, 0) << "recv failed: " << strerror(errno);  // orderly end, not a reset
  size_t at = 0;
  int answered = 0;
  for (Parsed r; (r = NextResponse(raw, at)).status == 200; ++answered) {
    EXPECT_EQ(r.body, "hello /hello?" + std::to_string(answered));
  }
  EXPECT_EQ(answered, 100);
  close(fd);
  EXPECT_TRUE(Eventually([&] { return AllClosed(); }));
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
