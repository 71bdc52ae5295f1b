#include "server/grpc/reflection.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/impl/server_builder_option.h>

#include <algorithm>
#include <memory>
#include <vector>

namespace heavykv::server {
namespace {

class WithoutReflection final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    std::erase_if(*plugins, [](const std::unique_ptr<grpc::ServerBuilderPlugin>& p) {
      return dynamic_cast<grpc::reflection::ProtoServerReflectionPlugin*>(p.get()) != nullptr;
    });
  }
};

}  // namespace

void ConfigureReflection(grpc::ServerBuilder* builder, bool enabled) {
  if (enabled) {
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();  // idempotent
  } else {
    builder->SetOption(std::make_unique<WithoutReflection>());
  }
}

}  // namespace heavykv::server
