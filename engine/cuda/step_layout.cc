#include "engine/cuda/step_layout.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/eviction_rule.h"

namespace heavykv {

static_assert(int32_t(VictimRule::kNone) == cuda::kEvictNone &&
              int32_t(VictimRule::kOldest) == cuda::kEvictOldest &&
              int32_t(VictimRule::kLowestChannel) == cuda::kEvictLowestScore,
              "VictimRule kinds are the GPU's eviction kinds");

absl::Status CheckGpuPolicy(const EvictionPolicy* policy) {
  if (policy == nullptr || policy->GpuRule(1).has_value()) return absl::OkStatus();
  if (policy->page_granularity()) {
    return absl::UnimplementedError(
        "page eviction granularity has no CUDA implementation; use granularity=token or "
        "--device cpu");
  }
  if (policy->demote() != KvQuant::kNone) {
    return absl::UnimplementedError(
        "demote= (MiKV's low-precision store of evicted tokens) has no CUDA implementation; "
        "use --device cpu");
  }
  if (policy->layer_budgets() != LayerBudgets::kUniform) {
    return absl::UnimplementedError(absl::StrCat(
        LayerBudgetsName(policy->layer_budgets()),
        " layer budgets have no CUDA implementation (the GPU pool has one block table for all "
        "layers); use layers=uniform or --device cpu"));
  }
  return absl::UnimplementedError(absl::StrCat(
      "KV policy \"", policy->name(),
      "\" has no CUDA implementation (the GPU runs full, window, sink and h2o); use --device cpu"));
}

absl::StatusOr<EvictRule> EvictRuleFor(const EvictionPolicy* policy, int32_t budget) {
  EvictRule r;
  if (policy == nullptr || budget == kUnboundedBudget) return r;
  const std::optional<VictimRule> rule = policy->GpuRule(budget);
  if (!rule.has_value()) return CheckGpuPolicy(policy);
  r.kind = rule->kind;
  r.param = rule->param;
  return r;
}

absl::Status BuildStepLayout(std::span<const SequenceStep> steps, std::span<const EvictRule> rules,
                             int32_t block_size, StepLayout* out) {
  StepLayout& L = *out;
  const int32_t S = static_cast<int32_t>(steps.size());
  int64_t T = 0, rows = 0, pages = 0;
  for (const SequenceStep& st : steps) {
    T += st.tokens.size();
    rows += st.all_logits ? st.tokens.size() : 1;
    pages += st.kv->Table(0).pages.size();
  }
  L.num_seqs = S;
  L.num_tokens = static_cast<int32_t>(T);
  L.num_rows = static_cast<int32_t>(rows);
  L.max_held = 0;
  L.any_scores = false;
  int64_t off = 0;
  auto take = [&](int64_t n) {
    const int64_t o = off;
    off += n;
    return o;
  };
  L.page_indptr = take(S + 1);
  L.num_old = take(S);
  L.num_new = take(S);
  L.token_begin = take(S);
  L.start_pos = take(S);
  L.accumulate = take(S);
  L.budget = take(S);
  L.evict_kind = take(S);
  L.evict_param = take(S);
  L.token_seq = take(T);
  L.token_pos = take(T);
  L.tokens = take(T);
  L.logit_rows = take(rows);
  L.page_ids = take(pages);
  L.data.assign(off, 0);
  int32_t* d = L.data.data();
  int64_t t = 0, r = 0, p = 0;
  for (int32_t i = 0; i < S; ++i) {
    const SequenceStep& st = steps[i];
    const SequenceKv& kv = *st.kv;
    const int32_t n = static_cast<int32_t>(st.tokens.size());
    // The CUDA layout: one table for all layers (KvShape::table_per_layer false).
    const KvTable& table = kv.Table(0);
    const int64_t held = int64_t(table.num_slots) + n;
    if (int64_t(table.pages.size()) * block_size < held) {
      return absl::InternalError(absl::StrCat("sequence ", i, " holds ", table.pages.size(),
                                              " pages for ", held, " slots: not reserved"));
    }
    L.max_held = std::max<int32_t>(L.max_held, static_cast<int32_t>(held));
    d[L.page_indptr + i] = static_cast<int32_t>(p);
    for (int32_t page : table.pages) d[L.page_ids + p++] = page;
    d[L.num_old + i] = table.num_slots;
    d[L.num_new + i] = n;
    d[L.token_begin + i] = static_cast<int32_t>(t);
    d[L.start_pos + i] = st.start_pos;
    const bool scores = kv.policy != nullptr && kv.policy->needs_scores();
    L.any_scores = L.any_scores || scores;
    d[L.accumulate + i] = scores ? 1 : 0;
    d[L.budget + i] = kv.budget;
    d[L.evict_kind + i] = rules[i].kind;
    d[L.evict_param + i] = rules[i].param;
    for (int32_t j = 0; j < n; ++j, ++t) {
      d[L.token_seq + t] = i;
      d[L.token_pos + t] = st.start_pos + j;
      d[L.tokens + t] = st.tokens[j];
      if (st.all_logits) d[L.logit_rows + r++] = static_cast<int32_t>(t);
    }
    if (!st.all_logits) d[L.logit_rows + r++] = static_cast<int32_t>(t - 1);
  }
  d[L.page_indptr + S] = static_cast<int32_t>(p);
  return absl::OkStatus();
}

}  // namespace heavykv
