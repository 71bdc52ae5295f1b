#include "server/client/http_probe.h"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace heavykv::cli {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Whether `response` is whole: its head and the Content-Length bytes after it (a response
// without one ends when the server closes, as the request asks).
bool Complete(const std::string& response) {
  const size_t end = response.find("\r\n\r\n");
  if (end == std::string::npos) return false;
  const std::string head = absl::AsciiStrToLower(response.substr(0, end + 2));
  const size_t at = head.find("\r\ncontent-length:");
  if (at == std::string::npos) return false;
  const size_t eol = head.find("\r\n", at + 2);
  size_t length = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(head.substr(at + 17, eol - at - 17)), &length)) {
    return false;
  }
  return response.size() >= end + 4 + length;
}

}  // namespace

struct HttpProbe::Probe {
  int fd = -1;
  Clock::time_point start;
  bool connected = false;
  std::string response;
};

HttpProbe::HttpProbe(HttpProbeOptions options)
    : options_(std::move(options)),
      request_(absl::StrCat("GET ", options_.path,
                            " HTTP/1.1\r\nHost: heavykv-bench\r\nConnection: close\r\n",
                            options_.api_key.empty()
                                ? ""
                                : absl::StrCat("Authorization: Bearer ", options_.api_key, "\r\n"),
                            "\r\n")) {}

HttpProbe::~HttpProbe() {
  Stop();
  if (epoll_ >= 0) close(epoll_);
}

absl::Status HttpProbe::Start() {
  epoll_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_ < 0) return absl::InternalError(absl::StrCat("epoll_create1: ", std::strerror(errno)));
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

HttpProbeStats HttpProbe::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

HttpProbeStats HttpProbe::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  return stats();
}

void HttpProbe::Finish(Probe& probe, const std::string& failure) {
  if (probe.fd >= 0) close(probe.fd);
  const double seconds = failure == "timeout"
                             ? std::chrono::duration<double>(options_.timeout).count()
                             : SecondsSince(probe.start);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.latency.push_back(seconds);
  if (failure.empty()) {
    ++stats_.ok;
  } else {
    ++stats_.failures[failure];
  }
}

void HttpProbe::Run() {
  std::map<int, Probe> in_flight;  // by socket
  std::vector<epoll_event> events(64);
  Clock::time_point next = Clock::now();
  while (!stop_.load() || !in_flight.empty()) {
    Clock::time_point now = Clock::now();
    if (!stop_.load() && now >= next) {
      next += options_.interval;
      if (next < now) next = now + options_.interval;  // fell behind: no burst to catch up
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.sent;
      }
      Probe p;
      p.start = now;
      p.fd = StartConnect(options_.target, options_.source);
      epoll_event ev{};
      ev.events = EPOLLOUT;
      ev.data.fd = p.fd;
      if (p.fd >= 0 && epoll_ctl(epoll_, EPOLL_CTL_ADD, p.fd, &ev) == 0) {
        in_flight.emplace(p.fd, std::move(p));
      } else {
        Finish(p, "connect");
      }
    }
    Clock::time_point wake = stop_.load() ? now + options_.timeout : next;
    for (const auto& [fd, p] : in_flight) wake = std::min(wake, p.start + options_.timeout);
    const auto wait = std::chrono::ceil<std::chrono::milliseconds>(wake - Clock::now()).count();
    const int n = epoll_wait(epoll_, events.data(), static_cast<int>(events.size()),
                             static_cast<int>(std::clamp<int64_t>(wait, 0, 100)));
    for (int i = 0; i < n; ++i) {
      const auto it = in_flight.find(events[i].data.fd);
      if (it == in_flight.end()) continue;
      Probe& p = it->second;
      std::string failure = "?";  // "?": still in flight
      if (!p.connected) {
        if (ConnectError(p.fd) != 0 || send(p.fd, request_.data(), request_.size(), MSG_NOSIGNAL) !=
                                           static_cast<ssize_t>(request_.size())) {
          failure = "connect";
        } else {
          p.connected = true;
          epoll_event ev{};
          ev.events = EPOLLIN | EPOLLRDHUP;
          ev.data.fd = p.fd;
          epoll_ctl(epoll_, EPOLL_CTL_MOD, p.fd, &ev);
        }
      } else {
        char buf[4096];
        ssize_t got;
        while ((got = recv(p.fd, buf, sizeof buf, 0)) > 0) p.response.append(buf, size_t(got));
        const bool ended =
            got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
        if (ended || Complete(p.response)) {
          const int status = ResponseStatus(p.response);
          if (p.response.find("\r\n\r\n") == std::string::npos || status == 0) {
            failure = "closed";
          } else {
            failure = status == 200 ? "" : absl::StrCat("http_", status);
          }
        }
      }
      if (failure != "?") {
        Finish(p, failure);
        in_flight.erase(it);
      }
    }
    now = Clock::now();
    for (auto it = in_flight.begin(); it != in_flight.end();) {
      if (now - it->second.start >= options_.timeout) {
        Finish(it->second, "timeout");
        it = in_flight.erase(it);
      } else {
        ++it;
      }
    }
  }
}

}  // namespace heavykv::cli
