// The GGUF benchmarks of issue 14: a random model at the llama3.2-1b shape (make-model --format
// gguf, written once per scratch directory as llama3.2-1b-<mix>.gguf, the same file
// scripts/bench-llamacpp.sh gives llama.cpp) in Q4_K_M and Q8_0, run the way llama.cpp's tools
// measure it:
//   gguf/llama3.2-1b/<mix>/decode-b1      one sequence at context 64 (llama-bench -n 128 decodes
//                                         from 0 to 128: 64 on average); tokens/s
//   gguf/llama3.2-1b/<mix>/decode-b32     32 sequences at context 192 (llama-batched-bench -npp
//                                         128 -ntg 128 -npl 32: 128..256); aggregate tokens/s
//   gguf/llama3.2-1b/<mix>/prefill512     one 512-token prompt from an empty cache in chunks of
//                                         512 (llama-bench -p 512); tokens/s
//   gguf/llama3.2-1b/<f32|bf16>/prefill4096  one 4096-token prompt in chunks of 512 (llama-bench
//                                         -p 4096 with its default 512-token micro-batches), fp32
//                                         or bf16 weights (issue 18: long prompts, where attention
//                                         over the growing context is a real share of the work)
// bench_main.cc prints their ratios to llama.cpp's figures when --peer_json names the file the
// script wrote from the same run.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "bench/bench_fixtures.h"
#include "engine/model/make_gguf_model.h"
#include "engine/model/make_model.h"

namespace heavykv::bench {
namespace {

const char* const kMixes[] = {"q4_k_m", "q8_0"};

// The loaded model of `mix` (its file: Llama1bFile), made on first use.
const Model& Llama1b(const std::string& mix) {
  static std::map<std::string, std::unique_ptr<Model>> models;
  std::unique_ptr<Model>& m = models[mix];
  if (m != nullptr) return *m;
  absl::StatusOr<Model> loaded = LoadModel(Llama1bFile(mix));
  if (!loaded.ok()) Die(loaded.status());
  m = std::make_unique<Model>(*std::move(loaded));
  return *m;
}

void BM_GgufDecode(benchmark::State& state, std::string mix, int32_t batch, int32_t context) {
  const Model& model = Llama1b(mix);
  std::unique_ptr<Batch> b = MakeBatch(model, batch, context, "full", kUnboundedBudget);
  ModelRunner runner(model, b->cache.get());
  DecodeStep(runner, *b, context);  // warm-up
  for (auto _ : state) DecodeStep(runner, *b, context);
  state.counters["tokens"] =
      benchmark::Counter(double(state.iterations()) * batch, benchmark::Counter::kIsRate);
  state.counters["weight_bytes"] = benchmark::Counter(
      double(state.iterations()) * model.WeightBytes(), benchmark::Counter::kIsRate);
}

// A `tokens`-token prompt from an empty cache, `chunk` tokens a step.
void BM_GgufPrefill(benchmark::State& state, std::string mix, int32_t tokens, int32_t chunk) {
  const Model& model = Llama1b(mix);
  KvShape shape = KvShapeFor(model.config, 16);
  shape.element_bytes = 4;
  std::unique_ptr<KvCache> cache = *KvCache::Create(shape, (tokens / 16 + 2) * shape.NumTables());
  ModelRunner runner(model, cache.get());
  std::vector<int32_t> prompt(tokens);
  for (int32_t i = 0; i < tokens; ++i) prompt[i] = 1 + (i * 7919) % (model.config.vocab_size - 1);
  SequenceKv kv;
  auto run = [&](int32_t upto) {
    Prefill(runner, kv, std::span<const int32_t>(prompt).first(upto), chunk);
    cache->Release(kv);
  };
  run(chunk);  // warm-up: the first chunk
  for (auto _ : state) run(tokens);
  state.counters["tokens"] =
      benchmark::Counter(double(state.iterations()) * tokens, benchmark::Counter::kIsRate);
}

}  // namespace

void RegisterGguf() {
  for (const char* mix : kMixes) {
    const std::string base = absl::StrCat("gguf/llama3.2-1b/", mix, "/");
    benchmark::RegisterBenchmark((base + "decode-b1").c_str(), BM_GgufDecode, std::string(mix), 1,
                                 64)
        ->MinTime(2.0)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark((base + "decode-b32").c_str(), BM_GgufDecode, std::string(mix),
                                 32, 192)
        ->MinTime(2.0)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark((base + "prefill512").c_str(), BM_GgufPrefill, std::string(mix),
                                 512, 512)
        ->MinTime(2.0)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  // Half a minute an iteration on 2 cores: one, after the warm-up.
  for (const char* mix : {"f32", "bf16"}) {
    benchmark::RegisterBenchmark(absl::StrCat("gguf/llama3.2-1b/", mix, "/prefill4096").c_str(),
                                 BM_GgufPrefill, std::string(mix), 4096, 512)
        ->Iterations(1)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace heavykv::bench
