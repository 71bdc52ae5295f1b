// The one place where an absl::Status becomes an HTTP status and an OpenAI error object
// ({"error": {"message", "type", "param", "code"}}), beside grpc_status.h for gRPC. Engine and
// parser messages already say what the client should change; the engine's, which name heavykv.v1
// fields, are put in the OpenAI API's terms (openai_names.h), field and message.
//
//   absl::Status s = WithParam(absl::InvalidArgumentError("n must be 1"), "n");
//   HttpError e = ToHttpError(s.code());   // {400, "invalid_request_error"}
//   res.status = e.status;
//   res.set_content(ErrorBody(s), "application/json");
//
// The mapping (docs/ARCHITECTURE.md, "OpenAI HTTP API"): INVALID_ARGUMENT, OUT_OF_RANGE and
// FAILED_PRECONDITION 400, UNAUTHENTICATED 401, PERMISSION_DENIED 403, NOT_FOUND 404,
// RESOURCE_EXHAUSTED 429, UNAVAILABLE 503, DEADLINE_EXCEEDED 504, anything else 500.
#pragma once

#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"

namespace heavykv::server {

struct HttpError {
  int status = 500;
  std::string type;  // OpenAI's error type: invalid_request_error, rate_limit_error, ...
};

HttpError ToHttpError(absl::StatusCode code);

// `status` with the request field it is about (the error object's `param`).
absl::Status WithParam(absl::Status status, absl::string_view param);
// `status` with an OpenAI error code (e.g. "model_not_found") instead of the code's name.
absl::Status WithErrorCode(absl::Status status, absl::string_view code);

// The error object of `status` (not OK) as compact JSON text: its message (OpenAiMessage), the
// type of ToHttpError, `param` (WithParam's, else the OpenAiParam of the engine's request field,
// else null) and `code` (WithErrorCode's, else the status code's name in lower case, e.g.
// "invalid_argument").
std::string ErrorBody(const absl::Status& status);

}  // namespace heavykv::server
