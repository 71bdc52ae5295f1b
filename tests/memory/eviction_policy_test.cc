// Eviction policy tests: the exact kept set of window, sink and h2o on scripted patterns, with
// slots in shuffled order (as after compaction), plus MakePolicy and KvBudget parsing.
//
// Semantics checked (the papers'):
//   window  keeps the `budget` most recent positions.
//   sink    (StreamingLLM) keeps positions 0..3 plus the budget-4 most recent ones.
//   h2o     never evicts the floor(budget * recent_fraction) most recent tokens; among the others
//           evicts the lowest accumulated score first, ties going to the older position.
#include "memory/eviction_policy.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "tests/memory/policy_test_util.h"

namespace heavykv {
namespace {

using testing::Choice;
using testing::Policy;
using testing::Positions;

// The policy's choice down to `budget` in a decode step, over slots shuffled by `seed`.
Choice Choose(const EvictionPolicy& policy, const std::vector<std::pair<int32_t, float>>& tokens,
              int32_t budget, uint32_t seed) {
  return testing::ChooseShuffled(policy, tokens, budget, /*num_new=*/1, seed);
}

// Tokens at positions [first, last] with score 0.
std::vector<std::pair<int32_t, float>> Range(int32_t first, int32_t last) {
  std::vector<std::pair<int32_t, float>> t;
  for (int32_t p = first; p <= last; ++p) t.push_back({p, 0.0f});
  return t;
}

Positions PosRange(int32_t first, int32_t last) {
  Positions s;
  for (int32_t p = first; p <= last; ++p) s.insert(p);
  return s;
}

Positions Union(Positions a, const Positions& b) {
  a.insert(b.begin(), b.end());
  return a;
}

constexpr uint32_t kShuffleSeeds[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};

TEST(EvictionPolicyTest, NamesAndScoreNeeds) {
  for (absl::string_view name : kPolicyNames) {
    if (name == "full") continue;  // no policy: see FullIsNoPolicy
    std::unique_ptr<EvictionPolicy> p = Policy(name);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p->name(), name);
    EXPECT_EQ(p->needs_scores(), name != "window" && name != "sink") << name;
  }
}

TEST(EvictionPolicyTest, WindowKeepsMostRecentBudget) {
  std::unique_ptr<EvictionPolicy> window = Policy("window");
  ASSERT_NE(window, nullptr);
  for (int32_t n : {2, 5, 9, 17, 40}) {
    for (int32_t budget = 1; budget < n; ++budget) {
      for (uint32_t seed : kShuffleSeeds) {
        SCOPED_TRACE(::testing::Message() << "n=" << n << " budget=" << budget << " seed=" << seed);
        Choice c = Choose(*window, Range(0, n - 1), budget, seed);
        EXPECT_EQ(c.kept, PosRange(n - budget, n - 1));
        EXPECT_EQ(c.victims, PosRange(0, n - budget - 1));
      }
    }
  }
}

TEST(EvictionPolicyTest, WindowIgnoresScoresAndGaps) {
  std::unique_ptr<EvictionPolicy> window = Policy("window");
  ASSERT_NE(window, nullptr);
  // Positions with gaps, older tokens carrying large scores: only recency counts.
  std::vector<std::pair<int32_t, float>> t = {{3, 100.0f}, {7, 50.0f}, {8, 0.0f}, {20, 9.0f},
                                              {21, 0.0f},  {30, 1.0f}, {31, 0.0f}};
  for (uint32_t seed : kShuffleSeeds) {
    Choice c = Choose(*window, t, 3, seed);
    EXPECT_EQ(c.kept, (Positions{21, 30, 31}));
    c = Choose(*window, t, 6, seed);  // single victim (the decode case)
    EXPECT_EQ(c.victims, (Positions{3}));
  }
}

TEST(EvictionPolicyTest, FullIsNoPolicy) {
  absl::StatusOr<std::unique_ptr<EvictionPolicy>> full = MakePolicy("full");
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(*full, nullptr);
  EXPECT_TRUE(IsFullPolicy("full"));
  EXPECT_FALSE(MakePolicy("full:window=3").ok());
}

TEST(EvictionPolicyTest, SinkKeepsFirstFourPlusMostRecent) {
  std::unique_ptr<EvictionPolicy> sink = Policy("sink");
  ASSERT_NE(sink, nullptr);
  for (int32_t n : {6, 9, 17, 40}) {
    for (int32_t budget = 5; budget < n; ++budget) {
      for (uint32_t seed : kShuffleSeeds) {
        SCOPED_TRACE(::testing::Message() << "n=" << n << " budget=" << budget << " seed=" << seed);
        Choice c = Choose(*sink, Range(0, n - 1), budget, seed);
        EXPECT_EQ(c.kept, Union(PosRange(0, 3), PosRange(n - (budget - 4), n - 1)));
        EXPECT_EQ(c.victims, PosRange(4, n - (budget - 4) - 1));
      }
    }
  }
}

TEST(EvictionPolicyTest, SinkOnSteadyStateOfADecode) {
  std::unique_ptr<EvictionPolicy> sink = Policy("sink");
  ASSERT_NE(sink, nullptr);
  // After earlier steps a budget-9 head holds 0..3 and 11..15; now 16..18 arrive in one chunk.
  std::vector<std::pair<int32_t, float>> t = Range(0, 3);
  for (int32_t p = 11; p <= 18; ++p) t.push_back({p, 5.0f});
  for (uint32_t seed : kShuffleSeeds) {
    Choice c = Choose(*sink, t, 9, seed);
    EXPECT_EQ(c.victims, (Positions{11, 12, 13}));
    EXPECT_EQ(c.kept, Union(PosRange(0, 3), PosRange(14, 18)));
    // Decode: one new token, one victim, the oldest non-sink.
    std::vector<std::pair<int32_t, float>> d = Range(0, 3);
    for (int32_t p = 14; p <= 19; ++p) d.push_back({p, 0.0f});
    EXPECT_EQ(Choose(*sink, d, 9, seed).victims, (Positions{14}));
  }
}

// StreamingLLM does not define budgets below kNumSinkTokens + 1. The implementation keeps
// budget - 1 sinks and the newest token rather than evicting the token just written.
TEST(EvictionPolicyTest, SinkWithTinyBudgetKeepsNewestToken) {
  std::unique_ptr<EvictionPolicy> sink = Policy("sink");
  ASSERT_NE(sink, nullptr);
  for (uint32_t seed : kShuffleSeeds) {
    EXPECT_EQ(Choose(*sink, Range(0, 9), 4, seed).kept, (Positions{0, 1, 2, 9}));
    EXPECT_EQ(Choose(*sink, Range(0, 9), 2, seed).kept, (Positions{0, 9}));
    EXPECT_EQ(Choose(*sink, Range(0, 9), 1, seed).kept, (Positions{9}));
  }
}

// Scripted h2o pattern: positions 0..9, budget 6 => the 3 newest (7, 8, 9) are protected even
// though their scores are the lowest.
const std::vector<std::pair<int32_t, float>> kH2oTokens = {
    {0, 5.0f}, {1, 1.0f}, {2, 9.0f}, {3, 1.0f}, {4, 0.5f},
    {5, 7.0f}, {6, 2.0f}, {7, 0.0f}, {8, 0.0f}, {9, 0.0f}};

TEST(EvictionPolicyTest, H2oEvictsLowestScoreOutsideRecentWindow) {
  std::unique_ptr<EvictionPolicy> h2o = Policy("h2o", 0.5);
  ASSERT_NE(h2o, nullptr);
  for (uint32_t seed : kShuffleSeeds) {
    SCOPED_TRACE(seed);
    // budget 6: recent = {7, 8, 9}; evict 4 of 0..6 by score: 4 (0.5), 1 (1, older), 3 (1), 6 (2).
    Choice c = Choose(*h2o, kH2oTokens, 6, seed);
    EXPECT_EQ(c.victims, (Positions{1, 3, 4, 6}));
    EXPECT_EQ(c.kept, (Positions{0, 2, 5, 7, 8, 9}));
    // budget 9 (one victim, the decode path): recent = {6..9}; lowest of 0..5 is 4.
    EXPECT_EQ(Choose(*h2o, kH2oTokens, 9, seed).victims, (Positions{4}));
    // budget 8: recent = {6..9}; two victims 4 then the tie 1 vs 3 goes to the older, 1.
    EXPECT_EQ(Choose(*h2o, kH2oTokens, 8, seed).victims, (Positions{1, 4}));
    // budget 7: recent = {7, 8, 9}; 4, 1, 3.
    EXPECT_EQ(Choose(*h2o, kH2oTokens, 7, seed).victims, (Positions{1, 3, 4}));
    // budget 5: recent = {8, 9} (floor(5/2) = 2); 7 now competes with score 0 and goes first.
    EXPECT_EQ(Choose(*h2o, kH2oTokens, 5, seed).kept, (Positions{0, 2, 5, 8, 9}));
    // budget 3: recent = {9}; the two highest scores remain.
    EXPECT_EQ(Choose(*h2o, kH2oTokens, 3, seed).kept, (Positions{2, 5, 9}));
    // budget 1: nothing is protected (floor(1/2) = 0): the highest score survives.
    EXPECT_EQ(Choose(*h2o, kH2oTokens, 1, seed).kept, (Positions{2}));
  }
}

TEST(EvictionPolicyTest, H2oTiesGoToTheOlderPosition) {
  std::unique_ptr<EvictionPolicy> h2o = Policy("h2o", 0.5);
  ASSERT_NE(h2o, nullptr);
  // All scores equal: h2o degenerates to evicting the oldest non-recent tokens.
  std::vector<std::pair<int32_t, float>> t;
  for (int32_t p = 0; p < 12; ++p) t.push_back({p, 3.0f});
  for (uint32_t seed : kShuffleSeeds) {
    EXPECT_EQ(Choose(*h2o, t, 8, seed).victims, PosRange(0, 3));
    EXPECT_EQ(Choose(*h2o, t, 11, seed).victims, (Positions{0}));
  }
  // Ties among a subset: {2, 5, 7} share the lowest score; evicting two takes 2 and 5.
  std::vector<std::pair<int32_t, float>> u;
  for (int32_t p = 0; p < 12; ++p) u.push_back({p, (p == 2 || p == 5 || p == 7) ? 1.0f : 4.0f});
  for (uint32_t seed : kShuffleSeeds) {
    EXPECT_EQ(Choose(*h2o, u, 10, seed).victims, (Positions{2, 5}));
    EXPECT_EQ(Choose(*h2o, u, 11, seed).victims, (Positions{2}));
  }
}

TEST(EvictionPolicyTest, H2oNeverEvictsRecentEvenWithZeroScores) {
  std::unique_ptr<EvictionPolicy> h2o = Policy("h2o", 0.5);
  ASSERT_NE(h2o, nullptr);
  // Old tokens have huge scores, recent ones zero; a chunk of 7 new tokens arrives.
  for (int32_t budget = 2; budget <= 16; ++budget) {
    const int32_t n = budget + 7;
    std::vector<std::pair<int32_t, float>> t;
    for (int32_t p = 0; p < n; ++p) t.push_back({p, p < n - 7 ? 1000.0f + p : 0.0f});
    for (uint32_t seed : kShuffleSeeds) {
      Choice c = Choose(*h2o, t, budget, seed);
      const int32_t recent = budget / 2;
      for (int32_t p = n - recent; p < n; ++p) {
        EXPECT_TRUE(c.kept.count(p)) << "recent position " << p << " evicted, budget " << budget;
      }
      // Of the new chunk, exactly the protected ones survive: all others have score 0.
      for (int32_t p = n - 7; p < n - recent; ++p) {
        EXPECT_TRUE(c.victims.count(p)) << "position " << p << ", budget " << budget;
      }
    }
  }
}

TEST(EvictionPolicyTest, H2oRecentFractionSetsTheProtectedWindow) {
  // Scores decrease with position, so without protection the newest tokens would go first.
  std::vector<std::pair<int32_t, float>> t;
  for (int32_t p = 0; p < 20; ++p) t.push_back({p, static_cast<float>(100 - p)});
  std::unique_ptr<EvictionPolicy> quarter = Policy("h2o", 0.25);
  ASSERT_NE(quarter, nullptr);
  std::unique_ptr<EvictionPolicy> all = Policy("h2o", 1.0);
  ASSERT_NE(all, nullptr);
  std::unique_ptr<EvictionPolicy> tenth = Policy("h2o", 0.1);
  ASSERT_NE(tenth, nullptr);
  for (uint32_t seed : kShuffleSeeds) {
    // rf 0.25, budget 8: protects 2 (18, 19); keeps the 6 best-scored (0..5).
    EXPECT_EQ(Choose(*quarter, t, 8, seed).kept, Union(PosRange(0, 5), PosRange(18, 19)));
    // rf 1.0: protects the whole budget, i.e. behaves as a window.
    EXPECT_EQ(Choose(*all, t, 8, seed).kept, PosRange(12, 19));
    // rf 0.1, budget 8: floor(0.8) = 0 protected: pure heavy hitters.
    EXPECT_EQ(Choose(*tenth, t, 8, seed).kept, PosRange(0, 7));
  }
}

TEST(EvictionPolicyTest, H2oWithGapsFromEarlierEvictions) {
  std::unique_ptr<EvictionPolicy> h2o = Policy("h2o", 0.5);
  ASSERT_NE(h2o, nullptr);
  // A budget-6 head that evicted before: old survivors are sparse; 10..13 are recent.
  std::vector<std::pair<int32_t, float>> t = {{0, 4.0f},  {2, 8.0f},  {5, 3.0f},  {9, 3.0f},
                                              {10, 0.0f}, {11, 1.0f}, {12, 0.0f}, {13, 0.0f}};
  for (uint32_t seed : kShuffleSeeds) {
    // recent = {11, 12, 13}; evict 2 of {0, 2, 5, 9, 10}: 10 (0), then 5 (3, older than 9).
    EXPECT_EQ(Choose(*h2o, t, 6, seed).victims, (Positions{5, 10}));
  }
}

// Brute-force reference of the three policies, for random patterns with many score ties.
Positions ReferenceKept(absl::string_view policy, std::vector<std::pair<int32_t, float>> t,
                        int32_t budget, double recent_fraction) {
  std::sort(t.begin(), t.end());  // by position
  const int32_t n = static_cast<int32_t>(t.size());
  Positions kept;
  if (policy == "window") {
    for (int32_t i = n - budget; i < n; ++i) kept.insert(t[i].first);
  } else if (policy == "sink") {
    for (int32_t i = 0; i < 4; ++i) kept.insert(t[i].first);
    for (int32_t i = n - (budget - 4); i < n; ++i) kept.insert(t[i].first);
  } else {
    const int32_t recent = static_cast<int32_t>(std::floor(budget * recent_fraction));
    for (int32_t i = n - recent; i < n; ++i) kept.insert(t[i].first);
    // Keep the highest (score, pos): on a score tie the newer token stays.
    std::vector<std::pair<float, int32_t>> rest;
    for (int32_t i = 0; i < n - recent; ++i) rest.push_back({t[i].second, t[i].first});
    std::sort(rest.rbegin(), rest.rend());
    for (int32_t i = 0; i < budget - recent; ++i) kept.insert(rest[i].second);
  }
  return kept;
}

TEST(EvictionPolicyTest, RandomPatternsMatchReference) {
  std::mt19937 rng(42);
  for (absl::string_view name : {"window", "sink", "h2o"}) {
    for (double rf : {0.5, 0.3, 1.0}) {
      if (name != "h2o" && rf != 0.5) continue;
      std::unique_ptr<EvictionPolicy> policy = Policy(name, rf);
      ASSERT_NE(policy, nullptr);
      for (int iter = 0; iter < 400; ++iter) {
        const int32_t budget = (name == "sink" ? 5 : 1) + static_cast<int32_t>(rng() % 20);
        const int32_t num_new = 1 + static_cast<int32_t>(rng() % 8);
        // Sinks 0..3 are always held, then older positions with random gaps; the protected
        // recent tokens are contiguous, as they are in a real decode.
        const int32_t held = budget + num_new;
        const int32_t recent = static_cast<int32_t>(std::floor(budget * rf));
        std::vector<std::pair<int32_t, float>> t;
        int32_t next = 0;  // next position to append
        while (static_cast<int32_t>(t.size()) < held) {
          const bool gap_ok = next >= 4 && static_cast<int32_t>(t.size()) < held - recent;
          if (gap_ok) next += static_cast<int32_t>(rng() % 3);
          t.push_back({next++, static_cast<float>(rng() % 4)});
        }
        SCOPED_TRACE(::testing::Message() << name << " rf=" << rf << " budget=" << budget
                                        << " held=" << t.size() << " iter=" << iter);
        Choice c = Choose(*policy, t, budget, rng());
        ASSERT_EQ(c.kept, ReferenceKept(name, t, budget, rf));
      }
    }
  }
}

TEST(MakePolicyTest, UnknownNameListsThePolicies) {
  absl::StatusOr<std::unique_ptr<EvictionPolicy>> p = MakePolicy("bogus");
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(p.status())) << p.status();
  const std::string msg(p.status().message());
  EXPECT_NE(msg.find("bogus"), std::string::npos) << msg;
  for (absl::string_view name : kPolicyNames) {
    EXPECT_NE(msg.find(std::string(name)), std::string::npos) << name << " missing in: " << msg;
  }
  EXPECT_NE(msg.find("full, window, sink, h2o"), std::string::npos) << msg;
  EXPECT_TRUE(absl::IsInvalidArgument(MakePolicy("").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(MakePolicy("H2O").status()));
}

TEST(MakePolicyTest, H2oRecentFractionMustBeInZeroOne) {
  for (double rf : {0.0, -0.5, 1.0000001, 2.0, std::numeric_limits<double>::quiet_NaN(),
                    std::numeric_limits<double>::infinity()}) {
    absl::StatusOr<std::unique_ptr<EvictionPolicy>> p = MakePolicy("h2o", rf);
    EXPECT_FALSE(p.ok()) << rf;
    EXPECT_TRUE(absl::IsInvalidArgument(p.status())) << rf << ": " << p.status();
  }
  for (double rf : {1e-6, 0.5, 1.0}) {
    absl::StatusOr<std::unique_ptr<EvictionPolicy>> p = MakePolicy("h2o", rf);
    ASSERT_TRUE(p.ok()) << rf << ": " << p.status();
    EXPECT_EQ((*p)->name(), "h2o");
  }
}

TEST(KvBudgetTest, ParsesTokenCountsAndFractions) {
  absl::StatusOr<KvBudget> b = KvBudget::Parse("102");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_FALSE(b->is_fraction);
  EXPECT_EQ(b->Resolve(512), 102);
  EXPECT_EQ(b->Resolve(50), 102);  // a token count does not depend on the sequence length
  EXPECT_EQ(b->ToString(), "102");

  b = KvBudget::Parse("0.2");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(b->is_fraction);
  EXPECT_EQ(b->Resolve(512), 102);
  EXPECT_EQ(b->Resolve(10), 2);
  EXPECT_EQ(b->ToString(), "0.2");

  b = KvBudget::Parse("0.1");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->Resolve(512), 51);

  b = KvBudget::Parse("1");  // the whole sequence, not one token
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(b->is_fraction);
  EXPECT_EQ(b->Resolve(512), 512);
  EXPECT_EQ(b->Resolve(7), 7);

  b = KvBudget::Parse("2");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_FALSE(b->is_fraction);
  EXPECT_EQ(b->Resolve(512), 2);

  b = KvBudget::Parse("0.001");  // resolves to at least one token
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->Resolve(100), 1);
  EXPECT_EQ(b->Resolve(0), 1);
}

TEST(KvBudgetTest, FractionsResolveWithoutFloatingPointLoss) {
  // 0.29 * 100 is 28.999999999999996 in doubles; the user asked for 29 tokens.
  EXPECT_EQ(KvBudget::Parse("0.29")->Resolve(100), 29);
  EXPECT_EQ(KvBudget::Parse("0.57")->Resolve(100), 57);
  EXPECT_EQ(KvBudget::Parse("0.58")->Resolve(100), 58);
  EXPECT_EQ(KvBudget::Parse("0.7")->Resolve(10), 7);
  EXPECT_EQ(KvBudget::Parse("0.299")->Resolve(10), 2);  // still floors
  EXPECT_EQ(KvBudget::Parse("0.99999")->Resolve(100), 99);
  // Every percentage of every length resolves to floor(pct * len / 100).
  for (int pct = 1; pct <= 100; ++pct) {
    absl::StatusOr<KvBudget> b = KvBudget::Parse(
        pct == 100 ? "1" : "0." + std::string(pct < 10 ? "0" : "") + std::to_string(pct));
    ASSERT_TRUE(b.ok()) << pct;
    for (int32_t len = 1; len <= 600; ++len) {
      ASSERT_EQ(b->Resolve(len), std::max(1, pct * len / 100)) << pct << "% of " << len;
    }
  }
}

TEST(KvBudgetTest, DefaultIsTheWholeSequence) {
  KvBudget b;
  EXPECT_TRUE(b.is_fraction);
  EXPECT_EQ(b.Resolve(300), 300);
}

TEST(KvBudgetTest, RejectsBadBudgets) {
  for (const char* text :
       {"0", "-3", "abc", "1.5", "", "0.0", "-0.5", "102.5", "inf", "nan", "1e30", "12abc"}) {
    absl::StatusOr<KvBudget> b = KvBudget::Parse(text);
    EXPECT_FALSE(b.ok()) << "\"" << text << "\" accepted";
    EXPECT_TRUE(absl::IsInvalidArgument(b.status())) << text << ": " << b.status();
  }
}

}  // namespace
}  // namespace heavykv

namespace heavykv {
namespace {

// The one-victim (decode) h2o search, vectorised, against a direct scan: slot counts around the
// 8- and 16-lane blocks, shuffled positions, heavy score ties (scores from a handful of values);
// through the policy (the best ISA) and through every ISA path this CPU runs.
TEST(EvictionPolicyTest, H2oDecodeVictimMatchesDirectScan) {
  std::unique_ptr<EvictionPolicy> h2o = *MakePolicy("h2o", 0.5);
  std::mt19937 rng(7);
  for (int32_t n : {1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 513}) {
    for (int trial = 0; trial < 50; ++trial) {
      const int32_t budget = n - 1;
      std::vector<int32_t> pos(n);
      std::iota(pos.begin(), pos.end(), 1000);
      std::shuffle(pos.begin(), pos.end(), rng);
      std::vector<float> score(n);
      for (float& s : score) s = float(rng() % 4) * 0.25f;
      const int32_t newest = 1000 + n - 1;
      const int32_t last_pos = newest - budget / 2;  // floor(budget/2) most recent are kept
      int32_t want = -1;
      for (int32_t i = 0; i < n; ++i) {
        if (pos[i] > last_pos) continue;
        if (want < 0 || score[i] < score[want] ||
            (score[i] == score[want] && pos[i] < pos[want])) {
          want = i;
        }
      }
      std::vector<int32_t> victims;
      h2o->ChooseVictims(HeadSlots{pos, score}, budget, newest, 1, &victims);
      ASSERT_EQ(victims.size(), 1u) << "n=" << n;
      EXPECT_EQ(victims[0], want) << "n=" << n << " trial=" << trial;
      for (cpu::Isa isa : cpu::SupportedIsas()) {
        EXPECT_EQ(LowestScoreSlot(pos.data(), score.data(), n, last_pos, isa), want)
            << cpu::IsaName(isa) << " n=" << n << " trial=" << trial;
      }
    }
  }
}

}  // namespace
}  // namespace heavykv
