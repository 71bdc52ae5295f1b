#include "server/client/front_load.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/client/bench_http.h"
#include "server/client/metrics_scrape.h"
#include "server/flags/cli_flags.h"

namespace heavykv::cli {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr auto kRampTimeout = 60s;
constexpr auto kProbeAfterOverflow = 3s;
const char* const kClosedBy[] = {"408", "429", "503", "other", "none"};
// What --metrics-url reports: the idle gauges (metrics_scrape.h) and the pages cached prefixes
// keep, which an idle server may hold.
const char* const kReportedSeries[] = {"heavykv_http_open_connections", "heavykv_requests_running",
                                       "heavykv_requests_waiting", "heavykv_kv_pages_used",
                                       "heavykv_prefix_cache_cached_pages"};

double Mb(int64_t kb) { return static_cast<double>(kb) / 1024.0; }

nlohmann::ordered_json SampleJson(const ProcessSample& s) {
  return {{"rss_mb", Rounded(Mb(s.rss_kb), 1)},
          {"hwm_mb", Rounded(Mb(s.hwm_kb), 1)},
          {"threads", s.threads},
          {"http_threads", s.http_threads}};
}

}  // namespace

absl::StatusOr<std::unique_ptr<FrontLoad>> FrontLoad::Start(const FrontLoadOptions& o) {
  std::unique_ptr<FrontLoad> load(new FrontLoad(o));
  if (o.server_pid > 0) {
    absl::StatusOr<ProcessSample> before = SampleProcess(o.server_pid);
    if (!before.ok()) return before.status();
    load->before_ = *before;
    load->peak_ = std::make_unique<ProcessPeak>(o.server_pid);
  }
  if (o.slow_connections < 0) return load;

  if (o.slow_kind != "half-header" && o.slow_kind != "silent") {
    return absl::InvalidArgumentError("--slow-kind must be half-header or silent");
  }
  if (o.slow_sources < 1 || o.slow_sources > 250 || o.probe_interval_ms < 0) {
    return absl::InvalidArgumentError(
        "--slow-sources must be in [1, 250], --probe-interval-ms at least 0");
  }
  absl::StatusOr<TcpTarget> target = ResolveHttpUrl(o.http_url);
  if (!target.ok()) return target.status();
  SlowFloodOptions flood;
  flood.target = *target;
  flood.connections = o.slow_connections;
  flood.kind = o.slow_kind == "silent" ? SlowKind::kSilent : SlowKind::kHalfHeader;
  HttpProbeOptions probe;
  probe.target = *target;
  probe.interval = std::chrono::milliseconds(o.probe_interval_ms);
  probe.path = o.probe_path;
  probe.api_key = o.api_key;
  if (o.slow_sources > 1) {
    if (!target->ipv4_loopback) {
      return absl::InvalidArgumentError(absl::StrCat("--slow-sources ", o.slow_sources,
                                                     " binds to 127.0.0.x: the --http server ",
                                                     o.http_url, " must be on IPv4 loopback"));
    }
    for (int i = 0; i < o.slow_sources; ++i)
      flood.sources.push_back(absl::StrCat("127.0.0.", 2 + i));
    probe.source = "127.0.0.1";
  }
  const int64_t files = RaiseFileLimit();
  const int64_t needed = int64_t{o.slow_connections} + o.other_sockets + 256 +
                         (o.overflow_connections > 0 ? o.overflow_concurrency : 0);
  if (needed > files) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--slow-connections ", o.slow_connections, " needs about ", needed,
        " open files; the limit is ", files, " (raise the hard limit, ulimit -Hn, or flood less)"));
  }

  if (o.slow_connections > 0) {
    const Clock::time_point ramp = Clock::now();
    load->flood_ = std::make_unique<SlowFlood>(std::move(flood));
    if (absl::Status s = load->flood_->Start(); !s.ok()) return s;
    load->flood_->WaitOpen(o.slow_connections,
                           std::chrono::duration_cast<std::chrono::milliseconds>(kRampTimeout));
    load->ramp_seconds_ = std::chrono::duration<double>(Clock::now() - ramp).count();
    load->flood_->StartMeasuring();
  }
  if (o.probe_interval_ms > 0) {
    load->probe_ = std::make_unique<HttpProbe>(std::move(probe));
    if (absl::Status s = load->probe_->Start(); !s.ok()) return s;
  }
  if (o.overflow_connections > 0) {
    OverflowOptions overflow;
    overflow.target = *target;
    overflow.connections = o.overflow_connections;
    overflow.concurrency = o.overflow_concurrency;
    overflow.sources = flood.sources;
    overflow.requests = o.overflow_requests;
    overflow.hold = std::chrono::milliseconds(o.overflow_hold_ms);
    FrontLoad* self = load.get();
    load->overflow_thread_ = std::thread(
        [self, overflow = std::move(overflow)] { self->overflow_stats_ = RunOverflow(overflow); });
  }
  return load;
}

FrontLoad::~FrontLoad() { Finish(); }

void FrontLoad::Finish() {
  if (finished_) return;
  finished_ = true;
  if (overflow_thread_.joinable()) overflow_thread_.join();
  // The probe goes on while the server settles: is it there for others after the load too?
  const Clock::time_point load_end = Clock::now();
  const bool scrape = !options_.metrics_url.empty();
  const auto at_least = options_.overflow_connections > 0 ? kProbeAfterOverflow : 0s;
  const auto at_most = std::chrono::duration<double>(options_.settle_seconds);
  for (;;) {
    const Clock::time_point now = Clock::now();
    if (scrape) {
      metrics_ = ScrapeMetrics(options_.metrics_url);
      if (!metrics_.ok()) break;
      if (settled_seconds_ < 0 && MetricsIdle(*metrics_)) {
        settled_seconds_ = std::chrono::duration<double>(now - load_end).count();
      }
    }
    if (((!scrape || settled_seconds_ >= 0) && now - load_end >= at_least) ||
        now - load_end >= at_most) {
      break;
    }
    std::this_thread::sleep_for(100ms);
  }
  if (probe_ != nullptr) probe_stats_ = probe_->Stop();
  if (flood_ != nullptr) flood_stats_ = flood_->Stop();
  if (peak_ != nullptr) {
    std::this_thread::sleep_for(1s);  // time for the server to see the closes and end threads
    peak_sample_ = peak_->Stop();
    if (absl::StatusOr<ProcessSample> after = SampleProcess(options_.server_pid); after.ok()) {
      after_ = *after;
    }
  }
  if (scrape && metrics_.ok()) metrics_ = ScrapeMetrics(options_.metrics_url);
  std::sort(probe_stats_.latency.begin(), probe_stats_.latency.end());
}

nlohmann::ordered_json FrontLoad::Json() const {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  if (flood_ != nullptr) {
    nlohmann::ordered_json closed_by = nlohmann::ordered_json::object();
    for (const char* k : kClosedBy) {
      const auto it = flood_stats_.closed_by.find(k);
      closed_by[k] = it == flood_stats_.closed_by.end() ? 0 : it->second;
    }
    out["slow_flood"] = {{"connections", options_.slow_connections},
                         {"kind", options_.slow_kind},
                         {"sources", options_.slow_sources},
                         {"ramp_seconds", Rounded(ramp_seconds_, 3)},
                         {"open_min", flood_stats_.open_min},
                         {"open_mean", Rounded(flood_stats_.open_mean, 1)},
                         {"reconnects", flood_stats_.reconnects},
                         {"connect_failures", flood_stats_.connect_failures},
                         {"closed_by", std::move(closed_by)}};
  }
  if (options_.overflow_connections > 0 && !overflow_stats_.ok()) {
    out["overflow"] = {{"error", overflow_stats_.status().ToString()}};
  } else if (options_.overflow_connections > 0) {
    const OverflowStats& o = *overflow_stats_;
    out["overflow"] = {{"connections", options_.overflow_connections},
                       {"concurrency", options_.overflow_concurrency},
                       {"extra_bytes", OverflowOptions().extra_bytes},
                       {"hold_ms", options_.overflow_hold_ms},
                       {"sources", options_.slow_sources},
                       {"seconds", Rounded(o.seconds, 3)},
                       {"opened", o.opened},
                       {"connect_failures", o.connect_failures},
                       {"sent_all", o.sent_all},
                       {"send_stalled", o.send_stalled},
                       {"closed_by_server", o.closed_by_server},
                       {"responses", o.responses}};
  }
  if (probe_ != nullptr) {
    const std::vector<double>& v = probe_stats_.latency;
    out["probe"] = {{"path", options_.probe_path},
                    {"interval_ms", options_.probe_interval_ms},
                    {"sent", probe_stats_.sent},
                    {"ok", probe_stats_.ok},
                    {"failed", probe_stats_.sent - probe_stats_.ok},
                    {"failures", probe_stats_.failures},
                    {"latency_ms",
                     {{"p50", Rounded(1000 * Percentile(v, 50), 3)},
                      {"p99", Rounded(1000 * Percentile(v, 99), 3)},
                      {"max", Rounded(1000 * (v.empty() ? 0 : v.back()), 3)}}}};
  }
  if (before_) {
    nlohmann::ordered_json server = {{"pid", options_.server_pid},
                                     {"before", SampleJson(*before_)}};
    if (peak_sample_) server["peak"] = SampleJson(*peak_sample_);
    if (after_) {
      server["after"] = SampleJson(*after_);
      server["rss_growth_mb"] = Rounded(Mb(after_->rss_kb - before_->rss_kb), 1);
      server["threads_left"] = after_->threads - before_->threads;
    }
    out["server"] = std::move(server);
  }
  if (!options_.metrics_url.empty()) {
    nlohmann::ordered_json metrics = {{"url", options_.metrics_url}};
    if (!metrics_.ok()) {
      metrics["error"] = metrics_.status().ToString();
    } else {
      metrics["idle"] = MetricsIdle(*metrics_);
      metrics["settled_seconds"] =
          settled_seconds_ >= 0 ? nlohmann::ordered_json(Rounded(settled_seconds_, 3)) : nullptr;
      nlohmann::ordered_json values = nlohmann::ordered_json::object();
      for (const char* name : kReportedSeries) {
        const auto it = metrics_->find(name);
        values[name] = it == metrics_->end() ? nlohmann::ordered_json(nullptr)
                                             : nlohmann::ordered_json(it->second);
      }
      metrics["values"] = std::move(values);
    }
    out["metrics"] = std::move(metrics);
  }
  return out;
}

std::string FrontLoad::Table() const {
  std::string out;
  if (flood_ != nullptr) {
    const SlowFloodStats& f = flood_stats_;
    std::vector<std::string> closed;
    for (const char* k : kClosedBy) {
      const auto it = f.closed_by.find(k);
      closed.push_back(absl::StrCat(k, " ", it == f.closed_by.end() ? 0 : it->second));
    }
    absl::StrAppendFormat(&out,
                          "slow flood      %d %s connections from %d source%s: open min %d, "
                          "mean %.1f (ramp %.2f s)\n",
                          options_.slow_connections, options_.slow_kind, options_.slow_sources,
                          options_.slow_sources == 1 ? "" : "s", f.open_min, f.open_mean,
                          ramp_seconds_);
    absl::StrAppendFormat(&out,
                          "                %d reconnects, %d connect failures; closed by the "
                          "server after: %s\n",
                          f.reconnects, f.connect_failures, absl::StrJoin(closed, ", "));
  }
  if (options_.overflow_connections > 0 && !overflow_stats_.ok()) {
    absl::StrAppend(&out, "overflow        failed: ", overflow_stats_.status().ToString(), "\n");
  } else if (options_.overflow_connections > 0) {
    const OverflowStats& o = *overflow_stats_;
    std::vector<std::string> answered;
    for (const auto& [k, n] : o.responses) answered.push_back(absl::StrCat(k, " ", n));
    absl::StrAppendFormat(&out,
                          "overflow        %d connections of a request + %d bytes (%d at once, "
                          "%d source%s) in %.2f s: %d opened, %d connect failures\n",
                          options_.overflow_connections, OverflowOptions().extra_bytes,
                          options_.overflow_concurrency, options_.slow_sources,
                          options_.slow_sources == 1 ? "" : "s", o.seconds, o.opened,
                          o.connect_failures);
    absl::StrAppendFormat(&out,
                          "                %d sent everything, %d stalled sending, %d closed by "
                          "the server first; answered: %s\n",
                          o.sent_all, o.send_stalled, o.closed_by_server,
                          absl::StrJoin(answered, ", "));
  }
  if (probe_ != nullptr) {
    const HttpProbeStats& p = probe_stats_;
    std::vector<std::string> why;
    for (const auto& [k, n] : p.failures) why.push_back(absl::StrCat(k, " ", n));
    absl::StrAppendFormat(&out,
                          "probe           GET %s every %d ms: %d sent, %d ok, %d failed%s%s\n",
                          options_.probe_path, options_.probe_interval_ms, p.sent, p.ok,
                          p.sent - p.ok, why.empty() ? "" : ": ", absl::StrJoin(why, ", "));
    absl::StrAppendFormat(&out, "probe ms        p50 %8.2f  p99 %8.2f  max %8.2f\n",
                          1000 * Percentile(p.latency, 50), 1000 * Percentile(p.latency, 99),
                          1000 * (p.latency.empty() ? 0 : p.latency.back()));
  }
  if (before_) {
    const auto line = [&](const char* name, const std::optional<ProcessSample>& s) {
      if (!s) return;
      absl::StrAppendFormat(&out, "server %-8s RSS %8.1f MB  VmHWM %8.1f MB  threads %5d\n", name,
                            Mb(s->rss_kb), Mb(s->hwm_kb), s->threads);
    };
    line("before", before_);
    line("peak", peak_sample_);
    line("after", after_);
    if (after_) {
      absl::StrAppendFormat(&out, "server change   RSS %+.1f MB, threads %+d (pid %d)\n",
                            Mb(after_->rss_kb - before_->rss_kb),
                            after_->threads - before_->threads, options_.server_pid);
    }
  }
  if (!options_.metrics_url.empty() && !metrics_.ok()) {
    absl::StrAppend(&out, "metrics after   ", metrics_.status().ToString(), "\n");
  } else if (!options_.metrics_url.empty()) {
    std::vector<std::string> values;
    for (const char* name : kReportedSeries) {
      const auto it = metrics_->find(name);
      values.push_back(absl::StrCat(std::string(name).substr(8), " ",
                                    it == metrics_->end() ? "-" : absl::StrCat(it->second)));
    }
    absl::StrAppend(&out, "metrics after   ", absl::StrJoin(values, ", "), "\n");
    absl::StrAppend(
        &out, "                ",
        settled_seconds_ >= 0
            ? absl::StrFormat("idle %.2f s after the load", settled_seconds_)
            : absl::StrFormat("not idle within %.0f s of the load", options_.settle_seconds),
        "\n");
  }
  return out;
}

}  // namespace heavykv::cli
