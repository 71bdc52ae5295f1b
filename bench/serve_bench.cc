// The serving benchmark of docs/BENCHMARKS.md, in process: one Engine with one fixed KV pool,
// the stories110M-shape random model, 64 requests of 512 prompt tokens and 512 new tokens all
// submitted at once; full cache vs h2o at 20%, each with fp32 and with bf16 weights and K/V
// (the pool then has the same bytes). The same workload over gRPC is `heavykv bench`.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/bench_fixtures.h"
#include "engine/runner/step_runner.h"
#include "engine/serving/engine.h"
#include "memory/kv_cache.h"

namespace heavykv::bench {
namespace {

constexpr int kRequests = 64, kPrompt = 512, kNew = 512;
// Pages for 12 full-cache sequences of 1024 tokens: what a small replica could afford.
constexpr int kPoolPages = 12 * (kPrompt + kNew) / 16;

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5))];
}

// bf16: --weight-dtype bf16; kv_dtype: --kv-dtype, on a pool of the same bytes as kPoolPages
// fp32 pages (pos and score included); request_dtype: every request's own kv_dtype.
// prefix_cache: EngineOptions::prefix_cache (the prompts share no block, so it only costs: the
// registration's copies).
void BM_Serve(benchmark::State& state, std::string policy, bool bf16, std::string kv_dtype,
              std::string request_dtype, bool prefix_cache) {
  for (auto _ : state) {
    state.PauseTiming();
    absl::StatusOr<Model> model = LoadModel(  // the Engine owns its Model
        Stories110MPath(), bf16 ? cpu::WeightType::kBf16 : cpu::WeightType::kFp32);
    state.ResumeTiming();
    if (!model.ok()) {
      state.SkipWithError(std::string(model.status().message()).c_str());
      return;
    }
    EngineOptions o;
    const KvShape fp32 = KvShapeForDevice(Device::kCpu, model->config, 16, KvDtype::kFp32);
    const KvShape shape =
        KvShapeForDevice(Device::kCpu, model->config, 16, *ParseKvDtype(kv_dtype));
    o.num_pages = KvCache::PagesForBytes(shape, int64_t(kPoolPages) * fp32.PageBytes());
    o.kv_dtype = kv_dtype;
    o.prefix_cache = prefix_cache;
    o.max_running = kRequests;
    o.max_waiting = kRequests;
    o.max_step_tokens = 512;
    auto engine = Engine::Create(*std::move(model), nullptr, o);
    if (!engine.ok()) {
      state.SkipWithError(std::string(engine.status().message()).c_str());
      return;
    }
    std::mutex mu;
    std::condition_variable cv;
    int done = 0;
    int64_t tokens = 0;
    std::vector<double> ttft;
    const absl::Time t0 = absl::Now();
    std::atomic<int32_t> peak_running{0};
    for (int i = 0; i < kRequests; ++i) {
      GenerationRequest r;
      for (int j = 0; j < kPrompt - 1; ++j) r.prompt_token_ids.push_back(3 + (i * 131 + j * 7) % 31000);
      r.max_new_tokens = kNew;
      r.ignore_eos = true;  // random weights: every request generates all its tokens
      if (!request_dtype.empty()) r.kv_dtype = request_dtype;
      r.temperature = 0.0f;
      if (policy != "full") {
        r.policy = policy;
        r.budget_fraction = 0.2;
      }
      auto h = (*engine)->Submit(r, [&](const GenerationDelta& d) {
        std::lock_guard<std::mutex> lock(mu);
        tokens += d.token_ids.size();
        if (d.finished) {
          ttft.push_back(d.timings.time_to_first_token_seconds);
          ++done;
          cv.notify_all();
        }
      });
      if (!h.ok()) {
        state.SkipWithError(std::string(h.status().message()).c_str());
        return;
      }
    }
    std::unique_lock<std::mutex> lock(mu);
    while (done < kRequests) {
      cv.wait_for(lock, std::chrono::milliseconds(20));
      peak_running = std::max(peak_running.load(), (*engine)->Stats().sequences_running);
    }
    const double seconds = absl::ToDoubleSeconds(absl::Now() - t0);
    state.counters["max_running"] = peak_running.load();
    state.counters["tokens_per_second"] = tokens / seconds;
    state.counters["ttft_p50"] = Quantile(ttft, 0.5);
    state.counters["ttft_p99"] = Quantile(ttft, 0.99);
    state.counters["preemptions"] = double((*engine)->Stats().preemptions);
    state.counters["pool_pages"] = o.num_pages;
    lock.unlock();
    (*engine)->Shutdown(absl::Seconds(1));
  }
}

}  // namespace

void RegisterServe() {
  for (bool bf16 : {false, true}) {
    for (const char* p : {"full", "h2o"}) {
      benchmark::RegisterBenchmark(
          absl::StrCat("serve/64x512+512/", p, bf16 ? "/bf16" : "").c_str(), BM_Serve,
          std::string(p), bf16, std::string(bf16 ? "bf16" : "fp32"), std::string(), true)
          ->Iterations(1)
          ->UseRealTime()
          ->Unit(benchmark::kSecond);
    }
  }
  // Issue 30: what the prefix cache costs when no prompt shares a block with another.
  benchmark::RegisterBenchmark("serve/64x512+512/full/no-prefix-cache", BM_Serve,
                               std::string("full"), false, std::string("fp32"), std::string(),
                               false)
      ->Iterations(1)
      ->UseRealTime()
      ->Unit(benchmark::kSecond);
  // Issue 29: h2o 20% with int8 and int4 K/V beside bf16 K/V, bf16 weights, the same pool bytes:
  // compare max_running (the concurrent sequences).
  for (const char* kv : {"int8", "int4"}) {
    benchmark::RegisterBenchmark(absl::StrCat("serve/64x512+512/h2o/bf16w/", kv, "kv").c_str(),
                                 BM_Serve, std::string("h2o"), true, std::string(kv),
                                 std::string(), true)
        ->Iterations(1)
        ->UseRealTime()
        ->Unit(benchmark::kSecond);
  }
  // MiKV's demoted store on the bf16 pool, and requests asking for int8 rows there.
  benchmark::RegisterBenchmark("serve/64x512+512/h2o:demote=int4/bf16", BM_Serve,
                               std::string("h2o:demote=int4"), true, std::string("bf16"),
                               std::string(), true)
      ->Iterations(1)
      ->UseRealTime()
      ->Unit(benchmark::kSecond);
  benchmark::RegisterBenchmark("serve/64x512+512/h2o/bf16/int8-per-request", BM_Serve,
                               std::string("h2o"), true, std::string("bf16"), std::string("int8"),
                               true)
      ->Iterations(1)
      ->UseRealTime()
      ->Unit(benchmark::kSecond);
}

}  // namespace heavykv::bench
