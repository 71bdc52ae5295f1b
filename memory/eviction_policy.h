// Eviction policies: which tokens one (layer, kv head) drops when it holds more than its budget.
//
// A policy is stateless and sees plain data: the positions of the slots of one (layer, kv head)
// and the one per-slot channel it declared (channel(): kernels/slot_channel.h says who writes
// what). It never touches KV storage; the KvCache applies its choice. Every (layer, kv head)
// chooses its own victims, so heads keep different tokens. The contract is in
// docs/ARCHITECTURE.md, "Eviction policies: the contract".
//
//   full          no policy at all: MakePolicy("full") is null, the budget unbounded
//   window        keeps the most recent `budget` tokens
//   sink          StreamingLLM: keeps the first kNumSinkTokens tokens of the sequence + the most
//                 recent
//   h2o           H2O: keeps the floor(budget * recent_fraction) most recent tokens, then those
//                 with the highest accumulated attention (ties: the older token goes first)
//   tova          TOVA: evicts the token with the lowest attention from the latest query
//   scissorhands  Scissorhands: keeps the floor(budget * recent_fraction) most recent tokens,
//                 then those most often above the mean attention over the last ~history steps
//   knorm         keeps the keys with the lowest L2 norm (and always the newest token)
//   snapkv        SnapKV: after a prefill chunk, keeps the last `window` tokens and the tokens
//                 with the most attention from those `window` queries, max-pooled over `kernel`
//                 neighbouring positions; in decode, behaves as h2o or window (`decode`)
//
// A policy is named by a spec, name[:key=value]... (see MakePolicy). Any policy but full may
// evict a page at a time instead of a token at a time (granularity=page; EvictGranularity), and
// split its budget unevenly across layers (layers=pyramid|squeeze; memory/layer_budgets.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/cpu/isa.h"
#include "kernels/kv_quant.h"
#include "kernels/slot_channel.h"
#include "memory/layer_budgets.h"

namespace heavykv {

// The slots of one (layer, kv head): slot i holds the token at position pos[i], whose channel
// value (what the policy's ChannelSpec says) is score[i].
struct HeadSlots {
  std::span<const int32_t> pos;
  std::span<const float> score;  // empty unless the policy needs_scores()
};

// A victim order that both backends apply without calling the policy (the GPU selects by
// kernels/cuda/eviction_rule.h's key, whose kinds have these values).
struct VictimRule {
  enum Kind : int32_t {
    kNone = 0,           // never evicts
    kOldest = 1,         // positions < param are kept; the others go oldest first
    kLowestChannel = 2,  // positions > newest_pos - param are kept; the others go lowest channel
                         // value first, ties the older position first
  };
  Kind kind = kNone;
  int32_t param = 0;
};

// One eviction of one (layer, kv head): it holds budget + num_evict tokens, the newest at
// newest_pos, num_new of them appended in this step (1 in decode, a chunk in prefill).
struct EvictionStep {
  int32_t budget = 0;
  int32_t newest_pos = 0;
  int32_t num_evict = 0;
  int32_t num_new = 1;
};

// When a head evicts and how much (docs/ARCHITECTURE.md, "Page granularity").
//   kToken  a head holds at most `budget` tokens after every step: each step that pushes it
//           over evicts the excess, one token per decode step.
//   kPage   a head may grow to budget + block_size - 1 tokens; the step that brings it to a
//           page over its budget evicts whole pages' worth (a multiple of block_size) at once,
//           the pages whose slots rank lowest together by the policy's rule (ChoosePageVictims).
//           Eviction then runs once per block_size decode steps; the peak is a page more.
enum class EvictGranularity { kToken, kPage };
absl::StatusOr<EvictGranularity> ParseEvictGranularity(absl::string_view text);
absl::string_view EvictGranularityName(EvictGranularity g);

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  EvictGranularity granularity() const { return granularity_; }
  bool page_granularity() const { return granularity_ == EvictGranularity::kPage; }
  // How the budget is split across layers (memory/layer_budgets.h).
  LayerBudgets layer_budgets() const { return layer_budgets_; }
  // MiKV (demote=int8|int4): the tokens this policy evicts are kept in a demoted store of
  // quantized rows instead of dropped (KvCache, docs/ARCHITECTURE.md "MiKV"); kNone: dropped.
  KvQuant demote() const { return demote_; }
  // Tokens per (layer, kv head) the demoted store holds at most (demote_budget=); 0: as many
  // as the sequence's budget. Past it, the lowest-ranked of the demoted and the step's victims
  // go, as tokens are evicted without demote.
  int32_t demote_budget() const { return demote_budget_; }
  // Set by MakePolicy before the policy is shared.
  void set_granularity(EvictGranularity g) { granularity_ = g; }
  void set_layer_budgets(LayerBudgets rule) { layer_budgets_ = rule; }
  void set_demote(KvQuant quant, int32_t budget) {
    demote_ = quant;
    demote_budget_ = budget;
  }
  // The base name ("snapkv"), without parameters.
  virtual absl::string_view name() const = 0;
  // What the kernels must write in each slot's channel for this policy.
  virtual ChannelSpec channel() const { return {}; }
  bool needs_scores() const { return channel().kind != SlotChannel::kNone; }
  // The order in which this policy evicts at `budget` (for snapkv: in decode).
  virtual VictimRule Rule(int32_t budget) const = 0;
  // Rule(budget) when it is this policy's choice at every step and the CUDA kernels write its
  // channel (kNone or kAccumulated): what the GPU may apply. nullopt: the GPU cannot run it.
  // (Inline: the CUDA module calls it without linking memory/.)
  std::optional<VictimRule> GpuRule(int32_t budget) const {
    const SlotChannel kind = channel().kind;
    if (!rule_is_exact() || page_granularity() || layer_budgets_ != LayerBudgets::kUniform ||
        demote_ != KvQuant::kNone ||
        (kind != SlotChannel::kNone && kind != SlotChannel::kAccumulated)) {
      return std::nullopt;
    }
    return Rule(budget);
  }
  // Endless streaming (StreamingLLM): when this policy keeps the positions below some p and
  // evicts every other token oldest first (window: p = 0, sink: kNumSinkTokens), p; else nullopt.
  // Such a policy keeps the recent tokens contiguous, so its sequences can run past the model's
  // context length (StreamsPastContext, kernels and runner in docs/ARCHITECTURE.md).
  // (Not at page granularity: its heads hold up to a page over the budget; nor with layer
  // budgets: the shift arithmetic assumes every layer keeps the same recent tokens.)
  std::optional<int32_t> PinnedPrefix(int32_t budget) const {
    if (!rule_is_exact() || page_granularity() || layer_budgets_ != LayerBudgets::kUniform) {
      return std::nullopt;
    }
    const VictimRule rule = Rule(budget);
    if (rule.kind != VictimRule::kOldest) return std::nullopt;
    return rule.param;
  }
  // Appends to `victims` exactly step.num_evict (> 0) distinct slot indices of `slots` to drop so
  // that step.budget tokens remain. Called concurrently for different heads: implementations
  // keep no state. The default applies Rule(step.budget).
  virtual void ChooseVictims(const HeadSlots& slots, const EvictionStep& step,
                             std::vector<int32_t>* victims) const;
  // At page granularity: appends step.num_evict (a multiple of block_size) victims, whole pages
  // of `slots` (slot s is on page s / block_size) chosen by Rule(step.budget): the full pages
  // none of whose slots the rule protects, lowest first by their aggregate (kLowestChannel: the
  // sum of their slots' channel; kOldest: their newest position), ties the older page first.
  // Falls back to ChooseVictims when fewer such pages exist, and for snapkv's prefill choice.
  // (Virtual only so that KvCache in the CUDA module, which does not link memory/, reaches it.)
  virtual void ChoosePageVictims(const HeadSlots& slots, const EvictionStep& step,
                                 int32_t block_size, std::vector<int32_t>* victims) const;
  // The same for a decode step (one new token).
  void ChooseVictims(const HeadSlots& slots, int32_t budget, int32_t newest_pos, int32_t num_evict,
                     std::vector<int32_t>* victims) const {
    ChooseVictims(slots, EvictionStep{budget, newest_pos, num_evict, 1}, victims);
  }

 protected:
  // Whether Rule() is the whole policy (false for snapkv, whose prefill choice is not an order).
  virtual bool rule_is_exact() const { return true; }

 private:
  EvictGranularity granularity_ = EvictGranularity::kToken;
  LayerBudgets layer_budgets_ = LayerBudgets::kUniform;
  KvQuant demote_ = KvQuant::kNone;
  int32_t demote_budget_ = 0;
};

// Appends the step.num_evict victims of `rule` (see VictimRule).
void ApplyVictimRule(const HeadSlots& slots, const VictimRule& rule, const EvictionStep& step,
                     std::vector<int32_t>* victims);

inline constexpr int32_t kNumSinkTokens = 4;
inline constexpr int32_t kUnboundedBudget = INT32_MAX;

// Policy names accepted by MakePolicy, in the order they are listed to users.
inline constexpr absl::string_view kPolicyNames[] = {"full", "window", "sink", "h2o",
                                                     "tova", "scissorhands", "knorm", "snapkv"};

// The policy of a spec "name[:key=value]...", or INVALID_ARGUMENT (unknown name or key, a bad
// value). A null pointer for "full". Keys: scissorhands history (steps, default 400);
// snapkv window (queries, default 32), kernel (odd, default 7), decode (h2o or window, default
// h2o); every policy but full: granularity (token or page, default `granularity`) and layers
// (uniform, pyramid or squeeze, default `layers`).
// `recent_fraction` in (0, 1] is used by h2o, scissorhands and snapkv with decode=h2o; their
// specs may override it with recent=F (`h2o:recent=0.9`).
absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakePolicy(
    absl::string_view spec, double recent_fraction = 0.5,
    EvictGranularity granularity = EvictGranularity::kToken,
    LayerBudgets layers = LayerBudgets::kUniform);
// `spec` with granularity=page appended when `granularity` is kPage, and layers=... when
// `layers` is not uniform, where the spec is not full and names no such key itself; else `spec`
// (for labels that show what ran: eval's tables).
std::string SpecWithDefaults(absl::string_view spec, EvictGranularity granularity,
                             LayerBudgets layers = LayerBudgets::kUniform);
// Whether MakePolicy(spec) succeeds; *error says why not.
bool ValidPolicySpec(absl::string_view spec, std::string* error = nullptr);
// Whether the spec names the full cache (no eviction).
inline bool IsFullPolicy(absl::string_view spec) { return spec == "full"; }

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
