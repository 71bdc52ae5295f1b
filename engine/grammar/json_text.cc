#include "engine/grammar/json_text.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "engine/grammar/utf8.h"

namespace heavykv::grammar {
namespace {

using json = nlohmann::ordered_json;

// Python's repr(float): the shortest text that reads back as `d`, fixed notation for exponents in
// [-4, 16), scientific with a sign and at least two exponent digits otherwise.
std::string PythonFloatRepr(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d < 0 ? "-Infinity" : "Infinity";
  char buf[64];
  auto [end, ec] =
      std::to_chars(buf, buf + sizeof(buf), std::fabs(d), std::chars_format::scientific);
  std::string sci(buf, end);  // d[.ddd]e[+-]xx
  const size_t e_pos = sci.find('e');
  std::string digits = sci.substr(0, 1);
  if (e_pos > 1) digits += sci.substr(2, e_pos - 2);
  const int exp = std::stoi(sci.substr(e_pos + 1));
  std::string out = std::signbit(d) ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      std::string int_part = digits.substr(0, std::min<size_t>(digits.size(), exp + 1));
      while (int_part.size() < size_t(exp) + 1) int_part += '0';
      std::string frac = digits.size() > size_t(exp) + 1 ? digits.substr(exp + 1) : "0";
      absl::StrAppend(&out, int_part, ".", frac);
    } else {
      absl::StrAppend(&out, "0.", std::string(-exp - 1, '0'), digits);
    }
    return out;
  }
  absl::StrAppend(&out, digits.substr(0, 1));
  if (digits.size() > 1) absl::StrAppend(&out, ".", digits.substr(1));
  absl::StrAppend(&out, "e", exp < 0 ? "-" : "+", std::abs(exp) < 10 ? "0" : "", std::abs(exp));
  return out;
}

void AppendPythonString(std::string_view s, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += char(c);
        }
    }
  }
  out += '"';
}

void AppendPython(const json& v, std::string& out) {
  switch (v.type()) {
    case json::value_t::null:
      out += "null";
      break;
    case json::value_t::boolean:
      out += v.get<bool>() ? "true" : "false";
      break;
    case json::value_t::number_integer:
      out += std::to_string(v.get<int64_t>());
      break;
    case json::value_t::number_unsigned:
      out += std::to_string(v.get<uint64_t>());
      break;
    case json::value_t::number_float:
      out += PythonFloatRepr(v.get<double>());
      break;
    case json::value_t::string:
      AppendPythonString(v.get_ref<const std::string&>(), out);
      break;
    case json::value_t::array: {
      out += '[';
      bool first = true;
      for (const json& e : v) {
        if (!first) out += ", ";
        first = false;
        AppendPython(e, out);
      }
      out += ']';
      break;
    }
    case json::value_t::object: {
      out += '{';
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        AppendPythonString(it.key(), out);
        out += ": ";
        AppendPython(it.value(), out);
      }
      out += '}';
      break;
    }
    default:
      out += "null";
      break;
  }
}

std::string StripLeadingZeros(std::string s) {
  size_t i = 0;
  while (i + 1 < s.size() && s[i] == '0') ++i;
  return s.substr(i);
}

// Magnitudes as digit strings.
std::string MagPlusOne(std::string s) {
  int i = int(s.size()) - 1;
  while (i >= 0 && s[i] == '9') s[i--] = '0';
  if (i < 0) return "1" + s;
  ++s[i];
  return s;
}
std::string MagMinusOne(std::string s) {  // s > 0
  int i = int(s.size()) - 1;
  while (i >= 0 && s[i] == '0') s[i--] = '9';
  --s[i];
  return StripLeadingZeros(s);
}
int MagCompare(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return a.size() < b.size() ? -1 : 1;
  return a < b ? -1 : a > b ? 1 : 0;
}

}  // namespace

std::string PythonJsonDumps(const json& value) {
  std::string out;
  AppendPython(value, out);
  return out;
}

// ---- Decimal ----

std::optional<Decimal> Decimal::Parse(std::string_view t) {
  size_t i = 0;
  Decimal d;
  bool neg = false;
  if (i < t.size() && t[i] == '-') {
    neg = true;
    ++i;
  }
  std::string int_part, frac_part;
  while (i < t.size() && std::isdigit(uint8_t(t[i]))) int_part += t[i++];
  if (int_part.empty()) return std::nullopt;
  if (i < t.size() && t[i] == '.') {
    ++i;
    while (i < t.size() && std::isdigit(uint8_t(t[i]))) frac_part += t[i++];
    if (frac_part.empty()) return std::nullopt;
  }
  int64_t exp = 0;
  if (i < t.size() && (t[i] == 'e' || t[i] == 'E')) {
    ++i;
    bool eneg = false;
    if (i < t.size() && (t[i] == '+' || t[i] == '-')) eneg = t[i++] == '-';
    std::string e;
    while (i < t.size() && std::isdigit(uint8_t(t[i]))) e += t[i++];
    if (e.empty() || e.size() > 4) return std::nullopt;
    exp = std::stoi(e) * (eneg ? -1 : 1);
  }
  if (i != t.size() || exp > 400 || exp < -400) return std::nullopt;
  std::string all = int_part + frac_part;
  int64_t point = int64_t(int_part.size()) + exp;  // digits before the point
  if (point < 0) {
    all = std::string(-point, '0') + all;
    point = 0;
  }
  while (int64_t(all.size()) < point) all += '0';
  d.int_digits = StripLeadingZeros(all.substr(0, point).empty() ? "0" : all.substr(0, point));
  std::string frac = all.substr(point);
  while (!frac.empty() && frac.back() == '0') frac.pop_back();
  d.frac_digits = frac;
  d.negative = neg && !(d.int_digits == "0" && d.frac_digits.empty());
  return d;
}

std::optional<Decimal> Decimal::FromJson(const json& n) {
  if (n.is_number_integer() || n.is_number_unsigned()) return Parse(PythonJsonDumps(n));
  if (n.is_number_float()) {
    const double v = n.get<double>();
    if (!std::isfinite(v)) return std::nullopt;
    return Parse(PythonFloatRepr(v));
  }
  return std::nullopt;
}

int Decimal::Compare(const Decimal& a, const Decimal& b) {
  if (a.negative != b.negative) return a.negative ? -1 : 1;
  int c = MagCompare(a.int_digits, b.int_digits);
  if (c == 0) {
    const size_t n = std::max(a.frac_digits.size(), b.frac_digits.size());
    std::string fa = a.frac_digits, fb = b.frac_digits;
    fa.resize(n, '0');
    fb.resize(n, '0');
    c = fa < fb ? -1 : fa > fb ? 1 : 0;
  }
  return a.negative ? -c : c;
}

Decimal Decimal::Negated() const {
  Decimal d = *this;
  d.negative = !negative && !(int_digits == "0" && frac_digits.empty());
  return d;
}

Decimal Decimal::Floor() const {
  if (IsInteger()) return *this;
  Decimal d;
  d.negative = negative;
  d.int_digits = negative ? MagPlusOne(int_digits) : int_digits;
  d.negative = negative;
  if (d.int_digits == "0") d.negative = false;
  return d;
}

Decimal Decimal::Ceil() const {
  if (IsInteger()) return *this;
  Decimal d;
  d.int_digits = negative ? int_digits : MagPlusOne(int_digits);
  d.negative = negative && d.int_digits != "0";
  return d;
}

Decimal Decimal::PlusOne() const {
  Decimal d = *this;
  if (!negative) {
    d.int_digits = MagPlusOne(int_digits);
  } else {
    d.int_digits = MagMinusOne(int_digits);
    d.negative = d.int_digits != "0";
  }
  return d;
}

Decimal Decimal::MinusOne() const { return Negated().PlusOne().Negated(); }

// ---- JsonText ----

using Expr = JsonText::Expr;

Expr JsonText::Ws() {
  if (ws_ < 0) {
    Expr space = b_.Literal(" ");
    ws_ = pretty_
              ? b_.Optional(b_.Alt(
                    {space,
                     b_.Seq({b_.Literal("\n"),
                             b_.Repeat(b_.Bytes(ByteSet::Of(' ') | ByteSet::Of('\t')), 0, 20)})}))
              : b_.Optional(space);
  }
  return ws_;
}

Expr JsonText::Comma() { return b_.Seq({b_.Literal(","), Ws()}); }
Expr JsonText::Colon() { return b_.Seq({b_.Literal(":"), Ws()}); }

Expr JsonText::Digit() {
  if (digit_ < 0) digit_ = b_.Bytes(ByteSet::Range('0', '9'));
  return digit_;
}

Expr JsonText::Digits() {
  if (digits_ < 0) digits_ = b_.Repeat(Digit(), 1, -1);
  return digits_;
}

Expr JsonText::StringChar(bool canonical) {
  // Raw: every code point from U+0020 but '"' and '\'.
  Expr raw = b_.CodePoints({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}, /*negate=*/true);
  const auto hex_lower = ByteSet::Range('0', '9') | ByteSet::Range('a', 'f');
  std::vector<Expr> esc_tail = {b_.Bytes(ByteSet::Of('"') | ByteSet::Of('\\') | ByteSet::Of('b') |
                                         ByteSet::Of('f') | ByteSet::Of('n') | ByteSet::Of('r') |
                                         ByteSet::Of('t'))};
  if (canonical) {
    // \u00xx for the controls without a short escape.
    ByteSet low = ByteSet::Range('0', '7') | ByteSet::Of('b') | ByteSet::Of('e') | ByteSet::Of('f');
    esc_tail.push_back(b_.Seq({b_.Literal("u000"), b_.Bytes(low)}));
    esc_tail.push_back(b_.Seq({b_.Literal("u001"), b_.Bytes(hex_lower)}));
  } else {
    const ByteSet hex = hex_lower | ByteSet::Range('A', 'F');
    Expr h = b_.Bytes(hex);
    esc_tail.push_back(b_.Literal("/"));
    const ByteSet d = ByteSet::Of('d') | ByteSet::Of('D');
    Expr non_surrogate =
        b_.Alt({b_.Seq({b_.Bytes(ByteSet::Range('0', '9') | ByteSet::Range('a', 'c') |
                                 ByteSet::Range('A', 'C') | ByteSet::Range('e', 'f') |
                                 ByteSet::Range('E', 'F')),
                        h, h, h}),
                b_.Seq({b_.Bytes(d), b_.Bytes(ByteSet::Range('0', '7')), h, h})});
    Expr pair = b_.Seq(
        {b_.Bytes(d),
         b_.Bytes(ByteSet::Range('8', '9') | ByteSet::Range('a', 'b') | ByteSet::Range('A', 'B')),
         h, h, b_.Literal("\\u"), b_.Bytes(d),
         b_.Bytes(ByteSet::Range('c', 'f') | ByteSet::Range('C', 'F')), h, h});
    esc_tail.push_back(b_.Seq({b_.Literal("u"), b_.Alt({non_surrogate, pair})}));
  }
  return b_.Alt({raw, b_.Seq({b_.Literal("\\"), b_.Alt(std::move(esc_tail))})});
}

Expr JsonText::AnyString() {
  if (any_string_ < 0) {
    RuleId r = b_.DeclareRule("string");
    b_.DefineRule(
        r, b_.Seq({b_.Literal("\""), b_.Repeat(StringChar(false), 0, -1), b_.Literal("\"")}));
    any_string_ = b_.Ref(r);
  }
  return any_string_;
}

Expr JsonText::CanonicalString() {
  if (canonical_ < 0) {
    RuleId r = b_.DeclareRule("key");
    b_.DefineRule(r,
                  b_.Seq({b_.Literal("\""), b_.Repeat(StringChar(true), 0, -1), b_.Literal("\"")}));
    canonical_ = b_.Ref(r);
  }
  return canonical_;
}

Expr JsonText::StringLiteral(std::string_view value) {
  std::string text;
  AppendPythonString(value, text);
  return b_.Literal(text);
}

namespace {

// Decodes UTF-8 (valid input assumed; a bad byte is taken as its own code point).
std::vector<uint32_t> CodePointsOf(std::string_view s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    const uint8_t c = s[i];
    const int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (n == 1 || i + n > s.size()) {
      out.push_back(c);
      ++i;
      continue;
    }
    uint32_t cp = c & (0xFF >> (n + 1));
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (uint8_t(s[i + k]) & 0x3F);
    out.push_back(cp);
    i += n;
  }
  return out;
}

// The canonical text of one code point inside a string.
std::string UnitText(uint32_t cp) {
  std::string quoted;
  AppendPythonString(EncodeUtf8(cp), quoted);
  return quoted.substr(1, quoted.size() - 2);
}

}  // namespace

Expr JsonText::CanonicalStringExcept(const std::vector<std::string>& excluded) {
  std::vector<std::vector<uint32_t>> words;
  for (const std::string& s : excluded) words.push_back(CodePointsOf(s));
  std::sort(words.begin(), words.end());
  words.erase(std::unique(words.begin(), words.end()), words.end());
  Expr any_rest = b_.Seq({b_.Repeat(StringChar(true), 0, -1), b_.Literal("\"")});
  // rest(words[lo, hi) sharing `depth` code points): the rest of a string that is none of them.
  struct Rec {
    JsonText& t;
    const std::vector<std::vector<uint32_t>>& words;
    Expr any_rest;
    Expr Run(size_t lo, size_t hi, size_t depth) {
      GrammarBuilder& b = t.b_;
      std::vector<Expr> alts;
      size_t i = lo;
      bool ends_here = false;
      while (i < hi && words[i].size() == depth) {
        ends_here = true;
        ++i;
      }
      if (!ends_here) alts.push_back(b.Literal("\""));
      std::vector<uint32_t> firsts;
      while (i < hi) {
        const uint32_t c = words[i][depth];
        size_t j = i;
        while (j < hi && words[j][depth] == c) ++j;
        firsts.push_back(c);
        alts.push_back(b.Seq({b.Literal(UnitText(c)), Run(i, j, depth + 1)}));
        i = j;
      }
      // Any other unit, then anything.
      std::vector<std::pair<uint32_t, uint32_t>> not_raw = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
      for (uint32_t c : firsts) not_raw.push_back({c, c});
      std::vector<Expr> other = {b.CodePoints(std::move(not_raw), /*negate=*/true)};
      for (uint32_t c = 0; c < 0x20; ++c) {
        if (std::find(firsts.begin(), firsts.end(), c) == firsts.end()) {
          other.push_back(b.Literal(UnitText(c)));
        }
      }
      for (uint32_t c : {uint32_t('"'), uint32_t('\\')}) {
        if (std::find(firsts.begin(), firsts.end(), c) == firsts.end()) {
          other.push_back(b.Literal(UnitText(c)));
        }
      }
      alts.push_back(b.Seq({b.Alt(std::move(other)), any_rest}));
      return b.Alt(std::move(alts));
    }
  };
  if (words.empty()) return CanonicalString();
  Rec rec{*this, words, any_rest};
  return b_.Seq({b_.Literal("\""), rec.Run(0, words.size(), 0)});
}

Expr JsonText::StringOfLength(int64_t min, int64_t max) {
  if (string_char_ < 0) {
    const RuleId r = b_.DeclareRule("char");
    b_.DefineRule(r, StringChar(false));
    string_char_ = b_.Ref(r);
  }
  return b_.Seq({b_.Literal("\""), LongRepeat(string_char_, min, max), b_.Literal("\"")});
}

// Counts past a few hundred go through a block rule of B items (B about the square root), so the
// grammar grows with sqrt(count) rules instead of count: n = q*B + r items is q blocks and r
// items; up to N optional items is "fewer than q blocks, then fewer than B items" or "q blocks,
// then at most r items" (each length has one parse).
Expr JsonText::LongRepeat(Expr item, int64_t min, int64_t max) {
  constexpr int64_t kDirect = 256;
  if (min <= kDirect && max <= kDirect) return b_.Repeat(item, int32_t(min), int32_t(max));
  const int64_t span = std::max(min, max);
  int64_t block = 1;
  while (block * block < span) ++block;
  const RuleId br = b_.DeclareRule(absl::StrCat("block", block));
  b_.DefineRule(br, b_.Repeat(item, int32_t(block), int32_t(block)));
  const Expr blk = b_.Ref(br);
  const auto exactly = [&](int64_t n) {
    return b_.Seq({b_.Repeat(blk, int32_t(n / block), int32_t(n / block)),
                   b_.Repeat(item, int32_t(n % block), int32_t(n % block))});
  };
  const auto up_to = [&](int64_t n) {  // 0..n items
    const int64_t q = n / block, r = n % block;
    std::vector<Expr> alts;
    if (q > 0) {
      alts.push_back(
          b_.Seq({b_.Repeat(blk, 0, int32_t(q - 1)), b_.Repeat(item, 0, int32_t(block - 1))}));
    }
    alts.push_back(
        b_.Seq({b_.Repeat(blk, int32_t(q), int32_t(q)), b_.Repeat(item, 0, int32_t(r))}));
    return b_.Alt(std::move(alts));
  };
  if (max < 0) return b_.Seq({exactly(min), b_.Repeat(item, 0, -1)});
  return b_.Seq({exactly(min), up_to(max - min)});
}

// ---- numbers ----

Expr JsonText::AnyNumber() {
  if (any_number_ < 0) {
    Expr int_part = b_.Alt(
        {b_.Literal("0"), b_.Seq({b_.Bytes(ByteSet::Range('1', '9')), b_.Repeat(Digit(), 0, -1)})});
    Expr frac = b_.Optional(b_.Seq({b_.Literal("."), Digits()}));
    Expr exp =
        b_.Optional(b_.Seq({b_.Bytes(ByteSet::Of('e') | ByteSet::Of('E')),
                            b_.Optional(b_.Bytes(ByteSet::Of('+') | ByteSet::Of('-'))), Digits()}));
    RuleId r = b_.DeclareRule("number");
    b_.DefineRule(r, b_.Seq({b_.Optional(b_.Literal("-")), int_part, frac, exp}));
    any_number_ = b_.Ref(r);
  }
  return any_number_;
}

Expr JsonText::AnyInteger() {
  if (any_integer_ < 0) {
    Expr int_part = b_.Alt(
        {b_.Literal("0"), b_.Seq({b_.Bytes(ByteSet::Range('1', '9')), b_.Repeat(Digit(), 0, -1)})});
    Expr zero_frac = IntegerFloatSuffix();
    // Python writes integral floats from 1e16 up as 1e+16 or 1.5e+16.
    Expr sci =
        b_.Seq({b_.Bytes(ByteSet::Range('1', '9')), b_.Optional(b_.Seq({b_.Literal("."), Digit()})),
                b_.Literal("e+"), b_.Bytes(ByteSet::Range('1', '9')), Digit()});
    RuleId r = b_.DeclareRule("integer");
    b_.DefineRule(
        r, b_.Seq({b_.Optional(b_.Literal("-")),
                   integer_floats_ ? b_.Alt({b_.Seq({int_part, zero_frac}), sci}) : int_part}));
    any_integer_ = b_.Ref(r);
  }
  return any_integer_;
}

Expr JsonText::IntegerFloatSuffix() {
  if (!integer_floats_) return b_.Empty();
  // One zero, as Python writes an integral float ("3.0"): a model cannot pad it without end.
  return b_.Optional(b_.Literal(".0"));
}

Expr JsonText::SameLengthRange(std::string_view lo, std::string_view hi) {
  const size_t n = lo.size();
  if (n == 0) return b_.Empty();
  if (lo == hi) return b_.Literal(lo);
  if (lo[0] == hi[0])
    return b_.Seq({b_.Literal(lo.substr(0, 1)), SameLengthRange(lo.substr(1), hi.substr(1))});
  const bool lo_full = lo.substr(1).find_first_not_of('0') == std::string_view::npos;
  const bool hi_full = hi.substr(1).find_first_not_of('9') == std::string_view::npos;
  const char mid_lo = lo_full ? lo[0] : char(lo[0] + 1);
  const char mid_hi = hi_full ? hi[0] : char(hi[0] - 1);
  std::vector<Expr> alts;
  const std::string nines(n - 1, '9'), zeros(n - 1, '0');
  if (!lo_full)
    alts.push_back(b_.Seq({b_.Literal(lo.substr(0, 1)), SameLengthRange(lo.substr(1), nines)}));
  if (mid_lo <= mid_hi) {
    alts.push_back(b_.Seq({b_.Bytes(ByteSet::Range(mid_lo, mid_hi)),
                           b_.Repeat(Digit(), int32_t(n - 1), int32_t(n - 1))}));
  }
  if (!hi_full)
    alts.push_back(b_.Seq({b_.Literal(hi.substr(0, 1)), SameLengthRange(zeros, hi.substr(1))}));
  return b_.Alt(std::move(alts));
}

Expr JsonText::UIntRange(const std::string& lo, const std::optional<std::string>& hi) {
  if (hi && MagCompare(lo, *hi) > 0) return b_.Nothing();
  if (lo.size() > 400 || (hi && hi->size() > 400)) return b_.Nothing();
  std::vector<Expr> alts;
  const size_t last = hi ? hi->size() : lo.size();
  for (size_t len = lo.size(); len <= last; ++len) {
    const std::string low = len == lo.size() ? lo : "1" + std::string(len - 1, '0');
    const std::string high = hi && len == hi->size() ? *hi : std::string(len, '9');
    alts.push_back(SameLengthRange(low, high));
  }
  if (!hi) {
    alts.push_back(
        b_.Seq({b_.Bytes(ByteSet::Range('1', '9')), b_.Repeat(Digit(), int32_t(lo.size()), -1)}));
  }
  return b_.Alt(std::move(alts));
}

Expr JsonText::IntegerRange(std::optional<Decimal> lo, std::optional<Decimal> hi) {
  if (!lo && !hi) return AnyInteger();
  if (lo && hi && Decimal::Compare(*lo, *hi) > 0) return b_.Nothing();
  std::vector<Expr> alts;
  const Decimal zero;
  // x >= 0 written without a sign.
  if (!hi || !hi->negative) {
    const std::string low = lo && !lo->negative ? lo->int_digits : "0";
    alts.push_back(UIntRange(low, hi ? std::optional<std::string>(hi->int_digits) : std::nullopt));
  }
  // "-m" with m in [-hi, -lo]; "-0" is 0.
  if (!lo || lo->negative || Decimal::Compare(*lo, zero) == 0) {
    const std::string low = hi && hi->negative ? hi->int_digits : "0";
    alts.push_back(
        b_.Seq({b_.Literal("-"),
                UIntRange(low, lo ? std::optional<std::string>(lo->int_digits) : std::nullopt)}));
  }
  return b_.Seq({b_.Alt(std::move(alts)), IntegerFloatSuffix()});
}

Expr JsonText::FracDigits(std::optional<FracBound> lo, std::optional<FracBound> hi, bool nonempty) {
  if (lo && lo->digits.empty() && lo->inclusive) lo.reset();
  Expr star = b_.Repeat(Digit(), 0, -1);
  if (!lo && !hi) return nonempty ? Digits() : star;
  if (hi && hi->digits.empty()) {
    if (!hi->inclusive || lo) return b_.Nothing();
    return b_.Repeat(b_.Literal("0"), nonempty ? 1 : 0, -1);
  }
  if (lo && lo->digits.empty() && !hi) {
    return b_.Seq({b_.Repeat(b_.Literal("0"), 0, -1), b_.Bytes(ByteSet::Range('1', '9')), star});
  }
  std::vector<Expr> alts;
  if (!nonempty && !lo) alts.push_back(b_.Empty());  // hi here is > 0
  // By first digit; digits whose tail is free share one range.
  int free_lo = -1, free_hi = -1;
  const auto flush = [&] {
    if (free_lo >= 0) {
      alts.push_back(b_.Seq({b_.Bytes(ByteSet::Range('0' + free_lo, '0' + free_hi)), star}));
    }
    free_lo = free_hi = -1;
  };
  for (int c = 0; c <= 9; ++c) {
    std::optional<FracBound> lo2, hi2;
    if (lo) {
      const int a = lo->digits.empty() ? 0 : lo->digits[0] - '0';
      if (c < a) continue;
      if (c == a) lo2 = FracBound{lo->digits.empty() ? "" : lo->digits.substr(1), lo->inclusive};
    }
    if (hi) {
      const int z = hi->digits[0] - '0';
      if (c > z) continue;
      if (c == z) hi2 = FracBound{hi->digits.substr(1), hi->inclusive};
    }
    if (!lo2 && !hi2) {
      if (free_lo < 0) free_lo = c;
      free_hi = c;
      continue;
    }
    flush();
    alts.push_back(b_.Seq(
        {b_.Literal(std::string(1, char('0' + c))), FracDigits(lo2, hi2, /*nonempty=*/false)}));
  }
  flush();
  return b_.Alt(std::move(alts));
}

Expr JsonText::Fraction(std::optional<FracBound> lo, std::optional<FracBound> hi) {
  const bool zero_ok = (!lo || (lo->digits.empty() && lo->inclusive)) &&
                       (!hi || !hi->digits.empty() || hi->inclusive);
  Expr dotted = b_.Seq({b_.Literal("."), FracDigits(lo, hi, /*nonempty=*/true)});
  return zero_ok ? b_.Alt({b_.Empty(), dotted}) : dotted;
}

Expr JsonText::NonNegativeRange(std::optional<Bound> lo, std::optional<Bound> hi) {
  const std::string a = lo ? lo->value.int_digits : "0";
  std::optional<FracBound> alpha;
  if (lo) alpha = FracBound{lo->value.frac_digits, lo->inclusive};
  if (!hi) {
    return b_.Alt(
        {b_.Seq({b_.Literal(a), Fraction(alpha, std::nullopt)}),
         b_.Seq({UIntRange(MagPlusOne(a), std::nullopt), Fraction(std::nullopt, std::nullopt)})});
  }
  const std::string& z = hi->value.int_digits;
  const FracBound beta{hi->value.frac_digits, hi->inclusive};
  const int c = MagCompare(a, z);
  if (c > 0) return b_.Nothing();
  if (c == 0) return b_.Seq({b_.Literal(a), Fraction(alpha, beta)});
  std::vector<Expr> alts = {b_.Seq({b_.Literal(a), Fraction(alpha, std::nullopt)})};
  const std::string mid_lo = MagPlusOne(a), mid_hi = MagMinusOne(z);
  if (MagCompare(mid_lo, mid_hi) <= 0) {
    alts.push_back(b_.Seq({UIntRange(mid_lo, mid_hi), Fraction(std::nullopt, std::nullopt)}));
  }
  alts.push_back(b_.Seq({b_.Literal(z), Fraction(std::nullopt, beta)}));
  return b_.Alt(std::move(alts));
}

Expr JsonText::NumberRange(std::optional<Bound> lo, std::optional<Bound> hi) {
  if (!lo && !hi) return AnyNumber();
  const Decimal zero;
  Expr mantissa =
      b_.Seq({b_.Alt({b_.Literal("0"),
                      b_.Seq({b_.Bytes(ByteSet::Range('1', '9')), b_.Repeat(Digit(), 0, -1)})}),
              b_.Optional(b_.Seq({b_.Literal("."), Digits()}))});
  Expr any_nonneg = b_.Seq(
      {mantissa, b_.Optional(b_.Seq({b_.Bytes(ByteSet::Of('e') | ByteSet::Of('E')),
                                     b_.Optional(b_.Bytes(ByteSet::Of('+') | ByteSet::Of('-'))),
                                     Digits()}))});
  std::vector<Expr> alts;
  // x >= 0 without a sign: [max(lo, 0), hi].
  const bool hi_nonneg = !hi || !hi->value.negative;
  if (hi_nonneg) {
    const bool lo_below_zero =
        !lo || lo->value.negative || (Decimal::Compare(lo->value, zero) == 0 && lo->inclusive);
    if (lo_below_zero && !hi) {
      alts.push_back(any_nonneg);
    } else {
      std::optional<Bound> l = lo && !lo->value.negative ? lo : std::nullopt;
      alts.push_back(NonNegativeRange(l, hi));
    }
  }
  // "-m": m in [-hi, -lo], m >= 0.
  const bool lo_nonpos = !lo || lo->value.negative || Decimal::Compare(lo->value, zero) == 0;
  if (lo_nonpos) {
    const bool hi_above_zero = !hi || !hi->value.negative;
    const bool hi_zero_ok = !hi || Decimal::Compare(hi->value, zero) > 0 || hi->inclusive;
    if (!lo && hi_above_zero && hi_zero_ok) {
      alts.push_back(b_.Seq({b_.Literal("-"), any_nonneg}));
    } else {
      std::optional<Bound> ml, mh;
      if (hi && hi->value.negative) ml = Bound{hi->value.Negated(), hi->inclusive};
      if (lo) mh = Bound{lo->value.Negated(), lo->inclusive};
      if (!ml && hi && Decimal::Compare(hi->value, zero) == 0 && !hi->inclusive) {
        ml = Bound{zero, false};
      }
      alts.push_back(b_.Seq({b_.Literal("-"), NonNegativeRange(ml, mh)}));
    }
  }
  return b_.Alt(std::move(alts));
}

Expr JsonText::IntegerMultipleOf(int k) {
  std::vector<RuleId> rem(k);
  for (int r = 0; r < k; ++r) rem[r] = b_.DeclareRule(absl::StrCat("mod", k, "_", r));
  for (int r = 0; r < k; ++r) {
    std::vector<Expr> alts;
    if (r == 0) alts.push_back(b_.Empty());
    for (int d = 0; d <= 9; ++d) {
      alts.push_back(
          b_.Seq({b_.Literal(std::string(1, char('0' + d))), b_.Ref(rem[(10 * r + d) % k])}));
    }
    b_.DefineRule(rem[r], b_.Alt(std::move(alts)));
  }
  std::vector<Expr> first = {b_.Literal("0")};
  for (int d = 1; d <= 9; ++d) {
    first.push_back(b_.Seq({b_.Literal(std::string(1, char('0' + d))), b_.Ref(rem[d % k])}));
  }
  return b_.Seq({b_.Optional(b_.Literal("-")), b_.Alt(std::move(first)), IntegerFloatSuffix()});
}

Expr JsonText::NumberLiteral(const json& number, bool integer_text) {
  std::optional<Decimal> d = Decimal::FromJson(number);
  if (!d) return b_.Nothing();
  Expr zero_frac = b_.Optional(b_.Literal(".0"));  // as Python writes an integral float
  if (integer_text) {
    if (!d->IsInteger()) return b_.Nothing();
    const std::string text = (d->negative ? "-" : "") + d->int_digits;
    return d->int_digits == "0" ? b_.Alt({b_.Literal("0"), b_.Literal("-0")}) : b_.Literal(text);
  }
  if (!d->IsInteger()) {
    std::string text =
        number.is_number_float() ? PythonFloatRepr(number.get<double>()) : PythonJsonDumps(number);
    return b_.Literal(text);
  }
  const std::string text = (d->negative ? "-" : "") + d->int_digits;
  std::vector<Expr> alts = {b_.Seq({b_.Literal(text), zero_frac})};
  if (d->int_digits == "0") alts.push_back(b_.Seq({b_.Literal("-0"), zero_frac}));
  if (d->int_digits.size() >= 16 && d->int_digits.size() < 300) {
    const double v = std::stod(text);
    char buf[400];
    std::snprintf(buf, sizeof(buf), "%.0f", v);
    if (buf == text) alts.push_back(b_.Literal(PythonFloatRepr(v)));
  }
  return b_.Alt(std::move(alts));
}

// ---- formats ----

Expr JsonText::Int(int lo, int hi, int width) {
  auto pad = [width](int v) {
    std::string s = std::to_string(v);
    return std::string(width - s.size(), '0') + s;
  };
  return SameLengthRange(pad(lo), pad(hi));
}

std::optional<std::pair<int64_t, int64_t>> FormatLengths(std::string_view format) {
  static const struct {
    const char* name;
    int64_t min, max;
  } kLengths[] = {{"date", 10, 10}, {"time", 9, 24}, {"date-time", 20, 35}, {"uuid", 36, 36},
                  {"ipv4", 7, 15},  {"ipv6", 2, 45}, {"hostname", 1, 247},  {"email", 5, 227}};
  for (const auto& f : kLengths) {
    if (format == f.name) return std::pair<int64_t, int64_t>{f.min, f.max};
  }
  return std::nullopt;
}

std::string_view FormatRegex(std::string_view format) {
  if (format == "uri" || format == "uri-reference" || format == "iri" ||
      format == "iri-reference") {
    // FormatBody's subset of RFC 3986, as a pattern (for lengths beside it).
    return R"(^[A-Za-z][A-Za-z0-9+.\-]*://(([A-Za-z0-9._~!$&'()*+,;=:\-]|%[0-9A-Fa-f]{2})*@)?)"
           R"(([A-Za-z0-9._~!$&'()*+,;=\-]|%[0-9A-Fa-f]{2})+(:[0-9]{0,5})?)"
           R"((/([A-Za-z0-9._~!$&'()*+,;=:@\-]|%[0-9A-Fa-f]{2})*)*)"
           R"((\?([A-Za-z0-9._~!$&'()*+,;=:@/?\-]|%[0-9A-Fa-f]{2})*)?)"
           R"((#([A-Za-z0-9._~!$&'()*+,;=:@/?\-]|%[0-9A-Fa-f]{2})*)?$)";
  }
  return "";
}

std::optional<Expr> JsonText::FormatBody(std::string_view format) {
  GrammarBuilder& b = b_;
  const auto L = [&b](std::string_view s) { return b.Literal(s); };
  const auto set = [](std::string_view chars) {
    ByteSet s;
    for (char c : chars) s.Add(uint8_t(c));
    return s;
  };
  const ByteSet alpha = ByteSet::Range('a', 'z') | ByteSet::Range('A', 'Z');
  const ByteSet alnum = alpha | ByteSet::Range('0', '9');
  const ByteSet hex =
      ByteSet::Range('0', '9') | ByteSet::Range('a', 'f') | ByteSet::Range('A', 'F');
  Expr d = Digit();
  const auto date = [&] {
    Expr year = b.Alt({b.Seq({b.Bytes(ByteSet::Range('1', '9')), d, d, d}),
                       b.Seq({L("0"), b.Bytes(ByteSet::Range('1', '9')), d, d}),
                       b.Seq({L("00"), b.Bytes(ByteSet::Range('1', '9')), d}),
                       b.Seq({L("000"), b.Bytes(ByteSet::Range('1', '9'))})});
    Expr leap_pair = b.Alt({b.Seq({L("0"), b.Bytes(set("48"))}),
                            b.Seq({b.Bytes(set("2468")), b.Bytes(set("048"))}),
                            b.Seq({b.Bytes(set("13579")), b.Bytes(set("26"))})});
    Expr leap_year = b.Alt({b.Seq({d, d, leap_pair}), b.Seq({leap_pair, L("00")})});
    Expr not_feb = b.Alt({L("01"), b.Seq({L("0"), b.Bytes(ByteSet::Range('3', '9'))}),
                          b.Seq({L("1"), b.Bytes(set("012"))})});
    Expr long_month = b.Alt({b.Seq({L("0"), b.Bytes(set("13578"))}), L("10"), L("12")});
    Expr month_day =
        b.Alt({b.Seq({Int(1, 12, 2), L("-"), Int(1, 28, 2)}),
               b.Seq({not_feb, L("-"), b.Alt({L("29"), L("30")})}), b.Seq({long_month, L("-31")})});
    return b.Alt({b.Seq({year, L("-"), month_day}), b.Seq({leap_year, L("-02-29")})});
  };
  const auto time = [&] {
    Expr offset =
        b.Alt({L("Z"), b.Seq({b.Bytes(set("+-")), Int(0, 23, 2), L(":"), Int(0, 59, 2)})});
    return b.Seq({Int(0, 23, 2), L(":"), Int(0, 59, 2), L(":"), Int(0, 59, 2),
                  b.Optional(b.Seq({L("."), b.Repeat(d, 1, 9)})), offset});
  };
  const auto octet = [&] {
    return b.Alt({d, b.Seq({b.Bytes(ByteSet::Range('1', '9')), d}), b.Seq({L("1"), d, d}),
                  b.Seq({L("2"), b.Bytes(ByteSet::Range('0', '4')), d}),
                  b.Seq({L("25"), b.Bytes(ByteSet::Range('0', '5'))})});
  };
  const auto ipv4 = [&] {
    Expr o = octet();
    return b.Seq({o, L("."), o, L("."), o, L("."), o});
  };
  // A DNS label: letters, digits and inner hyphens, at most 63.
  const auto label = [&](ByteSet first, int max_inner) {
    return b.Seq({b.Bytes(first),
                  b.Optional(b.Seq({b.Repeat(b.Bytes(alnum | ByteSet::Of('-')), 0, max_inner),
                                    b.Bytes(alnum)}))});
  };
  if (format == "date") return date();
  if (format == "time") return time();
  if (format == "date-time") return b.Seq({date(), L("T"), time()});
  if (format == "uuid") {
    Expr h = b.Bytes(hex);
    const auto hs = [&](int n) { return b.Repeat(h, n, n); };
    return b.Seq({hs(8), L("-"), hs(4), L("-"), hs(4), L("-"), hs(4), L("-"), hs(12)});
  }
  if (format == "ipv4") return ipv4();
  if (format == "ipv6") {
    Expr h16 = b.Repeat(b.Bytes(hex), 1, 4);
    Expr h16c = b.Seq({h16, L(":")});
    Expr ls32 = b.Alt({b.Seq({h16, L(":"), h16}), ipv4()});
    const auto pre = [&](int n) {  // [ *n( h16 ":" ) h16 ]
      return b.Optional(b.Seq({b.Repeat(h16c, 0, n), h16}));
    };
    return b.Alt({b.Seq({b.Repeat(h16c, 6, 6), ls32}), b.Seq({L("::"), b.Repeat(h16c, 5, 5), ls32}),
                  b.Seq({b.Optional(h16), L("::"), b.Repeat(h16c, 4, 4), ls32}),
                  b.Seq({pre(1), L("::"), b.Repeat(h16c, 3, 3), ls32}),
                  b.Seq({pre(2), L("::"), b.Repeat(h16c, 2, 2), ls32}),
                  b.Seq({pre(3), L("::"), h16c, ls32}), b.Seq({pre(4), L("::"), ls32}),
                  b.Seq({pre(5), L("::"), h16}), b.Seq({pre(6), L("::")})});
  }
  if (format == "hostname") {
    // At most 4 labels of at most 61: within the 253 of a name. A label starts with a letter and
    // has no "--" (which punycode's xn-- would need checked) and no hyphen at its end.
    Expr l = b.Seq({b.Bytes(alpha),
                    b.Repeat(b.Alt({b.Bytes(alnum), b.Seq({L("-"), b.Bytes(alnum)})}), 0, 30)});
    return b.Seq({l, b.Repeat(b.Seq({L("."), l}), 0, 3)});
  }
  if (format == "email") {
    // At most 63 + 1 + 163 characters (FormatLengths): local parts of at most 63 without
    // leading, trailing or doubled dots; 2 to 4 labels of at most 40.
    Expr atext = b.Bytes(alnum | set("!#$%&'*+/=?^_`{|}~-"));
    Expr l = label(alnum, 38);
    return b.Seq({atext, b.Repeat(b.Alt({atext, b.Seq({L("."), atext})}), 0, 31), L("@"), l,
                  b.Repeat(b.Seq({L("."), l}), 1, 3)});
  }
  if (format == "uri" || format == "uri-reference" || format == "iri" ||
      format == "iri-reference") {
    // scheme "://" authority path-abempty [ "?" query ] [ "#" fragment ] (RFC 3986), a subset.
    const ByteSet unreserved = alnum | set("-._~");
    const ByteSet sub_delims = set("!$&'()*+,;=");
    Expr pct = b.Seq({L("%"), b.Bytes(hex), b.Bytes(hex)});
    Expr pchar = b.Alt({b.Bytes(unreserved | sub_delims | set(":@")), pct});
    Expr qchar = b.Alt({b.Bytes(unreserved | sub_delims | set(":@/?")), pct});
    Expr scheme = b.Seq({b.Bytes(alpha), b.Repeat(b.Bytes(alnum | set("+-.")), 0, -1)});
    Expr userinfo =
        b.Seq({b.Repeat(b.Alt({b.Bytes(unreserved | sub_delims | set(":")), pct}), 0, -1), L("@")});
    Expr host = b.Repeat(b.Alt({b.Bytes(unreserved | sub_delims), pct}), 1, -1);
    Expr port = b.Seq({L(":"), b.Repeat(d, 0, 5)});
    return b.Seq({scheme, L("://"), b.Optional(userinfo), host, b.Optional(port),
                  b.Repeat(b.Seq({L("/"), b.Repeat(pchar, 0, -1)}), 0, -1),
                  b.Optional(b.Seq({L("?"), b.Repeat(qchar, 0, -1)})),
                  b.Optional(b.Seq({L("#"), b.Repeat(qchar, 0, -1)}))});
  }
  if (format == "json-pointer") {
    Expr ch = b.Alt({b.CodePoints({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}, {'/', '/'}, {'~', '~'}},
                                  /*negate=*/true),
                     L("~0"), L("~1")});
    return b.Repeat(b.Seq({L("/"), b.Repeat(ch, 0, -1)}), 0, -1);
  }
  if (format == "duration") {
    Expr n = Digits();
    const auto u = [&](char c) { return b.Seq({n, L(std::string(1, c))}); };
    Expr second = u('S');
    Expr minute = b.Seq({u('M'), b.Optional(second)});
    Expr hour = b.Seq({u('H'), b.Optional(minute)});
    Expr dur_time = b.Seq({L("T"), b.Alt({hour, minute, second})});
    Expr day = u('D');
    Expr month = b.Seq({u('M'), b.Optional(day)});
    Expr year = b.Seq({u('Y'), b.Optional(month)});
    Expr dur_date = b.Seq({b.Alt({day, month, year}), b.Optional(dur_time)});
    return b.Seq({L("P"), b.Alt({dur_date, dur_time, u('W')})});
  }
  return std::nullopt;
}

}  // namespace heavykv::grammar
