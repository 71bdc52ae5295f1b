// Host-side parts of the CUDA backend, checked against the CPU code without a GPU: the eviction
// rule the GPU selects victims by (kernels/cuda/eviction_rule.h) picks exactly the victims of the
// CPU policies, EvictRuleFor recovers each policy's parameters, and BuildStepLayout packs a step.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>

#include <gtest/gtest.h>

#include "engine/cuda/cuda_model_runner.h"
#include "engine/cuda/step_layout.h"
#include "engine/runner/model_runner.h"
#include "kernels/cuda/eviction_rule.h"
#include "memory/eviction_policy.h"

namespace heavykv {
namespace {

std::set<int32_t> RuleVictims(const EvictRule& rule, const HeadSlots& slots, int32_t newest,
                              int32_t num_evict) {
  std::vector<std::pair<uint64_t, int32_t>> keys;
  for (size_t i = 0; i < slots.pos.size(); ++i) {
    const float score = slots.score.empty() ? 0.0f : slots.score[i];
    keys.push_back({cuda::EvictionKey(rule.kind, rule.param, newest, slots.pos[i], score),
                    static_cast<int32_t>(i)});
  }
  std::sort(keys.begin(), keys.end());
  std::set<int32_t> out;
  for (int32_t i = 0; i < num_evict && keys[i].first != cuda::kNotCandidate; ++i) {
    out.insert(keys[i].second);
  }
  return out;
}

struct Case {
  const char* policy;
  double recent_fraction;
};

TEST(EvictionRuleTest, SameVictimsAsTheCpuPolicies) {
  std::mt19937 rng(7);
  // tova, scissorhands and knorm have no GPU rule (their channels are CPU-only), but their
  // VictimRule must still be the key order the GPU would apply to the same channel.
  const Case cases[] = {{"window", 0.5},       {"sink", 0.5},         {"h2o", 0.5},
                        {"h2o", 0.25},         {"h2o", 0.2},          {"h2o", 1.0},
                        {"h2o", 0.01},         {"tova", 0.5},         {"knorm", 0.5},
                        {"scissorhands", 0.5}, {"scissorhands", 0.2}, {"snapkv", 0.5}};
  int compared = 0;
  for (const Case& c : cases) {
    auto policy = *MakePolicy(c.policy, c.recent_fraction);
    for (int32_t budget : {1, 2, 3, 5, 8, 16, 51, 100}) {
      for (int32_t extra : {1, 2, 7, 33}) {
        for (int trial = 0; trial < 6; ++trial) {
          const int32_t held = budget + extra;
          // Distinct positions: the newest `held` tokens of a longer sequence, some older ones
          // already evicted (replaced by older survivors), in a shuffled slot order.
          const int32_t newest = held + static_cast<int32_t>(rng() % 50);
          std::vector<int32_t> all(newest + 1);
          std::iota(all.begin(), all.end(), 0);
          std::shuffle(all.begin(), all.end() - extra, rng);
          std::vector<int32_t> pos(all.begin(), all.begin() + (held - extra));
          pos.insert(pos.end(), all.end() - extra, all.end());
          std::shuffle(pos.begin(), pos.end(), rng);
          std::vector<float> score(held);
          for (float& s : score) s = (trial % 2) ? float(rng() % 4) * 0.25f : float(rng() % 1000) / 7.0f;
          HeadSlots slots{pos, {}};
          if (policy->needs_scores()) slots.score = score;
          std::vector<int32_t> victims;
          policy->ChooseVictims(slots, budget, newest, extra, &victims);  // a decode step
          if (static_cast<int32_t>(victims.size()) != extra) continue;  // CPU would abort
          const VictimRule vr = policy->Rule(budget);
          const EvictRule rule{vr.kind, vr.param};
          if (policy->GpuRule(budget).has_value()) {
            absl::StatusOr<EvictRule> gpu = EvictRuleFor(policy.get(), budget);
            ASSERT_TRUE(gpu.ok()) << gpu.status();
            EXPECT_EQ(gpu->kind, rule.kind);
            EXPECT_EQ(gpu->param, rule.param);
          }
          EXPECT_EQ(RuleVictims(rule, slots, newest, extra),
                    std::set<int32_t>(victims.begin(), victims.end()))
              << c.policy << " rf " << c.recent_fraction << " budget " << budget << " held "
              << held;
          ++compared;
        }
      }
    }
  }
  EXPECT_GT(compared, 1000);
}

TEST(EvictionRuleTest, RuleParametersMatchThePolicies) {
  auto h2o_default = *MakePolicy("h2o");
  for (double rf : {0.01, 0.2, 0.25, 0.29, 0.5, 0.7, 1.0}) {
    auto h2o = *MakePolicy("h2o", rf);
    for (int32_t budget : {1, 2, 3, 10, 51, 100, 819, 4096, 100000}) {
      absl::StatusOr<EvictRule> r = EvictRuleFor(h2o.get(), budget);
      ASSERT_TRUE(r.ok());
      EXPECT_EQ(r->kind, cuda::kEvictLowestScore);
      EXPECT_EQ(r->param, static_cast<int32_t>(std::floor(budget * rf))) << rf << " " << budget;
    }
  }
  auto sink = *MakePolicy("sink");
  EXPECT_EQ(EvictRuleFor(sink.get(), 1)->param, 0);
  EXPECT_EQ(EvictRuleFor(sink.get(), 3)->param, 2);
  EXPECT_EQ(EvictRuleFor(sink.get(), 100)->param, kNumSinkTokens);
  auto window = *MakePolicy("window");
  EXPECT_EQ(EvictRuleFor(window.get(), 10)->kind, cuda::kEvictOldest);
  EXPECT_EQ(EvictRuleFor(window.get(), 10)->param, 0);
  EXPECT_EQ(EvictRuleFor(nullptr, 10)->kind, cuda::kEvictNone);
  EXPECT_EQ(EvictRuleFor(window.get(), kUnboundedBudget)->kind, cuda::kEvictNone);

  // A policy whose channel the GPU does not write, or whose choice is not its rule, is refused.
  for (const char* name : {"tova", "scissorhands", "knorm", "snapkv", "snapkv:decode=window"}) {
    auto p = *MakePolicy(name);
    EXPECT_EQ(EvictRuleFor(p.get(), 10).status().code(), absl::StatusCode::kUnimplemented) << name;
    EXPECT_EQ(CheckGpuPolicy(p.get()).code(), absl::StatusCode::kUnimplemented) << name;
    EXPECT_NE(CheckGpuPolicy(p.get()).message().find(p->name()), std::string::npos);
  }
  // MiKV's demoted store is CPU only: refused naming the option.
  auto demoting = *MakePolicy("h2o:demote=int4");
  EXPECT_EQ(EvictRuleFor(demoting.get(), 10).status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(CheckGpuPolicy(demoting.get()).message().find("demote="), std::string::npos);
  EXPECT_TRUE(CheckGpuPolicy(nullptr).ok());
  EXPECT_TRUE(CheckGpuPolicy(h2o_default.get()).ok());
}

TEST(StepLayoutTest, PacksBlockTablesCountsAndLogitRows) {
  auto h2o = *MakePolicy("h2o", 0.5);
  SequenceKv a, b;
  a.tables = {KvTable{{7, 3}, 20}};  // block size 16: 2 pages cover 20 + 1
  a.policy = h2o.get();
  a.budget = 16;
  b.tables = {KvTable{{5}, 0}};
  const std::vector<int32_t> ta = {42}, tb = {1, 2, 3};
  const SequenceStep steps[] = {{&a, ta, 20, false}, {&b, tb, 0, true}};
  const EvictRule rules[] = {*EvictRuleFor(h2o.get(), 16), EvictRule{}};
  StepLayout L;
  ASSERT_TRUE(BuildStepLayout(steps, rules, 16, &L).ok());
  const int32_t* d = L.data.data();
  EXPECT_EQ(L.num_seqs, 2);
  EXPECT_EQ(L.num_tokens, 4);
  EXPECT_EQ(L.num_rows, 4);  // a: its last token; b: all three
  EXPECT_EQ(L.max_held, 21);
  EXPECT_TRUE(L.any_scores);
  EXPECT_EQ(std::vector<int32_t>(d + L.page_indptr, d + L.page_indptr + 3),
            (std::vector<int32_t>{0, 2, 3}));
  EXPECT_EQ(std::vector<int32_t>(d + L.page_ids, d + L.page_ids + 3),
            (std::vector<int32_t>{7, 3, 5}));
  EXPECT_EQ(std::vector<int32_t>(d + L.token_seq, d + L.token_seq + 4),
            (std::vector<int32_t>{0, 1, 1, 1}));
  EXPECT_EQ(std::vector<int32_t>(d + L.token_pos, d + L.token_pos + 4),
            (std::vector<int32_t>{20, 0, 1, 2}));
  EXPECT_EQ(std::vector<int32_t>(d + L.tokens, d + L.tokens + 4),
            (std::vector<int32_t>{42, 1, 2, 3}));
  EXPECT_EQ(std::vector<int32_t>(d + L.logit_rows, d + L.logit_rows + 4),
            (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(d[L.num_old], 20);
  EXPECT_EQ(d[L.num_new + 1], 3);
  EXPECT_EQ(d[L.token_begin + 1], 1);
  EXPECT_EQ(d[L.accumulate], 1);
  EXPECT_EQ(d[L.accumulate + 1], 0);
  EXPECT_EQ(d[L.budget], 16);
  EXPECT_EQ(d[L.evict_kind], cuda::kEvictLowestScore);
  EXPECT_EQ(d[L.evict_param], 8);
  EXPECT_EQ(d[L.evict_kind + 1], cuda::kEvictNone);

  a.tables[0].pages = {7};  // not reserved for the new token
  EXPECT_EQ(BuildStepLayout(steps, rules, 16, &L).code(), absl::StatusCode::kInternal);
}

TEST(DeviceTest, CudaRunnerNeedsADeviceAndAnExternalCache) {
  EXPECT_TRUE(BuiltWithCuda());
  EXPECT_EQ(CheckDevice(Device::kCuda).ok(), HasCudaDevice());
  EXPECT_EQ(ParseDevice("tpu").status().code(), absl::StatusCode::kInvalidArgument);
  ModelConfig c;
  c.dim = 64;
  c.hidden_dim = 96;
  c.num_layers = 1;
  c.num_heads = 8;
  c.num_kv_heads = 2;
  c.vocab_size = 10;
  c.seq_len = 8;
  EXPECT_EQ(KvShapeForDevice(Device::kCuda, c, 16).element_bytes, 2);
  EXPECT_EQ(KvShapeForDevice(Device::kCpu, c, 16).element_bytes, 4);
  // --kv-dtype: auto is fp32 on the CPU and bf16 on CUDA; bf16 works on both, fp32 only on the
  // CPU; anything else is INVALID_ARGUMENT.
  EXPECT_EQ(KvShapeForDevice(Device::kCpu, c, 16, KvDtype::kBf16).element_bytes, 2);
  EXPECT_EQ(KvShapeForDevice(Device::kCpu, c, 16, KvDtype::kFp32).element_bytes, 4);
  EXPECT_EQ(KvShapeForDevice(Device::kCuda, c, 16, KvDtype::kAuto).element_bytes, 2);
  EXPECT_EQ(*ParseKvDtype("bf16"), KvDtype::kBf16);
  EXPECT_EQ(*ParseKvDtype("auto"), KvDtype::kAuto);
  EXPECT_EQ(ParseKvDtype("fp16").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckKvDtype(Device::kCpu, KvDtype::kBf16).ok());
  EXPECT_TRUE(CheckKvDtype(Device::kCuda, KvDtype::kBf16).ok());
  EXPECT_EQ(CheckKvDtype(Device::kCuda, KvDtype::kFp32).code(), absl::StatusCode::kInvalidArgument);
  // A host cache cannot back the CUDA runner, nor an external one the CPU runner.
  auto host = *KvCache::Create(KvShapeFor(c, 16), 4);
  Model m;
  m.config = c;
  if (!HasCudaDevice()) {
    EXPECT_EQ(MakeStepRunner(Device::kCuda, m, host.get()).status().code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(CreateKvCache(Device::kCuda, KvShapeForDevice(Device::kCuda, c, 16), 4)
                  .status()
                  .code(),
              absl::StatusCode::kFailedPrecondition);
  } else {
    EXPECT_EQ(MakeStepRunner(Device::kCuda, m, host.get()).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  auto external = *KvCache::Create(KvShapeForDevice(Device::kCuda, c, 16), 4, KvStorage::kExternal);
  EXPECT_EQ(MakeStepRunner(Device::kCpu, m, external.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(KvCache::Create(KvShapeForDevice(Device::kCuda, c, 16), 4).ok());  // host bf16
  KvShape odd = KvShapeFor(c, 16);
  odd.element_bytes = 3;
  EXPECT_EQ(KvCache::Create(odd, 4).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace heavykv
