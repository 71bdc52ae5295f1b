// Sampler tests. Pinned RNG outputs and token sequences come from an independent Python
// re-implementation of llama2.c run.c (random_u32 masked to 64 bits, sample(), sample_topp()),
// not from this code.
#include "engine/serving/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "gtest/gtest.h"

namespace heavykv {
namespace {

// SamplingParams with these and every other option off (designated initializers would leave the
// others out, which -Wmissing-field-initializers reports).
SamplingParams Params(float temperature, float top_p = 0.9f, int32_t top_k = 0,
                      uint64_t seed = 1) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_p = top_p;
  p.top_k = top_k;
  p.seed = seed;
  return p;
}

const std::vector<float> kLogits = {1.5f, -0.5f, 3.0f, 0.25f, 2.0f, -2.0f, 2.75f, 0.0f};

std::vector<int32_t> SampleMany(const SamplingParams& params, const std::vector<float>& logits,
                                int n) {
  Sampler sampler(params);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    std::vector<float> scratch = logits;  // Sample() overwrites its input
    out.push_back(sampler.Sample(scratch));
  }
  return out;
}

std::vector<double> Softmax(const std::vector<float>& logits, double temperature) {
  std::vector<double> p(logits.size());
  double sum = 0.0;
  for (size_t i = 0; i < p.size(); ++i) sum += p[i] = std::exp(logits[i] / temperature);
  for (double& v : p) v /= sum;
  return p;
}

// Empirical token frequencies over `n` samples.
std::vector<double> Frequencies(const SamplingParams& params, const std::vector<float>& logits,
                                int n) {
  std::vector<double> freq(logits.size(), 0.0);
  for (int32_t t : SampleMany(params, logits, n)) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, static_cast<int32_t>(logits.size()));
    freq[t] += 1.0 / n;
  }
  return freq;
}

void ExpectNear(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "token " << i;
}

TEST(SamplerTest, ArgmaxTakesFirstMaximum) {
  EXPECT_EQ(Sampler::Argmax(kLogits), 2);
  const std::vector<float> ties = {0.0f, 5.0f, -1.0f, 5.0f};
  EXPECT_EQ(Sampler::Argmax(ties), 1);
  const std::vector<float> one = {-3.0f};
  EXPECT_EQ(Sampler::Argmax(one), 0);
  EXPECT_EQ(Sampler::Argmax(std::span<const float>()), -1);
}

TEST(SamplerTest, TemperatureZeroIsArgmax) {
  SamplingParams params = Params(0.0f, 0.9f, 0, 42);
  for (int32_t t : SampleMany(params, kLogits, 50)) EXPECT_EQ(t, 2);
  const std::vector<float> ties = {0.0f, 5.0f, -1.0f, 5.0f};
  for (int32_t t : SampleMany(params, ties, 10)) EXPECT_EQ(t, 1);
}

// With 2^24 equal logits every probability is exactly 2^-24 and every partial CDF is exact, so
// sample_mult returns exactly floor(coin * 2^24) = random_u32() >> 8: the sampled ids expose the
// RNG stream (all 24 bits that random_f32 uses).
std::vector<int32_t> ObserveRandomU32Shr8(uint64_t seed, int n) {
  Sampler sampler(Params(1.0f, 1.0f, 0, seed));
  std::vector<float> logits;
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    logits.assign(size_t{1} << 24, 0.0f);
    out.push_back(sampler.Sample(logits));
  }
  return out;
}

TEST(SamplerTest, RngStreamMatchesRunC) {
  // random_u32 for seed 42: 1456360119, 3359763283, 3393612768, 4054632243; >> 8 below.
  EXPECT_EQ(ObserveRandomU32Shr8(42, 4),
            (std::vector<int32_t>{5688906, 13124075, 13256299, 15838407}));
  // Seed 0 is replaced by the fixed constant 0x9E3779B97F4A7C15 (xorshift would stay at 0).
  EXPECT_EQ(ObserveRandomU32Shr8(0, 3), (std::vector<int32_t>{885683, 5555276, 11027955}));
}

TEST(SamplerTest, PinnedSequencesMatchRunC) {
  // top-p path (run.c sample_topp).
  EXPECT_EQ(SampleMany(Params(1.0f, 0.9f, 0, 42), kLogits, 24),
            (std::vector<int32_t>{2, 4, 4, 0, 4, 4, 2, 6, 2, 6, 6, 2,
                                  4, 2, 2, 6, 2, 2, 0, 2, 6, 6, 2, 2}));
  // Plain multinomial path (top_p = 1 disables nucleus sampling) at another temperature.
  EXPECT_EQ(SampleMany(Params(0.8f, 1.0f, 0, 42), kLogits, 24),
            (std::vector<int32_t>{2, 6, 6, 6, 6, 6, 2, 2, 2, 6, 2, 2,
                                  6, 2, 1, 4, 2, 2, 7, 2, 2, 6, 2, 2}));
  // top-k then top-p.
  EXPECT_EQ(
      SampleMany(Params(1.3f, 0.95f, 3, 1234), kLogits, 24),
      (std::vector<int32_t>{6, 2, 2, 2, 4, 2, 6, 2, 2, 6, 2, 6,
                            2, 4, 6, 4, 4, 4, 2, 2, 2, 2, 6, 2}));
}

TEST(SamplerTest, SameSeedSameSequenceDifferentSeedDifferent) {
  std::vector<float> logits(32);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(static_cast<float>(i)) * 2.0f;
  const SamplingParams a = Params(1.0f, 0.95f, 0, 7);
  SamplingParams b = a;
  b.seed = 8;
  const std::vector<int32_t> first = SampleMany(a, logits, 200);
  EXPECT_EQ(SampleMany(a, logits, 200), first);
  EXPECT_NE(SampleMany(b, logits, 200), first);
}

TEST(SamplerTest, TopKOneIsArgmaxAtAnyTemperature) {
  const std::vector<float> ties = {0.0f, 5.0f, -1.0f, 5.0f, 4.9f};
  for (float temperature : {0.1f, 1.0f, 2.0f, 100.0f}) {
    for (float top_p : {0.5f, 0.9f, 1.0f}) {
      SamplingParams params = Params(temperature, top_p, 1, 3);
      for (int32_t t : SampleMany(params, kLogits, 200)) EXPECT_EQ(t, 2);
      for (int32_t t : SampleMany(params, ties, 200)) EXPECT_EQ(t, 1);
    }
  }
}

TEST(SamplerTest, SmallTopPSamplesOnlyTheTopToken) {
  // The top token alone (p ~ 0.40 at temperature 1) already exceeds top_p.
  SamplingParams params = Params(1.0f, 0.1f, 0, 99);
  for (int32_t t : SampleMany(params, kLogits, 1000)) EXPECT_EQ(t, 2);
  // Flat logits with top_p < 1/n leave nothing above run.c's cutoff (run.c reads out of bounds);
  // we fall back to the argmax, the top_p -> 0 limit.
  const std::vector<float> flat(16, 0.5f);
  params.top_p = 0.01f;
  for (int32_t t : SampleMany(params, flat, 100)) EXPECT_EQ(t, 0);
}

TEST(SamplerTest, FrequenciesMatchSoftmax) {
  constexpr int kSamples = 200000;  // standard error <= 0.0012 per token
  ExpectNear(
      Frequencies(Params(1.0f, 1.0f, 0, 5), kLogits, kSamples),
      Softmax(kLogits, 1.0), 0.006);
  ExpectNear(
      Frequencies(Params(0.5f, 0.0f, 0, 6), kLogits, kSamples),
      Softmax(kLogits, 0.5), 0.006);
}

TEST(SamplerTest, TopKFrequenciesAreRenormalised) {
  // Keep tokens 2, 6, 4 (logits 3.0, 2.75, 2.0) with their relative softmax weights.
  std::vector<double> want(kLogits.size(), 0.0);
  const double e2 = std::exp(3.0), e6 = std::exp(2.75), e4 = std::exp(2.0);
  want[2] = e2 / (e2 + e6 + e4);
  want[6] = e6 / (e2 + e6 + e4);
  want[4] = e4 / (e2 + e6 + e4);
  ExpectNear(
      Frequencies(Params(1.0f, 1.0f, 3, 11), kLogits, 200000),
      want, 0.006);
}

TEST(SamplerTest, TopPFrequenciesAreTheRenormalisedNucleus) {
  // Sorted softmax at temperature 1: 2 (.397), 6 (.309), 4 (.146), 0 (.089), ... The smallest
  // prefix with mass > 0.8 is {2, 6, 4}; sampling is proportional within it.
  const std::vector<double> p = Softmax(kLogits, 1.0);
  ASSERT_LT(p[2] + p[6], 0.8);
  ASSERT_GT(p[2] + p[6] + p[4], 0.8);
  std::vector<double> want(kLogits.size(), 0.0);
  for (int i : {2, 6, 4}) want[i] = p[i] / (p[2] + p[6] + p[4]);
  ExpectNear(
      Frequencies(Params(1.0f, 0.8f, 0, 12), kLogits, 200000),
      want, 0.006);
}


// TopTokens against a full sort: largest logits first, the lower id first among equal logits.
TEST(SamplerTest, TopTokensAreTheLargestLogitsInOrder) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 3.5f, 0.5f, -7.0f, 2.0f, 1.0f};
  std::vector<int32_t> all(logits.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int32_t>(i);
  std::stable_sort(all.begin(), all.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  for (int32_t n = 0; n <= 12; ++n) {
    const std::vector<int32_t> want(all.begin(), all.begin() + std::min<size_t>(n, all.size()));
    EXPECT_EQ(Sampler::TopTokens(logits, n), want) << "n = " << n;
  }
  EXPECT_EQ(Sampler::TopTokens(logits, 3), (std::vector<int32_t>{4, 1, 3}));
  EXPECT_TRUE(Sampler::TopTokens(logits, -1).empty());
}

TEST(SamplerTest, LogProbsAreTheLogSoftmax) {
  const std::vector<double> p = Softmax(kLogits, 1.0);
  double total = 0;
  for (size_t t = 0; t < kLogits.size(); ++t) {
    EXPECT_NEAR(Sampler::LogProb(kLogits, static_cast<int32_t>(t)), std::log(p[t]), 1e-9);
    EXPECT_NEAR(kLogits[t] - Sampler::LogSumExp(kLogits), std::log(p[t]), 1e-6);
    total += std::exp(Sampler::LogProb(kLogits, static_cast<int32_t>(t)));
  }
  EXPECT_NEAR(total, 1.0, 1e-9);
}

// ---- The sampling API (issue 44): steps 2-5 against a reference written from sampler.h ----

constexpr float kInf = std::numeric_limits<float>::infinity();

// Steps 2-5 the plain way: counts by scanning the whole history for every token, the window as
// the last penalty_last_n of prompt + generated.
std::vector<float> ReferenceAdjust(const SamplingParams& p, const std::vector<int32_t>& prompt,
                                   const std::vector<int32_t>& generated,
                                   std::vector<float> logits) {
  std::vector<int32_t> seen = prompt;
  seen.insert(seen.end(), generated.begin(), generated.end());
  const size_t n = p.penalty_last_n < 0 ? seen.size()
                                        : std::min(seen.size(), size_t(p.penalty_last_n));
  const std::vector<int32_t> window(seen.end() - static_cast<std::ptrdiff_t>(n), seen.end());
  for (size_t i = 0; i < p.logit_bias.size(); ++i) {  // the last entry of an id wins
    const auto& [id, bias] = p.logit_bias[i];
    bool last = true;
    for (size_t j = i + 1; j < p.logit_bias.size(); ++j) last = last && p.logit_bias[j].first != id;
    if (last) logits[id] += bias;
  }
  for (size_t id = 0; id < logits.size(); ++id) {
    const auto t = static_cast<int32_t>(id);
    if (std::count(window.begin(), window.end(), t) > 0) {
      logits[id] = logits[id] > 0 ? logits[id] / p.repetition_penalty
                                  : logits[id] * p.repetition_penalty;
    }
    const auto count = std::count(generated.begin(), generated.end(), t);
    if (count > 0) {
      logits[id] -= p.frequency_penalty * float(count) + p.presence_penalty;
    }
  }
  if (int32_t(generated.size()) < p.min_tokens) {
    for (int32_t id : p.banned_until_min) logits[id] = -kInf;
  }
  return logits;
}

// Samples `steps` tokens from `logits` with `params` (accepting each), and from the reference's
// adjusted row with a plain run.c sampler of the same seed: the same coins must give the same
// tokens at every step, greedy or not.
void ExpectMatchesReference(const SamplingParams& params, const std::vector<int32_t>& prompt,
                            const std::vector<float>& logits, int steps) {
  Sampler sampler(params, prompt);
  Sampler plain(Params(params.temperature, params.top_p, params.top_k, params.seed));
  std::vector<int32_t> generated;
  for (int i = 0; i < steps; ++i) {
    std::vector<float> row = logits;
    const int32_t got = sampler.Sample(row);
    std::vector<float> want_row = ReferenceAdjust(params, prompt, generated, logits);
    ASSERT_EQ(got, plain.Sample(want_row)) << "step " << i;
    sampler.Accept(got);
    generated.push_back(got);
  }
}

TEST(SamplerApiTest, EverythingOffKeepsThePinnedSequences) {
  // The new fields at their "off" values, a prompt and accepted tokens: still run.c exactly.
  SamplingParams params = Params(1.0f, 0.9f, 0, 42);
  params.min_p = 0.0f;
  params.penalty_last_n = 64;
  params.banned_until_min = {2, 6};  // min_tokens 0: never banned
  const std::vector<int32_t> prompt = {1, 2, 2, 6, 4};
  Sampler sampler(params, prompt);
  std::vector<int32_t> out;
  for (int i = 0; i < 24; ++i) {
    std::vector<float> scratch = kLogits;
    out.push_back(sampler.Sample(scratch));
    sampler.Accept(out.back());
  }
  EXPECT_EQ(out, (std::vector<int32_t>{2, 4, 4, 0, 4, 4, 2, 6, 2, 6, 6, 2,
                                       4, 2, 2, 6, 2, 2, 0, 2, 6, 6, 2, 2}));
}

TEST(SamplerApiTest, PenaltiesAndBiasMatchTheReference) {
  std::mt19937 rng(2026);
  std::uniform_real_distribution<float> logit(-4.0f, 4.0f);
  std::uniform_int_distribution<int32_t> token(0, 15);
  for (int trial = 0; trial < 60; ++trial) {
    std::vector<float> logits(16);
    for (float& l : logits) l = logit(rng);
    std::vector<int32_t> prompt(size_t(token(rng)) + 1);
    for (int32_t& t : prompt) t = token(rng);
    SamplingParams p = Params(trial % 3 == 0 ? 0.0f : 0.9f, 0.95f, trial % 4 == 1 ? 5 : 0,
                              uint64_t(trial) + 1);
    p.presence_penalty = trial % 2 == 0 ? 0.7f : -0.3f;
    p.frequency_penalty = trial % 5 == 0 ? 0.0f : 0.4f;
    p.repetition_penalty = trial % 2 == 0 ? 1.7f : 0.8f;
    p.penalty_last_n = std::vector<int32_t>{-1, 0, 1, 4, 9}[trial % 5];
    p.logit_bias = {{token(rng), 2.5f}, {token(rng), -3.0f}};
    p.min_tokens = trial % 7;
    p.banned_until_min = {token(rng)};
    SCOPED_TRACE(testing::Message() << "trial " << trial);
    ExpectMatchesReference(p, prompt, logits, 30);
  }
}

// Greedy over logits {2.0, 1.9, 0, 0}: token 0 wins unless the penalty reaches it.
TEST(SamplerApiTest, RepetitionWindowSlides) {
  const std::vector<float> logits = {2.0f, 1.9f, 0.0f, 0.0f};
  SamplingParams p = Params(0.0f);
  p.repetition_penalty = 1.5f;
  p.penalty_last_n = 3;  // {2, 3, 3}: token 0 is out of the window
  std::vector<float> row = logits;
  EXPECT_EQ(Sampler(p, std::vector<int32_t>{0, 2, 3, 3}).Sample(row), 0);
  p.penalty_last_n = 4;  // {0, 2, 3, 3}: 2.0 / 1.5 < 1.9
  Sampler sampler(p, std::vector<int32_t>{0, 2, 3, 3});
  row = logits;
  EXPECT_EQ(sampler.Sample(row), 1);
  sampler.Accept(2);  // {2, 3, 3, 2}: token 0 has left
  row = logits;
  EXPECT_EQ(sampler.Sample(row), 0);
  sampler.Accept(0);  // {3, 3, 2, 0}
  row = logits;
  EXPECT_EQ(sampler.Sample(row), 1);
  p.penalty_last_n = 0;  // none
  row = logits;
  EXPECT_EQ(Sampler(p, std::vector<int32_t>{0, 0}).Sample(row), 0);
}

TEST(SamplerApiTest, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  SamplingParams p = Params(0.0f);
  p.repetition_penalty = 1.5f;
  const std::vector<int32_t> prompt = {0};
  std::vector<float> row = {1.2f, 1.0f};  // 1.2 / 1.5 = 0.8 < 1.0
  EXPECT_EQ(Sampler(p, prompt).Sample(row), 1);
  row = {-1.0f, -1.2f};  // -1.0 * 1.5 = -1.5 < -1.2
  EXPECT_EQ(Sampler(p, prompt).Sample(row), 1);
  p.repetition_penalty = 0.5f;  // below 1: repeats are favoured
  row = {1.0f, 1.2f};           // 2.0 > 1.2
  EXPECT_EQ(Sampler(p, prompt).Sample(row), 0);
  row = {-1.0f, -0.6f};  // -0.5 > -0.6
  EXPECT_EQ(Sampler(p, prompt).Sample(row), 0);
}

TEST(SamplerApiTest, FrequencyCountsRepeatsPresenceDoesNot) {
  const std::vector<float> logits = {3.0f, 2.5f, 0.0f};
  SamplingParams p = Params(0.0f);
  p.frequency_penalty = 0.3f;
  Sampler freq(p, std::vector<int32_t>{0, 0, 0});  // the prompt does not count
  std::vector<float> row = logits;
  EXPECT_EQ(freq.Sample(row), 0);
  freq.Accept(0);  // 3.0 - 0.3 > 2.5
  row = logits;
  EXPECT_EQ(freq.Sample(row), 0);
  freq.Accept(0);  // 3.0 - 0.6 < 2.5
  row = logits;
  EXPECT_EQ(freq.Sample(row), 1);

  p.frequency_penalty = 0.0f;
  p.presence_penalty = 0.4f;
  Sampler presence(p);
  presence.Accept(0);
  presence.Accept(0);
  presence.Accept(0);  // 3.0 - 0.4, however many times
  row = logits;
  EXPECT_EQ(presence.Sample(row), 0);
  p.presence_penalty = 0.6f;
  Sampler more(p);
  more.Accept(0);
  row = logits;
  EXPECT_EQ(more.Sample(row), 1);
}

TEST(SamplerApiTest, LogitBiasForcesAndBansUnderGreedy) {
  SamplingParams p = Params(0.0f);
  p.logit_bias = {{5, 100.0f}};  // the least likely token
  std::vector<float> row = kLogits;
  EXPECT_EQ(Sampler(p).Sample(row), 5);
  p.logit_bias = {{2, -100.0f}};  // the argmax: the next one (6) wins
  row = kLogits;
  EXPECT_EQ(Sampler(p).Sample(row), 6);
  p.logit_bias = {{5, 100.0f}, {5, -100.0f}};  // the last entry of an id wins
  row = kLogits;
  EXPECT_EQ(Sampler(p).Sample(row), 2);
  p.logit_bias = {{5, -100.0f}, {3, 0.0f}, {5, 100.0f}};
  row = kLogits;
  EXPECT_EQ(Sampler(p).Sample(row), 5);
  // Sampling too: +100 leaves the others e^-100 behind.
  p.temperature = 1.0f;
  p.top_p = 1.0f;
  for (int32_t t : SampleMany(p, kLogits, 200)) EXPECT_EQ(t, 5);
}

TEST(SamplerApiTest, MinPDropsTheUnlikelyAndRenormalises) {
  // Softmax at temperature 1: p2 = .397, p6 = .309, p4 = .146, ...: min_p 0.5 keeps 2 and 6.
  const std::vector<double> p = Softmax(kLogits, 1.0);
  ASSERT_GT(p[6], 0.5 * p[2]);
  ASSERT_LT(p[4], 0.5 * p[2]);
  std::vector<double> want(kLogits.size(), 0.0);
  want[2] = p[2] / (p[2] + p[6]);
  want[6] = p[6] / (p[2] + p[6]);
  SamplingParams params = Params(1.0f, 1.0f, 0, 21);
  params.min_p = 0.5f;
  ExpectNear(Frequencies(params, kLogits, 200000), want, 0.006);
  params.min_p = 1.0f;  // only the most likely
  for (int32_t t : SampleMany(params, kLogits, 200)) EXPECT_EQ(t, 2);
}

TEST(SamplerApiTest, MinTokensBansEndTokensUntilReached) {
  const std::vector<float> logits = {0.0f, 5.0f, 1.0f, 4.0f};  // 1 is EOS, 3 a stop token
  SamplingParams p = Params(0.0f);
  p.min_tokens = 3;
  p.banned_until_min = {1, 3};
  Sampler sampler(p);
  std::vector<int32_t> out;
  for (int i = 0; i < 5; ++i) {
    std::vector<float> row = logits;
    out.push_back(sampler.Sample(row));
    sampler.Accept(out.back());
  }
  EXPECT_EQ(out, (std::vector<int32_t>{2, 2, 2, 1, 1}));
  // A constraint that allows only the end: the ban gives way rather than leave nothing.
  Sampler masked(p);
  std::vector<float> row = {-kInf, 5.0f, -kInf, -kInf};
  EXPECT_EQ(masked.Sample(row), 1);
  p.temperature = 1.0f;
  Sampler masked_sampling(p);
  row = {-kInf, 5.0f, -kInf, -kInf};
  EXPECT_EQ(masked_sampling.Sample(row), 1);
}

}  // namespace
}  // namespace heavykv
