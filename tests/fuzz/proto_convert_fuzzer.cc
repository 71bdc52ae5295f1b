// Fuzzes the gRPC request path up to the engine: the input is a serialized
// heavykv.v1.GenerateRequest, converted with server::FromProto (server/grpc/proto_convert.h) and,
// when that succeeds, resolved by the bundled model's RequestValidator, as Generate does. Neither
// may crash; a rejection is INVALID_ARGUMENT; an accepted request keeps the validator's promises.
#include <cstddef>
#include <cstdint>

#include "google/protobuf/stubs/logging.h"
#include "heavykv/v1/generation.pb.h"
#include "server/grpc/proto_convert.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  // Parsing logs every string field with invalid UTF-8 at ERROR; a fuzzer sends thousands.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const heavykv::fuzz::BundledServer* server = new heavykv::fuzz::BundledServer();
  heavykv::v1::GenerateRequest proto;
  if (!proto.ParseFromArray(data, static_cast<int>(size))) return 0;
  absl::StatusOr<heavykv::GenerationRequest> q = heavykv::server::FromProto(proto);
  if (!q.ok()) {
    if (q.status().code() != absl::StatusCode::kInvalidArgument) {
      heavykv::fuzz::Die("FromProto failed with a code other than INVALID_ARGUMENT");
    }
    return 0;
  }
  absl::StatusOr<heavykv::ResolvedRequest> r = server->validator->Resolve(*q);
  if (r.ok()) {
    heavykv::fuzz::CheckResolved(*server, *r);
  } else if (r.status().code() != absl::StatusCode::kInvalidArgument) {
    heavykv::fuzz::Die("Resolve rejected a request with a code other than INVALID_ARGUMENT");
  }
  return 0;
}
