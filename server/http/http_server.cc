#include "server/http/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"

namespace heavykv::server {
namespace {

using Clock = std::chrono::steady_clock;

// The connection a worker thread is serving (-1: none), for HttpServer::ClientClosed().
thread_local int t_connection_fd = -1;

constexpr size_t kMaxDrainBytes = 4 << 20;  // read and dropped after an error, at most
constexpr auto kMaxDrainTime = std::chrono::seconds(1);

int Millis(Clock::duration d) {
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(d).count();
  return static_cast<int>(std::clamp<int64_t>(ms, 0, INT32_MAX));
}

Clock::duration ToChrono(absl::Duration d) { return absl::ToChronoMicroseconds(d); }

// Waits until `fd` has `events` or `deadline` passes; false on timeout, error or hang-up.
bool WaitFor(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p = {fd, events, 0};
    const int n = poll(&p, 1, Millis(deadline - Clock::now()));
    if (n < 0 && errno == EINTR) continue;
    return n > 0 && (p.revents & events) != 0;
  }
}

const char* StatusText(int status) {
  switch (status) {
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 414: return "URI Too Long";
    case 416: return "Range Not Satisfiable";
    case 417: return "Expectation Failed";
    case 500: return "Internal Server Error";
    default: return "Error";
  }
}

void SocketAddress(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  auto* sa = reinterpret_cast<sockaddr*>(&addr);
  if ((peer ? getpeername(fd, sa, &len) : getsockname(fd, sa, &len)) != 0) return;
  char buf[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &in->sin_addr, buf, sizeof buf);
    port = ntohs(in->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof buf);
    port = ntohs(in6->sin6_port);
  }
  ip = buf;
}

// One connection's socket as httplib reads and writes it, with the limits of one request: its
// bytes (head and body together) and a deadline for all of them. Writes never raise SIGPIPE.
// It remembers the status line of the response it writes, so the caller can close the
// connection after an error.
class BoundedStream final : public httplib::Stream {
 public:
  BoundedStream(int fd, Clock::duration write_timeout) : fd_(fd), write_timeout_(write_timeout) {}

  // Waits up to `timeout` for a request's first byte; false if none came (or the peer left).
  bool WaitForRequest(Clock::duration timeout) {
    return begin_ < end_ || WaitFor(fd_, POLLIN, Clock::now() + timeout);
  }
  void StartRequest(Clock::time_point deadline, size_t max_bytes) {
    deadline_ = deadline;
    bytes_left_ = max_bytes;
    status_ = 0;
  }
  bool failed() const { return failed_; }
  int status() const { return status_; }
  // Bytes the client sent that were not read (yet).
  bool HasPendingInput() const {
    int n = 0;
    return begin_ < end_ || (ioctl(fd_, FIONREAD, &n) == 0 && n > 0);
  }

  bool is_readable() const override {
    return begin_ < end_ || (bytes_left_ > 0 && WaitFor(fd_, POLLIN, deadline_));
  }
  bool is_writable() const override {
    return WaitFor(fd_, POLLOUT, Clock::now() + write_timeout_);
  }

  ssize_t read(char* ptr, size_t size) override {
    if (bytes_left_ == 0) return Fail();
    if (begin_ == end_) {
      if (!WaitFor(fd_, POLLIN, deadline_)) return Fail();
      ssize_t n;
      while ((n = recv(fd_, buf_, sizeof buf_, 0)) < 0 && errno == EINTR) {
      }
      if (n < 0) return Fail();
      if (n == 0) return 0;
      begin_ = 0;
      end_ = static_cast<size_t>(n);
    }
    const size_t k = std::min({size, end_ - begin_, bytes_left_});
    std::memcpy(ptr, buf_ + begin_, k);
    begin_ += k;
    bytes_left_ -= k;
    return static_cast<ssize_t>(k);
  }

  ssize_t write(const char* ptr, size_t size) override {
    // httplib writes the status line and headers in one piece: "HTTP/1.1 404 Not Found\r\n...".
    if (status_ < 200 && size >= 12 && std::memcmp(ptr, "HTTP/1.", 7) == 0) {
      int code = 0;
      if (absl::SimpleAtoi(absl::string_view(ptr + 9, 3), &code)) status_ = code;
    }
    if (!is_writable()) return Fail();
    ssize_t n;
    while ((n = send(fd_, ptr, size, MSG_NOSIGNAL)) < 0 && errno == EINTR) {
    }
    return n < 0 ? Fail() : n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    SocketAddress(fd_, /*peer=*/true, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    SocketAddress(fd_, /*peer=*/false, ip, port);
  }
  socket_t socket() const override { return fd_; }

 private:
  ssize_t Fail() {
    failed_ = true;
    return -1;
  }

  const int fd_;
  const Clock::duration write_timeout_;
  Clock::time_point deadline_;
  size_t bytes_left_ = 0;
  int status_ = 0;
  bool failed_ = false;
  char buf_[4096];
  size_t begin_ = 0, end_ = 0;  // unread bytes of buf_
};

// Reads and drops what the client still sends (up to a limit), so that closing the socket does
// not reset the connection before the client has read our error response.
void DrainAndClose(int fd) {
  shutdown(fd, SHUT_WR);
  char buf[4096];
  const auto until = Clock::now() + kMaxDrainTime;
  for (size_t total = 0; total < kMaxDrainBytes && WaitFor(fd, POLLIN, until);) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    total += static_cast<size_t>(n);
  }
}

std::string EscapeRegex(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::strchr(".^$|()[]{}*+?\\", c) != nullptr) out += '\\';
    out += c;
  }
  return out;
}

absl::Status ParseAddress(const std::string& address, std::string& host, int& port) {
  size_t colon;
  if (!address.empty() && address[0] == '[') {
    const size_t close = address.find(']');
    colon = close == std::string::npos ? close : close + 1;
    if (colon != std::string::npos) host = address.substr(1, close - 1);
  } else {
    colon = address.rfind(':');
    if (colon != std::string::npos) host = address.substr(0, colon);
  }
  if (colon == std::string::npos || colon >= address.size() || address[colon] != ':' ||
      host.empty() || !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("HTTP address '", address, "' is not host:port (port 0-65535)"));
  }
  return absl::OkStatus();
}

}  // namespace

// httplib's server with our connection loop (process_and_close_socket) and routing rules.
class HttpServer::Impl final : public httplib::Server {
 public:
  Impl(Routes routes, const HttpServerOptions& options)
      : options_(options), routes_(std::move(routes)) {
    set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      return Admit(req, res);
    });
    // Every error response gets a short fixed text and ends the connection.
    set_error_handler([this](const httplib::Request&, httplib::Response& res) {
      if (!res.body.empty()) return;
      if (options_.error_body) {
        options_.error_body(res.status, res);
      } else {
        res.set_content(absl::StrCat(res.status, " ", StatusText(res.status), "\n"),
                        "text/plain; charset=utf-8");
      }
    });
    set_post_routing_handler([](const httplib::Request&, httplib::Response& res) {
      if (res.status >= 400) {
        res.headers.erase("Keep-Alive");
        if (!res.has_header("Connection")) res.set_header("Connection", "close");
      }
    });
    set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
      res.status = 500;
      res.body.clear();
    });
  }

  const Routes& routes() const { return routes_; }
  std::atomic<bool> listen_returned{false};

  // Shuts every open connection down (their workers then end) and refuses new ones.
  void CloseConnections() {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (int fd : open_) shutdown(fd, SHUT_RDWR);
  }

 private:
  // Decides before the body is read: 413, 404 or 405 here; Unhandled lets httplib read the body
  // and call the route's handler.
  HandlerResponse Admit(const httplib::Request& req, httplib::Response& res) const {
    if (req.has_header("Content-Length")) {
      uint64_t length = 0;
      if (!absl::SimpleAtoi(req.get_header_value("Content-Length"), &length)) {
        res.status = 400;
        return HandlerResponse::Handled;
      }
      if (length > options_.max_body_bytes) {
        res.status = 413;
        return HandlerResponse::Handled;
      }
    }
    const auto route = routes_.by_path_.find(req.path);
    if (route == routes_.by_path_.end()) {
      res.status = 404;
      return HandlerResponse::Handled;
    }
    const auto& methods = route->second;
    if (methods.count(req.method) > 0 || (req.method == "HEAD" && methods.count("GET") > 0)) {
      return HandlerResponse::Unhandled;
    }
    std::set<std::string> allow;
    for (const auto& [method, handler] : methods) allow.insert(method);
    if (allow.count("GET") > 0) allow.insert("HEAD");
    res.status = 405;
    res.set_header("Allow", absl::StrJoin(allow, ", "));
    return HandlerResponse::Handled;
  }

  bool process_and_close_socket(socket_t fd) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) {
        close(fd);
        return false;
      }
      open_.insert(fd);
    }
    BoundedStream stream(fd, ToChrono(options_.write_timeout));
    t_connection_fd = fd;
    bool ok = true;
    for (int i = 0; i < options_.keep_alive_max_requests; ++i) {
      if (!stream.WaitForRequest(ToChrono(options_.keep_alive_timeout))) break;
      stream.StartRequest(Clock::now() + ToChrono(options_.read_timeout),
                          options_.max_head_bytes + options_.max_body_bytes);
      bool client_closes = false;
      const bool last = i + 1 == options_.keep_alive_max_requests;
      ok = process_request(stream, last, client_closes, nullptr);
      if (!ok || client_closes || stream.failed() || stream.status() >= 400) break;
    }
    t_connection_fd = -1;
    if (stream.HasPendingInput()) DrainAndClose(fd);
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_.erase(fd);
    }
    shutdown(fd, SHUT_RDWR);
    close(fd);
    return ok;
  }

  const HttpServerOptions options_;
  const Routes routes_;
  std::mutex mu_;
  bool stopping_ = false;  // guarded by mu_
  std::set<int> open_;     // connections being served; guarded by mu_
};

HttpServer::Routes& HttpServer::Routes::Add(const std::string& path, const std::string& method,
                                            Handler handler) {
  by_path_[path][method] = std::move(handler);
  return *this;
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& address,
                                                              Routes routes,
                                                              const HttpServerOptions& options) {
  std::string host;
  int port = 0;
  if (absl::Status s = ParseAddress(address, host, port); !s.ok()) return s;
  if (options.threads < 1 || options.keep_alive_max_requests < 1) {
    return absl::InvalidArgumentError("HTTP server: threads and requests per connection >= 1");
  }

  std::unique_ptr<HttpServer> server(new HttpServer());
  server->impl_ = std::make_unique<Impl>(std::move(routes), options);
  Impl& impl = *server->impl_;
  for (const auto& [path, methods] : impl.routes().by_path_) {
    const std::string pattern = EscapeRegex(path);
    for (const auto& [method, handler] : methods) {
      if (method == "GET") {
        impl.Get(pattern, handler);
      } else if (method == "POST") {
        impl.Post(pattern, handler);
      } else if (method == "PUT") {
        impl.Put(pattern, handler);
      } else if (method == "PATCH") {
        impl.Patch(pattern, handler);
      } else if (method == "DELETE") {
        impl.Delete(pattern, handler);
      } else if (method == "OPTIONS") {
        impl.Options(pattern, handler);
      } else {
        return absl::InvalidArgumentError(absl::StrCat("HTTP server: no method ", method));
      }
    }
  }
  // SO_REUSEADDR only: httplib's default SO_REUSEPORT would let a second server bind the port.
  impl.set_socket_options([](socket_t fd) {
    const int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  const auto seconds = [](absl::Duration d) {
    return std::max<time_t>(1, absl::ToInt64Seconds(d));
  };
  // Stream events are small writes: without TCP_NODELAY, Nagle holds each one until the client
  // acknowledges the last, and delayed ACKs stall a stream (gRPC sets it too).
  impl.set_tcp_nodelay(true);
  impl.set_read_timeout(seconds(options.read_timeout));  // SO_RCVTIMEO, beside our deadlines
  impl.set_write_timeout(seconds(options.write_timeout));
  impl.set_keep_alive_max_count(static_cast<size_t>(options.keep_alive_max_requests));
  impl.set_keep_alive_timeout(seconds(options.keep_alive_timeout));
  impl.set_payload_max_length(options.max_body_bytes);
  const size_t threads = static_cast<size_t>(options.threads);
  impl.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };

  errno = 0;
  const int bound =
      port == 0 ? impl.bind_to_any_port(host) : (impl.bind_to_port(host, port) ? port : -1);
  if (bound <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen for HTTP on ", address,
                                               errno != 0 ? ": " : "",
                                               errno != 0 ? std::strerror(errno) : ""));
  }
  server->port_ = bound;
  server->listener_ = std::thread([&impl, bound] {
    if (!impl.listen_after_bind()) spdlog::error("HTTP server on port {} stopped accepting", bound);
    impl.listen_returned = true;
  });
  // httplib's stop() does nothing until its accept loop runs: wait for it.
  while (!impl.is_running() && !impl.listen_returned) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return server;
}

void HttpServer::Stop() {
  if (stopped_ || impl_ == nullptr) return;
  stopped_ = true;
  impl_->stop();              // closes the listening socket: no new connections
  impl_->CloseConnections();  // wakes every worker blocked on a client
  if (listener_.joinable()) listener_.join();  // httplib joins its workers before returning
}

HttpServer::~HttpServer() { Stop(); }

bool HttpServer::ClientClosed() {
  const int fd = t_connection_fd;
  if (fd < 0) return false;
  pollfd p = {fd, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if ((p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0) return true;
  if ((p.revents & POLLIN) == 0) return false;
  char c;  // readable: bytes of a next request, or the end of the stream
  const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

}  // namespace heavykv::server
