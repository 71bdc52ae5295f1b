// Page granularity (granularity=page, EvictGranularity::kPage): a head grows to a page over its
// budget and then drops whole pages of its least important tokens at once.
//
// Checked against references written here, as the contract in docs/ARCHITECTURE.md
// ("Page granularity") reads:
//   - ChoosePageVictims: among the full pages (slots [k*B, (k+1)*B)) none of whose slots the
//     policy's rule protects, the lowest by aggregate (kLowestChannel: the sum of the channel;
//     kOldest: the newest position), ties the older page (lowest oldest position) first; with too
//     few such pages, the token rule (ChooseVictims).
//   - KvCache: after a step a head keeps budget + (held - budget) mod B tokens (KeptAfterStep);
//     the victims' holes below that are filled, in slot order, by the survivors above it, in slot
//     order. The reference simulates each head's slot array that way, and every slot's position,
//     score and K/V rows must match it after every step.
//   - Specs: granularity=token|page on every policy but full; PinnedPrefix and GpuRule refuse it.
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/paged_kv.h"
#include "memory/eviction_policy.h"
#include "memory/kv_cache.h"
#include "tests/memory/policy_test_util.h"

namespace heavykv {
namespace {

// The policy of `spec` at page granularity.
std::unique_ptr<EvictionPolicy> Policy(absl::string_view spec, double recent_fraction = 0.5) {
  return testing::Policy(spec, recent_fraction, EvictGranularity::kPage);
}

// The reference page choice: `want` pages of `block` slots from pos/score (slot order).
// Returns the victim slots, sorted, or nothing when fewer than `want` pages qualify.
std::vector<int32_t> ReferencePages(const std::vector<int32_t>& pos,
                                    const std::vector<float>& score, const VictimRule& rule,
                                    int32_t newest, int32_t block, int32_t want) {
  struct Cand {
    double key;
    int32_t oldest;
    int32_t page;
  };
  std::vector<Cand> cands;
  const int32_t full_pages = static_cast<int32_t>(pos.size()) / block;
  for (int32_t k = 0; k < full_pages; ++k) {
    bool ok = true;
    double sum = 0;
    int32_t oldest = INT32_MAX, newest_in = INT32_MIN;
    for (int32_t s = k * block; s < (k + 1) * block; ++s) {
      if (rule.kind == VictimRule::kOldest && pos[s] < rule.param) ok = false;
      if (rule.kind == VictimRule::kLowestChannel && pos[s] > newest - rule.param) ok = false;
      sum += score[s];
      oldest = std::min(oldest, pos[s]);
      newest_in = std::max(newest_in, pos[s]);
    }
    if (ok) cands.push_back({rule.kind == VictimRule::kOldest ? newest_in : sum, oldest, k});
  }
  if (static_cast<int32_t>(cands.size()) < want) return {};
  std::sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) {
    return a.key != b.key ? a.key < b.key : a.oldest < b.oldest;
  });
  std::vector<int32_t> out;
  for (int32_t i = 0; i < want; ++i) {
    for (int32_t s = 0; s < block; ++s) out.push_back(cands[i].page * block + s);
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(PageGranularityTest, ChoosesWholePagesByAggregate) {
  // Block 4, budget 8, 12 held (positions 0..11 in order), h2o with 2 recent tokens.
  std::unique_ptr<EvictionPolicy> h2o = Policy("h2o", 0.25);
  std::vector<int32_t> pos(12);
  std::iota(pos.begin(), pos.end(), 0);
  // Page 0 sums 10, page 1 sums 2 (one heavy hitter would not save it: 0+0+0+2), page 2 holds
  // the protected recent tokens 10 and 11 and the lowest slots of all.
  const std::vector<float> score = {1, 2, 3, 4, 0, 0, 0, 2, 0, 0, 0, 0};
  std::vector<int32_t> victims;
  h2o->ChoosePageVictims(HeadSlots{pos, score}, EvictionStep{8, 11, 4, 1}, 4, &victims);
  std::sort(victims.begin(), victims.end());
  EXPECT_EQ(victims, (std::vector<int32_t>{4, 5, 6, 7}));
  // The token rule would take the four lowest tokens instead, across pages.
  victims.clear();
  h2o->ChooseVictims(HeadSlots{pos, score}, EvictionStep{8, 11, 4, 1}, &victims);
  std::sort(victims.begin(), victims.end());
  EXPECT_EQ(victims, (std::vector<int32_t>{4, 5, 6, 8}));

  // window (kOldest): the page whose newest token is oldest, wherever it sits in the table.
  std::unique_ptr<EvictionPolicy> window = Policy("window");
  const std::vector<int32_t> shuffled = {8, 9, 10, 11, 0, 1, 2, 3, 4, 5, 6, 7};
  victims.clear();
  window->ChoosePageVictims(HeadSlots{shuffled, {}}, EvictionStep{8, 11, 4, 1}, 4, &victims);
  std::sort(victims.begin(), victims.end());
  EXPECT_EQ(victims, (std::vector<int32_t>{4, 5, 6, 7}));
  // sink: the page holding positions 0..3 is pinned, so the next oldest page goes.
  std::unique_ptr<EvictionPolicy> sink = Policy("sink");
  victims.clear();
  sink->ChoosePageVictims(HeadSlots{shuffled, {}}, EvictionStep{8, 11, 4, 1}, 4, &victims);
  std::sort(victims.begin(), victims.end());
  EXPECT_EQ(victims, (std::vector<int32_t>{8, 9, 10, 11}));
}

TEST(PageGranularityTest, FallsBackToTheTokenRuleWithoutAWholeCandidatePage) {
  // Every page holds one of the 3 protected newest tokens (h2o, recent 3 of budget 8 at 0.4):
  // no page qualifies, so the four lowest unprotected tokens go, as at token granularity.
  std::unique_ptr<EvictionPolicy> h2o = Policy("h2o", 0.4);
  const std::vector<int32_t> pos = {11, 0, 1, 2, 10, 3, 4, 5, 9, 6, 7, 8};
  const std::vector<float> score = {0, 5, 1, 6, 0, 2, 7, 3, 0, 8, 4, 9};
  std::vector<int32_t> paged, token;
  h2o->ChoosePageVictims(HeadSlots{pos, score}, EvictionStep{8, 11, 4, 1}, 4, &paged);
  h2o->ChooseVictims(HeadSlots{pos, score}, EvictionStep{8, 11, 4, 1}, &token);
  std::sort(paged.begin(), paged.end());
  std::sort(token.begin(), token.end());
  EXPECT_EQ(paged, token);
  EXPECT_EQ(paged, (std::vector<int32_t>{2, 5, 7, 10}));
}

TEST(PageGranularityTest, RandomMatchesReference) {
  std::mt19937 rng(17);
  const char* specs[] = {"h2o", "tova", "knorm", "scissorhands", "window", "sink",
                         "snapkv:decode=window"};
  int fallbacks = 0, paged = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const char* spec = specs[trial % 7];
    const double rf = std::uniform_real_distribution<double>(0.05, 1.0)(rng);
    std::unique_ptr<EvictionPolicy> policy = Policy(spec, rf);
    const int32_t block = 1 + static_cast<int32_t>(rng() % 8);
    const int32_t budget = 1 + static_cast<int32_t>(rng() % 40);
    const int32_t pages_over = 1 + static_cast<int32_t>(rng() % 3);
    const int32_t extra = static_cast<int32_t>(rng() % block);
    const int32_t held = budget + pages_over * block + extra;
    std::vector<int32_t> pos(held);
    std::iota(pos.begin(), pos.end(), static_cast<int32_t>(rng() % 5));
    std::shuffle(pos.begin(), pos.end(), rng);
    std::vector<float> score(held);
    for (float& s : score) s = static_cast<float>(rng() % 6);  // small integers: ties
    const int32_t newest = *std::max_element(pos.begin(), pos.end());
    const EvictionStep step{budget, newest, pages_over * block, 1};
    std::vector<int32_t> victims;
    policy->ChoosePageVictims(HeadSlots{pos, score}, step, block, &victims);
    std::sort(victims.begin(), victims.end());
    SCOPED_TRACE(::testing::Message() << spec << " rf " << rf << " block " << block << " budget "
                                    << budget << " held " << held);
    std::vector<int32_t> want =
        ReferencePages(pos, score, policy->Rule(budget), newest, block, pages_over);
    if (want.empty()) {  // the token rule
      ++fallbacks;
      policy->ChooseVictims(HeadSlots{pos, score}, step, &want);
      std::sort(want.begin(), want.end());
    } else {
      ++paged;
    }
    ASSERT_EQ(victims, want);
  }
  EXPECT_GT(paged, 1000);
  EXPECT_GT(fallbacks, 10);
}

// ---------------------------------------------------------------------------------------------
// KvCache at page granularity, against a slot-order reference.

float KValue(int32_t layer, int32_t head, int32_t pos, int32_t d) {
  const uint32_t id = (uint32_t(layer) * 16 + uint32_t(head)) * 4096 + uint32_t(pos);
  return static_cast<float>((id >> (8 * d)) & 0xFF);
}

struct Slot {
  int32_t pos;
  float score;
};

// Removes `victims` (slot indices) from `slots`, keeping `keep` = size - victims: holes below
// `keep`, in slot order, take the survivors at or above it, in slot order.
void ReferenceCompact(std::vector<Slot>& slots, const std::set<int32_t>& victims) {
  const int32_t keep = static_cast<int32_t>(slots.size() - victims.size());
  std::vector<int32_t> holes, movers;
  for (int32_t s = 0; s < static_cast<int32_t>(slots.size()); ++s) {
    if (s < keep && victims.count(s)) holes.push_back(s);
    if (s >= keep && !victims.count(s)) movers.push_back(s);
  }
  ASSERT_EQ(holes.size(), movers.size());
  for (size_t i = 0; i < holes.size(); ++i) slots[holes[i]] = slots[movers[i]];
  slots.resize(keep);
}

class PageCacheTest : public ::testing::TestWithParam<const char*> {};

TEST_P(PageCacheTest, MatchesSlotReferenceAndAdmissionPeak) {
  KvShape shape;
  shape.num_layers = 2;
  shape.num_kv_heads = 2;
  shape.head_dim = 4;
  shape.block_size = 4;
  const int32_t B = shape.block_size;
  std::unique_ptr<EvictionPolicy> policy = Policy(GetParam(), 0.5);
  for (int32_t budget : {1, 3, 4, 6, 9, 16}) {
    for (bool chunked : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "budget " << budget << (chunked ? " chunked" : ""));
      constexpr int32_t kLength = 80, kMaxChunk = 6;
      // Decode: exactly the pages admission counts (PeakDecodeSlots); chunks: a chunk more.
      const int64_t peak = PeakDecodeSlots(policy.get(), budget, B) + (chunked ? kMaxChunk : 0);
      ASSERT_EQ(PeakDecodeSlots(policy.get(), budget, B), budget + B);
      std::unique_ptr<KvCache> cache =
          *KvCache::Create(shape, static_cast<int32_t>((peak + B - 1) / B));
      SequenceKv kv;
      kv.policy = policy.get();
      kv.budget = budget;
      std::vector<std::vector<Slot>> ref(shape.num_layers * shape.num_kv_heads);
      std::mt19937 rng(budget * 7 + chunked);
      int32_t next = 0, evictions = 0;
      while (next < kLength) {
        int32_t n = chunked ? 1 + static_cast<int32_t>(rng() % kMaxChunk) : 1;
        n = std::min(n, kLength - next);
        ASSERT_TRUE(cache->Reserve(kv, n).ok()) << "at position " << next;
        const int32_t old = kv.Slots(0), held = old + n, newest = next + n - 1;
        for (int32_t l = 0; l < shape.num_layers; ++l) {
          for (int32_t h = 0; h < shape.num_kv_heads; ++h) {
            std::vector<Slot>& r = ref[l * shape.num_kv_heads + h];
            PagedKvHead v = cache->View(kv, l, h, held);
            for (int32_t i = 0; i < n; ++i) {
              float k[4], val[4];
              for (int32_t d = 0; d < 4; ++d) {
                k[d] = KValue(l, h, next + i, d);
                val[d] = -k[d];
              }
              v.StoreRows(old + i, k, val);
              v.Pos(old + i) = next + i;
              v.Score(old + i) = 0;
              r.push_back({next + i, 0});
            }
            for (int32_t s = 0; s < held; ++s) {  // scripted attention, different per head
              const float add = static_cast<float>((v.Pos(s) * 7 + l * 3 + h * 5 + next) % 4);
              v.Score(s) += add;
              r[s].score += add;
            }
            // The reference's victims: whole pages when it is a page or more over the budget.
            const int32_t keep =
                held <= budget ? held : budget + (held - budget) % B;
            if (keep < held) {
              std::vector<int32_t> pos(held);
              std::vector<float> score(held);
              for (int32_t s = 0; s < held; ++s) {
                pos[s] = r[s].pos;
                score[s] = r[s].score;
              }
              // snapkv's prefill selection is its own (policy_zoo_test checks it).
              const bool own_choice = std::string(GetParam()) == "snapkv" && n > 1;
              std::vector<int32_t> want;
              if (!own_choice) {
                want = ReferencePages(pos, score, policy->Rule(budget), newest, B,
                                      (held - keep) / B);
              }
              if (want.empty()) {
                policy->ChooseVictims(HeadSlots{pos, score},
                                      EvictionStep{budget, newest, held - keep, n}, &want);
              }
              ReferenceCompact(r, std::set<int32_t>(want.begin(), want.end()));
            }
            cache->EvictHead(kv, l, h, held, newest, n);
          }
        }
        if (KeptAfterStep(kv, 0, held, B) < held) ++evictions;
        cache->CommitStep(kv, n);
        next += n;
        ASSERT_EQ(kv.Slots(0), KeptAfterStep(policy.get(), budget, next, B));
        ASSERT_LT(kv.Slots(0), budget + B);
        ASSERT_EQ(kv.tokens_evicted, next - kv.Slots(0));
        ASSERT_EQ(kv.tokens_evicted % B, 0);
        for (int32_t l = 0; l < shape.num_layers; ++l) {
          for (int32_t h = 0; h < shape.num_kv_heads; ++h) {
            const std::vector<Slot>& r = ref[l * shape.num_kv_heads + h];
            ASSERT_EQ(static_cast<int32_t>(r.size()), kv.Slots(l));
            PagedKvHead v = cache->View(kv, l, h, kv.Slots(l));
            for (int32_t s = 0; s < kv.Slots(l); ++s) {
              ASSERT_EQ(v.Pos(s), r[s].pos) << "layer " << l << " head " << h << " slot " << s;
              ASSERT_EQ(v.Score(s), r[s].score) << "slot " << s;
              for (int32_t d = 0; d < 4; ++d) {
                ASSERT_EQ(v.KAt(s, d), KValue(l, h, r[s].pos, d)) << "slot " << s;
                ASSERT_EQ(v.VAt(s, d), -KValue(l, h, r[s].pos, d)) << "slot " << s;
              }
            }
          }
        }
      }
      if (!chunked && budget + B < kLength) {  // decode evicts once per B steps
        EXPECT_EQ(evictions, (kLength - budget) / B);
      }
      cache->Release(kv);
      EXPECT_EQ(cache->allocator().num_pages_used(), 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, PageCacheTest,
                         ::testing::Values("h2o", "tova", "knorm", "window", "sink",
                                         "scissorhands", "snapkv"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

// ---------------------------------------------------------------------------------------------
// Specs.

TEST(PageGranularitySpecTest, EveryPolicyButFullTakesIt) {
  for (const char* spec : {"window", "sink", "h2o", "tova", "knorm", "scissorhands", "snapkv"}) {
    for (const char* suffix : {":granularity=page", ":granularity=token"}) {
      const std::string s = absl::StrCat(spec, suffix);
      absl::StatusOr<std::unique_ptr<EvictionPolicy>> p = MakePolicy(s);
      ASSERT_TRUE(p.ok()) << s << ": " << p.status();
      EXPECT_EQ((*p)->page_granularity(), std::string(suffix) == ":granularity=page") << s;
      EXPECT_EQ((*p)->name(), spec);
    }
    // The default comes from the caller (serve/eval/run --evict-granularity) unless named.
    EXPECT_TRUE((*MakePolicy(spec, 0.5, EvictGranularity::kPage))->page_granularity());
    EXPECT_FALSE((*MakePolicy(absl::StrCat(spec, ":granularity=token"), 0.5,
                              EvictGranularity::kPage))->page_granularity());
  }
  // Its parameters stay with the others, in any order.
  std::unique_ptr<EvictionPolicy> snap = *MakePolicy("snapkv:granularity=page:window=8:kernel=3");
  EXPECT_TRUE(snap->page_granularity());
  EXPECT_EQ(snap->channel().window, 8);
  for (const char* bad : {"full:granularity=page", "h2o:granularity=block", "h2o:granularity",
                          "h2o:granularity=page:granularity=token",
                          "window:granularity=page:x=1"}) {
    std::string error;
    EXPECT_FALSE(ValidPolicySpec(bad, &error)) << bad;
    EXPECT_FALSE(error.empty()) << bad;
  }
  EXPECT_EQ(SpecWithDefaults("h2o", EvictGranularity::kPage), "h2o:granularity=page");
  EXPECT_EQ(SpecWithDefaults("h2o", EvictGranularity::kToken), "h2o");
  EXPECT_EQ(SpecWithDefaults("full", EvictGranularity::kPage), "full");
  EXPECT_EQ(SpecWithDefaults("h2o:granularity=token", EvictGranularity::kPage),
            "h2o:granularity=token");
  EXPECT_FALSE(ParseEvictGranularity("pages").ok());
}

TEST(PageGranularitySpecTest, NoStreamingPastTheContextNorAGpuRule) {
  // A page-granular head holds up to a page over its budget, which the endless-stream position
  // arithmetic and the GPU's one-victim kernel do not cover.
  std::unique_ptr<EvictionPolicy> window = *MakePolicy("window:granularity=page");
  std::unique_ptr<EvictionPolicy> sink = *MakePolicy("sink:granularity=page");
  std::unique_ptr<EvictionPolicy> h2o = *MakePolicy("h2o:granularity=page");
  EXPECT_FALSE(window->PinnedPrefix(64).has_value());
  EXPECT_FALSE(sink->PinnedPrefix(64).has_value());
  EXPECT_FALSE(h2o->GpuRule(64).has_value());
  EXPECT_TRUE((*MakePolicy("h2o"))->GpuRule(64).has_value());
  SequenceKv seq;
  seq.policy = sink.get();
  seq.budget = 64;
  EXPECT_FALSE(StreamsPastContext(seq, 1, 512));
}

}  // namespace
}  // namespace heavykv
