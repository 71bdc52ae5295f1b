// Token sampling, mirroring karpathy/llama2.c run.c (sample(), sample_mult(), sample_topp(), its
// xorshift RNG and its float softmax) so that a given seed reproduces run.c's tokens; top-k is our
// addition and is a no-op unless enabled.
#include "engine/serving/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <utility>

namespace heavykv {
namespace {

// xorshift never leaves the all-zero state, so seed 0 (which run.c replaces with the wall clock)
// is mapped to this fixed constant instead: runs stay reproducible and the stream is non-trivial.
constexpr uint64_t kZeroSeedReplacement = 0x9E3779B97F4A7C15ull;

// run.c softmax(): subtract the max for stability, expf, then normalise, all in float and in index
// order so the rounding (and hence the sampled token for a given coin) matches.
void Softmax(std::span<float> x) {
  float max_val = x[0];
  for (size_t i = 1; i < x.size(); ++i) {
    if (x[i] > max_val) max_val = x[i];
  }
  float sum = 0.0f;
  for (float& v : x) {
    v = std::exp(v - max_val);
    sum += v;
  }
  for (float& v : x) v /= sum;
}

// Zeroes all but the k most probable entries and renormalises. Ties at the boundary keep the lower
// ids, so the result does not depend on nth_element's internals; top_k = 1 is exactly Argmax.
void KeepTopK(std::span<float> probs, size_t k, std::vector<std::pair<float, int32_t>>& scratch) {
  scratch.clear();
  for (size_t i = 0; i < probs.size(); ++i) scratch.emplace_back(probs[i], static_cast<int32_t>(i));
  auto more_likely = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  std::nth_element(scratch.begin(), scratch.begin() + static_cast<std::ptrdiff_t>(k - 1),
                   scratch.end(), more_likely);
  const std::pair<float, int32_t> last_kept = scratch[k - 1];
  float sum = 0.0f;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (more_likely(last_kept, {probs[i], static_cast<int32_t>(i)})) {
      probs[i] = 0.0f;
    } else {
      sum += probs[i];
    }
  }
  for (float& p : probs) p /= sum;
}

// run.c sample_mult(): walk the CDF. Rounding can leave the total short of 1, hence the fallback.
int32_t SampleMult(std::span<const float> probs, float coin) {
  float cdf = 0.0f;
  for (size_t i = 0; i < probs.size(); ++i) {
    cdf += probs[i];
    if (coin < cdf) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(probs.size()) - 1;
}

// run.c sample_topp(): nucleus sampling over the smallest prefix (by descending probability) whose
// mass exceeds top_p.
int32_t SampleTopP(std::span<const float> probs, float top_p, float coin,
                   std::vector<std::pair<float, int32_t>>& candidates) {
  const size_t n = probs.size();
  if (n == 1) return 0;  // run.c divides by n - 1 = 0 below.
  // Tokens below this cannot be in the nucleus (if all of the other n - 1 tokens had exactly this
  // probability they would still not reach top_p), so run.c drops them before sorting.
  const float cutoff = (1.0f - top_p) / static_cast<float>(n - 1);
  candidates.clear();
  for (size_t i = 0; i < n; ++i) {
    if (probs[i] >= cutoff) candidates.emplace_back(probs[i], static_cast<int32_t>(i));
  }
  // With a flat distribution and top_p < 1/n nothing passes the cutoff and run.c reads
  // probindex[-1]; the top_p -> 0 limit of nucleus sampling is the argmax, so return that.
  if (candidates.empty()) return Sampler::Argmax(probs);
  // run.c uses qsort, which glibc implements as a stable merge sort; stable_sort keeps equal
  // probabilities in id order the same way.
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  float cumulative_prob = 0.0f;
  size_t last_idx = candidates.size() - 1;
  for (size_t i = 0; i < candidates.size(); ++i) {
    cumulative_prob += candidates[i].first;
    if (cumulative_prob > top_p) {
      last_idx = i;
      break;
    }
  }
  // The coin is in [0, 1) of the whole distribution; rescale it to the truncated mass.
  const float r = coin * cumulative_prob;
  float cdf = 0.0f;
  for (size_t i = 0; i <= last_idx; ++i) {
    cdf += candidates[i].first;
    if (r < cdf) return candidates[i].second;
  }
  return candidates[last_idx].second;
}

}  // namespace

// The penalties (and so `prompt`) are the sampling-API work's (issue 44); the contract commit
// declared the parameter, which is unused until then.
Sampler::Sampler(const SamplingParams& params, std::span<const int32_t> /*prompt*/)
    : params_(params), rng_state_(params.seed != 0 ? params.seed : kZeroSeedReplacement) {}

double Sampler::LogSumExp(std::span<const float> logits) {
  const float mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float v : logits) sum += std::exp(double(v) - mx);
  return mx + std::log(sum);
}

double Sampler::LogProb(std::span<const float> logits, int32_t token) {
  return double(logits[token]) - LogSumExp(logits);
}

std::vector<int32_t> Sampler::TopTokens(std::span<const float> logits, int32_t n) {
  const size_t k = std::min(logits.size(), size_t(std::max(n, 0)));
  // "a before b" in the output order: the larger logit, then the lower id.
  const auto before = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::vector<int32_t> heap;  // the best k so far; its front is the last of them
  heap.reserve(k + 1);
  for (size_t i = 0; i < logits.size() && k > 0; ++i) {
    const int32_t id = static_cast<int32_t>(i);
    if (heap.size() < k) {
      heap.push_back(id);
      std::push_heap(heap.begin(), heap.end(), before);
    } else if (before(id, heap.front())) {
      std::pop_heap(heap.begin(), heap.end(), before);
      heap.back() = id;
      std::push_heap(heap.begin(), heap.end(), before);
    }
  }
  std::sort_heap(heap.begin(), heap.end(), before);
  return heap;
}

int32_t Sampler::Argmax(std::span<const float> logits) {
  if (logits.empty()) return -1;
  // Strictly greater: the first maximum wins, as in run.c sample_argmax().
  size_t max_i = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[max_i]) max_i = i;
  }
  return static_cast<int32_t>(max_i);
}

int32_t Sampler::Sample(std::span<float> logits) {
  if (logits.empty()) return -1;
  // Greedy decoding draws no random number, so it does not advance the RNG.
  if (params_.temperature == 0.0f) return Argmax(logits);
  // Divide (not multiply by the reciprocal) to round exactly as run.c does.
  for (float& l : logits) l /= params_.temperature;
  Softmax(logits);
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < logits.size()) {
    KeepTopK(logits, static_cast<size_t>(params_.top_k), candidates_);
  }
  // Exactly one draw per sample whichever path follows, so streams stay aligned with run.c.
  const float coin = RandomF32();
  if (params_.top_p <= 0.0f || params_.top_p >= 1.0f) return SampleMult(logits, coin);
  return SampleTopP(logits, params_.top_p, coin, candidates_);
}

uint32_t Sampler::RandomU32() {
  // xorshift64* (https://en.wikipedia.org/wiki/Xorshift#xorshift*), as in run.c random_u32().
  rng_state_ ^= rng_state_ >> 12;
  rng_state_ ^= rng_state_ << 25;
  rng_state_ ^= rng_state_ >> 27;
  return static_cast<uint32_t>((rng_state_ * 0x2545F4914F6CDD1Dull) >> 32);
}

float Sampler::RandomF32() {
  // The top 24 bits fill a float mantissa exactly: uniform in [0, 1), never 1.
  return static_cast<float>(RandomU32() >> 8) / 16777216.0f;
}

}  // namespace heavykv
