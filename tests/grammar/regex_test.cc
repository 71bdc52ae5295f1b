// CompileRegex and CompileChoice: the strings each pattern matches, as ECMA-262 defines them
// (full match, and search as JSON Schema's `pattern`), checked by the grammar's reference
// matcher, against std::regex on random patterns, and the constructs refused.
#include "engine/grammar/regex.h"

#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/grammar/automaton.h"

namespace heavykv::grammar {
namespace {

using Expr = GrammarBuilder::Expr;

// The grammar of `pattern`, or the compiler's refusal.
absl::StatusOr<Grammar> TryCompile(std::string_view pattern, bool search) {
  GrammarBuilder b;
  absl::StatusOr<GrammarBuilder::Expr> e = CompileRegex(b, pattern, {.search = search});
  if (!e.ok()) return e.status();
  RuleId root = b.DeclareRule("root");
  b.DefineRule(root, *e);
  return std::move(b).Build(root);
}

std::optional<Grammar> Compile(std::string_view pattern, bool search) {
  GrammarBuilder b;
  absl::StatusOr<GrammarBuilder::Expr> e = CompileRegex(b, pattern, {.search = search});
  EXPECT_TRUE(e.ok()) << pattern << ": " << e.status();
  if (!e.ok()) return std::nullopt;
  RuleId root = b.DeclareRule("root");
  b.DefineRule(root, *e);
  absl::StatusOr<Grammar> g = std::move(b).Build(root);
  EXPECT_TRUE(g.ok()) << pattern << ": " << g.status();
  if (!g.ok()) return std::nullopt;
  return *std::move(g);
}

// Checks that `pattern` matches each of `yes` and none of `no`.
void Expect(std::string_view pattern, bool search, const std::vector<std::string>& yes,
            const std::vector<std::string>& no) {
  std::optional<Grammar> g = Compile(pattern, search);
  ASSERT_TRUE(g.has_value());
  for (const std::string& s : yes) {
    EXPECT_TRUE(Matches(*g, s)) << "/" << pattern << "/ search=" << search << " should match \""
                                << s << "\"";
  }
  for (const std::string& s : no) {
    EXPECT_FALSE(Matches(*g, s)) << "/" << pattern << "/ search=" << search
                                 << " should not match \"" << s << "\"";
  }
}

absl::Status CompileStatus(std::string_view pattern, bool search = false) {
  GrammarBuilder b;
  return CompileRegex(b, pattern, {.search = search}).status();
}

TEST(RegexTest, LiteralsAndClasses) {
  Expect("abc", false, {"abc"}, {"", "ab", "abcd", "xabc"});
  Expect("[a-c]x[^0-9]", false, {"axz", "cx-", "bx\xC3\xA9"}, {"dxz", "ax5", "ax"});
  Expect("\\d\\d-\\w+", false, {"12-a_Z9", "00-x"}, {"1-a", "12-", "12-\xC3\xA9", "ab-c"});
  Expect("\\D\\W\\S", false, {"a-b", "\xC3\xA9\xC3\xA9\xC3\xA9"}, {"1-b", "aab", "a- "});
  Expect("[\\d.]+", false, {"1.5", "..."}, {"1,5", ""});
  Expect("[]", false, {}, {"", "a", "]"});
  Expect("[^]", false, {"a", "\n", "\xF0\x9F\x98\x80"}, {"", "ab"});
  Expect("[]a]", false, {}, {"]a]", "a"});  // ECMA: [] then "a]"
  Expect("a]}", false, {"a]}"}, {"a"});
  Expect("[-a]+[a-]+[a\\-z]", false, {"-a-a-", "aaz"}, {"bab", "aab"});
  Expect("[\\w-.]+", false, {"a-b.c_d"}, {"a b", "a,b"});  // Annex B: \w, '-' and '.'
  Expect("[\\]\\\\^]+", false, {"]\\^"}, {"a"});
  Expect("[\\b]", false, {"\b"}, {"b", "\\"});
}

TEST(RegexTest, Escapes) {
  Expect("\\n\\t\\r\\f\\v\\0", false, {std::string("\n\t\r\f\v\0", 6)}, {"ntrfv0"});
  Expect("\\x41\\u0042\\u{43}\\u{1F600}", false, {"ABC\xF0\x9F\x98\x80"}, {"x41"});
  Expect("\\uD83D\\uDE00", false, {"\xF0\x9F\x98\x80"}, {"\xED\xA0\xBD\xED\xB8\x80"});
  Expect("\\cJ\\ca", false, {"\n\x01"}, {"cJca"});
  Expect("\\.\\*\\+\\?\\(\\)\\[\\]\\{\\}\\|\\/\\\\\\$\\^\\-", false, {".*+?()[]{}|/\\$^-"}, {""});
  Expect("[\\u00e0-\\u00ff]", false, {"\xC3\xA0", "\xC3\xBF"}, {"a", "\xC3\x9F"});
  Expect("\\p{ASCII}\\P{ASCII}", false, {"a\xC3\xA9"},
         {"ab",
          "\xC3\xA9"
          "a"});
}

TEST(RegexTest, UnicodeGeneralCategories) {
  const std::vector<std::pair<std::string, std::string>> samples = {{"Lu", "A"},
                                                                    {"Ll", "\xC3\xA9"},
                                                                    {"Lt", "\xC7\x85"},
                                                                    {"Lm", "\xCA\xB0"},
                                                                    {"Lo", "\xE4\xB8\xAD"},
                                                                    {"Mn", "\xCC\x81"},
                                                                    {"Nd", "\xD9\xA3"},
                                                                    {"Nl", "\xE2\x85\xAB"},
                                                                    {"No", "\xC2\xBD"},
                                                                    {"Pc", "_"},
                                                                    {"Pd", "-"},
                                                                    {"Ps", "("},
                                                                    {"Po", "!"},
                                                                    {"Sc", "$"},
                                                                    {"Sm", "+"},
                                                                    {"So", "\xC2\xA9"},
                                                                    {"Zs", " "},
                                                                    {"Zl", "\xE2\x80\xA8"},
                                                                    {"Cc", "\n"},
                                                                    {"Cf", "\xC2\xAD"},
                                                                    {"Co", "\xEE\x80\x80"},
                                                                    {"Cn", "\xCD\xB8"}};
  for (const auto& [category, text] : samples) {
    std::vector<std::string> others;
    for (const auto& [c, t] : samples) {
      if (c != category) others.push_back(t);
    }
    Expect("\\p{" + category + "}", false, {text}, others);
    Expect("\\p{gc=" + category + "}", false, {text}, others);
    Expect("\\P{" + category + "}", false, others, {text});
    Expect("\\p{" + category.substr(0, 1) + "}", false, {text}, {});
  }
  Expect("^[\\p{Letter}\\p{Nd} .'-]+$", true, {"Jos\xC3\xA9 O'Neil", "\xE4\xB8\xAD 3"},
         {"a_b", "a\tb", ""});
  Expect("\\p{General_Category=Uppercase_Letter}\\p{Assigned}", false, {"AB", "A\xC3\xA9"},
         {"aB", "A\xCD\xB8"});
  EXPECT_EQ(CompileStatus("\\p{Script=Latin}").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CompileStatus("\\p{Alphabetic}").code(), absl::StatusCode::kInvalidArgument);
}

TEST(RegexTest, DotExcludesLineTerminators) {
  Expect(".", false, {"a", "\xC3\xA9", "\xF0\x9F\x98\x80", "\t"},
         {"\n", "\r", "\xE2\x80\xA8", "\xE2\x80\xA9", "", "ab"});
  // Search: the text around a match may hold anything, line terminators too.
  Expect("a.c", true,
         {"abc", "x\nabc\n",
          "\xE2\x80\xA8"
          "a-c"},
         {"a\nc", "ac"});
}

TEST(RegexTest, WhiteSpaceIsEcmas) {
  Expect("\\s", false,
         {" ", "\t", "\n", "\v", "\f", "\r", "\xC2\xA0", "\xE1\x9A\x80", "\xE2\x80\x80",
          "\xE2\x80\x8A", "\xE2\x80\xA8", "\xE2\x80\xAF", "\xE2\x81\x9F", "\xE3\x80\x80",
          "\xEF\xBB\xBF"},
         {"a", "\xC2\x85", "\xE2\x80\x8B", "\x1C"});
}

TEST(RegexTest, Quantifiers) {
  Expect("a*", false, {"", "a", "aaaa"}, {"b", "ab"});
  Expect("a+?b", false, {"ab", "aaab"}, {"b"});
  Expect("ab?c", false, {"ac", "abc"}, {"abbc"});
  Expect("a{3}", false, {"aaa"}, {"aa", "aaaa"});
  Expect("a{2,}", false, {"aa", "aaaaaaa"}, {"a"});
  Expect("a{2,4}", false, {"aa", "aaa", "aaaa"}, {"a", "aaaaa"});
  Expect("a{0}b", false, {"b"}, {"ab"});
  Expect("(ab|c){2,3}", false, {"abc", "cc", "ababab", "cabc"}, {"c", "abababc"});
  Expect("((a|b)*c)+", false, {"c", "abcc", "bacabc"}, {"", "ab", "cab"});
  Expect("(a?)*b", false, {"b", "aab"}, {"ba"});  // a nullable item repeated
  Expect("(a*|b)*", false, {"", "ab", "bba"}, {"c"});
  Expect("(a*)+b", false, {"b", "aab"}, {"bb"});
  Expect("(a?){3}", false, {"", "a", "aaa"}, {"aaaa"});
  Expect("(?:a?b?){2}c", false, {"c", "abc", "ababc", "bac"}, {"abababc"});
  Expect("a{1,3}?b{2}?", false, {"abb", "aaabb"}, {"ab"});
  Expect("x{", false, {"x{"}, {"x"});  // Annex B: `{` that starts no quantifier
  Expect("x{a}", false, {"x{a}"}, {"xa"});
}

TEST(RegexTest, GroupsAndAlternation) {
  Expect("(?:ab|cd)e", false, {"abe", "cde"}, {"abcde", "e"});
  Expect("(?<year>\\d{4})-(?<m>\\d\\d)", false, {"2024-01"}, {"24-01"});
  Expect("a|", false, {"a", ""}, {"b"});
  Expect("|", false, {""}, {"a"});
  Expect("()", false, {""}, {"a"});
  Expect("", false, {""}, {"a"});
  Expect("", true, {"", "anything\n"}, {});
}

TEST(RegexTest, SearchIsUnanchored) {
  Expect("\\d{3}", true, {"123", "ab1234cd", "x\n999\n"}, {"12", "1a2b3", ""});
  Expect("^\\d{3}", true, {"123", "1234x"}, {"a123", "12"});
  Expect("\\d{3}$", true, {"123", "x123"}, {"123x", "12"});
  Expect("^\\d{3}$", true, {"123"}, {"1234", "a123", "123\n"});
  Expect("^$", true, {""}, {"a", "\n"});
  Expect("a^", true, {}, {"a", "", "aa"});
  Expect("$a", true, {}, {"a"});
  Expect("^", true, {"", "abc"}, {});
}

TEST(RegexTest, SearchKeepsOnlyWhatAMatchNeeds) {
  // any* a{2,50} any* is any* aa any*: the grammar is as small as for `aa`.
  const std::optional<Grammar> wide = Compile("x?a{2,50}b*", true);
  const std::optional<Grammar> narrow = Compile("aa", true);
  ASSERT_TRUE(wide.has_value() && narrow.has_value());
  EXPECT_EQ(wide->NumElements(), narrow->NumElements());
  Expect("x?a{2,50}b*", true, {"aa", "xaab", "\naaa\n"}, {"a", "xab", ""});
  Expect("(a{2,3}|b+c?)d*", true, {"aa", "b", "xbx", "aaaa"}, {"a", "", "cd"});
  Expect("a*", true, {"", "b", "\n"}, {});
  const std::optional<Grammar> start = Compile("^[a-z]{2,}", true);
  const std::optional<Grammar> start_narrow = Compile("^[a-z][a-z]", true);
  ASSERT_TRUE(start.has_value() && start_narrow.has_value());
  EXPECT_EQ(start->NumElements(), start_narrow->NumElements());
  Expect("^[a-z]{2,}", true, {"ab", "abc1"}, {"a", "1ab", ""});
  Expect("[a-z]{2,}$", true, {"ab", "1abc"}, {"a", "ab1", ""});
  Expect("^a*", true, {"", "b"}, {});
  Expect("^$", true, {""}, {"a"});
  Expect("^^$$", true, {""}, {"a"});
}

TEST(RegexTest, AlternativesOfFixedStringsShareTheirPrefixes) {
  Expect("^(USD|EUR|US|GBP|EURO|)$", true, {"USD", "US", "EUR", "EURO", "GBP", ""},
         {"U", "EU", "USDX", "EURUSD", "GB"});
  Expect("(?:ab|a(?:c|d)|\\u00e9t\\u00e9|\u00e9)x", false,
         {"abx", "acx", "adx", "\xC3\xA9t\xC3\xA9x", "\xC3\xA9x"}, {"ax", "aex", "\xC3\xA9tx"});
  // 200 codes parting at their first letter: the automaton keeps one stack, not 200.
  std::string codes = "^(";
  for (int i = 0; i < 200; ++i) {
    absl::StrAppend(&codes, i ? "|" : "", std::string(1, char('A' + i % 26)),
                    std::string(1, char('A' + i / 26)), "X");
  }
  codes += ")$";
  std::optional<Grammar> g = Compile(codes, true);
  ASSERT_TRUE(g.has_value());
  Automaton a(std::make_shared<const Grammar>(*g));
  const int32_t s = a.StepBytes(a.Start(), "QH");
  ASSERT_NE(s, Automaton::kDead);
  EXPECT_TRUE(a.Accepting(a.StepBytes(s, "X")));
  EXPECT_LT(a.num_frames(), 40);
}

TEST(RegexTest, AnchorsInBranchesAndGroups) {
  // ^a|b$: starts with a, or ends with b.
  Expect("^a|b$", true, {"a", "ax", "xb", "b", "axb"}, {"xa", "bx", ""});
  Expect("(^|,)x(,|$)", true, {"x", "a,x", "x,b", "a,x,b"}, {"ax", "xa", "a,xb"});
  Expect("^(abc|def)$", true, {"abc", "def"}, {"abcdef", "xabc", "abc\n"});
  Expect("(^a)?b", true, {"b", "ab", "xb", "xab"}, {"a", ""});
  Expect("(?:^a)?b$", false, {"b", "ab"}, {"aab"});
  Expect("a$|^b", false, {"a", "b"}, {"ab", ""});
  Expect("^^a$$", false, {"a"}, {""});
  Expect("x*^y", true, {"y", "yz"}, {"xy", "zy"});  // x* may only be empty before ^
  Expect("y$x*", true, {"y", "zy"}, {"yx", "yz"});
}

TEST(RegexTest, RealWorldSchemaPatterns) {
  Expect("^[a-zA-Z0-9_-]+$", true, {"abc_DEF-09"}, {"", "a b", "a.b", "\xC3\xA9"});
  Expect("^\\d{3}-\\d{4}$", true, {"555-1234"}, {"5551234", "555-12345", "a555-1234"});
  Expect("^\\d{4}-\\d{2}-\\d{2}$", true, {"2024-02-29"}, {"2024-2-29", "2024-02-29T"});
  Expect("^[^@\\s]+@[^@\\s]+\\.[^@\\s]+$", true, {"a.b@example.com", "\xC3\xA9@x.fr"},
         {"a@b", "a b@c.d", "a@@b.c"});
  Expect("^\\+?[1-9]\\d{1,14}$", true, {"+14155552671", "442071838750"},
         {"+0123", "+1", "1234567890123456"});
  Expect("^\\(?([0-9]{3})\\)?[-. ]?([0-9]{3})[-. ]?([0-9]{4})$", true,
         {"(555) 123-4567", "555.123.4567", "5551234567"}, {"555-1234", "(555) 123-45678"});
  Expect("^([01]?[0-9]|2[0-3]):[0-5][0-9]$", true, {"00:00", "9:59", "23:59"},
         {"24:00", "12:60", "1:5"});
  Expect("^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$", true,
         {"123e4567-e89b-12d3-a456-426614174000"}, {"123e4567-e89b-12d3-a456-42661417400"});
  Expect("^(https?|ftp)://[^\\s/$.?#].[^\\s]*$", true, {"https://example.com/a?b=c"},
         {"http://", "mailto:x", "https://exa mple.com"});
  Expect("^[\\u4e00-\\u9fa5]+$", true, {"\xE4\xB8\xAD\xE6\x96\x87"},
         {"abc",
          "\xE4\xB8\xAD"
          "a"});
  Expect("^[A-Z]{2}\\d{2}[A-Z0-9]{1,30}$", true, {"DE89370400440532013000"}, {"D89370400"});
  Expect("^v?(\\d+)\\.(\\d+)\\.(\\d+)(-[0-9A-Za-z.-]+)?$", true, {"1.2.3", "v10.0.1-rc.1"},
         {"1.2", "1.2.3-"});
  Expect("^#?([a-fA-F0-9]{6}|[a-fA-F0-9]{3})$", true, {"#fff", "a1b2c3"}, {"#ffff", "#ggg"});
  Expect("[a-z]", true, {"ABCdEF", "\xE2\x80\xA8x"}, {"ABC", ""});
}

// Long patterns as published schemas write them: semantic versions, RFC 5322 addresses, IPv6,
// ISO 8601 date-times; each compiles, builds, and matches a sample.
TEST(RegexTest, PublishedSchemaPatternsCompile) {
  struct Case {
    const char* pattern;
    const char* sample;
    const char* bad;
  };
  for (
      const Case& c : std::vector<Case>{
          {R"(^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$)",
           "1.0.0-alpha.1+build.5", "1.0.0-alpha..1"},
          {R"(^(?:[a-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[a-z0-9!#$%&'*+/=?^_`{|}~-]+)*|"(?:[\x01-\x08\x0b\x0c\x0e-\x1f\x21\x23-\x5b\x5d-\x7f]|\\[\x01-\x09\x0b\x0c\x0e-\x7f])*")@(?:(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\.)+[a-z0-9](?:[a-z0-9-]*[a-z0-9])?|\[(?:(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)\.){3}(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?|[a-z0-9-]*[a-z0-9]:(?:[\x01-\x08\x0b\x0c\x0e-\x1f\x21-\x5a\x53-\x7f]|\\[\x01-\x09\x0b\x0c\x0e-\x7f])+)\])$)",
           "first.last@example.org", "first..last@example.org"},
          {R"(^(([0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}|([0-9a-fA-F]{1,4}:){1,7}:|([0-9a-fA-F]{1,4}:){1,6}:[0-9a-fA-F]{1,4}|([0-9a-fA-F]{1,4}:){1,5}(:[0-9a-fA-F]{1,4}){1,2}|([0-9a-fA-F]{1,4}:){1,4}(:[0-9a-fA-F]{1,4}){1,3}|([0-9a-fA-F]{1,4}:){1,3}(:[0-9a-fA-F]{1,4}){1,4}|([0-9a-fA-F]{1,4}:){1,2}(:[0-9a-fA-F]{1,4}){1,5}|[0-9a-fA-F]{1,4}:((:[0-9a-fA-F]{1,4}){1,6})|:((:[0-9a-fA-F]{1,4}){1,7}|:))$)",
           "2001:db8::8a2e:370:7334", "2001:db8:::7334"},
          {R"(^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)$)",
           "2024-02-29T23:59:60.5+01:00", "2024-02-29T24:00:00Z"},
          {R"(^[A-Za-z0-9+/]*={0,2}$)", "aGVsbG8=", "aGVsbG8==="},
          {R"(^(\d{1,3}\.){3}\d{1,3}$)", "192.168.0.1", "192.168.0"},
          {R"(^\$\{[A-Z_]+\}$)", "${HOME_DIR}", "${home}"},
          {R"(^[^<>]{1,255}$)", "no tags\n", "<b>"},
          {R"(^(?:\+?1[-. ]?)?\(?([0-9]{3})\)?[-. ]?([0-9]{3})[-. ]?([0-9]{4})$)",
           "+1 (555) 010-9999", "555-0199"},
          {R"(\.(jpe?g|png|gif)$)", "a/b.jpeg", "a/b.jpeg\n"},
      }) {
    std::optional<Grammar> g = Compile(c.pattern, /*search=*/true);
    ASSERT_TRUE(g.has_value()) << c.pattern;
    EXPECT_TRUE(Matches(*g, c.sample)) << c.pattern << " on " << c.sample;
    EXPECT_FALSE(Matches(*g, c.bad)) << c.pattern << " on " << c.bad;
  }
}

TEST(RegexTest, RefusedConstructsNameThemAndTheirOffset) {
  struct Case {
    const char* pattern;
    const char* says;
  };
  for (const Case& c : std::vector<Case>{
           {"(a)\\1", "backreference at offset 3"},
           {"(?<x>a)\\k<x>", "named backreference \\k at offset 7"},
           {"a(?=b)", "lookahead (?= / (?! at offset 1"},
           {"a(?!b)", "lookahead"},
           {"(?<=a)b", "lookbehind (?<= / (?<! at offset 0"},
           {"(?<!a)b", "lookbehind"},
           {"\\bword\\b", "word boundary \\b at offset 0"},
           {"a\\B", "word boundary \\B at offset 1"},
           {"\\p{Script=Greek}+", "\\p{Script=Greek}"},
           {"(?i)abc", "inline flags"},
           {"(?P<n>a)", "(?P<name>"},
           {"(^a)+", "repeated group that contains an anchor"},
           {"(a$)*", "repeated group that contains an anchor"},
           {"a{,3}", "`{,`"},
           {"\\z", "unknown escape \\z at offset 0"},
           {"\\A", "unknown escape"},
           {"\\012", "legacy octal"},
           {"*a", "nothing to repeat"},
           {"a**", "nothing to repeat"},
           {"a{2}{3}", "nothing to repeat"},
           {"^*", "quantifier after an anchor"},
           {"a{3,2}", "m < n"},
           {"(ab", "`(` without its `)` at offset 0"},
           {"ab)", "unmatched `)` at offset 2"},
           {"[ab", "`[` without its `]`"},
           {"[z-a]", "out of order"},
           {"ab\\", "`\\` at the end"},
           {"\\x4", "malformed \\x"},
           {"\\u12", "malformed \\u"},
           {"\\u{110000}", "past U+10FFFF"},
           {"\\c1", "control escape"},
           {"a\xC3", "invalid UTF-8 at offset 1"},
       }) {
    absl::Status s = CompileStatus(c.pattern);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.pattern << ": " << s;
    EXPECT_NE(s.message().find(c.says), std::string_view::npos)
        << c.pattern << ": " << s.message() << " should say " << c.says;
  }
}

TEST(RegexTest, LimitsAreResourceExhausted) {
  GrammarLimits limits;
  limits.max_repeat = 100;
  limits.max_depth = 8;
  for (const char* p : {"a{101}", "a{1,101}", "a{99999999999999999999}", "((((((((((a))))))))))"}) {
    GrammarBuilder b(limits);
    EXPECT_EQ(CompileRegex(b, p, {}).status().code(), absl::StatusCode::kResourceExhausted) << p;
  }
  // Nested counts multiply: the build refuses the element count.
  GrammarBuilder b(GrammarLimits{.max_elements = 100'000});
  absl::StatusOr<GrammarBuilder::Expr> e = CompileRegex(b, "((a{1000}){1000}){1000}", {});
  ASSERT_TRUE(e.ok()) << e.status();
  RuleId root = b.DeclareRule("root");
  b.DefineRule(root, *e);
  EXPECT_EQ(std::move(b).Build(root).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(RegexTest, LongPatternsCompile) {
  std::string lit(20000, 'a');
  Expect(lit, false, {lit}, {lit + "a", lit.substr(1)});
  Expect("^" + lit + "$", true, {lit}, {lit + "a"});
  std::string alts;
  for (int i = 0; i < 1000; ++i) absl::StrAppend(&alts, i == 0 ? "" : "|", "w", i);
  Expect(alts, false, {"w0", "w999", "w42"}, {"w1000", "w"});
}

// As the JSON Schema compiler uses it: several patterns and other expressions in one builder.
TEST(RegexTest, PatternsShareABuilder) {
  GrammarBuilder b;
  absl::StatusOr<Expr> key = CompileRegex(b, "^[a-z]+$", {.search = true});
  absl::StatusOr<Expr> value = CompileRegex(b, "\\d", {.search = true});
  ASSERT_TRUE(key.ok() && value.ok());
  EXPECT_FALSE(CompileRegex(b, "(?=x)", {}).ok());  // a refusal leaves the builder usable
  RuleId root = b.DeclareRule("root");
  b.DefineRule(root, b.Seq({*key, b.Literal("="), *value, b.Literal(";")}));
  absl::StatusOr<Grammar> g = std::move(b).Build(root);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(Matches(*g, "abc=x1y;"));
  EXPECT_FALSE(Matches(*g, "abc=xy;"));
  EXPECT_FALSE(Matches(*g, "aBc=1;"));
}

// The JSON Schema compiler's use: the pattern applies to the decoded string, each code point
// written as the caller says (here: `"` and `\\` may also come escaped, as in a JSON string).
TEST(RegexTest, CodePointsWrittenByTheCaller) {
  RegexOptions options;
  options.search = true;
  options.code_point = [](GrammarBuilder& b, const std::vector<std::pair<uint32_t, uint32_t>>& rs) {
    std::vector<std::pair<uint32_t, uint32_t>> plain;
    std::vector<Expr> alts;
    for (auto [lo, hi] : rs) {
      for (char special : {'"', '\\'}) {
        const char escaped[] = {'\\', special};
        if (lo <= uint32_t(special) && uint32_t(special) <= hi) {
          alts.push_back(b.Literal(std::string_view(escaped, 2)));
        }
      }
      plain.push_back({lo, hi});
    }
    alts.push_back(b.CodePoints(plain, false));
    return b.Alt(std::move(alts));
  };
  GrammarBuilder b;
  absl::StatusOr<Expr> e = CompileRegex(b, "^a[\"x]b$", options);
  ASSERT_TRUE(e.ok());
  RuleId root = b.DeclareRule("root");
  b.DefineRule(root, *e);
  absl::StatusOr<Grammar> g = std::move(b).Build(root);
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(Matches(*g, "a\\\"b"));  // a\"b
  EXPECT_TRUE(Matches(*g, "axb"));
  EXPECT_FALSE(Matches(*g, "a\\xb"));
}

TEST(ChoiceTest, ExactlyOneOfTheStrings) {
  GrammarBuilder b;
  Expr e = CompileChoice(b, {"yes", "no", "maybe", "", "yesterday", "no", "n\xC3\xA9"});
  RuleId root = b.DeclareRule("root");
  b.DefineRule(root, e);
  absl::StatusOr<Grammar> g = std::move(b).Build(root);
  ASSERT_TRUE(g.ok()) << g.status();
  for (const char* s : {"yes", "no", "maybe", "", "yesterday", "n\xC3\xA9"}) {
    EXPECT_TRUE(Matches(*g, s)) << s;
  }
  for (const char* s : {"ye", "yess", "yesterda", "nono", "n", "m", "\xC3\xA9"}) {
    EXPECT_FALSE(Matches(*g, s)) << s;
  }
  GrammarBuilder none;
  Expr nothing = CompileChoice(none, {});
  RuleId r = none.DeclareRule("root");
  none.DefineRule(r, nothing);
  absl::StatusOr<Grammar> gn = std::move(none).Build(r);
  ASSERT_TRUE(gn.ok());
  EXPECT_FALSE(Matches(*gn, ""));
}

// Random patterns over a small alphabet, compared with std::regex (ECMAScript) on every short
// string over the alphabet: the grammar must accept exactly what std::regex matches.
// Quantifiers nest at most once (a repeated group holds no repeated items, only `?`), so
// std::regex's backtracking stays fast on every text.
class RandomPattern {
 public:
  // `unicode`: literals and classes outside ASCII too (é U+00E9, 😀 U+1F600).
  RandomPattern(uint32_t seed, bool unicode) : rng_(seed), unicode_(unicode) {}

  std::string Make(int depth, bool repeated = false) {
    std::string out;
    const int n = Pick(1, 3);
    for (int i = 0; i < n; ++i) out += Term(depth, repeated);
    if (depth > 0 && Pick(0, 3) == 0) out += "|" + Make(depth - 1, repeated);
    return out;
  }

 private:
  int Pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  std::string Term(int depth, bool repeated) {
    std::string quantifier;
    switch (Pick(0, 9)) {
      case 0:
        quantifier = "*";
        break;
      case 1:
        quantifier = "+";
        break;
      case 2:
        quantifier = "?";
        break;
      case 3:
        quantifier = "{" + std::to_string(Pick(0, 2)) + "," + std::to_string(Pick(2, 3)) + "}";
        break;
      default:
        break;
    }
    if (repeated && quantifier != "?") quantifier.clear();
    std::string atom;
    if (!repeated && Pick(0, 11) == 0) return Pick(0, 1) ? "^" : "$";  // anywhere but in a loop
    switch (Pick(0, 9)) {
      case 0:
        atom = ".";
        break;
      case 1:
        atom = "[ab]";
        break;
      case 2:
        atom = "[^a]";
        break;
      case 3:
        atom = "\\s";
        break;
      case 4:
        if (depth > 0) {
          atom = (Pick(0, 1) ? "(" : "(?:") +
                 Make(depth - 1, repeated || (!quantifier.empty() && quantifier != "?")) + ")";
          break;
        }
        [[fallthrough]];
      case 5:
        if (unicode_) {
          static const char* const kUnicodeAtoms[] = {
              "\xC3\xA9",      "\xF0\x9F\x98\x80", "[\xC3\xA9-\xF0\x9F\x98\x80]",
              "[^\xC3\xA9]",   "[a-\xC3\xA9]",     "\\u00e9",
              "[^\\u{1F600}a]"};
          atom = kUnicodeAtoms[Pick(0, 6)];
          break;
        }
        [[fallthrough]];
      default:
        atom = std::string(1, "ab\n-"[Pick(0, 3)]);
        break;
    }
    if (atom == "\n") atom = "\\n";
    return atom + quantifier;
  }
  std::mt19937 rng_;
  bool unicode_;
};

std::wstring Widen(std::string_view utf8) {  // wchar_t is UTF-32 here
  std::wstring out;
  for (size_t i = 0; i < utf8.size();) {
    const uint8_t c = uint8_t(utf8[i]);
    const int len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    uint32_t cp = len == 1 ? c : c & (0x7F >> len);
    for (int k = 1; k < len; ++k) cp = (cp << 6) | (uint8_t(utf8[i + k]) & 0x3F);
    out += wchar_t(cp);
    i += len;
  }
  return out;
}

// Compares the grammars of random patterns with std::wregex (ECMAScript, over code points) on
// every text of up to `max_len` characters of `alphabet` (UTF-8, one character a string).
void CompareWithStdRegex(const std::vector<std::string>& alphabet, size_t max_len, bool unicode,
                         int rounds) {
  // Breadth first: text j > 0 is text (j - 1) / k and one more character, so the automaton
  // walks each prefix once.
  const size_t k = alphabet.size();
  std::vector<std::string> texts = {""};
  std::vector<size_t> length = {0};
  for (size_t i = 0; length[i] < max_len; ++i) {
    for (const std::string& c : alphabet) {
      texts.push_back(texts[i] + c);
      length.push_back(length[i] + 1);
    }
  }
  std::vector<std::wstring> wide;
  for (const std::string& t : texts) wide.push_back(Widen(t));
  RandomPattern gen(43, unicode);
  for (int round = 0; round < rounds; ++round) {
    std::string pattern = gen.Make(2);
    if (round % 3 == 0) pattern = "^" + pattern;
    if (round % 5 == 0) pattern += "$";
    // std::regex knows no \u{...}: give it the code point itself.
    std::string for_std = pattern;
    for (size_t at; (at = for_std.find("\\u{1F600}")) != std::string::npos;) {
      for_std.replace(at, 9, "\xF0\x9F\x98\x80");
    }
    const std::wregex re(Widen(for_std), std::regex::ECMAScript);
    for (bool search : {false, true}) {
      // A quantified group holding only an anchor ("(^)?") is refused by name, never guessed:
      // the generator may write one (its random numbers differ between standard libraries).
      absl::StatusOr<Grammar> g = TryCompile(pattern, search);
      if (!g.ok() && absl::IsInvalidArgument(g.status()) &&
          g.status().message().find("anchor") != std::string_view::npos) {
        continue;
      }
      ASSERT_TRUE(g.ok()) << pattern << ": " << g.status();
      Automaton a(std::make_shared<const Grammar>(*std::move(g)));
      std::vector<int32_t> state(texts.size());
      state[0] = a.Start();
      for (size_t j = 0; j < texts.size(); ++j) {
        if (j > 0) {
          const int32_t parent = state[(j - 1) / k];
          const std::string& last = alphabet[(j - 1) % k];
          state[j] = parent == Automaton::kDead ? parent : a.StepBytes(parent, last);
        }
        const bool got = state[j] != Automaton::kDead && a.Accepting(state[j]);
        const bool want = search ? std::regex_search(wide[j], re) : std::regex_match(wide[j], re);
        ASSERT_EQ(got, want) << "/" << pattern << "/ search=" << search << " on \"" << texts[j]
                             << "\"";
      }
      ASSERT_TRUE(a.status().ok()) << a.status();
    }
  }
}

TEST(RegexTest, AgreesWithStdRegexOnRandomPatterns) {
  CompareWithStdRegex({"a", "b", "\n", "-"}, 5, /*unicode=*/false, 1000);
}

TEST(RegexTest, AgreesWithStdRegexOnRandomPatternsOverCodePoints) {
  CompareWithStdRegex({"a", "\n", "-", "\xC3\xA9", "\xF0\x9F\x98\x80"}, 4, /*unicode=*/true, 600);
}

}  // namespace
}  // namespace heavykv::grammar
