#include "engine/serving/capacity_plan.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"

namespace heavykv {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

int32_t PagesPerSequence(const KvShape& shape, int32_t max_len, int32_t tokens_kept,
                         EvictGranularity granularity, LayerBudgets layers, KvQuant demote,
                         KvQuant request_quant) {
  // Scheduler::WorstCasePages: a bounded sequence's layer holds its budget + 1 slots while a
  // decode token is in flight, before it evicts back to the budget (budget + block_size at page
  // granularity: PeakDecodeSlots), never more than the sequence's length; PeakPages sums that
  // over the tables. The policy matters only through its granularity, layer budgets and demoted
  // store (h2o stands for every importance policy: their pages are the same).
  const std::string spec =
      demote == KvQuant::kNone ? "window" : absl::StrCat("h2o:demote=", KvQuantName(demote));
  absl::StatusOr<std::unique_ptr<EvictionPolicy>> policy =
      MakePolicy(spec, 0.5, granularity, layers);
  if (!policy.ok()) return INT32_MAX;  // PlanCapacity refuses such input first
  const int64_t pages = PeakPages(shape, tokens_kept < max_len ? policy->get() : nullptr,
                                  tokens_kept, max_len, request_quant);
  return static_cast<int32_t>(std::min<int64_t>(pages, INT32_MAX));
}

int64_t PoolMiBForPages(int64_t pages, int64_t page_bytes) {
  return CeilDiv(pages * page_bytes, int64_t{1} << 20);
}

int32_t PrefillReservePages(const KvShape& shape, int32_t max_step_tokens) {
  // Scheduler::ScratchPages().
  return shape.NumTables() * (static_cast<int32_t>(CeilDiv(max_step_tokens, shape.block_size)) + 4);
}

absl::StatusOr<CapacityPlan> PlanCapacity(const CapacityPlanInput& in,
                                          const std::vector<KvBudget>& budgets) {
  const KvShape& s = in.shape;
  if (s.num_layers <= 0 || s.num_kv_heads <= 0 || s.head_dim <= 0 || s.block_size <= 0) {
    return absl::InvalidArgumentError(
        "the KV shape needs positive layers, kv heads, head_dim and block size");
  }
  for (auto [name, v] : {std::pair{"pool pages", in.num_pages},
                         {"max length", in.max_len},
                         {"max step tokens", in.max_step_tokens},
                         {"max running", in.max_running}}) {
    if (v <= 0) return absl::InvalidArgumentError(absl::StrCat(name, " must be positive"));
  }
  if (in.demote != KvQuant::kNone) {  // demote= with the server's granularity and layers
    absl::StatusOr<std::unique_ptr<EvictionPolicy>> p =
        MakePolicy(absl::StrCat("h2o:demote=", KvQuantName(in.demote)), 0.5, in.granularity,
                   in.layers);
    if (!p.ok()) return p.status();
  }
  if (absl::Status st = CheckPackedFormats(s, in.demote, in.request_quant); !st.ok()) return st;
  CapacityPlan plan;
  plan.page_bytes = s.PageBytes();
  plan.bytes_per_token = KvBytesPerPoolToken(s);
  plan.num_pages = in.num_pages;

  std::vector<KvBudget> all = {KvBudget{true, 1.0}};
  all.insert(all.end(), budgets.begin(), budgets.end());
  for (const KvBudget& b : all) {
    CapacityRow row;
    row.budget = b;
    row.tokens_kept = std::min(b.Resolve(in.max_len), in.max_len);
    row.bounded = row.tokens_kept < in.max_len;
    row.pages_per_sequence = PagesPerSequence(s, in.max_len, row.tokens_kept, in.granularity,
                                              in.layers, in.demote, in.request_quant);
    // The reserve is held back only while bounded sequences run (Scheduler::Fits).
    row.reserve_pages = row.bounded ? PrefillReservePages(s, in.max_step_tokens) : 0;
    row.sequences = std::max<int64_t>(0, in.num_pages - row.reserve_pages) / row.pages_per_sequence;
    // Every running sequence takes at least one of a step's tokens (its decode token).
    row.running = std::min<int64_t>({row.sequences, in.max_running, in.max_step_tokens});
    row.pages_for_max_running =
        int64_t(in.max_running) * row.pages_per_sequence + row.reserve_pages;
    plan.rows.push_back(row);
  }
  return plan;
}

}  // namespace heavykv
