// The --evict-granularity and --layer-budgets flags that serve, run, eval and plan share: the
// defaults of the policy specs that name no granularity= or layers= of their own. Registered
// once, parsed in one place.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "memory/eviction_policy.h"
#include "server/flags/cli_flags.h"

namespace heavykv::cli {

struct PolicyDefaultFlags {
  std::string granularity_name = "token", layers_name = "uniform";
  // Set by Resolve.
  EvictGranularity granularity = EvictGranularity::kToken;
  LayerBudgets layers = LayerBudgets::kUniform;

  void Register(FlagSet& flags);
  // INVALID_ARGUMENT for an unknown granularity or layer-budget rule.
  absl::Status Resolve();
};

}  // namespace heavykv::cli
