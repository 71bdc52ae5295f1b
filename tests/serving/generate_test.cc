// End-to-end generation on the bundled model: greedy output byte-exact with llama2.c, seeds,
// prompt echo, and the KV budget bounding the pages a sequence holds.
#include "engine/serving/generator.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "engine/tokenizer/tokenizer.h"
#include "kernels/cpu/gemm.h"
#include "tests/test_util.h"

namespace heavykv {
namespace {

using testing::ReadFile;
using testing::RunCapture;


class GenerateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cpu::SetNumThreads(1);
    absl::StatusOr<Model> m = LoadModel(testing::ModelPath());
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::make_unique<Model>(*std::move(m));
    absl::StatusOr<Tokenizer> t = Tokenizer::Load(testing::TokenizerPath(), 512);
    ASSERT_TRUE(t.ok()) << t.status();
    tok_ = std::make_unique<Tokenizer>(*std::move(t));
    auto cache = KvCache::Create(KvShapeFor(model_->config, 16), 64 * model_->config.num_layers);
    ASSERT_TRUE(cache.ok());
    cache_ = *std::move(cache);
    runner_ = std::make_unique<ModelRunner>(*model_, cache_.get());
  }

  // Generates from `prompt` and returns what `heavykv run` would print (without the final \n).
  std::string Text(const std::string& prompt, const GenerateOptions& opt,
                   GenerateResult* result = nullptr) {
    std::string text;
    auto on_token = [&](int32_t prev, int32_t tok) {
      std::string piece = tok_->Decode(prev, tok);
      if (Tokenizer::IsPrintablePiece(piece)) text += piece;
    };
    absl::StatusOr<GenerateResult> r =
        Generate(*runner_, tok_->Encode(prompt, true, false), opt, on_token);
    EXPECT_TRUE(r.ok()) << r.status();
    if (result != nullptr && r.ok()) *result = *r;
    return text;
  }

  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tok_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<ModelRunner> runner_;
};

TEST_F(GenerateTest, GreedyMatchesLlama2cByteForByte) {
  GenerateOptions opt;
  opt.steps = 256;
  opt.sampling.temperature = 0;
  std::string expected = ReadFile(testing::SourcePath("tests/data/stories260K.greedy.txt"));
  EXPECT_EQ(Text("", opt) + "\n", expected);
  EXPECT_EQ(cache_->allocator().num_pages_used(), 0);  // pages returned at the end
}

TEST_F(GenerateTest, CliRunPrintsReferenceGreedyText) {
  int rc = 0;
  std::string out = RunCapture(std::string(HEAVYKV_BINARY) + " run --model " +
                                   testing::ModelPath() + " --tokenizer " +
                                   testing::TokenizerPath() +
                                   " --temperature 0 --steps 256 --threads 1 2>/dev/null",
                               &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(out, ReadFile(testing::SourcePath("tests/data/stories260K.greedy.txt")));
}

TEST_F(GenerateTest, CliRejectsBadFlagsWithClearErrors) {
  int rc = 0;
  std::string base = std::string(HEAVYKV_BINARY) + " run --model " + testing::ModelPath();
  std::string err = RunCapture(base + " --policy lru 2>&1", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(err.find("unknown KV policy"), std::string::npos) << err;
  err = RunCapture(base + " --bogus 1 2>&1", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(err.find("unknown flag --bogus"), std::string::npos) << err;
  err = RunCapture(base + " --prompt 1,9999 2>&1", &rc);  // ids without a tokenizer
  EXPECT_NE(rc, 0);
  EXPECT_NE(err.find("outside the vocabulary"), std::string::npos) << err;
}

TEST_F(GenerateTest, PromptIsEchoedAndContinued) {
  GenerateOptions opt;
  opt.steps = 64;
  opt.sampling.temperature = 0;
  std::string text = Text("Once upon a time, Tom", opt);
  EXPECT_EQ(text.rfind("Once upon a time, Tom", 0), 0u) << text;
  EXPECT_GT(text.size(), std::string("Once upon a time, Tom").size() + 20);
}

TEST_F(GenerateTest, SameSeedSameTextOtherSeedOtherText) {
  GenerateOptions opt;
  opt.steps = 128;
  opt.sampling.temperature = 1.0f;
  opt.sampling.top_p = 0.9f;
  opt.sampling.seed = 1234;
  std::string a = Text("", opt), b = Text("", opt);
  opt.sampling.seed = 99;
  std::string c = Text("", opt);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST_F(GenerateTest, H2oBudgetBoundsPagesAndCountsEvictions) {
  auto policy = MakePolicy("h2o");
  ASSERT_TRUE(policy.ok());
  GenerateOptions opt;
  opt.steps = 256;
  opt.sampling.temperature = 0;
  opt.policy = policy->get();
  opt.budget = 64;
  GenerateResult r;
  std::string text = Text("", opt, &r);
  ASSERT_EQ(r.finish_reason, "length") << text;
  // 256 positions ran, 64 kept: every head dropped 192 tokens. A decode step holds one token
  // over the budget before evicting, hence the extra page: ceil(65 / 16) = 5.
  EXPECT_EQ(r.tokens_evicted, 256 - 64);
  EXPECT_EQ(r.peak_pages, 5 * model_->config.num_layers);  // per layer
  EXPECT_EQ(cache_->allocator().num_pages_used(), 0);
}

// The sampling API's flags on `heavykv run` (sampling_flags.h): set, checked as the engine checks
// a request, and malformed ones refused.
TEST_F(GenerateTest, CliRunTakesTheSamplingApiFlags) {
  int rc = 0;
  const std::string base = std::string(HEAVYKV_BINARY) + " run --model " + testing::ModelPath() +
                           " --prompt 1 --temperature 0 --steps 6 --threads 1";
  // +100 forces token 300 at every step; the ids are printed as the prompt was given.
  std::string out = RunCapture(base + " --logit-bias 300=100 2>/dev/null", &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_NE(out.find("300 300 300 300 300"), std::string::npos) << out;
  // A penalty changes the greedy text, as through Generate.
  const std::string plain = RunCapture(base + " --steps 40 2>/dev/null", &rc);
  out = RunCapture(base + " --steps 40 --repetition-penalty 2 --presence-penalty 1 2>/dev/null",
                   &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_NE(out, plain);
  std::string err = RunCapture(base + " --repetition-penalty 0 2>&1", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(err.find("repetition_penalty must be in (0, 10]"), std::string::npos) << err;
  err = RunCapture(base + " --logit-bias 3:1 2>&1", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(err.find("--logit-bias wants ID=BIAS"), std::string::npos) << err;
  err = RunCapture(base + " --logit-bias 600=1 2>&1", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(err.find("outside the vocabulary"), std::string::npos) << err;
}

// min_tokens in the one-sequence loop: the end-of-generation tokens are banned until reached.
TEST_F(GenerateTest, MinTokensHoldsBackTheEnd) {
  GenerateOptions opt;
  opt.steps = 64;
  opt.sampling.temperature = 0;
  opt.tokenizer = tok_.get();
  opt.sampling.logit_bias = {{tok_->eos_id(), 100.0f}};  // EOS at once
  GenerateResult r;
  Text("Once upon a time", opt, &r);
  EXPECT_EQ(r.finish_reason, "eos");
  EXPECT_EQ(r.tokens.size(), size_t(r.num_prompt_tokens));
  opt.sampling.min_tokens = 5;
  opt.sampling.banned_until_min = {tok_->bos_id(), tok_->eos_id()};
  Text("Once upon a time", opt, &r);
  EXPECT_EQ(r.finish_reason, "eos");
  EXPECT_EQ(r.tokens.size(), size_t(r.num_prompt_tokens) + 5);
}

}  // namespace
}  // namespace heavykv
