// Utf8Class: a class of code points as a deterministic UTF-8 byte trie, for the compilers into
// the byte grammar (grammar.h). GrammarBuilder::CodePoints writes one alternative per byte-range
// sequence, so a large class (\p{L}: hundreds of ranges) leaves the matcher many stacks after
// one byte; here the sequences share their prefixes and children with the same subtree share
// one byte set, so at every byte exactly one alternative goes on. Same strings as CodePoints.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "engine/grammar/grammar.h"

namespace heavykv::grammar {

using CodePointRanges = std::vector<std::pair<uint32_t, uint32_t>>;  // [lo, hi] inclusive

// Sorted, merged and disjoint, clipped to U+10FFFF (empty ranges dropped).
CodePointRanges NormalizeRanges(CodePointRanges ranges);
// The code points of 0..U+10FFFF in none of `ranges`, normalized.
CodePointRanges ComplementRanges(const CodePointRanges& ranges);

// One code point in the union of the [lo, hi] ranges (any order, may overlap; surrogates and
// anything past U+10FFFF never match), as its UTF-8 bytes; `negate`: one code point in none.
GrammarBuilder::Expr Utf8Class(GrammarBuilder& b, std::vector<std::pair<uint32_t, uint32_t>> ranges,
                               bool negate = false);

}  // namespace heavykv::grammar
