#include "engine/grammar/regex_parser.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/grammar/unicode_properties.h"
#include "engine/grammar/utf8_class.h"

namespace heavykv::grammar {
namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

constexpr uint32_t kMaxCp = 0x10FFFF;

void Append(Ranges& to, const Ranges& from) { to.insert(to.end(), from.begin(), from.end()); }

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
// ECMA-262 WhiteSpace and LineTerminator (what \s matches).
const Ranges kSpace = {{0x09, 0x0D},     {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680},
                       {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
                       {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
// ECMA-262 LineTerminator: what `.` does not match.
const Ranges kLineTerminators = {{0x0A, 0x0A}, {0x0D, 0x0D}, {0x2028, 0x2029}};

bool IsHex(uint32_t c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
uint32_t HexValue(uint32_t c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; }
bool IsAsciiAlnum(uint32_t c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

// Recursive descent over the pattern's code points (ECMA-262's Pattern grammar, with the Annex B
// leniencies people rely on: a `{` that starts no quantifier, and `]` `}`, are literals).
class Parser {
 public:
  Parser(std::string_view pattern, const GrammarLimits& limits) : p_(pattern), limits_(limits) {}

  absl::StatusOr<int> Parse() {
    int root = -1;
    if (absl::Status s = ParseAlternation(0, &root); !s.ok()) return s;
    if (pos_ < p_.size()) return Error("an unmatched `)`", pos_);
    return root;
  }

  std::vector<RegexNode> nodes;

 private:
  absl::Status Error(std::string_view what, size_t at) const {
    return absl::InvalidArgumentError(
        absl::StrCat("regex: ", std::string(what), " at offset ", at, " of the pattern"));
  }
  absl::Status Unsupported(std::string_view what, size_t at) const {
    return absl::InvalidArgumentError(absl::StrCat("regex: ", std::string(what), " at offset ", at,
                                                   " cannot be compiled exactly (unsupported)"));
  }

  bool AtEnd() const { return pos_ >= p_.size(); }
  char Peek(size_t ahead = 0) const { return pos_ + ahead < p_.size() ? p_[pos_ + ahead] : '\0'; }

  // Decodes the UTF-8 code point at pos_ and advances past it.
  absl::Status NextCp(uint32_t* cp) {
    const size_t at = pos_;
    const uint8_t c = uint8_t(p_[pos_]);
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || pos_ + len > p_.size()) return Error("invalid UTF-8", at);
    uint32_t v = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
    for (int i = 1; i < len; ++i) {
      const uint8_t d = uint8_t(p_[pos_ + i]);
      if ((d & 0xC0) != 0x80) return Error("invalid UTF-8", at);
      v = (v << 6) | (d & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < kMin[len] || v > kMaxCp || (v >= 0xD800 && v <= 0xDFFF)) {
      return Error("invalid UTF-8", at);
    }
    pos_ += len;
    *cp = v;
    return absl::OkStatus();
  }

  int Add(RegexNode n) {
    nodes.push_back(std::move(n));
    return int(nodes.size() - 1);
  }
  int AddChars(Ranges r) {
    RegexNode n;
    n.kind = RegexNode::Kind::kChars;
    n.chars = NormalizeRanges(std::move(r));
    return Add(std::move(n));
  }

  // Alternation := Sequence ('|' Sequence)*, up to a `)` or the end (neither consumed).
  absl::Status ParseAlternation(int depth, int* out) {
    if (depth > limits_.max_depth) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "regex: groups nest deeper than the limit of ", limits_.max_depth, " at offset ", pos_));
    }
    std::vector<int> alts;
    while (true) {
      int seq = -1;
      if (absl::Status s = ParseSequence(depth, &seq); !s.ok()) return s;
      alts.push_back(seq);
      if (Peek() != '|' || AtEnd()) break;
      ++pos_;
    }
    if (alts.size() == 1) {
      *out = alts[0];
      return absl::OkStatus();
    }
    RegexNode n;
    n.kind = RegexNode::Kind::kAlt;
    for (int a : alts) {
      n.has_start |= nodes[a].has_start;
      n.has_end |= nodes[a].has_end;
    }
    n.kids = std::move(alts);
    *out = Add(std::move(n));
    return absl::OkStatus();
  }

  // Sequence := (Atom Quantifier?)*. Runs of anchor-free items become one child, so a sequence
  // with anchors has few children (the lowering treats those specially).
  absl::Status ParseSequence(int depth, int* out) {
    std::vector<int> items;
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      const size_t at = pos_;
      int atom = -1;
      if (absl::Status s = ParseAtom(depth, &atom); !s.ok()) return s;
      if (absl::Status s = ParseQuantifier(at, &atom); !s.ok()) return s;
      items.push_back(atom);
    }
    std::vector<int> grouped, run;
    const auto flush = [&] {
      if (run.size() == 1) grouped.push_back(run[0]);
      if (run.size() > 1) {
        RegexNode n;
        n.kind = RegexNode::Kind::kSeq;
        n.kids = std::move(run);
        grouped.push_back(Add(std::move(n)));
      }
      run.clear();
    };
    bool anchored = false;
    for (int i : items) {
      if (nodes[i].has_start || nodes[i].has_end) {
        anchored = true;
        flush();
        grouped.push_back(i);
      } else {
        run.push_back(i);
      }
    }
    if (!anchored) {
      grouped = std::move(items);
    } else {
      flush();
    }
    if (grouped.empty()) {
      *out = Add(RegexNode{});
      return absl::OkStatus();
    }
    if (grouped.size() == 1) {
      *out = grouped[0];
      return absl::OkStatus();
    }
    RegexNode n;
    n.kind = RegexNode::Kind::kSeq;
    for (int k : grouped) {
      n.has_start |= nodes[k].has_start;
      n.has_end |= nodes[k].has_end;
    }
    n.kids = std::move(grouped);
    *out = Add(std::move(n));
    return absl::OkStatus();
  }

  // Reads a decimal number at pos_ (at least one digit); false when there is none. Saturates.
  bool ReadNumber(int64_t* v) {
    if (!(Peek() >= '0' && Peek() <= '9')) return false;
    *v = 0;
    while (Peek() >= '0' && Peek() <= '9') {
      *v = std::min<int64_t>(*v * 10 + (Peek() - '0'), int64_t{1} << 40);
      ++pos_;
    }
    return true;
  }

  // At a `{`: whether it starts a quantifier {n} {n,} {n,m}; if so reads it.
  bool ReadBraces(int64_t* min, int64_t* max) {
    const size_t save = pos_;
    ++pos_;
    if (!ReadNumber(min)) {
      pos_ = save;
      return false;
    }
    *max = *min;
    if (Peek() == ',') {
      ++pos_;
      *max = -1;
      ReadNumber(max);
    }
    if (Peek() != '}') {
      pos_ = save;
      return false;
    }
    ++pos_;
    return true;
  }

  absl::Status ParseQuantifier(size_t atom_at, int* atom) {
    const size_t at = pos_;
    int64_t min = 0, max = 0;
    const char c = Peek();
    if (c == '*') {
      min = 0, max = -1, ++pos_;
    } else if (c == '+') {
      min = 1, max = -1, ++pos_;
    } else if (c == '?') {
      min = 0, max = 1, ++pos_;
    } else if (c == '{' && ReadBraces(&min, &max)) {
      if (max >= 0 && max < min) return Error("a quantifier {n,m} with m < n", at);
    } else if (c == '{' && Peek(1) == ',') {
      return Error("`{,` (not a quantifier in ECMA-262: write {0,n}, or \\{ for the character)",
                   at);
    } else {
      return absl::OkStatus();
    }
    if (Peek() == '?') ++pos_;  // lazy: the same strings match
    const RegexNode& a = nodes[*atom];
    if (a.kind == RegexNode::Kind::kStart || a.kind == RegexNode::Kind::kEnd) {
      return Error("a quantifier after an anchor", at);
    }
    if (min > limits_.max_repeat || max > limits_.max_repeat) {
      return absl::ResourceExhaustedError(
          absl::StrCat("regex: the repetition count ", std::max(min, max), " at offset ", at,
                       " is over the limit of ", limits_.max_repeat));
    }
    if ((a.has_start || a.has_end) && max != 1 && max != 0) {
      return Unsupported("a repeated group that contains an anchor (^ or $)", atom_at);
    }
    if (min == 1 && max == 1) return absl::OkStatus();
    RegexNode n;
    n.kind = RegexNode::Kind::kRepeat;
    n.min = int32_t(min);
    n.max = int32_t(max);
    if (max != 0) {
      n.has_start = a.has_start;
      n.has_end = a.has_end;
      n.kids = {*atom};
    } else {
      n.kind = RegexNode::Kind::kEmpty;  // x{0}: x is never tried
    }
    *atom = Add(std::move(n));
    return absl::OkStatus();
  }

  absl::Status ParseAtom(int depth, int* out) {
    const size_t at = pos_;
    const char c = Peek();
    switch (c) {
      case '^':
      case '$': {
        ++pos_;
        RegexNode n;
        n.kind = c == '^' ? RegexNode::Kind::kStart : RegexNode::Kind::kEnd;
        n.has_start = c == '^';
        n.has_end = c == '$';
        *out = Add(std::move(n));
        return absl::OkStatus();
      }
      case '.':
        ++pos_;
        *out = AddChars(ComplementRanges(kLineTerminators));
        return absl::OkStatus();
      case '*':
      case '+':
      case '?':
        return Error(absl::StrCat("nothing to repeat before `", std::string(1, c), "`"), at);
      case '{': {
        int64_t lo, hi;
        if (ReadBraces(&lo, &hi)) return Error("nothing to repeat before `{`", at);
        if (Peek(1) == ',') {
          return Error("`{,` (not a quantifier in ECMA-262: write {0,n}, or \\{)", at);
        }
        ++pos_;
        *out = AddChars({{'{', '{'}});
        return absl::OkStatus();
      }
      case '(':
        return ParseGroup(depth, out);
      case '[': {
        Ranges r;
        if (absl::Status s = ParseClass(&r); !s.ok()) return s;
        *out = AddChars(std::move(r));
        return absl::OkStatus();
      }
      case '\\': {
        Ranges r;
        if (absl::Status s = ParseEscape(/*in_class=*/false, &r, nullptr); !s.ok()) return s;
        *out = AddChars(std::move(r));
        return absl::OkStatus();
      }
      default: {
        uint32_t cp = 0;
        if (absl::Status s = NextCp(&cp); !s.ok()) return s;
        *out = AddChars({{cp, cp}});
        return absl::OkStatus();
      }
    }
  }

  absl::Status ParseGroup(int depth, int* out) {
    const size_t at = pos_;
    ++pos_;  // (
    if (Peek() == '?') {
      const std::string_view rest = p_.substr(pos_);
      if (rest.starts_with("?:")) {
        pos_ += 2;
      } else if (rest.starts_with("?=") || rest.starts_with("?!")) {
        return Unsupported("a lookahead (?= / (?!", at);
      } else if (rest.starts_with("?<=") || rest.starts_with("?<!")) {
        return Unsupported("a lookbehind (?<= / (?<!", at);
      } else if (rest.starts_with("?<")) {
        pos_ += 2;
        const size_t name_at = pos_;
        while (!AtEnd() && Peek() != '>' && Peek() != ')') ++pos_;
        if (Peek() != '>' || pos_ == name_at) return Error("a malformed group name", at);
        ++pos_;
      } else if (rest.starts_with("?P<")) {
        return Error("a Python-style named group (?P<name>...) (ECMA-262 writes (?<name>...))", at);
      } else {
        return Unsupported("a group modifier (inline flags such as (?i) are not ECMA-262)", at);
      }
    }
    int inner = -1;
    if (absl::Status s = ParseAlternation(depth + 1, &inner); !s.ok()) return s;
    if (Peek() != ')' || AtEnd()) return Error("a `(` without its `)`", at);
    ++pos_;
    *out = inner;
    return absl::OkStatus();
  }

  absl::Status ParseClass(Ranges* out) {
    const size_t at = pos_;
    ++pos_;  // [
    bool negate = false;
    if (Peek() == '^' && !AtEnd()) {
      negate = true;
      ++pos_;
    }
    Ranges set;
    while (true) {
      if (AtEnd()) return Error("a `[` without its `]`", at);
      if (Peek() == ']') {
        ++pos_;
        break;
      }
      // One class atom: a code point (lo == hi, is_class false) or a class escape.
      Ranges first;
      bool first_is_class = false;
      if (absl::Status s = ClassAtom(&first, &first_is_class); !s.ok()) return s;
      if (Peek() == '-' && pos_ + 1 < p_.size() && p_[pos_ + 1] != ']') {
        const size_t dash_at = pos_;
        ++pos_;
        Ranges second;
        bool second_is_class = false;
        if (absl::Status s = ClassAtom(&second, &second_is_class); !s.ok()) return s;
        if (first_is_class || second_is_class) {
          // Annex B: [\w-.] is \w, '-' and '.'.
          Append(set, first);
          Append(set, second);
          set.push_back({'-', '-'});
          continue;
        }
        if (first[0].first > second[0].first) {
          return Error("a character range out of order", dash_at);
        }
        set.push_back({first[0].first, second[0].first});
        continue;
      }
      Append(set, first);
    }
    *out = negate ? ComplementRanges(set) : NormalizeRanges(std::move(set));
    return absl::OkStatus();
  }

  absl::Status ClassAtom(Ranges* out, bool* is_class) {
    *is_class = false;
    if (Peek() == '\\') return ParseEscape(/*in_class=*/true, out, is_class);
    uint32_t cp = 0;
    if (absl::Status s = NextCp(&cp); !s.ok()) return s;
    *out = {{cp, cp}};
    return absl::OkStatus();
  }

  // Reads exactly `n` hex digits at pos_; false (pos_ unchanged) when they are not there.
  bool ReadHex(int n, uint32_t* v) {
    if (pos_ + n > p_.size()) return false;
    uint32_t x = 0;
    for (int i = 0; i < n; ++i) {
      if (!IsHex(uint8_t(p_[pos_ + i]))) return false;
      x = x * 16 + HexValue(uint8_t(p_[pos_ + i]));
    }
    pos_ += n;
    *v = x;
    return true;
  }

  // \u escapes: \uHHHH (a surrogate pair of two escapes is one code point) and \u{H...}.
  absl::Status ParseUnicodeEscape(size_t at, uint32_t* cp) {
    if (Peek() == '{') {
      ++pos_;
      uint32_t v = 0;
      int digits = 0;
      while (!AtEnd() && IsHex(uint8_t(Peek()))) {
        v = v * 16 + HexValue(uint8_t(Peek()));
        if (v > kMaxCp) return Error("a \\u{...} escape past U+10FFFF", at);
        ++pos_, ++digits;
      }
      if (digits == 0 || Peek() != '}') return Error("a malformed \\u{...} escape", at);
      ++pos_;
      *cp = v;
      return absl::OkStatus();
    }
    if (!ReadHex(4, cp)) return Error("a malformed \\u escape (\\uHHHH)", at);
    if (*cp >= 0xD800 && *cp <= 0xDBFF && p_.substr(pos_).starts_with("\\u")) {
      const size_t save = pos_;
      pos_ += 2;
      uint32_t lo = 0;
      if (ReadHex(4, &lo) && lo >= 0xDC00 && lo <= 0xDFFF) {
        *cp = 0x10000 + ((*cp - 0xD800) << 10) + (lo - 0xDC00);
        return absl::OkStatus();
      }
      pos_ = save;
    }
    return absl::OkStatus();  // a lone surrogate: matches nothing in UTF-8 text
  }

  absl::Status ParseEscape(bool in_class, Ranges* out, bool* is_class) {
    const size_t at = pos_;
    ++pos_;  // backslash
    if (AtEnd()) return Error("a `\\` at the end of the pattern", at);
    uint32_t c = 0;
    if (absl::Status s = NextCp(&c); !s.ok()) return s;
    const auto one = [&](uint32_t cp) {
      *out = {{cp, cp}};
      return absl::OkStatus();
    };
    const auto cls = [&](const Ranges& r) {
      if (is_class != nullptr) *is_class = true;
      *out = r;
      return absl::OkStatus();
    };
    switch (c) {
      case 'd':
        return cls(kDigit);
      case 'D':
        return cls(ComplementRanges(kDigit));
      case 'w':
        return cls(kWord);
      case 'W':
        return cls(ComplementRanges(kWord));
      case 's':
        return cls(kSpace);
      case 'S':
        return cls(ComplementRanges(kSpace));
      case 'n':
        return one('\n');
      case 't':
        return one('\t');
      case 'r':
        return one('\r');
      case 'f':
        return one('\f');
      case 'v':
        return one('\v');
      case 'b':
        if (in_class) return one('\b');
        return Unsupported("a word boundary \\b", at);
      case 'B':
        return Unsupported("a word boundary \\B", at);
      case '0':
        if (Peek() >= '0' && Peek() <= '9') return Unsupported("a legacy octal escape", at);
        return one(0);
      case 'c': {
        const char l = Peek();
        if (!((l >= 'a' && l <= 'z') || (l >= 'A' && l <= 'Z'))) {
          return Error("a malformed control escape (\\cA..\\cZ)", at);
        }
        ++pos_;
        return one(uint32_t(l) % 32);
      }
      case 'x': {
        uint32_t v = 0;
        if (!ReadHex(2, &v)) return Error("a malformed \\x escape (\\xHH)", at);
        return one(v);
      }
      case 'u': {
        uint32_t v = 0;
        if (absl::Status s = ParseUnicodeEscape(at, &v); !s.ok()) return s;
        return one(v);
      }
      case 'k':
        return Unsupported("a named backreference \\k", at);
      case 'p':
      case 'P': {
        const size_t brace = pos_;
        if (Peek() != '{') return Error("a malformed \\p{...} escape", at);
        while (!AtEnd() && Peek() != '}') ++pos_;
        if (AtEnd()) return Error("a malformed \\p{...} escape", at);
        const std::string_view name = p_.substr(brace + 1, pos_ - brace - 1);
        ++pos_;
        Ranges r;
        if (!AppendUnicodeProperty(name, &r)) {
          return Unsupported(
              absl::StrCat("the Unicode property escape \\p{", std::string(name), "}"), at);
        }
        return cls(c == 'P' ? ComplementRanges(r) : r);
      }
      default:
        break;
    }
    if (c >= '1' && c <= '9') return Unsupported("a backreference", at);
    if (c == '-' || !IsAsciiAlnum(c)) return one(c);  // \. \\ \/ \- \$ ...
    return Error(absl::StrCat("an unknown escape \\", std::string(1, char(c))), at);
  }

  std::string_view p_;
  const GrammarLimits& limits_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<RegexTree> ParseRegex(std::string_view pattern, const GrammarLimits& limits) {
  Parser parser(pattern, limits);
  absl::StatusOr<int> root = parser.Parse();
  if (!root.ok()) return root.status();
  return RegexTree{std::move(parser.nodes), *root};
}

}  // namespace heavykv::grammar
