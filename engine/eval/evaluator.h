// Evaluate: quality of eviction policies x budgets against the full cache, by teacher forcing.
//
// Semantics (shared with an independent implementation, so numbers compare): the text is split
// into stories at blank lines, each encoded with BOS first, concatenated into one token stream
// and cut into consecutive non-overlapping windows of W tokens (the last partial window dropped).
// Each window runs from an empty cache one token per step; perplexity is exp(mean NLL) over the
// W-1 next-token predictions of all windows, top-1 the share whose argmax is the next token.
// All (configuration, window) sequences of a run are batched into the same forward steps.
// With `prefill` P > 1, the first P tokens of each window go in as one chunk (a prompt: all of
// them attend before the chunk's eviction, which is where snapkv's prefill selection runs), and
// the rest one token per step; the same W-1 predictions are scored. Without it no step has more
// than one new token, so snapkv is exactly its decode policy (h2o by default).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model.h"
#include "engine/runner/step_runner.h"
#include "engine/tokenizer/text_tokenizer.h"
#include "memory/eviction_policy.h"

namespace heavykv {

struct EvalConfig {
  std::string policy;
  KvBudget budget;
};

// What every eval task (Evaluate, EvaluateStream, RunPasskey) takes alike: the configurations
// and where they run.
struct EvalSetup {
  std::vector<EvalConfig> configs;
  double recent_fraction = 0.5;  // h2o, scissorhands, snapkv
  int32_t block_size = 16;
  Device device = Device::kCpu;  // where the forward passes run
  KvDtype kv_dtype = KvDtype::kAuto;  // the cached K/V's element type
  GpuWeights gpu_weights = GpuWeights::kBf16;  // --gpu-weights (CUDA only)
};

struct EvalOptions : EvalSetup {
  int32_t window = 0;       // W; 0 means the model's seq_len
  int32_t max_windows = 0;  // 0 means every full window of the stream
  int32_t prefill = 0;      // P: tokens of each window fed as one prompt chunk; 0 or 1: none
};

struct EvalResult {
  std::string policy;
  std::string kv_dtype;       // the cached K/V's element type (KvElementName): fp32, bf16, ...
  std::string budget;         // as given ("full" for the full cache); eval --json "budget_spec"
  int32_t budget_tokens = 0;  // resolved against W; eval --json "budget"
  int32_t window = 0;
  int32_t windows = 0;
  int64_t tokens = 0;  // predictions scored
  double ppl = 0;
  double top1 = 0;
  // Pool bytes one window holds at its peak (PeakPages x PageBytes): what the configuration's
  // memory costs, a demoted store's pages included (and with `prefill`, the prompt chunk's
  // pages when more); eval --json "kv_bytes".
  int64_t kv_bytes = 0;

  // "h2o budget 32 (0.25): ppl 5.123 top1 0.41 over 4 windows of 512", for logs and test traces.
  std::string ToString() const;
};

// A KV pool of `pages` pages of `shape` on `device` and a runner for `model` on it, for eval's
// tasks (INVALID_ARGUMENT past INT32_MAX pages, naming `what` holds them).
struct EvalBackend {
  std::unique_ptr<KvCache> cache;
  std::unique_ptr<StepRunner> runner;
};
absl::StatusOr<EvalBackend> MakeEvalBackend(const Model& model, Device device,
                                            const KvShape& shape, int64_t pages,
                                            absl::string_view what,
                                            GpuWeights gpu_weights = GpuWeights::kBf16);

// The KV page shape of `setup` for `config` (INVALID_ARGUMENT for a K/V dtype its device cannot
// hold).
absl::StatusOr<KvShape> EvalKvShape(const ModelConfig& config, const EvalSetup& setup);

// The policy object of each configuration, in order (null for "full"); INVALID_ARGUMENT for a
// bad spec. Evaluate, EvaluateStream and RunPasskey share it.
absl::StatusOr<std::vector<std::unique_ptr<EvictionPolicy>>> MakeConfigPolicies(
    const EvalSetup& setup);

// The eval token stream of `text`: stories split at blank lines, each encoded with BOS when the
// tokenizer adds one.
std::vector<int32_t> BuildEvalStream(const TextTokenizer& tokenizer, absl::string_view text);

// One result per configuration, in order (a "full" configuration ignores its budget).
absl::StatusOr<std::vector<EvalResult>> Evaluate(const Model& model,
                                                 std::span<const int32_t> stream,
                                                 const EvalOptions& options);

// Perplexity of one long stream (`eval --stream-tokens N`), StreamingLLM's test: the stories of
// the text one after another (each with its BOS), N tokens in all, fed one token per step to one
// sequence per configuration that is never reset, and scored in consecutive chunks of `chunk`
// tokens as they come. A policy that streams past the context (window, sink with a budget under
// it: StreamsPastContext) runs to N; any other (full included) stops at the context length.
// The configurations' budget fractions resolve against the context length.
struct StreamEvalOptions : EvalSetup {
  int64_t tokens = 0;    // N; the text repeats (without a leading BOS) when it is shorter
  int32_t chunk = 256;   // tokens per scored chunk
};

struct StreamEvalResult {
  std::string policy;
  std::string budget;         // as given ("full" for the full cache)
  int32_t budget_tokens = 0;  // resolved against the context length
  int64_t tokens = 0;         // predictions scored (stopped at the context or N - 1)
  bool past_context = false;  // whether it could run past the context length
  double ppl = 0;             // over all scored predictions
  // Per chunk: the position of its last predicted token + 1 and its perplexity.
  std::vector<int64_t> chunk_end;
  std::vector<double> chunk_ppl;
};

absl::StatusOr<std::vector<StreamEvalResult>> EvaluateStream(const Model& model,
                                                             std::span<const int32_t> stream,
                                                             const StreamEvalOptions& options);

}  // namespace heavykv
