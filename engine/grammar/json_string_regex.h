// A JSON Schema `pattern` as a grammar over the text of a JSON string (json_schema.h): the
// regular expression is matched against the DECODED string, so each code point it takes is
// written as json.dumps writes it inside the quotes (raw UTF-8, or \" \\ \n ... \u00xx).
// regex.h's CompileRegex matches raw text and cannot be embedded as is: a class that holds '"'
// would let the JSON string end early.
//
//   absl::StatusOr<StringRegex> r = CompileStringRegex(builder, "^[a-z]+-\\d{2}$");
//
// The expression becomes a Thompson automaton over code point sets, lowered to one rule per
// (state, length so far): right-linear, so matching never grows the parser's stack.
//
// The validators these schemas meet run Python's `re.search`, not ECMA-262; where the two
// differ this takes the intersection, so a match here is a match in both: \d \w \s are ASCII,
// \D \W \S and `.` take only what neither dialect excludes (ASCII for the negated escapes, no
// line terminators for `.`), `$` is the very end. Refused with INVALID_ARGUMENT (naming the
// construct and its offset): backreferences, lookaround, \b \B, anchors inside, flags, \p{..}.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/grammar/grammar.h"

namespace heavykv::grammar {

struct StringRegex {
  GrammarBuilder::Expr expr;  // the string's text between its quotes
};

// `search`: JSON Schema's unanchored semantics (a match anywhere unless anchored by ^ / $).
// Strings of min_length..max_length code points only (max -1: no bound): minLength and
// maxLength beside the pattern, compiled exactly as the pattern's automaton times a count.
absl::StatusOr<StringRegex> CompileStringRegex(GrammarBuilder& b, std::string_view pattern,
                                               bool search = true, int64_t min_length = 0,
                                               int64_t max_length = -1);

// Whether `pattern` (searched, as JSON Schema does) matches the decoded string `value`.
absl::StatusOr<bool> StringRegexMatches(std::string_view pattern, std::string_view value);

}  // namespace heavykv::grammar
