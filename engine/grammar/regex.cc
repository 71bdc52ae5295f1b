#include "engine/grammar/regex.h"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/grammar/regex_parser.h"

namespace heavykv::grammar {
namespace {

using Expr = GrammarBuilder::Expr;
using Node = RegexNode;

constexpr uint32_t kMaxCp = 0x10FFFF;

// Lowers the parsed tree to builder expressions. Anchors make a node's language depend on
// whether its match starts at the start of the text (s) and ends at its end (e); a node's
// language under (s, e) is "" when E(n, s, e) plus the non-empty strings P(n, s, e). For a
// sequence A B: the non-empty matches are P(A,s,0) P(B,0,e), P(A,s,e) when B may be empty
// after it, and P(B,s,e) when A may be empty before it. Nodes without anchors do not depend on
// s and e and are lowered once; kNone stands for the empty language.
class Lowering {
 public:
  static constexpr Expr kNone = -1;

  Lowering(GrammarBuilder& b, const std::vector<Node>& nodes) : b_(b), nodes_(nodes) {}

  Expr SeqOf(std::vector<Expr> items) {
    for (Expr e : items) {
      if (e == kNone) return kNone;
    }
    return b_.Seq(std::move(items));
  }
  Expr AltOf(std::vector<Expr> items) {
    std::erase(items, kNone);
    if (items.empty()) return kNone;
    return b_.Alt(std::move(items));
  }
  Expr Or(Expr e) { return e == kNone ? b_.Nothing() : e; }

  Expr AnyCp() {
    if (any_ < 0) any_ = b_.CodePoints({{0, kMaxCp}});
    return any_;
  }

  bool E(int n, bool s, bool e) {
    const Node& x = nodes_[n];
    switch (x.kind) {
      case Node::Kind::kEmpty:
        return true;
      case Node::Kind::kChars:
        return false;
      case Node::Kind::kStart:
        return s;
      case Node::Kind::kEnd:
        return e;
      case Node::Kind::kAlt:
        for (int k : x.kids) {
          if (E(k, s, e)) return true;
        }
        return false;
      case Node::Kind::kSeq:
        for (int k : x.kids) {
          if (!E(k, s, e)) return false;
        }
        return true;
      case Node::Kind::kRepeat:
        return x.min == 0 || E(x.kids[0], s, e);
    }
    return false;
  }

  // The language of an anchor-free node (memoized).
  Expr L(int n) {
    if (auto it = l_.find(n); it != l_.end()) return it->second;
    const Node& x = nodes_[n];
    Expr r = kNone;
    switch (x.kind) {
      case Node::Kind::kEmpty:
        r = b_.Empty();
        break;
      case Node::Kind::kChars:
        r = x.chars.empty() ? kNone : b_.CodePoints(x.chars);
        break;
      case Node::Kind::kStart:
      case Node::Kind::kEnd:
        break;  // not reached: anchored nodes go through P(n, s, e)
      case Node::Kind::kAlt: {
        std::vector<Expr> alts;
        for (int k : x.kids) alts.push_back(L(k));
        r = AltOf(std::move(alts));
        break;
      }
      case Node::Kind::kSeq: {
        std::vector<Expr> items;
        for (int k : x.kids) items.push_back(L(k));
        r = SeqOf(std::move(items));
        break;
      }
      case Node::Kind::kRepeat: {
        const int k = x.kids[0];
        // With an item that may be empty, x{m,n} matches what (x minus "")'s {0,n} matches;
        // lowering it so keeps the grammar free of loops that consume nothing.
        if (E(k, false, false)) {
          const Expr p = P(k, false, false);
          r = p == kNone ? b_.Empty() : b_.Repeat(p, 0, x.max);
        } else {
          const Expr l = L(k);
          r = l == kNone ? (x.min == 0 ? b_.Empty() : kNone) : b_.Repeat(l, x.min, x.max);
        }
        break;
      }
    }
    l_[n] = r;
    return r;
  }

  // The language under (s, e): E plus P.
  Expr Full(int n, bool s, bool e) {
    const Node& x = nodes_[n];
    if (!x.has_start && !x.has_end) return L(n);
    const Expr p = P(n, s, e);
    if (!E(n, s, e)) return p;
    return p == kNone ? b_.Empty() : b_.Alt({p, b_.Empty()});
  }

  // The non-empty strings n matches under (s, e) (memoized).
  Expr P(int n, bool s, bool e) {
    const Node& x = nodes_[n];
    s = s && x.has_start;
    e = e && x.has_end;
    const auto key = std::make_tuple(n, s, e);
    if (auto it = p_.find(key); it != p_.end()) return it->second;
    Expr r = kNone;
    switch (x.kind) {
      case Node::Kind::kEmpty:
      case Node::Kind::kStart:
      case Node::Kind::kEnd:
        break;
      case Node::Kind::kChars:
        r = L(n);
        break;
      case Node::Kind::kAlt: {
        std::vector<Expr> alts;
        for (int k : x.kids) alts.push_back(P(k, s, e));
        r = AltOf(std::move(alts));
        break;
      }
      case Node::Kind::kSeq:
        r = SeqP(n, s, e);
        break;
      case Node::Kind::kRepeat: {
        const int k = x.kids[0];
        if (x.has_start || x.has_end) {  // only x? and x{0,1}: the parser refuses the rest
          r = P(k, s, e);
        } else if (E(k, false, false)) {
          const Expr p = P(k, false, false);
          r = p == kNone ? kNone : b_.Repeat(p, 1, x.max);
        } else {
          const Expr l = L(k);
          r = l == kNone ? kNone : b_.Repeat(l, std::max(x.min, 1), x.max);
        }
        break;
      }
    }
    p_[key] = r;
    return r;
  }

  // P of a sequence, folded from its end: suffix i is kid i then suffix i+1.
  Expr SeqP(int n, bool s, bool e) {
    const Node& x = nodes_[n];
    const int num = int(x.kids.size());
    if (!x.has_start && !x.has_end) {
      if (!E(n, false, false)) return L(n);
      // Every kid may be empty: the first non-empty kid i, then anything of the rest.
      Expr rest_l = b_.Empty(), rest_p = kNone;
      for (int i = num - 1; i >= 0; --i) {
        const int k = x.kids[i];
        rest_p = AltOf({SeqOf({P(k, false, false), rest_l}), rest_p});
        rest_l = SeqOf({L(k), rest_l});
      }
      return rest_p;
    }
    // Anchored: P and E of suffix i under each (s, e), from the end.
    Expr p[2][2] = {{kNone, kNone}, {kNone, kNone}};
    bool em[2][2] = {{true, true}, {true, true}};
    for (int i = num - 1; i >= 0; --i) {
      const int k = x.kids[i];
      Expr np[2][2];
      bool ne[2][2];
      for (int ss = 0; ss < 2; ++ss) {
        for (int ee = 0; ee < 2; ++ee) {
          ne[ss][ee] = E(k, ss, ee) && em[ss][ee];
          std::vector<Expr> alts = {SeqOf({P(k, ss, false), p[0][ee]})};
          if (em[0][ee]) alts.push_back(P(k, ss, ee));
          if (E(k, ss, false)) alts.push_back(p[ss][ee]);
          np[ss][ee] = AltOf(std::move(alts));
        }
      }
      for (int ss = 0; ss < 2; ++ss) {
        for (int ee = 0; ee < 2; ++ee) {
          p[ss][ee] = np[ss][ee];
          em[ss][ee] = ne[ss][ee];
        }
      }
    }
    return p[s][e];
  }

  // The whole pattern. Search: the text is x m z with m matched at |x|, so s = (x empty) and
  // e = (z empty).
  Expr Root(int root, bool search) {
    const Node& x = nodes_[root];
    if (!search) return Or(Full(root, true, true));
    const Expr star = b_.Repeat(AnyCp(), 0, -1), plus = b_.Repeat(AnyCp(), 1, -1);
    if (!x.has_start && !x.has_end) {
      if (E(root, false, false)) return star;  // "" matches, so every text has a match
      return Or(SeqOf({star, Core(root, true, true), star}));
    }
    // The common ^m, m$ and ^m$ with m anchor-free (the parser made m one node).
    if (x.kind == Node::Kind::kSeq) {
      size_t lo = 0, hi = x.kids.size();
      while (lo < hi && nodes_[x.kids[lo]].kind == Node::Kind::kStart) ++lo;
      while (hi > lo && nodes_[x.kids[hi - 1]].kind == Node::Kind::kEnd) --hi;
      const bool s = lo > 0, e = hi < x.kids.size();
      const int m = hi - lo == 1 ? x.kids[lo] : -1;
      if (hi - lo <= 1 && (m < 0 || (!nodes_[m].has_start && !nodes_[m].has_end))) {
        if (s && e) return Or(m < 0 ? b_.Empty() : L(m));
        if (m < 0 || E(m, false, false)) return star;
        return Or(s ? SeqOf({Core(m, false, true), star}) : SeqOf({star, Core(m, true, false)}));
      }
    }
    if (!x.has_end) {  // (m(s) | any+ m(not s)) any*
      return Or(
          SeqOf({AltOf({Full(root, true, false), SeqOf({plus, Full(root, false, false)})}), star}));
    }
    if (!x.has_start) {  // any* (m(e) | m(not e) any+)
      return Or(
          SeqOf({star, AltOf({Full(root, false, true), SeqOf({Full(root, false, false), plus})})}));
    }
    return Or(AltOf({Full(root, true, true), SeqOf({Full(root, true, false), plus}),
                     SeqOf({plus, Full(root, false, true)}),
                     SeqOf({plus, Full(root, false, false), plus})}));
  }

 private:
  // For an anchor-free node that does not match "": a language C with any* C any* equal to
  // any* L(n) any*, cut where `left` / `right` text may stand (any* x? = any*, any* x{m,n} =
  // any* x{m}). Fewer ways to place a match keep the automaton's states small.
  Expr Core(int n, bool left, bool right) {
    const Node& x = nodes_[n];
    if (!left && !right) return L(n);
    switch (x.kind) {
      case Node::Kind::kAlt: {
        std::vector<Expr> alts;
        for (int k : x.kids) alts.push_back(Core(k, left, right));
        return AltOf(std::move(alts));
      }
      case Node::Kind::kRepeat: {
        const Expr l = L(x.kids[0]);  // not "" (x does not match ""), so min >= 1
        return l == kNone ? kNone : b_.Repeat(l, x.min, x.min);
      }
      case Node::Kind::kSeq: {
        size_t lo = 0, hi = x.kids.size();
        while (left && E(x.kids[lo], false, false)) ++lo;
        while (right && E(x.kids[hi - 1], false, false)) --hi;
        if (hi - lo == 1) return Core(x.kids[lo], left, right);
        std::vector<Expr> items;
        for (size_t i = lo; i < hi; ++i) {
          items.push_back(Core(x.kids[i], left && i == lo, right && i + 1 == hi));
        }
        return SeqOf(std::move(items));
      }
      default:
        return L(n);
    }
  }

  GrammarBuilder& b_;
  const std::vector<Node>& nodes_;
  Expr any_ = -1;
  std::map<int, Expr> l_;
  std::map<std::tuple<int, bool, bool>, Expr> p_;
};

// A radix tree of the (sorted, distinct) strings [lo, hi), all sharing their first `depth`
// bytes: shared prefixes are written once, so the alternatives are decided byte by byte.
Expr ChoiceTree(GrammarBuilder& b, const std::vector<std::string>& s, size_t lo, size_t hi,
                size_t depth) {
  std::vector<Expr> alts;
  if (s[lo].size() == depth) {
    alts.push_back(b.Empty());
    ++lo;
  }
  while (lo < hi) {
    const char c = s[lo][depth];
    size_t end = lo + 1;
    while (end < hi && s[end][depth] == c) ++end;
    // The common prefix of s[lo, end): its first and last strings' common prefix.
    size_t common = depth + 1;
    while (common < s[lo].size() && common < s[end - 1].size() &&
           s[lo][common] == s[end - 1][common]) {
      ++common;
    }
    const Expr prefix = b.Literal(std::string_view(s[lo]).substr(depth, common - depth));
    alts.push_back(end - lo == 1 && s[lo].size() == common
                       ? prefix
                       : b.Seq({prefix, ChoiceTree(b, s, lo, end, common)}));
    lo = end;
  }
  return b.Alt(std::move(alts));
}

}  // namespace

absl::StatusOr<GrammarBuilder::Expr> CompileRegex(GrammarBuilder& b, std::string_view pattern,
                                                  const RegexOptions& options) {
  absl::StatusOr<RegexTree> tree = ParseRegex(pattern, b.limits());
  if (!tree.ok()) return tree.status();
  const bool builder_ok = b.status().ok();  // a failure from before is not this pattern's
  Lowering lowering(b, tree->nodes);
  const Expr e = lowering.Root(tree->root, options.search);
  if (builder_ok && !b.status().ok()) {
    return absl::Status(b.status().code(),
                        absl::StrCat("regex: ", std::string(b.status().message())));
  }
  return e;
}

GrammarBuilder::Expr CompileChoice(GrammarBuilder& b, const std::vector<std::string>& choices) {
  std::vector<std::string> s = choices;
  std::sort(s.begin(), s.end());
  s.erase(std::unique(s.begin(), s.end()), s.end());
  if (s.empty()) return b.Nothing();
  return ChoiceTree(b, s, 0, s.size(), 0);
}

}  // namespace heavykv::grammar
