// HttpServer: an event-driven HTTP/1.1 server for the endpoints heavykv serves beside gRPC (the
// OpenAI API, /metrics). One Asio event loop holds every connection (a socket, a buffer and a
// timer each, no thread); Boost.Beast parses the requests; handlers run on a small CPU pool and
// answer through an HttpExchange, now or later, from any thread:
//
//   HttpServer::Routes routes;
//   routes.Add("/metrics", "GET", [](const HttpRequest& req, std::shared_ptr<HttpExchange> ex) {
//     ex->Respond({.status = 200, .content_type = "text/plain", .body = "..."});
//   });
//   absl::StatusOr<std::unique_ptr<HttpServer>> http =
//       HttpServer::Start("127.0.0.1:0", std::move(routes), HttpServerOptions());
//   (*http)->port();  // the port bound (a free one for port 0)
//   (*http)->Stop();  // or destroy it
//
// The contract (routes, limits, deadlines, caps, keep-alive, threading) is docs/ARCHITECTURE.md
// "The HTTP server".
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/common/http_stats.h"

namespace heavykv::server {

// One request as a handler sees it (the whole body read).
struct HttpRequest {
  std::string method;  // "GET", "POST", ...; a HEAD request reaches the GET route as "HEAD"
  std::string target;  // as sent: path and query
  std::string path;    // the target without its query string
  int version = 11;    // 10 or 11
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::string remote_addr;  // the client's IP address
  int remote_port = 0;

  // The first value of header `name` (case-insensitive), or "".
  std::string Header(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;  // beside Content-Type/-Length
  std::string body;
};

// A handler's side of one request. Thread-safe and never blocks; calls from one request must be
// ordered by the caller. Calls after the connection has gone, or after the response is complete,
// do nothing.
class HttpExchange {
 public:
  virtual ~HttpExchange() = default;
  // The whole response.
  virtual void Respond(HttpResponse response) = 0;
  // A chunked response: `head`'s status, type and headers now (its body is ignored), then each
  // Write as one chunk, then End.
  virtual void StartStream(HttpResponse head) = 0;
  virtual void Write(std::string data) = 0;
  virtual void End() = 0;
  // `on_abort` runs once if the connection ends before the response is complete (the client went
  // away, a write made no progress for write_timeout, Stop()): on the server's I/O thread, or on
  // the caller's at once if that has already happened. Set it at most once.
  virtual void OnAbort(std::function<void()> on_abort) = 0;
  virtual bool aborted() const = 0;
  // Backpressure: the bytes given to Write (and Respond) that have not yet been written to the
  // socket, and `on_written`, run on the server's I/O thread each time a write of them completes
  // (so after every fall of queued_bytes()). Set it at most once.
  virtual size_t queued_bytes() const = 0;
  virtual void OnWritten(std::function<void()> on_written) = 0;
  // Runs `work` on the server's CPU pool (never on the caller's thread; nothing once the server
  // has stopped): for work a response needs later, e.g. formatting a stream's next events.
  virtual void Post(std::function<void()> work) = 0;
};

struct HttpServerOptions {
  int cpu_threads = 1;  // the pool that runs handlers and Post()ed work
  absl::Duration header_timeout = absl::Seconds(10);  // accept (or first byte) to end of head
  absl::Duration body_timeout = absl::Seconds(30);    // end of head to end of body
  absl::Duration idle_timeout = absl::Seconds(5);     // keep-alive: between requests
  absl::Duration write_timeout = absl::Seconds(30);   // a write making no progress (a stall)
  int keep_alive_max_requests = 1;                    // per connection (1: close after each)
  size_t max_head_bytes = 16 << 10;                   // request line + headers
  size_t max_body_bytes = 64 << 10;
  int max_connections = 16384;             // open at once, in all
  int max_connections_per_client = 4096;   // open at once from one client address
  // The body of the server's own error responses (400, 404, 405, 408, 413, 417, 429, 503, a
  // handler's exception 500), made from the status alone so that it never echoes the request.
  // Empty: "<status> <reason>\n" as text/plain.
  std::function<void(int status, HttpResponse& res)> error_body;
};

class HttpServer {
 public:
  using Handler = std::function<void(const HttpRequest&, std::shared_ptr<HttpExchange>)>;

  // Paths to handlers by method ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"). A path is
  // exact, or "/prefix/*": every path under /prefix/ (at least one more byte) that has no exact
  // route; the handler reads HttpRequest::path.
  class Routes {
   public:
    using Methods = std::map<std::string, Handler>;
    Routes& Add(const std::string& path, const std::string& method, Handler handler);
    // As Add, for a handler cheap enough for the I/O thread (no parsing, nothing that waits):
    // it runs there instead of on the CPU pool, so it answers while the pool is busy (/health).
    Routes& AddOnLoop(const std::string& path, const std::string& method, Handler handler);
    bool OnLoop(const Handler* handler) const { return on_loop_.count(handler) > 0; }
    // The handlers of `path` (exact first, then the longest prefix route), or null.
    const Methods* Find(std::string_view path) const;
    // path -> method -> handler
    const std::map<std::string, std::map<std::string, Handler>>& by_path() const {
      return by_path_;
    }

   private:
    std::map<std::string, std::map<std::string, Handler>> by_path_;
    std::set<const Handler*> on_loop_;  // into by_path_'s nodes, which moves keep in place
  };

  // Binds `address` ("host:port" or "[v6]:port"; port 0 = any free port) and serves `routes`.
  // INVALID_ARGUMENT for a malformed address or options, UNAVAILABLE when it cannot be bound
  // (in use, or not an address of this machine).
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& address,
                                                           Routes routes,
                                                           const HttpServerOptions& options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }
  HttpServerStats Stats() const;
  void Stop();

  class Impl;

 private:
  HttpServer() = default;

  std::shared_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace heavykv::server
