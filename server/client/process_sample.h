// The memory and threads of another process, as /proc shows them: `heavykv bench --server-pid`
// watches the server it loads with these (RSS growth and threads left behind by a load are what
// a connection flood costs a server).
//
//   absl::StatusOr<ProcessSample> before = SampleProcess(pid);
//   ProcessPeak peak(pid);  // samples every 100 ms until Stop()
//   ... load ...
//   ProcessSample most = peak.Stop();
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <thread>

#include "absl/status/statusor.h"

namespace heavykv::cli {

struct ProcessSample {
  int64_t rss_kb = 0;   // VmRSS
  int64_t hwm_kb = 0;   // VmHWM: the most RSS the process has ever had
  int64_t threads = 0;  // entries of /proc/PID/task
  int64_t http_threads = 0;  // of those, named heavykv-http-* (the HTTP front's loop and pool)
};

// NOT_FOUND when the process does not exist or has exited (or /proc cannot be read).
absl::StatusOr<ProcessSample> SampleProcess(pid_t pid);

// Samples a process every 100 ms on its own thread and keeps the largest value of each field.
class ProcessPeak {
 public:
  explicit ProcessPeak(pid_t pid);
  ~ProcessPeak() { Stop(); }
  ProcessPeak(const ProcessPeak&) = delete;
  ProcessPeak& operator=(const ProcessPeak&) = delete;

  // Ends the sampling (idempotent); the largest values seen.
  ProcessSample Stop();

 private:
  const pid_t pid_;
  std::atomic<bool> stop_{false};
  ProcessSample peak_;  // written by thread_ until it ends
  std::thread thread_;
};

}  // namespace heavykv::cli
