#include "server/client/overflow_load.h"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"

namespace heavykv::cli {
namespace {

using Clock = std::chrono::steady_clock;

enum class Phase { kConnecting, kSending, kHolding };

struct Connection {
  Phase phase = Phase::kConnecting;
  size_t request = 0;  // index into OverflowOptions::requests
  size_t sent = 0;     // bytes of request + extra sent
  // kConnecting: of the connect; kSending: of the next progress; kHolding: of the close.
  Clock::time_point deadline;
  std::string head;  // the first bytes the server sent (its status line)
};

bool Retry(int error) { return error == EAGAIN || error == EWOULDBLOCK || error == EINTR; }

}  // namespace

absl::StatusOr<OverflowStats> RunOverflow(const OverflowOptions& o) {
  if (o.requests.empty() || o.concurrency < 1 || o.connections < 0) {
    return absl::InvalidArgumentError("an overflow needs requests, a concurrency of at least 1");
  }
  const int epoll = epoll_create1(EPOLL_CLOEXEC);
  if (epoll < 0) return absl::InternalError(absl::StrCat("epoll_create1: ", std::strerror(errno)));
  const std::string extra(o.extra_bytes, 'A');
  OverflowStats stats;
  std::map<int, Connection> open;  // by socket
  const auto watch = [&](int fd, uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.fd = fd;
    epoll_ctl(epoll, EPOLL_CTL_MOD, fd, &ev);
  };
  // Ends a connection: `by_server` when the server closed or reset it first.
  const auto end = [&](std::map<int, Connection>::iterator it, bool by_server) {
    const int status = ResponseStatus(it->second.head);
    ++stats.responses[status > 0 ? absl::StrCat(status) : "none"];
    if (by_server) ++stats.closed_by_server;
    close(it->first);  // epoll forgets a closed descriptor by itself
    open.erase(it);
  };
  const Clock::time_point start = Clock::now();
  std::vector<epoll_event> events(256);
  int started = 0;
  while (started < o.connections || !open.empty()) {
    while (started < o.connections && static_cast<int>(open.size()) < o.concurrency) {
      const int i = started++;
      const std::string& source = o.sources.empty() ? "" : o.sources[i % o.sources.size()];
      const int fd = StartConnect(o.target, source);
      epoll_event ev{};
      ev.events = EPOLLOUT | EPOLLIN | EPOLLRDHUP;
      ev.data.fd = fd;
      if (fd < 0 || epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &ev) != 0) {
        if (fd >= 0) close(fd);
        ++stats.connect_failures;
        continue;
      }
      Connection c;
      c.request = static_cast<size_t>(i) % o.requests.size();
      c.deadline = Clock::now() + o.send_timeout;
      open.emplace(fd, std::move(c));
    }
    const int n = epoll_wait(epoll, events.data(), static_cast<int>(events.size()), 20);
    for (int e = 0; e < n; ++e) {
      const auto it = open.find(events[e].data.fd);
      if (it == open.end()) continue;
      const int fd = it->first;
      Connection& c = it->second;
      const uint32_t ev = events[e].events;
      if (c.phase == Phase::kConnecting) {
        if (ConnectError(fd) != 0) {
          ++stats.connect_failures;
          close(fd);
          open.erase(it);
          continue;
        }
        ++stats.opened;
        c.phase = Phase::kSending;
        c.deadline = Clock::now() + o.send_timeout;
      }
      if (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
        char buf[16384];
        ssize_t got;
        while ((got = recv(fd, buf, sizeof buf, 0)) > 0) {
          if (c.head.size() < 16) c.head.append(buf, std::min<size_t>(got, 16 - c.head.size()));
        }
        if (got == 0 || !Retry(errno)) {
          end(it, /*by_server=*/true);
          continue;
        }
        if (c.phase == Phase::kHolding && !c.head.empty()) {
          end(it, /*by_server=*/false);
          continue;
        }
      }
      if (c.phase != Phase::kSending) continue;
      const std::string& request = o.requests[c.request];
      const size_t total = request.size() + extra.size();
      bool reset = false;
      while (c.sent < total) {
        const bool in_request = c.sent < request.size();
        const char* from =
            in_request ? request.data() + c.sent : extra.data() + (c.sent - request.size());
        const size_t left = in_request ? request.size() - c.sent : total - c.sent;
        const ssize_t put = send(fd, from, left, MSG_NOSIGNAL);
        if (put < 0) {
          reset = !Retry(errno);
          break;
        }
        c.sent += static_cast<size_t>(put);
        c.deadline = Clock::now() + o.send_timeout;
      }
      if (reset) {
        end(it, /*by_server=*/true);
      } else if (c.sent == total) {
        ++stats.sent_all;
        if (o.hold.count() == 0 || !c.head.empty()) {
          end(it, /*by_server=*/false);
        } else {
          c.phase = Phase::kHolding;
          c.deadline = Clock::now() + o.hold;
          watch(fd, EPOLLIN | EPOLLRDHUP);
        }
      }
    }
    const Clock::time_point now = Clock::now();
    for (auto it = open.begin(); it != open.end();) {
      const auto next = std::next(it);
      if (now >= it->second.deadline && it->second.phase == Phase::kConnecting) {
        ++stats.connect_failures;
        close(it->first);
        open.erase(it);
      } else if (now >= it->second.deadline) {
        if (it->second.phase == Phase::kSending) ++stats.send_stalled;
        end(it, /*by_server=*/false);
      }
      it = next;
    }
  }
  close(epoll);
  stats.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return stats;
}

}  // namespace heavykv::cli
