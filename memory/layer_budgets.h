// Layer budgets: how a sequence's KV budget is split across the model's layers (issue 17;
// docs/ARCHITECTURE.md, "Layer budgets"). Every rule keeps the sequence's total, L x budget
// tokens per kv head, and gives each layer at least one token:
//   uniform  every layer keeps `budget` (the default, and what every policy did before)
//   pyramid  PyramidKV (Cai et al. 2024): budgets fall linearly from the first layer to the
//            last, which keeps budget / kPyramidBeta (the first keeps 2 x budget minus that)
//   squeeze  SqueezeAttention (Wang et al. 2024): measured over a sequence's tokens until it
//            first fills its budget (its prompt, as the paper measures prefill, or the prompt and
//            first new tokens when the prompt is shorter), each layer's importance is how little
//            its attention changes the hidden state (the cosine similarity of the residual stream
//            before and after the attention block, averaged over those tokens; until then every
//            layer keeps the uniform budget, which is all it holds); the layers are clustered
//            into three groups by that value,
//            the group that attention changes least keeps kSqueezeFraction x budget per layer,
//            the other layers share what that frees evenly
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace heavykv {

enum class LayerBudgets { kUniform, kPyramid, kSqueeze };
absl::StatusOr<LayerBudgets> ParseLayerBudgets(absl::string_view text);
absl::string_view LayerBudgetsName(LayerBudgets rule);

// PyramidKV's beta: the last layer keeps budget / beta tokens (their default is 20).
inline constexpr double kPyramidBeta = 20.0;
// SqueezeAttention's p: the least changed group's share of the budget (the paper sweeps it; a
// choice here, not a measured optimum).
inline constexpr double kSqueezeFraction = 0.3;

// Per-layer budgets of pyramid: [num_layers], each >= 1, summing to num_layers * budget.
std::vector<int32_t> PyramidBudgets(int32_t budget, int32_t num_layers);
// Per-layer budgets of squeeze from each layer's similarity (cosine, higher: attention changed
// the hidden state less): [similarity.size()], each >= 1, summing to size * budget. Uniform when
// the similarities are all equal.
std::vector<int32_t> SqueezeBudgets(int32_t budget, std::span<const double> similarity);
// The rule's budgets when they are known before the sequence runs (uniform, pyramid); empty for
// squeeze (measured while the sequence runs: KvCache::AddLayerSimilarity) and for an unbounded
// budget.
std::vector<int32_t> LayerBudgetsBeforeRun(LayerBudgets rule, int32_t budget, int32_t num_layers);

// `targets` (any real values; below 1 counts as 1) rounded to integers >= 1 that sum exactly to
// `total` (>= targets.size()): the parts above 1 scaled to fit, then largest remainders first
// (ties the lower layer). Exposed for tests.
std::vector<int32_t> RoundBudgets(std::span<const double> targets, int64_t total);

}  // namespace heavykv
