// The structured-output fields of an OpenAI-style request body -> the engine's ConstraintSpec
// (docs/ARCHITECTURE.md "Structured outputs"). Served, one at most per request:
//   response_format       OpenAI: {type: text | json_object | json_schema {name, schema,
//                         strict, description}}; json_object may carry `schema` (vLLM,
//                         llama.cpp)
//   json_schema, grammar  llama.cpp's server: a schema object; a GBNF grammar string
//   structured_outputs    vLLM: {json | regex | choice | grammar | json_object}
//   guided_json, guided_regex, guided_choice, guided_grammar   vLLM's older names
// Refused by name: vLLM's structural_tag and whitespace patterns, and any second constraint.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "engine/grammar/constraint_spec.h"
#include "nlohmann/json.hpp"

namespace heavykv::server {

// Reads the fields of `body` (parsed as ordered_json: schemas keep their key order) into `spec` (left kNone when the body asks for none) and `param`
// (the field it came from, for errors the engine reports later). INVALID_ARGUMENT with the
// field as the status's param for a malformed field or two constraints.
absl::Status ReadConstraintFields(const nlohmann::ordered_json& body, grammar::ConstraintSpec& spec,
                                  std::string& param);

}  // namespace heavykv::server
