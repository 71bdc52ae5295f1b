// The CUDA runner against the CPU runner on the bundled model (models/stories260K.bin): logits of
// prefill chunks and decode steps by normalised error, greedy text, the H2O path (eviction on the
// GPU) and the step contract (all-or-nothing reservation, errors). bf16 weights and K/V give
// logits within a few percent of the fp32 CPU run; greedy decoding follows the same tokens while
// the top two logits are further apart than that. The same logit parity on GGUF models of the
// other architectures and settings: qwen2 (q/k/v bias, NEOX rope, theta 1e6, eps 1e-6), Llama 3.1
// rope_freqs at theta 500000, Q4_K/Q6_K weights (dequantized to bf16 at upload), and a random
// qwen3 (per-head q/k norm, q_dim != dim) written here with GgufWriter, within a looser bound
// (kGgufTolerance says why). --gpu-weights quantized (file blocks on the GPU, issue 32; never run
// on a GPU as of its commit) against the CPU on the quantized fixtures and on stories260K
// quantized to Q8_0 / Q4_0 (greedy text).
#include <cstdlib>
#include <memory>
#include <random>

#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_model_runner.h"
#include "engine/gguf/gguf_writer.h"
#include "engine/runner/model_runner.h"
#include "engine/serving/generator.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/test_util.h"

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
  EXPECT_EQ(a.Slots(0), b.Slots(0));
  EXPECT_EQ(a.Table(0).pages.size(), b.Table(0).pages.size());
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
    // The CPU holds a table per layer (a page per layer), the GPU one for all layers.
    EXPECT_EQ(rg.peak_pages * model_->config.num_layers, rc.peak_pages);
  }
  // Every (layer, head) of a bounded sequence holds the budget and distinct positions.
  SequenceKv kv;
  kv.policy = h2o.get();
  kv.budget = 20;
  std::vector<int32_t> prompt = tok_->Encode("Once upon a time there was a big dog named Max", true, false);
  SequenceStep st{&kv, prompt, 0, false};
  ASSERT_TRUE(gpu_->Forward({&st, 1}).ok());
  ASSERT_EQ(kv.Slots(0), std::min<int32_t>(20, prompt.size()));
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
  EXPECT_EQ(kv.NumPages(), 0);
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

// A policy the GPU has no rule for is refused, by SupportsPolicy (what the engine asks at
// submission) and by Forward, with UNIMPLEMENTED naming it and nothing changed; the others pass.
TEST_F(CudaModelRunnerTest, PoliciesWithoutAGpuRuleAreRefused) {
  for (const char* name : {"tova", "scissorhands", "knorm", "snapkv"}) {
    auto policy = *MakePolicy(name);
    const absl::Status s = gpu_->SupportsPolicy(policy.get());
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << name;
    EXPECT_NE(s.message().find(name), std::string::npos) << s;
    SequenceKv kv;
    kv.policy = policy.get();
    kv.budget = 8;
    std::vector<int32_t> ids(12, 5);
    SequenceStep st{&kv, ids, 0, false};
    EXPECT_EQ(gpu_->Forward({&st, 1}).status().code(), absl::StatusCode::kUnimplemented) << name;
    EXPECT_EQ(kv.NumPages(), 0) << name;
  }
  for (const char* name : {"window", "sink", "h2o"}) {
    auto policy = *MakePolicy(name);
    EXPECT_TRUE(gpu_->SupportsPolicy(policy.get()).ok()) << name;
  }
  EXPECT_TRUE(gpu_->SupportsPolicy(nullptr).ok());
}

TEST_F(CudaModelRunnerTest, DefaultPoolFitsInFreeMemory) {
  absl::StatusOr<int32_t> pages =
      DefaultKvPages(Device::kCuda, *model_, KvShapeForDevice(Device::kCuda, model_->config, 16));
  ASSERT_TRUE(pages.ok()) << pages.status();
  EXPECT_GT(*pages, 1000);
}

// The GGUF models are random (uniform weights), which makes their logits far more sensitive to
// bf16 rounding than a trained model's: the CPU runner with only its weights and K/V rounded to
// bf16 already lands 0.017 (rl256), 0.023 (rq256) and 0.028 (rl3) from the fp32 run on these
// steps (stories260K: 0.0013), and the GPU also rounds the GEMM inputs. A wrong rope (theta
// 10000 for rl3, interleaved pairs for rq256) or a missing bias moves them by 0.6 to 1.4.
// The factors and the epsilon hardly show in logits this noisy; kernels_test.cc checks them.
constexpr double kGgufTolerance = 0.1;

std::string GgufFixture(const std::string& name) {
  return std::string(HEAVYKV_SOURCE_DIR) + "/tests/data/gguf/" + name;
}

// Runs 24 tokens through the CPU runner (fp32 K/V) and the CUDA runner (MakeStepRunner, so the
// device check is the one serving uses) as two prefill chunks with every row's logits, then four
// teacher-forced decode steps; returns the largest normalised error of a step's logits.
double GgufParityError(const Model& model, const StepRunnerOptions& options = {}) {
  const ModelConfig& c = model.config;
  auto cpu_cache = *CreateKvCache(Device::kCpu, KvShapeForDevice(Device::kCpu, c, 16), 64);
  auto gpu_cache = *CreateKvCache(Device::kCuda, KvShapeForDevice(Device::kCuda, c, 16), 64);
  auto cpu = *MakeStepRunner(Device::kCpu, model, cpu_cache.get());
  absl::StatusOr<std::unique_ptr<StepRunner>> gpu =
      MakeStepRunner(Device::kCuda, model, gpu_cache.get(), options);
  EXPECT_TRUE(gpu.ok()) << gpu.status();
  if (!gpu.ok()) return 1e9;
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 28; ++i) tokens.push_back((i * 7 + 3) % c.vocab_size);
  SequenceKv a, b;
  double worst = 0;
  struct Chunk { int32_t from, n; bool all; };
  for (Chunk ch : {Chunk{0, 16, true}, Chunk{16, 8, true}, Chunk{24, 1, false},
                   Chunk{25, 1, false}, Chunk{26, 1, false}, Chunk{27, 1, false}}) {
    SCOPED_TRACE(absl::StrCat("tokens from ", ch.from));
    const std::span<const int32_t> ids = std::span<const int32_t>(tokens).subspan(ch.from, ch.n);
    SequenceStep sa{&a, ids, ch.from, ch.all}, sb{&b, ids, ch.from, ch.all};
    absl::StatusOr<std::span<const float>> want = cpu->Forward({&sa, 1});
    EXPECT_TRUE(want.ok()) << want.status();
    if (!want.ok()) return 1e9;
    const std::vector<float> w(want->begin(), want->end());
    absl::StatusOr<std::span<const float>> got = (*gpu)->Forward({&sb, 1});
    EXPECT_TRUE(got.ok()) << got.status();
    if (!got.ok()) return 1e9;
    const double e = testing::NormalizedError(std::vector<float>(got->begin(), got->end()), w);
    EXPECT_EQ(got->size(), w.size());
    worst = std::max(worst, e);
  }
  EXPECT_EQ(a.Slots(0), b.Slots(0));
  cpu_cache->Release(a);
  gpu_cache->Release(b);
  return worst;
}

Model LoadFixture(const std::string& path) {
  absl::StatusOr<Model> m = LoadModel(path);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : Model{};
}

TEST(CudaGgufTest, Qwen2BiasNeoxLogitsMatchCpu) {
  HEAVYKV_SKIP_WITHOUT_GPU();
  const Model m = LoadFixture(GgufFixture("rq256-f32.gguf"));
  ASSERT_TRUE(m.config.attention_bias);
  ASSERT_EQ(m.config.rope_style, RopeStyle::kNeox);
  ASSERT_NE(m.config.rms_norm_eps, 1e-5f);
  EXPECT_LT(GgufParityError(m), kGgufTolerance);
}

TEST(CudaGgufTest, Llama31RopeFreqsLogitsMatchCpu) {
  HEAVYKV_SKIP_WITHOUT_GPU();
  const Model m = LoadFixture(GgufFixture("rl3-f32.gguf"));
  ASSERT_FALSE(m.rope_freqs.empty());
  ASSERT_EQ(m.config.rope_theta, 500000.0f);
  EXPECT_LT(GgufParityError(m), kGgufTolerance);
}

TEST(CudaGgufTest, QuantizedWeightsLogitsMatchCpu) {
  HEAVYKV_SKIP_WITHOUT_GPU();
  // Q4_K / Q6_K on the CPU as the file stores them, dequantized and rounded to bf16 on the GPU.
  const Model m = LoadFixture(GgufFixture("rl256-q4_k_m.gguf"));
  ASSERT_FALSE(m.layers.empty());
  ASSERT_FALSE(m.layers[0].wqkv.IsPacked(cpu::WeightType::kFp32));
  EXPECT_LT(GgufParityError(m), kGgufTolerance);
}

// --gpu-weights quantized (issue 32; NEVER RUN ON A GPU as of this commit): every fixture whose
// matrices are in a format the GPU keeps quantized, with the file's blocks on the device. The
// weights are then the CPU's exactly (only the activations are bf16), so the bound is the bf16
// path's. HEAVYKV_CUDA_QUANT_GEMV_MAX=0 sends every step through the other large-batch path
// (bf16 slabs + cuBLASLt) instead of QuantGemv.
TEST(CudaGgufTest, QuantizedWeightsKeptOnTheGpuMatchCpu) {
  HEAVYKV_SKIP_WITHOUT_GPU();
  const StepRunnerOptions quantized{.gpu_weights = GpuWeights::kQuantized};
  for (const char* name : {"rl256-q4_0", "rl256-q8_0", "rl256-q4_k_m", "rl256-q5_k_m",
                           "rl256-q6_k", "rq256-q4_k_m"}) {
    SCOPED_TRACE(name);
    const Model m = LoadFixture(GgufFixture(std::string(name) + ".gguf"));
    const double bf16 = GgufParityError(m);
    const double q = GgufParityError(m, quantized);
    ::testing::Test::RecordProperty(std::string(name) + "_bf16_error", absl::StrCat(bf16));
    ::testing::Test::RecordProperty(std::string(name) + "_quantized_error", absl::StrCat(q));
    EXPECT_LT(q, kGgufTolerance) << "bf16 path: " << bf16;
    setenv("HEAVYKV_CUDA_QUANT_GEMV_MAX", "0", 1);
    const double slabs = GgufParityError(m, quantized);
    unsetenv("HEAVYKV_CUDA_QUANT_GEMV_MAX");
    EXPECT_LT(slabs, kGgufTolerance) << "bf16 slabs + cuBLASLt";
  }
}

TEST(CudaGgufTest, QuantizedWeightsReportTheirRealBytes) {
  HEAVYKV_SKIP_WITHOUT_GPU();
  const Model m = LoadFixture(GgufFixture("rl256-q4_k_m.gguf"));
  auto cache = *CreateKvCache(Device::kCuda, KvShapeForDevice(Device::kCuda, m.config, 16), 16);
  auto q = CudaModelRunner::Create(m, cache.get(), {.gpu_weights = GpuWeights::kQuantized});
  ASSERT_TRUE(q.ok()) << q.status();
  auto b = CudaModelRunner::Create(m, cache.get());
  ASSERT_TRUE(b.ok()) << b.status();
  const auto formats = (*q)->DeviceWeightBytes();
  ASSERT_GE(formats.size(), 2u);
  EXPECT_EQ(formats[0].first, "q4_K");
  // What a decode step reads: the matrices' file bytes, not their bf16 size.
  int64_t matrices = m.classifier.bytes();
  for (const LayerWeights& l : m.layers) {
    matrices += l.wqkv.bytes() + l.wo.bytes() + l.w13.bytes() + l.w2.bytes();
  }
  EXPECT_EQ((*q)->WeightBytes(), matrices);
  EXPECT_GT((*b)->WeightBytes(), 3 * (*q)->WeightBytes());
  EXPECT_LT((*q)->DeviceBytes(), (*b)->DeviceBytes());
}

// stories260K with every matrix of whole 32-blocks quantized (Q8_0 or Q4_0; ffn_down's 172 inputs
// stay fp32, so its part goes bf16) and the shared classifier, so the embedding is gathered from
// quantized blocks too. The CPU runs the same quantized model; greedy text must agree for as
// long as the bf16 test's bound allows for activations rounded differently (bf16 here, int8 on
// the CPU's quantized path): 40 tokens.
Model QuantizedStories(cpu::QuantType type) {
  Model m = *LoadModel(ModelPath());
  auto quantize = [&](cpu::Linear& l) {
    if (l.cols() % 32 != 0) return;
    std::vector<float> w(l.rows() * l.cols());
    l.ToRowMajor(w.data());
    l = cpu::Linear(*cpu::QuantMatrix::Quantize(type, w.data(), l.rows(), l.cols()));
  };
  for (LayerWeights& l : m.layers) {
    for (cpu::Linear* w : {&l.wqkv, &l.wo, &l.w13, &l.w2}) quantize(*w);
  }
  quantize(m.classifier);
  return m;
}

TEST(CudaQuantizedWeightsTest, GreedyTextMatchesCpuOnAQuantizedStoriesModel) {
  HEAVYKV_SKIP_WITHOUT_GPU();
  const auto tok = *Tokenizer::Load(TokenizerPath(), 512);
  for (cpu::QuantType type : {cpu::QuantType::kQ8_0, cpu::QuantType::kQ4_0}) {
    SCOPED_TRACE(cpu::QuantTypeName(type));
    const Model m = QuantizedStories(type);
    ASSERT_TRUE(m.config.shared_classifier);
    auto cpu_cache = *CreateKvCache(Device::kCpu, KvShapeForDevice(Device::kCpu, m.config, 16), 64);
    auto gpu_cache =
        *CreateKvCache(Device::kCuda, KvShapeForDevice(Device::kCuda, m.config, 16), 64);
    auto cpu = *MakeStepRunner(Device::kCpu, m, cpu_cache.get());
    auto gpu = MakeStepRunner(Device::kCuda, m, gpu_cache.get(),
                              {.gpu_weights = GpuWeights::kQuantized});
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    const auto fmt = (*gpu)->DeviceWeightBytes();
    ASSERT_FALSE(fmt.empty());
    EXPECT_EQ(fmt[0].first, cpu::QuantTypeName(type));
    GenerateOptions opt;
    opt.steps = 128;
    opt.sampling.temperature = 0;
    opt.prefill_chunk = 7;
    const std::vector<int32_t> prompt = tok.Encode("Once upon a time", true, false);
    auto want = Generate(*cpu, prompt, opt, [](int32_t, int32_t) {});
    auto got = Generate(**gpu, prompt, opt, [](int32_t, int32_t) {});
    ASSERT_TRUE(want.ok() && got.ok()) << want.status() << got.status();
    ASSERT_GE(want->tokens.size(), 40u);
    ASSERT_GE(got->tokens.size(), 40u);
    EXPECT_EQ(std::vector<int32_t>(got->tokens.begin(), got->tokens.begin() + 40),
              std::vector<int32_t>(want->tokens.begin(), want->tokens.begin() + 40));
  }
}

// A random qwen3 (the layout of tests/model/gguf_arch_test.cc's): dim 64, 4 heads / 2 kv heads of
// 32, so q_dim 128 != dim, per-head q/k norm, NEOX rope, theta 1e6, eps 1e-6, tied classifier; F32.
void WriteRandomQwen3(const std::string& path) {
  const int dim = 64, hidden = 96, layers = 2, heads = 4, kv_heads = 2, hd = 32, vocab = 64;
  GgufWriter w;
  std::mt19937 rng(4321);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto tensor = [&](const std::string& name, int64_t rows, int64_t cols, float center,
                    float scale) {
    std::vector<float> f(rows * cols);
    for (float& x : f) x = center + scale * u(rng);
    std::string bytes(reinterpret_cast<const char*>(f.data()), f.size() * sizeof(float));
    std::vector<int64_t> dims = rows == 1 ? std::vector<int64_t>{cols}
                                          : std::vector<int64_t>{cols, rows};
    EXPECT_TRUE(w.AddTensor(name, GgmlType::kF32, dims, bytes).ok()) << name;
  };
  const std::string a = "qwen3";
  w.AddString("general.architecture", a);
  w.AddU32(a + ".context_length", 128);
  w.AddU32(a + ".embedding_length", dim);
  w.AddU32(a + ".block_count", layers);
  w.AddU32(a + ".feed_forward_length", hidden);
  w.AddU32(a + ".attention.head_count", heads);
  w.AddU32(a + ".attention.head_count_kv", kv_heads);
  w.AddU32(a + ".rope.dimension_count", hd);
  w.AddF32(a + ".rope.freq_base", 1e6f);
  w.AddF32(a + ".attention.layer_norm_rms_epsilon", 1e-6f);
  w.AddU32(a + ".attention.key_length", hd);
  w.AddU32(a + ".attention.value_length", hd);
  tensor("token_embd.weight", vocab, dim, 0.0f, 1.0f);
  tensor("output_norm.weight", 1, dim, 1.0f, 0.2f);
  for (int l = 0; l < layers; ++l) {
    const std::string b = absl::StrCat("blk.", l, ".");
    tensor(b + "attn_norm.weight", 1, dim, 1.0f, 0.2f);
    tensor(b + "attn_q.weight", heads * hd, dim, 0.0f, 0.4f);
    tensor(b + "attn_k.weight", kv_heads * hd, dim, 0.0f, 0.4f);
    tensor(b + "attn_v.weight", kv_heads * hd, dim, 0.0f, 0.4f);
    tensor(b + "attn_q_norm.weight", 1, hd, 1.0f, 0.5f);
    tensor(b + "attn_k_norm.weight", 1, hd, 1.0f, 0.5f);
    tensor(b + "attn_output.weight", dim, heads * hd, 0.0f, 0.2f);
    tensor(b + "ffn_norm.weight", 1, dim, 1.0f, 0.2f);
    tensor(b + "ffn_gate.weight", hidden, dim, 0.0f, 0.3f);
    tensor(b + "ffn_up.weight", hidden, dim, 0.0f, 0.3f);
    tensor(b + "ffn_down.weight", dim, hidden, 0.0f, 0.2f);
  }
  EXPECT_TRUE(w.WriteFile(path).ok());
}

TEST(CudaGgufTest, Qwen3QkNormWideHeadsLogitsMatchCpu) {
  HEAVYKV_SKIP_WITHOUT_GPU();
  testing::TempDir dir;
  const std::string path = dir.File("q3.gguf");
  WriteRandomQwen3(path);
  const Model m = LoadFixture(path);
  ASSERT_TRUE(m.config.qk_norm);
  ASSERT_NE(m.config.q_dim(), m.config.dim);
  EXPECT_LT(GgufParityError(m), kGgufTolerance);
}

}  // namespace
}  // namespace heavykv
