// RejectionObserver: how both fronts (gRPC, server/grpc/grpc_service.h; the OpenAI HTTP API,
// server/http/openai_http.h) tell the server of a request they refused before it ran, so that
// one place (cmd_serve wires it to server/common/metrics.h) counts refusals by status code.
#pragma once

#include <functional>

#include "absl/status/status.h"

namespace heavykv::server {

// Told of every call refused before it ran (any Generate refusal; an unauthenticated call to any
// method), with its status code. Called on the front's request threads: must be thread-safe.
using RejectionObserver = std::function<void(absl::StatusCode)>;

}  // namespace heavykv::server
