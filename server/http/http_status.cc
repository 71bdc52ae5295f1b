#include "server/http/http_status.h"

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "engine/serving/request_field.h"
#include "nlohmann/json.hpp"
#include "server/http/openai_names.h"

namespace heavykv::server {
namespace {

constexpr absl::string_view kParamPayload = "type.heavykv.dev/openai.param";
constexpr absl::string_view kCodePayload = "type.heavykv.dev/openai.code";

}  // namespace

HttpError ToHttpError(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:  // e.g. no chat template: vLLM answers 400 too
      return {400, "invalid_request_error"};
    case absl::StatusCode::kUnauthenticated:
      return {401, "authentication_error"};
    case absl::StatusCode::kPermissionDenied:
      return {403, "permission_error"};
    case absl::StatusCode::kNotFound:
      return {404, "not_found_error"};
    case absl::StatusCode::kResourceExhausted:
      return {429, "rate_limit_error"};
    case absl::StatusCode::kUnavailable:
      return {503, "service_unavailable_error"};
    case absl::StatusCode::kDeadlineExceeded:
      return {504, "timeout_error"};
    default:
      return {500, "server_error"};
  }
}

absl::Status WithParam(absl::Status status, absl::string_view param) {
  status.SetPayload(kParamPayload, absl::Cord(param));
  return status;
}

absl::Status WithErrorCode(absl::Status status, absl::string_view code) {
  status.SetPayload(kCodePayload, absl::Cord(code));
  return status;
}

std::string ErrorBody(const absl::Status& status) {
  const auto param = status.GetPayload(kParamPayload);
  const auto code = status.GetPayload(kCodePayload);
  // The front's own param, else the engine's field in OpenAI's name (openai_names.h).
  const std::string field = param ? std::string(*param) : OpenAiParam(RequestFieldOf(status));
  nlohmann::json error = {
      {"message", OpenAiMessage(status.message())},
      {"type", ToHttpError(status.code()).type},
      {"param", field.empty() ? nlohmann::json(nullptr) : nlohmann::json(field)},
      {"code", code ? std::string(*code)
                    : absl::AsciiStrToLower(absl::StatusCodeToString(status.code()))},
  };
  return nlohmann::json{{"error", std::move(error)}}.dump(
      -1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace heavykv::server
