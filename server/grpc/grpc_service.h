// GenerationService: the heavykv.v1.Generation gRPC service (callback API), a thin layer over
// the Engine. Generate gets one ServerWriteReactor per call (grpc route_guide_callback_server
// style): the engine thread queues deltas into it and it writes them one at a time; a client that
// cancels, disconnects or passes its deadline cancels the engine request, which frees its pages.
//
//   GenerationService service(engine.get(), {"full", "1"}, on_rejected,
//                             [&keys](auto& context, auto method) {
//                               return keys.CheckCall(context, method);
//                             });
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
#include <string_view>

#include "engine/serving/engine.h"
#include "heavykv/v1/generation.grpc.pb.h"
#include "server/common/rejection_observer.h"

namespace heavykv::server {

struct ServiceDefaults {
  std::string policy = "full";  // what an unset kv.policy / kv budget means; for logs and info
  std::string budget = "1";
};

// Decides whether a call may run (e.g. ApiKeyStore::CheckCall); `method` is its short name,
// "Generate". Runs first, on the gRPC thread; a non-OK status is the call's status and the
// call does no work. Must be thread-safe.
using CallAuthenticator =
    std::function<absl::Status(const grpc::CallbackServerContext&, std::string_view method)>;

class GenerationService final : public v1::Generation::CallbackService {
 public:
  GenerationService(Engine* engine, ServiceDefaults defaults,
                    RejectionObserver on_rejected = nullptr,
                    CallAuthenticator authenticate = nullptr);

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::ServerWriteReactor<v1::GenerateResponse>* Chat(grpc::CallbackServerContext* context,
                                                      const v1::ChatRequest* request) override;
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
  // OK, or the refusal (counted by on_rejected_) when authenticate_ denies the call.
  absl::Status Authenticate(const grpc::CallbackServerContext& context, std::string_view method);
  // The call's default reactor, finished with the refusal, when authenticate_ denies the call;
  // null when it may run.
  grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* context, std::string_view method);
  // Generate and Chat: authenticates, converts, submits; one reactor streams the deltas.
  template <typename Request>
  grpc::ServerWriteReactor<v1::GenerateResponse>* StartGeneration(
      grpc::CallbackServerContext* context, const Request& request, std::string_view method);
  // Who the scheduler shares the batch between: with API keys, the key (as a hash, so no copy of
  // it lives on: every connection of one key is one client); without, the connection.
  std::string ClientOf(const grpc::CallbackServerContext& context) const;

  Engine* engine_;
  ServiceDefaults defaults_;
  RejectionObserver on_rejected_;
  CallAuthenticator authenticate_;
  std::atomic<int64_t> next_request_ = 1;  // for ids the client left empty
};

}  // namespace heavykv::server
