// heavykv eval against an independent implementation of the same semantics: on
// eval_stories.txt with W=512 and 4 windows its perplexities must agree within 0.5%.
#include "engine/eval/evaluator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "engine/runner/model_runner.h"
#include "engine/tokenizer/tokenizer.h"
#include "kernels/cpu/gemm.h"
#include "tests/test_util.h"

namespace heavykv {
namespace {

class EvalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cpu::SetNumThreads(1);
    model_ = std::make_unique<Model>(*LoadModel(testing::ModelPath()));
    tok_ = std::make_unique<Tokenizer>(*Tokenizer::Load(testing::TokenizerPath(), 512));
    std::ifstream in(testing::SourcePath("tests/data/eval_stories.txt"));
    std::stringstream ss;
    ss << in.rdbuf();
    stream_ = BuildEvalStream(*tok_, ss.str());
  }
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tok_;
  std::vector<int32_t> stream_;
};

TEST_F(EvalTest, StreamIsStoriesEachStartingWithBos) {
  EXPECT_EQ(std::count(stream_.begin(), stream_.end(), kBosId), 60);  // 60 stories in the file
  EXPECT_EQ(stream_[0], kBosId);
  EXPECT_GT(stream_.size(), 4u * 512);
}

TEST_F(EvalTest, AgreesWithIndependentImplementation) {
  struct Ref {
    const char* policy;
    int32_t budget;
    double ppl;
  };
  const Ref refs[] = {{"full", 0, 2.8661},    {"window", 102, 2.9029}, {"sink", 102, 2.9213},
                      {"h2o", 102, 2.9323},   {"window", 51, 3.0305},  {"sink", 51, 3.0549},
                      {"h2o", 51, 3.0720},    {"window", 256, 2.8666}, {"sink", 256, 2.8671},
                      {"h2o", 256, 2.8669}};
  EvalOptions opt;
  opt.window = 512;
  opt.max_windows = 4;
  for (const Ref& r : refs) {
    opt.configs.push_back({r.policy, *KvBudget::Parse(std::to_string(r.budget == 0 ? 1 : r.budget))});
  }
  absl::StatusOr<std::vector<EvalResult>> res = Evaluate(*model_, stream_, opt);
  ASSERT_TRUE(res.ok()) << res.status();
  ASSERT_EQ(res->size(), std::size(refs));
  for (size_t i = 0; i < res->size(); ++i) {
    const EvalResult& r = (*res)[i];
    SCOPED_TRACE(r.ToString());
    EXPECT_EQ(r.windows, 4);
    EXPECT_EQ(r.tokens, 4 * 511);
    EXPECT_NEAR(r.ppl, refs[i].ppl, 0.005 * refs[i].ppl);
    EXPECT_GT(r.top1, 0.5);
    EXPECT_LT(r.top1, 0.8);
    if (refs[i].budget > 0) {
      EXPECT_EQ(r.budget_tokens, refs[i].budget);
    }
  }
  // Fractions resolve against the window: 0.2 of 512 is the 102-token budget above.
  opt.configs = {{"h2o", *KvBudget::Parse("0.2")}};
  absl::StatusOr<std::vector<EvalResult>> frac = Evaluate(*model_, stream_, opt);
  ASSERT_TRUE(frac.ok());
  EXPECT_EQ((*frac)[0].budget_tokens, 102);
  EXPECT_NEAR((*frac)[0].ppl, (*res)[3].ppl, 1e-6);  // other batch, other rounding
}

// A bf16 storage option against fp32 on three configurations: each perplexity within the
// reference's 0.5%, and at least one different from fp32's (else the bf16 path never ran).
// `refs`: the independent implementation's perplexities.
void ExpectBf16NearReference(const std::vector<EvalResult>& fp32,
                             const std::vector<EvalResult>& bf16, const std::vector<double>& refs,
                             const char* what) {
  ASSERT_EQ(fp32.size(), refs.size());
  ASSERT_EQ(bf16.size(), refs.size());
  bool differs = false;
  for (size_t i = 0; i < refs.size(); ++i) {
    SCOPED_TRACE(bf16[i].ToString());
    EXPECT_NEAR(bf16[i].ppl, refs[i], 0.005 * refs[i]);
    if (bf16[i].ppl != fp32[i].ppl) differs = true;
  }
  EXPECT_TRUE(differs) << what << " gave exactly the fp32 perplexities";
}

// W = 512, 4 windows, and these (policy, budget) configurations.
EvalOptions FourWindows(std::vector<std::pair<std::string, std::string>> configs) {
  EvalOptions opt;
  opt.window = 512;
  opt.max_windows = 4;
  for (const auto& [policy, budget] : configs) {
    opt.configs.push_back({policy, *KvBudget::Parse(budget)});
  }
  return opt;
}

// bf16 weights (--weight-dtype bf16): every matrix rounded to bf16, fp32 arithmetic.
TEST_F(EvalTest, Bf16WeightsStayWithinToleranceOfTheReference) {
  const Model bf16 = *LoadModel(testing::ModelPath(), cpu::WeightType::kBf16);
  const EvalOptions opt = FourWindows({{"full", "1"}, {"h2o", "102"}, {"sink", "51"}});
  absl::StatusOr<std::vector<EvalResult>> fp32 = Evaluate(*model_, stream_, opt);
  absl::StatusOr<std::vector<EvalResult>> half = Evaluate(bf16, stream_, opt);
  ASSERT_TRUE(fp32.ok() && half.ok()) << fp32.status() << " " << half.status();
  ExpectBf16NearReference(*fp32, *half, {2.8661, 2.9323, 3.0549}, "bf16 weights");
}

// bf16 K/V (--kv-dtype bf16): K and V rounded to bf16, attention in fp32.
TEST_F(EvalTest, Bf16KvStaysWithinToleranceOfTheReference) {
  EvalOptions opt = FourWindows({{"full", "1"}, {"h2o", "102"}, {"h2o", "51"}});
  absl::StatusOr<std::vector<EvalResult>> fp32 = Evaluate(*model_, stream_, opt);
  opt.kv_dtype = KvDtype::kBf16;
  absl::StatusOr<std::vector<EvalResult>> bf16 = Evaluate(*model_, stream_, opt);
  ASSERT_TRUE(fp32.ok() && bf16.ok()) << fp32.status() << " " << bf16.status();
  ExpectBf16NearReference(*fp32, *bf16, {2.8661, 2.9323, 3.0720}, "bf16 K/V");
  // The CUDA backend has no fp32 cache.
  opt.device = Device::kCuda;
  opt.kv_dtype = KvDtype::kFp32;
  EXPECT_EQ(Evaluate(*model_, stream_, opt).status().code(), absl::StatusCode::kInvalidArgument);
}

// int8 K/V (--kv-dtype int8, issue 29): perplexity within 1% of fp32 K/V at the full cache and
// under h2o (measured: +0.3%); int4 costs more (its ratio is reported in docs/BENCHMARKS.md).
TEST_F(EvalTest, Int8KvStaysWithinOnePercentOfFp32) {
  EvalOptions opt = FourWindows({{"full", "1"}, {"h2o", "102"}, {"h2o", "51"}});
  absl::StatusOr<std::vector<EvalResult>> fp32 = Evaluate(*model_, stream_, opt);
  opt.kv_dtype = KvDtype::kInt8;
  absl::StatusOr<std::vector<EvalResult>> int8 = Evaluate(*model_, stream_, opt);
  opt.kv_dtype = KvDtype::kInt4;
  absl::StatusOr<std::vector<EvalResult>> int4 = Evaluate(*model_, stream_, opt);
  ASSERT_TRUE(fp32.ok() && int8.ok() && int4.ok()) << fp32.status() << int8.status();
  for (size_t i = 0; i < fp32->size(); ++i) {
    SCOPED_TRACE((*fp32)[i].ToString());
    EXPECT_NE((*int8)[i].ppl, (*fp32)[i].ppl);  // quantized, not fp32 under another name
    EXPECT_NEAR((*int8)[i].ppl, (*fp32)[i].ppl, 0.01 * (*fp32)[i].ppl) << (*int8)[i].ToString();
    EXPECT_GT((*int4)[i].ppl, (*int8)[i].ppl) << (*int4)[i].ToString();
  }
  opt.device = Device::kCuda;  // the CUDA backend has no quantized cache
  EXPECT_EQ(Evaluate(*model_, stream_, opt).status().code(), absl::StatusCode::kUnimplemented);
}

// MiKV (issue 29's target): h2o at 20% of the window keeping its evicted tokens as int4 (or int8)
// in a demoted store predicts strictly better than h2o at 20% dropping them, and its peak pool
// bytes count the store's pages.
TEST_F(EvalTest, DemotingEvictedTokensBeatsDroppingThem) {
  EvalOptions opt = FourWindows({{"h2o", "102"}, {"h2o:demote=int4", "102"},
                                 {"h2o:demote=int8", "102"},
                                 {"h2o:demote=int4:demote_budget=51", "102"}});
  absl::StatusOr<std::vector<EvalResult>> r = Evaluate(*model_, stream_, opt);
  ASSERT_TRUE(r.ok()) << r.status();
  const EvalResult& h2o = (*r)[0];
  for (size_t i = 1; i < r->size(); ++i) {
    SCOPED_TRACE((*r)[i].ToString());
    EXPECT_LT((*r)[i].ppl, h2o.ppl) << h2o.ToString();
    EXPECT_GT((*r)[i].kv_bytes, h2o.kv_bytes);
  }
  EXPECT_LT((*r)[3].kv_bytes, (*r)[1].kv_bytes);  // a smaller store, fewer pages
}

TEST_F(EvalTest, OneWindowEqualsADirectTeacherForcedLoop) {
  // Evaluate batches every (configuration, window) sequence; a plain single-sequence loop over
  // the first window, scoring each prediction itself, must give the same perplexity.
  EvalOptions opt;
  opt.window = 512;
  opt.max_windows = 1;
  opt.configs = {{"h2o", *KvBudget::Parse("102")}, {"full", KvBudget{}}};
  auto res = Evaluate(*model_, stream_, opt);
  ASSERT_TRUE(res.ok()) << res.status();
  auto h2o = *MakePolicy("h2o");
  for (int which = 0; which < 2; ++which) {
    auto cache = *KvCache::Create(KvShapeFor(model_->config, 16), 64 * model_->config.num_layers);
    ModelRunner runner(*model_, cache.get());
    SequenceKv kv;
    kv.policy = which == 0 ? h2o.get() : nullptr;
    kv.budget = which == 0 ? 102 : kUnboundedBudget;
    double nll = 0;
    for (int32_t pos = 0; pos < 511; ++pos) {
      SequenceStep step{&kv, std::span<const int32_t>(stream_).subspan(pos, 1), pos, false};
      auto logits = runner.Forward({&step, 1});
      ASSERT_TRUE(logits.ok());
      double mx = *std::max_element(logits->begin(), logits->end()), sum = 0;
      for (float v : *logits) sum += std::exp(v - mx);
      nll += std::log(sum) + mx - (*logits)[stream_[pos + 1]];
    }
    EXPECT_EQ((*res)[which].tokens, 511);
    EXPECT_NEAR((*res)[which].ppl, std::exp(nll / 511), 1e-6 * (*res)[which].ppl);
  }
  // Eviction costs quality on this window too, but little at 20%.
  EXPECT_GT((*res)[0].ppl, (*res)[1].ppl);
  EXPECT_LT((*res)[0].ppl, 1.1 * (*res)[1].ppl);
}

TEST_F(EvalTest, RejectsBadOptions) {
  EvalOptions opt;
  opt.window = 513;  // over the context length
  opt.configs = {{"full", KvBudget{}}};
  EXPECT_TRUE(absl::IsInvalidArgument(Evaluate(*model_, stream_, opt).status()));
  opt.window = 512;
  opt.configs = {{"lru", KvBudget{}}};
  EXPECT_TRUE(absl::IsInvalidArgument(Evaluate(*model_, stream_, opt).status()));
  opt.configs = {{"full", KvBudget{}}};
  std::vector<int32_t> short_stream(100, 5);
  EXPECT_TRUE(absl::IsInvalidArgument(Evaluate(*model_, short_stream, opt).status()));
}

// Issue 42: one token per step never runs snapkv's prefill selection, so snapkv's rows were
// h2o's. With --prefill P the first P tokens of each window are one prompt chunk: a chunk over
// the budget evicts by each policy's rule at once (snapkv: its observation window), and the same
// W-1 predictions are scored (the full cache and a chunk within the budget change nothing but
// rounding).
TEST_F(EvalTest, PrefillChunkRunsSnapKvSelection) {
  EvalOptions opt;
  opt.window = 256;
  opt.max_windows = 2;
  for (const char* policy : {"full", "h2o", "snapkv", "window"}) {
    opt.configs.push_back({policy, *KvBudget::Parse("64")});
  }
  absl::StatusOr<std::vector<EvalResult>> step = Evaluate(*model_, stream_, opt);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ((*step)[2].ppl, (*step)[1].ppl);  // snapkv is h2o without a prompt chunk
  opt.prefill = 192;
  absl::StatusOr<std::vector<EvalResult>> chunk = Evaluate(*model_, stream_, opt);
  ASSERT_TRUE(chunk.ok()) << chunk.status();
  for (size_t i = 0; i < chunk->size(); ++i) {
    SCOPED_TRACE((*chunk)[i].ToString());
    EXPECT_EQ((*chunk)[i].tokens, 2 * 255);
    EXPECT_GT((*chunk)[i].ppl, 1.0);
  }
  EXPECT_NEAR((*chunk)[0].ppl, (*step)[0].ppl, 1e-4 * (*step)[0].ppl);  // full
  EXPECT_NE((*chunk)[2].ppl, (*chunk)[1].ppl);  // snapkv's selection is not h2o's
  // The prompt's 192 tokens are held at once: the memory a budget of 64 costs is the chunk's.
  // Pages per table: 12 (192 slots of 16) against 5 at the decode peak (65 slots).
  EXPECT_EQ((*chunk)[1].kv_bytes, (*step)[1].kv_bytes / 5 * 12);
  // The prompt's own predictions see the whole chunk: window loses less than token by token.
  EXPECT_LT((*chunk)[3].ppl, (*step)[3].ppl);
  // A chunk within the budget evicts nothing in it: as token by token (but for snapkv, whose
  // channel then holds only the chunk's last `window` queries).
  opt.prefill = 48;
  absl::StatusOr<std::vector<EvalResult>> small = Evaluate(*model_, stream_, opt);
  ASSERT_TRUE(small.ok()) << small.status();
  for (size_t i : {0, 1, 3}) {
    EXPECT_NEAR((*small)[i].ppl, (*step)[i].ppl, 1e-4 * (*step)[i].ppl) << (*small)[i].ToString();
  }
  opt.prefill = 256;  // the whole window: nothing left to step
  EXPECT_EQ(Evaluate(*model_, stream_, opt).status().code(), absl::StatusCode::kInvalidArgument);
}

// The CLI: --prefill reaches Evaluate (snapkv's row leaves h2o's), h2o:recent= is a spec of its
// own, and --prefill is refused where it means nothing.
TEST_F(EvalTest, CliPrefillAndRecentSpec) {
  const std::string eval = std::string(HEAVYKV_BINARY) + " eval --model " +
                           testing::ModelPath() + " --tokenizer " + testing::TokenizerPath() +
                           " --text " + testing::SourcePath("tests/data/eval_stories.txt") +
                           " --window 128 --max-windows 1 --threads 1 --kv-budget 32";
  const auto ppl = [](const std::string& out, const std::string& policy) {
    const size_t at = out.find("\n" + policy + " ");
    if (at == std::string::npos) return -1.0;
    std::istringstream row(out.substr(at + 1, out.find('\n', at + 1) - at - 1));
    std::string field;
    std::vector<std::string> fields;
    while (row >> field) fields.push_back(field);
    return fields.size() > 6 ? std::stod(fields[6]) : -1.0;  // policy kv budget tokens ... ppl
  };
  int code = 0;
  const std::string step = testing::RunCapture(
      eval + " --policy h2o,snapkv,h2o:recent=1,window 2>&1", &code);
  ASSERT_EQ(code, 0) << step;
  EXPECT_GT(ppl(step, "h2o"), 1.0) << step;
  EXPECT_EQ(ppl(step, "snapkv"), ppl(step, "h2o")) << step;
  EXPECT_EQ(ppl(step, "h2o:recent=1"), ppl(step, "window")) << step;  // all recent: window
  EXPECT_NE(ppl(step, "h2o:recent=1"), ppl(step, "h2o")) << step;
  const std::string chunk =
      testing::RunCapture(eval + " --policy h2o,snapkv --prefill 96 2>&1", &code);
  ASSERT_EQ(code, 0) << chunk;
  EXPECT_GT(ppl(chunk, "snapkv"), 1.0) << chunk;
  EXPECT_NE(ppl(chunk, "snapkv"), ppl(chunk, "h2o")) << chunk;
  for (const char* bad : {" --policy h2o --prefill 128", " --policy h2o --prefill -1",
                          " --policy h2o --prefill 8 --stream-tokens 64",
                          " --policy window:recent=0.5"}) {
    const std::string out = testing::RunCapture(eval + bad + " 2>&1", &code);
    EXPECT_NE(code, 0) << bad << ": " << out;
  }
}

}  // namespace
}  // namespace heavykv
