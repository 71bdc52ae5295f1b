#include "engine/grammar/gbnf.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace heavykv::grammar {
namespace {

using Expr = GrammarBuilder::Expr;
using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
}
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

std::string Utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += char(0xE0 | (cp >> 12));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  } else {
    s += char(0xF0 | (cp >> 18));
    s += char(0x80 | ((cp >> 12) & 0x3F));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

// One pass over the text: rules are declared when first named (defined or referred to) and
// defined once; sequences stop at a newline outside parentheses, as llama.cpp's parser does
// (a newline right after `::=` or `|` continues the rule).
class GbnfParser {
 public:
  GbnfParser(std::string_view text, const GrammarLimits& limits) : t_(text), b_(limits) {}

  absl::StatusOr<Grammar> Run(std::string_view root_name) && {
    SkipSpace(/*newlines=*/true);
    while (!AtEnd()) {
      if (absl::Status s = ParseRule(); !s.ok()) return s;
    }
    const std::string* undefined = nullptr;  // the first one used, for a stable message
    for (const auto& [name, info] : rules_) {
      if (!b_.IsDefined(info.id) &&
          (undefined == nullptr || info.first_use < rules_.at(*undefined).first_use)) {
        undefined = &name;
      }
    }
    if (undefined != nullptr) {
      return Error(absl::StrCat("the rule `", *undefined, "` is used but never defined"),
                   rules_.at(*undefined).first_use);
    }
    auto it = rules_.find(std::string(root_name));
    if (it == rules_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gbnf: the grammar has no `", std::string(root_name), "` rule to start from"));
    }
    absl::StatusOr<Grammar> g = std::move(b_).Build(it->second.id);
    if (!g.ok()) {
      return absl::Status(g.status().code(),
                          absl::StrCat("gbnf: ", std::string(g.status().message())));
    }
    return g;
  }

 private:
  struct RuleInfo {
    RuleId id;
    size_t first_use;
  };

  bool AtEnd() const { return pos_ >= t_.size(); }
  char Peek(size_t ahead = 0) const { return pos_ + ahead < t_.size() ? t_[pos_ + ahead] : '\0'; }

  absl::Status Error(std::string_view what, size_t at) const {
    int line = 1;
    size_t line_start = 0;
    for (size_t i = 0; i < at && i < t_.size(); ++i) {
      if (t_[i] == '\n') {
        ++line;
        line_start = i + 1;
      }
    }
    return absl::InvalidArgumentError(absl::StrCat("gbnf: line ", line, ", column ",
                                                   at - line_start + 1, ": ", std::string(what)));
  }

  // Spaces, tabs and # comments; newlines too when `newlines`.
  void SkipSpace(bool newlines) {
    while (!AtEnd()) {
      const char c = Peek();
      if (c == '#') {
        while (!AtEnd() && Peek() != '\n' && Peek() != '\r') ++pos_;
      } else if (c == ' ' || c == '\t' || (newlines && (c == '\n' || c == '\r'))) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  RuleId Rule(std::string_view name, size_t at) {
    auto [it, fresh] = rules_.try_emplace(std::string(name), RuleInfo{-1, at});
    if (fresh) it->second.id = b_.DeclareRule(std::string(name));
    return it->second.id;
  }

  absl::Status ParseRule() {
    const size_t at = pos_;
    while (IsNameChar(Peek())) ++pos_;
    if (pos_ == at && Peek() == '|') {
      return Error(
          "a `|` that starts a line (a rule goes on past a newline only after a `|` "
          "that ends the line, or inside parentheses)",
          at);
    }
    if (pos_ == at) return Error("expected a rule name", at);
    const std::string_view name = t_.substr(at, pos_ - at);
    SkipSpace(false);
    if (t_.substr(pos_, 3) != "::=") return Error("expected `::=` after the rule name", pos_);
    pos_ += 3;
    SkipSpace(true);
    const RuleId id = Rule(name, at);
    if (b_.IsDefined(id))
      return Error(absl::StrCat("the rule `", std::string(name), "` is defined twice"), at);
    Expr body;
    if (absl::Status s = ParseAlternates(/*nested=*/false, 0, &body); !s.ok()) return s;
    b_.DefineRule(id, body);
    if (Peek() == '\r') ++pos_;
    if (Peek() == '\n') {
      ++pos_;
    } else if (!AtEnd()) {
      return Error(absl::StrCat("unexpected `", std::string(1, Peek()), "`"), pos_);
    }
    SkipSpace(true);
    return absl::OkStatus();
  }

  absl::Status ParseAlternates(bool nested, int depth, Expr* out) {
    if (depth > b_.limits().max_depth) {
      return absl::ResourceExhaustedError(
          absl::StrCat("gbnf: groups nest deeper than the limit of ", b_.limits().max_depth));
    }
    std::vector<Expr> alts;
    while (true) {
      Expr seq;
      if (absl::Status s = ParseSequence(nested, depth, &seq); !s.ok()) return s;
      alts.push_back(seq);
      if (Peek() != '|' || AtEnd()) break;
      ++pos_;
      SkipSpace(true);
    }
    *out = b_.Alt(std::move(alts));
    return absl::OkStatus();
  }

  absl::Status ParseSequence(bool nested, int depth, Expr* out) {
    std::vector<Expr> items;
    while (!AtEnd()) {
      const size_t at = pos_;
      const char c = Peek();
      Expr item;
      if (c == '"') {
        if (absl::Status s = ParseLiteral(&item); !s.ok()) return s;
      } else if (c == '[') {
        if (absl::Status s = ParseClass(&item); !s.ok()) return s;
      } else if (c == '.') {
        ++pos_;
        item = b_.CodePoints({{0, 0x10FFFF}});
      } else if (IsNameChar(c)) {
        while (IsNameChar(Peek())) ++pos_;
        item = b_.Ref(Rule(t_.substr(at, pos_ - at), at));
      } else if (c == '(') {
        ++pos_;
        SkipSpace(true);
        if (absl::Status s = ParseAlternates(/*nested=*/true, depth + 1, &item); !s.ok()) {
          return s;
        }
        if (Peek() != ')' || AtEnd()) return Error("a `(` without its `)`", at);
        ++pos_;
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (items.empty()) {
          return Error(absl::StrCat("`", std::string(1, c), "` with nothing before it to repeat"),
                       at);
        }
        int64_t min = 0, max = -1;
        if (absl::Status s = ParseQuantifier(&min, &max); !s.ok()) return s;
        items.back() = b_.Repeat(items.back(), int32_t(min), int32_t(max));
        SkipSpace(nested);
        continue;
      } else if (c == '<' || c == '!') {
        return Error("token references (<[id]>, <|name|>, !) are not supported", at);
      } else {
        break;
      }
      items.push_back(item);
      SkipSpace(nested);
    }
    *out = b_.Seq(std::move(items));
    return absl::OkStatus();
  }

  absl::Status ParseQuantifier(int64_t* min, int64_t* max) {
    const size_t at = pos_;
    const char c = Peek();
    ++pos_;
    if (c == '*') {
      *min = 0, *max = -1;
    } else if (c == '+') {
      *min = 1, *max = -1;
    } else if (c == '?') {
      *min = 0, *max = 1;
    } else {  // {m} {m,} {m,n}
      SkipSpace(false);
      if (!ReadInt(min)) return Error("expected a count after `{`", pos_);
      SkipSpace(false);
      *max = *min;
      if (Peek() == ',') {
        ++pos_;
        SkipSpace(false);
        *max = -1;
        ReadInt(max);
        SkipSpace(false);
      }
      if (Peek() != '}') return Error("expected `}` to close the repetition", pos_);
      ++pos_;
      if (*max >= 0 && *max < *min) return Error("a repetition {m,n} with n < m", at);
    }
    const int64_t limit = b_.limits().max_repeat;
    if (*min > limit || *max > limit) {
      const std::string msg = absl::StrCat("the repetition count ", std::max(*min, *max),
                                           " is over the limit of ", limit);
      absl::Status s = Error(msg, at);
      return absl::ResourceExhaustedError(s.message());
    }
    return absl::OkStatus();
  }

  bool ReadInt(int64_t* v) {
    if (!IsDigit(Peek())) return false;
    *v = 0;
    while (IsDigit(Peek())) {
      *v = std::min<int64_t>(*v * 10 + (Peek() - '0'), int64_t{1} << 40);
      ++pos_;
    }
    return true;
  }

  // Decodes one UTF-8 code point of the text at pos_.
  absl::Status NextCp(uint32_t* cp) {
    const size_t at = pos_;
    const uint8_t c = uint8_t(t_[pos_]);
    const int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || pos_ + len > t_.size()) return Error("invalid UTF-8", at);
    uint32_t v = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
    for (int i = 1; i < len; ++i) {
      const uint8_t d = uint8_t(t_[pos_ + i]);
      if ((d & 0xC0) != 0x80) return Error("invalid UTF-8", at);
      v = (v << 6) | (d & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < kMin[len] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
      return Error("invalid UTF-8", at);
    }
    pos_ += len;
    *cp = v;
    return absl::OkStatus();
  }

  // One character of a literal or class: itself, or an escape (\x \u \U \t \r \n \\ \" \[ \]).
  absl::Status ParseChar(uint32_t* cp) {
    const size_t at = pos_;
    if (Peek() != '\\') return NextCp(cp);
    ++pos_;
    const char e = Peek();
    ++pos_;
    int hex = 0;
    switch (e) {
      case 'x':
        hex = 2;
        break;
      case 'u':
        hex = 4;
        break;
      case 'U':
        hex = 8;
        break;
      case 't':
        *cp = '\t';
        return absl::OkStatus();
      case 'r':
        *cp = '\r';
        return absl::OkStatus();
      case 'n':
        *cp = '\n';
        return absl::OkStatus();
      case '\\':
      case '"':
      case '[':
      case ']':
        *cp = uint8_t(e);
        return absl::OkStatus();
      default:
        return Error("an unknown escape", at);
    }
    uint32_t v = 0;
    for (int i = 0; i < hex; ++i) {
      const char h = Peek();
      int d = -1;
      if (h >= '0' && h <= '9') d = h - '0';
      if (h >= 'a' && h <= 'f') d = h - 'a' + 10;
      if (h >= 'A' && h <= 'F') d = h - 'A' + 10;
      if (d < 0) return Error(absl::StrCat("expected ", hex, " hex digits in the escape"), at);
      v = v * 16 + uint32_t(d);
      ++pos_;
    }
    if (v > 0x10FFFF) return Error("an escape past U+10FFFF", at);
    *cp = v;
    return absl::OkStatus();
  }

  absl::Status ParseLiteral(Expr* out) {
    const size_t at = pos_;
    ++pos_;
    std::string bytes;
    bool surrogate = false;
    while (true) {
      if (AtEnd()) return Error("a `\"` without its closing `\"`", at);
      if (Peek() == '"') break;
      uint32_t cp = 0;
      if (absl::Status s = ParseChar(&cp); !s.ok()) return s;
      surrogate |= cp >= 0xD800 && cp <= 0xDFFF;
      bytes += Utf8(cp);
    }
    ++pos_;
    // A surrogate code point is never in UTF-8 text: such a literal matches nothing.
    *out = surrogate ? b_.Nothing() : b_.Literal(bytes);
    return absl::OkStatus();
  }

  absl::Status ParseClass(Expr* out) {
    const size_t at = pos_;
    ++pos_;
    bool negate = false;
    if (Peek() == '^') {
      negate = true;
      ++pos_;
    }
    Ranges ranges;
    while (true) {
      if (AtEnd()) return Error("a `[` without its `]`", at);
      if (Peek() == ']') break;
      uint32_t lo = 0, hi = 0;
      if (absl::Status s = ParseChar(&lo); !s.ok()) return s;
      hi = lo;
      if (Peek() == '-' && Peek(1) != ']' && pos_ + 1 < t_.size()) {
        const size_t dash = pos_;
        ++pos_;
        if (absl::Status s = ParseChar(&hi); !s.ok()) return s;
        if (hi < lo) return Error("a character range out of order", dash);
      }
      ranges.push_back({lo, hi});
    }
    ++pos_;
    *out = b_.CodePoints(std::move(ranges), negate);
    return absl::OkStatus();
  }

  std::string_view t_;
  GrammarBuilder b_;
  size_t pos_ = 0;
  absl::flat_hash_map<std::string, RuleInfo> rules_;
};

}  // namespace

absl::StatusOr<Grammar> CompileGbnf(std::string_view text, std::string_view root,
                                    const GrammarLimits& limits) {
  return GbnfParser(text, limits).Run(root);
}

}  // namespace heavykv::grammar
