// The OpenAI HTTP API (POST /v1/completions, /v1/chat/completions, /tokenize, /detokenize; GET
// /v1/models, /v1/models/{id}, /health, /version, /metrics; OPTIONS with CORS) on an HttpServer, over the same Engine as gRPC. The contract (field
// mapping, SSE framing, errors, threading, limits) is docs/ARCHITECTURE.md "OpenAI HTTP API";
// the JSON is server/http/openai_json.h, the error mapping server/http/http_status.h.
//
//   auto draining = std::make_shared<std::atomic<bool>>(false);
//   absl::StatusOr<std::unique_ptr<HttpServer>> http = StartOpenAiHttp(engine.get(), options,
//                                                                      draining);
//   ... on SIGTERM: *draining = true; engine->Shutdown(grace); (*http)->Stop();
//
// No thread waits for a generation: a handler submits and returns, the engine's callback queues
// deltas and posts a formatting job to the server's CPU pool, and a client that goes cancels the
// engine request (docs/ARCHITECTURE.md "OpenAI HTTP API", "Threading"). The engine must outlive
// the server.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/serving/engine.h"
#include "server/common/auth.h"
#include "server/common/metrics.h"
#include "server/common/rejection_observer.h"
#include "server/http/cors.h"
#include "server/http/http_server.h"

namespace heavykv::server {

struct OpenAiHttpOptions {
  std::string address = "0.0.0.0:8000";
  std::string model_name;  // what /v1/models lists and `model` must be (when sent)
  int threads = 2;         // the CPU pool: parsing, tokenize endpoints, formatting events
  absl::Duration header_timeout = absl::Seconds(10);
  absl::Duration body_timeout = absl::Seconds(30);
  absl::Duration idle_timeout = absl::Seconds(5);
  // A response write that makes no progress for this long ends the connection (a stream's
  // generation is cancelled); the engine's own stall timeout should be the same
  // (`--stream-stall-timeout`).
  absl::Duration write_timeout = absl::Seconds(30);
  int max_connections = 16384;
  int max_connections_per_client = 4096;
  const ApiKeyStore* api_keys = nullptr;  // not owned; null: no key is asked for
  RejectionObserver on_rejected;          // every refused generation request's code; may be empty
  std::shared_ptr<const Metrics> metrics;  // GET /metrics; null: no such route
  CorsPolicy cors;                         // --http-cors-origins; off by default
};

absl::StatusOr<std::unique_ptr<HttpServer>> StartOpenAiHttp(
    Engine* engine, const OpenAiHttpOptions& options,
    std::shared_ptr<const std::atomic<bool>> draining);

}  // namespace heavykv::server
