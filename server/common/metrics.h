// Metrics: the server's Prometheus series, vLLM's names with a `heavykv_` prefix (prometheus-cpp
// core), served over HTTP at /metrics by http_metrics.h.
//
//   auto metrics = std::make_shared<Metrics>();
//   options.observer = metrics.get();              // counters and histograms, from the engine
//   ...create the engine...
//   metrics->SetStatsSource([&] { return engine->Stats(); });
//   auto http = StartMetricsHttp("127.0.0.1:9090", metrics);      // http_metrics.h
//
// Counters and histograms are fed by the EngineObserver events (engine thread). The gauges
// (pages, usage ratio, running and waiting requests) are read from the stats source on each
// scrape, so a scrape always agrees with GetCacheStats at that moment.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/serving/engine.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/common/http_stats.h"

namespace heavykv::server {

class Metrics final : public EngineObserver, public prometheus::Collectable {
 public:
  Metrics();

  // Where the gauges come from; call once before the first scrape (thread-safe).
  void SetStatsSource(std::function<CacheStats()> stats);
  // The OpenAI HTTP front's connections (heavykv_http_*); unset: those series stay 0.
  void SetHttpStatsSource(std::function<HttpServerStats()> stats);

  // EngineObserver (engine thread).
  void OnStep(int32_t iteration_tokens) override;
  void OnPromptTokens(int32_t n) override;
  void OnGenerationTokens(int32_t n) override;
  void OnFirstToken(double seconds_since_arrival) override;
  void OnInterToken(double seconds) override;
  void OnQueued(double queue_seconds) override;
  void OnEvicted(const std::string& policy, int64_t tokens) override;
  void OnPreemption() override;
  void OnRequestFinished(const std::string& finish_reason, double e2e_seconds) override;

  // A request refused before it ran (bad input, full queue, draining, no valid API key), by gRPC
  // status code name (gRPC threads).
  void OnRejected(const std::string& code);

  // prometheus::Collectable (HTTP thread): refreshes the gauges, then returns every series.
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  mutable std::mutex mu_;
  std::function<CacheStats()> stats_;  // guarded by mu_
  std::function<HttpServerStats()> http_stats_;  // guarded by mu_

  prometheus::Gauge* kv_cache_usage_ratio_;
  prometheus::Gauge* kv_pages_total_;
  prometheus::Gauge* kv_pages_used_;
  prometheus::Gauge* kv_bytes_per_token_;
  prometheus::Gauge* kv_pages_demoted_;
  prometheus::Gauge* kv_pages_packed_;
  // Prefix caching (from the engine's CacheStats; the counters follow its totals).
  prometheus::Gauge* prefix_cache_cached_pages_;
  prometheus::Counter* prefix_cache_lookups_total_;
  prometheus::Counter* prefix_cache_hits_total_;
  prometheus::Counter* prefix_cache_hit_tokens_total_;
  prometheus::Counter* prefix_cache_reclaimed_pages_total_;
  prometheus::Gauge* requests_running_;
  prometheus::Gauge* requests_held_;
  prometheus::Gauge* requests_waiting_;
  prometheus::Counter* preemptions_total_;
  prometheus::Counter* prompt_tokens_total_;
  prometheus::Counter* generation_tokens_total_;
  prometheus::Family<prometheus::Counter>* kv_tokens_evicted_total_;  // {policy}
  prometheus::Family<prometheus::Counter>* request_success_total_;    // {finish_reason}
  prometheus::Family<prometheus::Counter>* request_rejected_total_;   // {code}
  prometheus::Histogram* time_to_first_token_seconds_;
  prometheus::Histogram* inter_token_latency_seconds_;
  prometheus::Histogram* e2e_request_latency_seconds_;
  prometheus::Histogram* request_queue_time_seconds_;
  prometheus::Histogram* iteration_tokens_;
  prometheus::Gauge* http_open_connections_;
  prometheus::Gauge* http_open_clients_;
  prometheus::Counter* http_refused_max_connections_;  // {reason="max_connections"}
  prometheus::Counter* http_refused_per_client_;       // {reason="per_client"}
  prometheus::Counter* http_timeouts_[4];              // {phase=header|body|idle|write}
};

}  // namespace heavykv::server
