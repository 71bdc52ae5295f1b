#include "server/grpc/grpc_status.h"

#include <string>

namespace heavykv::server {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode are both the canonical codes (0..16).
  const int code = static_cast<int>(status.code());
  const grpc::StatusCode grpc_code = code >= grpc::StatusCode::OK && code <= grpc::UNAUTHENTICATED
                                         ? static_cast<grpc::StatusCode>(code)
                                         : grpc::StatusCode::UNKNOWN;
  return grpc::Status(grpc_code, std::string(status.message()));
}

}  // namespace heavykv::server
