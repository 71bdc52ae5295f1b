// Sampler: turns a row of logits into a token id, as llama2.c run.c does, plus top-k, min-p,
// logit bias and the penalties of the OpenAI, vLLM and llama.cpp APIs.
//
// The order (docs/ARCHITECTURE.md "The sampling API"; vLLM's, with the constraint's mask first):
//   1. the caller's mask (a constraint: disallowed tokens are -inf before Sample is called)
//   2. min_tokens: end-of-generation and stop tokens -inf while fewer were generated (unless
//      that leaves no token at all: a constraint that allows only the end wins)
//   3. logit_bias: logit[id] += bias
//   4. repetition_penalty r over the tokens seen (prompt and generated, or the last
//      penalty_last_n of them): a positive logit is divided by r, a negative one multiplied
//   5. frequency_penalty f and presence_penalty p over the generated tokens:
//      logit[id] -= f * count(id) + p * (count(id) > 0)
//   -- temperature == 0: argmax of the adjusted logits (first index on ties). Otherwise:
//   6. logits / temperature, softmax
//   7. min_p: tokens below min_p x the largest probability are dropped
//   8. top_k, then top_p (nucleus), as run.c; one number from run.c's xorshift RNG per sample.
// With every option off this is run.c's sampler exactly: the same seed gives the same tokens.
// Steps 2-5 cost O(entries + distinct tokens seen), never O(vocab).
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace heavykv {

struct SamplingParams {
  float temperature = 1.0f;
  float top_p = 0.9f;
  int32_t top_k = 0;  // 0: disabled
  uint64_t seed = 1;
  float min_p = 0.0f;               // 0: off
  float presence_penalty = 0.0f;    // 0: off
  float frequency_penalty = 0.0f;   // 0: off
  float repetition_penalty = 1.0f;  // 1: off
  int32_t penalty_last_n = -1;      // repetition_penalty's window: -1 every token seen, 0 none
  std::vector<std::pair<int32_t, float>> logit_bias;  // (id, bias); ids inside the vocabulary
  int32_t min_tokens = 0;
  std::vector<int32_t> banned_until_min;  // EOS and stop token ids, for min_tokens
};

class Sampler {
 public:
  // `prompt`: the tokens repetition_penalty counts before any is generated.
  explicit Sampler(const SamplingParams& params, std::span<const int32_t> prompt = {});

  // Samples from `logits` [vocab] (steps 2-8); the span is used as scratch and modified.
  int32_t Sample(std::span<float> logits);
  // Records a generated token (the penalties' counts, min_tokens). The engine calls it for every
  // token it keeps, sampled here or not.
  void Accept(int32_t token);

  static int32_t Argmax(std::span<const float> logits);
  // log softmax(logits)[token], computed in double around the maximum.
  static double LogProb(std::span<const float> logits, int32_t token);
  // log sum exp(logits), in double around the maximum: logits[t] - LogSumExp = log p(t).
  static double LogSumExp(std::span<const float> logits);
  // The min(n, size) ids of the largest logits, largest first (ties: the lower id first).
  static std::vector<int32_t> TopTokens(std::span<const float> logits, int32_t n);

 private:
  // Steps 2-5 on `logits`; true when step 2 banned something (the row may be all -inf then).
  bool AdjustLogits(std::span<float> logits);
  // Adds `token` to repetition_penalty's window, dropping the oldest past penalty_last_n.
  void PushWindow(int32_t token);
  float RandomF32();  // run.c random_f32()
  uint32_t RandomU32();

  SamplingParams params_;  // logit_bias: one entry per id (the last given), sorted by id
  uint64_t rng_state_;
  std::vector<std::pair<float, int32_t>> candidates_;  // scratch: (prob, id)
  std::vector<std::pair<int32_t, float>> banned_saved_;  // scratch: step 2's (id, logit before)
  // Invariants: counts are > 0 (an id whose count falls to 0 is erased); window_counts_ is the
  // multiset of window_ (the last penalty_last_n tokens seen, a ring whose oldest is at
  // window_head_ once full; every token seen when penalty_last_n is -1, then window_ stays empty).
  absl::flat_hash_map<int32_t, int32_t> generated_counts_;  // presence / frequency
  absl::flat_hash_map<int32_t, int32_t> window_counts_;     // repetition_penalty
  std::vector<int32_t> window_;
  size_t window_head_ = 0;
  int32_t num_accepted_ = 0;  // tokens generated so far (min_tokens)
};

}  // namespace heavykv
