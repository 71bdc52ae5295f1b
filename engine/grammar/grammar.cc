#include "engine/grammar/grammar.h"

#include <algorithm>
#include <bit>
#include <map>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "engine/grammar/automaton.h"
#include "engine/grammar/utf8_class.h"

namespace heavykv::grammar {

int ByteSet::Count() const {
  return std::popcount(bits[0]) + std::popcount(bits[1]) + std::popcount(bits[2]) +
         std::popcount(bits[3]);
}
ByteSet ByteSet::operator|(const ByteSet& o) const {
  ByteSet s;
  for (int i = 0; i < 4; ++i) s.bits[i] = bits[i] | o.bits[i];
  return s;
}
ByteSet ByteSet::operator&(const ByteSet& o) const {
  ByteSet s;
  for (int i = 0; i < 4; ++i) s.bits[i] = bits[i] & o.bits[i];
  return s;
}
ByteSet ByteSet::operator~() const {
  ByteSet s;
  for (int i = 0; i < 4; ++i) s.bits[i] = ~bits[i];
  return s;
}

int64_t Grammar::NumElements() const {
  int64_t n = 0;
  for (const auto& alts : rules) {
    for (const auto& seq : alts) n += static_cast<int64_t>(seq.size()) + 1;
  }
  return n;
}

namespace {

std::string ByteSetText(const ByteSet& s) {
  const auto ch = [](int b) -> std::string {
    if (b >= 0x21 && b < 0x7f && b != ']' && b != '\\' && b != '-' && b != '^') {
      return std::string(1, char(b));
    }
    return absl::StrCat("\\x", absl::Hex(b, absl::kZeroPad2));
  };
  if (s.Count() == 1) {
    for (int b = 0; b < 256; ++b) {
      if (s.Has(uint8_t(b))) return absl::StrCat("[", ch(b), "]");
    }
  }
  std::string out = "[";
  for (int b = 0; b < 256;) {
    if (!s.Has(uint8_t(b))) {
      ++b;
      continue;
    }
    int e = b;
    while (e + 1 < 256 && s.Has(uint8_t(e + 1))) ++e;
    absl::StrAppend(&out, ch(b));
    if (e > b) absl::StrAppend(&out, "-", ch(e));
    b = e + 1;
  }
  return out + "]";
}

}  // namespace

std::string Grammar::ToString() const {
  std::string out;
  for (size_t r = 0; r < rules.size(); ++r) {
    absl::StrAppend(&out, rule_names[r], " ::=");
    if (rules[r].empty()) absl::StrAppend(&out, " [^\\x00-\\xff]");
    for (size_t a = 0; a < rules[r].size(); ++a) {
      if (a > 0) absl::StrAppend(&out, " |");
      if (rules[r][a].empty()) absl::StrAppend(&out, " \"\"");
      for (const Element& e : rules[r][a]) {
        absl::StrAppend(&out, " ",
                        e.kind == Element::Kind::kBytes ? ByteSetText(byte_sets[e.index])
                                                        : rule_names[e.index]);
      }
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

// ---- GrammarBuilder ----

GrammarBuilder::Expr GrammarBuilder::Add(Node n) {
  nodes_.push_back(std::move(n));
  return static_cast<Expr>(nodes_.size() - 1);
}

void GrammarBuilder::Fail(absl::Status s) {
  if (status_.ok()) status_ = std::move(s);
}

GrammarBuilder::Expr GrammarBuilder::Empty() { return Add(MakeNode(Node::Op::kEmpty)); }
GrammarBuilder::Expr GrammarBuilder::Nothing() { return Add(MakeNode(Node::Op::kNothing)); }

GrammarBuilder::Expr GrammarBuilder::Bytes(const ByteSet& set) {
  if (set.Empty()) return Nothing();
  Node n = MakeNode(Node::Op::kBytes);
  n.set = set;
  return Add(std::move(n));
}

GrammarBuilder::Expr GrammarBuilder::Literal(std::string_view bytes) {
  if (bytes.empty()) return Empty();
  if (bytes.size() == 1) return Bytes(ByteSet::Of(uint8_t(bytes[0])));
  std::vector<Expr> items;
  items.reserve(bytes.size());
  for (char c : bytes) items.push_back(Bytes(ByteSet::Of(uint8_t(c))));
  return Seq(std::move(items));
}

GrammarBuilder::Expr GrammarBuilder::CodePoints(std::vector<std::pair<uint32_t, uint32_t>> ranges,
                                                bool negate) {
  return Utf8Class(*this, std::move(ranges), negate);  // a deterministic byte trie
}

GrammarBuilder::Expr GrammarBuilder::Seq(std::vector<Expr> items) {
  if (items.empty()) return Empty();
  if (items.size() == 1) return items[0];
  Node n = MakeNode(Node::Op::kSeq);
  n.items = std::move(items);
  return Add(std::move(n));
}

GrammarBuilder::Expr GrammarBuilder::Alt(std::vector<Expr> items) {
  if (items.empty()) return Nothing();
  if (items.size() == 1) return items[0];
  Node n = MakeNode(Node::Op::kAlt);
  n.items = std::move(items);
  return Add(std::move(n));
}

GrammarBuilder::Expr GrammarBuilder::Repeat(Expr e, int32_t min, int32_t max) {
  if (min < 0 || (max >= 0 && max < min)) {
    Fail(absl::InvalidArgumentError(absl::StrCat("bad repetition {", min, ",", max, "}")));
    return Nothing();
  }
  if (min > limits_.max_repeat || max > limits_.max_repeat) {
    Fail(absl::ResourceExhaustedError(
        absl::StrCat("a repetition count of ", std::max(min, max), " is over the limit of ",
                     limits_.max_repeat)));
    return Nothing();
  }
  if (min == 1 && max == 1) return e;
  if (max == 0) return Empty();
  Node n = MakeNode(Node::Op::kRepeat);
  n.items = {e};
  n.min = min;
  n.max = max;
  return Add(std::move(n));
}

GrammarBuilder::Expr GrammarBuilder::Ref(RuleId rule) {
  Node n = MakeNode(Node::Op::kRef);
  n.rule = rule;
  return Add(std::move(n));
}

RuleId GrammarBuilder::DeclareRule(std::string name) {
  rule_names_.push_back(std::move(name));
  rule_bodies_.push_back(-1);
  return static_cast<RuleId>(rule_names_.size() - 1);
}

void GrammarBuilder::DefineRule(RuleId rule, Expr body) { rule_bodies_[rule] = body; }

bool GrammarBuilder::IsDefined(RuleId rule) const { return rule_bodies_[rule] >= 0; }

// Lowers builder expressions to Grammar rules. Named rules keep their ids; alternatives and
// repetitions get generated rules (memoized per expression).
class Lowering {
 public:
  Lowering(GrammarBuilder& b) : b_(b) {}

  absl::StatusOr<Grammar> Run(RuleId root) {
    if (!b_.status_.ok()) return b_.status_;
    const size_t named = b_.rule_names_.size();
    g_.rules.resize(named);
    g_.rule_names = b_.rule_names_;
    std::vector<bool> done(named, false);
    std::vector<RuleId> work = {root};
    done[root] = true;
    while (!work.empty()) {
      const RuleId r = work.back();
      work.pop_back();
      if (b_.rule_bodies_[r] < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("the rule `", b_.rule_names_[r], "` is used but never defined"));
      }
      g_.rules[r] = AltsOf(b_.rule_bodies_[r]);
      if (!status_.ok()) return status_;
      for (RuleId used : pending_named_) {
        if (!done[used]) {
          done[used] = true;
          work.push_back(used);
        }
      }
      pending_named_.clear();
    }
    g_.root = root;
    if (g_.NumElements() > b_.limits_.max_elements) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the grammar has ", g_.NumElements(), " elements, over the limit of ",
          b_.limits_.max_elements));
    }
    if (absl::Status s = CheckLeftRecursion(); !s.ok()) return s;
    return std::move(g_);
  }

 private:
  using Node = GrammarBuilder::Node;
  using Expr = GrammarBuilder::Expr;

  int32_t SetIndex(const ByteSet& s) {
    auto [it, fresh] = sets_.try_emplace(s.bits, int32_t(g_.byte_sets.size()));
    if (fresh) g_.byte_sets.push_back(s);
    return it->second;
  }

  RuleId NewRule(std::string name) {
    g_.rule_names.push_back(std::move(name));
    g_.rules.emplace_back();
    return RuleId(g_.rules.size() - 1);
  }

  void Count(int64_t n) {
    elements_ += n;
    if (elements_ > b_.limits_.max_elements && status_.ok()) {
      status_ = absl::ResourceExhaustedError(absl::StrCat(
          "the grammar is over the limit of ", b_.limits_.max_elements, " elements"));
    }
  }

  // The alternatives of expression `e` as a rule body.
  std::vector<std::vector<Element>> AltsOf(Expr e) {
    std::vector<std::vector<Element>> alts;
    const Node& n = b_.nodes_[e];
    if (n.op == Node::Op::kNothing) return alts;
    if (n.op == Node::Op::kAlt) {
      for (Expr item : n.items) {
        if (b_.nodes_[item].op == Node::Op::kNothing) continue;
        alts.emplace_back();
        Append(item, alts.back());
      }
      return alts;
    }
    alts.emplace_back();
    Append(e, alts.back());
    return alts;
  }

  // The rule that matches exactly `e` (memoized).
  RuleId RuleOf(Expr e) {
    const Node& n = b_.nodes_[e];
    if (n.op == Node::Op::kRef) {
      pending_named_.push_back(n.rule);
      return n.rule;
    }
    if (auto it = rule_of_.find(e); it != rule_of_.end()) return it->second;
    const RuleId r = NewRule(absl::StrCat("_", g_.rules.size()));
    rule_of_[e] = r;
    auto alts = AltsOf(e);
    g_.rules[r] = std::move(alts);
    return r;
  }

  void Append(Expr e, std::vector<Element>& seq) {
    if (!status_.ok()) return;
    if (++depth_ > 10000) {
      status_ = absl::ResourceExhaustedError("the grammar's expressions nest too deeply");
      --depth_;
      return;
    }
    const Node& n = b_.nodes_[e];
    switch (n.op) {
      case Node::Op::kEmpty:
        break;
      case Node::Op::kBytes:
        seq.push_back({Element::Kind::kBytes, SetIndex(n.set)});
        Count(1);
        break;
      case Node::Op::kSeq:
        for (Expr item : n.items) Append(item, seq);
        break;
      case Node::Op::kNothing:
      case Node::Op::kAlt:
      case Node::Op::kRef:
        seq.push_back({Element::Kind::kRule, RuleOf(e)});
        Count(1);
        break;
      case Node::Op::kRepeat:
        AppendRepeat(e, seq);
        break;
    }
    --depth_;
  }

  void AppendRepeat(Expr e, std::vector<Element>& seq) {
    const Node& n = b_.nodes_[e];
    const Expr item = n.items[0];
    for (int32_t i = 0; i < n.min; ++i) Append(item, seq);
    if (n.max == n.min) return;
    if (n.max < 0) {  // star ::= item star | ""
      RuleId star;
      if (auto it = star_of_.find(item); it != star_of_.end()) {
        star = it->second;
      } else {
        star = NewRule(absl::StrCat("_", g_.rules.size(), "_star"));
        star_of_[item] = star;
        std::vector<Element> loop;
        Append(item, loop);
        loop.push_back({Element::Kind::kRule, star});
        g_.rules[star] = {std::move(loop), {}};
        Count(2);
      }
      seq.push_back({Element::Kind::kRule, star});
      Count(1);
      return;
    }
    // opt_k ::= item opt_{k-1} | ""   (opt_1 ::= item | "")
    auto& chain = opt_of_[item];
    RuleId prev = -1;
    const int32_t k = n.max - n.min;
    for (int32_t i = static_cast<int32_t>(chain.size()); i < k; ++i) {
      const RuleId r = NewRule(absl::StrCat("_", g_.rules.size(), "_opt", i + 1));
      std::vector<Element> one;
      Append(item, one);
      if (i > 0) one.push_back({Element::Kind::kRule, chain[i - 1]});
      g_.rules[r] = {std::move(one), {}};
      Count(2);
      chain.push_back(r);
      if (!status_.ok()) return;
    }
    prev = chain[k - 1];
    seq.push_back({Element::Kind::kRule, prev});
    Count(1);
  }

  // A rule that can reach itself before consuming a byte would grow the matcher's stack without
  // end, unless every call on the cycle is a tail call (those loop in place).
  absl::Status CheckLeftRecursion() {
    const size_t n = g_.rules.size();
    std::vector<bool> nullable(n, false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (const auto& alt : g_.rules[r]) {
          bool all = true;
          for (const Element& el : alt) {
            if (el.kind == Element::Kind::kBytes || !nullable[el.index]) {
              all = false;
              break;
            }
          }
          if (all) {
            nullable[r] = changed = true;
            break;
          }
        }
      }
    }
    // Edges r -> s for calls reachable without a byte; `grows` when not in tail position.
    std::vector<std::vector<std::pair<int32_t, bool>>> edges(n);
    for (size_t r = 0; r < n; ++r) {
      for (const auto& alt : g_.rules[r]) {
        for (size_t i = 0; i < alt.size(); ++i) {
          const Element& el = alt[i];
          if (el.kind == Element::Kind::kBytes) break;
          edges[r].push_back({el.index, i + 1 < alt.size()});
          if (!nullable[el.index]) break;
        }
      }
    }
    // Tarjan's SCC, iterative; a growing edge inside one component is left recursion.
    std::vector<int32_t> index(n, -1), low(n, 0), comp(n, -1);
    std::vector<bool> on(n, false);
    std::vector<int32_t> st;
    int32_t counter = 0, ncomp = 0;
    for (size_t s0 = 0; s0 < n; ++s0) {
      if (index[s0] >= 0) continue;
      std::vector<std::pair<int32_t, size_t>> call = {{int32_t(s0), 0}};
      index[s0] = low[s0] = counter++;
      st.push_back(int32_t(s0));
      on[s0] = true;
      while (!call.empty()) {
        auto& [v, i] = call.back();
        if (i < edges[v].size()) {
          const int32_t w = edges[v][i++].first;
          if (index[w] < 0) {
            index[w] = low[w] = counter++;
            st.push_back(w);
            on[w] = true;
            call.push_back({w, 0});
          } else if (on[w]) {
            low[v] = std::min(low[v], index[w]);
          }
          continue;
        }
        if (low[v] == index[v]) {
          int32_t w;
          do {
            w = st.back();
            st.pop_back();
            on[w] = false;
            comp[w] = ncomp;
          } while (w != v);
          ++ncomp;
        }
        const int32_t done = v;
        call.pop_back();
        if (!call.empty()) low[call.back().first] = std::min(low[call.back().first], low[done]);
      }
    }
    for (size_t r = 0; r < n; ++r) {
      for (auto [s, grows] : edges[r]) {
        if (grows && comp[s] == comp[r]) {
          return absl::InvalidArgumentError(absl::StrCat(
              "the rule `", g_.rule_names[r],
              "` is left-recursive (it can reach itself before matching any text)"));
        }
      }
    }
    return absl::OkStatus();
  }

  GrammarBuilder& b_;
  Grammar g_;
  absl::Status status_;
  std::map<std::array<uint64_t, 4>, int32_t> sets_;
  absl::flat_hash_map<Expr, RuleId> rule_of_, star_of_;
  std::map<Expr, std::vector<RuleId>> opt_of_;  // node-based: references stay valid
  std::vector<RuleId> pending_named_;
  int64_t elements_ = 0;
  int depth_ = 0;
};

absl::StatusOr<Grammar> GrammarBuilder::Build(RuleId root) && {
  if (root < 0 || root >= static_cast<RuleId>(rule_names_.size())) {
    return absl::InvalidArgumentError("no root rule");
  }
  Lowering lowering(*this);
  return lowering.Run(root);
}

bool Matches(const Grammar& g, std::string_view text) {
  auto a = std::make_shared<Automaton>(std::make_shared<const Grammar>(g));
  int32_t state = a->Start();
  for (char c : text) {
    state = a->Step(state, uint8_t(c));
    if (state == Automaton::kDead) return false;
  }
  return a->Accepting(state);
}

}  // namespace heavykv::grammar
