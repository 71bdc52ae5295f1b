#include "memory/layer_budgets.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "memory/eviction_policy.h"

namespace heavykv {

absl::StatusOr<LayerBudgets> ParseLayerBudgets(absl::string_view text) {
  if (text == "uniform") return LayerBudgets::kUniform;
  if (text == "pyramid") return LayerBudgets::kPyramid;
  if (text == "squeeze") return LayerBudgets::kSqueeze;
  return absl::InvalidArgumentError(
      absl::StrCat("layer budgets must be uniform, pyramid or squeeze, got \"", text, "\""));
}

absl::string_view LayerBudgetsName(LayerBudgets rule) {
  switch (rule) {
    case LayerBudgets::kPyramid: return "pyramid";
    case LayerBudgets::kSqueeze: return "squeeze";
    case LayerBudgets::kUniform: break;
  }
  return "uniform";
}

std::vector<int32_t> RoundBudgets(std::span<const double> targets, int64_t total) {
  const int64_t n = static_cast<int64_t>(targets.size());
  std::vector<double> t(targets.begin(), targets.end());
  // Every layer keeps one token; the parts above it are scaled to share total - n.
  double above = 0;
  for (double& x : t) {
    x = std::max(1.0, x);
    above += x - 1.0;
  }
  const double scale = above > 0 ? double(total - n) / above : 0.0;
  std::vector<int32_t> out(n);
  std::vector<double> frac(n);
  int64_t sum = 0;
  for (int64_t l = 0; l < n; ++l) {
    const double x = above > 0 ? 1.0 + (t[l] - 1.0) * scale : double(total) / double(n);
    out[l] = static_cast<int32_t>(std::floor(x));
    frac[l] = x - std::floor(x);
    sum += out[l];
  }
  // Floating-point rounding may leave the sum a unit off either way; the remainders settle it.
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return frac[a] > frac[b]; });
  for (int64_t i = 0; sum < total; i = (i + 1) % n, ++sum) ++out[order[i]];
  for (int64_t i = n - 1; sum > total; i = (i + n - 1) % n) {
    if (out[order[i]] > 1) {
      --out[order[i]];
      --sum;
    }
  }
  return out;
}

std::vector<int32_t> PyramidBudgets(int32_t budget, int32_t num_layers) {
  const int64_t total = int64_t(budget) * num_layers;
  if (num_layers == 1) return {budget};
  const double last = budget / kPyramidBeta, first = 2.0 * budget - last;
  std::vector<double> t(num_layers);
  for (int32_t l = 0; l < num_layers; ++l) {
    t[l] = first + (last - first) * double(l) / double(num_layers - 1);
  }
  return RoundBudgets(t, total);
}

std::vector<int32_t> SqueezeBudgets(int32_t budget, std::span<const double> similarity) {
  const int32_t n = static_cast<int32_t>(similarity.size());
  const int64_t total = int64_t(budget) * n;
  std::vector<double> sorted(similarity.begin(), similarity.end());
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  const int32_t k = std::min<int32_t>(3, static_cast<int32_t>(sorted.size()));
  if (k < 2) return std::vector<int32_t>(n, budget);
  // One-dimensional k-means (Lloyd), started at evenly spaced quantiles of the distinct values:
  // deterministic, and on a few dozen layers it settles in a handful of rounds.
  std::vector<double> centre(k);
  for (int32_t c = 0; c < k; ++c) {
    centre[c] = sorted[(sorted.size() - 1) * (2 * c + 1) / (2 * k)];
  }
  std::vector<int32_t> group(n, 0);
  for (int32_t round = 0; round < 100; ++round) {
    bool moved = false;
    for (int32_t l = 0; l < n; ++l) {
      int32_t best = 0;
      for (int32_t c = 1; c < k; ++c) {
        if (std::abs(similarity[l] - centre[c]) < std::abs(similarity[l] - centre[best])) best = c;
      }
      moved |= best != group[l];
      group[l] = best;
    }
    for (int32_t c = 0; c < k; ++c) {
      double sum = 0;
      int32_t count = 0;
      for (int32_t l = 0; l < n; ++l) {
        if (group[l] == c) {
          sum += similarity[l];
          ++count;
        }
      }
      if (count > 0) centre[c] = sum / count;
    }
    if (!moved && round > 0) break;
  }
  // The group with the highest similarity is the one whose attention matters least.
  const int32_t least = static_cast<int32_t>(std::max_element(centre.begin(), centre.end()) -
                                             centre.begin());
  int32_t num_least = 0;
  for (int32_t g : group) num_least += g == least;
  if (num_least == 0 || num_least == n) return std::vector<int32_t>(n, budget);
  const double low = kSqueezeFraction * budget;
  const double high = (double(total) - low * num_least) / double(n - num_least);
  std::vector<double> t(n);
  for (int32_t l = 0; l < n; ++l) t[l] = group[l] == least ? low : high;
  return RoundBudgets(t, total);
}

std::vector<int32_t> LayerBudgetsBeforeRun(LayerBudgets rule, int32_t budget,
                                           int32_t num_layers) {
  if (budget >= kUnboundedBudget || rule == LayerBudgets::kSqueeze) return {};
  if (rule == LayerBudgets::kPyramid) return PyramidBudgets(budget, num_layers);
  return std::vector<int32_t>(num_layers, budget);
}

}  // namespace heavykv
