// The chat template's variables that come from JSON (engine/chat/chat_template.h): the messages
// with their tool calls, `tools` and chat_template_kwargs, as Python values the way json.loads
// makes them.
//
//   absl::StatusOr<jinja::Value> tools = jinja::ValueFromJson(opts.tools_json, "tools");
#pragma once

#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/chat/chat_template.h"
#include "engine/chat/chat_template_value.h"

namespace heavykv::jinja {

// The value of JSON text: objects are dicts in the text's key order, integers ints (past 64 bits:
// floats), numbers with a fraction or an exponent floats. INVALID_ARGUMENT naming `what` when the
// text is not JSON or nests past 256 levels.
absl::StatusOr<Value> ValueFromJson(std::string_view text, std::string_view what);

// `messages`: each a dict {role, content} (content None when content_null), with tool_calls
// [{id, type, function: {name, arguments}}] (arguments parsed: vLLM's rule), tool_call_id, name
// and reasoning_content where set. INVALID_ARGUMENT for arguments that are not a JSON object.
absl::StatusOr<Value> MessagesValue(const std::vector<ChatMessage>& messages);

}  // namespace heavykv::jinja
