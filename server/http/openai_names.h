// How the OpenAI HTTP front names the engine's request fields: the engine's refusals name
// heavykv.v1 fields (engine/serving/request_field.h: `max_new_tokens`, `prompt_token_ids`,
// `kv.recent_fraction`, ...), which an HTTP client never sent. One table (openai_names.cc,
// kOpenAiNames) gives each its OpenAI name; ErrorBody (http_status.h) applies it to every error
// object, so no route or stream has to (docs/ARCHITECTURE.md, "Field names in errors").
//
//   OpenAiParam("max_new_tokens");                          // "max_tokens"
//   OpenAiMessage("max_new_tokens must be in [1, 512]");    // "max_tokens must be in [1, 512]"
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace heavykv::server {

// The OpenAI `param` of a heavykv.v1 field path; a path the table does not hold (a name both APIs
// share, such as `stop` or `messages[2].role`) is its own param; "" for "".
std::string OpenAiParam(absl::string_view request_field);

// `message` with every heavykv.v1 field name (whole names only) and gRPC-only advice ("send token
// ids (prompt_token_ids)", "(Generate)") in the OpenAI API's terms.
std::string OpenAiMessage(absl::string_view message);

}  // namespace heavykv::server
