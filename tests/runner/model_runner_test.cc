// The batched forward step: a batch gives each sequence the same logits as running it alone,
// chunked prefill equals token-by-token feeding, bad plans are rejected without side effects,
// and each kv head keeps its own tokens.
#include "engine/runner/model_runner.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <set>

#include "engine/gguf/gguf_weight_mix.h"
#include "engine/model/make_gguf_model.h"
#include "kernels/cpu/gemm.h"
#include "tests/test_util.h"

namespace heavykv {
namespace {

// A sequence of the test: its prompt, how many tokens it decodes (fed greedily from its own
// logits), and the step at which it joins the batch.
struct Script {
  std::vector<int32_t> prompt;
  int32_t decode = 0;
  int32_t join = 0;
};

std::unique_ptr<Model> Load(const std::string& path) {
  absl::StatusOr<Model> m = LoadModel(path);
  EXPECT_TRUE(m.ok()) << m.status();
  return std::make_unique<Model>(*std::move(m));
}

int32_t ArgmaxRow(const float* row, int32_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

// Runs the scripts batched (each joins at its step; prefill in chunks of `chunk`) and returns
// per script the logits rows of every step in which it took part.
std::vector<std::vector<std::vector<float>>> RunBatched(const Model& model,
                                                        const std::vector<Script>& scripts,
                                                        const EvictionPolicy* policy,
                                                        int32_t budget, int32_t chunk,
                                                        bool batched, int32_t kv_bytes = 4) {
  const int32_t V = model.config.vocab_size;
  KvShape shape = KvShapeFor(model.config, 8);
  shape.element_bytes = kv_bytes;
  auto cache = *KvCache::Create(shape, 512);
  ModelRunner runner(model, cache.get());
  std::vector<std::vector<std::vector<float>>> out(scripts.size());
  // Per-script state.
  struct State {
    SequenceKv kv;
    std::vector<int32_t> tokens;
    int32_t fed = 0, decoded = 0;
  };
  std::vector<State> st(scripts.size());
  for (size_t i = 0; i < scripts.size(); ++i) {
    st[i].kv.policy = policy;
    st[i].kv.budget = budget;
    st[i].tokens = scripts[i].prompt;
  }
  auto done = [&](size_t i) {
    return st[i].decoded == scripts[i].decode && st[i].fed == int32_t(st[i].tokens.size());
  };
  // Alone: one script at a time, all steps; batched: every live script in every step.
  for (size_t only = 0; only < (batched ? 1 : scripts.size()); ++only) {
    for (int32_t step = 0;; ++step) {
      std::vector<SequenceStep> plan;
      std::vector<size_t> who;
      for (size_t i = 0; i < scripts.size(); ++i) {
        if (!batched && i != only) continue;
        if ((batched && step < scripts[i].join) || done(i)) continue;
        State& s = st[i];
        int32_t n = std::min<int32_t>(chunk, s.tokens.size() - s.fed);
        plan.push_back({&s.kv, std::span<const int32_t>(s.tokens).subspan(s.fed, n), s.fed, false});
        who.push_back(i);
      }
      if (plan.empty()) {
        bool all_done = true;
        for (size_t i = 0; i < scripts.size(); ++i) all_done &= (!batched && i != only) || done(i);
        if (all_done) break;
        continue;
      }
      absl::StatusOr<std::span<const float>> logits = runner.Forward(plan);
      EXPECT_TRUE(logits.ok()) << logits.status();
      if (!logits.ok()) return out;
      for (size_t r = 0; r < who.size(); ++r) {
        State& s = st[who[r]];
        const float* row = logits->data() + r * V;
        out[who[r]].emplace_back(row, row + V);
        s.fed += plan[r].tokens.size();
        if (s.fed == int32_t(s.tokens.size()) && s.decoded < scripts[who[r]].decode) {
          s.tokens.push_back(ArgmaxRow(row, V));
          ++s.decoded;
        }
      }
    }
  }
  for (State& s : st) cache->Release(s.kv);
  EXPECT_EQ(cache->allocator().num_pages_used(), 0);
  return out;
}

std::vector<Script> MakeScripts(int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Script> scripts;
  const int32_t lens[] = {1, 9, 23, 40, 5};
  for (int i = 0; i < 5; ++i) {
    Script s;
    s.prompt.push_back(1);
    for (int j = 1; j < lens[i]; ++j) s.prompt.push_back(3 + rng() % (vocab - 3));
    s.decode = 30 + 3 * i;
    s.join = 2 * i;
    scripts.push_back(s);
  }
  return scripts;
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

class BatchParity : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(BatchParity, BatchEqualsAlone) {
  const auto& [which, policy_name] = GetParam();
  cpu::SetNumThreads(2);
  testing::TempDir dir;
  std::unique_ptr<Model> model;
  if (which == "bundled") {
    model = Load(testing::ModelPath());
  } else {
    ASSERT_TRUE(WriteRandomModel(testing::SmallGqaConfig(), 3, dir.File("gqa.bin")).ok());
    model = Load(dir.File("gqa.bin"));
  }
  auto policy = *MakePolicy(policy_name);
  const EvictionPolicy* p = policy_name == "full" ? nullptr : policy.get();
  const int32_t budget = policy_name == "full" ? kUnboundedBudget : 17;
  std::vector<Script> scripts = MakeScripts(model->config.vocab_size, 5);
  auto alone = RunBatched(*model, scripts, p, budget, 8, false);
  auto batch = RunBatched(*model, scripts, p, budget, 8, true);
  ASSERT_EQ(alone.size(), batch.size());
  for (size_t i = 0; i < scripts.size(); ++i) {
    ASSERT_EQ(alone[i].size(), batch[i].size()) << "script " << i;
    for (size_t t = 0; t < alone[i].size(); ++t) {
      EXPECT_LE(MaxAbsDiff(alone[i][t], batch[i][t]), 1e-4) << "script " << i << " step " << t;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, BatchParity,
                         ::testing::Combine(::testing::Values("bundled", "gqa"),
                                            ::testing::Values("full", "window", "sink", "h2o",
                                                              "tova", "scissorhands", "knorm",
                                                              "snapkv:window=4:kernel=3")));

// bf16 K/V: a batch still equals each sequence alone, and the logits stay near fp32's (K and V
// rounded to 8 mantissa bits; measured up to ~0.25 here) without being identical (the bf16
// path ran).
TEST(ModelRunnerTest, Bf16KvBatchEqualsAloneAndStaysNearFp32) {
  cpu::SetNumThreads(2);
  std::unique_ptr<Model> model = Load(testing::ModelPath());
  auto policy = *MakePolicy("h2o");
  std::vector<Script> scripts = MakeScripts(model->config.vocab_size, 5);
  auto alone = RunBatched(*model, scripts, policy.get(), 17, 8, false, 2);
  auto batch = RunBatched(*model, scripts, policy.get(), 17, 8, true, 2);
  auto full_alone = RunBatched(*model, scripts, nullptr, kUnboundedBudget, 8, false, 2);
  auto fp32_alone = RunBatched(*model, scripts, nullptr, kUnboundedBudget, 8, false, 4);
  ASSERT_EQ(alone.size(), batch.size());
  double max_vs_fp32 = 0;
  for (size_t i = 0; i < scripts.size(); ++i) {
    ASSERT_EQ(alone[i].size(), batch[i].size()) << "script " << i;
    for (size_t t = 0; t < alone[i].size(); ++t) {
      EXPECT_LE(MaxAbsDiff(alone[i][t], batch[i][t]), 1e-4) << "script " << i << " step " << t;
    }
    // Decoding is greedy, so the two runs feed the same tokens only until their argmax first
    // differs: compare up to and including that step.
    for (size_t t = 0; t < full_alone[i].size(); ++t) {
      const std::vector<float>& a = full_alone[i][t];
      const std::vector<float>& b = fp32_alone[i][t];
      max_vs_fp32 = std::max(max_vs_fp32, MaxAbsDiff(a, b));
      if (std::max_element(a.begin(), a.end()) - a.begin() !=
          std::max_element(b.begin(), b.end()) - b.begin()) {
        break;
      }
    }
  }
  EXPECT_GT(max_vs_fp32, 0.0);
  EXPECT_LT(max_vs_fp32, 0.5);  // logits of this model reach ~20
}

// bf16 weights (and bf16 K/V): a batch equals each sequence alone, as with fp32.
TEST(ModelRunnerTest, Bf16WeightsBatchEqualsAlone) {
  cpu::SetNumThreads(2);
  const Model model = *LoadModel(testing::ModelPath(), cpu::WeightType::kBf16);
  auto policy = *MakePolicy("h2o");
  std::vector<Script> scripts = MakeScripts(model.config.vocab_size, 7);
  for (int32_t kv_bytes : {4, 2}) {
    auto alone = RunBatched(model, scripts, policy.get(), 17, 8, false, kv_bytes);
    auto batch = RunBatched(model, scripts, policy.get(), 17, 8, true, kv_bytes);
    ASSERT_EQ(alone.size(), batch.size());
    for (size_t i = 0; i < scripts.size(); ++i) {
      ASSERT_EQ(alone[i].size(), batch[i].size()) << "script " << i;
      for (size_t t = 0; t < alone[i].size(); ++t) {
        EXPECT_LE(MaxAbsDiff(alone[i][t], batch[i][t]), 1e-4) << "script " << i << " step " << t;
      }
    }
  }
}

TEST(ModelRunnerTest, ChunkedPrefillEqualsTokenByToken) {
  cpu::SetNumThreads(2);
  std::unique_ptr<Model> model = Load(testing::ModelPath());
  std::vector<Script> scripts = MakeScripts(512, 11);
  for (Script& s : scripts) s.join = 0;
  auto one = RunBatched(*model, scripts, nullptr, kUnboundedBudget, 1, true);
  auto chunked = RunBatched(*model, scripts, nullptr, kUnboundedBudget, 16, true);
  for (size_t i = 0; i < scripts.size(); ++i) {
    // Compare the logits after the whole prompt and of every decode step: the last rows.
    const size_t decode = scripts[i].decode;
    ASSERT_GE(one[i].size(), decode);
    ASSERT_GE(chunked[i].size(), decode);
    for (size_t k = 1; k <= decode; ++k) {
      EXPECT_LE(MaxAbsDiff(one[i][one[i].size() - k], chunked[i][chunked[i].size() - k]), 1e-4);
    }
  }
}

TEST(ModelRunnerTest, AttentionPartsKeepTheThreadsBusy) {
  EXPECT_EQ(AttentionParts(8, 2, 32768), 1);   // 8 pairs already busy 2 threads
  EXPECT_EQ(AttentionParts(2, 2, 32768), 1);
  EXPECT_EQ(AttentionParts(1, 2, 32768), 2);   // one pair, two threads
  EXPECT_EQ(AttentionParts(3, 16, 32768), 6);  // ceil(16 / 3)
  EXPECT_EQ(AttentionParts(1, 16, 2048), 4);   // no part under 512 slots
  EXPECT_EQ(AttentionParts(1, 16, 1023), 1);
  EXPECT_EQ(AttentionParts(1, 1, 32768), 1);
}

// Decoding with fewer (sequence, kv head) pairs than threads cuts each long context into parts
// (split-K) and combines them: the logits, and under h2o what each head keeps, are those of the
// unsplit attention (one thread), to float rounding. One kv head at batch 1 on two threads,
// after a 1536-token prompt; h2o at a 1100-token budget evicts every step on the scores the
// combine writes.
TEST(ModelRunnerTest, SplitContextDecodeEqualsUnsplit) {
  ModelConfig c = testing::SmallGqaConfig();
  c.num_kv_heads = 1;
  c.num_layers = 2;
  c.seq_len = 1600;
  testing::TempDir dir;
  ASSERT_TRUE(WriteRandomModel(c, 5, dir.File("mqa.bin")).ok());
  std::unique_ptr<Model> model = Load(dir.File("mqa.bin"));
  std::mt19937 rng(3);
  std::vector<int32_t> prompt(1536);
  for (int32_t& t : prompt) t = 3 + rng() % (c.vocab_size - 3);
  for (const char* policy_name : {"full", "h2o"}) {
    SCOPED_TRACE(policy_name);
    auto policy = *MakePolicy(policy_name);
    struct Run {
      std::vector<std::vector<float>> logits;
      std::vector<int32_t> kept;  // positions held by every (layer, head) at the end
      int64_t split_parts = 0;
    };
    auto run = [&](int threads) {
      cpu::SetNumThreads(threads);
      const KvShape shape = KvShapeFor(c, 16);
      std::unique_ptr<KvCache> cache = *KvCache::Create(shape, 2 * (1600 / 16 + 2));
      ModelRunner runner(*model, cache.get());
      SequenceKv kv;
      if (std::string(policy_name) == "h2o") {
        kv.policy = policy.get();
        kv.budget = 1100;
      }
      Run r;
      int32_t pos = 0, next = 0;
      for (int32_t t0 = 0; t0 < int32_t(prompt.size()); t0 += 512) {
        SequenceStep step{&kv, std::span<const int32_t>(prompt.data() + t0, 512), pos, false};
        auto out = runner.Forward({&step, 1});
        EXPECT_TRUE(out.ok()) << out.status();
        pos += 512;
        next = ArgmaxRow(out->data(), c.vocab_size);
      }
      for (int32_t i = 0; i < 12; ++i) {
        SequenceStep step{&kv, std::span<const int32_t>(&next, 1), pos++, false};
        auto out = runner.Forward({&step, 1});
        EXPECT_TRUE(out.ok()) << out.status();
        r.logits.emplace_back(out->begin(), out->end());
        next = ArgmaxRow(out->data(), c.vocab_size);
      }
      for (int32_t l = 0; l < c.num_layers; ++l) {
        PagedKvHead v = cache->View(kv, l, 0, kv.Slots(l));
        for (int32_t s = 0; s < kv.Slots(l); ++s) r.kept.push_back(v.Pos(s));
      }
      r.split_parts = runner.split_attention_parts();
      cache->Release(kv);
      return r;
    };
    const Run whole = run(1), split = run(2);
    EXPECT_EQ(whole.split_parts, 0);
    EXPECT_EQ(split.split_parts, 12 * c.num_layers * 2);  // every decode step, 2 parts a layer
    ASSERT_EQ(whole.logits.size(), split.logits.size());
    for (size_t i = 0; i < whole.logits.size(); ++i) {
      EXPECT_LE(MaxAbsDiff(whole.logits[i], split.logits[i]), 1e-4) << "step " << i;
    }
    EXPECT_EQ(whole.kept, split.kept);
    if (std::string(policy_name) == "h2o") {
      EXPECT_EQ(whole.kept.size(), 2u * 1100);
    }
  }
  cpu::SetNumThreads(2);
}

// The team path (one parallel region per decode step, rows shared out as the threads come) gives
// the logits of the general path bit for bit, and keeps the same tokens under h2o: quantized
// llama (Q4_K_M: Q4_K and Q6_K parts in one fused qkv), qwen2 (biases; Q4_0) and qwen3 (q/k norms,
// a q wider than dim; Q8_0, Q5_K_M), one sequence and a batch of three, prompts fed a token at a
// time and in one chunk (the chunk takes the general path).
TEST(ModelRunnerTest, TeamDecodeEqualsTheGeneralPath) {
  struct Case {
    Architecture arch;
    const char* mix;
  };
  testing::TempDir dir;
  for (const Case& k : {Case{Architecture::kLlama, "q4_k_m"}, Case{Architecture::kQwen2, "q4_0"},
                        Case{Architecture::kQwen3, "q8_0"}, Case{Architecture::kQwen3, "q5_k_m"}}) {
    SCOPED_TRACE(std::string(ArchitectureName(k.arch)) + " " + k.mix);
    RandomGgufOptions o;
    o.config.dim = 256;
    o.config.hidden_dim = 512;
    o.config.num_layers = 2;
    o.config.num_heads = 8;
    o.config.num_kv_heads = 2;
    o.config.vocab_size = 300;
    o.config.seq_len = 128;
    SetArchitecture(k.arch, &o.config);
    if (k.arch == Architecture::kQwen3) o.config.head_size = 64;
    o.weights = *ParseGgufWeightMix(k.mix);
    const std::string path = dir.File(std::string(k.mix) + ".gguf");
    ASSERT_TRUE(WriteRandomGgufModel(o, path).ok());
    std::unique_ptr<Model> model = Load(path);
    const ModelConfig& c = model->config;
    auto policy = *MakePolicy("h2o");
    struct Run {
      std::vector<std::vector<float>> logits;
      std::vector<int32_t> kept;
      int64_t team_steps = 0;
    };
    // `batch` sequences of 40 steps each, budget 24: h2o evicts from step 25 on.
    auto run = [&](bool team, int32_t batch) {
      cpu::SetNumThreads(2);
      std::unique_ptr<KvCache> cache = *KvCache::Create(KvShapeFor(c, 8), 256);
      ModelRunner runner(*model, cache.get());
      runner.set_team(team);
      std::vector<SequenceKv> kv(batch);
      std::vector<int32_t> next(batch);
      for (int32_t i = 0; i < batch; ++i) {
        kv[i].policy = policy.get();
        kv[i].budget = 24;
        next[i] = 1 + 7 * i;
      }
      Run r;
      for (int32_t pos = 0; pos < 40; ++pos) {
        std::vector<SequenceStep> steps;
        for (int32_t i = 0; i < batch; ++i) {
          steps.push_back({&kv[i], std::span<const int32_t>(&next[i], 1), pos, false});
        }
        auto out = runner.Forward(steps);
        EXPECT_TRUE(out.ok()) << out.status();
        if (!out.ok()) return r;
        r.logits.emplace_back(out->begin(), out->end());
        for (int32_t i = 0; i < batch; ++i) {
          // Greedy, but kept off a fixed point of the random model: every token differs.
          next[i] = (ArgmaxRow(out->data() + i * c.vocab_size, c.vocab_size) + pos) % c.vocab_size;
        }
      }
      for (int32_t i = 0; i < batch; ++i) {
        for (int32_t l = 0; l < c.num_layers; ++l) {
          for (int32_t h = 0; h < c.num_kv_heads; ++h) {
            PagedKvHead v = cache->View(kv[i], l, h, kv[i].Slots(l));
            for (int32_t s = 0; s < kv[i].Slots(l); ++s) r.kept.push_back(v.Pos(s));
          }
        }
        cache->Release(kv[i]);
      }
      r.team_steps = runner.team_steps();
      return r;
    };
    for (int32_t batch : {1, 3}) {
      SCOPED_TRACE(::testing::Message() << "batch " << batch);
      const Run general = run(false, batch), team = run(true, batch);
      EXPECT_EQ(general.team_steps, 0);
      EXPECT_EQ(team.team_steps, 40);
      ASSERT_EQ(general.logits.size(), team.logits.size());
      for (size_t i = 0; i < general.logits.size(); ++i) {
        ASSERT_EQ(general.logits[i], team.logits[i]) << "step " << i;
      }
      EXPECT_EQ(general.kept, team.kept);
      EXPECT_EQ(team.kept.size(), size_t(batch) * c.num_layers * c.num_kv_heads * 24);
    }
    // A prompt chunk, and a batch over kTeamMaxTokens, take the general path.
    std::unique_ptr<KvCache> cache = *KvCache::Create(KvShapeFor(c, 8), 256);
    ModelRunner runner(*model, cache.get());
    SequenceKv kv;
    std::vector<int32_t> prompt(kTeamMaxTokens + 1, 5);
    SequenceStep step{&kv, prompt, 0, false};
    ASSERT_TRUE(runner.Forward({&step, 1}).ok());
    EXPECT_EQ(runner.team_steps(), 0);
    cache->Release(kv);
  }
}

// Weights the team path does not serve (fp32 here) always take the general path.
TEST(ModelRunnerTest, FloatWeightsTakeTheGeneralPath) {
  testing::TempDir dir;
  ModelConfig c = testing::SmallGqaConfig();
  ASSERT_TRUE(WriteRandomModel(c, 5, dir.File("f32.bin")).ok());
  std::unique_ptr<Model> model = Load(dir.File("f32.bin"));
  std::unique_ptr<KvCache> cache = *KvCache::Create(KvShapeFor(c, 8), 64);
  ModelRunner runner(*model, cache.get());
  SequenceKv kv;
  int32_t token = 1;
  SequenceStep step{&kv, std::span<const int32_t>(&token, 1), 0, false};
  ASSERT_TRUE(runner.Forward({&step, 1}).ok());
  EXPECT_EQ(runner.team_steps(), 0);
  cache->Release(kv);
}

TEST(ModelRunnerTest, RejectsBadPlansWithoutSideEffects) {
  std::unique_ptr<Model> model = Load(testing::ModelPath());
  auto cache = *KvCache::Create(KvShapeFor(model->config, 16), 4 * model->config.num_layers);
  ModelRunner runner(*model, cache.get());
  SequenceKv kv;
  std::vector<int32_t> bad = {1, 512};
  SequenceStep step{&kv, bad, 0, false};
  absl::Status s = runner.Forward({&step, 1}).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_EQ(cache->allocator().num_pages_used(), 0);
  std::vector<int32_t> ok = {1, 5};
  step = {&kv, ok, 511, false};  // positions 511, 512: past the context of 512
  EXPECT_TRUE(absl::IsInvalidArgument(runner.Forward({&step, 1}).status()));
  step = {&kv, {}, 0, false};
  EXPECT_TRUE(absl::IsInvalidArgument(runner.Forward({&step, 1}).status()));
  // 4 pages of 16 slots: 65 tokens do not fit. Recoverable, nothing allocated.
  std::vector<int32_t> many(65, 5);
  step = {&kv, many, 0, false};
  EXPECT_TRUE(absl::IsResourceExhausted(runner.Forward({&step, 1}).status()));
  EXPECT_EQ(cache->allocator().num_pages_used(), 0);
  // The runner still works afterwards.
  step = {&kv, ok, 0, false};
  EXPECT_TRUE(runner.Forward({&step, 1}).ok());
  cache->Release(kv);
  EXPECT_EQ(cache->allocator().num_pages_used(), 0);
}

TEST(ModelRunnerTest, KvHeadsKeepTheirOwnTokensUnderH2o) {
  std::unique_ptr<Model> model = Load(testing::ModelPath());
  auto cache = *KvCache::Create(KvShapeFor(model->config, 16), 16 * model->config.num_layers);
  ModelRunner runner(*model, cache.get());
  auto h2o = *MakePolicy("h2o");
  SequenceKv kv;
  kv.policy = h2o.get();
  kv.budget = 32;
  std::vector<int32_t> tokens = {1};
  for (int32_t pos = 0; pos < 200; ++pos) {
    SequenceStep step{&kv, std::span<const int32_t>(tokens).subspan(pos, 1), pos, false};
    auto logits = runner.Forward({&step, 1});
    ASSERT_TRUE(logits.ok());
    tokens.push_back(ArgmaxRow(logits->data(), 512));
    for (int32_t l = 0; l < model->config.num_layers; ++l) {
      ASSERT_LE(kv.Slots(l), 32);
      ASSERT_LE(kv.Table(l).pages.size(), 2u);
    }
  }
  // Collect the kept positions of every (layer, kv head); H2O heads attend differently, so
  // they keep different sets. The 16 most recent tokens are in every set.
  std::set<std::set<int32_t>> distinct;
  for (int32_t l = 0; l < model->config.num_layers; ++l) {
    for (int32_t h = 0; h < model->config.num_kv_heads; ++h) {
      PagedKvHead view = cache->View(kv, l, h, kv.Slots(l));
      std::set<int32_t> kept;
      for (int32_t s = 0; s < kv.Slots(l); ++s) kept.insert(view.Pos(s));
      ASSERT_EQ(kept.size(), 32u);
      for (int32_t p = 199 - 15; p <= 199; ++p) EXPECT_TRUE(kept.count(p)) << p;
      distinct.insert(kept);
    }
  }
  EXPECT_GT(distinct.size(), 5u);
  cache->Release(kv);
}

}  // namespace
}  // namespace heavykv
