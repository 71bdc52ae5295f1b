// Shared by the gRPC clients (`heavykv generate`, `heavykv bench`): the request flags, the
// GenerateRequest or ChatRequest they make, and the connection (address, TLS, API key). Flags a
// user leaves unset stay unset in the request, so the server's defaults apply.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "heavykv/v1/generation.pb.h"
#include "server/common/tls.h"
#include "server/flags/cli_flags.h"
#include "server/flags/sampling_flags.h"

namespace heavykv::cli {

struct RequestFlags {
  int64_t max_tokens = 64;
  double temperature = 1, top_p = 1, recent_fraction = 0.5;
  int64_t top_k = 0, seed = 0, top_logprobs = 0;
  int64_t prompt_logprobs = -1;  // -1: unset
  std::string policy, kv_budget, stop;
  bool ignore_eos = false, logprobs = false, keep_special_tokens = false;
  SamplingApiFlags sampling;  // --min-p, the penalties, --logit-bias, --min-tokens
  int64_t n = 1;              // choices
};

// Registers --max-tokens, --temperature, --top-p, --top-k, --seed, the sampling API's flags
// (sampling_flags.h), --policy, --kv-budget, --recent-fraction, --stop (comma-separated),
// --ignore-eos, --logprobs, --top-logprobs, --prompt-logprobs, --keep-special-tokens, --n.
void AddRequestFlags(FlagSet& flags, RequestFlags* f);

// Fills everything but the input (the prompt, or the chat's messages). INVALID_ARGUMENT for a
// --kv-budget that is not a token count or a fraction, or a malformed --logit-bias.
absl::Status FillRequest(const FlagSet& flags, const RequestFlags& f, v1::GenerateRequest* out);
absl::Status FillRequest(const FlagSet& flags, const RequestFlags& f, v1::ChatRequest* out);

struct ConnectionFlags {
  std::string address = "127.0.0.1:50051";
  server::ClientTls tls;
  std::string api_key;  // empty: the environment's HEAVYKV_API_KEY, if any
};

// Registers --server, --tls-ca, --tls-cert, --tls-key, --tls-server-name, --api-key.
void AddConnectionFlags(FlagSet& flags, ConnectionFlags* f);

// The channel to f->address (TLS with --tls-ca). Fills f->api_key from HEAVYKV_API_KEY when
// --api-key was not given. INVALID_ARGUMENT / NOT_FOUND for bad TLS flags or files.
// `own_connection` as server::ClientChannel.
absl::StatusOr<std::shared_ptr<grpc::Channel>> Connect(ConnectionFlags* f,
                                                       bool own_connection = false,
                                                       int window_bytes = 0);

// Adds `authorization: Bearer KEY` to a call when there is a key.
void Authorize(const ConnectionFlags& f, grpc::ClientContext* context);

// "RESOURCE_EXHAUSTED", "INVALID_ARGUMENT", ...
std::string StatusCodeName(grpc::StatusCode code);

}  // namespace heavykv::cli
