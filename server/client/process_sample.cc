#include "server/client/process_sample.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace heavykv::cli {

absl::StatusOr<ProcessSample> SampleProcess(pid_t pid) {
  const std::string dir = absl::StrCat("/proc/", pid);
  std::ifstream status(dir + "/status");
  if (!status) return absl::NotFoundError(absl::StrCat("no process ", pid, " (", dir, ")"));
  ProcessSample s;
  bool has_rss = false;  // a zombie (exited, not yet reaped) has no VmRSS
  for (std::string line; std::getline(status, line);) {
    has_rss |= line.rfind("VmRSS:", 0) == 0;
    absl::string_view rest = line;
    int64_t* field = absl::ConsumePrefix(&rest, "VmRSS:")   ? &s.rss_kb
                     : absl::ConsumePrefix(&rest, "VmHWM:") ? &s.hwm_kb
                                                            : nullptr;
    if (field == nullptr) continue;
    absl::ConsumeSuffix(&rest, "kB");
    if (!absl::SimpleAtoi(rest, field)) *field = 0;
  }
  if (!has_rss) return absl::NotFoundError(absl::StrCat("process ", pid, " has exited"));
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir + "/task", ec), end; !ec && it != end;
       it.increment(ec)) {
    ++s.threads;
    std::ifstream comm(it->path() / "comm");
    std::string name;
    if (std::getline(comm, name) && name.rfind("heavykv-http", 0) == 0) ++s.http_threads;
  }
  if (ec || s.threads == 0) {
    return absl::NotFoundError(absl::StrCat("cannot list ", dir, "/task: ", ec.message()));
  }
  return s;
}

ProcessPeak::ProcessPeak(pid_t pid) : pid_(pid) {
  thread_ = std::thread([this] {
    while (!stop_.load()) {
      if (absl::StatusOr<ProcessSample> s = SampleProcess(pid_); s.ok()) {
        peak_.rss_kb = std::max(peak_.rss_kb, s->rss_kb);
        peak_.hwm_kb = std::max(peak_.hwm_kb, s->hwm_kb);
        peak_.threads = std::max(peak_.threads, s->threads);
        peak_.http_threads = std::max(peak_.http_threads, s->http_threads);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
}

ProcessSample ProcessPeak::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  return peak_;
}

}  // namespace heavykv::cli
