// Constraints at serving time (engine/grammar/constraint.h): the compile cache, the matcher's
// masks and ends, lazy triggers, and the walk `heavykv grammar test` makes.
#include "engine/grammar/constraint.h"

#include <gtest/gtest.h>

#include "engine/grammar/json_text.h"
#include "engine/grammar/test_suite.h"

namespace heavykv::grammar {
namespace {

// Tokens: 0 <eos>, 1 "yes", 2 "no", 3 "y", 4 "es", 5 "<call>", 6 "x", 7 " ", 8 "<ctl>".
std::shared_ptr<const TokenVocabulary> Vocab() {
  return TokenVocabulary::FromBytes({"", "yes", "no", "y", "es", "<call>", "x", " ", "<ctl>"},
                                    {0}, {8});
}

std::vector<int32_t> Allowed(ConstraintMatcher& m, int32_t n) {
  std::vector<uint64_t> words(1);
  m.FillMask(words);
  std::vector<int32_t> ids;
  for (int32_t t = 0; t < n; ++t) {
    if ((words[0] >> t) & 1) ids.push_back(t);
  }
  return ids;
}

ConstraintSpec Choice(std::vector<std::string> choices) {
  ConstraintSpec s;
  s.kind = ConstraintSpec::Kind::kChoice;
  s.choices = std::move(choices);
  return s;
}

TEST(ConstraintTest, MatcherMasksAcceptsAndCompletes) {
  ConstraintCompiler compiler(Vocab());
  auto c = compiler.Compile(Choice({"yes", "no"}));
  ASSERT_TRUE(c.ok()) << c.status();
  ConstraintMatcher m(*c);
  EXPECT_TRUE(m.active());
  EXPECT_EQ(Allowed(m, 9), (std::vector<int32_t>{1, 2, 3}));
  ASSERT_TRUE(m.Accept(3).ok());  // "y"
  EXPECT_FALSE(m.Complete());
  EXPECT_EQ(Allowed(m, 9), (std::vector<int32_t>{4}));
  EXPECT_FALSE(m.Accept(0).ok());  // the end before the grammar is matched
  ASSERT_TRUE(m.Accept(4).ok());
  EXPECT_TRUE(m.Complete());
  EXPECT_EQ(Allowed(m, 9), (std::vector<int32_t>{0}));
  ConstraintMatcher other(*c);
  EXPECT_EQ(other.Accept(6).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(other.Accept(8).code(), absl::StatusCode::kFailedPrecondition);  // control token
}

TEST(ConstraintTest, CompiledConstraintsAreCachedBySpec) {
  ConstraintCompiler compiler(Vocab(), /*max_entries=*/2);
  auto a = compiler.Compile(Choice({"yes"}));
  auto a2 = compiler.Compile(Choice({"yes"}));
  ASSERT_TRUE(a.ok() && a2.ok());
  EXPECT_EQ(a->get(), a2->get());
  auto b = compiler.Compile(Choice({"no"}));
  auto c = compiler.Compile(Choice({"yes", "no"}));
  ASSERT_TRUE(b.ok() && c.ok());
  auto a3 = compiler.Compile(Choice({"yes"}));  // evicted by the two newer ones
  ASSERT_TRUE(a3.ok());
  EXPECT_NE(a->get(), a3->get());
  EXPECT_TRUE(absl::IsInvalidArgument(compiler.Compile(Choice({})).status()));
}

TEST(ConstraintTest, LazyConstraintsStartAtTheirTrigger) {
  ConstraintCompiler compiler(Vocab());
  ConstraintSpec s = Choice({"<call>yes", "<call>no"});
  s.triggers = {"<call>"};
  s.trigger_in_grammar = true;
  auto c = compiler.Compile(s);
  ASSERT_TRUE(c.ok()) << c.status();
  ConstraintMatcher m(*c);
  EXPECT_FALSE(m.active());
  ASSERT_TRUE(m.Accept(6).ok());  // free text before the trigger
  ASSERT_TRUE(m.Accept(7).ok());
  EXPECT_FALSE(m.active());
  ASSERT_TRUE(m.Accept(5).ok());  // the trigger
  EXPECT_TRUE(m.active());
  EXPECT_EQ(Allowed(m, 9), (std::vector<int32_t>{1, 2, 3}));
  ASSERT_TRUE(m.Accept(2).ok());
  EXPECT_TRUE(m.Complete());

  // A trigger the grammar does not include: what follows it must match (after spaces).
  ConstraintSpec after = Choice({"yes"});
  after.triggers = {"<call>"};
  auto c2 = compiler.Compile(after);
  ASSERT_TRUE(c2.ok()) << c2.status();
  ConstraintMatcher m2(*c2);
  ASSERT_TRUE(m2.Accept(5).ok());
  EXPECT_EQ(Allowed(m2, 9), (std::vector<int32_t>{1, 3, 7}));
  ConstraintMatcher m3(*c2);
  ASSERT_TRUE(m3.Accept(5).ok());
  EXPECT_FALSE(m3.Accept(2).ok());  // "no" does not fit
}

TEST(ConstraintTest, PythonJsonDumpsWritesAsPythonDoes) {
  const auto j = nlohmann::ordered_json::parse(
      R"({"b": [1, 2.0, -0.0, 1e16, 1.5e-07, 0.0001, 123.456, true, null], "a": "é\n\u0001\"",
          "e": {}, "f": []})");
  EXPECT_EQ(PythonJsonDumps(j),
            "{\"b\": [1, 2.0, -0.0, 1e+16, 1.5e-07, 0.0001, 123.456, true, null], "
            "\"a\": \"é\\n\\u0001\\\"\", \"e\": {}, \"f\": []}");
  EXPECT_EQ(PythonJsonDumps(nlohmann::ordered_json::parse("[1e22, 123456789012345.6, 1e-5]")),
            "[1e+22, 123456789012345.6, 1e-05]");
}

}  // namespace
}  // namespace heavykv::grammar
