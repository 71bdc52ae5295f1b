// The sampling API's flags (docs/ARCHITECTURE.md "The sampling API"), shared by the commands that
// sample: `heavykv generate` and `bench` (through client_request.h) and `heavykv run`.
//
//   SamplingApiFlags sampling;
//   sampling.Register(flags);            // --min-p, --presence-penalty, ..., --logit-bias
//   ... flags.Parse(...)
//   absl::Status s = sampling.Fill(flags, request);  // the GenerationRequest fields set
//
// Flags left unset leave their field unset, so the server's defaults (all off) apply. Ranges are
// the engine's to check (request_validation.h CheckSamplingApi), as for any client.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/serving/engine.h"
#include "server/flags/cli_flags.h"

namespace heavykv::cli {

struct SamplingApiFlags {
  double min_p = 0, presence_penalty = 0, frequency_penalty = 0, repetition_penalty = 1;
  int64_t penalty_last_n = -1, min_tokens = 0;
  std::string logit_bias;  // ID=BIAS[,ID=BIAS...]

  // --min-p, --presence-penalty, --frequency-penalty, --repetition-penalty, --penalty-last-n,
  // --logit-bias, --min-tokens.
  void Register(FlagSet& flags);
  // The set flags into `r`. INVALID_ARGUMENT naming the flag for a malformed --logit-bias or an
  // integer outside int32.
  absl::Status Fill(const FlagSet& flags, GenerationRequest& r) const;
};

// "ID=BIAS[,ID=BIAS...]" -> (id, bias) in the order given; INVALID_ARGUMENT for anything else.
absl::StatusOr<std::vector<std::pair<int32_t, float>>> ParseLogitBias(absl::string_view text);

}  // namespace heavykv::cli
