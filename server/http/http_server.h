// HttpServer: a small HTTP/1.1 server (Debian's cpp-httplib) for the endpoints heavykv serves
// beside gRPC, hardened against clients that misbehave or attack:
//
//   HttpServer::Routes routes;
//   routes.Add("/metrics", "GET", [](const httplib::Request&, httplib::Response& res) {...});
//   absl::StatusOr<std::unique_ptr<HttpServer>> http =
//       HttpServer::Start("127.0.0.1:0", std::move(routes), HttpServerOptions());
//   (*http)->port();  // the port bound (a free one for port 0)
//   (*http)->Stop();  // or destroy it
//
// What it guarantees:
// - Routes match the exact path (the query string is ignored). An unknown path gets 404, a known
//   path with a method it does not serve 405 with an `Allow` header, a malformed request 400, a
//   declared body over `max_body_bytes` 413, each with a short fixed body (`error_body`): no
//   response echoes any part of the request. A route for GET also answers HEAD (headers only).
// - Bounded work per connection: a request's line, headers and body must all arrive within
//   `read_timeout` of its first byte and within `max_head_bytes + max_body_bytes` bytes, or the
//   connection is closed; an idle connection is closed after `keep_alive_timeout`. So a client
//   holds one of the `threads` workers for at most keep_alive_timeout + read_timeout (+ the
//   write timeout, + 1 s of draining what it sent after an error), however it behaves, and fewer
//   than `threads` stuck clients never delay anyone else.
// - A response of 400 or more ends the connection (the rest of a bad request is never parsed
//   as the next one).
// - Stop() (and the destructor) closes the listening socket and every open connection, and
//   returns when every thread has ended.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "httplib.h"

namespace heavykv::server {

struct HttpServerOptions {
  int threads = 8;                        // worker threads, each serving one connection at a time
  absl::Duration read_timeout = absl::Seconds(5);   // a whole request, first byte to last
  absl::Duration write_timeout = absl::Seconds(5);  // each write of a response
  int keep_alive_max_requests = 1;        // requests per connection (1: close after each)
  absl::Duration keep_alive_timeout = absl::Seconds(2);  // wait for a request's first byte
  size_t max_head_bytes = 16 << 10;       // request line + headers (one header line <= 8 KiB)
  size_t max_body_bytes = 64 << 10;
  // The body of the server's own error responses (404, 405, 413, a malformed request 400, a
  // handler's exception 500), made from the status alone so that it never echoes the request.
  // Empty: "<status> <reason>\n" as text/plain.
  std::function<void(int status, httplib::Response& res)> error_body;
};

class HttpServer {
 public:
  using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;

  // Exact paths to handlers by method ("GET", "POST", ...).
  class Routes {
   public:
    Routes& Add(const std::string& path, const std::string& method, Handler handler);

   private:
    friend class HttpServer;
    std::map<std::string, std::map<std::string, Handler>> by_path_;
  };

  // Binds `address` ("host:port" or "[v6]:port"; port 0 = any free port) and serves `routes`
  // from its own threads. INVALID_ARGUMENT for a malformed address, UNAVAILABLE when it cannot be
  // bound (in use, or not an address of this machine).
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& address,
                                                           Routes routes,
                                                           const HttpServerOptions& options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }
  void Stop();

  // From a handler, or the content provider it set (both run on the connection's worker): true
  // once the client of the request being served has gone (hung up, reset, shut its sending side
  // down, or Stop() closed the connection), so that a long response can stop its work. False on
  // any other thread.
  static bool ClientClosed();

 private:
  class Impl;
  HttpServer() = default;

  std::unique_ptr<Impl> impl_;
  std::thread listener_;
  int port_ = 0;
  bool stopped_ = false;
};

}  // namespace heavykv::server
