// FrontLoad: the connection-level half of `heavykv bench` (issues 33 and 41), around its measured
// requests: a SlowFlood of idle connections held against the --http server, an OverflowLoad of
// connections that each send a request and more bytes than the server buffers, then close; an
// HttpProbe that keeps asking GET /v1/models (or --probe-path) as another client would; the
// server process's RSS and thread count before, at their peak during, and one second after the
// load (--server-pid); and the server's idle gauges scraped once the load is over (--metrics-url).
//
//   absl::StatusOr<std::unique_ptr<FrontLoad>> load = FrontLoad::Start(options);  // flood ramped
//   ... the measured requests (the overflow runs meanwhile, on its own thread) ...
//   (*load)->Finish();  // overflow done, metrics settled, probe drained, flood closed, sampled
//   PrintJsonLine((*load)->Json()) or std::fputs((*load)->Table().c_str(), stdout);
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "server/client/http_flood.h"
#include "server/client/http_probe.h"
#include "server/client/overflow_load.h"
#include "server/client/process_sample.h"

namespace heavykv::cli {

struct FrontLoadOptions {
  std::string http_url;                   // the flood's and the probe's server: http://host:port
  int slow_connections = -1;              // -1: neither flood nor probe; 0: the probe alone
  std::string slow_kind = "half-header";  // or "silent"
  // Clients the flood stands for: 1 = the kernel's source address; K > 1 binds the sockets
  // round-robin to 127.0.0.2 .. 127.0.0.(K+1) (a loopback server only) and the probe to 127.0.0.1.
  int slow_sources = 1;
  int probe_interval_ms = 100;  // 0: no probe
  std::string probe_path = "/v1/models";
  // Connections that each send one of overflow_requests (whole HTTP requests, taken in turn) and
  // 200 KB more, then close; at most overflow_concurrency at once (overflow_load.h). Needs
  // slow_connections >= 0. 0: none.
  int overflow_connections = 0;
  int overflow_concurrency = 256;
  int overflow_hold_ms = 0;
  std::vector<std::string> overflow_requests;
  // Scraped once the load is over, until kIdleSeries are all 0 or settle_seconds pass (the probe
  // goes on meanwhile, and for at least 3 s after an overflow); empty: not scraped.
  std::string metrics_url;
  double settle_seconds = 10;
  std::string api_key;          // the probe's Bearer token
  pid_t server_pid = 0;         // 0: the server process is not watched
  int other_sockets = 0;        // sockets the rest of bench holds (for the file-limit check)
};

class FrontLoad {
 public:
  // Checks the options (INVALID_ARGUMENT: a bad kind or count, sources for a server that is not
  // on loopback, a flood over the file limit once raised to its hard limit; NOT_FOUND: no process
  // --server-pid), samples the server, opens the flood and waits up to 60 s for all of it to be
  // connected, then starts the probe.
  static absl::StatusOr<std::unique_ptr<FrontLoad>> Start(const FrontLoadOptions& options);
  ~FrontLoad();

  // Waits for the overflow to end and the metrics to settle, stops the probe (its requests in
  // flight finish or time out while the flood still holds), closes the flood, waits one second
  // and samples the server again; scrapes the metrics a last time. Idempotent.
  void Finish();
  bool probes_failed() const { return probe_stats_.sent > probe_stats_.ok; }

  // {"slow_flood", "overflow", "probe", "server", "metrics"}, each only when it ran.
  nlohmann::ordered_json Json() const;
  // The same as lines of bench's table.
  std::string Table() const;

 private:
  explicit FrontLoad(const FrontLoadOptions& options) : options_(options) {}

  const FrontLoadOptions options_;
  std::unique_ptr<SlowFlood> flood_;
  std::unique_ptr<HttpProbe> probe_;
  std::unique_ptr<ProcessPeak> peak_;
  std::thread overflow_thread_;
  absl::StatusOr<OverflowStats> overflow_stats_ = OverflowStats();  // written by overflow_thread_
  double ramp_seconds_ = 0;
  bool finished_ = false;
  // The last scrape of metrics_url, or why it failed; seconds from the end of the load until it
  // was idle (-1: not within settle_seconds).
  absl::StatusOr<std::map<std::string, double>> metrics_ = std::map<std::string, double>();
  double settled_seconds_ = -1;
  SlowFloodStats flood_stats_;
  HttpProbeStats probe_stats_;
  std::optional<ProcessSample> before_, peak_sample_, after_;
};

}  // namespace heavykv::cli
