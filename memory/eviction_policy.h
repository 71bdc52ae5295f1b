// Eviction policies: which tokens one (layer, kv head) drops when it holds more than its budget.
//
// A policy is stateless and sees plain data: the positions and accumulated attention scores of the
// slots of one (layer, kv head). It never touches KV storage; the KvCache applies its choice.
// Every (layer, kv head) chooses its own victims, so heads keep different tokens.
//
//   full   never evicts (the budget is unbounded)
//   window keeps the most recent `budget` tokens
//   sink   StreamingLLM: keeps the first kNumSinkTokens tokens of the sequence + the most recent
//   h2o    H2O: keeps the floor(budget * recent_fraction) most recent tokens, then the tokens with
//          the highest accumulated score (ties: the older token goes first)
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/isa.h"

namespace heavykv {

// The slots of one (layer, kv head): slot i holds the token at position pos[i], whose attention
// score summed over all steps and all query heads of the group is score[i].
struct HeadSlots {
  std::span<const int32_t> pos;
  std::span<const float> score;  // empty unless the policy needs_scores()
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual absl::string_view name() const = 0;
  // True when the attention kernels must accumulate per-slot scores for this policy.
  virtual bool needs_scores() const { return false; }
  // For a score-ranked policy: how many of the newest tokens are never evicted at `budget`
  // (h2o: floor(budget * recent_fraction)), so that another backend can apply the same rule.
  // 0 for the age-ranked policies.
  virtual int32_t NumProtectedRecent(int32_t budget) const { return 0; }
  // Appends to `victims` exactly `num_evict` (= slots.pos.size() - budget, > 0) distinct slot
  // indices of `slots` to drop so that `budget` tokens remain. `newest_pos` is the largest
  // position held. Called concurrently for different heads: implementations keep no state.
  virtual void ChooseVictims(const HeadSlots& slots, int32_t budget, int32_t newest_pos,
                             int32_t num_evict, std::vector<int32_t>* victims) const = 0;
};

inline constexpr int32_t kNumSinkTokens = 4;
inline constexpr int32_t kUnboundedBudget = INT32_MAX;

// Policy names accepted by MakePolicy, in the order they are listed to users.
inline constexpr absl::string_view kPolicyNames[] = {"full", "window", "sink", "h2o"};

// Returns the named policy or INVALID_ARGUMENT. `recent_fraction` in (0, 1] is used by h2o only.
absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakePolicy(absl::string_view name,
                                                           double recent_fraction = 0.5);

// The h2o decode search (one victim per head per step): the slot with the lowest score among
// those at positions <= last_pos, the oldest among equal scores; -1 if there is none. pos, score:
// [n]. Runs `isa`'s code (one AVX-512 or AVX2 pass, or two plain loops), which the CPU must
// support; H2OPolicy passes BestIsa(), tests every path the machine has.
int32_t LowestScoreSlot(const int32_t* pos, const float* score, int32_t n, int32_t last_pos,
                        cpu::Isa isa = cpu::BestIsa());

// A budget as users write it: an absolute token count ("102") or a fraction of the sequence's
// maximum length ("0.2", in (0, 1]).
struct KvBudget {
  bool is_fraction = true;
  double value = 1.0;

  static absl::StatusOr<KvBudget> Parse(absl::string_view text);
  // Tokens kept for a sequence of at most `max_len` tokens (prompt + max new tokens); >= 1.
  int32_t Resolve(int32_t max_len) const;
  std::string ToString() const;
};

}  // namespace heavykv
