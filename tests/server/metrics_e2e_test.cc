// The /metrics port of the real server, probed as an attacker or a careless client would: every
// request other than GET /metrics gets its status code and a short fixed body, the server
// survives each (gRPC and scrapes still work), and clients that connect and stall do not block
// a scrape. With civetweb, the first probe crashed the server and two stalled clients blocked
// scrapes for 30 s.
#include <fcntl.h>

#include "tests/server/server_harness.h"

namespace heavykv::e2e {
namespace {

struct HttpResponse {
  int status = 0;  // 0: no response (connection failed, closed or timed out)
  std::string head;
  std::string body;
};

// Sends `request` as is and reads the response until the server closes the connection (every
// response of the metrics server ends it) or 5 s pass.
HttpResponse Exchange(int port, const std::string& request) {
  HttpResponse r;
  const int fd = ConnectLoopback(port);
  if (fd < 0) return r;
  std::string response;
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) == ssize_t(request.size())) {
    char buf[4096];
    for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) response.append(buf, size_t(n));
  }
  close(fd);
  const size_t end = response.find("\r\n\r\n");
  if (end == std::string::npos || response.compare(0, 9, "HTTP/1.1 ") != 0) return r;
  r.status = std::atoi(response.c_str() + 9);
  r.head = response.substr(0, end + 2);
  r.body = response.substr(end + 4);
  return r;
}

// The value of header `name` (exact case, as the server writes it); "" if absent.
std::string Header(const HttpResponse& r, const std::string& name) {
  const size_t at = r.head.find("\r\n" + name + ": ");
  if (at == std::string::npos) return "";
  const size_t begin = at + name.size() + 4;
  return r.head.substr(begin, r.head.find("\r\n", begin) - begin);
}

class MetricsE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess({"--model", testing::ModelPath(), "--tokenizer",
                                 testing::TokenizerPath(), "--threads", "1"});
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(server_->ok()) << server_->log(); }

  // The server is alive: health SERVING, a generation completes, GET /metrics has the series.
  static void ExpectServing() {
    EXPECT_EQ(server_->Health(), HealthCheckResponse::SERVING) << server_->log();
    const Streamed out = Generate(server_->stub(), Greedy("Once upon a time", 4), 30s);
    EXPECT_TRUE(out.status.ok()) << out.status.error_message();
    EXPECT_EQ(out.ids.size(), 4u);
    const HttpResponse scrape = Exchange(server_->metrics_port(), Get("/metrics"));
    EXPECT_EQ(scrape.status, 200);
    EXPECT_EQ(Header(scrape, "Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
    const std::map<std::string, double> m = ParseMetrics(scrape.body);
    EXPECT_EQ(m.count("heavykv_kv_pages_total"), 1u) << scrape.body;
    EXPECT_GT(m.count("heavykv_generation_tokens_total"), 0u);
  }

  static std::string Get(const std::string& path) {
    return "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  }

  static ServerProcess* server_;
};

ServerProcess* MetricsE2eTest::server_ = nullptr;

TEST_F(MetricsE2eTest, GetMetricsAnswersTheTextFormat) {
  const HttpResponse r = Exchange(server_->metrics_port(), Get("/metrics?name=x"));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(Header(r, "Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(Header(r, "Content-Length"), std::to_string(r.body.size()));
  EXPECT_NE(r.body.find("# TYPE heavykv_kv_pages_total gauge\n"), std::string::npos) << r.body;
}

TEST_F(MetricsE2eTest, HeadAnswersHeadersOnly) {
  const HttpResponse r =
      Exchange(server_->metrics_port(), "HEAD /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(Header(r, "Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_GT(std::atoi(Header(r, "Content-Length").c_str()), 1000);  // the body GET would send
  EXPECT_EQ(r.body, "");
  ExpectServing();
}

struct Probe {
  const char* name;
  std::string request;
  int status;
  std::string body;  // exactly; the request is never echoed
  std::string allow = "";
};

TEST_F(MetricsE2eTest, EveryOtherRequestGetsItsStatusAndTheServerStaysUp) {
  const std::string kNotFound = "404 Not Found\n", kNotAllowed = "405 Method Not Allowed\n",
                    kBad = "400 Bad Request\n", kTooLarge = "413 Payload Too Large\n",
                    kHeadTooLarge = "431 Request Header Fields Too Large\n";
  const std::string host = "Host: 127.0.0.1\r\n";
  const std::vector<Probe> probes = {
      {"GET /", Get("/"), 404, kNotFound},
      {"GET /favicon.ico", Get("/favicon.ico"), 404, kNotFound},
      {"GET /metricsx (HTTP/1.0)", "GET /metricsx HTTP/1.0\r\n\r\n", 404, kNotFound},
      {"POST /metrics", "POST /metrics HTTP/1.1\r\n" + host + "Content-Length: 5\r\n\r\nhello",
       405, kNotAllowed, "GET, HEAD"},
      {"PUT /metrics", "PUT /metrics HTTP/1.1\r\n" + host + "\r\n", 405, kNotAllowed,
       "GET, HEAD"},
      {"DELETE /metrics", "DELETE /metrics HTTP/1.1\r\n" + host + "\r\n", 405, kNotAllowed,
       "GET, HEAD"},
      {"invalid request line", "<script>alert(1)</script>\r\n\r\n", 400, kBad},
      {"unknown method", "BREW /metrics HTTP/1.1\r\n" + host + "\r\n", 400, kBad},
      {"unknown version", "GET /metrics HTTP/9.9\r\n" + host + "\r\n", 400, kBad},
      {"huge header (64 KiB)",
       "GET /metrics HTTP/1.1\r\n" + host + "X-Big: " + std::string(64 << 10, 'a') + "\r\n\r\n",
       431, kHeadTooLarge},
      {"many headers (200 x 1 KiB)",
       [&] {
         std::string r = "GET /metrics HTTP/1.1\r\n" + host;
         for (int i = 0; i < 200; ++i) {
           r += "X-" + std::to_string(i) + ": " + std::string(1024, 'b') + "\r\n";
         }
         return r + "\r\n";
       }(),
       431, kHeadTooLarge},
      {"10 MB body declared on POST",
       "POST /metrics HTTP/1.1\r\n" + host + "Content-Length: 10000000\r\n\r\n", 413, kTooLarge},
      {"10 MB body declared on GET",
       "GET /metrics HTTP/1.1\r\n" + host + "Content-Length: 10000000\r\n\r\n", 413, kTooLarge},
      {"bad Content-Length", "GET /metrics HTTP/1.1\r\n" + host + "Content-Length: -1\r\n\r\n",
       400, kBad},
  };
  for (const Probe& p : probes) {
    SCOPED_TRACE(p.name);
    const HttpResponse r = Exchange(server_->metrics_port(), p.request);
    EXPECT_EQ(r.status, p.status) << r.head;
    EXPECT_EQ(r.body, p.body);
    EXPECT_EQ(Header(r, "Allow"), p.allow);
    EXPECT_EQ(Header(r, "Connection"), "close");
    ExpectServing();
  }
}

// Clients that connect and send nothing, or half a request line, each hold a worker until their
// timeout; while they do, a scrape still gets its answer (civetweb's two threads did not).
TEST_F(MetricsE2eTest, StalledConnectionsDoNotBlockAScrape) {
  std::vector<int> stalled;
  for (int i = 0; i < 12; ++i) {
    const int fd = ConnectLoopback(server_->metrics_port());
    ASSERT_GE(fd, 0);
    if (i % 2 == 1) {
      const std::string half = i % 4 == 1 ? "GET /met" : "GET /metrics HTTP/1.1\r\nHost: 1";
      ASSERT_EQ(send(fd, half.data(), half.size(), MSG_NOSIGNAL), ssize_t(half.size()));
    }
    stalled.push_back(fd);
  }
  std::this_thread::sleep_for(200ms);  // let the server accept them all and start reading
  for (int i = 0; i < 3; ++i) {
    const HttpResponse r = Exchange(server_->metrics_port(), Get("/metrics"));
    EXPECT_EQ(r.status, 200) << "scrape " << i << " with " << stalled.size() << " stalled clients";
    EXPECT_EQ(ParseMetrics(r.body).count("heavykv_kv_pages_total"), 1u);
  }
  // The stalled connections are closed by the server, not left open: each read ends (EOF, after a
  // 400 for the half requests) instead of running into this client's generous timeout.
  for (int fd : stalled) {
    const timeval tv = {30, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[256];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) {
    }
    EXPECT_EQ(n, 0) << "the server did not close a stalled connection: " << std::strerror(errno);
    close(fd);
  }
  ExpectServing();
}

TEST(MetricsE2eStartTest, MetricsAddressInUseFailsClearly) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string taken = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  const std::string out =
      RunCapture(Bin() + " serve --model " + testing::ModelPath() +
                 " --listen 127.0.0.1:0 --http-address '' --metrics-address " + taken +
                 " 2>&1; echo exit=$?");
  close(fd);
  EXPECT_NE(out.find("cannot listen for HTTP on " + taken), std::string::npos) << out;
  EXPECT_NE(out.find("--metrics-address"), std::string::npos) << out;
  EXPECT_EQ(out.find("exit=0"), std::string::npos) << out;
}

}  // namespace
}  // namespace heavykv::e2e
