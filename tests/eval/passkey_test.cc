// Passkey retrieval (`eval --task passkey`, engine/eval/passkey.h), tested for its mechanics: the
// prompt holds the key where the depth says and fills the length asked for, the scoring reads the
// answer's first number, and every configuration answers the same prompts. The bundled model
// cannot retrieve, so its accuracy is whatever it is; only its bookkeeping is checked.
#include "engine/eval/passkey.h"

#include <gtest/gtest.h>

#include <set>

#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace heavykv {
namespace {

class PasskeyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = Tokenizer::Load(testing::TokenizerPath(), 512);
    ASSERT_TRUE(t.ok()) << t.status();
    tok_ = std::make_unique<Tokenizer>(*std::move(t));
  }
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(PasskeyTest, PromptHoldsTheKeyAtItsDepthAndFillsTheLength) {
  for (double depth : {0.0, 0.5, 1.0}) {
    auto p = BuildPasskeyPrompt(*tok_, "48213", depth, 400);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_LE(p->tokens.size(), 400u);
    EXPECT_GT(p->tokens.size(), 300u);  // one more filler sentence would not fit
    auto more = BuildPasskeyPrompt(*tok_, "48213", depth, static_cast<int32_t>(p->tokens.size()) + 60);
    ASSERT_TRUE(more.ok());
    EXPECT_GT(more->tokens.size(), p->tokens.size());
    EXPECT_EQ(p->tokens[0], 1);  // BOS
    const size_t key = p->text.find("The pass key is 48213.");
    ASSERT_NE(key, std::string::npos);
    const size_t question = p->text.rfind("What is the pass key?");
    ASSERT_NE(question, std::string::npos);
    // Where the key sits in the filler between the instructions and the question.
    const size_t filler = p->text.find('\n') + 1;
    const double where = double(key - filler) / double(question - filler);
    EXPECT_NEAR(where, depth, 0.2) << p->text;
    EXPECT_EQ(p->text.substr(p->text.size() - 15), "The pass key is");
  }
  EXPECT_FALSE(BuildPasskeyPrompt(*tok_, "1", 0.5, 10).ok());  // not even one sentence fits
  EXPECT_FALSE(BuildPasskeyPrompt(*tok_, "1", 1.5, 400).ok());
}

TEST_F(PasskeyTest, TheFirstNumberOfTheAnswerMustBeTheKey) {
  EXPECT_TRUE(PasskeyFound(" 48213.", "48213"));
  EXPECT_TRUE(PasskeyFound("48213", "48213"));
  EXPECT_TRUE(PasskeyFound(" is 48213, remember", "48213"));
  EXPECT_FALSE(PasskeyFound(" 482130", "48213"));
  EXPECT_FALSE(PasskeyFound(" 4821", "48213"));
  EXPECT_FALSE(PasskeyFound(" 12345 48213", "48213"));
  EXPECT_FALSE(PasskeyFound(" green", "48213"));
  EXPECT_FALSE(PasskeyFound("", "48213"));
}

TEST_F(PasskeyTest, EveryConfigurationAnswersTheSamePrompts) {
  absl::StatusOr<Model> model = LoadModel(testing::ModelPath());
  ASSERT_TRUE(model.ok());
  PasskeyOptions o;
  o.trials = 3;
  o.prompt_tokens = 300;
  o.configs = {{"full", KvBudget{}}, {"h2o", *KvBudget::Parse("64")}, {"window", *KvBudget::Parse("0.25")}};
  auto r = RunPasskey(*model, *tok_, o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 3u);
  std::set<std::string> distinct;
  for (const PasskeyResult& x : *r) {
    EXPECT_EQ(x.trials, 3);
    EXPECT_EQ(x.keys, (*r)[0].keys);
    EXPECT_LE(x.prompt_tokens, 300);
    EXPECT_EQ(x.answers.size(), 3u);
    int correct = 0;
    for (size_t i = 0; i < x.keys.size(); ++i) {
      EXPECT_EQ(x.keys[i].size(), 5u);
      correct += PasskeyFound(x.answers[i], x.keys[i]);
      distinct.insert(x.keys[i]);
    }
    EXPECT_EQ(x.correct, correct);
    EXPECT_DOUBLE_EQ(x.accuracy, correct / 3.0);
  }
  EXPECT_EQ(distinct.size(), 3u);
  EXPECT_EQ((*r)[1].budget_tokens, 64);
  // The same seed gives the same keys; too long a prompt is refused.
  auto again = RunPasskey(*model, *tok_, o);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)[0].keys, (*r)[0].keys);
  EXPECT_EQ((*again)[1].answers, (*r)[1].answers);
  o.prompt_tokens = 600;
  EXPECT_EQ(RunPasskey(*model, *tok_, o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(PasskeyTest, EvalTaskPasskeyPrintsJsonLines) {
  const std::string out = testing::RunCapture(
      std::string(HEAVYKV_BINARY) + " eval --task passkey --model " + testing::ModelPath() +
      " --tokenizer " + testing::TokenizerPath() + " --policy full,h2o --kv-budget 0.5 " +
      "--trials 2 --threads 1 --json 2>/dev/null");
  std::vector<nlohmann::json> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 2u) << out;
  EXPECT_EQ(lines[0]["task"], "passkey");
  EXPECT_EQ(lines[0]["policy"], "full");
  EXPECT_EQ(lines[1]["policy"], "h2o");
  EXPECT_EQ(lines[1]["trials"], 2);
  EXPECT_EQ(lines[1]["keys"].size(), 2u);
  EXPECT_LE(lines[1]["prompt_tokens"].get<int>(), 512 - 8);
  int code = 0;
  testing::RunCapture(std::string(HEAVYKV_BINARY) + " eval --task passkey --model " +
                          testing::ModelPath() + " 2>&1", &code);
  EXPECT_NE(code, 0);  // no tokenizer
}

}  // namespace
}  // namespace heavykv
