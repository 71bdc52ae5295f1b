// Utf8Class: for sets of code point ranges, every code point's UTF-8 encoding matches exactly
// when the code point is in the set (checked for all of U+0000..U+10FFFF), surrogates, overlong
// forms and cut sequences never do, and the trie lets one alternative go on at each byte.
#include "engine/grammar/utf8_class.h"

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine/grammar/automaton.h"

namespace heavykv::grammar {
namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

std::string Utf8(uint32_t cp) {  // also encodes surrogates, for the negative checks
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += {char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
  } else if (cp < 0x10000) {
    s += {char(0xE0 | (cp >> 12)), char(0x80 | ((cp >> 6) & 0x3F)), char(0x80 | (cp & 0x3F))};
  } else {
    s += {char(0xF0 | (cp >> 18)), char(0x80 | ((cp >> 12) & 0x3F)),
          char(0x80 | ((cp >> 6) & 0x3F)), char(0x80 | (cp & 0x3F))};
  }
  return s;
}

bool In(const Ranges& rs, uint32_t cp) {
  for (auto [lo, hi] : rs) {
    if (cp >= lo && cp <= hi) return true;
  }
  return false;
}

std::shared_ptr<const Grammar> Build(const Ranges& rs, bool negate) {
  GrammarBuilder b;
  GrammarBuilder::Expr e = Utf8Class(b, rs, negate);
  RuleId root = b.DeclareRule("root");
  b.DefineRule(root, e);
  absl::StatusOr<Grammar> g = std::move(b).Build(root);
  EXPECT_TRUE(g.ok()) << g.status();
  return std::make_shared<const Grammar>(*std::move(g));
}

void CheckEveryCodePoint(const Ranges& rs, bool negate) {
  Automaton a(Build(rs, negate));
  const int32_t start = a.Start();
  for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    const int32_t s = a.StepBytes(start, Utf8(cp));
    const bool got = s != Automaton::kDead && a.Accepting(s);
    const bool surrogate = cp >= 0xD800 && cp <= 0xDFFF;
    const bool want = !surrogate && In(rs, cp) != negate;
    ASSERT_EQ(got, want) << "U+" << std::hex << cp << " negate=" << negate;
  }
  for (std::string bad : {std::string("\xC0\xAF"), std::string("\xE0\x80\xAF"),
                          std::string("\xF0\x80\x80\xAF"), std::string("\xF4\x90\x80\x80"),
                          std::string("\xC3"), std::string("\x80"), std::string("\xFF")}) {
    const int32_t s = a.StepBytes(start, bad);
    EXPECT_TRUE(s == Automaton::kDead || !a.Accepting(s));
  }
  ASSERT_TRUE(a.status().ok()) << a.status();
}

TEST(Utf8ClassTest, EveryCodePointOfHandPickedSets) {
  for (const Ranges& rs : std::vector<Ranges>{
           {},
           {{0, 0x10FFFF}},
           {{'a', 'z'}, {'0', '9'}},
           {{0x7F, 0x80}, {0x7FF, 0x800}, {0xFFFF, 0x10000}, {0x10FFFF, 0x10FFFF}},
           {{0xD000, 0xE100}},  // across the surrogates
           {{0x20, 0x10FFFF}, {0x10, 0x30}},
           {{0x3B1, 0x3C9}, {0x4E00, 0x9FFF}, {0x1F600, 0x1F64F}, {0x401, 0x401}, {0x5FF, 0x641}},
       }) {
    CheckEveryCodePoint(rs, false);
    CheckEveryCodePoint(rs, true);
  }
}

TEST(Utf8ClassTest, EveryCodePointOfRandomSets) {
  std::mt19937 rng(43);
  for (int round = 0; round < 4; ++round) {
    Ranges rs;
    for (int i = 0; i < 40; ++i) {
      const uint32_t lo = rng() % 0x110000, len = rng() % (i % 2 ? 0x100 : 0x4000);
      rs.push_back({lo, lo + len});
    }
    CheckEveryCodePoint(rs, round % 2);
  }
}

TEST(Utf8ClassTest, SameStringsAsOneAlternativePerRangeWithFewerStacks) {
  // Many small ranges in one block: an alternation has an alternative for each, the trie one
  // path (GrammarBuilder::CodePoints is the trie too).
  Ranges rs;
  for (uint32_t cp = 0x4E00; cp < 0x5E00; cp += 7) rs.push_back({cp, cp + 2});
  GrammarBuilder b;
  RuleId root = b.DeclareRule("root");
  b.DefineRule(root, b.Repeat(Utf8Class(b, rs), 1, -1));
  absl::StatusOr<Grammar> g = std::move(b).Build(root);
  ASSERT_TRUE(g.ok());
  GrammarBuilder b2;
  RuleId root2 = b2.DeclareRule("root");
  std::vector<GrammarBuilder::Expr> each;
  for (const auto& r : rs) each.push_back(b2.CodePoints({r}));
  b2.DefineRule(root2, b2.Repeat(b2.Alt(std::move(each)), 1, -1));
  absl::StatusOr<Grammar> g2 = std::move(b2).Build(root2);
  ASSERT_TRUE(g2.ok());
  EXPECT_LT(g->NumElements(), g2->NumElements());
  Automaton a(std::make_shared<const Grammar>(*g));
  Automaton a2(std::make_shared<const Grammar>(*g2));
  int32_t s = a.Start(), s2 = a2.Start();
  for (uint32_t cp : {0x4E00u, 0x4E08u, 0x5DF9u, 0x4E01u}) {
    s = a.StepBytes(s, Utf8(cp));
    s2 = a2.StepBytes(s2, Utf8(cp));
    ASSERT_NE(s, Automaton::kDead);
    ASSERT_NE(s2, Automaton::kDead);
    EXPECT_EQ(a.Accepting(s), a2.Accepting(s2));
  }
  EXPECT_EQ(a.StepBytes(s, Utf8(0x4E03)), Automaton::kDead);
  EXPECT_EQ(a2.StepBytes(s2, Utf8(0x4E03)), Automaton::kDead);
  EXPECT_LT(a.num_frames(), a2.num_frames());
}

}  // namespace
}  // namespace heavykv::grammar
