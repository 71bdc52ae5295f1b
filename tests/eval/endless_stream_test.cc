// Endless streaming (StreamingLLM): window and sink sequences run past the model's context with
// every query within the context of its keys. The re-rotated sink keys are checked against an
// independent computation: with one layer, a token's K/V depend only on the token and its
// position, so the logits of a step past the context must equal those of a fresh full-cache
// sequence holding the same tokens at the same relative positions (RoPE depends on distances).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <sstream>

#include "engine/model/make_model.h"
#include "engine/runner/model_runner.h"
#include "engine/serving/generator.h"
#include "memory/eviction_policy.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace heavykv {
namespace {

constexpr int32_t kContext = 64;

Model RandomModel(int32_t layers, uint64_t seed, testing::TempDir& dir) {
  ModelConfig c;
  c.dim = 64;
  c.hidden_dim = 128;
  c.num_layers = layers;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.vocab_size = 96;
  c.seq_len = kContext;
  const std::string path = dir.File("m" + std::to_string(layers) + ".bin");
  EXPECT_TRUE(WriteRandomModel(c, seed, path).ok());
  absl::StatusOr<Model> m = LoadModel(path);
  EXPECT_TRUE(m.ok()) << m.status();
  return *std::move(m);
}

std::vector<float> Logits(ModelRunner& runner, SequenceKv& kv, std::span<const int32_t> tokens,
                          int32_t start) {
  SequenceStep step{&kv, tokens, start, false};
  absl::StatusOr<std::span<const float>> out = runner.Forward({&step, 1});
  EXPECT_TRUE(out.ok()) << out.status();
  if (!out.ok()) return {};
  return std::vector<float>(out->begin(), out->end());
}

// The sink policy with budget B, one token a step, up to and past the context: at the steps where
// the sinks were just re-based (positions kContext and 2 kContext - B), the kept tokens sit at
// consecutive positions relative to the sinks, so a fresh full-cache sequence of them, fed at
// positions 0..B, gives the same last logits.
TEST(EndlessStreamTest, SinkPastTheContextEqualsTheSameTokensAtCachePositions) {
  testing::TempDir dir;
  const Model model = RandomModel(/*layers=*/1, 7, dir);
  constexpr int32_t B = 24;
  std::mt19937 rng(3);
  std::vector<int32_t> tokens(3 * kContext);
  for (int32_t& t : tokens) t = 3 + int32_t(rng() % 90);
  auto policy = *MakePolicy("sink");
  auto cache = *KvCache::Create(KvShapeFor(model.config, 8), 16 * model.config.num_layers);
  ModelRunner runner(model, cache.get());
  SequenceKv kv;
  kv.policy = policy.get();
  kv.budget = B;
  int checked = 0;
  for (int32_t pos = 0; pos < int32_t(tokens.size()); ++pos) {
    const std::vector<float> got = Logits(runner, kv, {&tokens[pos], 1}, pos);
    ASSERT_FALSE(got.empty()) << "position " << pos;
    EXPECT_LE(kv.Slots(0), B);
    if (pos != kContext && pos != 2 * kContext - B) continue;
    // The tokens the step attended to: the 4 sinks, then positions pos - B + 4 .. pos.
    std::vector<int32_t> kept(tokens.begin(), tokens.begin() + kNumSinkTokens);
    kept.insert(kept.end(), tokens.begin() + pos - B + kNumSinkTokens, tokens.begin() + pos + 1);
    ASSERT_EQ(kept.size(), size_t(B) + 1);
    auto fresh_cache = *KvCache::Create(KvShapeFor(model.config, 8), 16 * model.config.num_layers);
    ModelRunner fresh(model, fresh_cache.get());
    SequenceKv full;
    const std::vector<float> want = Logits(fresh, full, kept, 0);
    ASSERT_EQ(want.size(), got.size());
    for (size_t v = 0; v < want.size(); ++v) {
      EXPECT_NEAR(got[v], want[v], 2e-4f * (1 + std::abs(want[v]))) << "pos " << pos << " v " << v;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 2);
  // Re-based at positions 64, 104, 144 and 184: each time to 24 before the newest.
  EXPECT_EQ(kv.pinned_shift, 184 - B);
  cache->Release(kv);
  EXPECT_EQ(kv.pinned_shift, 0);
}

// Window needs no rotation: past the context it equals the same tokens at shifted positions too.
TEST(EndlessStreamTest, WindowPastTheContextEqualsTheSameTokensShifted) {
  testing::TempDir dir;
  const Model model = RandomModel(/*layers=*/1, 9, dir);
  constexpr int32_t B = 20;
  std::vector<int32_t> tokens(2 * kContext + 5);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = 3 + int32_t((i * 37) % 90);
  auto policy = *MakePolicy("window");
  auto cache = *KvCache::Create(KvShapeFor(model.config, 8), 16 * model.config.num_layers);
  ModelRunner runner(model, cache.get());
  SequenceKv kv;
  kv.policy = policy.get();
  kv.budget = B;
  std::vector<float> got;
  const int32_t last = int32_t(tokens.size()) - 1;
  for (int32_t pos = 0; pos <= last; ++pos) got = Logits(runner, kv, {&tokens[pos], 1}, pos);
  std::vector<int32_t> kept(tokens.begin() + last - B, tokens.end());  // B + 1 attended
  auto fresh_cache = *KvCache::Create(KvShapeFor(model.config, 8), 16 * model.config.num_layers);
  ModelRunner fresh(model, fresh_cache.get());
  SequenceKv full;
  const std::vector<float> want = Logits(fresh, full, kept, 3);
  ASSERT_EQ(want.size(), got.size());
  for (size_t v = 0; v < want.size(); ++v) {
    EXPECT_NEAR(got[v], want[v], 2e-4f * (1 + std::abs(want[v]))) << v;
  }
}

// Which sequences may run past the context, and Generate going there on a deeper model: peak
// pages stay at the budget's; full and h2o stop at the context with a clear error.
TEST(EndlessStreamTest, OnlyWindowAndSinkUnderTheContextRunPastIt) {
  testing::TempDir dir;
  const Model model = RandomModel(/*layers=*/3, 11, dir);
  auto cache = *KvCache::Create(KvShapeFor(model.config, 8), 64 * model.config.num_layers);
  ModelRunner runner(model, cache.get());
  for (const char* name : {"window", "sink"}) {
    auto policy = *MakePolicy(name);
    GenerateOptions g;
    g.steps = 4 * kContext;
    g.sampling.temperature = 0;
    g.policy = policy.get();
    g.budget = 16;
    g.ignore_eos = true;
    absl::StatusOr<GenerateResult> r =
        Generate(runner, std::vector<int32_t>{1, 5, 6}, g, [](int32_t, int32_t) {});
    ASSERT_TRUE(r.ok()) << name << ": " << r.status();
    EXPECT_EQ(r->tokens.size(), size_t(4 * kContext) + 1) << name;
    EXPECT_EQ(r->finish_reason, "length");
    EXPECT_LE(r->peak_pages, 3 * model.config.num_layers) << name;  // 16 + 1 slots of 8
    EXPECT_EQ(cache->allocator().num_pages_free(), 64 * model.config.num_layers);
  }
  SequenceKv probe;
  auto sink = *MakePolicy("sink");
  auto h2o = *MakePolicy("h2o");
  probe.policy = sink.get();
  probe.budget = kContext - 1;
  EXPECT_TRUE(StreamsPastContext(probe, 1, kContext));
  EXPECT_FALSE(StreamsPastContext(probe, 2, kContext));  // no room for a 2-token step
  probe.policy = h2o.get();
  probe.budget = 16;
  EXPECT_FALSE(StreamsPastContext(probe, 1, kContext));
  probe.policy = nullptr;
  EXPECT_FALSE(StreamsPastContext(probe, 1, kContext));
  for (const char* name : {"full", "h2o"}) {
    auto policy = *MakePolicy(name);
    GenerateOptions g;
    g.steps = kContext + 1;
    g.policy = policy.get();
    g.budget = 16;
    absl::StatusOr<GenerateResult> r =
        Generate(runner, std::vector<int32_t>{1, 5}, g, [](int32_t, int32_t) {});
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << name;
  }
  // A step past the context that is not allowed changes nothing.
  SequenceKv kv;
  kv.policy = h2o.get();
  kv.budget = 16;
  const int32_t t = 5;
  SequenceStep step{&kv, {&t, 1}, kContext, false};
  EXPECT_EQ(runner.Forward({&step, 1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv.Slots(0), 0);
}

// `eval --stream-tokens`: one unbroken stream, past the context for window and sink only, scored
// in chunks; JSON lines and the plot.
TEST(EndlessStreamTest, EvalStreamTokensScoresPastTheContext) {
  testing::TempDir dir;
  int code = 0;
  const std::string out = testing::RunCapture(
      std::string(HEAVYKV_BINARY) + " eval --model " + testing::ModelPath() + " --tokenizer " +
          testing::TokenizerPath() + " --text " +
          testing::SourcePath("tests/data/eval_stories.txt") +
          " --stream-tokens 1200 --chunk 256 --policy full,window,sink --kv-budget 64 "
          "--threads 1 --json --plot " + dir.File("s.svg") + " 2>/dev/null",
      &code);
  ASSERT_EQ(code, 0) << out;
  std::vector<nlohmann::json> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 3u) << out;
  EXPECT_EQ(lines[0]["policy"], "full");
  EXPECT_EQ(lines[0]["tokens"], 511);  // stops at the context
  EXPECT_EQ(lines[0]["past_context"], false);
  for (int i : {1, 2}) {
    EXPECT_EQ(lines[i]["tokens"], 1199);
    EXPECT_EQ(lines[i]["past_context"], true);
    EXPECT_EQ(lines[i]["budget"], 64);
    const nlohmann::json& ends = lines[i]["chunk_end"];
    ASSERT_EQ(ends.size(), 5u);  // 4 chunks of 256 and the last 175
    EXPECT_EQ(ends[0], 257);
    EXPECT_EQ(ends[4], 1200);
    for (const auto& p : lines[i]["chunk_ppl"]) {
      EXPECT_GT(p.get<double>(), 1.0);
      EXPECT_LT(p.get<double>(), 20.0);  // the bundled model stays sane past its context
    }
  }
  EXPECT_NE(testing::ReadFile(dir.File("s.svg")).find("context length"), std::string::npos);
}

}  // namespace
}  // namespace heavykv
