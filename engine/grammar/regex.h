// Regular expressions -> Grammar (engine/grammar/grammar.h), for vLLM's structured_outputs.regex
// and JSON Schema's `pattern` and `format`s.
//
//   absl::StatusOr<GrammarBuilder::Expr> e = CompileRegex(builder, "[a-z]+@[a-z]+\\.com", {});
//
// The dialect is ECMA-262 (JSON Schema's) as people write it, over code points: literals and
// escapes (\n \t \r \f \v \0 \xHH \uHHHH \u{H..} \/ and escaped punctuation), `.`, classes
// [...] with ranges and negation, \d \w \s \D \W \S (ASCII \d \w; \s the ECMA white space),
// groups ( ), (?: ), named groups (?<n> ), alternation |, quantifiers * + ? {n} {n,} {n,m}
// (lazy forms match the same strings), anchors ^ and $ at the ends. Refused with
// INVALID_ARGUMENT naming the construct and its offset: backreferences, lookaround, \b \B,
// anchors inside, Unicode property escapes \p{..} (unless they compile exactly).
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "engine/grammar/grammar.h"

namespace heavykv::grammar {

struct RegexOptions {
  // JSON Schema's `pattern` is unanchored (a match anywhere in the string): the expression is
  // then wrapped as .*(e).* unless it starts with ^ / ends with $. vLLM's regex is a full match.
  bool search = false;
};

absl::StatusOr<GrammarBuilder::Expr> CompileRegex(GrammarBuilder& b, std::string_view pattern,
                                                  const RegexOptions& options);

}  // namespace heavykv::grammar
