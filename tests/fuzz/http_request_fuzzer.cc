// Fuzzes the HTTP front's connection state machine (server/http/http_server.h) with the bytes a
// client sends: one in-process HttpServer (keep-alive, small head and body limits, short
// deadlines, a plain, an echo and a streamed route) gets each input over a fresh loopback
// connection, cut into up to three writes where the input's first two bytes say, then the end of
// the client's stream. The server must answer only with HTTP/1.1 responses, close the connection
// within its deadlines (a hang aborts), and give every connection back (open_connections 0).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "server/http/http_server.h"

namespace {

using heavykv::server::HttpExchange;
using heavykv::server::HttpRequest;
using heavykv::server::HttpResponse;
using heavykv::server::HttpServer;
using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "http_request_fuzzer: %s\n", what.c_str());
  std::abort();
}

// Three events, each from a job on the server's pool, then the end.
void StreamFrom(std::shared_ptr<HttpExchange> ex, int i) {
  if (i == 3) return ex->End();
  ex->Write(absl::StrCat("data: ", i, "\n\n"));
  ex->Post([ex, i] { StreamFrom(ex, i + 1); });
}

HttpServer& Server() {
  static HttpServer* server = [] {
    HttpServer::Routes routes;
    routes.Add("/hello", "GET", [](const HttpRequest& req, std::shared_ptr<HttpExchange> ex) {
      ex->Respond({200, "text/plain", {}, "hello " + req.path});
    });
    routes.Add("/echo", "POST", [](const HttpRequest& req, std::shared_ptr<HttpExchange> ex) {
      ex->Respond({200, "text/plain", {{"X-Header", req.Header("X-Header")}}, req.body});
    });
    routes.Add("/stream", "POST", [](const HttpRequest&, std::shared_ptr<HttpExchange> ex) {
      ex->StartStream({200, "text/event-stream", {}, ""});
      ex->Post([ex] { StreamFrom(ex, 0); });
    });
    heavykv::server::HttpServerOptions options;
    options.cpu_threads = 1;
    options.keep_alive_max_requests = 8;
    options.max_head_bytes = 2048;
    options.max_body_bytes = 4096;
    options.header_timeout = absl::Milliseconds(200);
    options.body_timeout = absl::Milliseconds(200);
    options.idle_timeout = absl::Milliseconds(200);
    options.write_timeout = absl::Milliseconds(500);
    auto s = HttpServer::Start("127.0.0.1:0", std::move(routes), options);
    if (!s.ok()) Die(s.status().ToString());
    return s->release();
  }();
  return *server;
}

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    Die("cannot connect");
  }
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  HttpServer& server = Server();
  if (size < 2) return 0;
  const size_t cut1 = 2 + data[0] % (size - 1), cut2 = 2 + data[1] % (size - 1);
  const std::string in(reinterpret_cast<const char*>(data + 2), size - 2);
  const size_t a = std::min(std::min(cut1, cut2) - 2, in.size());
  const size_t b = std::min(std::max(cut1, cut2) - 2, in.size());
  const int fd = Connect(server.port());
  for (const std::string& piece : {in.substr(0, a), in.substr(a, b - a), in.substr(b)}) {
    if (!piece.empty() && send(fd, piece.data(), piece.size(), MSG_NOSIGNAL) < 0) break;
  }
  shutdown(fd, SHUT_WR);
  // Everything the server says until it closes; its deadlines bound that well under 5 s.
  std::string out;
  const auto until = Clock::now() + std::chrono::seconds(5);
  for (;;) {
    const int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count());
    if (left <= 0) Die("the server kept a connection open past its deadlines");
    pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, left) <= 0) continue;
    char buf[4096];
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  // The client sent the first FIN (shutdown above), so an orderly close leaves its port in
  // TIME_WAIT for a minute: 60,000 inputs would run out of the ~28,000 ephemeral ports. The
  // server has closed by now; an abortive close (RST) frees the port at once.
  const linger abort_close{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &abort_close, sizeof abort_close);
  close(fd);
  if (!out.empty() && out.compare(0, 9, "HTTP/1.1 ") != 0) Die("not an HTTP/1.1 response: " + out);
  for (auto t = Clock::now() + std::chrono::seconds(5); server.Stats().open_connections != 0;) {
    if (Clock::now() > t) Die("a closed connection was not given back");
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return 0;
}
