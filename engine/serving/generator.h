// Generate: runs one sequence from its prompt to completion, the way llama2.c run.c's generate()
// does: the prompt is fed (in chunks here, instead of one token at a time), then tokens are
// sampled until `steps` positions are filled or the model ends the sequence (BOS/EOS, or the
// tokenizer's end-of-generation tokens).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/runner/model_runner.h"  // ModelRunner, StepRunner
#include "engine/serving/sampler.h"
#include "engine/tokenizer/text_tokenizer.h"
#include "memory/eviction_policy.h"

namespace heavykv {

struct GenerateOptions {
  int32_t steps = 256;  // positions in all: prompt tokens + new tokens (llama2.c's -n)
  SamplingParams sampling;
  const EvictionPolicy* policy = nullptr;  // null: full cache
  int32_t budget = kUnboundedBudget;       // tokens kept per (layer, kv head)
  KvQuant kv_quant = KvQuant::kNone;       // the sequence's own row type (SequenceKv::quant)
  int32_t prefill_chunk = 256;             // prompt tokens per forward step
  // Ends the generation at its end-of-generation tokens; null: at the model's BOS or EOS (run.c).
  const TextTokenizer* tokenizer = nullptr;
  bool ignore_eos = false;  // run to `steps` whatever the model samples
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // prompt followed by the generated tokens
  int32_t num_prompt_tokens = 0;
  std::string finish_reason;  // "length" or "eos"
  int32_t peak_pages = 0;
  int64_t tokens_evicted = 0;  // per (layer, kv head)
  double prefill_seconds = 0;
  double decode_seconds = 0;
  // CPU time of the whole process (every thread) while decoding: against decode_seconds x
  // threads it shows how much of the wall time the threads had a core (a noisy VM shows here).
  double decode_cpu_seconds = 0;
};

// Whether `token` ends a sequence: the tokenizer's end-of-generation tokens, or without a
// tokenizer the model's BOS or EOS (run.c's rule). Generate and the serving engine both use it.
bool EndsSequence(const TextTokenizer* tokenizer, const ModelConfig& config, int32_t token);

// Calls on_token(prev, token) for every token after the first of the prompt (prompt tokens are
// echoed, as run.c does) as soon as it is known. The sequence's pages are returned before it
// returns, also on error.
absl::StatusOr<GenerateResult> Generate(StepRunner& runner, std::span<const int32_t> prompt,
                                        const GenerateOptions& options,
                                        const std::function<void(int32_t, int32_t)>& on_token);

}  // namespace heavykv
