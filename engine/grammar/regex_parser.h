// The syntax of regex.h's patterns: ParseRegex reads an ECMA-262 pattern (the dialect regex.h
// describes) into a tree over code points, refusing what cannot be compiled exactly. regex.cc
// lowers the tree to a grammar; nothing else should need this header.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/grammar/grammar.h"

namespace heavykv::grammar {

// One node of a parsed pattern; kids are indices into RegexTree::nodes.
struct RegexNode {
  enum class Kind : uint8_t { kEmpty, kChars, kSeq, kAlt, kRepeat, kStart, kEnd };
  Kind kind = Kind::kEmpty;
  // kChars: sorted, disjoint, merged code point ranges (empty: matches nothing).
  std::vector<std::pair<uint32_t, uint32_t>> chars;
  std::vector<int> kids;     // kSeq, kAlt, kRepeat (one)
  int32_t min = 1, max = 1;  // kRepeat (max -1: unbounded; never {1,1} or {0,0})
  bool has_start = false;    // a ^ somewhere inside
  bool has_end = false;      // a $ somewhere inside
};

// Invariants: a kRepeat whose kid has an anchor has max 1 (the parser refuses the rest); in a
// kSeq with an anchor, the anchor-free runs of items are grouped into one kSeq kid each.
struct RegexTree {
  std::vector<RegexNode> nodes;
  int root = 0;
};

// INVALID_ARGUMENT naming the construct and its byte offset; RESOURCE_EXHAUSTED past
// limits.max_repeat or limits.max_depth.
absl::StatusOr<RegexTree> ParseRegex(std::string_view pattern, const GrammarLimits& limits);

}  // namespace heavykv::grammar
