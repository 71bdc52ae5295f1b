// Request body fields the OpenAI front does not know: not read, refused or known to be harmless
// by any of its parsers (openai_json.cc, openai_sampling.cc, openai_constraint.cc,
// openai_tools.cc). They are ignored, and said so once: one warning line per request kind the
// first time each name is seen (docs/ARCHITECTURE.md "The sampling API"), never per request.
//
//   UnknownFieldLog log;                      // one per request kind
//   std::vector<std::string> names = log.Take(body);   // new unknown names, escaped; log them
#pragma once

#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "server/http/openai_json.h"

namespace heavykv::server {

// Whether some parser of the OpenAI front reads, refuses or deliberately accepts `name`.
bool IsKnownBodyField(absl::string_view name);

// The unknown names already reported. Bounded: after kMaxNames names nothing new is reported, so
// a client sending random keys cannot grow it (nor the log). Thread-safe.
class UnknownFieldLog {
 public:
  static constexpr size_t kMaxNames = 256;

  // The unknown keys of `body` (an object) not reported before, in body order, escaped and cut
  // to 64 bytes (client text in a log); they count as reported from now on.
  std::vector<std::string> Take(const nlohmann::ordered_json& body);

 private:
  std::mutex mu_;
  absl::flat_hash_set<std::string> reported_;  // raw names; at most kMaxNames
};

// Logs the new unknown fields of a `kind` request body in one spdlog warning line:
// "unknown fields ignored by /v1/chat/completions: foo, bar".
void WarnUnknownFields(ApiKind kind, const nlohmann::ordered_json& body);

}  // namespace heavykv::server
