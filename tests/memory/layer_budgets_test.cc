// Layer budgets (memory/layer_budgets.h): the pyramid and squeeze splits, the spec key and where
// they are refused, a KvCache with a block table per layer holding and freeing each layer's own
// pages, SetLayerBudgets evicting down at once, squeeze's measurement deciding once a sequence
// fills its budget, and the model runner measuring the layers, end to end on the bundled model.
#include "memory/layer_budgets.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <set>
#include <vector>

#include "engine/runner/model_runner.h"
#include "engine/serving/generator.h"
#include "kernels/cpu/gemm.h"
#include "memory/eviction_policy.h"
#include "memory/kv_cache.h"
#include "tests/test_util.h"

namespace heavykv {
namespace {

int64_t Sum(const std::vector<int32_t>& v) { return std::accumulate(v.begin(), v.end(), 0LL); }

TEST(LayerBudgetsTest, RoundBudgetsKeepsTheTotalAndOneTokenEach) {
  const std::vector<double> targets = {10.4, 0.2, 3.3, 7.9, 0.0};
  for (int64_t total : {5, 6, 22, 23, 100}) {
    const std::vector<int32_t> b = RoundBudgets(targets, total);
    ASSERT_EQ(b.size(), targets.size());
    EXPECT_EQ(Sum(b), total);
    for (int32_t x : b) EXPECT_GE(x, 1);
  }
  // Targets that already sum to the total (each above 1) come out within one of themselves.
  const std::vector<int32_t> b = RoundBudgets(std::vector<double>{2.5, 2.5, 5.0}, 10);
  EXPECT_EQ(b, (std::vector<int32_t>{3, 2, 5}));  // the tie goes to the lower layer
}

TEST(LayerBudgetsTest, PyramidFallsLinearlyAndKeepsTheTotal) {
  const std::vector<int32_t> b = PyramidBudgets(100, 12);
  ASSERT_EQ(b.size(), 12u);
  EXPECT_EQ(Sum(b), 1200);
  EXPECT_EQ(b.back(), 5);    // budget / beta
  EXPECT_EQ(b.front(), 195);  // 2 x budget - budget / beta
  for (size_t l = 1; l < b.size(); ++l) {
    EXPECT_LE(b[l], b[l - 1]);
    EXPECT_NEAR(b[l - 1] - b[l], 190.0 / 11, 1.0);  // evenly spaced, up to rounding
  }
  EXPECT_EQ(PyramidBudgets(7, 1), std::vector<int32_t>{7});
  EXPECT_EQ(PyramidBudgets(1, 4), std::vector<int32_t>(4, 1));  // nothing to move
  for (int32_t budget : {2, 3, 17, 51}) {
    const std::vector<int32_t> small = PyramidBudgets(budget, 5);
    EXPECT_EQ(Sum(small), 5 * budget);
    EXPECT_GE(*std::min_element(small.begin(), small.end()), 1);
  }
}

TEST(LayerBudgetsTest, SqueezeShrinksTheLayersAttentionChangesLeast) {
  // Three clear groups; the two layers whose hidden state attention barely changes (cosine
  // 0.95) keep 0.3 x budget, the others share the rest evenly.
  const std::vector<double> sim = {0.5, 0.95, 0.2, 0.94, 0.52, 0.21};
  const std::vector<int32_t> b = SqueezeBudgets(100, sim);
  ASSERT_EQ(b.size(), 6u);
  EXPECT_EQ(Sum(b), 600);
  EXPECT_EQ(b[1], 30);
  EXPECT_EQ(b[3], 30);
  for (int l : {0, 2, 4, 5}) EXPECT_EQ(b[l], 135) << l;  // (600 - 60) / 4
  // No spread, nothing to cluster: uniform.
  EXPECT_EQ(SqueezeBudgets(40, std::vector<double>(5, 0.7)), std::vector<int32_t>(5, 40));
  // Two distinct values: the higher group shrinks.
  const std::vector<int32_t> two = SqueezeBudgets(10, std::vector<double>{0.1, 0.9});
  EXPECT_EQ(two, (std::vector<int32_t>{17, 3}));
  EXPECT_TRUE(LayerBudgetsBeforeRun(LayerBudgets::kSqueeze, 10, 4).empty());
  EXPECT_EQ(LayerBudgetsBeforeRun(LayerBudgets::kUniform, 10, 3), std::vector<int32_t>(3, 10));
  EXPECT_TRUE(LayerBudgetsBeforeRun(LayerBudgets::kPyramid, kUnboundedBudget, 3).empty());
}

TEST(LayerBudgetsTest, SpecKeyDefaultAndWhereItIsRefused) {
  auto p = *MakePolicy("h2o:layers=pyramid");
  EXPECT_EQ(p->layer_budgets(), LayerBudgets::kPyramid);
  EXPECT_EQ((*MakePolicy("h2o", 0.5, EvictGranularity::kToken, LayerBudgets::kSqueeze))
                ->layer_budgets(),
            LayerBudgets::kSqueeze);
  EXPECT_EQ((*MakePolicy("window:layers=uniform", 0.5, EvictGranularity::kToken,
                         LayerBudgets::kSqueeze))
                ->layer_budgets(),
            LayerBudgets::kUniform);
  auto both = *MakePolicy("snapkv:window=8:layers=squeeze:granularity=page");
  EXPECT_EQ(both->layer_budgets(), LayerBudgets::kSqueeze);
  EXPECT_TRUE(both->page_granularity());
  for (const char* bad : {"h2o:layers=cone", "h2o:layers=pyramid:layers=squeeze",
                          "full:layers=pyramid", "h2o:layers="}) {
    EXPECT_EQ(MakePolicy(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(SpecWithDefaults("h2o", EvictGranularity::kPage, LayerBudgets::kPyramid),
            "h2o:granularity=page:layers=pyramid");
  EXPECT_EQ(SpecWithDefaults("h2o:layers=uniform", EvictGranularity::kToken,
                             LayerBudgets::kPyramid),
            "h2o:layers=uniform");
  EXPECT_EQ(SpecWithDefaults("full", EvictGranularity::kPage, LayerBudgets::kSqueeze), "full");
  // The GPU pool has one table for all layers, and endless streaming's arithmetic assumes every
  // layer keeps the same recent tokens.
  EXPECT_FALSE(p->GpuRule(16).has_value());
  EXPECT_TRUE((*MakePolicy("h2o"))->GpuRule(16).has_value());
  EXPECT_FALSE((*MakePolicy("sink:layers=pyramid"))->PinnedPrefix(16).has_value());
  // And a one-table (CUDA-layout) cache refuses them at the first Reserve.
  auto one_table = *KvCache::Create(KvShape{2, 1, 4, 4}, 8);
  SequenceKv kv;
  kv.policy = p.get();
  kv.budget = 4;
  EXPECT_EQ(one_table->Reserve(kv, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(one_table->allocator().num_pages_used(), 0);
}

KvShape PerLayerShape(int32_t layers) {
  KvShape s{layers, 2, 4, 4};
  s.table_per_layer = true;
  return s;
}

// Decode steps of a window sequence with pyramid budgets, driven as the runner drives a cache:
// each layer keeps its own budget's newest tokens on its own pages, and the pool holds exactly
// the sum of the layers' pages (what admission counts).
TEST(LayerBudgetsTest, EachLayerHoldsAndFreesItsOwnPages) {
  const KvShape shape = PerLayerShape(4);
  auto window = *MakePolicy("window:layers=pyramid");
  constexpr int32_t kBudget = 10, kLength = 60;
  const std::vector<int32_t> budgets = PyramidBudgets(kBudget, 4);
  ASSERT_EQ(budgets, (std::vector<int32_t>{19, 13, 7, 1}));
  const int64_t peak = PeakPages(shape, window.get(), kBudget, kLength);
  EXPECT_EQ(peak, 5 + 4 + 2 + 1);  // ceil((b_l + 1) / 4)
  auto cache = *KvCache::Create(shape, static_cast<int32_t>(peak));  // exactly the peak
  SequenceKv kv;
  kv.policy = window.get();
  kv.budget = kBudget;
  for (int32_t pos = 0; pos < kLength; ++pos) {
    ASSERT_TRUE(cache->Reserve(kv, 1).ok()) << "at " << pos;
    ASSERT_EQ(kv.layer_budgets, budgets);
    for (int32_t l = 0; l < 4; ++l) {
      for (int32_t h = 0; h < 2; ++h) {
        PagedKvHead v = cache->View(kv, l, h, kv.Slots(l) + 1);
        v.Pos(kv.Slots(l)) = pos;
        cache->EvictHead(kv, l, h, kv.Slots(l) + 1, pos);
      }
    }
    cache->CommitStep(kv, 1);
    int64_t pages = 0;
    for (int32_t l = 0; l < 4; ++l) {
      const int32_t want = std::min(pos + 1, budgets[l]);
      ASSERT_EQ(kv.Slots(l), want) << "layer " << l << " at " << pos;
      ASSERT_EQ(kv.Table(l).pages.size(), static_cast<size_t>((want + 3) / 4));
      pages += (want + 3) / 4;
      std::set<int32_t> kept;
      PagedKvHead v = cache->View(kv, l, 1, kv.Slots(l));
      for (int32_t s = 0; s < kv.Slots(l); ++s) kept.insert(v.Pos(s));
      ASSERT_EQ(static_cast<int32_t>(kept.size()), want);
      ASSERT_EQ(*kept.begin(), pos + 1 - want);  // the newest b_l positions
    }
    ASSERT_EQ(kv.NumPages(), pages);
    ASSERT_EQ(cache->allocator().num_pages_used(), pages);
  }
  EXPECT_EQ(kv.peak_pages, peak);
  // 60 positions, 40 kept in all layers together: 200 evicted over 4 layers, 50 per layer.
  EXPECT_EQ(kv.layer_tokens_evicted, 4 * kLength - 40);
  EXPECT_EQ(kv.tokens_evicted, (4 * kLength - 40) / 4);
  EXPECT_EQ(kv.MeanSlots(), 10);
  cache->Release(kv);
  EXPECT_TRUE(kv.layer_budgets.empty());
  EXPECT_EQ(cache->allocator().num_pages_used(), 0);
  // The same total under uniform budgets takes 4 x ceil(11 / 4) = 12 pages too: pyramid moves
  // memory between layers, it does not add any.
  EXPECT_EQ(PeakPages(shape, (*MakePolicy("window")).get(), kBudget, kLength), 12);
}

// Squeeze: budgets set after the first step evict a layer down at once and free its pages; the
// admission bound covers any split.
TEST(LayerBudgetsTest, SetLayerBudgetsEvictsDownAndFreesPages) {
  const KvShape shape = PerLayerShape(3);
  auto h2o = *MakePolicy("h2o:layers=squeeze", 0.25);
  constexpr int32_t kBudget = 12;
  auto cache = *KvCache::Create(shape, 64);
  SequenceKv kv;
  kv.policy = h2o.get();
  kv.budget = kBudget;
  ASSERT_TRUE(cache->Reserve(kv, 12).ok());
  EXPECT_TRUE(kv.layer_budgets.empty());  // not measured yet: uniform
  for (int32_t l = 0; l < 3; ++l) {
    for (int32_t h = 0; h < 2; ++h) {
      PagedKvHead v = cache->View(kv, l, h, 12);
      for (int32_t s = 0; s < 12; ++s) {
        v.Pos(s) = s;
        v.Score(s) = static_cast<float>((s * 5 + h) % 12);  // a different order per head
      }
    }
  }
  cache->CommitStep(kv, 12);
  EXPECT_EQ(kv.NumPages(), 9);
  cache->SetLayerBudgets(kv, {2, 17, 17}, /*newest_pos=*/11);
  EXPECT_TRUE(kv.layers_measured);
  EXPECT_EQ(kv.Slots(0), 2);
  EXPECT_EQ(kv.Slots(1), 12);
  EXPECT_EQ(kv.Table(0).pages.size(), 1u);
  EXPECT_EQ(kv.NumPages(), 7);
  EXPECT_EQ(cache->allocator().num_pages_used(), 7);
  EXPECT_EQ(kv.layer_tokens_evicted, 10);
  // Layer 0 kept per head the newest (recent: floor(2 x 0.25) = 0) ... the highest scores.
  for (int32_t h = 0; h < 2; ++h) {
    PagedKvHead v = cache->View(kv, 0, h, 2);
    std::set<float> scores = {v.Score(0), v.Score(1)};
    EXPECT_EQ(scores, (std::set<float>{10.0f, 11.0f})) << "head " << h;
  }
  for (const std::vector<int32_t>& split :
       {std::vector<int32_t>{1, 1, 34}, {12, 12, 12}, {5, 14, 17}, {34, 1, 1}}) {
    int64_t pages = 0;
    for (int32_t b : split) pages += (b + 1 + 3) / 4;
    EXPECT_LE(pages, PeakPages(shape, h2o.get(), kBudget, 1000));
  }
  cache->Release(kv);
  EXPECT_FALSE(kv.layers_measured);
  EXPECT_EQ(cache->allocator().num_pages_used(), 0);
}

// Squeeze's measurement: summed over steps, averaged, and turned into budgets by the step after
// which a layer holds the whole budget.
TEST(LayerBudgetsTest, SqueezeDecidesOnceTheBudgetIsFull) {
  const KvShape shape = PerLayerShape(3);
  auto h2o = *MakePolicy("h2o:layers=squeeze");
  auto cache = *KvCache::Create(shape, 16);
  SequenceKv kv;
  kv.policy = h2o.get();
  kv.budget = 4;
  ASSERT_TRUE(cache->Reserve(kv, 2).ok());
  cache->CommitStep(kv, 2);
  cache->AddLayerSimilarity(kv, std::vector<double>{0.2, 1.8, 0.4}, 2, 1);
  EXPECT_FALSE(kv.layers_measured);
  EXPECT_TRUE(kv.layer_budgets.empty());
  ASSERT_TRUE(cache->Reserve(kv, 2).ok());
  cache->CommitStep(kv, 2);  // 4 held: the next step would evict
  cache->AddLayerSimilarity(kv, std::vector<double>{0.2, 0.0, 0.4}, 2, 3);
  EXPECT_TRUE(kv.layers_measured);
  EXPECT_EQ(kv.similarity_tokens, 4);
  // Means 0.1, 0.45, 0.2: layer 1 changed least and keeps 0.3 x 4; the others share the rest.
  EXPECT_EQ(kv.layer_budgets, SqueezeBudgets(4, std::vector<double>{0.1, 0.45, 0.2}));
  EXPECT_EQ(kv.layer_budgets, (std::vector<int32_t>{6, 1, 5}));
  EXPECT_EQ(kv.Slots(1), 1);  // evicted down at once
  EXPECT_EQ(kv.Slots(0), 4);
  // Further measurements change nothing.
  cache->AddLayerSimilarity(kv, std::vector<double>{9, 9, 0}, 1, 4);
  EXPECT_EQ(kv.layer_budgets, (std::vector<int32_t>{6, 1, 5}));
  cache->Release(kv);
  EXPECT_TRUE(kv.layer_similarity.empty());
  EXPECT_EQ(kv.similarity_tokens, 0);
}

// End to end on the bundled model: pyramid holds each layer to its budget; squeeze measures the
// layers until the sequence fills its budget and then does the same with its own split. Both keep
// L x budget tokens per kv head and run the same number of positions as uniform.
TEST(LayerBudgetsTest, GenerateKeepsEachLayerToItsBudget) {
  cpu::SetNumThreads(1);
  const Model model = *LoadModel(testing::ModelPath());
  const int32_t L = model.config.num_layers;
  constexpr int32_t kBudget = 32;
  for (const char* spec : {"h2o:layers=pyramid", "h2o:layers=squeeze", "window:layers=squeeze",
                           "tova:layers=pyramid:granularity=page"}) {
    SCOPED_TRACE(spec);
    auto policy = *MakePolicy(spec);
    auto cache = *KvCache::Create(KvShapeFor(model.config, 16), 64 * L);
    ModelRunner runner(model, cache.get());
    SequenceKv kv;
    kv.policy = policy.get();
    kv.budget = kBudget;
    std::vector<int32_t> tokens = {1, 403, 407, 259, 300, 301, 302, 303};
    int32_t pos = 0;
    while (pos < 160) {  // the prompt in one step, then greedy decode steps
      const int32_t n = pos == 0 ? static_cast<int32_t>(tokens.size()) : 1;
      SequenceStep step{&kv, std::span<const int32_t>(tokens).subspan(pos, n), pos, false};
      auto logits = runner.Forward({&step, 1});
      ASSERT_TRUE(logits.ok()) << logits.status();
      pos += n;
      const float* row = logits->data();
      tokens.push_back(static_cast<int32_t>(std::max_element(row, row + 512) - row));
      if (policy->layer_budgets() == LayerBudgets::kSqueeze) {
        // Measured over the tokens the uniform budget holds in full: set by the step that fills
        // it (the prompt, then 24 decode steps), uniform until then.
        ASSERT_EQ(kv.layers_measured, pos >= kBudget) << "at " << pos;
        ASSERT_EQ(kv.similarity_tokens, std::min(pos, kBudget));
        if (pos < kBudget) {
          ASSERT_TRUE(kv.layer_budgets.empty());
          continue;
        }
      }
      ASSERT_EQ(static_cast<int32_t>(kv.layer_budgets.size()), L);
      EXPECT_EQ(Sum(kv.layer_budgets), int64_t(L) * kBudget);
      for (int32_t l = 0; l < L; ++l) {
        ASSERT_LE(kv.Slots(l), kv.LayerBudget(l) + (policy->page_granularity() ? 15 : 0));
      }
      ASSERT_LE(kv.NumPages(), PeakPages(cache->shape(), policy.get(), kBudget, 100000));
    }
    EXPECT_EQ(cache->allocator().num_pages_used(), kv.NumPages());
    const auto [lo, hi] = std::minmax_element(kv.layer_budgets.begin(), kv.layer_budgets.end());
    EXPECT_LT(*lo, *hi) << "the layers got one budget";
    if (policy->layer_budgets() == LayerBudgets::kSqueeze) {
      EXPECT_TRUE(kv.layers_measured);
      // Two groups: the least changed layers at 0.3 x 32 = 9.6, the others sharing the rest
      // (each group rounded to integers that keep the total).
      EXPECT_TRUE(*lo == 9 || *lo == 10) << *lo;
      for (int32_t b : kv.layer_budgets) EXPECT_TRUE(b == 9 || b == 10 || *hi - b <= 1) << b;
    } else {
      EXPECT_EQ(kv.layer_budgets, PyramidBudgets(kBudget, L));
    }
    cache->Release(kv);
    EXPECT_EQ(cache->allocator().num_pages_used(), 0);
  }
}

}  // namespace
}  // namespace heavykv
