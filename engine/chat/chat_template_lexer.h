// The tokens of a chat template (engine/chat/chat_template_ast.h's parser reads them): text between
// tags with jinja2's whitespace control already applied (`-` on a tag, trim_blocks,
// lstrip_blocks), and the tokens inside `{{ }}` / `{% %}`. Comments are dropped.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/chat/chat_template_value.h"

namespace heavykv::jinja {

struct Token {
  enum class Kind { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kLiteral, kOp, kEof };
  Kind kind = Kind::kEof;
  std::string text;  // kText: the text; kName: the name; kOp: the operator
  Value literal;     // kLiteral: a string, int or float
  int line = 0;
  int column = 0;
};

// INVALID_ARGUMENT with the line and column for an unterminated tag, comment or string, or a
// character that is no token.
absl::StatusOr<std::vector<Token>> LexTemplate(std::string_view source);

}  // namespace heavykv::jinja
