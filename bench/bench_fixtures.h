// Fixtures shared by the benchmarks: random-weight models at real shapes (written once per run
// into a scratch directory), sequences whose caches are filled synthetically to a context length,
// and FLOP/byte counts of a decode step.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "engine/runner/model_runner.h"
#include "memory/kv_cache.h"

namespace heavykv::bench {

// Directory for generated models (--bench_dir, default /tmp/heavykv-bench).
void SetScratchDir(const std::string& dir);
// <scratch dir>/<shape>-<mix>.gguf (the directory is created): where the GGUF benchmarks keep
// their random model, and where scripts/bench-llamacpp.sh writes the same file for llama.cpp.
std::string GgufBenchModelPath(const std::string& shape, const std::string& mix);
// The random llama3.2-1b-shape GGUF file of weight mix `mix` (q4_k_m, q8_0, f32, ...) at
// GgufBenchModelPath, written on first use; exits on failure.
std::string Llama1bFile(const std::string& mix);
// <scratch dir>/<file> (the directory is created), for any other file a benchmark writes once.
std::string BenchFilePath(const std::string& file);
// `n` token ids of a random-weight model's "text" (any ids in range do), in [100, 30100),
// different for each `salt`.
std::vector<int32_t> SyntheticTokenIds(int32_t n, int32_t salt);
// Prints the status and exits 1: a fixture that cannot be made ends the run.
[[noreturn]] void Die(const absl::Status& s);

// The stories110M shape with a context long enough for the 4096-token benchmarks, loaded once.
// With bf16 weights (--weight-dtype bf16) it is a second model, loaded on first use.
const Model& Stories110M(cpu::WeightType weights = cpu::WeightType::kFp32);
// Its checkpoint file (written on first use), for a benchmark that needs its own Model.
const std::string& Stories110MPath();
// A random-weight model of shape `c` (llama2.c format, weights from `seed`), written once as
// <scratch dir>/<file>, loaded.
Model SmallModel(const ModelConfig& c, const std::string& file, uint64_t seed);

// Multiply-adds x2 of one decode token: every matrix and the classifier, plus attention over
// `context` cached tokens.
double DecodeFlopsPerToken(const ModelConfig& c, int64_t context);
// Bytes of K and V one decode token reads at `context`.
double KvBytesPerToken(const ModelConfig& c, int64_t context);

// `batch` sequences whose every (layer, kv head) holds `context` random K/V rows at positions
// [0, context) with random scores, as if they had been prefilled; K/V elements of
// `kv_element_bytes` (4: fp32, 2: bf16).
struct Batch {
  std::unique_ptr<KvCache> cache;
  std::vector<std::unique_ptr<EvictionPolicy>> policies;
  std::vector<SequenceKv> seqs;
  std::vector<int32_t> tokens;  // one decode token per sequence
  int32_t next_pos = 0;
};
// `table_per_layer` false: the one-table layout the CUDA pool uses, on the host (to measure
// the per-layer tables against it).
std::unique_ptr<Batch> MakeBatch(const Model& model, int32_t batch, int32_t context,
                                 const std::string& policy, int32_t budget,
                                 int32_t kv_element_bytes = 4, bool table_per_layer = true);

// Feeds `prompt` to an empty sequence `kv` from position 0, `chunk` tokens a step (as a prefill
// does); dies on an error.
void Prefill(ModelRunner& runner, SequenceKv& kv, std::span<const int32_t> prompt,
             int32_t chunk);

// One decode step of every sequence; sequences without eviction are rolled back to their
// context afterwards so that every step runs at the same context length.
void DecodeStep(ModelRunner& runner, Batch& b, int32_t context);

}  // namespace heavykv::bench
