#include "server/http/http_server.h"

#include <pthread.h>
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <future>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"

namespace heavykv::server {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using ErrorCode = boost::system::error_code;

constexpr size_t kMaxDrainBytes = 4 << 20;         // read and dropped before a close, at most
constexpr auto kMaxDrain = std::chrono::seconds(2);  // and for at most this long
// Read and dropped while a response is in progress once the buffer is full (bytes pipelined past
// what one request may be), at most; more ends the connection.
constexpr size_t kMaxOverflowBytes = 4 << 20;
constexpr int kMaxRefusing = 256;                  // over-cap connections being answered at once
constexpr auto kAcceptPause = std::chrono::milliseconds(50);  // after accept ran out of fds
constexpr size_t kWriteSlice = 256 << 10;          // one write's bytes, at most
constexpr size_t kWatchSlice = 4096;               // room past the limits in the read buffer
constexpr size_t kReadSlice = 64 << 10;            // one read while a response is in progress
constexpr int kAcceptBatch = 64;  // connections taken from the accept queue per wakeup, at most

std::chrono::steady_clock::duration ToChrono(absl::Duration d) {
  return absl::ToChronoMicroseconds(std::max(d, absl::Milliseconds(1)));
}

const char* StatusText(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 201: return "Created";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 417: return "Expectation Failed";
    case 431: return "Request Header Fields Too Large";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return status < 400 ? "OK" : "Error";
  }
}

// A request target's path: the target without its query string.
std::string PathOf(std::string_view target) {
  return std::string(target.substr(0, target.find('?')));
}

bool KnownMethod(std::string_view m) {
  return m == "GET" || m == "HEAD" || m == "POST" || m == "PUT" || m == "PATCH" ||
         m == "DELETE" || m == "OPTIONS";
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

// Lets other threads post to the event loop while it runs, and never after.
struct LoopLink {
  std::mutex mu;
  asio::io_context* io = nullptr;  // guarded by mu; null once the loop has stopped

  template <typename F>
  void Post(F&& f) {
    std::lock_guard<std::mutex> lock(mu);
    if (io != nullptr) asio::post(*io, std::forward<F>(f));
  }
  void Close() {
    std::lock_guard<std::mutex> lock(mu);
    io = nullptr;
  }
};

// The CPU pool (threads named "heavykv-http-cp"), reachable from exchanges until the server
// stops.
class PoolLink {
 public:
  void Start(int threads) {
    for (int i = 0; i < threads; ++i) {
      threads_.emplace_back([this] {
        pthread_setname_np(pthread_self(), "heavykv-http-cp");  // 15 characters at most
        io_.run();
      });
    }
  }
  void Post(std::function<void()> work) {
    std::lock_guard<std::mutex> lock(mu_);
    if (open_) asio::post(io_, std::move(work));
  }
  // No more work is taken; the work queued runs, then the threads end.
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = false;
    }
    guard_.reset();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  }

 private:
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> guard_{io_.get_executor()};
  std::vector<std::thread> threads_;
  std::mutex mu_;
  bool open_ = true;  // guarded by mu_
};

class Connection;

// What a handler holds: posts its calls to the connection's loop, tagged with the request's
// sequence number so that a late call never touches a later request's response.
class Exchange final : public HttpExchange, public std::enable_shared_from_this<Exchange> {
 public:
  Exchange(std::shared_ptr<LoopLink> link, std::shared_ptr<PoolLink> pool,
           std::weak_ptr<Connection> conn, uint64_t seq)
      : link_(std::move(link)), pool_(std::move(pool)), conn_(std::move(conn)), seq_(seq) {}

  void Respond(HttpResponse response) override;
  void StartStream(HttpResponse head) override;
  void Write(std::string data) override;
  void End() override;

  void OnAbort(std::function<void()> on_abort) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!aborted_) {
        on_abort_ = std::move(on_abort);
        return;
      }
    }
    if (on_abort) on_abort();
  }
  bool aborted() const override { return aborted_.load(); }
  void Post(std::function<void()> work) override { pool_->Post(std::move(work)); }
  size_t queued_bytes() const override { return queued_.load(); }
  void OnWritten(std::function<void()> on_written) override {
    std::lock_guard<std::mutex> lock(mu_);
    on_written_ = std::make_shared<std::function<void()>>(std::move(on_written));
  }

  // From the loop: `n` bytes of Write/Respond data are out (or dropped).
  void Sent(size_t n) {
    if (n == 0) return;
    queued_.fetch_sub(n);
    std::shared_ptr<std::function<void()>> f;
    {
      std::lock_guard<std::mutex> lock(mu_);
      f = on_written_;
    }
    if (f && *f) (*f)();
  }

  // From the loop: the connection ended before the response was complete.
  void Abort() {
    std::function<void()> f;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted_) return;
      aborted_ = true;
      f = std::move(on_abort_);
    }
    if (f) f();
  }

 private:
  template <typename F>
  void OnLoop(F&& f);

  const std::shared_ptr<LoopLink> link_;
  const std::shared_ptr<PoolLink> pool_;
  const std::weak_ptr<Connection> conn_;
  const uint64_t seq_;
  std::mutex mu_;
  std::atomic<bool> aborted_{false};
  std::function<void()> on_abort_;  // guarded by mu_
  std::atomic<size_t> queued_{0};   // see queued_bytes()
  std::shared_ptr<std::function<void()>> on_written_;  // guarded by mu_

  friend class Connection;
};

}  // namespace

class HttpServer::Impl {
 public:
  Impl(Routes routes, const HttpServerOptions& options)
      : options(options),
        routes(std::move(routes)),
        acceptor(io),
        accept_pause(io),
        link(std::make_shared<LoopLink>()),
        pool(std::make_shared<PoolLink>()) {
    link->io = &io;
  }

  const HttpServerOptions options;
  const Routes routes;
  asio::io_context io{1};
  tcp::acceptor acceptor;
  asio::steady_timer accept_pause;
  std::shared_ptr<LoopLink> link;
  std::shared_ptr<PoolLink> pool;
  std::thread io_thread;

  // Loop-thread state. Every connection, served or refused, is owned here from accept until
  // Connection::Close (the one way a connection ends) erases it.
  std::unordered_map<Connection*, std::shared_ptr<Connection>> open;
  std::unordered_map<std::string, int> per_client;
  bool stopping = false;
  std::array<char, kReadSlice> discard;  // what overflow reads drop (loop thread only)

  // Stats (any thread reads).
  std::atomic<int64_t> open_count{0}, accepted{0}, refused_total{0}, refused_client{0};
  // Written on the loop; atomic for Stats(). refusing: over-cap connections being answered.
  std::atomic<int64_t> open_clients{0}, refusing{0}, overflows{0};
  std::atomic<int64_t> timeouts_header{0}, timeouts_body{0}, timeouts_idle{0}, timeouts_write{0};

  void Accept();
  void OnAccepted(tcp::socket socket);
  // The body of an error response made from its status alone.
  HttpResponse ErrorResponse(int status) const {
    HttpResponse res;
    res.status = status;
    if (options.error_body) {
      options.error_body(status, res);
    } else {
      res.content_type = "text/plain; charset=utf-8";
      res.body = absl::StrCat(status, " ", StatusText(status), "\n");
    }
    return res;
  }
};

namespace {

// One accepted connection: its socket, read buffer, timer and the state of the request being
// served. Lives on the loop thread only (Exchange posts there).
class Connection final : public std::enable_shared_from_this<Connection> {
 public:
  enum class Mode { kServe, kRefuse };

  Connection(HttpServer::Impl& server, tcp::socket socket, std::string client, int port,
             Mode mode)
      : server_(server),
        socket_(std::move(socket)),
        timer_(server.io),
        buffer_(server.options.max_head_bytes + server.options.max_body_bytes + kWatchSlice),
        client_(std::move(client)),
        client_port_(port),
        mode_(mode) {}

  void Start(int refuse_status) {
    ErrorCode ec;
    socket_.set_option(tcp::no_delay(true), ec);
    if (mode_ == Mode::kRefuse) {
      phase_ = Phase::kHandling;
      BeginResponse(/*head_only=*/false);
      close_after_ = true;
      SendResponse(server_.ErrorResponse(refuse_status));
      return;
    }
    Arm(Phase::kHead, server_.options.header_timeout);
    ReadHead();
  }

  // Ends the connection now: the one way every connection ends (Stop(), a failed write or read,
  // a deadline, the end of a linger). Frees its slot and counts, aborts an unfinished exchange.
  void Close() {
    if (phase_ == Phase::kClosed) return;
    const std::shared_ptr<Connection> keep = shared_from_this();  // Forget drops the server's
    phase_ = Phase::kClosed;
    ErrorCode ec;
    timer_.cancel();
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    if (exchange_ != nullptr && !response_complete_) exchange_->Abort();
    exchange_.reset();
    Forget();
  }

  // Exchange calls, on the loop thread.
  void OnRespond(uint64_t seq, HttpResponse res) {
    if (!Current(seq) || response_started_) return;
    SendResponse(std::move(res));
  }
  void OnStartStream(uint64_t seq, HttpResponse head) {
    if (!Current(seq) || response_started_) return;
    response_started_ = true;
    if (head.status >= 400) close_after_ = true;
    // HTTP/1.0 has no chunked encoding: the stream's end is the connection's.
    chunked_ = version_ >= 11;
    if (!chunked_) close_after_ = true;
    std::string out = Head(head, std::nullopt);
    Send(std::move(out));
  }
  void OnWrite(uint64_t seq, std::string data, Exchange& from) {
    if (!Current(seq) || !response_started_ || response_complete_ || data.empty() || head_only_) {
      from.Sent(data.size());  // dropped: no longer queued
      return;
    }
    pending_payload_ += data.size();
    if (chunked_) {
      std::string framed = absl::StrCat(absl::Hex(data.size()), "\r\n");
      framed += data;
      framed += "\r\n";
      Send(std::move(framed));
    } else {
      Send(std::move(data));
    }
  }
  void OnEnd(uint64_t seq) {
    if (!Current(seq) || !response_started_ || response_complete_) return;
    response_complete_ = true;
    Send(chunked_ && !head_only_ ? std::string("0\r\n\r\n") : std::string());
  }

 private:
  enum class Phase { kHead, kBody, kHandling, kIdle, kClosing, kClosed };

  bool Current(uint64_t seq) const {
    return phase_ == Phase::kHandling && exchange_ != nullptr && seq == seq_;
  }

  void Forget() {
    auto& s = server_;
    s.open.erase(this);
    if (mode_ == Mode::kRefuse) {
      --s.refusing;
    } else {
      if (auto it = s.per_client.find(client_); it != s.per_client.end() && --it->second <= 0) {
        s.per_client.erase(it);
      }
      s.open_clients = static_cast<int64_t>(s.per_client.size());
      --s.open_count;
    }
  }

  // Sets the connection's one deadline; `phase` says what missing it means.
  void Arm(Phase phase, absl::Duration d) {
    phase_ = phase;
    timed_out_ = false;
    const uint64_t gen = ++timer_gen_;
    timer_.expires_after(ToChrono(d));
    timer_.async_wait([self = shared_from_this(), gen](const ErrorCode& ec) {
      if (!ec && gen == self->timer_gen_) self->OnTimeout();
    });
  }
  void Disarm() {
    ++timer_gen_;
    timer_.cancel();
  }

  void OnTimeout() {
    switch (phase_) {
      case Phase::kHead:
      case Phase::kBody:
      case Phase::kIdle: {
        timed_out_ = true;
        ErrorCode ec;
        socket_.cancel(ec);  // the pending read ends with operation_aborted
        return;
      }
      case Phase::kHandling:  // a write made no progress
        ++server_.timeouts_write;
        Close();
        return;
      case Phase::kClosing:
        Close();
        return;
      case Phase::kClosed:
        return;
    }
  }

  void ReadHead() {
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(
        std::min<size_t>(server_.options.max_head_bytes, UINT32_MAX)));
    parser_->body_limit(server_.options.max_body_bytes);
    bhttp::async_read_header(socket_, buffer_, *parser_,
                             [self = shared_from_this()](const ErrorCode& ec, size_t) {
                               self->OnHead(ec);
                             });
  }

  // A read error: a timeout (408), a malformed or oversized request (its status), or the client
  // gone mid-request (close: nobody to answer).
  void OnReadError(const ErrorCode& ec, bool body) {
    if (phase_ == Phase::kClosed) return;
    if (timed_out_) {
      ++(body ? server_.timeouts_body : server_.timeouts_header);
      return Refuse(408);
    }
    if (ec == bhttp::error::body_limit) return Refuse(413);
    if (ec == bhttp::error::header_limit) return Refuse(431);
    // A transfer coding other than chunked (alone, or last after others: read as plain chunked
    // it would be garbage).
    if (ec == bhttp::error::bad_transfer_encoding) return Refuse(501);
    const bool parse_error = ec.category() == ErrorCode(bhttp::error::bad_method).category() &&
                             ec != bhttp::error::end_of_stream &&
                             ec != bhttp::error::partial_message;
    if (parse_error) return Refuse(400);
    Close();
  }

  void OnHead(const ErrorCode& ec) {
    if (phase_ == Phase::kClosed) return;
    if (ec) return OnReadError(ec, /*body=*/false);
    const auto& req = parser_->get();
    const std::string method(req.method_string());
    version_ = req.version();
    if ((version_ != 10 && version_ != 11) || !KnownMethod(method)) return Refuse(400);
    head_only_ = method == "HEAD";
    for (const auto& field : req) {  // only chunked is decoded: "gzip, chunked" is 501
      if (field.name() == bhttp::field::transfer_encoding &&
          !absl::EqualsIgnoreCase(
              absl::StripAsciiWhitespace(absl::string_view(field.value().data(),
                                                           field.value().size())),
              "chunked")) {
        return Refuse(501);
      }
    }
    const HttpServer::Routes::Methods* route =
        server_.routes.Find(PathOf({req.target().data(), req.target().size()}));
    if (route == nullptr) return Refuse(404);
    const auto& methods = *route;
    auto handler = methods.find(head_only_ ? std::string("GET") : method);
    if (handler == methods.end()) {
      std::set<std::string> allow;
      for (const auto& [m, h] : methods) allow.insert(m);
      if (allow.count("GET") > 0) allow.insert("HEAD");
      HttpResponse res = server_.ErrorResponse(405);
      res.headers.emplace_back("Allow", absl::StrJoin(allow, ", "));
      return Refuse(std::move(res));
    }
    handler_ = &handler->second;
    const auto expect = req.find(bhttp::field::expect);
    bool continue_100 = false;
    if (expect != req.end()) {
      if (!absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(
                                      absl::string_view(expect->value().data(),
                                                        expect->value().size())),
                                  "100-continue")) {
        return Refuse(417);
      }
      continue_100 = version_ >= 11;
    }
    if (parser_->is_done()) return Dispatch();
    Arm(Phase::kBody, server_.options.body_timeout);
    if (continue_100 && buffer_.size() == 0) {
      interim_ = "HTTP/1.1 100 Continue\r\n\r\n";
      asio::async_write(socket_, asio::buffer(interim_),
                        [self = shared_from_this()](const ErrorCode& wec, size_t) {
                          if (self->phase_ == Phase::kClosed) return;
                          if (wec) return self->Close();
                          self->ReadBody();
                        });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    bhttp::async_read(socket_, buffer_, *parser_,
                      [self = shared_from_this()](const ErrorCode& ec, size_t) {
                        if (self->phase_ == Phase::kClosed) return;
                        if (ec) return self->OnReadError(ec, /*body=*/true);
                        self->Dispatch();
                      });
  }

  void BeginResponse(bool head_only) {
    head_only_ = head_only;
    response_started_ = false;
    response_complete_ = false;
    close_after_ = false;
    chunked_ = false;
  }

  // Hands the request to its handler on the CPU pool and watches the socket meanwhile.
  void Dispatch() {
    Disarm();
    phase_ = Phase::kHandling;
    ++requests_;
    auto message = parser_->release();
    parser_.reset();
    BeginResponse(head_only_);
    keep_alive_ = message.keep_alive() &&
                  requests_ < server_.options.keep_alive_max_requests;
    auto request = std::make_shared<HttpRequest>();
    request->method = std::string(message.method_string());
    request->target = std::string(message.target());
    request->path = PathOf(request->target);
    request->version = version_;
    for (const auto& field : message) {
      request->headers.emplace_back(std::string(field.name_string()),
                                    std::string(field.value()));
    }
    request->body = std::move(message.body());
    request->remote_addr = client_;
    request->remote_port = client_port_;
    exchange_ = std::make_shared<Exchange>(server_.link, server_.pool, weak_from_this(), ++seq_);
    // The pool's work ends (Stop) before the server does, so `server` outlives the job.
    auto job = [handler = handler_, request, exchange = exchange_, server = &server_] {
      try {
        (*handler)(*request, exchange);
      } catch (const std::exception& e) {
        spdlog::error("HTTP handler of {} threw: {}", request->path, e.what());
        exchange->Respond(server->ErrorResponse(500));
      } catch (...) {
        spdlog::error("HTTP handler of {} threw", request->path);
        exchange->Respond(server->ErrorResponse(500));
      }
    };
    if (server_.routes.OnLoop(handler_)) {
      job();  // its answer is posted to the loop, after this
    } else {
      server_.pool->Post(std::move(job));
    }
    Watch();
  }

  // While a response is in progress: reads on (into the buffer, for a pipelined next request)
  // to see the client go.
  // Once the buffer is full (the client pipelined more than one request may be), it reads on,
  // dropping the bytes (at most kMaxOverflowBytes), and the response is followed by a 413 and
  // the close. End of stream is a half-close: the client may still read its answer, and a
  // write that fails says it has gone.
  void Watch() {
    if (watching_ || phase_ != Phase::kHandling || peer_eof_) return;
    const size_t room = buffer_.max_size() - buffer_.size();
    watching_ = true;
    if (room == 0) {
      if (!overflowed_) ++server_.overflows;
      overflowed_ = true;
      socket_.async_read_some(asio::buffer(server_.discard),
                              [self = shared_from_this()](const ErrorCode& ec, size_t n) {
                                self->overflow_bytes_ += n;
                                self->OnWatched(ec, 0);
                              });
      return;
    }
    socket_.async_read_some(buffer_.prepare(std::min(room, kReadSlice)),
                            [self = shared_from_this()](const ErrorCode& ec, size_t n) {
                              self->OnWatched(ec, n);
                            });
  }
  void OnWatched(const ErrorCode& ec, size_t n) {
    watching_ = false;
    buffer_.commit(n);
    if (phase_ == Phase::kClosed) return;
    const bool failed = ec && ec != asio::error::operation_aborted;
    if (phase_ == Phase::kClosing) return failed ? Close() : Drain();
    if (ec == asio::error::eof) {
      if (version_ < 11) return Close();  // an HTTP/1.0 client that closes has gone
      peer_eof_ = true;  // half-closed, or gone: answer on, and find out
      WatchForReset();
    } else if (failed) {
      return Close();  // the client has gone (reset)
    }
    if (overflow_bytes_ > kMaxOverflowBytes) return Close();
    if (next_after_watch_) {
      next_after_watch_ = false;
      return NextRequest();
    }
    if (!ec) Watch();
  }

  // After end of stream: the client half-closed (it still reads) or closed (it has gone). Until
  // the response starts, an interim "100 Continue" (which HTTP/1.1 clients must accept
  // unasked) makes a closed socket answer with a reset; a reset, however it comes, ends the
  // connection and aborts the exchange (a non-streamed generation is cancelled, not finished
  // for nobody).
  void WatchForReset() {
    if (!response_started_) Send("HTTP/1.1 100 Continue\r\n\r\n");
    socket_.async_wait(tcp::socket::wait_error, [self = shared_from_this()](const ErrorCode& ec) {
      if (self->phase_ == Phase::kClosed || ec == asio::error::operation_aborted) return;
      self->Close();
    });
  }

  // The whole (non-streamed) response.
  void SendResponse(HttpResponse res) {
    response_started_ = true;
    response_complete_ = true;
    if (res.status >= 400) close_after_ = true;
    std::string out = Head(res, res.body.size());
    if (!head_only_) out += res.body;
    Send(std::move(out));
  }

  std::string Head(const HttpResponse& res, std::optional<size_t> length) {
    if (!keep_alive_) close_after_ = true;
    std::string out = absl::StrCat("HTTP/1.1 ", res.status, " ", StatusText(res.status), "\r\n");
    if (!res.content_type.empty()) absl::StrAppend(&out, "Content-Type: ", res.content_type, "\r\n");
    if (length.has_value()) {
      // 204 carries no Content-Length (RFC 9110 8.6): a CORS preflight's answer.
      if (res.status != 204) absl::StrAppend(&out, "Content-Length: ", *length, "\r\n");
    } else if (chunked_) {
      out += "Transfer-Encoding: chunked\r\n";
    }
    for (const auto& [name, value] : res.headers) {
      if (absl::EqualsIgnoreCase(name, "Connection")) continue;
      absl::StrAppend(&out, name, ": ", value, "\r\n");
    }
    if (close_after_) {
      out += "Connection: close\r\n";
    } else if (version_ == 10) {
      out += "Connection: keep-alive\r\n";
    }
    out += "\r\n";
    return out;
  }

  void Send(std::string bytes) {
    out_pending_ += bytes;
    Flush();
  }

  void Flush() {
    if (writing_ || phase_ == Phase::kClosed) return;
    if (out_pending_.empty()) {
      if (response_complete_ && phase_ == Phase::kHandling) AfterResponse();
      return;
    }
    out_writing_.swap(out_pending_);
    out_pending_.clear();
    writing_payload_ = pending_payload_;
    pending_payload_ = 0;
    written_ = 0;
    WriteSome();
  }

  void WriteSome() {
    writing_ = true;
    if (phase_ == Phase::kHandling) Arm(Phase::kHandling, server_.options.write_timeout);
    const size_t n = std::min(kWriteSlice, out_writing_.size() - written_);
    socket_.async_write_some(
        asio::buffer(out_writing_.data() + written_, n),
        [self = shared_from_this()](const ErrorCode& ec, size_t n) { self->OnWritten(ec, n); });
  }

  void OnWritten(const ErrorCode& ec, size_t n) {
    writing_ = false;
    if (phase_ == Phase::kClosed) return;
    if (ec) return Close();  // the client has gone: the exchange is aborted
    written_ += n;
    if (written_ < out_writing_.size()) return WriteSome();
    out_writing_.clear();
    if (phase_ == Phase::kHandling) Disarm();
    if (exchange_ != nullptr && writing_payload_ > 0) exchange_->Sent(writing_payload_);
    writing_payload_ = 0;
    Flush();
  }

  // The response is out: the next request, or the end of the connection.
  void AfterResponse() {
    exchange_.reset();
    if (mode_ == Mode::kRefuse || close_after_) return Linger();
    // The bytes pipelined behind this request overflowed the buffer: the next request cannot be
    // read whole, so it is refused, and the connection ends.
    if (overflowed_) return Refuse(413);
    if (watching_) {
      next_after_watch_ = true;
      ErrorCode ec;
      socket_.cancel(ec);
      return;
    }
    NextRequest();
  }

  void NextRequest() {
    if (buffer_.size() > 0) {  // a pipelined request's bytes are here
      Arm(Phase::kHead, server_.options.header_timeout);
      return ReadHead();
    }
    if (peer_eof_) return Linger();  // half-closed and answered: nothing more will come
    Arm(Phase::kIdle, server_.options.idle_timeout);
    socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](const ErrorCode& ec) {
      if (self->phase_ != Phase::kIdle) return;
      if (ec || self->timed_out_) {
        if (self->timed_out_) ++self->server_.timeouts_idle;
        return self->Close();
      }
      self->Arm(Phase::kHead, self->server_.options.header_timeout);
      self->ReadHead();
    });
  }

  // An error response made by the server itself; the connection ends after it.
  void Refuse(int status) { Refuse(server_.ErrorResponse(status)); }
  void Refuse(HttpResponse res) {
    Disarm();
    phase_ = Phase::kHandling;
    parser_.reset();
    BeginResponse(head_only_);
    keep_alive_ = false;
    close_after_ = true;
    exchange_.reset();
    ++seq_;
    SendResponse(std::move(res));
  }

  // Closes the sending side, then reads and drops what the client still sends (at most
  // kMaxDrainBytes, for at most kMaxDrain), so that the close does not reset the connection
  // before the client has read the response.
  void Linger() {
    ErrorCode ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    Arm(Phase::kClosing, absl::FromChrono(kMaxDrain));
    if (watching_) {  // the watch's end (OnWatched) drains
      socket_.cancel(ec);
      return;
    }
    Drain();
  }
  void Drain() {
    if (drained_ >= kMaxDrainBytes) return Close();
    buffer_.clear();
    socket_.async_read_some(buffer_.prepare(kWatchSlice),
                            [self = shared_from_this()](const ErrorCode& ec, size_t n) {
                              if (self->phase_ != Phase::kClosing) return;
                              if (ec) return self->Close();
                              self->drained_ += n;
                              self->Drain();
                            });
  }

  HttpServer::Impl& server_;
  tcp::socket socket_;
  asio::steady_timer timer_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  const std::string client_;
  const int client_port_;
  const Mode mode_;

  Phase phase_ = Phase::kHead;
  uint64_t timer_gen_ = 0;
  bool timed_out_ = false;
  int version_ = 11;
  int requests_ = 0;
  bool keep_alive_ = true;
  const HttpServer::Handler* handler_ = nullptr;
  uint64_t seq_ = 0;
  std::shared_ptr<Exchange> exchange_;
  std::string interim_;  // "100 Continue"

  // The response in progress.
  bool head_only_ = false;
  bool response_started_ = false, response_complete_ = false;
  bool close_after_ = false, chunked_ = false;
  std::string out_pending_, out_writing_;
  size_t written_ = 0;
  bool writing_ = false;
  bool watching_ = false, next_after_watch_ = false;
  size_t drained_ = 0;
  // Write() bytes of the exchange in out_pending_ and out_writing_ (Exchange::Sent once out).
  size_t pending_payload_ = 0, writing_payload_ = 0;
  bool peer_eof_ = false;    // the client half-closed (read end of stream)
  bool overflowed_ = false;  // bytes were dropped while a response was in progress
  size_t overflow_bytes_ = 0;
};

template <typename F>
void Exchange::OnLoop(F&& f) {
  link_->Post([conn = conn_, f = std::forward<F>(f)]() mutable {
    if (std::shared_ptr<Connection> c = conn.lock()) f(*c);
  });
}

void Exchange::Respond(HttpResponse response) {
  OnLoop([seq = seq_, r = std::move(response)](Connection& c) mutable {
    c.OnRespond(seq, std::move(r));
  });
}
void Exchange::StartStream(HttpResponse head) {
  OnLoop([seq = seq_, h = std::move(head)](Connection& c) mutable {
    c.OnStartStream(seq, std::move(h));
  });
}
void Exchange::Write(std::string data) {
  if (data.empty() || aborted_) return;
  queued_ += data.size();
  OnLoop([seq = seq_, d = std::move(data), self = shared_from_this()](Connection& c) mutable {
    c.OnWrite(seq, std::move(d), *self);
  });
}
void Exchange::End() {
  OnLoop([seq = seq_](Connection& c) { c.OnEnd(seq); });
}

}  // namespace

void HttpServer::Impl::Accept() {
  acceptor.async_accept([this](const ErrorCode& ec, tcp::socket socket) {
    if (stopping || !acceptor.is_open()) return;
    if (ec) {
      if (ec == asio::error::operation_aborted) return;
      // Out of descriptors (or buffers): the kernel keeps the connection queued; try again soon
      // instead of spinning on the error.
      if (ec == asio::error::no_descriptors || ec == asio::error::no_buffer_space ||
          ec == asio::error::no_memory || ec.value() == ENFILE) {
        spdlog::warn("HTTP accept: {}; pausing accepts for 50 ms", ec.message());
        accept_pause.expires_after(kAcceptPause);
        accept_pause.async_wait([this](const ErrorCode& wec) {
          if (!wec && !stopping) Accept();
        });
        return;
      }
    } else {
      OnAccepted(std::move(socket));
      // Empty the accept queue before the loop serves the connections' reads again (as
      // nginx's multi_accept): under a flood of connections, a new client (a health probe)
      // would otherwise wait one loop round per connection queued ahead of it.
      for (int i = 1; i < kAcceptBatch && !stopping; ++i) {
        ErrorCode aec;
        tcp::socket next = acceptor.accept(aec);
        if (aec) break;  // would_block: the queue is empty (or an error the next wait sees)
        OnAccepted(std::move(next));
      }
    }
    Accept();
  });
}

void HttpServer::Impl::OnAccepted(tcp::socket socket) {
  ErrorCode ec;
  const tcp::endpoint peer = socket.remote_endpoint(ec);
  if (ec) return;  // already gone
  std::string client = peer.address().to_string();
  const int port = peer.port();
  ++accepted;
  const auto from_client = per_client.find(client);
  int refuse = 0;
  if (open_count.load() >= options.max_connections) {
    refuse = 503;
    ++refused_total;
  } else if (from_client != per_client.end() &&
             from_client->second >= options.max_connections_per_client) {
    refuse = 429;
    ++refused_client;
  }
  if (refuse != 0) {
    if (refusing >= kMaxRefusing) return;  // closed unanswered: the socket goes out of scope
    ++refusing;
    auto conn = std::make_shared<Connection>(*this, std::move(socket), std::move(client), port,
                                             Connection::Mode::kRefuse);
    open.emplace(conn.get(), conn);
    conn->Start(refuse);
    return;
  }
  ++per_client[client];
  open_clients = static_cast<int64_t>(per_client.size());
  ++open_count;
  auto conn = std::make_shared<Connection>(*this, std::move(socket), std::move(client), port,
                                           Connection::Mode::kServe);
  open.emplace(conn.get(), conn);
  conn->Start(0);
}

std::string HttpRequest::Header(std::string_view name) const {
  for (const auto& [n, v] : headers) {
    if (absl::EqualsIgnoreCase(n, absl::string_view(name.data(), name.size()))) return v;
  }
  return "";
}

HttpServer::Routes& HttpServer::Routes::Add(const std::string& path, const std::string& method,
                                            Handler handler) {
  by_path_[path][method] = std::move(handler);
  return *this;
}

HttpServer::Routes& HttpServer::Routes::AddOnLoop(const std::string& path,
                                                  const std::string& method, Handler handler) {
  Add(path, method, std::move(handler));
  on_loop_.insert(&by_path_[path][method]);
  return *this;
}

const HttpServer::Routes::Methods* HttpServer::Routes::Find(std::string_view path) const {
  if (const auto exact = by_path_.find(std::string(path)); exact != by_path_.end()) {
    return &exact->second;
  }
  const Methods* best = nullptr;
  size_t best_size = 0;
  for (const auto& [route, methods] : by_path_) {
    if (route.size() < 2 || route.compare(route.size() - 2, 2, "/*") != 0) continue;
    const std::string_view prefix(route.data(), route.size() - 1);  // with its '/'
    if (path.size() > prefix.size() && path.substr(0, prefix.size()) == prefix &&
        prefix.size() > best_size) {
      best = &methods;
      best_size = prefix.size();
    }
  }
  return best;
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& address,
                                                              Routes routes,
                                                              const HttpServerOptions& options) {
  std::string host;
  int port = 0;
  if (absl::Status s = ParseAddress(address, host, port); !s.ok()) return s;
  if (options.cpu_threads < 1 || options.keep_alive_max_requests < 1 ||
      options.max_connections < 1 || options.max_connections_per_client < 1) {
    return absl::InvalidArgumentError(
        "HTTP server: threads, requests per connection and connection caps must be >= 1");
  }
  for (const auto& [path, methods] : routes.by_path()) {
    for (const auto& [method, handler] : methods) {
      if (method == "HEAD" || !KnownMethod(method)) {
        return absl::InvalidArgumentError(absl::StrCat("HTTP server: no method ", method));
      }
    }
  }
  HttpServerOptions opts = options;
  // Each connection is a descriptor: make room for the cap, or lower it to what fits.
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0) {
    constexpr rlim_t kReserve = 256;  // model files, gRPC, logs, the other server
    const rlim_t want = static_cast<rlim_t>(opts.max_connections) + kMaxRefusing + kReserve;
    if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < want) {
      rlimit raised = lim;
      raised.rlim_cur = lim.rlim_max == RLIM_INFINITY ? want : std::min(want, lim.rlim_max);
      if (setrlimit(RLIMIT_NOFILE, &raised) == 0) lim = raised;
      if (lim.rlim_cur < want) {
        const int fits = static_cast<int>(std::max<rlim_t>(
            16, lim.rlim_cur > kReserve + kMaxRefusing ? lim.rlim_cur - kReserve - kMaxRefusing
                                                        : 16));
        spdlog::warn(
            "HTTP server on {}: {} connections need {} file descriptors, the limit is {}; "
            "holding at most {} (raise `ulimit -n`)",
            address, opts.max_connections, want, static_cast<uint64_t>(lim.rlim_cur), fits);
        opts.max_connections = std::min(opts.max_connections, fits);
      }
    }
  }

  std::unique_ptr<HttpServer> server(new HttpServer());
  server->impl_ = std::make_shared<Impl>(std::move(routes), opts);
  Impl& impl = *server->impl_;
  ErrorCode ec;
  const asio::ip::address ip = asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("HTTP address '", address, "': '", host, "' is not an IP address"));
  }
  const tcp::endpoint endpoint(ip, static_cast<unsigned short>(port));
  impl.acceptor.open(endpoint.protocol(), ec);
  // SO_REUSEADDR only (a restart binds at once); never SO_REUSEPORT, which would let a second
  // server bind the same port.
  if (!ec) impl.acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) impl.acceptor.bind(endpoint, ec);
  if (!ec) impl.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (!ec) impl.acceptor.non_blocking(true, ec);  // Accept's batch stops at would_block
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for HTTP on ", address, ": ", ec.message()));
  }
  server->port_ = impl.acceptor.local_endpoint(ec).port();
  impl.pool->Start(opts.cpu_threads);
  impl.Accept();
  impl.io_thread = std::thread([&impl] {
    pthread_setname_np(pthread_self(), "heavykv-http-io");
    for (;;) {
      try {
        impl.io.run();
        return;
      } catch (const std::exception& e) {
        spdlog::error("HTTP event loop: {}", e.what());
      }
    }
  });
  return server;
}

HttpServerStats HttpServer::Stats() const {
  HttpServerStats s;
  if (impl_ == nullptr) return s;
  s.open_connections = impl_->open_count.load();
  s.open_clients = impl_->open_clients.load();
  s.refusing = impl_->refusing.load();
  s.overflows = impl_->overflows.load();
  s.accepted = impl_->accepted.load();
  s.refused_max_connections = impl_->refused_total.load();
  s.refused_per_client = impl_->refused_client.load();
  s.timeouts_header = impl_->timeouts_header.load();
  s.timeouts_body = impl_->timeouts_body.load();
  s.timeouts_idle = impl_->timeouts_idle.load();
  s.timeouts_write = impl_->timeouts_write.load();
  return s;
}

void HttpServer::Stop() {
  if (impl_ == nullptr || !impl_->io_thread.joinable()) return;
  Impl& impl = *impl_;
  // On the loop: no new connections, every open one closed (their exchanges aborted).
  std::promise<void> closed;
  asio::post(impl.io, [&impl, &closed] {
    impl.stopping = true;
    ErrorCode ec;
    impl.acceptor.close(ec);
    impl.accept_pause.cancel();
    std::vector<std::shared_ptr<Connection>> all;
    all.reserve(impl.open.size());
    for (auto& [raw, conn] : impl.open) all.push_back(conn);
    for (auto& c : all) c->Close();
    closed.set_value();
  });
  closed.get_future().wait();
  impl.link->Close();
  impl.io.stop();
  impl.io_thread.join();
  impl.pool->Stop();
}

HttpServer::~HttpServer() { Stop(); }

}  // namespace heavykv::server
