// n choices on shared prompt pages (issue 44), in process, on the random llama3.2-1b-shape
// Q4_K_M GGUF file:
//   choices/llama3.2-1b/q4_k_m/n8_prompt2000[/bf16]   one request with n = 1 and one with n = 8
//       on 2,000-token prompts (a new prompt each, so neither is a prefix-cache hit), each
//       sampling 64 tokens per choice (temperature 1, EOS ignored), the full cache. Counters:
//       ttft_n1, ttft_n8 (seconds from submission to the first token of every choice),
//       ttft_ratio (target <= 1.2); peak_pages_n1, peak_pages_n8 (usage.peak_pages: the
//       distinct pages the request's choices held at once), pages_target (n = 1's pages + 8 x
//       the generated tokens' pages, i.e. peak_pages_n1 + 8 x (peak_pages_n1 - the prompt's)),
//       pages_ratio (peak_pages_n8 / pages_target, target <= 1.25); decode tokens per second
//       after the first token, tps_n1 and tps_n8 (all eight choices), tps_ratio (target >= 4).
//   choices/llama3.2-1b/q4_k_m/step_b8_ctx{2000,64}   the runner alone: one decode
//       step of the eight choices forked from a 2,000-token prompt (KvCache::Fork), with the
//       shared-prefix walk (engine/runner/shared_prefix.h) and without it (each choice attends
//       the prompt's pages itself), alternating, the same caches, and the parent alone (b1).
//       Counters: b8_shared_ms, b8_separate_ms, b1_ms per step, their ratios, walks.
#include <benchmark/benchmark.h>

#include <condition_variable>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/bench_fixtures.h"
#include "engine/runner/model_runner.h"
#include "engine/serving/engine.h"

namespace heavykv::bench {
namespace {

constexpr int32_t kBlock = 16;

std::unique_ptr<Engine> MakeEngine(const std::string& mix, const std::string& kv_dtype,
                                   int32_t* layers) {
  absl::StatusOr<Model> model = LoadModel(Llama1bFile(mix));
  if (!model.ok()) Die(model.status());
  *layers = model->config.num_layers;
  EngineOptions o;
  o.block_size = kBlock;
  o.num_pages = model->config.num_layers * 8192 / kBlock;  // 8,192 tokens of every layer
  o.max_step_tokens = 512;
  o.kv_dtype = kv_dtype;
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(*std::move(model), nullptr, o);
  if (!e.ok()) Die(e.status());
  return *std::move(e);
}

struct Result {
  double all_first = 0;  // seconds from Submit to the first token of the last choice to get one
  double end = 0;        // seconds from Submit to the request's last delta
  GenerationDelta last;
};

Result RunChoices(Engine& engine, std::vector<int32_t> prompt, int32_t n, int32_t max_new) {
  GenerationRequest r;
  r.prompt_token_ids = std::move(prompt);
  r.n = n;
  r.max_new_tokens = max_new;
  r.temperature = 1.0f;
  r.seed = 11;
  r.ignore_eos = true;
  std::mutex mu;
  std::condition_variable cv;
  std::set<int32_t> started;
  Result out;
  bool done = false;
  const absl::Time t0 = absl::Now();
  auto h = engine.Submit(r, [&](const GenerationDelta& d) {
    std::lock_guard<std::mutex> lock(mu);
    if (!d.token_ids.empty() && started.insert(d.index).second &&
        int32_t(started.size()) == n) {
      out.all_first = absl::ToDoubleSeconds(absl::Now() - t0);
    }
    if (d.finished) {
      out.end = absl::ToDoubleSeconds(absl::Now() - t0);
      out.last = d;
      done = true;
      cv.notify_all();
    }
  });
  if (!h.ok()) Die(h.status());
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  return out;
}

void BM_Choices(benchmark::State& state, std::string mix, std::string kv_dtype, int32_t prompt,
                int32_t n, int32_t max_new) {
  int32_t layers = 0;
  auto engine = MakeEngine(mix, kv_dtype, &layers);
  int32_t round = 0;
  for (auto _ : state) {
    const Result one = RunChoices(*engine, SyntheticTokenIds(prompt, 500 + round), 1, max_new);
    const Result many = RunChoices(*engine, SyntheticTokenIds(prompt, 900 + round), n, max_new);
    ++round;
    state.SetIterationTime(one.end + many.end);
    const double prompt_pages = double((prompt + kBlock - 1) / kBlock) * layers;
    const double p1 = one.last.usage.peak_pages, pn = many.last.usage.peak_pages;
    const double target = p1 + n * (p1 - prompt_pages);
    const double tps1 = (max_new - 1) / (one.end - one.all_first);
    const double tpsn = double(n) * (max_new - 1) / (many.end - many.all_first);
    state.counters["ttft_n1"] = one.all_first;
    state.counters["ttft_n8"] = many.all_first;
    state.counters["ttft_ratio"] = many.all_first / one.all_first;
    state.counters["peak_pages_n1"] = p1;
    state.counters["peak_pages_n8"] = pn;
    state.counters["pages_target"] = target;
    state.counters["pages_ratio"] = pn / target;
    state.counters["tps_n1"] = tps1;
    state.counters["tps_n8"] = tpsn;
    state.counters["tps_ratio"] = tpsn / tps1;
    state.counters["completion_tokens_n8"] = many.last.usage.completion_tokens;
  }
}

// The runner with a 2,000-token prompt prefilled once and forked into `choices` sequences.
struct ForkedSteps {
  std::unique_ptr<Model> model;
  std::unique_ptr<KvCache> cache;
  std::unique_ptr<ModelRunner> runner;
  std::vector<SequenceKv> kv;
  std::vector<int32_t> next;
  int32_t pos = 0;

  ForkedSteps(const std::string& mix, int32_t prompt, int32_t choices) {
    absl::StatusOr<Model> m = LoadModel(Llama1bFile(mix));
    if (!m.ok()) Die(m.status());
    model = std::make_unique<Model>(*std::move(m));
    const ModelConfig& c = model->config;
    cache = *KvCache::Create(KvShapeFor(c, kBlock), c.num_layers * (prompt + 512) / kBlock * 2);
    runner = std::make_unique<ModelRunner>(*model, cache.get());
    kv.resize(size_t(choices));
    const std::vector<int32_t> ids = SyntheticTokenIds(prompt, 77);
    for (int32_t t0 = 0; t0 < prompt; t0 += 512) {
      const int32_t n = std::min(512, prompt - t0);
      SequenceStep step{&kv[0], std::span<const int32_t>(ids).subspan(size_t(t0), size_t(n)), t0,
                        false};
      if (absl::StatusOr<std::span<const float>> out = runner->Forward({&step, 1}); !out.ok()) {
        Die(out.status());
      }
    }
    for (int32_t i = 1; i < choices; ++i) {
      if (absl::Status s = cache->Fork(kv[0], kv[size_t(i)]); !s.ok()) Die(s);
    }
    next.assign(size_t(choices), 0);
    for (int32_t i = 0; i < choices; ++i) next[size_t(i)] = 100 + 17 * i;
    pos = prompt;
  }
  // One decode step of the first `n` sequences.
  void Step(int32_t n) {
    std::vector<SequenceStep> steps;
    for (int32_t i = 0; i < n; ++i) {
      steps.push_back({&kv[size_t(i)], std::span<const int32_t>(&next[size_t(i)], 1), pos, false});
    }
    if (absl::StatusOr<std::span<const float>> out = runner->Forward(steps); !out.ok()) {
      Die(out.status());
    }
    // Every sequence appended one token: drop it again so each step sees the same context.
    for (int32_t i = 0; i < n; ++i) cache->Truncate(kv[size_t(i)], pos);
  }
};

// The three figures side by side, steps alternating: b8 shared, b8 separate, b1.
void BM_ForkedStep(benchmark::State& state, std::string mix, int32_t prompt) {
  ForkedSteps f(mix, prompt, 8);
  double shared = 0, separate = 0, one = 0;
  int64_t steps = 0;
  for (auto _ : state) {
    for (int rep = 0; rep < 3; ++rep) {
      f.runner->set_shared_prefix_attention(true);
      absl::Time t0 = absl::Now();
      f.Step(8);
      shared += absl::ToDoubleSeconds(absl::Now() - t0);
      f.runner->set_shared_prefix_attention(false);
      t0 = absl::Now();
      f.Step(8);
      separate += absl::ToDoubleSeconds(absl::Now() - t0);
      t0 = absl::Now();
      f.Step(1);
      one += absl::ToDoubleSeconds(absl::Now() - t0);
      ++steps;
    }
    state.SetIterationTime((shared + separate + one) / double(steps) / 3);
  }
  state.counters["b8_shared_ms"] = 1e3 * shared / double(steps);
  state.counters["b8_separate_ms"] = 1e3 * separate / double(steps);
  state.counters["b1_ms"] = 1e3 * one / double(steps);
  state.counters["shared_over_separate"] = shared / separate;
  state.counters["b8_tps_over_b1"] = 8 * one / shared;
  state.counters["walks"] = double(f.runner->shared_prefix_walks());
}

}  // namespace

void RegisterChoices() {
  for (int32_t ctx : {2000, 8000, 64}) {  // 64: the step without the prompt's attention, nearly
    benchmark::RegisterBenchmark(
        absl::StrCat("choices/llama3.2-1b/q4_k_m/step_b8_ctx", ctx).c_str(), BM_ForkedStep,
        std::string("q4_k_m"), ctx)
        ->Iterations(4)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
  for (const char* dtype : {"auto", "bf16"}) {
    const std::string name = std::string("choices/llama3.2-1b/q4_k_m/n8_prompt2000") +
                             (std::string(dtype) == "auto" ? "" : "/bf16");
    benchmark::RegisterBenchmark(name.c_str(), BM_Choices, std::string("q4_k_m"),
                                 std::string(dtype), 2000, 8, 64)
        ->Iterations(1)
        ->UseManualTime()
        ->Unit(benchmark::kSecond);
  }
}

}  // namespace heavykv::bench
