// Prompt logprobs (GenerationRequest::prompt_logprobs; docs/ARCHITECTURE.md "Prompt logprobs and
// echo"): the engine's scores of a prompt equal what `heavykv eval` (Evaluate) computes for the
// same tokens, whether the prompt runs as one chunk or several, with or without a cached prefix;
// max_new_tokens 0 scores a prompt without generating; PromptScorer records each position once.
#include "engine/serving/prompt_scoring.h"

#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <sstream>

#include "engine/eval/evaluator.h"
#include "engine/model/make_model.h"
#include "engine/serving/engine.h"
#include "engine/serving/request_field.h"
#include "engine/serving/request_validation.h"
#include "engine/tokenizer/tokenizer.h"
#include "kernels/cpu/gemm.h"
#include "tests/test_util.h"

namespace heavykv {
namespace {

constexpr int32_t kLayers = 5;  // the bundled model's: a CPU page holds one layer

// One request's deltas, until the finished one.
struct Deltas {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<GenerationDelta> all;
  bool finished = false;

  std::function<void(const GenerationDelta&)> Callback() {
    return [this](const GenerationDelta& d) {
      std::lock_guard<std::mutex> lock(mu);
      all.push_back(d);
      finished |= d.finished;
      cv.notify_all();
    };
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return finished; }));
  }
};

// exp(mean NLL) of a prompt's scores (the first, NaN, left out): eval's perplexity.
double Perplexity(const PromptLogprobs& p) {
  double nll = 0;
  for (size_t i = 1; i < p.logprobs.size(); ++i) nll -= p.logprobs[i];
  return std::exp(nll / double(p.logprobs.size() - 1));
}

class PromptLogprobsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cpu::SetNumThreads(1);
    model_ = std::make_unique<Model>(*LoadModel(testing::ModelPath()));
    tok_ = std::make_shared<Tokenizer>(*Tokenizer::Load(testing::TokenizerPath(), 512));
    stream_ = BuildEvalStream(*tok_, testing::ReadFile(
                                         testing::SourcePath("tests/data/eval_stories.txt")));
  }
  std::unique_ptr<Engine> Make(int32_t max_step_tokens = 512, bool prefix_cache = true,
                               int32_t pages = 64, double overcommit = 1.0) {
    EngineOptions o;
    o.full_overcommit = overcommit;
    o.num_pages = pages * kLayers;
    o.max_step_tokens = max_step_tokens;
    o.prefix_cache = prefix_cache;
    o.threads = 1;
    auto e = Engine::Create(*LoadModel(testing::ModelPath()), tok_, o);
    EXPECT_TRUE(e.ok()) << e.status();
    return *std::move(e);
  }
  // The scores of the first `n` stream tokens as a prompt (max_new_tokens 0), and its deltas.
  std::shared_ptr<const PromptLogprobs> Score(Engine& engine, int32_t n, int32_t top = 0,
                                              std::optional<std::string> policy = {},
                                              int32_t budget = 0, Deltas* out = nullptr) {
    GenerationRequest r;
    r.prompt_token_ids.assign(stream_.begin(), stream_.begin() + n);
    r.max_new_tokens = 0;
    r.prompt_logprobs = top;
    r.policy = std::move(policy);
    if (budget > 0) r.budget_tokens = budget;
    Deltas local;
    Deltas& d = out != nullptr ? *out : local;
    absl::StatusOr<std::shared_ptr<RequestHandle>> h = engine.Submit(r, d.Callback());
    EXPECT_TRUE(h.ok()) << h.status();
    if (!h.ok()) return nullptr;
    d.Wait();
    EXPECT_NE(d.all.front().prompt, nullptr);
    return d.all.front().prompt;
  }
  // Evaluate's perplexity of the first window of `w` stream tokens, `prefill` of them as one
  // chunk.
  double EvalPerplexity(int32_t w, int32_t prefill, const std::string& policy = "full",
                        int32_t budget = 1) {
    EvalOptions opt;
    opt.window = w;
    opt.max_windows = 1;
    opt.prefill = prefill;
    opt.configs.push_back({policy, *KvBudget::Parse(std::to_string(budget))});
    absl::StatusOr<std::vector<EvalResult>> res = Evaluate(*model_, stream_, opt);
    EXPECT_TRUE(res.ok()) << res.status();
    return res.ok() ? res->front().ppl : 0;
  }

  std::unique_ptr<Model> model_;
  std::shared_ptr<Tokenizer> tok_;
  std::vector<int32_t> stream_;
};

TEST_F(PromptLogprobsTest, OneChunkEqualsEvaluate) {
  auto engine = Make();
  Deltas d;
  auto p = Score(*engine, 200, 0, {}, 0, &d);
  ASSERT_NE(p, nullptr);
  ASSERT_EQ(p->logprobs.size(), 200u);
  EXPECT_TRUE(std::isnan(p->logprobs[0]));
  EXPECT_EQ(p->ranks[0], 0);
  for (size_t i = 1; i < 200; ++i) {
    EXPECT_LE(p->logprobs[i], 0.0f);
    EXPECT_GE(p->ranks[i], 1);
  }
  // The same 199 predictions, the prompt as one chunk in both.
  const double eval = EvalPerplexity(200, 199);
  EXPECT_NEAR(Perplexity(*p), eval, 1e-5 * eval);
  // One token per step (eval's default) gives the full cache's same figures.
  EXPECT_NEAR(Perplexity(*p), EvalPerplexity(200, 0), 1e-4 * eval);
  // Scoring alone: one delta, which ends the request after its prompt.
  ASSERT_EQ(d.all.size(), 1u);
  EXPECT_TRUE(d.all[0].finished);
  EXPECT_TRUE(d.all[0].choice_finished);
  EXPECT_EQ(d.all[0].finish_reason, "length");
  EXPECT_EQ(d.all[0].usage.completion_tokens, 0);
  EXPECT_EQ(d.all[0].usage.prompt_tokens, 200);
  EXPECT_TRUE(d.all[0].token_ids.empty());
  EXPECT_EQ(engine->Stats().pages_used, 0);
}

TEST_F(PromptLogprobsTest, SeveralChunksEqualOneChunk) {
  auto one = Make();
  auto many = Make(/*max_step_tokens=*/48);  // chunks of 48 tokens
  auto a = Score(*one, 300, 3), b = Score(*many, 300, 3);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_EQ(b->logprobs.size(), 300u);
  for (size_t i = 1; i < 300; ++i) {
    EXPECT_NEAR(a->logprobs[i], b->logprobs[i], 1e-4) << i;
    ASSERT_EQ(b->top[i].size(), 3u);
    EXPECT_EQ(a->top[i][0].token, b->top[i][0].token) << i;
  }
  EXPECT_NEAR(Perplexity(*b), EvalPerplexity(300, 0), 1e-4 * Perplexity(*b));
}

TEST_F(PromptLogprobsTest, TopTokensAndRanksAgree) {
  auto engine = Make();
  auto p = Score(*engine, 64, 5);
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(p->top[0].empty());
  for (size_t i = 1; i < 64; ++i) {
    ASSERT_EQ(p->top[i].size(), 5u);
    for (size_t k = 1; k < 5; ++k) EXPECT_GE(p->top[i][k - 1].logprob, p->top[i][k].logprob);
    // The prompt token's rank places it among the top tokens where it is one of them.
    for (size_t k = 0; k < 5; ++k) {
      if (p->top[i][k].token == p->token_ids[i]) {
        EXPECT_EQ(p->ranks[i], int32_t(k) + 1) << i;
        EXPECT_FLOAT_EQ(p->top[i][k].logprob, p->logprobs[i]);
      }
    }
    if (p->ranks[i] > 5) {
      EXPECT_LT(p->logprobs[i], p->top[i][4].logprob);
    }
    EXPECT_EQ(p->token_bytes[i], tok_->Decode(p->token_ids[i - 1], p->token_ids[i]));
  }
}

TEST_F(PromptLogprobsTest, EvictingPolicyInOneChunkEqualsEvaluate) {
  // A prompt chunk attends whole before its eviction, in the engine as in eval's prefill; the
  // engine splits longer prompts into chunks (256 tokens) that eval has no equivalent of.
  auto engine = Make();
  auto p = Score(*engine, 128, 0, "h2o", 32);
  ASSERT_NE(p, nullptr);
  const double eval = EvalPerplexity(128, 127, "h2o", 32);
  EXPECT_NEAR(Perplexity(*p), eval, 1e-5 * eval);
}

TEST_F(PromptLogprobsTest, TakesNoCachedPrefixAndGenerationFollows) {
  auto engine = Make();
  GenerationRequest r;
  r.prompt_token_ids.assign(stream_.begin(), stream_.begin() + 100);
  r.max_new_tokens = 4;
  r.temperature = 0.0f;
  Deltas warm;  // caches the prompt's blocks
  ASSERT_TRUE(engine->Submit(r, warm.Callback()).ok());
  warm.Wait();
  r.prompt_logprobs = 1;
  Deltas d;
  ASSERT_TRUE(engine->Submit(r, d.Callback()).ok());
  d.Wait();
  EXPECT_EQ(d.all.back().usage.cached_tokens, 0);
  ASSERT_NE(d.all.front().prompt, nullptr);
  EXPECT_EQ(d.all.front().token_ids.size(), 1u);  // with the first token
  for (size_t i = 1; i < d.all.size(); ++i) EXPECT_EQ(d.all[i].prompt, nullptr);
  std::vector<int32_t> a, b;
  for (const auto& x : warm.all) a.insert(a.end(), x.token_ids.begin(), x.token_ids.end());
  for (const auto& x : d.all) b.insert(b.end(), x.token_ids.begin(), x.token_ids.end());
  EXPECT_EQ(a, b);  // the row that samples is the chunk's last, as without scoring
  EXPECT_EQ(d.all.back().finish_reason, "length");
  EXPECT_NEAR(Perplexity(*d.all.front().prompt), EvalPerplexity(100, 99), 1e-4);
}

TEST_F(PromptLogprobsTest, OneTokenPromptHasOnlyTheNullEntry) {
  auto engine = Make();
  auto p = Score(*engine, 1, 2);
  ASSERT_NE(p, nullptr);
  ASSERT_EQ(p->logprobs.size(), 1u);
  EXPECT_TRUE(std::isnan(p->logprobs[0]));
  EXPECT_TRUE(p->top[0].empty());
}

TEST_F(PromptLogprobsTest, RefusesOutOfRangeAndZeroTokensWithoutIt) {
  auto engine = Make();
  GenerationRequest r;
  r.prompt_token_ids = {1, 2, 3};
  r.max_new_tokens = 0;
  absl::StatusOr<std::shared_ptr<RequestHandle>> h = engine->Submit(r, [](const auto&) {});
  ASSERT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(h.status().message().find("prompt_logprobs"), std::string::npos) << h.status();
  EXPECT_EQ(RequestFieldOf(h.status()), "max_new_tokens");
  r.max_new_tokens = 1;
  r.prompt_logprobs = kMaxTopLogprobs + 1;
  h = engine->Submit(r, [](const auto&) {});
  ASSERT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RequestFieldOf(h.status()), "prompt_logprobs");
  r.prompt_logprobs = -2;
  EXPECT_FALSE(engine->Submit(r, [](const auto&) {}).ok());
}

TEST_F(PromptLogprobsTest, PreemptedRequestsSendTheirScoresOnce) {
  // 16 pages = 256 slots; each request grows to 60 + 120 tokens = 12 pages: two cannot coexist,
  // but an overcommitting server admits them on their first chunk and preempts.
  auto engine = Make(512, true, 16, /*overcommit=*/4.0);
  auto calm = Make();
  std::vector<std::unique_ptr<Deltas>> ds;
  for (int i = 0; i < 3; ++i) {
    GenerationRequest r;
    r.prompt_token_ids.assign(stream_.begin() + 60 * i, stream_.begin() + 60 * (i + 1));
    r.max_new_tokens = 120;
    r.temperature = 0.0f;
    r.ignore_eos = true;
    r.prompt_logprobs = 0;
    ds.push_back(std::make_unique<Deltas>());
    ASSERT_TRUE(engine->Submit(r, ds.back()->Callback()).ok());
  }
  for (int i = 0; i < 3; ++i) {
    ds[size_t(i)]->Wait();
    int with_prompt = 0;
    for (const GenerationDelta& d : ds[size_t(i)]->all) with_prompt += d.prompt != nullptr;
    EXPECT_EQ(with_prompt, 1) << i;
    ASSERT_NE(ds[size_t(i)]->all.front().prompt, nullptr);
    const PromptLogprobs& got = *ds[size_t(i)]->all.front().prompt;
    std::vector<int32_t> ids(stream_.begin() + 60 * i, stream_.begin() + 60 * (i + 1));
    GenerationRequest r;
    r.prompt_token_ids = ids;
    r.max_new_tokens = 0;
    r.prompt_logprobs = 0;
    Deltas alone;
    ASSERT_TRUE(calm->Submit(r, alone.Callback()).ok());
    alone.Wait();
    for (size_t t = 1; t < 60; ++t) {
      EXPECT_NEAR(got.logprobs[t], alone.all.front().prompt->logprobs[t], 1e-5) << i << " " << t;
    }
  }
  EXPECT_GT(engine->Stats().preemptions, 0);
  EXPECT_EQ(engine->Stats().pages_used, 0);
}

TEST(PromptLogprobsGgufTest, QwenGgufPromptEqualsEvaluate) {
  // A random qwen3 GGUF (make-model's), token ids only: another architecture and file format.
  testing::TempDir dir;
  const std::string path = dir.File("q.gguf");
  int code = 0;
  testing::RunCapture(std::string(HEAVYKV_BINARY) +
                          " make-model --format gguf --shape stories260K --arch qwen3 --out " +
                          path + " 2>&1",
                      &code);
  ASSERT_EQ(code, 0);
  absl::StatusOr<Model> model = LoadModel(path);
  ASSERT_TRUE(model.ok()) << model.status();
  cpu::SetNumThreads(1);
  std::vector<int32_t> ids = {1};
  for (int32_t i = 1; i < 120; ++i) ids.push_back(3 + (i * 37) % (model->config.vocab_size - 3));
  for (const std::string policy : {"full", "h2o"}) {
    EngineOptions o;
    o.num_pages = 64 * model->config.num_layers;
    o.threads = 1;
    auto engine = Engine::Create(*LoadModel(path), nullptr, o);
    ASSERT_TRUE(engine.ok()) << engine.status();
    GenerationRequest r;
    r.prompt_token_ids = ids;
    r.max_new_tokens = 0;
    r.prompt_logprobs = 0;
    r.policy = policy;
    if (policy == "h2o") r.budget_tokens = 24;
    Deltas d;
    ASSERT_TRUE((*engine)->Submit(r, d.Callback()).ok());
    d.Wait();
    ASSERT_NE(d.all.front().prompt, nullptr);
    EXPECT_TRUE(d.all.front().prompt->token_bytes[1].empty());  // no tokenizer: no bytes
    EvalOptions opt;
    opt.window = 120;
    opt.max_windows = 1;
    opt.prefill = 119;
    opt.configs.push_back({policy, *KvBudget::Parse(policy == "h2o" ? "24" : "1")});
    absl::StatusOr<std::vector<EvalResult>> res = Evaluate(*model, ids, opt);
    ASSERT_TRUE(res.ok()) << res.status();
    EXPECT_NEAR(Perplexity(*d.all.front().prompt), res->front().ppl, 1e-5 * res->front().ppl)
        << policy;
  }
}

TEST(PromptScorerTest, RecordsEachPositionOnce) {
  // Vocabulary of 3; row t's largest logit is token (t + 1) % 3.
  const std::vector<int32_t> prompt = {0, 1, 2, 0};
  auto rows = [](int32_t start, int32_t count) {
    std::vector<float> r;
    for (int32_t t = start; t < start + count; ++t) {
      for (int32_t v = 0; v < 3; ++v) r.push_back(v == (t + 1) % 3 ? 2.0f : 0.0f);
    }
    return r;
  };
  PromptScorer s(prompt, 1, nullptr);
  EXPECT_TRUE(s.NeedsRows(0, 2));
  std::vector<float> a = rows(0, 2);
  s.Score(0, 2, a, 3);
  EXPECT_FALSE(s.NeedsRows(0, 2));  // a recompute of the same chunk adds nothing
  EXPECT_TRUE(s.NeedsRows(0, 3));
  // A recompute's rows for positions scored already are not read; position 2's row has
  // token 0 most likely.
  std::vector<float> bad = {5, 5, 5, 5, 5, 5, 2, 0, 0};
  s.Score(0, 3, bad, 3);
  EXPECT_TRUE(s.complete());  // the last token's row predicts nothing
  EXPECT_FALSE(s.NeedsRows(3, 1));
  std::shared_ptr<const PromptLogprobs> p = s.Take();
  const float top = float(2.0 - std::log(std::exp(2.0) + 2.0));
  EXPECT_TRUE(std::isnan(p->logprobs[0]));
  EXPECT_FLOAT_EQ(p->logprobs[1], top);
  EXPECT_FLOAT_EQ(p->logprobs[2], top);
  EXPECT_FLOAT_EQ(p->logprobs[3], top);  // from `bad`'s row 2, where 0 is most likely
  EXPECT_EQ(p->ranks[3], 1);
  EXPECT_EQ(p->top[1][0].token, 1);
  EXPECT_FLOAT_EQ(p->top[1][0].logprob, top);
}

}  // namespace
}  // namespace heavykv
