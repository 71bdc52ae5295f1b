// Helpers shared by the eviction policy tests (eviction_policy_test, policy_zoo_test,
// page_granularity_test): a policy from its spec, and one victim choice over shuffled slots.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "memory/eviction_policy.h"

namespace heavykv::testing {

using Positions = std::set<int32_t>;
using Tokens = std::vector<std::pair<int32_t, float>>;  // (position, channel value)

// MakePolicy(spec, recent_fraction, granularity), failing the test on an error.
inline std::unique_ptr<EvictionPolicy> Policy(
    absl::string_view spec, double recent_fraction = 0.5,
    EvictGranularity granularity = EvictGranularity::kToken) {
  absl::StatusOr<std::unique_ptr<EvictionPolicy>> p =
      MakePolicy(spec, recent_fraction, granularity);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *std::move(p) : nullptr;
}

struct Choice {
  Positions victims;
  Positions kept;
};

// Lays `tokens` out over slots in an order shuffled by `seed` (as after compaction), asks the
// policy to evict down to `budget` in a step with `num_new` new tokens and returns the victims
// and survivors as positions. Checks that ChooseVictims appended (kept what was in the vector)
// exactly the requested number of distinct, in-range slots.
inline Choice ChooseShuffled(const EvictionPolicy& policy, const Tokens& tokens, int32_t budget,
                             int32_t num_new, uint32_t seed) {
  std::vector<int32_t> order(tokens.size());
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int32_t> pos(tokens.size());
  std::vector<float> score(tokens.size());
  int32_t newest = std::numeric_limits<int32_t>::min();
  for (size_t s = 0; s < order.size(); ++s) {
    pos[s] = tokens[order[s]].first;
    score[s] = tokens[order[s]].second;
    newest = std::max(newest, pos[s]);
  }
  HeadSlots slots{pos, {}};
  if (policy.needs_scores()) slots.score = score;
  const int32_t num_evict = static_cast<int32_t>(tokens.size()) - budget;
  std::vector<int32_t> victims = {-12345};  // ChooseVictims appends; keeps what was there
  policy.ChooseVictims(slots, EvictionStep{budget, newest, num_evict, num_new}, &victims);
  Choice c;
  EXPECT_EQ(victims.front(), -12345) << "ChooseVictims must append, not overwrite";
  victims.erase(victims.begin());
  EXPECT_EQ(static_cast<int32_t>(victims.size()), num_evict);
  std::set<int32_t> victim_slots;
  for (int32_t s : victims) {
    EXPECT_GE(s, 0);
    EXPECT_LT(s, static_cast<int32_t>(pos.size()));
    if (s < 0 || s >= static_cast<int32_t>(pos.size())) continue;
    EXPECT_TRUE(victim_slots.insert(s).second) << "slot " << s << " chosen twice";
    c.victims.insert(pos[s]);
  }
  for (int32_t s = 0; s < static_cast<int32_t>(pos.size()); ++s) {
    if (!victim_slots.count(s)) c.kept.insert(pos[s]);
  }
  return c;
}

}  // namespace heavykv::testing
