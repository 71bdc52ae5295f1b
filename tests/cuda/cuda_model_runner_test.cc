// The CUDA runner against the CPU runner on the bundled model (models/stories260K.bin): logits of
// prefill chunks and decode steps by normalised error, greedy text, the H2O path (eviction on the
// GPU) and the step contract (all-or-nothing reservation, errors). bf16 weights and K/V give
// logits within a few percent of the fp32 CPU run; greedy decoding follows the same tokens while
// the top two logits are further apart than that.
#include <memory>

#include "engine/cuda/cuda_model_runner.h"
#include "engine/generator.h"
#include "engine/model_runner.h"
#include "engine/tokenizer.h"
#include "tests/cuda/cuda_test_util.h"

namespace heavykv {
namespace {

std::string ModelPath() { return std::string(HEAVYKV_SOURCE_DIR) + "/models/stories260K.bin"; }
std::string TokenizerPath() { return std::string(HEAVYKV_SOURCE_DIR) + "/models/tok512.bin"; }

class CudaModelRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HEAVYKV_SKIP_WITHOUT_GPU();
    model_ = std::make_unique<Model>(*LoadModel(ModelPath()));
    tok_ = std::make_unique<Tokenizer>(*Tokenizer::Load(TokenizerPath(), model_->config.vocab_size));
    cpu_cache_ = *CreateKvCache(Device::kCpu, KvShapeForDevice(Device::kCpu, model_->config, 16), 256);
    gpu_cache_ = *CreateKvCache(Device::kCuda, KvShapeForDevice(Device::kCuda, model_->config, 16), 256);
    cpu_ = *MakeStepRunner(Device::kCpu, *model_, cpu_cache_.get());
    absl::StatusOr<std::unique_ptr<CudaModelRunner>> g =
        CudaModelRunner::Create(*model_, gpu_cache_.get());
    ASSERT_TRUE(g.ok()) << g.status();
    gpu_ = *std::move(g);
  }

  std::vector<int32_t> Greedy(StepRunner& runner, const std::string& prompt, int32_t steps,
                              const EvictionPolicy* policy, int32_t budget,
                              GenerateResult* result = nullptr) {
    GenerateOptions opt;
    opt.steps = steps;
    opt.sampling.temperature = 0;
    opt.policy = policy;
    opt.budget = budget;
    opt.prefill_chunk = 7;  // several prefill chunks
    absl::StatusOr<GenerateResult> r =
        Generate(runner, tok_->Encode(prompt, true, false), opt, [](int32_t, int32_t) {});
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {};
    if (result != nullptr) *result = *r;
    return r->tokens;
  }

  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tok_;
  std::unique_ptr<KvCache> cpu_cache_, gpu_cache_;
  std::unique_ptr<StepRunner> cpu_;
  std::unique_ptr<CudaModelRunner> gpu_;
};

TEST_F(CudaModelRunnerTest, LogitsMatchCpuThroughPrefillAndDecode) {
  const std::vector<int32_t> ids = tok_->Encode("Once upon a time, there was a little girl", true, false);
  SequenceKv a, b;
  const int32_t V = model_->config.vocab_size;
  // Prefill in two chunks with every row's logits, then decode teacher-forced.
  const int32_t half = static_cast<int32_t>(ids.size()) / 2;
  for (auto [from, to] : {std::pair<int32_t, int32_t>{0, half}, {half, int32_t(ids.size())}}) {
    std::span<const int32_t> chunk(ids.data() + from, to - from);
    SequenceStep sa{&a, chunk, from, true}, sb{&b, chunk, from, true};
    auto want = cpu_->Forward({&sa, 1});
    ASSERT_TRUE(want.ok());
    std::vector<float> w(want->begin(), want->end());
    auto got = gpu_->Forward({&sb, 1});
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_LT(testing::NormalizedError(std::vector<float>(got->begin(), got->end()), w), 3e-2);
  }
  int32_t pos = static_cast<int32_t>(ids.size());
  for (int32_t token : {403, 407, 261, 300, 17}) {
    SequenceStep sa{&a, {&token, 1}, pos, false}, sb{&b, {&token, 1}, pos, false};
    auto want = cpu_->Forward({&sa, 1});
    std::vector<float> w(want->begin(), want->end());
    auto got = gpu_->Forward({&sb, 1});
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), size_t(V));
    EXPECT_LT(testing::NormalizedError(std::vector<float>(got->begin(), got->end()), w), 3e-2);
    ++pos;
  }
  EXPECT_EQ(a.num_slots, b.num_slots);
  EXPECT_EQ(a.pages.size(), b.pages.size());
  cpu_cache_->Release(a);
  gpu_cache_->Release(b);
}

TEST_F(CudaModelRunnerTest, BatchedSequencesMatchCpu) {
  // Sequences of different lengths in one step, one of them prefilling.
  const std::vector<int32_t> p1 = tok_->Encode("Lily had a red ball", true, false);
  const std::vector<int32_t> p2 = tok_->Encode("The dog", true, false);
  SequenceKv c1, c2, g1, g2;
  SequenceStep s1{&c1, p1, 0, false}, t1{&g1, p1, 0, false};
  ASSERT_TRUE(cpu_->Forward({&s1, 1}).ok());
  ASSERT_TRUE(gpu_->Forward({&t1, 1}).ok());
  const int32_t next = 300;
  SequenceStep cs[] = {{&c1, {&next, 1}, int32_t(p1.size()), false}, {&c2, p2, 0, true}};
  SequenceStep gs[] = {{&g1, {&next, 1}, int32_t(p1.size()), false}, {&g2, p2, 0, true}};
  auto want = cpu_->Forward(cs);
  std::vector<float> w(want->begin(), want->end());
  auto got = gpu_->Forward(gs);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_LT(testing::NormalizedError(std::vector<float>(got->begin(), got->end()), w), 3e-2);
  for (SequenceKv* s : {&c1, &c2}) cpu_cache_->Release(*s);
  for (SequenceKv* s : {&g1, &g2}) gpu_cache_->Release(*s);
}

TEST_F(CudaModelRunnerTest, GreedyTextMatchesCpu) {
  const std::vector<int32_t> want = Greedy(*cpu_, "Once upon a time", 256, nullptr, kUnboundedBudget);
  const std::vector<int32_t> got = Greedy(*gpu_, "Once upon a time", 256, nullptr, kUnboundedBudget);
  ASSERT_GE(want.size(), 80u);
  ASSERT_GE(got.size(), 80u);
  // bf16 may flip a near-tie late in the story; the first 80 tokens must agree.
  EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + 80),
            std::vector<int32_t>(want.begin(), want.begin() + 80));
}

TEST_F(CudaModelRunnerTest, H2OEvictsOnTheGpuLikeTheCpu) {
  auto h2o = *MakePolicy("h2o", 0.5);
  GenerateResult rc, rg;
  const std::vector<int32_t> want = Greedy(*cpu_, "Once upon a time", 128, h2o.get(), 26, &rc);
  const std::vector<int32_t> got = Greedy(*gpu_, "Once upon a time", 128, h2o.get(), 26, &rg);
  ASSERT_GE(want.size(), 40u);
  ASSERT_GE(got.size(), 40u);
  // Until the budget fills the run is the full-cache run; eviction then starts from the same
  // scores (to fp32 rounding), so the tokens stay together for a while.
  EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + 40),
            std::vector<int32_t>(want.begin(), want.begin() + 40));
  if (want.size() == got.size()) {
    EXPECT_EQ(rg.tokens_evicted, rc.tokens_evicted);
    EXPECT_EQ(rg.peak_pages, rc.peak_pages);
  }
  // Every (layer, head) of a bounded sequence holds the budget and distinct positions.
  SequenceKv kv;
  kv.policy = h2o.get();
  kv.budget = 20;
  std::vector<int32_t> prompt = tok_->Encode("Once upon a time there was a big dog named Max", true, false);
  SequenceStep st{&kv, prompt, 0, false};
  ASSERT_TRUE(gpu_->Forward({&st, 1}).ok());
  ASSERT_EQ(kv.num_slots, std::min<int32_t>(20, prompt.size()));
  std::vector<int32_t> pos;
  std::vector<float> score;
  for (int32_t l = 0; l < model_->config.num_layers; ++l) {
    for (int32_t h = 0; h < model_->config.num_kv_heads; ++h) {
      ASSERT_TRUE(gpu_->ReadSlots(kv, l, h, &pos, &score).ok());
      std::vector<int32_t> sorted = pos;
      std::sort(sorted.begin(), sorted.end());
      EXPECT_EQ(std::unique(sorted.begin(), sorted.end()), sorted.end());
      EXPECT_EQ(sorted.back(), int32_t(prompt.size()) - 1);  // the newest token is kept
    }
  }
  gpu_cache_->Release(kv);
}

TEST_F(CudaModelRunnerTest, InvalidPlansChangeNothing) {
  SequenceKv kv;
  const int32_t bad = model_->config.vocab_size;
  SequenceStep st{&kv, {&bad, 1}, 0, false};
  EXPECT_EQ(gpu_->Forward({&st, 1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(kv.pages.empty());
  // A pool too small for the step: RESOURCE_EXHAUSTED, all or nothing across sequences.
  auto small = *CreateKvCache(Device::kCuda, KvShapeForDevice(Device::kCuda, model_->config, 16), 2);
  auto runner = *MakeStepRunner(Device::kCuda, *model_, small.get());
  std::vector<int32_t> ids(20, 5);
  SequenceKv x, y;
  SequenceStep two[] = {{&x, ids, 0, false}, {&y, ids, 0, false}};
  EXPECT_EQ(runner->Forward(two).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(small->allocator().num_pages_used(), 0);
  SequenceStep one{&x, ids, 0, false};
  EXPECT_TRUE(runner->Forward({&one, 1}).ok());  // and the runner still works
  small->Release(x);
}

TEST_F(CudaModelRunnerTest, DefaultPoolFitsInFreeMemory) {
  absl::StatusOr<int32_t> pages =
      DefaultKvPages(Device::kCuda, *model_, KvShapeForDevice(Device::kCuda, model_->config, 16));
  ASSERT_TRUE(pages.ok()) << pages.status();
  EXPECT_GT(*pages, 1000);
}

}  // namespace
}  // namespace heavykv
