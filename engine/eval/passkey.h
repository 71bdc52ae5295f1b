// Passkey retrieval (`heavykv eval --task passkey`): a five-digit number hidden at some depth in
// filler text, asked for at the end, as in Mohtashami & Jaggi's Landmark Attention and LongLoRA.
// A policy passes a trial when the greedy answer's first number is the key. The task shows what a
// budget costs a model that can retrieve (a real instruction-tuned model); the bundled toy model
// cannot, so its accuracy is 0 whatever the policy.
//
//   PasskeyOptions o;  o.configs = {{"h2o", *KvBudget::Parse("0.2")}};
//   absl::StatusOr<std::vector<PasskeyResult>> r = RunPasskey(model, tokenizer, o);
//
// Trial t of n puts its key at depth t / (n - 1) of the filler (0: right after the instructions,
// 1: just before the question); the keys come from `seed`, so every configuration answers the same
// prompts. Each trial is one Generate() from an empty cache: the prompt in chunks, then up to
// `answer_tokens` greedy tokens, the budget resolved against prompt + answer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/eval/evaluator.h"
#include "engine/model/model.h"
#include "engine/tokenizer/text_tokenizer.h"

namespace heavykv {

struct PasskeyPrompt {
  std::vector<int32_t> tokens;  // with BOS when the tokenizer adds one
  std::string text;
  std::string key;
  double depth = 0;
};

// The prompt with `key` at `depth` in [0, 1], as many filler sentences as fit in
// `target_tokens` (at least one); INVALID_ARGUMENT when not even one fits.
absl::StatusOr<PasskeyPrompt> BuildPasskeyPrompt(const TextTokenizer& tokenizer,
                                                 const std::string& key, double depth,
                                                 int32_t target_tokens);

// Whether the first run of digits in `answer` is exactly `key`.
bool PasskeyFound(absl::string_view answer, absl::string_view key);

struct PasskeyOptions : EvalSetup {
  int32_t prompt_tokens = 0;  // target prompt length; 0: the context length minus answer_tokens
  int32_t answer_tokens = 8;
  int32_t trials = 5;
  uint64_t seed = 1;
  int32_t prefill_chunk = 256;
};

struct PasskeyResult {
  std::string policy;
  std::string budget;         // as given ("full" for the full cache)
  int32_t budget_tokens = 0;  // resolved against prompt + answer tokens
  int32_t prompt_tokens = 0;  // the longest prompt of the trials
  int32_t trials = 0;
  int32_t correct = 0;
  double accuracy = 0;
  std::vector<std::string> answers;  // per trial, the generated text
  std::vector<std::string> keys;     // per trial
};

// One result per configuration, in order.
absl::StatusOr<std::vector<PasskeyResult>> RunPasskey(const Model& model,
                                                      const TextTokenizer& tokenizer,
                                                      const PasskeyOptions& options);

}  // namespace heavykv
