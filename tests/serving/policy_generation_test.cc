// Every eviction policy, end to end on the bundled model (models/stories260K): a generation with a
// budget evicts and stays within the budget's pages, a long prompt (prefill chunks above the
// budget, where snapkv makes its selection) too, `eval` takes every policy spec, and the CLI's
// `run --policy` and `eval --policy` accept them.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "engine/eval/evaluator.h"
#include "engine/serving/generator.h"
#include "engine/tokenizer/tokenizer.h"
#include "kernels/cpu/gemm.h"
#include "tests/test_util.h"

namespace heavykv {
namespace {

const char* const kSpecs[] = {"window", "sink",  "h2o",    "tova",
                              "scissorhands", "scissorhands:history=20", "knorm",
                              "snapkv", "snapkv:window=8:kernel=3:decode=window",
                              // page granularity: whole pages evicted once a page over budget
                              "window:granularity=page", "sink:granularity=page",
                              "h2o:granularity=page", "tova:granularity=page",
                              "knorm:granularity=page", "snapkv:granularity=page"};

// Tokens a head keeps after `positions` tokens under a budget (all heads evict in step): the
// budget, plus at page granularity the part of a page left over after whole pages went.
int64_t Kept(const EvictionPolicy& policy, int64_t positions, int64_t budget, int64_t block) {
  if (positions <= budget) return positions;
  return policy.page_granularity() ? budget + (positions - budget) % block : budget;
}

// Positions the model ran: every token, except the last sampled one when the length ran out.
int64_t Positions(const GenerateResult& r) {
  return static_cast<int64_t>(r.tokens.size()) - (r.finish_reason == "length" ? 1 : 0);
}

class PolicyGenerationTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    cpu::SetNumThreads(1);
    model_ = std::make_unique<Model>(*LoadModel(testing::ModelPath()));
    tok_ = std::make_unique<Tokenizer>(*Tokenizer::Load(testing::TokenizerPath(), 512));
    cache_ = *KvCache::Create(KvShapeFor(model_->config, 16), 64 * model_->config.num_layers);
    runner_ = std::make_unique<ModelRunner>(*model_, cache_.get());
  }
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tok_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<ModelRunner> runner_;
};

TEST_P(PolicyGenerationTest, DecodeWithABudgetFreesPages) {
  auto policy = MakePolicy(GetParam());
  ASSERT_TRUE(policy.ok()) << policy.status();
  GenerateOptions opt;
  opt.steps = 256;
  opt.sampling.temperature = 0;
  opt.policy = policy->get();
  opt.budget = 64;
  absl::StatusOr<GenerateResult> r =
      Generate(*runner_, tok_->Encode("", true, false), opt, [](int32_t, int32_t) {});
  ASSERT_TRUE(r.ok()) << r.status();
  // Up to 256 positions ran (fewer if the model ended the story), 64 kept by every head; a
  // decode step holds one token over the budget before evicting: ceil(65 / 16) = 5 pages.
  const int64_t positions = Positions(*r);
  ASSERT_GT(positions, 80) << r->finish_reason;
  EXPECT_EQ(r->tokens_evicted, positions - Kept(**policy, positions, 64, 16));
  // At page granularity a head grows to 79 between steps, 80 in one: ceil(80 / 16) = 5 pages too.
  EXPECT_EQ(r->peak_pages, 5 * model_->config.num_layers);  // pages of one layer each
  EXPECT_EQ(cache_->allocator().num_pages_used(), 0);
}

TEST_P(PolicyGenerationTest, LongPromptInChunksAboveTheBudget) {
  auto policy = MakePolicy(GetParam());
  ASSERT_TRUE(policy.ok()) << policy.status();
  std::ifstream in(testing::SourcePath("tests/data/eval_stories.txt"));
  std::stringstream ss;
  ss << in.rdbuf();
  std::vector<int32_t> prompt = tok_->Encode(ss.str(), true, false);
  prompt.resize(200);
  GenerateOptions opt;
  opt.steps = 240;
  opt.sampling.temperature = 0;
  opt.policy = policy->get();
  opt.budget = 48;
  opt.prefill_chunk = 64;  // chunks of 64 over a budget of 48: the chunk's own tokens get evicted
  absl::StatusOr<GenerateResult> r = Generate(*runner_, prompt, opt, [](int32_t, int32_t) {});
  ASSERT_TRUE(r.ok()) << r.status();
  const int64_t positions = Positions(*r);
  EXPECT_GE(positions, 200);
  EXPECT_EQ(r->tokens_evicted, positions - Kept(**policy, positions, 48, 16));
  // The most a step holds: the 48 kept plus a chunk of 64 in flight, ceil(112 / 16) = 7 pages;
  // at page granularity up to 15 more kept: ceil(127 / 16) = 8.
  EXPECT_LE(r->peak_pages, ((*policy)->page_granularity() ? 8 : 7) * model_->config.num_layers);
  EXPECT_EQ(cache_->allocator().num_pages_used(), 0);
}

INSTANTIATE_TEST_SUITE_P(Policies, PolicyGenerationTest, ::testing::ValuesIn(kSpecs));

TEST(PolicyEvalTest, EvalTakesEveryPolicy) {
  cpu::SetNumThreads(1);
  const Model model = *LoadModel(testing::ModelPath());
  const Tokenizer tok = *Tokenizer::Load(testing::TokenizerPath(), 512);
  std::ifstream in(testing::SourcePath("tests/data/eval_stories.txt"));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::vector<int32_t> stream = BuildEvalStream(tok, ss.str());
  EvalOptions opt;
  opt.window = 256;
  opt.max_windows = 1;
  opt.configs.push_back({"full", KvBudget{}});
  for (const char* spec : kSpecs) opt.configs.push_back({spec, *KvBudget::Parse("0.25")});
  absl::StatusOr<std::vector<EvalResult>> res = Evaluate(model, stream, opt);
  ASSERT_TRUE(res.ok()) << res.status();
  ASSERT_EQ(res->size(), opt.configs.size());
  const double full = (*res)[0].ppl;
  for (size_t i = 1; i < res->size(); ++i) {
    const EvalResult& r = (*res)[i];
    SCOPED_TRACE(r.ToString());
    EXPECT_EQ(r.policy, kSpecs[i - 1]);
    EXPECT_EQ(r.budget_tokens, 64);
    EXPECT_TRUE(std::isfinite(r.ppl));
    // Each evicted (64 of 256 kept), which moves the perplexity off the full cache's.
    EXPECT_NE(r.ppl, full);
    EXPECT_GT(r.ppl, 1.0);
  }
  opt.configs = {{"snapkv:kernel=2", KvBudget{}}};
  EXPECT_EQ(Evaluate(model, stream, opt).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PolicyCliTest, RunAndEvalAcceptPolicySpecs) {
  const std::string bin = HEAVYKV_BINARY;
  const std::string model = " --model " + testing::ModelPath() + " --tokenizer " +
                            testing::TokenizerPath();
  int code = -1;
  // `heavykv run` on the bundled model with `args`, stderr included.
  auto run = [&](const std::string& args) {
    return testing::RunCapture(bin + " run" + model + " " + args + " 2>&1", &code);
  };
  std::string out =
      run("--steps 64 --temperature 0 --kv-budget 24 --policy snapkv:window=8:kernel=3");
  EXPECT_EQ(code, 0) << out;
  out = run("--steps 64 --policy snapkv:kernel=2");
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("odd"), std::string::npos) << out;
  // eval over one 128-token window at budget 32 with `args` (--policy ... and more).
  auto eval = [&](const std::string& args) {
    return testing::RunCapture(bin + " eval" + model + " --text " +
                                   testing::SourcePath("tests/data/eval_stories.txt") +
                                   " --window 128 --max-windows 1 --kv-budget 32 " + args +
                                   " 2>&1",
                               &code);
  };
  out = eval("--policy full,tova,knorm,scissorhands:history=50,snapkv:window=4");
  EXPECT_EQ(code, 0) << out;
  for (const char* name : {"tova", "knorm", "scissorhands:history=50", "snapkv:window=4"}) {
    EXPECT_NE(out.find(name), std::string::npos) << name << " missing in:\n" << out;
  }
  // --evict-granularity page applies to the specs naming no granularity, and the table says so.
  out = eval("--policy full,h2o,tova:granularity=token --evict-granularity page");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("h2o:granularity=page"), std::string::npos) << out;
  EXPECT_NE(out.find("tova:granularity=token"), std::string::npos) << out;
  EXPECT_EQ(out.find("full:granularity"), std::string::npos) << out;
  out = run("--steps 80 --temperature 0 --kv-budget 24 --policy h2o --evict-granularity page "
            "--json");
  EXPECT_EQ(code, 0) << out;
  out = run("--steps 8 --evict-granularity block");
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("token or page"), std::string::npos) << out;
}

}  // namespace
}  // namespace heavykv
