// The byte grammar, its builder and the automaton: what strings match, and token masks.
#include "engine/grammar/grammar.h"

#include <gtest/gtest.h>

#include "engine/grammar/automaton.h"

namespace heavykv::grammar {
namespace {

using Expr = GrammarBuilder::Expr;

Grammar BuildOrDie(GrammarBuilder& b, Expr body) {
  RuleId root = b.DeclareRule("root");
  b.DefineRule(root, body);
  absl::StatusOr<Grammar> g = std::move(b).Build(root);
  EXPECT_TRUE(g.ok()) << g.status();
  return *g;
}

TEST(GrammarTest, LiteralsSequencesAndRepeats) {
  GrammarBuilder b;
  Expr digit = b.Bytes(ByteSet::Range('0', '9'));
  Grammar g = BuildOrDie(b, b.Seq({b.Literal("n="), b.Repeat(digit, 1, -1)}));
  EXPECT_TRUE(Matches(g, "n=0"));
  EXPECT_TRUE(Matches(g, "n=0123456789"));
  EXPECT_FALSE(Matches(g, "n="));
  EXPECT_FALSE(Matches(g, "n=1x"));
  EXPECT_FALSE(Matches(g, "m=1"));
}

TEST(GrammarTest, BoundedRepeatAndAlternatives) {
  GrammarBuilder b;
  Expr ab = b.Alt({b.Literal("a"), b.Literal("bc")});
  Grammar g = BuildOrDie(b, b.Repeat(ab, 2, 3));
  EXPECT_FALSE(Matches(g, "a"));
  EXPECT_TRUE(Matches(g, "aa"));
  EXPECT_TRUE(Matches(g, "abc"));
  EXPECT_TRUE(Matches(g, "bcabc"));
  EXPECT_FALSE(Matches(g, "bcabca"));
  EXPECT_FALSE(Matches(g, "aaaa"));
  EXPECT_FALSE(Matches(g, "ab"));
}

TEST(GrammarTest, CodePointsAreUtf8) {
  GrammarBuilder b;
  // Anything but '"' and the controls, as a JSON string's characters.
  Expr ch = b.CodePoints({{'"', '"'}, {0, 0x1f}}, /*negate=*/true);
  Grammar g = BuildOrDie(b, b.Seq({b.Literal("\""), b.Repeat(ch, 0, -1), b.Literal("\"")}));
  EXPECT_TRUE(Matches(g, "\"h\xC3\xA9llo \xE2\x82\xAC \xF0\x9F\x98\x80\""));
  EXPECT_FALSE(Matches(g, "\"\xC3\""));           // a cut character
  EXPECT_FALSE(Matches(g, "\"\xED\xA0\x80\""));   // a surrogate
  EXPECT_FALSE(Matches(g, "\"\xC0\xAF\""));       // an overlong form
  EXPECT_FALSE(Matches(g, "\"a\nb\""));
  GrammarBuilder b2;
  Grammar narrow = BuildOrDie(b2, b2.CodePoints({{0x400, 0x4FF}, {0x10000, 0x10010}}));
  EXPECT_TRUE(Matches(narrow, "\xD0\x80"));   // U+0400
  EXPECT_TRUE(Matches(narrow, "\xD3\xBF"));   // U+04FF
  EXPECT_FALSE(Matches(narrow, "\xD4\x80"));  // U+0500
  EXPECT_TRUE(Matches(narrow, "\xF0\x90\x80\x90"));
  EXPECT_FALSE(Matches(narrow, "\xF0\x90\x80\x91"));
}

TEST(GrammarTest, RecursionThroughNamedRules) {
  GrammarBuilder b;
  RuleId root = b.DeclareRule("root");
  RuleId list = b.DeclareRule("list");
  b.DefineRule(list, b.Seq({b.Literal("("), b.Repeat(b.Ref(list), 0, -1), b.Literal(")")}));
  b.DefineRule(root, b.Ref(list));
  absl::StatusOr<Grammar> g = std::move(b).Build(root);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(Matches(*g, "()"));
  EXPECT_TRUE(Matches(*g, "(()(()))"));
  EXPECT_FALSE(Matches(*g, "(()"));
  EXPECT_FALSE(Matches(*g, "())"));
}

TEST(GrammarTest, LeftRecursionAndUndefinedRulesAreErrors) {
  GrammarBuilder b;
  RuleId root = b.DeclareRule("expr");
  b.DefineRule(root, b.Alt({b.Seq({b.Ref(root), b.Literal("+1")}), b.Literal("1")}));
  absl::StatusOr<Grammar> g = std::move(b).Build(root);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("left-recursive"), std::string::npos) << g.status();

  GrammarBuilder b2;
  RuleId r2 = b2.DeclareRule("root");
  RuleId missing = b2.DeclareRule("missing");
  b2.DefineRule(r2, b2.Ref(missing));
  g = std::move(b2).Build(r2);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("`missing`"), std::string::npos) << g.status();
}

TEST(GrammarTest, NullableLoopsTerminate) {
  GrammarBuilder b;
  Grammar g = BuildOrDie(b, b.Repeat(b.Optional(b.Literal("a")), 0, -1));
  EXPECT_TRUE(Matches(g, ""));
  EXPECT_TRUE(Matches(g, "aaaa"));
  EXPECT_FALSE(Matches(g, "ab"));
}

TEST(GrammarTest, RepeatLimitIsAnError) {
  GrammarBuilder b(GrammarLimits{.max_repeat = 100});
  RuleId root = b.DeclareRule("root");
  b.DefineRule(root, b.Repeat(b.Literal("a"), 0, 101));
  absl::StatusOr<Grammar> g = std::move(b).Build(root);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kResourceExhausted);
}

std::vector<int32_t> Allowed(Automaton& a, int32_t state) {
  std::vector<uint64_t> words(a.vocab()->num_words());
  a.FillMask(state, words);
  std::vector<int32_t> ids;
  for (int32_t t = 0; t < a.vocab()->size(); ++t) {
    if ((words[t >> 6] >> (t & 63)) & 1) ids.push_back(t);
  }
  return ids;
}

TEST(AutomatonTest, MasksFollowTheGrammarByteByByte) {
  // Tokens: 0 "<eos>", 1 "a", 2 "ab", 3 "b", 4 "ba", 5 "\xC3", 6 "\xA9", 7 "\xC3\xA9", 8 "<ctl>"
  auto vocab = TokenVocabulary::FromBytes(
      {"", "a", "ab", "b", "ba", "\xC3", "\xA9", "\xC3\xA9", "<ctl>"}, {0}, {8});
  GrammarBuilder b;
  // ("a" | "b")* then one é.
  Grammar g = BuildOrDie(
      b, b.Seq({b.Repeat(b.Alt({b.Literal("a"), b.Literal("b")}), 0, -1),
                b.CodePoints({{0xE9, 0xE9}})}));
  auto a = std::make_shared<Automaton>(std::make_shared<const Grammar>(g), vocab);
  int32_t s = a->Start();
  EXPECT_EQ(Allowed(*a, s), (std::vector<int32_t>{1, 2, 3, 4, 5, 7}));
  s = a->StepToken(s, 5);  // half of é
  EXPECT_EQ(Allowed(*a, s), (std::vector<int32_t>{6}));
  s = a->StepToken(s, 6);
  EXPECT_TRUE(a->Accepting(s));
  EXPECT_FALSE(a->CanContinue(s));
  EXPECT_EQ(Allowed(*a, s), (std::vector<int32_t>{0}));  // only the end
  EXPECT_EQ(a->StepToken(a->Start(), 8), Automaton::kDead);
}

TEST(AutomatonTest, LoopingSubtreesAreAcceptedWhole) {
  // Many tokens of 'x' and 'y' under one prefix: the loop shortcut must give the same mask as
  // the walk would (all but those containing 'z').
  std::vector<std::string> bytes = {""};
  for (int i = 0; i < 64; ++i) {
    std::string s = "q";
    for (int k = 0; k < 6; ++k) s += ((i >> k) & 1) ? 'x' : 'y';
    bytes.push_back(s);
  }
  bytes.push_back("qxz");
  auto vocab = TokenVocabulary::FromBytes(bytes, {0});
  GrammarBuilder b;
  Grammar g = BuildOrDie(b, b.Repeat(b.Bytes(ByteSet::Range('q', 'y')), 0, -1));
  auto a = std::make_shared<Automaton>(std::make_shared<const Grammar>(g), vocab);
  std::vector<int32_t> want = {0};
  for (int i = 1; i <= 64; ++i) want.push_back(i);
  EXPECT_EQ(Allowed(*a, a->Start()), want);
}

TEST(AutomatonTest, AmbiguityPastTheLimitEndsTheMatch) {
  GrammarBuilder b;
  Expr any_a = b.Repeat(b.Literal("a"), 0, -1);
  std::vector<Expr> parts(40, any_a);
  Grammar g = BuildOrDie(b, b.Seq(parts));
  auto a = std::make_shared<Automaton>(std::make_shared<const Grammar>(g), nullptr,
                                       AutomatonLimits{.max_stacks_per_state = 16});
  int32_t s = a->StepBytes(a->Start(), "aaaa");
  EXPECT_EQ(s, Automaton::kDead);
  EXPECT_EQ(a->status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(AutomatonTest, LongestPrefixTokenFollowsTheTrie) {
  auto vocab = TokenVocabulary::FromBytes({"", "a", "ab", "abc", "b", "ba", "<c>"}, {0}, {6});
  EXPECT_EQ(vocab->LongestPrefixToken("abd"), (std::pair<int32_t, size_t>{2, 2}));
  EXPECT_EQ(vocab->LongestPrefixToken("abcab"), (std::pair<int32_t, size_t>{3, 3}));
  EXPECT_EQ(vocab->LongestPrefixToken("bb"), (std::pair<int32_t, size_t>{4, 1}));
  EXPECT_EQ(vocab->LongestPrefixToken("c"), (std::pair<int32_t, size_t>{-1, 0}));
  EXPECT_EQ(vocab->LongestPrefixToken("<c>"), (std::pair<int32_t, size_t>{-1, 0}));  // control
}

}  // namespace
}  // namespace heavykv::grammar
