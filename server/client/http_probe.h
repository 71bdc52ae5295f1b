// HttpProbe: a client that, every `interval`, opens a new connection to an HTTP server and asks
// one small request (GET /v1/models), timing each from the start of its connect to the end of
// the response. It answers the question a flood of other clients raises: is the server still
// there for someone else? Probes overlap when the server is slow (one starts every interval
// whatever the others are doing); one thread and epoll drive them.
//
//   HttpProbe probe({.target = *ResolveHttpUrl(url), .source = "127.0.0.1"});
//   probe.Start();
//   ... load the server ...
//   HttpProbeStats s = probe.Stop();  // waits for the probes in flight (up to their timeout)
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "server/client/tcp_client.h"

namespace heavykv::cli {

struct HttpProbeOptions {
  TcpTarget target;
  std::string source;  // IPv4 source address; empty: the kernel's choice
  std::chrono::milliseconds interval{100};
  std::chrono::milliseconds timeout{30000};  // connect to the last byte of the response
  std::string path = "/v1/models";
  std::string api_key;  // sent as a Bearer token when not empty
};

struct HttpProbeStats {
  int64_t sent = 0, ok = 0;  // ok: a whole 200 response within the timeout
  // The others by why: "timeout", "connect" (refused or reset before the request went),
  // "closed" (the connection ended before a whole response), "http_NNN" (another status).
  std::map<std::string, int64_t> failures;
  // Seconds each finished probe took, a failed one up to when it failed (a timeout: the
  // timeout), in the order they finished.
  std::vector<double> latency;
};

class HttpProbe {
 public:
  explicit HttpProbe(HttpProbeOptions options);
  ~HttpProbe();
  HttpProbe(const HttpProbe&) = delete;
  HttpProbe& operator=(const HttpProbe&) = delete;

  // Starts the probe's thread; the first probe starts at once. INTERNAL when epoll cannot be
  // created.
  absl::Status Start();
  HttpProbeStats stats() const;
  // Starts no more probes, waits for those in flight to finish or time out, and returns the
  // counts. Idempotent.
  HttpProbeStats Stop();

 private:
  struct Probe;
  void Run();
  void Finish(Probe& probe, const std::string& failure);

  const HttpProbeOptions options_;
  const std::string request_;
  int epoll_ = -1;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  HttpProbeStats stats_;  // guarded by mu_
};

}  // namespace heavykv::cli
