// The one place where an absl::Status becomes a grpc::Status (TF Serving grpc_status_util).
// The canonical codes share their numbers, so the code is kept as is and the message passed on
// unchanged: engine messages already say what the client should change.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace heavykv::server {

grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace heavykv::server
