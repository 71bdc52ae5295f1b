#include "server/client/http_flood.h"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <queue>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"

namespace heavykv::cli {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr char kHalfHeader[] = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Ty";
constexpr int kMaxConnecting = 256;  // connects in flight at once: a SYN burst of 10,000 would
                                     // overflow the server's accept queue and wait out retries
constexpr auto kSampleEvery = 100ms;
// A socket that ended sooner than this after its connect started is replaced only this long
// after, so that a server refusing at once is not met with a busy loop of connects.
constexpr auto kShortLived = 1s;
constexpr size_t kMaxHead = 512;  // bytes of a response kept to read its status

const char* ClosedBy(std::string_view head) {
  switch (const int status = ResponseStatus(head)) {
    case 0:
      return "none";
    case 408:
      return "408";
    case 429:
      return "429";
    case 503:
      return "503";
    default:
      return status > 0 ? "other" : "none";
  }
}

int Millis(Clock::duration d) {
  return static_cast<int>(
      std::clamp<int64_t>(std::chrono::ceil<std::chrono::milliseconds>(d).count(), 0, 100));
}

}  // namespace

// Each slot is one of the N connections: idle (waiting in due_ to be opened), connecting, or open.
// Invariant: connecting_ and open_ count the slots in those states.
class SlowFlood::Loop {
 public:
  explicit Loop(const SlowFloodOptions& options)
      : options_(options), slots_(static_cast<size_t>(options.connections)) {
    epoll_ = epoll_create1(EPOLL_CLOEXEC);
    const Clock::time_point now = Clock::now();
    for (int i = 0; i < options.connections; ++i) due_.push({now, i});
  }
  ~Loop() {
    for (Slot& s : slots_) {
      if (s.fd >= 0) close(s.fd);
    }
    if (epoll_ >= 0) close(epoll_);
  }
  bool ok() const { return epoll_ >= 0; }

  void Run(SlowFlood& owner) {
    std::vector<epoll_event> events(1024);
    Clock::time_point next_sample = Clock::now() + kSampleEvery;
    while (!owner.stop_.load()) {
      OpenDue();
      Clock::time_point wake = next_sample;
      if (!due_.empty() && connecting_ < kMaxConnecting) wake = std::min(wake, due_.top().first);
      const int n = epoll_wait(epoll_, events.data(), static_cast<int>(events.size()),
                               Millis(wake - Clock::now()));
      for (int i = 0; i < n; ++i) OnEvent(static_cast<int>(events[i].data.u32), events[i].events);
      if (owner.measure_requested_.exchange(false)) {
        stats_ = SlowFloodStats();
        samples_ = 0;
        open_sum_ = 0;
        Sample(owner);
      }
      if (Clock::now() >= next_sample) {
        Sample(owner);
        next_sample += kSampleEvery;
      }
    }
    Sample(owner);
  }

 private:
  enum class State { kIdle, kConnecting, kOpen };
  struct Slot {
    int fd = -1;
    State state = State::kIdle;
    bool used = false;  // opened before: the next open is a reconnect
    Clock::time_point started;
    std::string head;  // the first bytes the server sent
  };
  using Due = std::pair<Clock::time_point, int>;  // when, slot

  void OpenDue() {
    const Clock::time_point now = Clock::now();
    while (!due_.empty() && connecting_ < kMaxConnecting && due_.top().first <= now) {
      const int index = due_.top().second;
      due_.pop();
      Open(index, now);
    }
  }

  void Open(int index, Clock::time_point now) {
    Slot& s = slots_[static_cast<size_t>(index)];
    if (s.used) ++stats_.reconnects;
    s.used = true;
    const std::vector<std::string>& sources = options_.sources;
    const std::string none;
    const std::string& source = sources.empty() ? none : sources[next_source_++ % sources.size()];
    s.fd = StartConnect(options_.target, source);
    epoll_event ev{};
    ev.events = EPOLLOUT;
    ev.data.u32 = static_cast<uint32_t>(index);
    if (s.fd < 0 || epoll_ctl(epoll_, EPOLL_CTL_ADD, s.fd, &ev) != 0) {
      if (s.fd >= 0) close(s.fd);
      s.fd = -1;
      ++stats_.connect_failures;
      due_.push({now + kShortLived, index});
      return;
    }
    s.state = State::kConnecting;
    s.started = now;
    s.head.clear();
    ++connecting_;
  }

  void OnEvent(int index, uint32_t events) {
    Slot& s = slots_[static_cast<size_t>(index)];
    if (s.state == State::kConnecting) {
      --connecting_;
      if (ConnectError(s.fd) != 0 || (events & (EPOLLERR | EPOLLHUP)) != 0) {
        ++stats_.connect_failures;
        End(index, nullptr);
        return;
      }
      s.state = State::kOpen;
      ++open_;
      if (options_.kind == SlowKind::kHalfHeader) {
        // 48 bytes into an empty send buffer: all of them go, or the peer is gone (read below).
        send(s.fd, kHalfHeader, sizeof kHalfHeader - 1, MSG_NOSIGNAL);
      }
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLRDHUP;
      ev.data.u32 = static_cast<uint32_t>(index);
      epoll_ctl(epoll_, EPOLL_CTL_MOD, s.fd, &ev);
      return;
    }
    if (s.state != State::kOpen) return;
    char buf[4096];
    for (;;) {
      const ssize_t n = recv(s.fd, buf, sizeof buf, 0);
      if (n > 0) {
        s.head.append(buf, std::min(static_cast<size_t>(n), kMaxHead - s.head.size()));
        // A whole response head: the server has answered; this socket will get nothing more.
        if (s.head.find("\r\n\r\n") != std::string::npos || s.head.size() == kMaxHead) break;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      break;  // closed (0) or reset
    }
    End(index, ClosedBy(s.head));
  }

  // Closes the slot's socket, counts `closed_by` (an open socket the server ended) and queues
  // the slot to be opened again.
  void End(int index, const char* closed_by) {
    Slot& s = slots_[static_cast<size_t>(index)];
    if (s.state == State::kOpen) --open_;
    if (closed_by != nullptr) ++stats_.closed_by[closed_by];
    close(s.fd);
    s.fd = -1;
    s.state = State::kIdle;
    const Clock::time_point now = Clock::now();
    due_.push({now - s.started < kShortLived ? s.started + kShortLived : now, index});
  }

  void Sample(SlowFlood& owner) {
    stats_.open_now = open_;
    stats_.connecting_now = connecting_;
    stats_.open_min = samples_ == 0 ? open_ : std::min(stats_.open_min, open_);
    ++samples_;
    open_sum_ += open_;
    stats_.open_mean = static_cast<double>(open_sum_) / static_cast<double>(samples_);
    std::lock_guard<std::mutex> lock(owner.mu_);
    owner.published_ = stats_;
  }

  const SlowFloodOptions& options_;
  int epoll_ = -1;
  std::vector<Slot> slots_;
  std::priority_queue<Due, std::vector<Due>, std::greater<Due>> due_;  // idle slots, soonest first
  int connecting_ = 0, open_ = 0;
  size_t next_source_ = 0;
  SlowFloodStats stats_;
  int64_t samples_ = 0, open_sum_ = 0;
};

SlowFlood::SlowFlood(SlowFloodOptions options) : options_(std::move(options)) {}

SlowFlood::~SlowFlood() { Stop(); }

absl::Status SlowFlood::Start() {
  loop_ = std::make_unique<Loop>(options_);
  if (!loop_->ok()) {
    loop_.reset();
    return absl::InternalError(absl::StrCat("epoll_create1: ", std::strerror(errno)));
  }
  thread_ = std::thread([this] { loop_->Run(*this); });
  return absl::OkStatus();
}

bool SlowFlood::WaitOpen(int n, std::chrono::milliseconds timeout) const {
  for (const Clock::time_point until = Clock::now() + timeout;; std::this_thread::sleep_for(10ms)) {
    if (stats().open_now >= n) return true;
    if (Clock::now() >= until) return false;
  }
}

SlowFloodStats SlowFlood::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return published_;
}

SlowFloodStats SlowFlood::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  loop_.reset();  // closes the sockets
  return stats();
}

}  // namespace heavykv::cli
