// The eviction policies of memory/eviction_policy.h and MakePolicy, which builds one from its
// spec. Every policy but snapkv is a channel and a VictimRule; snapkv adds its prefill selection.
#include <algorithm>
#include <cmath>
#include <string_view>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "memory/eviction_policy.h"

namespace heavykv {
namespace {

int32_t RecentTokens(int32_t budget, double recent_fraction) {
  return static_cast<int32_t>(std::floor(budget * recent_fraction));
}

class WindowPolicy final : public EvictionPolicy {
 public:
  absl::string_view name() const override { return "window"; }
  VictimRule Rule(int32_t) const override { return {VictimRule::kOldest, 0}; }
};

class SinkPolicy final : public EvictionPolicy {
 public:
  absl::string_view name() const override { return "sink"; }
  VictimRule Rule(int32_t budget) const override {
    // Keep at least one recent slot (the newest token) even for tiny budgets.
    return {VictimRule::kOldest, std::max(0, std::min(kNumSinkTokens, budget - 1))};
  }
};

class H2OPolicy final : public EvictionPolicy {
 public:
  explicit H2OPolicy(double recent_fraction) : recent_fraction_(recent_fraction) {}
  absl::string_view name() const override { return "h2o"; }
  ChannelSpec channel() const override { return {SlotChannel::kAccumulated}; }
  // The recent tokens are all still held (none of them could have been evicted before: they
  // were recent at every earlier step), so "recent" is a position range.
  VictimRule Rule(int32_t budget) const override {
    return {VictimRule::kLowestChannel, RecentTokens(budget, recent_fraction_)};
  }

 private:
  double recent_fraction_;
};

// TOVA (Oren et al. 2024): the channel is overwritten by each query, and nothing is protected:
// the newest token itself goes when the latest query attends to it least.
class TovaPolicy final : public EvictionPolicy {
 public:
  absl::string_view name() const override { return "tova"; }
  ChannelSpec channel() const override { return {SlotChannel::kLast}; }
  VictimRule Rule(int32_t) const override { return {VictimRule::kLowestChannel, 0}; }
};

// Scissorhands (Liu et al. 2023): importance is how often a token got more than the mean
// attention within the last `history` steps. Counting exactly over a sliding window would need
// `history` bits per slot; the count decays by (1 - 1/history) per query instead, an
// exponential window of the same mean length in one float.
class ScissorhandsPolicy final : public EvictionPolicy {
 public:
  ScissorhandsPolicy(double recent_fraction, int32_t history)
      : recent_fraction_(recent_fraction), history_(history) {}
  absl::string_view name() const override { return "scissorhands"; }
  ChannelSpec channel() const override {
    return {SlotChannel::kAboveMeanCount, 1.0f - 1.0f / static_cast<float>(history_)};
  }
  VictimRule Rule(int32_t budget) const override {
    return {VictimRule::kLowestChannel, RecentTokens(budget, recent_fraction_)};
  }

 private:
  double recent_fraction_;
  int32_t history_;
};

// Key-norm eviction (Devoto et al. 2024): low-norm keys draw the most attention, so the highest
// norms go first. The channel holds -||k|| so that, as for every channel, lowest goes first. The
// newest token is kept: the next query should see its own predecessor.
class KnormPolicy final : public EvictionPolicy {
 public:
  absl::string_view name() const override { return "knorm"; }
  ChannelSpec channel() const override { return {SlotChannel::kNegKeyNorm}; }
  VictimRule Rule(int32_t) const override { return {VictimRule::kLowestChannel, 1}; }
};

// SnapKV (Li et al. 2024). In a step with more than one new token (a prefill chunk; the whole
// prompt when it fits one chunk), the channel holds the attention each slot got from the step's
// last `window` queries; the `window` newest positions are kept, and the rest are ranked by that
// attention max-pooled over the positions within kernel / 2 of theirs (clusters of important
// tokens survive together). In decode it is h2o (the channel keeps accumulating, as every
// query is then in the window) or window.
class SnapKvPolicy final : public EvictionPolicy {
 public:
  SnapKvPolicy(double recent_fraction, int32_t window, int32_t kernel, bool decode_h2o)
      : recent_fraction_(recent_fraction),
        window_(window),
        kernel_(kernel),
        decode_h2o_(decode_h2o) {}
  absl::string_view name() const override { return "snapkv"; }
  ChannelSpec channel() const override {
    return {SlotChannel::kObservationWindow, 1.0f, window_};
  }
  VictimRule Rule(int32_t budget) const override {
    if (decode_h2o_) return {VictimRule::kLowestChannel, RecentTokens(budget, recent_fraction_)};
    return {VictimRule::kOldest, 0};
  }
  void ChooseVictims(const HeadSlots& slots, const EvictionStep& step,
                     std::vector<int32_t>* victims) const override {
    if (step.num_new <= 1) {
      ApplyVictimRule(slots, Rule(step.budget), step, victims);
      return;
    }
    // The window (the newest positions, at most the budget so that there are always enough
    // candidates) is kept; the candidates, in position order, are a prefix of the held tokens.
    const int32_t protect = std::min(window_, step.budget);
    const int32_t last_pos = step.newest_pos - protect;
    const int32_t n = static_cast<int32_t>(slots.pos.size());
    thread_local std::vector<int32_t> order;
    thread_local std::vector<float> pooled;
    order.resize(n);
    for (int32_t i = 0; i < n; ++i) order[i] = i;
    std::sort(order.begin(), order.end(),
              [&](int32_t a, int32_t b) { return slots.pos[a] < slots.pos[b]; });
    int32_t num_cand = 0;
    while (num_cand < n && slots.pos[order[num_cand]] <= last_pos) ++num_cand;
    // Max-pool the candidates' channel over the candidates within kernel / 2 positions, as
    // SnapKV pools the prefix's attention (the window's own columns are not pooled in).
    const int32_t half = kernel_ / 2;
    pooled.assign(n, 0.0f);
    int32_t lo = 0, hi = 0;  // the candidates within `half` positions of order[i]: [lo, hi)
    for (int32_t i = 0; i < num_cand; ++i) {
      const int32_t p = slots.pos[order[i]];
      while (slots.pos[order[lo]] < p - half) ++lo;
      while (hi < num_cand && slots.pos[order[hi]] <= p + half) ++hi;
      float best = slots.score[order[lo]];
      for (int32_t j = lo + 1; j < hi; ++j) best = std::max(best, slots.score[order[j]]);
      pooled[order[i]] = best;
    }
    ApplyVictimRule(HeadSlots{slots.pos, pooled}, VictimRule{VictimRule::kLowestChannel, protect},
                    step, victims);
  }

 protected:
  bool rule_is_exact() const override { return false; }

 private:
  double recent_fraction_;
  int32_t window_, kernel_;
  bool decode_h2o_;
};

// A budget at which every importance policy's rule is its own (tested for demote=).
constexpr int32_t kDemoteRuleProbe = 64;

absl::Status Invalid(absl::string_view spec, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("KV policy \"", spec, "\": ", why));
}

// Reads "key=value" parameters into the named fields; INVALID_ARGUMENT for others.
struct IntParam {
  absl::string_view key;
  int32_t* value;
  int32_t min;
};

absl::Status ParseParams(absl::string_view spec, std::span<const absl::string_view> items,
                         std::span<const IntParam> ints, std::string* decode) {
  for (absl::string_view item : items) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(item, '=');
    bool known = false;
    for (const IntParam& p : ints) {
      if (kv.first != p.key) continue;
      known = true;
      if (!absl::SimpleAtoi(kv.second, p.value) || *p.value < p.min) {
        return Invalid(spec, absl::StrCat(p.key, " must be an integer >= ", p.min));
      }
    }
    if (decode != nullptr && kv.first == "decode") {
      known = true;
      if (kv.second != "h2o" && kv.second != "window") {
        return Invalid(spec, "decode must be h2o or window");
      }
      *decode = std::string(kv.second);
    }
    if (!known) return Invalid(spec, absl::StrCat("unknown parameter \"", kv.first, "\""));
  }
  return absl::OkStatus();
}

// The policy of `name` with its own parameters `params` (granularity already taken out).
absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeNamedPolicy(
    absl::string_view spec, absl::string_view name, std::span<const absl::string_view> params,
    double recent_fraction) {
  if ((name == "h2o" || name == "scissorhands" || name == "snapkv") &&
      !(recent_fraction > 0.0 && recent_fraction <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " recent_fraction must be in (0, 1], got ", recent_fraction));
  }
  if (name == "scissorhands") {
    int32_t history = 400;
    const IntParam ints[] = {{"history", &history, 1}};
    if (absl::Status s = ParseParams(spec, params, ints, nullptr); !s.ok()) return s;
    return std::make_unique<ScissorhandsPolicy>(recent_fraction, history);
  }
  if (name == "snapkv") {
    int32_t window = 32, kernel = 7;
    std::string decode = "h2o";
    const IntParam ints[] = {{"window", &window, 1}, {"kernel", &kernel, 1}};
    if (absl::Status s = ParseParams(spec, params, ints, &decode); !s.ok()) return s;
    if (kernel % 2 == 0) return Invalid(spec, "kernel must be odd");
    return std::make_unique<SnapKvPolicy>(recent_fraction, window, kernel, decode == "h2o");
  }
  if (!params.empty()) {
    bool known = false;
    for (absl::string_view p : kPolicyNames) known = known || p == name;
    if (known) {
      return Invalid(spec, absl::StrCat(name, name == "full"
                                                  ? " takes no parameters"
                                                  : " takes only granularity and layers"));
    }
  }
  if (params.empty()) {
    if (name == "full") return std::unique_ptr<EvictionPolicy>();
    if (name == "window") return std::make_unique<WindowPolicy>();
    if (name == "sink") return std::make_unique<SinkPolicy>();
    if (name == "h2o") return std::make_unique<H2OPolicy>(recent_fraction);
    if (name == "tova") return std::make_unique<TovaPolicy>();
    if (name == "knorm") return std::make_unique<KnormPolicy>();
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown KV policy \"", spec,
                                                 "\"; choose one of: ",
                                                 absl::StrJoin(kPolicyNames, ", ")));
}

}  // namespace

absl::StatusOr<EvictGranularity> ParseEvictGranularity(absl::string_view text) {
  if (text == "token") return EvictGranularity::kToken;
  if (text == "page") return EvictGranularity::kPage;
  return absl::InvalidArgumentError(
      absl::StrCat("eviction granularity must be token or page, got \"", text, "\""));
}

absl::string_view EvictGranularityName(EvictGranularity g) {
  return g == EvictGranularity::kPage ? "page" : "token";
}

std::string SpecWithDefaults(absl::string_view spec, EvictGranularity granularity,
                             LayerBudgets layers) {
  std::string out(spec);
  if (IsFullPolicy(spec)) return out;
  if (granularity == EvictGranularity::kPage && !absl::StrContains(spec, ":granularity=")) {
    absl::StrAppend(&out, ":granularity=", EvictGranularityName(granularity));
  }
  if (layers != LayerBudgets::kUniform && !absl::StrContains(spec, ":layers=")) {
    absl::StrAppend(&out, ":layers=", LayerBudgetsName(layers));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakePolicy(absl::string_view spec,
                                                           double recent_fraction,
                                                           EvictGranularity granularity,
                                                           LayerBudgets layers) {
  std::vector<absl::string_view> parts = absl::StrSplit(spec, ':');
  const absl::string_view name = parts[0];
  // granularity=... and layers=... apply to every policy but full; the others' parameters stay
  // in order.
  std::vector<absl::string_view> params;
  bool granularity_set = false, layers_set = false;
  KvQuant demote = KvQuant::kNone;
  int32_t demote_budget = 0;
  bool demote_set = false, demote_budget_set = false, recent_set = false;
  for (size_t i = 1; i < parts.size(); ++i) {
    // recent=F overrides `recent_fraction` for this spec (so one eval compares several).
    if (absl::StartsWith(parts[i], "recent=") && name != "full") {
      if (name != "h2o" && name != "scissorhands" && name != "snapkv") {
        return Invalid(spec, "recent applies to h2o, scissorhands and snapkv");
      }
      if (recent_set) return Invalid(spec, "recent is given twice");
      recent_set = true;
      if (!absl::SimpleAtod(parts[i].substr(7), &recent_fraction) ||
          !(recent_fraction > 0.0 && recent_fraction <= 1.0)) {
        return Invalid(spec, "recent must be a number in (0, 1]");
      }
      continue;
    }
    const bool g_key = absl::StartsWith(parts[i], "granularity=");
    const bool l_key = absl::StartsWith(parts[i], "layers=");
    const bool d_key = absl::StartsWith(parts[i], "demote=");
    const bool db_key = absl::StartsWith(parts[i], "demote_budget=");
    if ((!g_key && !l_key && !d_key && !db_key) || name == "full") {
      params.push_back(parts[i]);
      continue;
    }
    const absl::string_view value = parts[i].substr(parts[i].find('=') + 1);
    if (d_key) {
      if (demote_set) return Invalid(spec, "demote is given twice");
      demote_set = true;
      if (!ParseKvQuant(std::string_view(value.data(), value.size()), &demote)) {
        return Invalid(spec, absl::StrCat("demote must be int8 or int4, got \"", value, "\""));
      }
    } else if (db_key) {
      if (demote_budget_set) return Invalid(spec, "demote_budget is given twice");
      demote_budget_set = true;
      if (!absl::SimpleAtoi(value, &demote_budget) || demote_budget < 1) {
        return Invalid(spec, "demote_budget must be an integer >= 1 (tokens per layer and head)");
      }
    } else if (g_key) {
      absl::StatusOr<EvictGranularity> g = ParseEvictGranularity(value);
      if (!g.ok()) return Invalid(spec, g.status().message());
      if (granularity_set) return Invalid(spec, "granularity is given twice");
      granularity_set = true;
      granularity = *g;
    } else {
      absl::StatusOr<LayerBudgets> l = ParseLayerBudgets(value);
      if (!l.ok()) return Invalid(spec, l.status().message());
      if (layers_set) return Invalid(spec, "layers is given twice");
      layers_set = true;
      layers = *l;
    }
  }
  absl::StatusOr<std::unique_ptr<EvictionPolicy>> policy =
      MakeNamedPolicy(spec, name, params, recent_fraction);
  if (policy.ok() && *policy != nullptr) {
    (*policy)->set_granularity(granularity);
    (*policy)->set_layer_budgets(layers);
  }
  if (!policy.ok() || (!demote_set && !demote_budget_set)) return policy;
  // MiKV: the importance policies (an order by channel) at token granularity, uniform layers.
  if (*policy == nullptr || (*policy)->Rule(kDemoteRuleProbe).kind != VictimRule::kLowestChannel) {
    return Invalid(spec, "demote needs an importance policy (h2o, tova, scissorhands, knorm, "
                         "snapkv with decode=h2o)");
  }
  if (!demote_set) return Invalid(spec, "demote_budget needs demote=int8 or demote=int4");
  if (granularity != EvictGranularity::kToken || layers != LayerBudgets::kUniform) {
    return Invalid(spec, "demote is not built for granularity=page or non-uniform layers");
  }
  (*policy)->set_demote(demote, demote_budget);
  return policy;
}

bool ValidPolicySpec(absl::string_view spec, std::string* error) {
  absl::StatusOr<std::unique_ptr<EvictionPolicy>> p = MakePolicy(spec);
  if (!p.ok() && error != nullptr) *error = std::string(p.status().message());
  return p.ok();
}

}  // namespace heavykv
