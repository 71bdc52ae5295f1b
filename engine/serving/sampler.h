// Sampler: turns a row of logits into a token id, as llama2.c run.c does, plus top-k.
//
// temperature == 0: argmax (first index on ties). Otherwise logits / temperature, softmax, keep
// the top_k most likely tokens when top_k > 0, then nucleus (top-p) sampling when 0 < top_p < 1,
// drawing one number from run.c's xorshift RNG per sample. The same seed gives the same tokens.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace heavykv {

struct SamplingParams {
  float temperature = 1.0f;
  float top_p = 0.9f;
  int32_t top_k = 0;  // 0: disabled
  uint64_t seed = 1;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // Samples from `logits` [vocab]; the span is used as scratch and modified.
  int32_t Sample(std::span<float> logits);

  static int32_t Argmax(std::span<const float> logits);
  // log softmax(logits)[token], computed in double around the maximum.
  static double LogProb(std::span<const float> logits, int32_t token);
  // log sum exp(logits), in double around the maximum: logits[t] - LogSumExp = log p(t).
  static double LogSumExp(std::span<const float> logits);
  // The min(n, size) ids of the largest logits, largest first (ties: the lower id first).
  static std::vector<int32_t> TopTokens(std::span<const float> logits, int32_t n);

 private:
  float RandomF32();  // run.c random_f32()
  uint32_t RandomU32();

  SamplingParams params_;
  uint64_t rng_state_;
  std::vector<std::pair<float, int32_t>> candidates_;  // scratch: (prob, id)
};

}  // namespace heavykv
