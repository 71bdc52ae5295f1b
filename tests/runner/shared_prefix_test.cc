// Shared-prefix attention (engine/runner/shared_prefix.h): choices forked from one prompt
// (KvCache::Fork) decode with the logits they get when each attends its whole context alone, to
// float rounding, on the general path (fp32 weights) and the team path (quantized weights), with
// walks of more query heads than one attention tile, beside a sequence that shares nothing.
#include "engine/runner/shared_prefix.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>

#include "engine/gguf/gguf_weight_mix.h"
#include "engine/model/make_gguf_model.h"
#include "engine/runner/model_runner.h"
#include "kernels/cpu/gemm.h"
#include "tests/test_util.h"

namespace heavykv {
namespace {

std::unique_ptr<Model> Load(const std::string& path) {
  absl::StatusOr<Model> m = LoadModel(path);
  EXPECT_TRUE(m.ok()) << m.status();
  return std::make_unique<Model>(*std::move(m));
}

struct Outcome {
  std::vector<std::vector<float>> logits;  // per decode step, every sequence's row
  int64_t walks = 0;
  int64_t team_steps = 0;
};

// A prompt of `prompt` tokens prefilled once, forked into `choices` sequences, plus one
// unrelated sequence; then `decode` steps of all of them in one batch.
Outcome Decode(const Model& model, bool shared, int32_t prompt, int32_t choices, int32_t decode) {
  const ModelConfig& c = model.config;
  const int32_t V = c.vocab_size;
  std::unique_ptr<KvCache> cache = *KvCache::Create(KvShapeFor(c, 8), 2048);
  ModelRunner runner(model, cache.get());
  runner.set_shared_prefix_attention(shared);
  std::mt19937 rng(11);
  std::vector<int32_t> ids(prompt);
  for (int32_t& t : ids) t = 3 + int32_t(rng() % uint32_t(V - 3));
  std::vector<SequenceKv> kv(choices + 1);
  SequenceStep prefill{&kv[0], ids, 0, false};
  EXPECT_TRUE(runner.Forward({&prefill, 1}).ok());
  for (int32_t i = 1; i < choices; ++i) EXPECT_TRUE(cache->Fork(kv[0], kv[i]).ok());
  SequenceStep other{&kv[choices], std::span<const int32_t>(ids).first(prompt / 2), 0, false};
  EXPECT_TRUE(runner.Forward({&other, 1}).ok());
  std::vector<int32_t> next(choices + 1), pos(choices + 1, prompt);
  pos[choices] = prompt / 2;
  for (int32_t i = 0; i <= choices; ++i) next[i] = 5 + 3 * i;
  Outcome r;
  for (int32_t s = 0; s < decode; ++s) {
    std::vector<SequenceStep> steps;
    for (int32_t i = 0; i <= choices; ++i) {
      steps.push_back({&kv[i], std::span<const int32_t>(&next[i], 1), pos[i]++, false});
    }
    auto out = runner.Forward(steps);
    EXPECT_TRUE(out.ok()) << out.status();
    if (!out.ok()) return r;
    r.logits.emplace_back(out->begin(), out->end());
    for (int32_t i = 0; i <= choices; ++i) {
      const float* row = out->data() + int64_t(i) * V;
      next[i] = int32_t((std::max_element(row, row + V) - row + i + s) % V);
    }
  }
  r.walks = runner.shared_prefix_walks();
  r.team_steps = runner.team_steps();
  for (SequenceKv& k : kv) cache->Release(k);
  EXPECT_EQ(cache->allocator().num_pages_used(), 0);
  return r;
}

void ExpectSameLogits(const Outcome& a, const Outcome& b) {
  ASSERT_EQ(a.logits.size(), b.logits.size());
  for (size_t s = 0; s < a.logits.size(); ++s) {
    float worst = 0;
    for (size_t i = 0; i < a.logits[s].size(); ++i) {
      worst = std::max(worst, std::abs(a.logits[s][i] - b.logits[s][i]));
    }
    EXPECT_LE(worst, 2e-4) << "step " << s;
  }
}

TEST(SharedPrefixTest, ForkedChoicesGetTheLogitsOfWholeAttentionOnTheGeneralPath) {
  testing::TempDir dir;
  ModelConfig c = testing::SmallGqaConfig();  // G = 4: 5 choices walk 20 query heads at once
  ASSERT_TRUE(WriteRandomModel(c, 5, dir.File("gqa.bin")).ok());
  std::unique_ptr<Model> model = Load(dir.File("gqa.bin"));
  for (int threads : {1, 2}) {
    cpu::SetNumThreads(threads);
    const Outcome off = Decode(*model, false, 100, 5, 6), on = Decode(*model, true, 100, 5, 6);
    EXPECT_EQ(off.walks, 0);
    // Every step, layer and kv head walks the shared pages once for the five choices.
    EXPECT_EQ(on.walks, int64_t(6) * c.num_layers * c.num_kv_heads);
    ExpectSameLogits(off, on);
  }
  cpu::SetNumThreads(2);
}

TEST(SharedPrefixTest, ForkedChoicesGetTheLogitsOfWholeAttentionOnTheTeamPath) {
  testing::TempDir dir;
  RandomGgufOptions o;
  o.config.dim = 256;
  o.config.hidden_dim = 512;
  o.config.num_layers = 2;
  o.config.num_heads = 16;  // G = 8: three choices walk 24 query heads, over one tile's 16
  o.config.num_kv_heads = 2;
  o.config.vocab_size = 300;
  o.config.seq_len = 256;
  SetArchitecture(Architecture::kLlama, &o.config);
  o.weights = *ParseGgufWeightMix("q4_k_m");
  ASSERT_TRUE(WriteRandomGgufModel(o, dir.File("q.gguf")).ok());
  std::unique_ptr<Model> model = Load(dir.File("q.gguf"));
  cpu::SetNumThreads(2);
  const Outcome off = Decode(*model, false, 120, 3, 5), on = Decode(*model, true, 120, 3, 5);
  EXPECT_EQ(on.team_steps, off.team_steps);
  EXPECT_EQ(on.team_steps, 5);
  EXPECT_GT(on.walks, 0);
  ExpectSameLogits(off, on);
}

TEST(SharedPrefixTest, OnlyDecodeStepsOfTheFullCacheSharingWholePagesAreGrouped) {
  const KvShape shape = KvShapeFor(testing::SmallGqaConfig(), 8);
  std::unique_ptr<KvCache> cache = *KvCache::Create(shape, 256);
  SequenceKv a, b, lone;
  ASSERT_TRUE(cache->Reserve(a, 20).ok());
  cache->CommitStep(a, 20);  // 2 whole pages and a part one
  ASSERT_TRUE(cache->Fork(a, b).ok());
  ASSERT_TRUE(cache->Reserve(lone, 20).ok());
  cache->CommitStep(lone, 20);
  const int32_t t = 7;
  SharedPrefixAttention plan;
  std::vector<SequenceStep> steps = {{&a, {&t, 1}, 20, false}, {&lone, {&t, 1}, 20, false},
                                     {&b, {&t, 1}, 20, false}};
  ASSERT_TRUE(plan.Plan(steps, *cache, 3, 2, 4, 8));
  for (int32_t l = 0; l < 3; ++l) {
    EXPECT_TRUE(plan.Member(l, 0));   // a, kv head 0
    EXPECT_FALSE(plan.Member(l, 2));  // lone
    EXPECT_TRUE(plan.Member(l, 5));   // b, kv head 1
    EXPECT_EQ(plan.Items(l).size(), 2u + 6u);  // a walk per kv head, then every task
  }
  // A prompt chunk is not a decode step: nothing to group.
  std::vector<int32_t> chunk(4, 7);
  steps[2] = {&b, chunk, 20, false};
  EXPECT_FALSE(plan.Plan(steps, *cache, 3, 2, 4, 8));
  for (SequenceKv* k : {&a, &b, &lone}) cache->Release(*k);
}

}  // namespace
}  // namespace heavykv
