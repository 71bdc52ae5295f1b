// SlowFlood: N idle client connections held open to an HTTP server, as slowloris holds them:
// each sends half a request header (or nothing) and then waits. When the server closes one, the
// flood records how (the status of the response it sent first, if any) and opens another, so N
// stay open or in progress for as long as the flood runs. One thread and epoll drive every
// socket, so ten thousand cost the client a few MB, not ten thousand threads.
//
//   SlowFlood flood({.target = *ResolveHttpUrl(url), .connections = 10000});
//   flood.Start();
//   flood.WaitOpen(10000, std::chrono::seconds(60));  // the ramp
//   flood.StartMeasuring();                            // counters and samples from here on
//   ... measure something else ...
//   SlowFloodStats s = flood.Stop();                   // closes every socket
//
// Thread-safety: Start, WaitOpen, StartMeasuring, stats and Stop may be called from any one
// thread; only the flood's own thread touches the sockets.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "server/client/tcp_client.h"

namespace heavykv::cli {

enum class SlowKind {
  kHalfHeader,  // "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Ty", then nothing
  kSilent,      // connects and sends nothing
};

struct SlowFloodOptions {
  TcpTarget target;
  int connections = 0;
  SlowKind kind = SlowKind::kHalfHeader;
  // IPv4 source addresses the sockets are bound to, round-robin; empty: the kernel's choice.
  std::vector<std::string> sources;
};

// Counted from StartMeasuring() (everything before it, when it was never called).
struct SlowFloodStats {
  int open_now = 0;        // connected sockets at the last sample
  int connecting_now = 0;  // connects in progress at the last sample
  int open_min = 0;        // connected sockets, least and mean of the samples (every 100 ms)
  double open_mean = 0;
  int64_t reconnects = 0;        // sockets opened in place of one that closed or failed
  int64_t connect_failures = 0;  // connects refused, reset or timed out
  // Sockets the server ended, by what it sent first: "408", "429", "503", "other" (another
  // status) or "none" (closed or reset without a response).
  std::map<std::string, int64_t> closed_by;
};

class SlowFlood {
 public:
  explicit SlowFlood(SlowFloodOptions options);
  ~SlowFlood();
  SlowFlood(const SlowFlood&) = delete;
  SlowFlood& operator=(const SlowFlood&) = delete;

  // Starts the flood's thread, which opens the connections (a few hundred connects in flight at
  // a time). INTERNAL when epoll cannot be created.
  absl::Status Start();
  // Waits until `n` sockets are connected (true) or `timeout` passes (false).
  bool WaitOpen(int n, std::chrono::milliseconds timeout) const;
  // Zeroes the counters and samples: what follows is the measured run.
  void StartMeasuring() { measure_requested_ = true; }
  SlowFloodStats stats() const;
  // Closes every socket, ends the thread and returns the final counts. Idempotent.
  SlowFloodStats Stop();

 private:
  class Loop;  // the sockets and counters; only the flood's thread touches them

  const SlowFloodOptions options_;
  std::unique_ptr<Loop> loop_;
  std::thread thread_;
  std::atomic<bool> stop_{false}, measure_requested_{false};
  mutable std::mutex mu_;
  SlowFloodStats published_;  // guarded by mu_: the loop's counts, copied at every sample
};

}  // namespace heavykv::cli
