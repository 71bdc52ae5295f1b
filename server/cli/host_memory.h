// What this process may still allocate on the host, so that a pool size that cannot fit fails at
// start-up with a clear message instead of std::bad_alloc or the OOM killer.
//
//   if (absl::Status s = CheckHostMemory(pool_bytes, "the KV pool (--kv-pages)"); !s.ok()) ...
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "absl/status/status.h"

namespace heavykv::cli {

// The smaller of /proc/meminfo's MemAvailable and what the cgroup (v2 memory.max, or v1
// memory.limit_in_bytes) still allows; std::nullopt when neither can be read.
std::optional<int64_t> AvailableHostMemoryBytes();

// INVALID_ARGUMENT naming `what`, its size and the memory available when `bytes` exceeds
// `fraction` of it; OK when it fits or the available memory is unknown.
absl::Status CheckHostMemory(int64_t bytes, std::string_view what, double fraction = 0.9);

}  // namespace heavykv::cli
