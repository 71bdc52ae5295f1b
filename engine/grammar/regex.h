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
// ^a|b$, except inside a repeated group), \p{..} \P{..} of General_Category values (L, Lu,
// Letter, gc=Nd, ...: Unicode 15.0, unicode_properties.h) and Any, ASCII, AHex, Assigned.
// Annex B's leniencies hold: `{` that starts no quantifier, `]` and `}` are literals; [\w-.] is
// \w, '-' and '.'. Refused with INVALID_ARGUMENT naming the construct and its byte offset:
// backreferences, lookaround, \b \B, scripts and other properties, inline flags (?i), (?P<n>),
// {,n}, unknown letter escapes. RESOURCE_EXHAUSTED: counts past GrammarLimits::max_repeat,
// groups past max_depth.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/grammar/grammar.h"

namespace heavykv::grammar {

struct RegexOptions {
  // JSON Schema's `pattern` is unanchored (a match anywhere in the string): the expression is
  // then wrapped as .*(e).* unless it starts with ^ / ends with $. vLLM's regex is a full match.
  bool search = false;
  // Writes one code point of the sorted, disjoint `ranges` (a class, `.`, a literal, or any code
  // point around a search's match; surrogates may be inside the ranges and must never match).
  // Unset: its UTF-8 bytes (Utf8Class). A JSON Schema compiler may pass one that writes a JSON
  // string's character, escapes included, so that the pattern applies to the decoded string.
  std::function<GrammarBuilder::Expr(GrammarBuilder& b,
                                     const std::vector<std::pair<uint32_t, uint32_t>>& ranges)>
      code_point = nullptr;
};

absl::StatusOr<GrammarBuilder::Expr> CompileRegex(GrammarBuilder& b, std::string_view pattern,
                                                  const RegexOptions& options);

// Exactly one of `choices` (vLLM's structured_outputs.choice), as bytes; shared prefixes are
// written once, so the alternatives part byte by byte. No choices: matches nothing.
GrammarBuilder::Expr CompileChoice(GrammarBuilder& b, const std::vector<std::string>& choices);

}  // namespace heavykv::grammar
