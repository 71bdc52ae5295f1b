// Sampler tests. Pinned RNG outputs and token sequences come from an independent Python
// re-implementation of llama2.c run.c (random_u32 masked to 64 bits, sample(), sample_topp()),
// not from this code.
#include "engine/serving/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace heavykv {
namespace {

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
  SamplingParams params{.temperature = 0.0f, .top_p = 0.9f, .top_k = 0, .seed = 42};
  for (int32_t t : SampleMany(params, kLogits, 50)) EXPECT_EQ(t, 2);
  const std::vector<float> ties = {0.0f, 5.0f, -1.0f, 5.0f};
  for (int32_t t : SampleMany(params, ties, 10)) EXPECT_EQ(t, 1);
}

// With 2^24 equal logits every probability is exactly 2^-24 and every partial CDF is exact, so
// sample_mult returns exactly floor(coin * 2^24) = random_u32() >> 8: the sampled ids expose the
// RNG stream (all 24 bits that random_f32 uses).
std::vector<int32_t> ObserveRandomU32Shr8(uint64_t seed, int n) {
  Sampler sampler({.temperature = 1.0f, .top_p = 1.0f, .top_k = 0, .seed = seed});
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
  EXPECT_EQ(SampleMany({.temperature = 1.0f, .top_p = 0.9f, .top_k = 0, .seed = 42}, kLogits, 24),
            (std::vector<int32_t>{2, 4, 4, 0, 4, 4, 2, 6, 2, 6, 6, 2,
                                  4, 2, 2, 6, 2, 2, 0, 2, 6, 6, 2, 2}));
  // Plain multinomial path (top_p = 1 disables nucleus sampling) at another temperature.
  EXPECT_EQ(SampleMany({.temperature = 0.8f, .top_p = 1.0f, .top_k = 0, .seed = 42}, kLogits, 24),
            (std::vector<int32_t>{2, 6, 6, 6, 6, 6, 2, 2, 2, 6, 2, 2,
                                  6, 2, 1, 4, 2, 2, 7, 2, 2, 6, 2, 2}));
  // top-k then top-p.
  EXPECT_EQ(
      SampleMany({.temperature = 1.3f, .top_p = 0.95f, .top_k = 3, .seed = 1234}, kLogits, 24),
      (std::vector<int32_t>{6, 2, 2, 2, 4, 2, 6, 2, 2, 6, 2, 6,
                            2, 4, 6, 4, 4, 4, 2, 2, 2, 2, 6, 2}));
}

TEST(SamplerTest, SameSeedSameSequenceDifferentSeedDifferent) {
  std::vector<float> logits(32);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(static_cast<float>(i)) * 2.0f;
  const SamplingParams a{.temperature = 1.0f, .top_p = 0.95f, .top_k = 0, .seed = 7};
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
      SamplingParams params{.temperature = temperature, .top_p = top_p, .top_k = 1, .seed = 3};
      for (int32_t t : SampleMany(params, kLogits, 200)) EXPECT_EQ(t, 2);
      for (int32_t t : SampleMany(params, ties, 200)) EXPECT_EQ(t, 1);
    }
  }
}

TEST(SamplerTest, SmallTopPSamplesOnlyTheTopToken) {
  // The top token alone (p ~ 0.40 at temperature 1) already exceeds top_p.
  SamplingParams params{.temperature = 1.0f, .top_p = 0.1f, .top_k = 0, .seed = 99};
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
      Frequencies({.temperature = 1.0f, .top_p = 1.0f, .top_k = 0, .seed = 5}, kLogits, kSamples),
      Softmax(kLogits, 1.0), 0.006);
  ExpectNear(
      Frequencies({.temperature = 0.5f, .top_p = 0.0f, .top_k = 0, .seed = 6}, kLogits, kSamples),
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
      Frequencies({.temperature = 1.0f, .top_p = 1.0f, .top_k = 3, .seed = 11}, kLogits, 200000),
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
      Frequencies({.temperature = 1.0f, .top_p = 0.8f, .top_k = 0, .seed = 12}, kLogits, 200000),
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

}  // namespace
}  // namespace heavykv
