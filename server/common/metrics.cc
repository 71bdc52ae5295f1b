#include "server/common/metrics.h"

namespace heavykv::server {
namespace {

using prometheus::Histogram;

prometheus::Gauge* Gauge(prometheus::Registry& r, const std::string& name,
                         const std::string& help) {
  return &prometheus::BuildGauge().Name("heavykv_" + name).Help(help).Register(r).Add({});
}

prometheus::Family<prometheus::Counter>* CounterFamily(prometheus::Registry& r,
                                                       const std::string& name,
                                                       const std::string& help) {
  return &prometheus::BuildCounter().Name("heavykv_" + name).Help(help).Register(r);
}

Histogram* Hist(prometheus::Registry& r, const std::string& name, const std::string& help,
                Histogram::BucketBoundaries buckets) {
  return &prometheus::BuildHistogram()
              .Name("heavykv_" + name)
              .Help(help)
              .Register(r)
              .Add({}, std::move(buckets));
}

}  // namespace

Metrics::Metrics() : registry_(std::make_shared<prometheus::Registry>()) {
  prometheus::Registry& r = *registry_;
  kv_cache_usage_ratio_ = Gauge(r, "kv_cache_usage_ratio", "KV pages used / pages total (0..1)");
  kv_pages_total_ = Gauge(r, "kv_pages_total", "KV pool size in pages");
  kv_pages_used_ = Gauge(r, "kv_pages_used", "KV pages held by sequences");
  kv_bytes_per_token_ = Gauge(r, "kv_bytes_per_token",
                              "Pool bytes one token takes in every layer and kv head: K/V in the "
                              "pool's --kv-dtype (with the scales of int8/int4), pos and score");
  kv_pages_demoted_ = Gauge(r, "kv_pages_demoted",
                            "KV pages of demoted stores (MiKV, policies with demote=)");
  kv_pages_packed_ = Gauge(r, "kv_pages_packed",
                           "KV pages of requests with their own kv_dtype (int8/int4 packed)");
  prefix_cache_cached_pages_ =
      Gauge(r, "prefix_cache_cached_pages",
            "KV pages held by cached prompt prefixes (reclaimed when the pool needs them)");
  prefix_cache_lookups_total_ = &CounterFamily(r, "prefix_cache_lookups_total",
                                               "Admissions that looked up a cached prefix")
                                     ->Add({});
  prefix_cache_hits_total_ =
      &CounterFamily(r, "prefix_cache_hits_total", "Admissions that reused a cached prefix")
           ->Add({});
  prefix_cache_hit_tokens_total_ = &CounterFamily(r, "prefix_cache_hit_tokens_total",
                                                  "Prompt tokens reused from the prefix cache")
                                        ->Add({});
  prefix_cache_reclaimed_pages_total_ =
      &CounterFamily(r, "prefix_cache_reclaimed_pages_total",
                     "Cached prefix pages given back to the pool for running sequences")
           ->Add({});
  http_open_connections_ =
      Gauge(r, "http_open_connections", "Connections open on the OpenAI HTTP port");
  http_open_clients_ = Gauge(r, "http_open_clients",
                             "Client addresses with a connection open on the OpenAI HTTP port");
  auto* refused = CounterFamily(
      r, "http_refused_connections_total",
      "HTTP connections answered 503 (max_connections) or 429 (per_client) and closed, by cap");
  http_refused_max_connections_ = &refused->Add({{"reason", "max_connections"}});
  http_refused_per_client_ = &refused->Add({{"reason", "per_client"}});
  auto* timeouts = CounterFamily(
      r, "http_timeouts_total",
      "HTTP connections ended by a deadline: header/body (408), idle (keep-alive), write");
  const char* phases[4] = {"header", "body", "idle", "write"};
  for (int i = 0; i < 4; ++i) http_timeouts_[i] = &timeouts->Add({{"phase", phases[i]}});
  requests_running_ = Gauge(r, "requests_running", "Sequences in the running batch");
  requests_held_ = Gauge(r, "requests_held",
                         "Requests held because their client is not reading their stream");
  requests_waiting_ = Gauge(r, "requests_waiting", "Requests queued or preempted");
  preemptions_total_ =
      &CounterFamily(r, "preemptions_total", "Sequences preempted for lack of pages")->Add({});
  prompt_tokens_total_ =
      &CounterFamily(r, "prompt_tokens_total", "Prompt tokens of admitted requests")->Add({});
  generation_tokens_total_ =
      &CounterFamily(r, "generation_tokens_total", "Tokens generated")->Add({});
  kv_tokens_evicted_total_ = CounterFamily(r, "kv_tokens_evicted_total",
                                           "KV tokens evicted per (layer, kv head), by policy");
  request_success_total_ =
      CounterFamily(r, "request_success_total", "Finished requests, by finish reason");
  request_rejected_total_ = CounterFamily(
      r, "request_rejected_total", "Requests refused before running, by gRPC status code");
  // Exported at 0 from the start, so rate() and alerts see the series before the first refusal.
  for (const char* code : {"INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "UNAVAILABLE", "UNAUTHENTICATED"}) {
    request_rejected_total_->Add({{"code", code}});
  }
  time_to_first_token_seconds_ =
      Hist(r, "time_to_first_token_seconds", "Arrival to first token",
           {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10});
  inter_token_latency_seconds_ =
      Hist(r, "inter_token_latency_seconds", "Time between two tokens of a request",
           {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1,
            2.5});
  const Histogram::BucketBoundaries request_buckets = {0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1,  1.5, 2,
                                                       2.5,  5,    10,  15,  20,  30,  40, 50,  60};
  e2e_request_latency_seconds_ =
      Hist(r, "e2e_request_latency_seconds", "Arrival to last token", request_buckets);
  request_queue_time_seconds_ =
      Hist(r, "request_queue_time_seconds", "Arrival to first admission", request_buckets);
  iteration_tokens_ = Hist(r, "iteration_tokens", "Tokens per engine step",
                           {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192});
}

void Metrics::SetStatsSource(std::function<CacheStats()> stats) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_ = std::move(stats);
}

void Metrics::SetHttpStatsSource(std::function<HttpServerStats()> stats) {
  std::lock_guard<std::mutex> lock(mu_);
  http_stats_ = std::move(stats);
}

void Metrics::OnStep(int32_t iteration_tokens) { iteration_tokens_->Observe(iteration_tokens); }
void Metrics::OnPromptTokens(int32_t n) { prompt_tokens_total_->Increment(n); }
void Metrics::OnGenerationTokens(int32_t n) { generation_tokens_total_->Increment(n); }
void Metrics::OnFirstToken(double s) { time_to_first_token_seconds_->Observe(s); }
void Metrics::OnInterToken(double s) { inter_token_latency_seconds_->Observe(s); }
void Metrics::OnQueued(double s) { request_queue_time_seconds_->Observe(s); }
void Metrics::OnPreemption() { preemptions_total_->Increment(); }

void Metrics::OnEvicted(const std::string& policy, int64_t tokens) {
  kv_tokens_evicted_total_->Add({{"policy", policy}}).Increment(static_cast<double>(tokens));
}

void Metrics::OnRequestFinished(const std::string& finish_reason, double e2e_seconds) {
  request_success_total_->Add({{"finish_reason", finish_reason}}).Increment();
  e2e_request_latency_seconds_->Observe(e2e_seconds);
}

void Metrics::OnRejected(const std::string& code) {
  request_rejected_total_->Add({{"code", code}}).Increment();
}

std::vector<prometheus::MetricFamily> Metrics::Collect() const {
  std::function<CacheStats()> source;
  std::function<HttpServerStats()> http_source;
  {
    std::lock_guard<std::mutex> lock(mu_);
    source = stats_;
    http_source = http_stats_;
  }
  // A source keeps the totals; a counter moves by what they grew since the last scrape.
  const auto follow = [](prometheus::Counter* c, int64_t total) {
    if (double(total) > c->Value()) c->Increment(double(total) - c->Value());
  };
  if (http_source) {
    const HttpServerStats h = http_source();
    http_open_connections_->Set(double(h.open_connections));
    http_open_clients_->Set(double(h.open_clients));
    follow(http_refused_max_connections_, h.refused_max_connections);
    follow(http_refused_per_client_, h.refused_per_client);
    follow(http_timeouts_[0], h.timeouts_header);
    follow(http_timeouts_[1], h.timeouts_body);
    follow(http_timeouts_[2], h.timeouts_idle);
    follow(http_timeouts_[3], h.timeouts_write);
  }
  if (source) {
    const CacheStats s = source();
    kv_pages_total_->Set(s.pages_total);
    kv_pages_used_->Set(s.pages_used);
    kv_bytes_per_token_->Set(double(s.bytes_per_token));
    kv_pages_demoted_->Set(s.pages_demoted);
    kv_pages_packed_->Set(s.pages_packed);
    prefix_cache_cached_pages_->Set(s.cached_pages);
    follow(prefix_cache_lookups_total_, s.prefix_lookups);
    follow(prefix_cache_hits_total_, s.prefix_hits);
    follow(prefix_cache_hit_tokens_total_, s.prefix_hit_tokens);
    follow(prefix_cache_reclaimed_pages_total_, s.prefix_reclaimed_pages);
    kv_cache_usage_ratio_->Set(s.pages_total > 0 ? double(s.pages_used) / s.pages_total : 0);
    requests_running_->Set(s.sequences_running);
    requests_held_->Set(s.sequences_held);
    requests_waiting_->Set(s.sequences_waiting);
  }
  return registry_->Collect();
}

}  // namespace heavykv::server
