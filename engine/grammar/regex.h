// Regular expressions -> Grammar (engine/grammar/grammar.h), for vLLM's structured_outputs.regex
// and JSON Schema's `pattern` and `format`s.
//
//   absl::StatusOr<GrammarBuilder::Expr> e = CompileRegex(builder, "[a-z]+@[a-z]+\\.com", {});
//
// The dialect is ECMA-262 (JSON Schema's) as people write it, over code points: literals and
// escapes (\n \t \r \f \v \0 \xHH \uHHHH \u{H..} \/ and escaped punctuation), `.`, classes
// [...] with ranges and negation, \d \w \s \D \W \S (ASCII \d \w; \s the ECMA white space),
// groups ( ), (?: ), named groups (?<n> ), alternation |, quantifiers * + ? {n} {n,} {n,m}
// (lazy forms match the same strings), anchors ^ and $ (wherever they stand, as in (^|,)x or
// ^a|b$, except inside a repeated group), \p{ASCII} \p{Any} \p{AHex}. Annex B's leniencies
// hold: `{` that starts no quantifier, `]` and `}` are literals; [\w-.] is \w, '-' and '.'.
// Refused with INVALID_ARGUMENT naming the construct and its byte offset: backreferences,
// lookaround, \b \B, other \p{..}, inline flags (?i), (?P<n>), {,n}, unknown letter escapes.
// RESOURCE_EXHAUSTED: counts past GrammarLimits::max_repeat, groups past max_depth.
#pragma once

#include <string>
#include <string_view>
#include <vector>

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

// Exactly one of `choices` (vLLM's structured_outputs.choice), as bytes; shared prefixes are
// written once, so the alternatives part byte by byte. No choices: matches nothing.
GrammarBuilder::Expr CompileChoice(GrammarBuilder& b, const std::vector<std::string>& choices);

}  // namespace heavykv::grammar
