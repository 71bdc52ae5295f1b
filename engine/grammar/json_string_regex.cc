#include "engine/grammar/json_string_regex.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/grammar/json_text.h"
#include "engine/grammar/utf8_class.h"

namespace heavykv::grammar {
namespace {

using Expr = GrammarBuilder::Expr;
using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;
constexpr uint32_t kMaxCp = 0x10FFFF;

Ranges Intersect(const Ranges& a, const Ranges& b) {
  return ComplementRanges(NormalizeRanges([&] {
    Ranges u = ComplementRanges(a);
    Ranges cb = ComplementRanges(b);
    u.insert(u.end(), cb.begin(), cb.end());
    return u;
  }()));
}

Ranges Union(Ranges a, const Ranges& b) {
  a.insert(a.end(), b.begin(), b.end());
  return NormalizeRanges(std::move(a));
}

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = {{'\t', '\r'}, {' ', ' '}};
const Ranges kAscii = {{0, 0x7F}};
// White space in either dialect (Python's str.isspace, ECMA's \s).
const Ranges kAnySpace = {{'\t', '\r'},     {0x1C, ' '},      {0x85, 0x85},     {0xA0, 0xA0},
                          {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F},
                          {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
const Ranges kLineTerminators = {{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}};

// The escape (or raw text) json.dumps writes for a code point that must be escaped.
std::string EscapeText(uint32_t c) {
  switch (c) {
    case '"':
      return "\\\"";
    case '\\':
      return "\\\\";
    case '\n':
      return "\\n";
    case '\r':
      return "\\r";
    case '\t':
      return "\\t";
    case '\b':
      return "\\b";
    case '\f':
      return "\\f";
    default: {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      return buf;
    }
  }
}

// A Thompson NFA over code point sets; fragments of it are [first, last] state ranges, so a
// fragment can be copied for counted repetition.
struct NfaState {
  std::vector<int> eps;
  std::vector<std::pair<int, int>> edges;  // (set id, target)
};
struct Frag {
  int start = 0, end = 0;
  int first = 0, last = 0;  // the states it owns
};

constexpr int kMaxNfaStates = 100'000;

class Parser {
 public:
  Parser(GrammarBuilder& b, std::string_view pattern) : b_(b), src_(pattern) {
    for (size_t i = 0; i < pattern.size();) {
      const uint8_t c = pattern[i];
      const int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
      uint32_t cp = n == 1 ? c : c & (0xFF >> (n + 1));
      for (int k = 1; k < n && i + k < pattern.size(); ++k) {
        cp = (cp << 6) | (uint8_t(pattern[i + k]) & 0x3F);
      }
      cps_.push_back(cp);
      i += n;
    }
  }

  absl::StatusOr<StringRegex> Run(bool search, int64_t min_len, int64_t max_len) {
    absl::StatusOr<Frag> f = Alternation(0, search);
    if (!f.ok()) return f.status();
    if (pos_ != cps_.size()) return Error("an unmatched `)`");
    if (!status_.ok()) return status_;
    return Lower(*f, min_len, max_len);
  }

 private:
  absl::Status Error(std::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("the pattern `", std::string(src_), "` has ",
                                                   std::string(what), " at offset ", pos_,
                                                   ", which does not compile"));
  }
  bool AtEnd() const { return pos_ >= cps_.size(); }
  uint32_t Peek(size_t ahead = 0) const {
    return pos_ + ahead < cps_.size() ? cps_[pos_ + ahead] : 0xFFFFFFFF;
  }

  int NewState() {
    if (int(nfa_.size()) >= kMaxNfaStates && status_.ok()) {
      status_ = absl::ResourceExhaustedError(absl::StrCat("the pattern `", std::string(src_),
                                                          "` needs more than ", kMaxNfaStates,
                                                          " automaton states"));
    }
    nfa_.emplace_back();
    return int(nfa_.size()) - 1;
  }
  int SetId(const Ranges& r) {
    for (size_t i = 0; i < sets_.size(); ++i) {
      if (sets_[i] == r) return int(i);
    }
    sets_.push_back(r);
    return int(sets_.size()) - 1;
  }
  Frag Chars(const Ranges& set) {
    const int a = NewState(), z = NewState();
    nfa_[a].edges.push_back({SetId(set), z});
    return {a, z, a, z};
  }
  Frag Epsilon() {
    const int a = NewState();
    return {a, a, a, a};
  }
  Frag Concat(Frag x, Frag y) {
    nfa_[x.end].eps.push_back(y.start);
    return {x.start, y.end, std::min(x.first, y.first), std::max(x.last, y.last)};
  }
  Frag Union(const std::vector<Frag>& fs) {
    const int a = NewState(), z = NewState();
    int first = a, last = z;
    for (const Frag& f : fs) {
      nfa_[a].eps.push_back(f.start);
      nfa_[f.end].eps.push_back(z);
      first = std::min(first, f.first);
      last = std::max(last, f.last);
    }
    return {a, z, first, last};
  }
  Frag Copy(const Frag& f) {
    const int offset = int(nfa_.size()) - f.first;
    for (int q = f.first; q <= f.last; ++q) {
      NfaState st = nfa_[q];
      for (int& t : st.eps) t += offset;
      for (auto& e : st.edges) e.second += offset;
      nfa_.push_back(std::move(st));
    }
    if (int(nfa_.size()) > kMaxNfaStates && status_.ok()) {
      status_ = absl::ResourceExhaustedError(absl::StrCat("the pattern `", std::string(src_),
                                                          "` needs more than ", kMaxNfaStates,
                                                          " automaton states"));
    }
    return {f.start + offset, f.end + offset, f.first + offset, f.last + offset};
  }
  // f{n,m} (m -1: unbounded); f's own states serve as the first copy.
  Frag Repeat(const Frag& f, int64_t n, int64_t m) {
    if (m == 0) return Epsilon();
    std::vector<Frag> copies = {f};
    const int64_t needed = std::max<int64_t>(n, m < 0 ? std::max<int64_t>(n, 1) : m);
    for (int64_t i = 1; i < needed && status_.ok(); ++i) copies.push_back(Copy(f));
    if (!status_.ok()) return f;
    Frag out = Epsilon();
    for (int64_t i = 0; i < n; ++i) out = Concat(out, copies[i]);
    if (m < 0) {
      Frag loop = n > 0 ? copies[n - 1] : copies[0];
      if (n == 0) {
        const Frag skip = Epsilon();
        nfa_[loop.end].eps.push_back(loop.start);
        Frag u = Union({loop, skip});
        return Concat(out, u);
      }
      nfa_[loop.end].eps.push_back(loop.start);
      return out;
    }
    // (m - n) optional copies, nested: (c (c (c)?)?)?
    Frag tail = Epsilon();
    for (int64_t i = m - 1; i >= n; --i) {
      Frag c = Concat(copies[i], tail);
      tail = Union({c, Epsilon()});
    }
    return Concat(out, tail);
  }

  // The set's text: raw UTF-8 where json.dumps writes it raw, else its escape.
  Expr Emit(int set) {
    if (emitted_.size() < sets_.size()) emitted_.resize(sets_.size(), -1);
    if (emitted_[set] >= 0) return emitted_[set];
    const Ranges& r = sets_[set];
    const Ranges raw = Intersect(r, ComplementRanges({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}));
    std::vector<Expr> alts;
    if (!raw.empty()) alts.push_back(b_.CodePoints(raw));
    for (auto [lo, hi] : Intersect(r, {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}})) {
      for (uint32_t c = lo; c <= hi; ++c) alts.push_back(b_.Literal(EscapeText(c)));
    }
    emitted_[set] = b_.Alt(std::move(alts));
    return emitted_[set];
  }

  // One rule per (state, count of code points so far): a right-linear grammar, so matching
  // never grows the parser's stack. Counts stop at max_len, or at min_len when unbounded.
  absl::StatusOr<StringRegex> Lower(const Frag& f, int64_t min_len, int64_t max_len) {
    const int n = int(nfa_.size());
    // Epsilon closures of the states that matter (the start and every edge's target).
    std::vector<std::vector<int>> closure(n);
    std::vector<char> done(n, 0);
    const auto close = [&](int q) -> const std::vector<int>& {
      if (done[q]) return closure[q];
      done[q] = 1;
      std::vector<char> seen(n, 0);
      std::vector<int> work = {q};
      seen[q] = 1;
      while (!work.empty()) {
        const int x = work.back();
        work.pop_back();
        closure[q].push_back(x);
        for (int y : nfa_[x].eps) {
          if (!seen[y]) {
            seen[y] = 1;
            work.push_back(y);
          }
        }
      }
      return closure[q];
    };
    const int64_t cap = max_len >= 0 ? max_len : min_len;
    const int64_t levels = cap + 1;
    if (levels > 1'000'000 || int64_t(n) * levels > 4'000'000) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the pattern `", std::string(src_), "` with a length bound needs too many rules"));
    }
    std::map<std::pair<int, int64_t>, RuleId> rules;
    std::vector<std::pair<int, int64_t>> todo;
    const auto ref = [&](int q, int64_t k) {
      k = std::min(k, cap);
      auto [it, fresh] = rules.try_emplace({q, k}, -1);
      if (fresh) {
        it->second = b_.DeclareRule(absl::StrCat("re", q, "_", k));
        todo.push_back({q, k});
      }
      return b_.Ref(it->second);
    };
    const Expr root = ref(f.start, 0);
    while (!todo.empty()) {
      if (rules.size() > 200'000) {
        return absl::ResourceExhaustedError(
            absl::StrCat("the pattern `", std::string(src_), "` needs more than 200000 rules"));
      }
      const auto [q, k] = todo.back();
      todo.pop_back();
      std::vector<Expr> alts;
      bool accepting = false;
      std::map<int, std::vector<int>> by_target;  // target -> set ids
      for (int x : close(q)) {
        accepting |= x == f.end;
        for (auto [set, t] : nfa_[x].edges) by_target[t].push_back(set);
      }
      if (accepting && k >= min_len) alts.push_back(b_.Empty());
      if (max_len < 0 || k < max_len) {
        for (const auto& [t, sets] : by_target) {
          Ranges u;
          for (int set : sets) u = grammar::Union(u, sets_[set]);
          alts.push_back(b_.Seq({Emit(SetId(u)), ref(t, k + 1)}));
        }
      }
      b_.DefineRule(rules[{q, k}], b_.Alt(std::move(alts)));
    }
    return StringRegex{root};
  }

  absl::StatusOr<Frag> Alternation(int depth, bool search) {
    if (depth > 64) return Error("groups nested too deeply");
    std::vector<Frag> alts;
    while (true) {
      absl::StatusOr<Frag> s = Sequence(depth, search);
      if (!s.ok()) return s.status();
      alts.push_back(*s);
      if (Peek() != '|') break;
      ++pos_;
    }
    if (alts.size() == 1) return alts[0];
    return Union(alts);
  }

  absl::StatusOr<Frag> Sequence(int depth, bool search) {
    const bool top = depth == 0;
    bool anchored_start = false, anchored_end = false;
    if (top && Peek() == '^') {
      anchored_start = true;
      ++pos_;
    }
    Frag out = Epsilon();
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      if (Peek() == '$') {
        ++pos_;
        if (top && (AtEnd() || Peek() == '|')) {
          anchored_end = true;
          break;
        }
        return Error("an anchor `$` inside");
      }
      if (Peek() == '^') return Error("an anchor `^` inside");
      absl::StatusOr<Frag> a = Quantified(depth);
      if (!a.ok()) return a.status();
      out = Concat(out, *a);
      if (!status_.ok()) return status_;
    }
    if (top && search) {
      const Ranges any = {{0, kMaxCp}};
      if (!anchored_start) out = Concat(Repeat(Chars(any), 0, -1), out);
      if (!anchored_end) out = Concat(out, Repeat(Chars(any), 0, -1));
    }
    return out;
  }

  // {n}, {n,}, {n,m} at pos_ (after the '{'); false if it is not one (then '{' is literal).
  bool Counts(int64_t& n, int64_t& m) {
    size_t p = pos_ + 1;
    const auto number = [&](int64_t& v) {
      const size_t start = p;
      v = 0;
      while (p < cps_.size() && cps_[p] >= '0' && cps_[p] <= '9') {
        v = std::min<int64_t>(v * 10 + (cps_[p] - '0'), 1'000'000);
        ++p;
      }
      return p > start;
    };
    if (!number(n)) return false;
    m = n;
    if (p < cps_.size() && cps_[p] == ',') {
      ++p;
      if (!number(m)) m = -1;
    }
    if (p >= cps_.size() || cps_[p] != '}') return false;
    pos_ = p + 1;
    return true;
  }

  absl::StatusOr<Frag> Quantified(int depth) {
    absl::StatusOr<Frag> a = Atom(depth);
    if (!a.ok()) return a.status();
    Frag f = *a;
    while (!AtEnd()) {
      int64_t n, m;
      const uint32_t c = Peek();
      if (c == '*') {
        n = 0, m = -1, ++pos_;
      } else if (c == '+') {
        n = 1, m = -1, ++pos_;
      } else if (c == '?') {
        n = 0, m = 1, ++pos_;
      } else if (c == '{' && Counts(n, m)) {
      } else if (c == '{' && Peek(1) == ',') {
        return Error("`{,` (a count in Python, a literal in ECMA)");
      } else {
        break;
      }
      if (m >= 0 && m < n) return Error("a repetition {n,m} with m < n");
      if (n > b_.limits().max_repeat || m > b_.limits().max_repeat) {
        return absl::ResourceExhaustedError(
            absl::StrCat("the pattern `", std::string(src_), "` repeats ", std::max(n, m),
                         " times, over the limit of ", b_.limits().max_repeat, " (max_repeat)"));
      }
      if (Peek() == '?') ++pos_;  // lazy: the same strings
      if (Peek() == '+' || Peek() == '*' || Peek() == '{') return Error("a quantifier repeated");
      f = Repeat(f, n, m);
      if (!status_.ok()) return status_;
    }
    return f;
  }

  absl::StatusOr<Frag> Atom(int depth) {
    const uint32_t c = Peek();
    if (c == '(') {
      ++pos_;
      if (Peek() == '?') {
        if (Peek(1) == ':') {
          pos_ += 2;
        } else if ((Peek(1) == '<' && Peek(2) != '=' && Peek(2) != '!') ||
                   (Peek(1) == 'P' && Peek(2) == '<')) {
          pos_ += Peek(1) == 'P' ? 3 : 2;
          while (!AtEnd() && Peek() != '>') ++pos_;
          if (AtEnd()) return Error("an unterminated group name");
          ++pos_;
        } else {
          return Error("a lookaround, flag or other `(?` group");
        }
      }
      absl::StatusOr<Frag> inner = Alternation(depth + 1, false);
      if (!inner.ok()) return inner.status();
      if (Peek() != ')') return Error("an unterminated group");
      ++pos_;
      return inner;
    }
    if (c == '[') {
      absl::StatusOr<Ranges> set = Class();
      if (!set.ok()) return set.status();
      return Chars(*set);
    }
    if (c == '.') {
      ++pos_;
      return Chars(ComplementRanges(kLineTerminators));
    }
    if (c == '*' || c == '+' || c == '?') return Error("a quantifier with nothing to repeat");
    if (c == '\\') {
      absl::StatusOr<Ranges> set = Escape(/*in_class=*/false);
      if (!set.ok()) return set.status();
      return Chars(*set);
    }
    ++pos_;
    return Chars({{c, c}});
  }

  absl::StatusOr<uint32_t> Hex(int digits) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      const uint32_t h = Peek();
      int d = h >= '0' && h <= '9'   ? int(h - '0')
              : h >= 'a' && h <= 'f' ? int(h - 'a' + 10)
              : h >= 'A' && h <= 'F' ? int(h - 'A' + 10)
                                     : -1;
      if (d < 0) return Error("a bad hexadecimal escape");
      v = v * 16 + d;
      ++pos_;
    }
    return v;
  }

  // After a backslash: a set (one code point or a class escape).
  absl::StatusOr<Ranges> Escape(bool in_class) {
    ++pos_;  // the backslash
    if (AtEnd()) return Error("a trailing backslash");
    const uint32_t c = Peek();
    ++pos_;
    switch (c) {
      case 'd':
        return kDigit;
      case 'w':
        return kWord;
      case 's':
        return kSpace;
      // The complements, where Python (Unicode classes) and ECMA (ASCII \d \w) agree.
      case 'D':
        return Intersect(ComplementRanges(kDigit), {{0, 0x65F}});
      case 'W':
        return Intersect(ComplementRanges(kWord), kAscii);
      case 'S':
        return ComplementRanges(kAnySpace);
      case 'n':
        return Ranges{{'\n', '\n'}};
      case 't':
        return Ranges{{'\t', '\t'}};
      case 'r':
        return Ranges{{'\r', '\r'}};
      case 'f':
        return Ranges{{'\f', '\f'}};
      case 'v':
        return Ranges{{'\v', '\v'}};
      case '0':
        if (Peek() >= '0' && Peek() <= '9') return Error("an octal escape");
        return Ranges{{0, 0}};
      case 'x': {
        absl::StatusOr<uint32_t> v = Hex(2);
        if (!v.ok()) return v.status();
        return Ranges{{*v, *v}};
      }
      case 'u': {
        if (Peek() == '{') return Error("a \\u{...} escape");
        absl::StatusOr<uint32_t> v = Hex(4);
        if (!v.ok()) return v.status();
        uint32_t cp = *v;
        if (cp >= 0xD800 && cp <= 0xDBFF && Peek() == '\\' && Peek(1) == 'u') {
          pos_ += 2;
          absl::StatusOr<uint32_t> lo = Hex(4);
          if (!lo.ok()) return lo.status();
          if (*lo < 0xDC00 || *lo > 0xDFFF) return Error("a lone surrogate");
          cp = 0x10000 + ((cp - 0xD800) << 10) + (*lo - 0xDC00);
        } else if (cp >= 0xD800 && cp <= 0xDFFF) {
          return Error("a lone surrogate");
        }
        return Ranges{{cp, cp}};
      }
      case 'b':
        if (in_class) return Ranges{{'\b', '\b'}};
        return Error("a word boundary \\b");
      default:
        break;
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '1' && c <= '9')) {
      --pos_;
      return Error(absl::StrCat("the escape \\", std::string(1, char(c))));
    }
    return Ranges{{c, c}};
  }

  absl::StatusOr<Ranges> Class() {
    ++pos_;  // '['
    bool negate = false;
    if (Peek() == '^') {
      negate = true;
      ++pos_;
    }
    if (Peek() == ']') return Error("an empty class `[]` (the dialects differ)");
    Ranges set;
    bool unicode_dependent = false;
    while (true) {
      if (AtEnd()) return Error("an unterminated class");
      if (Peek() == ']') {
        ++pos_;
        break;
      }
      if (Peek() == '[' && (Peek(1) == ':' || Peek(1) == '=' || Peek(1) == '.')) {
        return Error("a POSIX class");
      }
      Ranges item;
      bool single = false;
      uint32_t lo = 0;
      if (Peek() == '\\') {
        const uint32_t kind = Peek(1);
        unicode_dependent |=
            kind == 'd' || kind == 'w' || kind == 's' || kind == 'D' || kind == 'W' || kind == 'S';
        absl::StatusOr<Ranges> e = Escape(/*in_class=*/true);
        if (!e.ok()) return e.status();
        item = *e;
        single = item.size() == 1 && item[0].first == item[0].second &&
                 !(kind == 'd' || kind == 'w' || kind == 's' || kind == 'D' || kind == 'W' ||
                   kind == 'S');
        lo = item[0].first;
      } else {
        lo = Peek();
        ++pos_;
        item = {{lo, lo}};
        single = true;
      }
      if (single && Peek() == '-' && Peek(1) != ']' && Peek(1) != 0xFFFFFFFF) {
        ++pos_;  // a range lo-hi
        uint32_t hi;
        if (Peek() == '\\') {
          const uint32_t kind = Peek(1);
          if (kind == 'd' || kind == 'w' || kind == 's' || kind == 'D' || kind == 'W' ||
              kind == 'S') {
            return Error("a range to a class escape");
          }
          absl::StatusOr<Ranges> e = Escape(/*in_class=*/true);
          if (!e.ok()) return e.status();
          hi = (*e)[0].first;
        } else {
          hi = Peek();
          ++pos_;
        }
        if (hi < lo) return Error("a range out of order");
        item = {{lo, hi}};
      }
      set.insert(set.end(), item.begin(), item.end());
    }
    set = NormalizeRanges(set);
    if (!negate) return set;
    Ranges out = ComplementRanges(set);
    // [^\d] and friends: Python's \d \w \s are Unicode, so keep to ASCII there.
    return unicode_dependent ? Intersect(out, kAscii) : out;
  }

  GrammarBuilder& b_;
  std::string_view src_;
  std::vector<uint32_t> cps_;
  size_t pos_ = 0;
  std::vector<NfaState> nfa_;
  std::vector<Ranges> sets_;
  std::vector<Expr> emitted_;
  absl::Status status_;
};

}  // namespace

absl::StatusOr<StringRegex> CompileStringRegex(GrammarBuilder& b, std::string_view pattern,
                                               bool search, int64_t min_length,
                                               int64_t max_length) {
  Parser p(b, pattern);
  return p.Run(search, min_length, max_length);
}

absl::StatusOr<bool> StringRegexMatches(std::string_view pattern, std::string_view value) {
  GrammarBuilder b;
  absl::StatusOr<StringRegex> re = CompileStringRegex(b, pattern);
  if (!re.ok()) return re.status();
  const RuleId root = b.DeclareRule("root");
  b.DefineRule(root, re->expr);
  absl::StatusOr<Grammar> g = std::move(b).Build(root);
  if (!g.ok()) return g.status();
  const std::string text = PythonJsonDumps(nlohmann::ordered_json(std::string(value)));
  return Matches(*g, std::string_view(text).substr(1, text.size() - 2));
}

}  // namespace heavykv::grammar
