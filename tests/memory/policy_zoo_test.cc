// The policies added beside window/sink/h2o (tova, knorm, scissorhands, snapkv) against
// straightforward reference implementations written here, on hand-made inputs and on random ones,
// with the slots in shuffled order (as after compaction); and the policy specs
// ("name[:key=value]...") that select them.
//
// Semantics checked:
//   tova          evicts the lowest channel (the latest query's attention); nothing protected.
//   knorm         evicts the highest key norm (channel = -norm) except the newest token.
//   scissorhands  keeps floor(budget * recent_fraction) newest, then evicts the lowest count.
//   snapkv        in a prefill chunk keeps the min(window, budget) newest positions and evicts the
//                 lowest max-pooled channel among the others (pool over positions within
//                 kernel / 2, among those others only); in decode behaves as h2o or window.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/memory/policy_test_util.h"
#include "memory/eviction_policy.h"

namespace heavykv {
namespace {

using testing::Policy;
using testing::Positions;
using testing::Tokens;

// The victims' positions when `policy` evicts `tokens` down to `budget` in a step with `num_new`
// new tokens, over slots shuffled by `seed` (testing::ChooseShuffled checks the slots).
Positions Victims(const EvictionPolicy& policy, const Tokens& tokens, int32_t budget,
                  int32_t num_new, uint32_t seed) {
  return testing::ChooseShuffled(policy, tokens, budget, num_new, seed).victims;
}

// The reference: the `num_evict` lowest (key, position) pairs among positions <= last_pos.
Positions LowestKeys(const Tokens& tokens, int32_t last_pos, int32_t num_evict,
                     const std::map<int32_t, float>& key) {
  std::vector<std::pair<float, int32_t>> cand;
  for (const auto& [p, v] : tokens) {
    if (p <= last_pos) cand.push_back({key.at(p), p});
  }
  std::sort(cand.begin(), cand.end());
  Positions out;
  for (int32_t i = 0; i < num_evict && i < static_cast<int32_t>(cand.size()); ++i) {
    out.insert(cand[i].second);
  }
  return out;
}

std::map<int32_t, float> AsMap(const Tokens& tokens) {
  return std::map<int32_t, float>(tokens.begin(), tokens.end());
}

int32_t Newest(const Tokens& t) {
  int32_t n = INT32_MIN;
  for (const auto& [p, v] : t) n = std::max(n, p);
  return n;
}

// Distinct positions (gaps, as after evictions) with channel values drawn from a few levels
// (many ties) or from a wide range.
Tokens RandomTokens(std::mt19937& rng, int32_t n, bool ties, bool negative) {
  std::set<int32_t> ps;
  while (static_cast<int32_t>(ps.size()) < n) ps.insert(static_cast<int32_t>(rng() % (3 * n)));
  Tokens t;
  for (int32_t p : ps) {
    float v = ties ? float(rng() % 4) : float(rng() % 100000) / 997.0f;
    t.push_back({p, negative ? -v : v});
  }
  return t;
}

constexpr uint32_t kSeeds[] = {1, 2, 3, 4, 5};

TEST(TovaTest, EvictsTheLowestLastAttentionEvenTheNewest) {
  auto tova = Policy("tova");
  ASSERT_NE(tova, nullptr);
  EXPECT_EQ(tova->channel().kind, SlotChannel::kLast);
  const Tokens t = {{0, 0.30f}, {1, 0.05f}, {2, 0.20f}, {3, 0.05f}, {4, 0.40f}, {5, 0.01f}};
  for (uint32_t seed : kSeeds) {
    EXPECT_EQ(Victims(*tova, t, 5, 1, seed), (Positions{5}));  // the newest token itself
    EXPECT_EQ(Victims(*tova, t, 3, 1, seed), (Positions{1, 3, 5}));
    EXPECT_EQ(Victims(*tova, t, 4, 1, seed), (Positions{1, 5}));  // tie 1 vs 3: the older
  }
}

TEST(TovaTest, RandomMatchesReference) {
  auto tova = Policy("tova");
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const int32_t n = 2 + static_cast<int32_t>(rng() % 60);
    const int32_t budget = 1 + static_cast<int32_t>(rng() % (n - 1));
    const Tokens t = RandomTokens(rng, n, trial % 2 == 0, false);
    EXPECT_EQ(Victims(*tova, t, budget, 1 + trial % 3, trial),
              LowestKeys(t, Newest(t), n - budget, AsMap(t)))
        << "trial " << trial;
  }
}

TEST(KnormTest, EvictsTheHighestKeyNormButNeverTheNewest) {
  auto knorm = Policy("knorm");
  ASSERT_NE(knorm, nullptr);
  EXPECT_EQ(knorm->channel().kind, SlotChannel::kNegKeyNorm);
  EXPECT_FALSE(knorm->GpuRule(8).has_value());
  // Norms 3, 9, 1, 7, 20 (the newest has the largest).
  const Tokens t = {{10, -3.0f}, {11, -9.0f}, {12, -1.0f}, {13, -7.0f}, {14, -20.0f}};
  for (uint32_t seed : kSeeds) {
    EXPECT_EQ(Victims(*knorm, t, 4, 1, seed), (Positions{11}));
    EXPECT_EQ(Victims(*knorm, t, 2, 1, seed), (Positions{10, 11, 13}));
    EXPECT_EQ(Victims(*knorm, t, 1, 1, seed), (Positions{10, 11, 12, 13}));
  }
}

TEST(KnormTest, RandomMatchesReference) {
  auto knorm = Policy("knorm");
  std::mt19937 rng(12);
  for (int trial = 0; trial < 300; ++trial) {
    const int32_t n = 2 + static_cast<int32_t>(rng() % 60);
    const int32_t budget = 1 + static_cast<int32_t>(rng() % (n - 1));
    const Tokens t = RandomTokens(rng, n, trial % 2 == 0, true);
    EXPECT_EQ(Victims(*knorm, t, budget, 1, trial),
              LowestKeys(t, Newest(t) - 1, n - budget, AsMap(t)))
        << "trial " << trial;
  }
}

TEST(ScissorhandsTest, KeepsRecentThenTheMostPersistent) {
  auto sh = Policy("scissorhands", 0.5);
  ASSERT_NE(sh, nullptr);
  EXPECT_EQ(sh->channel().kind, SlotChannel::kAboveMeanCount);
  EXPECT_FLOAT_EQ(sh->channel().decay, 1.0f - 1.0f / 400.0f);  // the paper's history of 400
  EXPECT_FLOAT_EQ(Policy("scissorhands:history=10")->channel().decay, 0.9f);
  // budget 4: the 2 newest (8, 9) are kept whatever their counts; of 0..7 the 2 with the
  // highest counts (3 and 6) survive.
  const Tokens t = {{0, 1.0f}, {1, 2.0f}, {2, 0.0f}, {3, 9.0f}, {4, 2.0f},
                    {5, 1.5f}, {6, 7.0f}, {7, 0.5f}, {8, 0.0f}, {9, 0.0f}};
  for (uint32_t seed : kSeeds) {
    EXPECT_EQ(Victims(*sh, t, 4, 1, seed), (Positions{0, 1, 2, 4, 5, 7}));
    EXPECT_EQ(Victims(*sh, Tokens(t.begin(), t.begin() + 5), 4, 1, seed), (Positions{2}));
  }
}

TEST(ScissorhandsTest, RandomMatchesReference) {
  std::mt19937 rng(13);
  for (double rf : {0.1, 0.5, 1.0}) {
    auto sh = Policy("scissorhands", rf);
    for (int trial = 0; trial < 200; ++trial) {
      const int32_t n = 2 + static_cast<int32_t>(rng() % 60);
      const int32_t budget = 1 + static_cast<int32_t>(rng() % (n - 1));
      // Contiguous newest positions, as the recent ones always are.
      Tokens t = RandomTokens(rng, n, trial % 2 == 0, false);
      const int32_t recent = static_cast<int32_t>(std::floor(budget * rf));
      const int32_t top = Newest(t);
      for (int32_t i = 0; i < recent; ++i) t.push_back({top + 1 + i, float(rng() % 3)});
      const int32_t held = static_cast<int32_t>(t.size());
      const int32_t b = budget + recent;  // keep held - b victims possible
      if (b >= held) continue;
      const int32_t protect = static_cast<int32_t>(std::floor(b * rf));
      EXPECT_EQ(Victims(*sh, t, b, 1, trial),
                LowestKeys(t, Newest(t) - protect, held - b, AsMap(t)))
          << "rf " << rf << " trial " << trial;
    }
  }
}

// SnapKV's prefill choice, directly: window kept, the others ranked by max-pooled channel.
Positions SnapKvReference(const Tokens& tokens, int32_t budget, int32_t window, int32_t kernel) {
  const int32_t protect = std::min(window, budget);
  const int32_t last_pos = Newest(tokens) - protect;
  std::map<int32_t, float> pooled;
  for (const auto& [p, v] : tokens) {
    if (p > last_pos) continue;
    float best = -INFINITY;
    for (const auto& [q, w] : tokens) {
      if (q <= last_pos && std::abs(q - p) <= kernel / 2) best = std::max(best, w);
    }
    pooled[p] = best;
  }
  for (const auto& [p, v] : tokens) {
    if (p > last_pos) pooled[p] = 0.0f;
  }
  return LowestKeys(tokens, last_pos, static_cast<int32_t>(tokens.size()) - budget, pooled);
}

TEST(SnapKvTest, PrefillKeepsTheWindowAndPooledNeighbours) {
  auto snap = Policy("snapkv:window=2:kernel=3");
  ASSERT_NE(snap, nullptr);
  EXPECT_EQ(snap->channel().kind, SlotChannel::kObservationWindow);
  EXPECT_EQ(snap->channel().window, 2);
  // Positions 0..9, a chunk of 10 new tokens; 8 and 9 are the observation window. Token 3 has
  // the peak: pooled over +-1, tokens 2, 3, 4 all rank 5.0; then 7 (pooled 1.0 from 7, with 6).
  const Tokens t = {{0, 0.1f}, {1, 0.0f}, {2, 0.0f}, {3, 5.0f}, {4, 0.0f},
                    {5, 0.0f}, {6, 0.0f}, {7, 1.0f}, {8, 0.0f}, {9, 0.0f}};
  for (uint32_t seed : kSeeds) {
    // budget 5: the window (8, 9) and 2, 3, 4.
    EXPECT_EQ(Victims(*snap, t, 5, 10, seed), (Positions{0, 1, 5, 6, 7}));
    // budget 7: 6 and 7 (pooled 1.0) stay too; 5 (0), then 0 and 1 (0.1) go.
    EXPECT_EQ(Victims(*snap, t, 7, 10, seed), (Positions{0, 1, 5}));
  }
  // Without pooling (kernel 1) only the peaks survive beside the window.
  auto plain = Policy("snapkv:window=2:kernel=1");
  EXPECT_EQ(Victims(*plain, t, 4, 10, 1), (Positions{1, 2, 4, 5, 6, 0}));
}

TEST(SnapKvTest, PrefillRandomMatchesReference) {
  std::mt19937 rng(14);
  for (int32_t window : {1, 4, 32}) {
    for (int32_t kernel : {1, 3, 7}) {
      auto snap = Policy(absl::StrCat("snapkv:window=", window, ":kernel=", kernel));
      for (int trial = 0; trial < 60; ++trial) {
        const int32_t n = 2 + static_cast<int32_t>(rng() % 80);
        const int32_t budget = 1 + static_cast<int32_t>(rng() % (n - 1));
        const Tokens t = RandomTokens(rng, n, trial % 2 == 0, false);
        EXPECT_EQ(Victims(*snap, t, budget, 2 + trial % 50, trial),
                  SnapKvReference(t, budget, window, kernel))
            << "window " << window << " kernel " << kernel << " trial " << trial;
      }
    }
  }
}

TEST(SnapKvTest, DecodeIsH2oOrWindow) {
  const Tokens t = {{0, 3.0f}, {1, 0.5f}, {2, 0.2f}, {3, 4.0f}, {4, 0.0f}, {5, 0.0f}};
  auto as_h2o = Policy("snapkv", 0.5);
  auto h2o = Policy("h2o", 0.5);
  auto as_window = Policy("snapkv:decode=window");
  auto window = Policy("window");
  for (uint32_t seed : kSeeds) {
    for (int32_t budget : {1, 2, 4, 5}) {
      EXPECT_EQ(Victims(*as_h2o, t, budget, 1, seed), Victims(*h2o, t, budget, 1, seed));
      EXPECT_EQ(Victims(*as_window, t, budget, 1, seed), Victims(*window, t, budget, 1, seed));
    }
    EXPECT_EQ(Victims(*as_h2o, t, 5, 1, seed), (Positions{2}));
  }
  EXPECT_EQ(as_h2o->Rule(10).kind, VictimRule::kLowestChannel);
  EXPECT_EQ(as_h2o->Rule(10).param, 5);
  EXPECT_EQ(as_window->Rule(10).kind, VictimRule::kOldest);
  EXPECT_FALSE(as_h2o->GpuRule(10).has_value());  // its prefill choice is no order
}

TEST(PolicySpecTest, ParametersAndErrors) {
  for (const char* ok : {"full", "window", "sink", "h2o", "tova", "knorm", "scissorhands",
                         "scissorhands:history=1", "snapkv", "snapkv:window=32:kernel=7:decode=h2o",
                         "snapkv:decode=window", "snapkv:kernel=1"}) {
    EXPECT_TRUE(ValidPolicySpec(ok)) << ok;
  }
  for (const char* bad : {"tova:window=3", "h2o:x=1", "snapkv:kernel=4", "snapkv:kernel=0",
                          "snapkv:window=0", "snapkv:window=x", "snapkv:decode=sink",
                          "snapkv:foo=1", "scissorhands:history=0", "scissorhands:history",
                          "snapkv:", "bogus:window=1", "SNAPKV"}) {
    std::string error;
    EXPECT_FALSE(ValidPolicySpec(bad, &error)) << bad;
    EXPECT_FALSE(error.empty()) << bad;
    EXPECT_EQ(MakePolicy(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  std::string error;
  ValidPolicySpec("snapkv:kernel=4", &error);
  EXPECT_NE(error.find("odd"), std::string::npos) << error;
  ValidPolicySpec("snapkv:foo=1", &error);
  EXPECT_NE(error.find("foo"), std::string::npos) << error;
  EXPECT_EQ(Policy("snapkv:window=5")->name(), "snapkv");
  EXPECT_EQ(Policy("snapkv:window=5")->channel().window, 5);
  // recent=F overrides recent_fraction, for the policies that protect recent tokens (issue 42).
  EXPECT_EQ(Policy("h2o:recent=0.9")->Rule(100).param, 90);
  EXPECT_EQ(Policy("h2o:recent=0.25", 0.9)->Rule(100).param, 25);
  EXPECT_EQ(Policy("scissorhands:recent=0.1:history=5")->Rule(100).param, 10);
  EXPECT_EQ(Policy("snapkv:decode=h2o:recent=0.75")->Rule(100).param, 75);
  EXPECT_EQ(Policy("h2o:recent=1:granularity=page")->Rule(64).param, 64);
  EXPECT_TRUE(MakePolicy("h2o:recent=0.5", 0.0).ok());  // the spec's fraction is the one used
  for (const char* bad : {"h2o:recent=0", "h2o:recent=1.5", "h2o:recent=x", "h2o:recent=",
                          "h2o:recent=0.5:recent=0.6", "window:recent=0.5", "tova:recent=0.5",
                          "full:recent=0.5"}) {
    EXPECT_EQ(MakePolicy(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  // recent_fraction is checked where it is used.
  EXPECT_FALSE(MakePolicy("scissorhands", 0.0).ok());
  EXPECT_FALSE(MakePolicy("snapkv", 1.5).ok());
  EXPECT_TRUE(MakePolicy("tova", 0.0).ok());
}

}  // namespace
}  // namespace heavykv
