// tokenizer/encode/<bytes>: Tokenizer::Encode of 1 KiB, 16 KiB and 1 MiB of
// tests/data/eval_stories.txt (repeated) with models/tok512.bin. With run.c's quadratic merge these
// grew ~n^2 (a 32 KB prompt took 15 s); bytes_per_second staying roughly flat across the three
// sizes shows the O(n log n) merge.
//
// tokenizer/bpe-<vocab>/<size>: BpeTokenizer::Encode of the same text with byte-level BPE
// vocabularies: gpt2 (tests/data/gguf/ggml-vocab-gpt-2.gguf), llama3 and qwen
// (../shared/gguf/{llama3,qwen}-vocab.gguf, skipped when absent). llama.cpp's `llama-tokenize
// --file` on the same 1 MiB is the reference (docs/BENCHMARKS.md).
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/gguf/gguf.h"
#include "engine/tokenizer/bpe_tokenizer.h"
#include "engine/tokenizer/gguf_tokenizer.h"
#include "engine/tokenizer/tokenizer.h"

namespace heavykv::bench {
namespace {

const std::string kSourceDir = HEAVYKV_SOURCE_DIR;

const Tokenizer& Tok512() {
  static const Tokenizer* tok = [] {
    absl::StatusOr<Tokenizer> t = Tokenizer::Load(kSourceDir + "/models/tok512.bin", 512);
    if (!t.ok()) {
      std::fprintf(stderr, "bench: %s\n", std::string(t.status().message()).c_str());
      std::exit(1);
    }
    return new Tokenizer(*std::move(t));
  }();
  return *tok;
}

// `bytes` bytes of the evaluation stories, repeated as needed.
std::string StoryText(size_t bytes) {
  std::ifstream in(kSourceDir + "/tests/data/eval_stories.txt", std::ios::binary);
  const std::string stories((std::istreambuf_iterator<char>(in)), {});
  if (stories.empty()) {
    std::fprintf(stderr, "bench: cannot read tests/data/eval_stories.txt\n");
    std::exit(1);
  }
  std::string text;
  while (text.size() < bytes) text.append(stories, 0, bytes - text.size());
  return text;
}

void BM_Encode(benchmark::State& state, size_t bytes) {
  const Tokenizer& tok = Tok512();
  const std::string text = StoryText(bytes);
  size_t tokens = 0;
  for (auto _ : state) {
    const std::vector<int32_t> ids = tok.Encode(text, /*bos=*/true, /*eos=*/false);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(state.iterations() * int64_t(bytes));
  state.counters["tokens"] = double(tokens);
}

// The BPE tokenizer of a GGUF vocabulary under the source tree, loaded once; null when absent.
const BpeTokenizer* Bpe(const std::string& rel_path) {
  static auto* cache = new std::vector<std::pair<std::string, const BpeTokenizer*>>();
  for (const auto& [path, tok] : *cache) {
    if (path == rel_path) return tok;
  }
  const BpeTokenizer* tok = nullptr;
  absl::StatusOr<GgufFile> f = GgufFile::Open(kSourceDir + "/" + rel_path);
  if (f.ok()) {
    const GgufMetadata* tokens = f->FindMetadata("tokenizer.ggml.tokens");
    absl::StatusOr<BpeTokenizer> t =
        LoadGgufBpeTokenizer(*f, tokens == nullptr ? 0 : int32_t(tokens->count));
    if (!t.ok()) {
      std::fprintf(stderr, "bench: %s\n", std::string(t.status().message()).c_str());
      std::exit(1);
    }
    tok = new BpeTokenizer(*std::move(t));
  }
  cache->emplace_back(rel_path, tok);
  return tok;
}

void BM_EncodeBpe(benchmark::State& state, std::string rel_path, size_t bytes) {
  const BpeTokenizer* tok = Bpe(rel_path);
  if (tok == nullptr) {
    state.SkipWithError(("no " + rel_path).c_str());
    return;
  }
  const std::string text = StoryText(bytes);
  size_t tokens = 0;
  for (auto _ : state) {
    const std::vector<int32_t> ids = tok->Encode(text, /*bos=*/true, /*eos=*/false);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(state.iterations() * int64_t(bytes));
  state.counters["tokens"] = double(tokens);
}

}  // namespace

void RegisterTokenizer() {
  for (size_t bytes : {size_t{1} << 10, size_t{16} << 10, size_t{1} << 20}) {
    benchmark::RegisterBenchmark(absl::StrCat("tokenizer/encode/", bytes).c_str(), BM_Encode, bytes)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  for (const auto& [name, path] : {std::pair<const char*, const char*>{
                                       "gpt2", "tests/data/gguf/ggml-vocab-gpt-2.gguf"},
                                   {"llama3", "../shared/gguf/llama3-vocab.gguf"},
                                   {"qwen", "../shared/gguf/qwen-vocab.gguf"}}) {
    for (const auto& [size, bytes] : {std::pair<const char*, size_t>{"16KiB", size_t{16} << 10},
                                      {"1MiB", size_t{1} << 20}}) {
      benchmark::RegisterBenchmark(absl::StrCat("tokenizer/bpe-", name, "/", size).c_str(),
                                   BM_EncodeBpe, std::string(path), bytes)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
}

}  // namespace heavykv::bench
