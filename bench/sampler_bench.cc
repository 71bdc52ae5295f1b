// The sampler's cost per decode step at batch 32 (issue 44): every row of a step is sampled once,
// as the engine does after the forward pass, with the plain run.c options against every option of
// the sampling API on. The target: all on costs <= 3% of a batch-32 decode step
// (sampler/b32/all_on against decode/b32/ctx512/full, formed in bench_main.cc).
//
//   sampler/b32/plain      temperature 0.8, top_p 0.9
//   sampler/b32/penalties  the same with presence, frequency and repetition penalties (the
//                          window of the last 256 tokens), a 16-entry logit_bias and min_tokens
//                          past (its ban no longer applies): steps 2-5 alone
//   sampler/b32/all_on     penalties and min_p 0.05, which also shrinks top_p's sort (only the
//                          tokens min_p keeps are candidates), so it may well cost less than plain
// Each sampler has seen 2,000 prompt tokens and 200 generated ones; the rows are 32000 logits (the
// stories110M bench model's vocabulary).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "bench/bench_fixtures.h"
#include "engine/model/make_model.h"
#include "engine/serving/sampler.h"

namespace heavykv::bench {
namespace {

constexpr int32_t kBatch = 32;
constexpr int32_t kPromptTokens = 2000;
constexpr int32_t kGeneratedTokens = 200;

void BM_SamplerStep(benchmark::State& state, bool penalties, bool min_p) {
  const int32_t vocab = NamedShape("stories110M")->vocab_size;
  std::mt19937 rng(44);
  std::normal_distribution<float> logit(0.0f, 2.0f);
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  std::vector<std::vector<float>> rows(kBatch, std::vector<float>(vocab));  // [batch][vocab]
  for (auto& row : rows) {
    for (float& l : row) l = logit(rng);
  }
  std::vector<std::unique_ptr<Sampler>> samplers;
  for (int32_t b = 0; b < kBatch; ++b) {
    SamplingParams p;
    p.temperature = 0.8f;
    p.top_p = 0.9f;
    p.seed = uint64_t(b) + 1;
    if (min_p) p.min_p = 0.05f;
    if (penalties) {
      p.presence_penalty = 0.5f;
      p.frequency_penalty = 0.3f;
      p.repetition_penalty = 1.2f;
      p.penalty_last_n = 256;
      for (int i = 0; i < 16; ++i) p.logit_bias.emplace_back(token(rng), 1.5f);
      p.min_tokens = 100;
      p.banned_until_min = {1, 2};
    }
    std::vector<int32_t> prompt(kPromptTokens);
    for (int32_t& t : prompt) t = token(rng);
    samplers.push_back(std::make_unique<Sampler>(p, prompt));
    for (int32_t i = 0; i < kGeneratedTokens; ++i) samplers.back()->Accept(token(rng));
  }
  std::vector<float> scratch(vocab);
  for (auto _ : state) {
    for (int32_t b = 0; b < kBatch; ++b) {
      scratch.assign(rows[b].begin(), rows[b].end());  // the engine samples a copy of the row too
      const int32_t t = samplers[b]->Sample(scratch);
      samplers[b]->Accept(t);
      benchmark::DoNotOptimize(t);
    }
  }
  state.counters["rows_per_step"] = kBatch;
}

}  // namespace

void RegisterSampler() {
  struct Variant {
    const char* name;
    bool penalties, min_p;
  };
  for (const Variant& v : {Variant{"sampler/b32/plain", false, false},
                           Variant{"sampler/b32/penalties", true, false},
                           Variant{"sampler/b32/all_on", true, true}}) {
    benchmark::RegisterBenchmark(v.name, BM_SamplerStep, v.penalties, v.min_p)
        ->MinTime(0.5)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  }
}

}  // namespace heavykv::bench
