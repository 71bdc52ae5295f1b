// FrontLoad: the connection-level half of `heavykv bench` (issue 33), around its measured
// requests: a SlowFlood of idle connections held against the --http server, an HttpProbe that
// keeps asking GET /v1/models as another client would, and the server process's RSS and thread
// count before, at their peak during, and one second after the flood (--server-pid).
//
//   absl::StatusOr<std::unique_ptr<FrontLoad>> load = FrontLoad::Start(options);  // flood ramped
//   ... the measured requests ...
//   (*load)->Finish();                     // probe drained, flood closed, server sampled again
//   PrintJsonLine((*load)->Json()) or std::fputs((*load)->Table().c_str(), stdout);
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "server/client/http_flood.h"
#include "server/client/http_probe.h"
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

  // Stops the probe (its requests in flight finish or time out while the flood still holds),
  // closes the flood, waits one second and samples the server again. Idempotent.
  void Finish();
  bool probes_failed() const { return probe_stats_.sent > probe_stats_.ok; }

  // {"slow_flood": {...}, "probe": {...}, "server": {...}}, each only when it ran.
  nlohmann::ordered_json Json() const;
  // The same as lines of bench's table.
  std::string Table() const;

 private:
  explicit FrontLoad(const FrontLoadOptions& options) : options_(options) {}

  const FrontLoadOptions options_;
  std::unique_ptr<SlowFlood> flood_;
  std::unique_ptr<HttpProbe> probe_;
  std::unique_ptr<ProcessPeak> peak_;
  double ramp_seconds_ = 0;
  bool finished_ = false;
  SlowFloodStats flood_stats_;
  HttpProbeStats probe_stats_;
  std::optional<ProcessSample> before_, peak_sample_, after_;
};

}  // namespace heavykv::cli
