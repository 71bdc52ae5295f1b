// llama.cpp's GBNF grammars -> Grammar (engine/grammar/grammar.h), for the `grammar` request
// field of llama.cpp's server and vLLM's structured_outputs.grammar.
//
//   absl::StatusOr<Grammar> g = CompileGbnf(text, /*root=*/"root", limits);
//
// The dialect is llama.cpp's grammars/README.md: rules `name ::= ...` over several lines,
// comments `#`, literals "..." with escapes (\n \t \r \\ \" \xHH \uHHHH \UHHHHHHHH), character
// classes [...] / [^...] over code points, `.`, groups, |, * + ?, {n} {n,} {n,m}, and rule
// names with letters, digits and '-'. A newline ends a rule except inside parentheses or after
// `::=` or `|`, as in llama.cpp. Token references (<[id]>, <|name|>) are refused, and so is a
// rule defined twice (llama.cpp keeps the last definition silently). INVALID_ARGUMENT names the
// line, column and what is wrong (undefined rule, no root, left recursion, ...);
// RESOURCE_EXHAUSTED past the limits (a count past max_repeat, groups past max_depth).
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "engine/grammar/grammar.h"

namespace heavykv::grammar {

absl::StatusOr<Grammar> CompileGbnf(std::string_view text, std::string_view root = "root",
                                    const GrammarLimits& limits = {});

}  // namespace heavykv::grammar
