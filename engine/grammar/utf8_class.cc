#include "engine/grammar/utf8_class.h"

#include <algorithm>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"

namespace heavykv::grammar {
namespace {

using Expr = GrammarBuilder::Expr;

using ByteRanges = std::vector<std::pair<uint8_t, uint8_t>>;

int Utf8Length(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

void Utf8Bytes(uint32_t cp, int len, uint8_t* out) {
  static constexpr uint8_t kLead[] = {0, 0, 0xC0, 0xE0, 0xF0};
  for (int i = len - 1; i > 0; --i, cp >>= 6) out[i] = uint8_t(0x80 | (cp & 0x3F));
  out[0] = uint8_t(kLead[len] | cp);
}

// The byte-range sequences whose strings are exactly the UTF-8 encodings of [lo, hi].
void SplitUtf8(uint32_t lo, uint32_t hi, std::vector<ByteRanges>& out) {
  for (uint32_t edge : {0x7Fu, 0x7FFu, 0xFFFFu}) {  // one encoded length at a time
    if (lo <= edge && hi > edge) {
      SplitUtf8(lo, edge, out);
      SplitUtf8(edge + 1, hi, out);
      return;
    }
  }
  const int len = Utf8Length(lo);
  // Below the first byte where lo and hi differ, lo's bits must be all 0 and hi's all 1, so
  // that each byte position spans a plain range.
  for (int i = 1; i < len; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) == (hi & ~m)) continue;
    if ((lo & m) != 0) {
      SplitUtf8(lo, lo | m, out);
      SplitUtf8((lo | m) + 1, hi, out);
      return;
    }
    if ((hi & m) != m) {
      SplitUtf8(lo, (hi & ~m) - 1, out);
      SplitUtf8(hi & ~m, hi, out);
      return;
    }
  }
  uint8_t a[4], z[4];
  Utf8Bytes(lo, len, a);
  Utf8Bytes(hi, len, z);
  ByteRanges seq;
  for (int i = 0; i < len; ++i) seq.push_back({a[i], z[i]});
  out.push_back(std::move(seq));
}

class Utf8Trie {
 public:
  explicit Utf8Trie(GrammarBuilder& b) : b_(b) { nodes_.emplace_back(); }

  // `ranges`: sorted, disjoint; surrogates are dropped.
  Expr Build(const std::vector<std::pair<uint32_t, uint32_t>>& ranges) {
    std::vector<ByteRanges> seqs;
    for (auto [lo, hi] : ranges) {
      if (lo < 0xD800 && hi >= 0xD800) SplitUtf8(lo, std::min<uint32_t>(hi, 0xD7FF), seqs);
      if (hi > 0xDFFF) SplitUtf8(std::max<uint32_t>(lo, 0xE000), hi, seqs);
      if (hi < 0xD800) SplitUtf8(lo, hi, seqs);
    }
    if (seqs.empty()) return b_.Nothing();
    for (const ByteRanges& seq : seqs) {
      int node = 0;
      for (auto r : seq) {
        auto [it, fresh] = nodes_[node].kids.try_emplace(r, int(nodes_.size()));
        if (fresh) nodes_.emplace_back();
        node = it->second;
      }
    }
    return Emit(0).first;
  }

 private:
  struct TrieNode {
    std::map<std::pair<uint8_t, uint8_t>, int> kids;  // byte range -> node; ranges disjoint
  };

  // The expression of `node`'s subtree and a signature of it (equal subtrees, equal signatures).
  std::pair<Expr, std::string> Emit(int node) {
    if (nodes_[node].kids.empty()) return {b_.Empty(), ""};
    std::map<std::string, std::pair<ByteSet, Expr>> by_tail;  // children grouped by subtree
    for (const auto& [range, kid] : nodes_[node].kids) {
      auto [expr, sig] = Emit(kid);
      auto [it, fresh] = by_tail.try_emplace(sig, ByteSet{}, expr);
      it->second.first.AddRange(range.first, range.second);
    }
    std::string sig = "(";
    std::vector<Expr> alts;
    for (const auto& [tail, set_expr] : by_tail) {
      const auto& [set, expr] = set_expr;
      for (uint64_t w : set.bits) absl::StrAppend(&sig, absl::Hex(w), ",");
      absl::StrAppend(&sig, tail, ";");
      alts.push_back(tail.empty() ? b_.Bytes(set) : b_.Seq({b_.Bytes(set), expr}));
    }
    sig += ")";
    auto [it, fresh] = emitted_.try_emplace(sig, 0);
    if (fresh) it->second = b_.Alt(std::move(alts));
    return {it->second, sig};
  }

  GrammarBuilder& b_;
  std::vector<TrieNode> nodes_;
  std::map<std::string, Expr> emitted_;
};

}  // namespace

CodePointRanges NormalizeRanges(CodePointRanges ranges) {
  for (auto& r : ranges) r.second = std::min<uint32_t>(r.second, 0x10FFFF);
  std::erase_if(ranges, [](const auto& r) { return r.first > r.second; });
  std::sort(ranges.begin(), ranges.end());
  CodePointRanges merged;
  for (auto r : ranges) {
    if (!merged.empty() && r.first <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}

CodePointRanges ComplementRanges(const CodePointRanges& ranges) {
  CodePointRanges inverse;
  uint32_t next = 0;
  for (auto [lo, hi] : NormalizeRanges(ranges)) {
    if (lo > next) inverse.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= 0x10FFFF) inverse.push_back({next, 0x10FFFF});
  return inverse;
}

Expr Utf8Class(GrammarBuilder& b, std::vector<std::pair<uint32_t, uint32_t>> ranges, bool negate) {
  return Utf8Trie(b).Build(negate ? ComplementRanges(ranges) : NormalizeRanges(std::move(ranges)));
}

}  // namespace heavykv::grammar
