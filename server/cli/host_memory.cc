#include "server/cli/host_memory.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace heavykv::cli {
namespace {

// The first line of `path` as a byte count; nullopt when absent or "max" (no limit).
std::optional<int64_t> ReadBytes(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  int64_t v = 0;
  if (!std::getline(in, line) || !absl::SimpleAtoi(line, &v)) return std::nullopt;
  return v;
}

std::optional<int64_t> MemAvailable() {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string key;
    int64_t kib = 0;
    if (fields >> key >> kib && key == "MemAvailable:") return kib * 1024;
  }
  return std::nullopt;
}

std::string GiB(int64_t bytes) { return absl::StrFormat("%.1f GiB", double(bytes) / (1 << 30)); }

}  // namespace

std::optional<int64_t> AvailableHostMemoryBytes() {
  std::optional<int64_t> avail = MemAvailable();
  // cgroup v2, then v1: what the container may still take.
  std::optional<int64_t> limit = ReadBytes("/sys/fs/cgroup/memory.max");
  std::optional<int64_t> usage = ReadBytes("/sys/fs/cgroup/memory.current");
  if (!limit) {
    limit = ReadBytes("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    usage = ReadBytes("/sys/fs/cgroup/memory/memory.usage_in_bytes");
  }
  if (limit && *limit < (int64_t(1) << 60)) {  // v1 reports "no limit" as a huge number
    const int64_t left = std::max<int64_t>(0, *limit - usage.value_or(0));
    avail = avail ? std::min(*avail, left) : left;
  }
  return avail;
}

absl::Status CheckHostMemory(int64_t bytes, std::string_view what, double fraction) {
  const std::optional<int64_t> avail = AvailableHostMemoryBytes();
  if (!avail || bytes <= fraction * double(*avail)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      absl::string_view(what.data(), what.size()), " needs ", GiB(bytes),
      " but this machine (or container) has ", GiB(*avail), " available: make it smaller"));
}

}  // namespace heavykv::cli
