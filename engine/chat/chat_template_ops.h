// Python's operators on chat-template values (engine/chat/chat_template_value.h), charging the
// strings and lists they build to the render's Budget.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "engine/chat/chat_template_builtins.h"
#include "engine/chat/chat_template_value.h"

namespace heavykv::jinja {

// a op b for + - * / // % ** ~: numbers (ints stay 64-bit; overflow is an error), str and list
// concatenation and repetition, ~ on any values' str(). INVALID_ARGUMENT for undefined operands
// (except with ~) and type mismatches, as Python's TypeError.
absl::StatusOr<Value> BinaryOp(const std::string& op, const Value& a, const Value& b,
                               Budget* budget);

// obj[start:stop:step] of a str (by code point) or list/tuple, Python's index rules; `given`
// says which of bounds[] were written.
absl::StatusOr<Value> SliceOf(const Value& obj, const int64_t bounds[3], const bool given[3],
                              Budget* budget);

}  // namespace heavykv::jinja
