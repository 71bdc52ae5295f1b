// Server reflection behind `heavykv serve --reflection`.
//
//   grpc::ServerBuilder builder;
//   ConfigureReflection(&builder, reflection);  // before BuildAndStart()
//
// Linking grpc++_reflection registers its builder plugin for every server at static
// initialisation, so not calling InitProtoReflectionServerBuilderPlugin() is not enough to turn
// reflection off: when disabled, a ServerBuilderOption removes the plugin from this builder, and
// the method answers UNIMPLEMENTED like any unknown one.
#pragma once

#include <grpcpp/grpcpp.h>

namespace heavykv::server {

void ConfigureReflection(grpc::ServerBuilder* builder, bool enabled);

}  // namespace heavykv::server
