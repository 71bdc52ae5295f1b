// The request field a refusal is about, carried in the absl::Status beside its message, so each
// front can name the field its own way (docs/ARCHITECTURE.md, "Field names in errors").
//
//   return WithRequestField(absl::InvalidArgumentError("max_new_tokens must be in [1, 512]"),
//                           "max_new_tokens");
//   RequestFieldOf(status);  // "max_new_tokens"; "" when the status names no field
//
// The field is its path in heavykv.v1 (proto/heavykv/v1/generation.proto): `max_new_tokens`,
// `prompt`, `prompt_token_ids`, `messages`, `sampling.temperature`, `kv.budget_tokens`, ...; the
// engine's messages use the same names. The gRPC front passes both on; the OpenAI front maps them
// (server/http/openai_names.h).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"

namespace heavykv {

inline constexpr absl::string_view kRequestFieldPayload = "type.heavykv.dev/request.field";

inline absl::Status WithRequestField(absl::Status status, absl::string_view field) {
  if (!status.ok()) status.SetPayload(kRequestFieldPayload, absl::Cord(field));
  return status;
}

inline std::string RequestFieldOf(const absl::Status& status) {
  const auto field = status.GetPayload(kRequestFieldPayload);
  return field ? std::string(*field) : std::string();
}

}  // namespace heavykv
