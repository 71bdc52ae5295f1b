// The lexical pieces of JSON as grammar expressions (engine/grammar/grammar.h), for the JSON
// Schema compiler (json_schema.h): whitespace, strings (any, canonical, length-bounded, string
// formats), numbers (any, integers, exact decimal ranges) and the exact text of a JSON value as
// Python's json.dumps(ensure_ascii=False) writes it.
//
//   JsonText t(builder, /*pretty=*/true);
//   Expr n = t.IntegerRange(Decimal::Parse("-5"), Decimal::Parse("120"));   // -5 ..= 120
//
// Canonical strings: a key or a literal is matched in the form json.dumps writes it (raw UTF-8,
// the short escapes \" \\ \b \f \n \r \t and \u00xx for the other controls), so that one text
// stands for one string and "every key but these" is exact.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/grammar/grammar.h"
#include "nlohmann/json.hpp"

namespace heavykv::grammar {

// Python's json.dumps(value, ensure_ascii=False): ", " and ": " separators, floats as repr.
std::string PythonJsonDumps(const nlohmann::ordered_json& value);

// An exact decimal number: sign, integer digits (no leading zeros, "0" for zero) and fraction
// digits (no trailing zeros). Zero is never negative.
struct Decimal {
  bool negative = false;
  std::string int_digits = "0";
  std::string frac_digits;

  // From a JSON number's text ("12", "-0.5", "1e3", "2.50E-2"); nullopt for other text or an
  // exponent past +-400.
  static std::optional<Decimal> Parse(std::string_view text);
  static std::optional<Decimal> FromJson(const nlohmann::ordered_json& number);
  bool IsInteger() const { return frac_digits.empty(); }
  // -1, 0, 1.
  static int Compare(const Decimal& a, const Decimal& b);
  Decimal Negated() const;
  Decimal Floor() const;  // the largest integer <= this
  Decimal Ceil() const;
  Decimal PlusOne() const;   // integers only
  Decimal MinusOne() const;  // integers only
};

// One end of a range.
struct Bound {
  Decimal value;
  bool inclusive = true;
};

// The shortest and longest strings FormatBody(format) matches, for the bounded ones.
std::optional<std::pair<int64_t, int64_t>> FormatLengths(std::string_view format);
// FormatBody(format) as a pattern (json_string_regex.h) where one is written; "" if none.
std::string_view FormatRegex(std::string_view format);

class JsonText {
 public:
  using Expr = GrammarBuilder::Expr;

  // `integer_floats`: an integer may be written as a float with a zero fraction ("3.0"), as
  // JSON Schema draft 6 and later say; draft 4 validators refuse it.
  JsonText(GrammarBuilder& b, bool pretty, bool integer_floats = true)
      : b_(b), pretty_(pretty), integer_floats_(integer_floats) {}

  // After '[', '{', ',' and before ']', '}': nothing, one space, or (pretty) a newline and at
  // most 20 spaces or tabs. After ':' the same.
  Expr Ws();
  Expr Comma();  // "," Ws
  Expr Colon();  // ":" Ws

  // A whole JSON string (quotes included).
  Expr AnyString();
  // Any string in canonical form (keys, and strings compared with a finite set).
  Expr CanonicalString();
  // A canonical string that is none of `excluded` (decoded strings).
  Expr CanonicalStringExcept(const std::vector<std::string>& excluded);
  // Exactly this string, in canonical form.
  Expr StringLiteral(std::string_view value);
  // A string of min..max code points (max -1: unbounded); an escape counts as one.
  Expr StringOfLength(int64_t min, int64_t max);
  // `item` min..max times (max -1: unbounded), for counts in the thousands too.
  Expr LongRepeat(Expr item, int64_t min, int64_t max);
  // A string of this format (the inside only: no quotes); nullopt when the format is not one
  // written exactly here.
  std::optional<Expr> FormatBody(std::string_view format);

  Expr AnyNumber();
  // JSON Schema's integer: an integer, or a float with a zero fraction ("3.0").
  Expr AnyInteger();
  // Integers within [lo, hi] (either open: nullopt), in integer form or with a zero fraction.
  Expr IntegerRange(std::optional<Decimal> lo, std::optional<Decimal> hi);
  // Numbers within the bounds, exactly (fixed notation; exponents only where every number of
  // that form is in range).
  Expr NumberRange(std::optional<Bound> lo, std::optional<Bound> hi);
  // Integers that are multiples of `k` (1 <= k <= 1000), no bounds.
  Expr IntegerMultipleOf(int k);
  // Exactly this JSON number, in the forms json.dumps may write it (1 == 1.0 == 1e0 in value).
  // `integer_text`: only integer forms ("1", not "1.0": draft 4's integer type).
  Expr NumberLiteral(const nlohmann::ordered_json& number, bool integer_text = false);

 private:
  Expr Digit();
  Expr Digits();              // [0-9]+
  Expr IntegerFloatSuffix();  // ".0" where integers may be written as floats
  Expr StringChar(bool canonical);
  // Unsigned integers (no leading zeros) within [lo, hi] (hi nullopt: unbounded).
  Expr UIntRange(const std::string& lo, const std::optional<std::string>& hi);
  Expr SameLengthRange(std::string_view lo, std::string_view hi);
  // A bound on a fraction 0.digits (digits without trailing zeros).
  struct FracBound {
    std::string digits;
    bool inclusive = true;
  };
  // Digit strings d (possibly empty) with lo < or <= 0.d < or <= hi.
  Expr FracDigits(std::optional<FracBound> lo, std::optional<FracBound> hi, bool nonempty);
  // "" (when 0 is in range) or "." and such digits.
  Expr Fraction(std::optional<FracBound> lo, std::optional<FracBound> hi);
  Expr NonNegativeRange(std::optional<Bound> lo, std::optional<Bound> hi);
  Expr Int(int lo, int hi, int width);  // zero-padded numbers of `width` digits in [lo, hi]

  GrammarBuilder& b_;
  bool pretty_;
  bool integer_floats_;
  Expr string_char_ = -1, ws_ = -1, digit_ = -1, digits_ = -1, any_string_ = -1, canonical_ = -1;
  Expr any_number_ = -1, any_integer_ = -1;
};

}  // namespace heavykv::grammar
