// Structured outputs (docs/BENCHMARKS.md "Structured outputs"):
//   grammar/mask/<vocab>: JSON-schema workloads (the schemas and instances of
//     tests/data/grammar_bench/workload.json, real-world shapes) walked token by token through
//     the masks on one core, as `heavykv grammar test` does: counters mask_p50_us, mask_p99_us,
//     compile_p50_us, over Llama 3's 128k and Qwen's 151k vocabularies (../shared/gguf).
//   grammar/decode/<free|json>/b<N>: the serving engine decoding N requests of a random
//     llama3.2-1b-shape Q4_K_M model with the Llama 3 vocabulary, unconstrained or under a JSON
//     schema none of them can finish within its tokens (so the batch stays full): tokens_per_s
//     of the decode phase (after every request's first token).
#include <benchmark/benchmark.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/bench_fixtures.h"
#include "engine/gguf/gguf.h"
#include "engine/grammar/test_suite.h"
#include "engine/model/make_gguf_model.h"
#include "engine/model/make_model.h"
#include "engine/serving/engine.h"
#include "engine/tokenizer/gguf_tokenizer.h"
#include "kernels/cpu/gemm.h"

namespace heavykv::bench {
namespace {

const std::string kSourceDir = HEAVYKV_SOURCE_DIR;

std::string VocabFile(const std::string& name) {
  return kSourceDir + "/../shared/gguf/" + name + "-vocab.gguf";
}

// A GGUF file's own tokenizer (its vocabulary size from its token list).
absl::StatusOr<std::shared_ptr<const TextTokenizer>> LoadVocabulary(const std::string& path) {
  absl::StatusOr<GgufFile> file = GgufFile::Open(path);
  if (!file.ok()) return file.status();
  const GgufMetadata* tokens = file->FindMetadata("tokenizer.ggml.tokens");
  if (tokens == nullptr || !tokens->is_array()) {
    return absl::NotFoundError(path + " has no tokenizer.ggml.tokens");
  }
  absl::StatusOr<std::unique_ptr<TextTokenizer>> t =
      LoadGgufTextTokenizer(*file, int32_t(tokens->count));
  if (!t.ok()) return t.status();
  return std::shared_ptr<const TextTokenizer>(*std::move(t));
}

void BM_Mask(benchmark::State& state, std::string vocab) {
  const std::string path = VocabFile(vocab);
  absl::StatusOr<std::shared_ptr<const TextTokenizer>> tok = LoadVocabulary(path);
  if (!tok.ok()) {
    state.SkipWithError(std::string(tok.status().message()).c_str());
    return;
  }
  std::ifstream in(kSourceDir + "/tests/data/grammar_bench/workload.json");
  const nlohmann::ordered_json groups = nlohmann::ordered_json::parse(
      std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()), nullptr,
      false);
  if (!groups.is_array()) {
    state.SkipWithError("tests/data/grammar_bench/workload.json is missing");
    return;
  }
  cpu::SetNumThreads(1);
  auto vocabulary = grammar::TokenVocabulary::FromTokenizer(**tok);
  std::vector<double> mask_us, compile_us;
  int64_t failed = 0;
  for (auto _ : state) {
    // A fresh compiler: every schema is compiled and every state met for the first time.
    grammar::ConstraintCompiler compiler(vocabulary);
    for (const auto& g : groups) {
      grammar::GroupResult r = grammar::RunSchemaGroup(compiler, **tok, g);
      if (!r.compiled || r.passed != r.tests) ++failed;
      compile_us.push_back(r.compile_us);
      mask_us.insert(mask_us.end(), r.mask_us.begin(), r.mask_us.end());
    }
  }
  state.counters["mask_p50_us"] = grammar::Quantile(mask_us, 0.5);
  state.counters["mask_p99_us"] = grammar::Quantile(mask_us, 0.99);
  state.counters["mask_max_us"] = grammar::Quantile(mask_us, 1.0);
  state.counters["compile_p50_us"] = grammar::Quantile(compile_us, 0.5);
  state.counters["masks"] = double(mask_us.size());
  state.counters["groups_failed"] = double(failed);
  cpu::SetNumThreads(0);
}

// Never finishes within kNew tokens: at least 24 items of ~10 tokens each.
constexpr char kDecodeSchema[] = R"({"type": "object", "properties": {"items": {"type": "array",
  "minItems": 24, "items": {"type": "object", "properties": {"name": {"type": "string",
  "maxLength": 16}, "id": {"type": "integer"}, "tags": {"type": "array", "items":
  {"type": "string"}}}, "required": ["name", "id"]}}}, "required": ["items"]})";
constexpr int32_t kNew = 48, kPrompt = 32;

std::string Llama1bWithLlama3Vocab() {
  const std::string path = BenchFilePath("llama3.2-1b-llama3vocab-q4_k_m.gguf");
  if (std::filesystem::exists(path)) return path;
  RandomGgufOptions o;
  o.config = *NamedShape("llama3.2-1b");
  o.weights = *ParseGgufWeightMix("q4_k_m");
  o.vocab_from = VocabFile("llama3");
  absl::StatusOr<ModelConfig> c = WriteRandomGgufModel(o, path + ".tmp");
  if (!c.ok()) Die(c.status());
  std::filesystem::rename(path + ".tmp", path);
  return path;
}

void BM_Decode(benchmark::State& state, bool json, int32_t batch) {
  const std::string path = Llama1bWithLlama3Vocab();
  double tokens_per_s = 0;
  int length_ends = 0;  // requests that ran all their tokens (the constraint never ended one)
  for (auto _ : state) {
    state.PauseTiming();
    absl::StatusOr<Model> model = LoadModel(path);
    absl::StatusOr<std::shared_ptr<const TextTokenizer>> tok = LoadVocabulary(path);
    if (!model.ok() || !tok.ok()) {
      state.SkipWithError("cannot load the benchmark model");
      return;
    }
    EngineOptions o;
    o.num_pages = 64 * batch * 16;
    o.max_running = batch;
    o.prefix_cache = false;
    auto engine = Engine::Create(*std::move(model), *tok, o);
    if (!engine.ok()) {
      state.SkipWithError(std::string(engine.status().message()).c_str());
      return;
    }
    if (json) {  // compiled once before timing, as a server's cache would hold it
      GenerationRequest warm;
      warm.prompt_token_ids = {128000, 40};
      warm.max_new_tokens = 1;
      warm.constraint.kind = grammar::ConstraintSpec::Kind::kJsonSchema;
      warm.constraint.text = kDecodeSchema;
      std::atomic<bool> done{false};
      (void)(*engine)->Submit(warm, [&](const GenerationDelta& d) { done = d.finished; });
      while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    state.ResumeTiming();
    std::mutex mu;
    std::condition_variable cv;
    int finished = 0, first = 0;
    length_ends = 0;
    int64_t decode_tokens = 0;
    absl::Time decode_start, last;
    for (int i = 0; i < batch; ++i) {
      GenerationRequest r;
      r.prompt_token_ids.push_back(128000);
      for (int j = 1; j < kPrompt; ++j) r.prompt_token_ids.push_back(1000 + (i * 131 + j * 7) % 30000);
      r.max_new_tokens = kNew;
      r.ignore_eos = !json;
      r.temperature = 0.0f;
      if (json) {
        r.constraint.kind = grammar::ConstraintSpec::Kind::kJsonSchema;
        r.constraint.text = kDecodeSchema;
      }
      bool seen = false;
      auto h = (*engine)->Submit(r, [&, seen](const GenerationDelta& d) mutable {
        std::lock_guard<std::mutex> lock(mu);
        const absl::Time now = absl::Now();
        if (!seen && !d.token_ids.empty()) {
          seen = true;
          if (++first == batch) decode_start = now;
        } else if (first == batch) {
          decode_tokens += int64_t(d.token_ids.size());
        }
        last = now;
        if (d.finished) {
          length_ends += d.finish_reason == "length";
          ++finished;
          cv.notify_all();
        }
      });
      if (!h.ok()) Die(h.status());
    }
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return finished == batch; });
    tokens_per_s = double(decode_tokens) / absl::ToDoubleSeconds(last - decode_start);
    lock.unlock();
    (*engine)->Shutdown(absl::ZeroDuration());
  }
  state.counters["tokens_per_s"] = tokens_per_s;
  state.counters["length_ends"] = length_ends;
}

}  // namespace

void RegisterGrammar() {
  for (const char* vocab : {"llama3", "qwen"}) {
    benchmark::RegisterBenchmark(absl::StrCat("grammar/mask/", vocab).c_str(), BM_Mask,
                                 std::string(vocab))
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
  }
  for (int32_t batch : {1, 32}) {
    for (bool json : {false, true}) {
      benchmark::RegisterBenchmark(
          absl::StrCat("grammar/decode/", json ? "json" : "free", "/b", batch).c_str(), BM_Decode,
          json, batch)
          ->Iterations(1)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
}

}  // namespace heavykv::bench
