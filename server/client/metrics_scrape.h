// The server's Prometheus page as `heavykv bench --metrics-url` reads it after a load: did the
// server give back everything the load took (connections, sequences, KV pages)?
//
//   absl::StatusOr<std::map<std::string, double>> m = ScrapeMetrics(url);  // http://.../metrics
//   (*m)["heavykv_kv_pages_used"]
#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace heavykv::cli {

// The gauges that are all 0 on a server with nothing to do, and that a load which leaks leaves
// above 0: open HTTP connections, running and waiting sequences, KV pages held by sequences.
inline constexpr const char* kIdleSeries[] = {"heavykv_http_open_connections",
                                              "heavykv_requests_running",
                                              "heavykv_requests_waiting", "heavykv_kv_pages_used"};

// GET `url` (http://host:port/path) and its samples: "name{labels}" -> value (comments and
// malformed lines skipped). INVALID_ARGUMENT for a URL that is not http://, UNAVAILABLE when
// the server cannot be reached or does not answer 200 within 5 s.
absl::StatusOr<std::map<std::string, double>> ScrapeMetrics(const std::string& url);

// Whether every kIdleSeries present in `metrics` is 0 (and at least one is present).
bool MetricsIdle(const std::map<std::string, double>& metrics);

}  // namespace heavykv::cli
