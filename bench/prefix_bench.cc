// Prefix caching (issue 30) in process, on the random llama3.2-1b-shape Q4_K_M GGUF file, with
// one Engine that caches prefixes and one that does not (--no-prefix-cache), side by side in one
// run and alternating:
//   prefix/llama3.2-1b/q4_k_m/ttft2000   time to first token of a request whose first 2,000
//       prompt tokens another request sent just before, against the same request with the cache
//       off (each round a new prefix). Counters: ttft_cold, ttft_warm (median seconds),
//       ttft_ratio (warm / cold), cached_tokens.
//   prefix/llama3.2-1b/q4_k_m/chat8     a chat of 8 turns on a 1,500-token system prompt, each
//       turn 64 user tokens and 32 generated ones appended to the history, cache on and off.
//       Counters: tokens_per_second_on / _off, ratio, same_tokens (1 when both engines
//       generated the same tokens: the cache only saves work).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/bench_fixtures.h"
#include "engine/serving/engine.h"

namespace heavykv::bench {
namespace {

std::unique_ptr<Engine> MakeEngine(const std::string& mix, bool prefix_cache) {
  absl::StatusOr<Model> model = LoadModel(Llama1bFile(mix));
  if (!model.ok()) Die(model.status());
  EngineOptions o;
  o.num_pages = 16 * 4096 / 16;  // 4,096 tokens of every layer
  o.max_step_tokens = 512;
  o.prefix_cache = prefix_cache;
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(*std::move(model), nullptr, o);
  if (!e.ok()) Die(e.status());
  return *std::move(e);
}

// Runs one greedy request to its end; returns its last delta, its tokens in *out.
GenerationDelta Run(Engine& engine, std::vector<int32_t> prompt, int32_t max_new,
                    std::vector<int32_t>* out = nullptr) {
  GenerationRequest r;
  r.prompt_token_ids = std::move(prompt);
  r.max_new_tokens = max_new;
  r.temperature = 0.0f;
  r.ignore_eos = true;
  std::mutex mu;
  std::condition_variable cv;
  GenerationDelta last;
  bool done = false;
  std::vector<int32_t> tokens;
  auto h = engine.Submit(r, [&](const GenerationDelta& d) {
    std::lock_guard<std::mutex> lock(mu);
    tokens.insert(tokens.end(), d.token_ids.begin(), d.token_ids.end());
    if (d.finished) {
      last = d;
      done = true;
      cv.notify_all();
    }
  });
  if (!h.ok()) Die(h.status());
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  if (out != nullptr) *out = tokens;
  return last;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void BM_Ttft(benchmark::State& state, std::string mix, int32_t prefix, int32_t rounds) {
  auto on = MakeEngine(mix, true), off = MakeEngine(mix, false);
  for (auto _ : state) {
    std::vector<double> cold, warm;
    int32_t cached = 0;
    for (int32_t round = 0; round < rounds; ++round) {
      const std::vector<int32_t> shared = SyntheticTokenIds(prefix, 1000 + round);
      std::vector<int32_t> first = shared, second = shared;
      for (int32_t t : SyntheticTokenIds(24, 1)) first.push_back(t);
      for (int32_t t : SyntheticTokenIds(24, 2)) second.push_back(t);
      cold.push_back(Run(*off, second, 1).timings.time_to_first_token_seconds);
      Run(*on, first, 1);  // sends the prefix
      const GenerationDelta d = Run(*on, second, 1);
      warm.push_back(d.timings.time_to_first_token_seconds);
      cached = d.usage.cached_tokens;
    }
    state.SetIterationTime(Median(cold) + Median(warm));
    state.counters["ttft_cold"] = Median(cold);
    state.counters["ttft_warm"] = Median(warm);
    state.counters["ttft_ratio"] = Median(warm) / Median(cold);
    state.counters["cached_tokens"] = cached;
  }
}

void BM_Chat(benchmark::State& state, std::string mix, int32_t system, int32_t turns,
             int32_t user, int32_t reply) {
  auto on = MakeEngine(mix, true), off = MakeEngine(mix, false);
  for (auto _ : state) {
    double seconds[2] = {0, 0};
    std::vector<int32_t> generated[2];
    // The two engines alternate turn by turn, so that a slow minute of the VM hits both.
    std::vector<int32_t> history[2] = {SyntheticTokenIds(system, 7), SyntheticTokenIds(system, 7)};
    for (int32_t t = 0; t < turns; ++t) {
      for (int e = 0; e < 2; ++e) {
        for (int32_t id : SyntheticTokenIds(user, 100 + t)) history[e].push_back(id);
        std::vector<int32_t> out;
        const absl::Time t0 = absl::Now();
        Run(e == 0 ? *on : *off, history[e], reply, &out);
        seconds[e] += absl::ToDoubleSeconds(absl::Now() - t0);
        history[e].insert(history[e].end(), out.begin(), out.end());
        generated[e].insert(generated[e].end(), out.begin(), out.end());
      }
    }
    state.SetIterationTime(seconds[0] + seconds[1]);
    const double n = double(turns) * reply;
    state.counters["tokens_per_second_on"] = n / seconds[0];
    state.counters["tokens_per_second_off"] = n / seconds[1];
    state.counters["ratio"] = seconds[1] / seconds[0];
    state.counters["same_tokens"] = generated[0] == generated[1] ? 1 : 0;
    state.counters["cached_pages"] = on->Stats().cached_pages;
  }
}

}  // namespace

void RegisterPrefixCache() {
  benchmark::RegisterBenchmark("prefix/llama3.2-1b/q4_k_m/ttft2000", BM_Ttft,
                               std::string("q4_k_m"), 2000, 3)
      ->Iterations(1)
      ->UseManualTime()
      ->Unit(benchmark::kSecond);
  benchmark::RegisterBenchmark("prefix/llama3.2-1b/q4_k_m/chat8", BM_Chat, std::string("q4_k_m"),
                               1500, 8, 64, 32)
      ->Iterations(1)
      ->UseManualTime()
      ->Unit(benchmark::kSecond);
}

}  // namespace heavykv::bench
