// Token sampling, mirroring karpathy/llama2.c run.c (sample(), sample_mult(), sample_topp(), its
// xorshift RNG and its float softmax) so that a given seed reproduces run.c's tokens; top-k, min-p,
// logit bias and the penalties are our additions and each is a no-op (not even a pass over the
// row) unless enabled.
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

// min_p: zeroes the probabilities under min_p x the largest and renormalises (vLLM, llama.cpp).
// The largest always stays, so the row keeps some mass.
void KeepMinP(std::span<float> probs, float min_p) {
  const float threshold = min_p * *std::max_element(probs.begin(), probs.end());
  float sum = 0.0f;
  for (float& p : probs) {
    if (p < threshold) {
      p = 0.0f;
    } else {
      sum += p;
    }
  }
  for (float& p : probs) p /= sum;
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

Sampler::Sampler(const SamplingParams& params, std::span<const int32_t> prompt)
    : params_(params), rng_state_(params.seed != 0 ? params.seed : kZeroSeedReplacement) {
  // One entry per id, the last given winning (as a JSON object's last key would): stable sort by
  // id, then keep the last of each run.
  std::vector<std::pair<int32_t, float>>& bias = params_.logit_bias;
  std::stable_sort(bias.begin(), bias.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  size_t kept = 0;
  for (size_t i = 0; i < bias.size(); ++i) {
    if (i + 1 < bias.size() && bias[i + 1].first == bias[i].first) continue;
    bias[kept++] = bias[i];
  }
  bias.resize(kept);
  if (params_.repetition_penalty != 1.0f && params_.penalty_last_n != 0) {
    // Only the last penalty_last_n prompt tokens can ever be in the window.
    const size_t n = params_.penalty_last_n < 0
                         ? prompt.size()
                         : std::min(prompt.size(), size_t(params_.penalty_last_n));
    for (int32_t t : prompt.subspan(prompt.size() - n)) PushWindow(t);
  }
}

void Sampler::PushWindow(int32_t token) {
  ++window_counts_[token];
  if (params_.penalty_last_n < 0) return;  // every token counts: no ring to keep
  if (window_.size() < size_t(params_.penalty_last_n)) {
    window_.push_back(token);
    return;
  }
  // Full: the oldest token leaves the window (and its count) as this one takes its slot.
  int32_t& slot = window_[window_head_];
  const auto it = window_counts_.find(slot);
  if (--it->second == 0) window_counts_.erase(it);
  slot = token;
  window_head_ = (window_head_ + 1) % window_.size();
}

void Sampler::Accept(int32_t token) {
  ++num_accepted_;
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    ++generated_counts_[token];
  }
  if (params_.repetition_penalty != 1.0f && params_.penalty_last_n != 0) PushWindow(token);
}

bool Sampler::AdjustLogits(std::span<float> logits) {
  const auto in_vocab = [&](int32_t id) { return id >= 0 && size_t(id) < logits.size(); };
  // 3. logit_bias (-inf stays -inf: a bias never revives a masked token).
  for (const auto& [id, bias] : params_.logit_bias) {
    if (in_vocab(id)) logits[id] += bias;
  }
  // 4. repetition_penalty: dividing a positive logit and multiplying a negative one both make
  // the token less likely for r > 1 (more likely for r < 1), as Hugging Face and vLLM do.
  const float r = params_.repetition_penalty;
  if (r != 1.0f) {
    for (const auto& [id, count] : window_counts_) {
      if (!in_vocab(id)) continue;
      float& l = logits[id];
      l = l > 0.0f ? l / r : l * r;
    }
  }
  // 5. frequency and presence (OpenAI), over the generated tokens only.
  const float f = params_.frequency_penalty, p = params_.presence_penalty;
  for (const auto& [id, count] : generated_counts_) {
    if (in_vocab(id)) logits[id] -= f * float(count) + p;
  }
  // 2. min_tokens, applied last: -inf stays -inf through steps 3-5, so the row is the same as in
  // the documented order, and the logits saved here (for Sample to undo a ban that left nothing)
  // are the adjusted ones.
  banned_saved_.clear();
  if (num_accepted_ < params_.min_tokens) {
    for (int32_t id : params_.banned_until_min) {
      if (!in_vocab(id)) continue;
      banned_saved_.emplace_back(id, logits[id]);
      logits[id] = -INFINITY;
    }
  }
  return !banned_saved_.empty();
}

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
  if (AdjustLogits(logits)) {
    // min_tokens banned every token a constraint left (a grammar that can only end): ending
    // honours the constraint, so the ban gives way. One pass over the row, only while banning.
    if (*std::max_element(logits.begin(), logits.end()) == -INFINITY) {
      // Last saved first: an id listed twice was saved a second time as -inf.
      for (auto it = banned_saved_.rbegin(); it != banned_saved_.rend(); ++it) {
        logits[it->first] = it->second;
      }
    }
  }
  // Greedy decoding draws no random number, so it does not advance the RNG.
  if (params_.temperature == 0.0f) return Argmax(logits);
  // Divide (not multiply by the reciprocal) to round exactly as run.c does.
  for (float& l : logits) l /= params_.temperature;
  Softmax(logits);
  if (params_.min_p > 0.0f) KeepMinP(logits, params_.min_p);
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
