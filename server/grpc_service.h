// GenerationService: the heavykv.v1.Generation gRPC service (callback API), a thin layer over
// the Engine. Generate gets one ServerWriteReactor per call (grpc route_guide_callback_server
// style): the engine thread queues deltas into it and it writes them one at a time; a client that
// cancels, disconnects or passes its deadline cancels the engine request, which frees its pages.
//
//   GenerationService service(engine.get(), {"full", "1"});
//   grpc::ServerBuilder builder;
//   builder.RegisterService(&service);
//
// The engine must outlive the server's last call (shut the engine down before the server).
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "engine/engine.h"
#include "heavykv/v1/generation.grpc.pb.h"

namespace heavykv::server {

struct ServiceDefaults {
  std::string policy = "full";  // what an unset kv.policy / kv budget means; for logs and info
  std::string budget = "1";
};

// Told of every Generate call refused before it ran, with its status code (gRPC threads).
using RejectionObserver = std::function<void(absl::StatusCode)>;

class GenerationService final : public v1::Generation::CallbackService {
 public:
  GenerationService(Engine* engine, ServiceDefaults defaults,
                    RejectionObserver on_rejected = nullptr);

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest* request,
                                         v1::ModelInfo* response) override;
  grpc::ServerUnaryReactor* GetCacheStats(grpc::CallbackServerContext* context,
                                          const v1::GetCacheStatsRequest* request,
                                          v1::CacheStats* response) override;

 private:
  Engine* engine_;
  ServiceDefaults defaults_;
  RejectionObserver on_rejected_;
  std::atomic<int64_t> next_request_ = 1;  // for ids the client left empty
};

}  // namespace heavykv::server
