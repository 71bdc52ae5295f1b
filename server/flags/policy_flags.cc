#include "server/flags/policy_flags.h"

namespace heavykv::cli {

void PolicyDefaultFlags::Register(FlagSet& flags) {
  flags.String("evict-granularity", &granularity_name,
               "token: a head evicts down to its budget every step; page: it grows to a page "
               "over the budget, then evicts whole pages of its least important tokens at once "
               "(a page more per sequence); for policy specs that name no granularity=");
  flags.String("layer-budgets", &layers_name,
               "uniform, pyramid (PyramidKV: budgets falling linearly with depth) or squeeze "
               "(SqueezeAttention: each layer measured while a sequence fills its budget), the "
               "same total per sequence; for policy specs that name no layers= (cpu only)");
}

absl::Status PolicyDefaultFlags::Resolve() {
  absl::StatusOr<EvictGranularity> g = ParseEvictGranularity(granularity_name);
  if (!g.ok()) return g.status();
  absl::StatusOr<LayerBudgets> l = ParseLayerBudgets(layers_name);
  if (!l.ok()) return l.status();
  granularity = *g;
  layers = *l;
  return absl::OkStatus();
}

}  // namespace heavykv::cli
