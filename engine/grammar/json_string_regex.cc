#include "engine/grammar/json_string_regex.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/grammar/json_text.h"

namespace heavykv::grammar {
namespace {

using Expr = GrammarBuilder::Expr;
using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;
constexpr uint32_t kMaxCp = 0x10FFFF;

Ranges Normalize(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (auto [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.push_back({lo, hi});
    }
  }
  return out;
}

Ranges Complement(const Ranges& r0) {
  Ranges r = Normalize(r0), out;
  uint32_t next = 0;
  for (auto [lo, hi] : r) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMaxCp) out.push_back({next, kMaxCp});
  return out;
}

Ranges Intersect(const Ranges& a, const Ranges& b) {
  return Complement(Normalize([&] {
    Ranges u = Complement(a);
    Ranges cb = Complement(b);
    u.insert(u.end(), cb.begin(), cb.end());
    return u;
  }()));
}

Ranges Union(Ranges a, const Ranges& b) {
  a.insert(a.end(), b.begin(), b.end());
  return Normalize(std::move(a));
}

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = {{'\t', '\r'}, {' ', ' '}};
const Ranges kAscii = {{0, 0x7F}};
// White space in either dialect (Python's str.isspace, ECMA's \s).
const Ranges kAnySpace = {{'\t', '\r'}, {0x1C, ' '}, {0x85, 0x85}, {0xA0, 0xA0}, {0x1680, 0x1680},
                          {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
                          {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
const Ranges kLineTerminators = {{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}};

// The escape (or raw text) json.dumps writes for a code point that must be escaped.
std::string EscapeText(uint32_t c) {
  switch (c) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    case '\b': return "\\b";
    case '\f': return "\\f";
    default: {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      return buf;
    }
  }
}

struct Piece {
  Expr expr;
  int64_t min = 0, max = 0;  // max -1: unbounded
};

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

  absl::StatusOr<StringRegex> Run(bool search) {
    absl::StatusOr<Piece> p = Alternation(0, search);
    if (!p.ok()) return p.status();
    if (pos_ != cps_.size()) return Error("an unmatched `)`");
    return StringRegex{p->expr, p->min, p->max};
  }

 private:
  absl::Status Error(std::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("the pattern `", std::string(src_), "` has ", std::string(what), " at offset ", pos_,
                     ", which does not compile"));
  }
  bool AtEnd() const { return pos_ >= cps_.size(); }
  uint32_t Peek(size_t ahead = 0) const {
    return pos_ + ahead < cps_.size() ? cps_[pos_ + ahead] : 0xFFFFFFFF;
  }

  Expr AnyChar() {
    if (any_char_ < 0) any_char_ = Emit({{0, kMaxCp}});
    return any_char_;
  }

  // A set of code points as the text of one string character.
  Expr Emit(const Ranges& set) {
    const Ranges raw = Intersect(set, Complement({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}));
    std::vector<Expr> alts;
    if (!raw.empty()) alts.push_back(b_.CodePoints(raw));
    for (auto [lo, hi] : Intersect(set, {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}})) {
      for (uint32_t c = lo; c <= hi; ++c) alts.push_back(b_.Literal(EscapeText(c)));
    }
    return b_.Alt(std::move(alts));
  }

  // top level: each alternative may start with ^ and end with $.
  absl::StatusOr<Piece> Alternation(int depth, bool search) {
    if (depth > 64) return Error("groups nested too deeply");
    std::vector<Piece> alts;
    while (true) {
      absl::StatusOr<Piece> s = Sequence(depth, search);
      if (!s.ok()) return s.status();
      alts.push_back(*s);
      if (Peek() != '|') break;
      ++pos_;
    }
    if (alts.size() == 1) return alts[0];
    Piece out{b_.Nothing(), INT64_MAX, 0};
    std::vector<Expr> exprs;
    for (const Piece& p : alts) {
      exprs.push_back(p.expr);
      out.min = std::min(out.min, p.min);
      out.max = (out.max < 0 || p.max < 0) ? -1 : std::max(out.max, p.max);
    }
    out.expr = b_.Alt(std::move(exprs));
    return out;
  }

  absl::StatusOr<Piece> Sequence(int depth, bool search) {
    const bool top = depth == 0;
    bool anchored_start = false, anchored_end = false;
    if (top && Peek() == '^') {
      anchored_start = true;
      ++pos_;
    }
    std::vector<Expr> items;
    Piece out{b_.Empty(), 0, 0};
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
      absl::StatusOr<Piece> a = Quantified(depth);
      if (!a.ok()) return a.status();
      items.push_back(a->expr);
      out.min += a->min;
      out.max = (out.max < 0 || a->max < 0) ? -1 : out.max + a->max;
      if (out.min > 1'000'000) return Error("a pattern too long");
    }
    if (top && search) {
      if (!anchored_start) {
        items.insert(items.begin(), b_.Repeat(AnyChar(), 0, -1));
        out.max = -1;
      }
      if (!anchored_end) {
        items.push_back(b_.Repeat(AnyChar(), 0, -1));
        out.max = -1;
      }
    }
    out.expr = b_.Seq(std::move(items));
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

  absl::StatusOr<Piece> Quantified(int depth) {
    absl::StatusOr<Piece> a = Atom(depth);
    if (!a.ok()) return a.status();
    Piece p = *a;
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
        return absl::ResourceExhaustedError(absl::StrCat(
            "the pattern `", std::string(src_), "` repeats ", std::max(n, m), " times, over the limit of ",
            b_.limits().max_repeat, " (max_repeat)"));
      }
      if (Peek() == '?') ++pos_;  // lazy: the same strings
      if (Peek() == '+' || Peek() == '*' || Peek() == '{') return Error("a quantifier repeated");
      p.expr = b_.Repeat(p.expr, int32_t(n), int32_t(m));
      p.min *= n;
      p.max = (m < 0 && p.max != 0) ? -1 : (p.max < 0 ? (m == 0 ? 0 : -1) : p.max * m);
      if (p.min > 1'000'000) return Error("a pattern too long");
    }
    return p;
  }

  absl::StatusOr<Piece> Atom(int depth) {
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
      absl::StatusOr<Piece> inner = Alternation(depth + 1, false);
      if (!inner.ok()) return inner.status();
      if (Peek() != ')') return Error("an unterminated group");
      ++pos_;
      return inner;
    }
    if (c == '[') {
      absl::StatusOr<Ranges> set = Class();
      if (!set.ok()) return set.status();
      return Piece{Emit(*set), 1, 1};
    }
    if (c == '.') {
      ++pos_;
      return Piece{Emit(Complement(kLineTerminators)), 1, 1};
    }
    if (c == '*' || c == '+' || c == '?') return Error("a quantifier with nothing to repeat");
    if (c == '\\') {
      absl::StatusOr<Ranges> set = Escape(/*in_class=*/false);
      if (!set.ok()) return set.status();
      return Piece{Emit(*set), 1, 1};
    }
    ++pos_;
    return Piece{Emit({{c, c}}), 1, 1};
  }

  absl::StatusOr<uint32_t> Hex(int digits) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      const uint32_t h = Peek();
      int d = h >= '0' && h <= '9' ? int(h - '0')
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
      case 'd': return kDigit;
      case 'w': return kWord;
      case 's': return kSpace;
      // The complements, where Python (Unicode classes) and ECMA (ASCII \d \w) agree.
      case 'D': return Intersect(Complement(kDigit), {{0, 0x65F}});
      case 'W': return Intersect(Complement(kWord), kAscii);
      case 'S': return Complement(kAnySpace);
      case 'n': return Ranges{{'\n', '\n'}};
      case 't': return Ranges{{'\t', '\t'}};
      case 'r': return Ranges{{'\r', '\r'}};
      case 'f': return Ranges{{'\f', '\f'}};
      case 'v': return Ranges{{'\v', '\v'}};
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
        unicode_dependent |= kind == 'd' || kind == 'w' || kind == 's' || kind == 'D' ||
                             kind == 'W' || kind == 'S';
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
    set = Normalize(set);
    if (!negate) return set;
    Ranges out = Complement(set);
    // [^\d] and friends: Python's \d \w \s are Unicode, so keep to ASCII there.
    return unicode_dependent ? Intersect(out, kAscii) : out;
  }

  GrammarBuilder& b_;
  std::string_view src_;
  std::vector<uint32_t> cps_;
  size_t pos_ = 0;
  Expr any_char_ = -1;
};

}  // namespace

absl::StatusOr<StringRegex> CompileStringRegex(GrammarBuilder& b, std::string_view pattern,
                                               bool search) {
  Parser p(b, pattern);
  return p.Run(search);
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
