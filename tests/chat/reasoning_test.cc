// engine/chat/reasoning.h: <think> blocks split from the answer, opened by the output or by the
// prompt, whole and streamed (split at every byte boundary: the same parts).
#include "engine/chat/reasoning.h"

#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace heavykv {
namespace {

using ::heavykv::testing::SourcePath;

ReasoningSplit Stream(const std::vector<std::string>& pieces, bool open) {
  ReasoningStreamParser parser(open);
  ReasoningSplit out;
  for (const std::string& p : pieces) {
    ReasoningDelta d = parser.Feed(p);
    out.reasoning += d.reasoning;
    out.content += d.content;
  }
  ReasoningDelta d = parser.Finish();
  out.reasoning += d.reasoning;
  out.content += d.content;
  out.has_reasoning = parser.opened();
  return out;
}

ReasoningSplit SplitEveryWay(const std::string& text, bool open) {
  const ReasoningSplit whole = SplitReasoning(text, open);
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    const ReasoningSplit s = Stream({text.substr(0, cut), text.substr(cut)}, open);
    EXPECT_EQ(s.reasoning, whole.reasoning) << "cut at " << cut << ": " << text;
    EXPECT_EQ(s.content, whole.content) << "cut at " << cut << ": " << text;
    EXPECT_EQ(s.has_reasoning, whole.has_reasoning) << "cut at " << cut << ": " << text;
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  const ReasoningSplit b = Stream(bytes, open);
  EXPECT_EQ(b.reasoning, whole.reasoning) << text;
  EXPECT_EQ(b.content, whole.content) << text;
  return whole;
}

TEST(ReasoningTest, OutputOpensTheBlock) {
  const ReasoningSplit s = SplitEveryWay("<think>\nLet me think.\n</think>\n\nIt is 4.", false);
  EXPECT_TRUE(s.has_reasoning);
  EXPECT_EQ(s.reasoning, "\nLet me think.\n");
  EXPECT_EQ(s.content, "It is 4.");
}

TEST(ReasoningTest, PromptOpensTheBlock) {
  const ReasoningSplit s = SplitEveryWay("Hmm, 2+2 < 5.\n</think>\n\nFour.", true);
  EXPECT_EQ(s.reasoning, "Hmm, 2+2 < 5.\n");
  EXPECT_EQ(s.content, "Four.");
}

TEST(ReasoningTest, NoBlockIsAllContent) {
  for (const std::string text : {"Just an answer.", "  <thin", "<b>bold</b>", "", "\n\n"}) {
    const ReasoningSplit s = SplitEveryWay(text, false);
    EXPECT_FALSE(s.has_reasoning) << text;
    EXPECT_EQ(s.reasoning, "");
    EXPECT_EQ(s.content, text);
  }
  // A tag later in the answer is the answer's.
  EXPECT_EQ(SplitEveryWay("Use <think> tags.", false).content, "Use <think> tags.");
}

TEST(ReasoningTest, CutShortInsideIsAllReasoning) {
  const ReasoningSplit s = SplitEveryWay("<think>still going </thi", false);
  EXPECT_TRUE(s.has_reasoning);
  EXPECT_EQ(s.reasoning, "still going </thi");
  EXPECT_EQ(s.content, "");
  const ReasoningSplit e = SplitEveryWay("<think></think>Answer", false);
  EXPECT_TRUE(e.has_reasoning);
  EXPECT_EQ(e.reasoning, "");
  EXPECT_EQ(e.content, "Answer");
}

// Texts assembled at random from tag pieces, streamed in random pieces: the same parts.
TEST(ReasoningTest, RandomTextsStreamAsTheySplit) {
  const std::vector<std::string> pool = {"<think>", "</think>", "<thi", "</th", "\n", " ", "a",
                                         "<", ">", "think"};
  std::mt19937 rng(5);
  for (int n = 0; n < 1000; ++n) {
    std::string text;
    for (int k = rng() % 7; k >= 0; --k) text += pool[rng() % pool.size()];
    const bool open = rng() % 2;
    const ReasoningSplit whole = SplitReasoning(text, open);
    std::vector<std::string> pieces;
    for (size_t at = 0; at < text.size();) {
      const size_t len = 1 + rng() % 5;
      pieces.push_back(text.substr(at, len));
      at += len;
    }
    const ReasoningSplit s = Stream(pieces, open);
    EXPECT_EQ(s.reasoning, whole.reasoning) << text;
    EXPECT_EQ(s.content, whole.content) << text;
    EXPECT_EQ(s.has_reasoning, whole.has_reasoning) << text;
  }
}

TEST(ReasoningTest, PromptEnds) {
  EXPECT_TRUE(PromptOpensReasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_TRUE(PromptOpensReasoning("<｜Assistant｜><think>"));
  EXPECT_FALSE(PromptOpensReasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(PromptOpensReasoning("<|im_start|>assistant\n"));
}

TEST(ReasoningTest, TemplatesWithThinkTags) {
  const auto uses = [](const std::string& name) {
    std::ifstream in(SourcePath("tests/data/chat_templates/" + name + ".jinja"));
    std::stringstream ss;
    ss << in.rdbuf();
    return TemplateUsesThinkTags(ss.str());
  };
  EXPECT_TRUE(uses("qwen3"));
  EXPECT_FALSE(uses("qwen2.5"));
  EXPECT_FALSE(uses("llama3.1"));
}

}  // namespace
}  // namespace heavykv
