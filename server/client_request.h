// Shared by the gRPC clients (`heavykv generate`, `heavykv bench`): the request flags, the
// GenerateRequest they make, and the channel. Flags a user leaves unset stay unset in the
// request, so the server's defaults apply.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "heavykv/v1/generation.pb.h"
#include "server/cli_flags.h"

namespace heavykv::cli {

struct RequestFlags {
  int64_t max_tokens = 64;
  double temperature = 1, top_p = 1, recent_fraction = 0.5;
  int64_t top_k = 0, seed = 0;
  std::string policy, kv_budget, stop;
  bool ignore_eos = false, logprobs = false;
};

// Registers --max-tokens, --temperature, --top-p, --top-k, --seed, --policy, --kv-budget,
// --recent-fraction, --stop (comma-separated), --ignore-eos, --logprobs.
void AddRequestFlags(FlagSet& flags, RequestFlags* f);

// Fills everything but the input. INVALID_ARGUMENT for a --kv-budget that is not a token count
// or a fraction.
absl::Status FillRequest(const FlagSet& flags, const RequestFlags& f, v1::GenerateRequest* out);

std::shared_ptr<grpc::Channel> Connect(const std::string& address);

// "RESOURCE_EXHAUSTED", "INVALID_ARGUMENT", ...
std::string StatusCodeName(grpc::StatusCode code);

}  // namespace heavykv::cli
