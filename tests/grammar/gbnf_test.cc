// CompileGbnf: llama.cpp's dialect, on llama.cpp's own example grammars (tests/data/gbnf) and on
// small grammars for each construct, with strings that must and must not match, and the errors.
#include "engine/grammar/gbnf.h"

#include <gtest/gtest.h>

#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace heavykv::grammar {
namespace {

std::string ReadGrammarFile(const std::string& name) {
  std::ifstream in(std::string(HEAVYKV_SOURCE_DIR) + "/tests/data/gbnf/" + name);
  EXPECT_TRUE(in.good()) << name;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void Expect(std::string_view text, const std::vector<std::string>& yes,
            const std::vector<std::string>& no, std::string_view what = "") {
  absl::StatusOr<Grammar> g = CompileGbnf(text);
  ASSERT_TRUE(g.ok()) << what << ": " << g.status();
  for (const std::string& s : yes) {
    EXPECT_TRUE(Matches(*g, s)) << what << " should match \"" << s << "\"";
  }
  for (const std::string& s : no) {
    EXPECT_FALSE(Matches(*g, s)) << what << " should not match \"" << s << "\"";
  }
}

void ExpectFile(const std::string& file, const std::vector<std::string>& yes,
                const std::vector<std::string>& no) {
  Expect(ReadGrammarFile(file), yes, no, file);
}

TEST(GbnfTest, LlamaCppJson) {
  ExpectFile("json.gbnf",
             {"{}", "{\"a\": 1}", "{\"a\":[1, 2.5e3, true, null, \"x\\n\\u00e9\"]}",
              "{\n  \"k\": {\"n\": -0.5}}", "{\"\xC3\xA9\": \"\xF0\x9F\x98\x80\"} "},
             {"", "[]", "{", "{\"a\" 1}", "{\"a\": 01x}", "{\"a\": \"\x01\"}", "{'a': 1}",
              "{\"a\": tru}"});
  ExpectFile("json_arr.gbnf", {"[\n]", "[\n{\"a\": 1},\n2]"}, {"[]", "{}", "[\n1] "});
}

TEST(GbnfTest, LlamaCppArithmeticListChess) {
  ExpectFile("arithmetic.gbnf", {"1+2= 3\n", "x *(y -2)=z\n", "a=b\nc=d\n"},
             {"1+2=3", "x * (y)=z\n", "1+=3\n", "=3\n", "A=b\n"});
  ExpectFile("list.gbnf", {"- a\n", "- one\n- two \xC3\xA9\n"},
             {"", "- \n", "-a\n", "- a", "- a\rb\n", "- a\xE2\x80\xA8\n"});
  ExpectFile("chess.gbnf", {"1. e4 e5\n2. Nf3 Nc6\n", "1. d4 d5\n2. c4 dxc4\n10. O-O O-O-O\n"},
             {"1. e4 e5\n", "1. e9 e5\n2. Nf3 Nc6\n", "1. e4 e5\n0. Nf3 Nc6\n"});
}

TEST(GbnfTest, LlamaCppCJapaneseEnglish) {
  ExpectFile("c.gbnf",
             {"int main(){return 0;}", "int f(int x){x = x+1;return x;}",
              "float g(){while(a<b){a = a*2;}}int h(){}"},
             {"int main(){return 0}", "main(){}", "int main(){return 0;"});
  ExpectFile("japanese.gbnf",
             {"\xE3\x81\x93\xE3\x82\x93\xE3\x81\xAB\xE3\x81\xA1\xE3\x81\xAF",  // こんにちは
              "\xE6\x97\xA5\xE6\x9C\xAC \xE8\xAA\x9E"},                        // 日本 語
             {"", "abc", "\xE6\x97\xA5 ", "\xE6\x97\xA5  \xE6\x97\xA5"});
  ExpectFile("english.gbnf", {"Hello, world!", "a b\nc"}, {"", "a  b", "caf\xC3\xA9"});
}

TEST(GbnfTest, Constructs) {
  Expect("root ::= \"a\" [b-d]+ . \"\\x41\\u00e9\\U0001F600\"",
         {"ab\xE2\x82\xAC"
          "A\xC3\xA9\xF0\x9F\x98\x80",
          "abcdzA\xC3\xA9\xF0\x9F\x98\x80"},
         {"azA\xC3\xA9\xF0\x9F\x98\x80", "ab\nA\xC3\xA9"});
  Expect("root ::= [^a-c\\]\\\\] [\\t\\r\\n] \"\\\"\\\\\\[\\]\"", {"d\t\"\\[]", "\xC3\xA9\n\"\\[]"},
         {"a\t\"\\[]", "]\t\"\\[]", "\\\t\"\\[]"});
  Expect("root ::= x{2} y{1,} z{0,2} w{2,3}\nx ::= \"x\"\ny ::= \"y\"\nz ::= \"z\"\nw ::= \"w\"",
         {"xxyww", "xxyyyzzwww"}, {"xyww", "xxww", "xxyzzzww", "xxywwww"});
  // Quantifiers apply to the last item: a whole literal, a class, a rule, a group.
  Expect("root ::= \"ab\"* (\"c\" | \"d\")+ e?\ne ::= \"e\"", {"c", "ababdce"}, {"abe", "aabc"});
  // A newline ends a rule outside parentheses, except after `|` and `::=`; comments anywhere.
  Expect("# header\nroot ::=\n  \"a\" |   # first\n  \"b\" ( # nested\n \"c\"\n  )\n\n",
         {"a", "bc"}, {"b", "ac"});
  Expect("root ::= | \"x\"", {"", "x"}, {"xx"});
  Expect("root ::= rule-1\nrule-1 ::= \"1\" Rule2\nRule2 ::= [0-9]{3}\r\n", {"1123"}, {"11"});
  // A rule may be used before it is defined, and recursively.
  Expect("root ::= list\nlist ::= \"(\" list* \")\"", {"()", "(()(()))"}, {"(()", "())"});
  Expect("root ::= (\"a\"?)* \"b\"", {"b", "aab"}, {"ba"});  // a nullable item repeated
}

TEST(GbnfTest, ErrorsNameLineAndColumn) {
  struct Case {
    const char* text;
    const char* says;
  };
  for (const Case& c : std::vector<Case>{
           {"root ::= foo", "line 1, column 10: the rule `foo` is used but never defined"},
           {"item ::= \"a\"", "no `root` rule"},
           {"root ::= \"a\"\nroot ::= \"b\"", "line 2, column 1: the rule `root` is defined twice"},
           {"root ::= \"a", "line 1, column 10: a `\"` without its closing"},
           {"root ::= [a", "`[` without its `]`"},
           {"root ::= (\"a\"", "`(` without its `)`"},
           {"root ::= \"a\")", "line 1, column 13: unexpected `)`"},
           {"root = \"a\"", "expected `::=`"},
           {"::= \"a\"", "expected a rule name"},
           {"root ::= * \"a\"", "nothing before it to repeat"},
           {"root ::= \"a\"{3,1}", "n < m"},
           {"root ::= \"a\"{x}", "expected a count"},
           {"root ::= \"\\q\"", "unknown escape"},
           {"root ::= \"\\x4\"", "hex digits"},
           {"root ::= [z-a]", "out of order"},
           {"root ::= <[1234]>", "token references"},
           {"root ::= \"\xC3\"", "invalid UTF-8"},
           {"root ::= root \"a\"", "left-recursive"},
           {"root ::= \"a\"\n  | \"b\"", "line 2, column 3"},
       }) {
    absl::StatusOr<Grammar> g = CompileGbnf(c.text);
    ASSERT_FALSE(g.ok()) << c.text;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_NE(g.status().message().find(c.says), std::string_view::npos)
        << c.text << ": " << g.status().message() << " should say " << c.says;
  }
}

TEST(GbnfTest, LimitsAndOtherRoots) {
  GrammarLimits limits;
  limits.max_repeat = 50;
  limits.max_depth = 4;
  EXPECT_EQ(CompileGbnf("root ::= \"a\"{51}", "root", limits).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(CompileGbnf("root ::= ((((((\"a\"))))))", "root", limits).status().code(),
            absl::StatusCode::kResourceExhausted);
  absl::StatusOr<Grammar> g = CompileGbnf("root ::= \"a\"\nother ::= \"b\"", "other");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(Matches(*g, "b"));
  EXPECT_FALSE(Matches(*g, "a"));
}

}  // namespace
}  // namespace heavykv::grammar
