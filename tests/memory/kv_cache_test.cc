// KvCache tests: full decode/prefill sequences driven like the model runner drives them, checked
// after every step against an independent reference simulation of the policies (one plain vector
// of (position, score) per head); a multi-sequence stress run on a small pool; Reserve's
// all-or-nothing contract; Create's argument checks.
//
// Every K/V row written encodes (layer, head, position), so after any compaction a slot's rows
// must still match the position in its Pos() entry, and its Score() the reference's score.
#include "memory/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/paged_kv.h"
#include "memory/eviction_policy.h"

namespace heavykv {
namespace {

KvShape TinyShape() {
  KvShape s;
  s.num_layers = 2;
  s.num_kv_heads = 2;
  s.head_dim = 4;
  s.block_size = 4;
  return s;
}

int32_t CeilDiv(int64_t a, int64_t b) { return static_cast<int32_t>((a + b - 1) / b); }

// Row contents for (layer, head, position): element d is byte d of a unique id, an integer
// below 256 that fp32 and bf16 both hold exactly, so a row is checkable in either storage.
float KValue(int32_t layer, int32_t head, int32_t pos, int32_t d) {
  const uint32_t id = (uint32_t(layer) * 16 + uint32_t(head)) * 4096 + uint32_t(pos);
  return static_cast<float>((id >> (8 * d)) & 0xFF);
}
float VValue(int32_t layer, int32_t head, int32_t pos, int32_t d) {
  return -KValue(layer, head, pos, d) - 0.5f;
}

// Scripted attention mass that (layer, head) gives the token at `pos` at `step`: small integers
// (exact sums, plenty of ties), different for every head so heads keep different tokens.
float ScoreIncrement(uint32_t salt, int32_t step, int32_t layer, int32_t head, int32_t pos) {
  uint32_t x = salt * 0x9e3779b9u ^ static_cast<uint32_t>(step) * 73856093u ^
               static_cast<uint32_t>(pos) * 19349663u ^
               static_cast<uint32_t>(layer * 8 + head + 1) * 83492791u;
  x ^= x >> 13;
  x *= 0x5bd1e995u;
  x ^= x >> 15;
  return static_cast<float>(x % 5);
}

struct Tok {
  int32_t pos;
  float score;
};

// The reference: what each policy keeps, written as directly as the definitions read. `toks` is in
// position order (tokens are appended in order and erase keeps it).
void ReferenceEvict(absl::string_view policy, int32_t budget, double recent_fraction,
                    std::vector<Tok>& toks) {
  if (policy == "full") return;
  const int32_t held = static_cast<int32_t>(toks.size());
  if (held <= budget) return;
  if (policy == "window") {
    toks.erase(toks.begin(), toks.begin() + (held - budget));  // the oldest go
  } else if (policy == "sink") {
    // Positions 0..3 stay (budget - 1 of them for budgets under 5, so the newest token stays).
    const int32_t sinks = std::max(0, std::min(kNumSinkTokens, budget - 1));
    toks.erase(toks.begin() + sinks, toks.begin() + sinks + (held - budget));
  } else {
    ASSERT_EQ(policy, "h2o");
    // The `recent` newest tokens are untouchable; among the others, evict the lowest score one
    // at a time, the older one on a tie.
    const int32_t recent = static_cast<int32_t>(std::floor(budget * recent_fraction));
    for (int32_t e = 0; e < held - budget; ++e) {
      const int32_t candidates = static_cast<int32_t>(toks.size()) - recent;
      ASSERT_GT(candidates, 0);
      int32_t worst = 0;
      for (int32_t i = 1; i < candidates; ++i) {
        if (toks[i].score < toks[worst].score) worst = i;  // strict: keeps the older on ties
      }
      toks.erase(toks.begin() + worst);
    }
  }
}

// One sequence driven step by step, with its reference state.
struct SimSeq {
  SequenceKv kv;
  std::string policy;
  double recent_fraction = 0.5;
  int32_t length = 0;    // tokens to feed in total
  int32_t next_pos = 0;  // tokens fed so far
  int32_t step = 0;
  uint32_t salt = 0;
  std::vector<std::vector<Tok>> ref;  // [layer * num_kv_heads + head]
};

class Driver {
 public:
  explicit Driver(KvCache* cache) : cache_(cache) {}

  const EvictionPolicy* Policy(const std::string& name, double recent_fraction) {
    auto key = std::make_pair(name, recent_fraction);
    auto it = policies_.find(key);
    if (it == policies_.end()) {
      absl::StatusOr<std::unique_ptr<EvictionPolicy>> p = MakePolicy(name, recent_fraction);
      EXPECT_TRUE(p.ok()) << p.status();
      it = policies_.emplace(key, p.ok() ? *std::move(p) : nullptr).first;
    }
    return it->second.get();
  }

  void Init(SimSeq& s, const std::string& policy, int32_t budget, double recent_fraction,
            int32_t length, uint32_t salt) {
    const KvShape& sh = cache_->shape();
    s.kv = SequenceKv{};
    s.kv.policy = Policy(policy, recent_fraction);
    s.kv.budget = budget;
    s.policy = policy;
    s.recent_fraction = recent_fraction;
    s.length = length;
    s.next_pos = 0;
    s.step = 0;
    s.salt = salt;
    s.ref.assign(sh.num_layers * sh.num_kv_heads, {});
  }

  // One step of `n` tokens, as the model runner does it. Returns Reserve's status; on failure the
  // sequence is unchanged.
  absl::Status Step(SimSeq& s, int32_t n) {
    const KvShape& sh = cache_->shape();
    const int32_t old = s.kv.Slots(0);
    const int64_t pages_before = s.kv.NumPages();
    const int32_t used_before = cache_->allocator().num_pages_used();
    if (absl::Status st = cache_->Reserve(s.kv, n); !st.ok()) {
      EXPECT_EQ(s.kv.NumPages(), pages_before);
      EXPECT_EQ(cache_->allocator().num_pages_used(), used_before);
      return st;
    }
    const int32_t held = old + n;
    for (int32_t l = 0; l < sh.num_layers; ++l) {
      EXPECT_EQ(s.kv.Table(l).pages.size(), static_cast<size_t>(CeilDiv(held, sh.block_size)));
    }
    EXPECT_EQ(s.kv.NumPages(), int64_t(sh.NumTables()) * CeilDiv(held, sh.block_size));
    const int32_t newest = s.next_pos + n - 1;
    for (int32_t l = 0; l < sh.num_layers; ++l) {
      for (int32_t h = 0; h < sh.num_kv_heads; ++h) {
        PagedKvHead v = cache_->View(s.kv, l, h, held);
        EXPECT_EQ(v.num_slots, held);
        std::vector<Tok>& ref = s.ref[l * sh.num_kv_heads + h];
        for (int32_t i = 0; i < n; ++i) {
          const int32_t pos = s.next_pos + i;
          std::vector<float> k(sh.head_dim), val(sh.head_dim);
          for (int32_t d = 0; d < sh.head_dim; ++d) {
            k[d] = KValue(l, h, pos, d);
            val[d] = VValue(l, h, pos, d);
          }
          v.StoreRows(old + i, k.data(), val.data());
          v.Pos(old + i) = pos;
          v.Score(old + i) = 0.0f;
          ref.push_back({pos, 0.0f});
        }
        // "Attention": every held slot gets this step's mass, in the cache and the reference.
        for (int32_t slot = 0; slot < held; ++slot) {
          v.Score(slot) += ScoreIncrement(s.salt, s.step, l, h, v.Pos(slot));
        }
        for (Tok& t : ref) t.score += ScoreIncrement(s.salt, s.step, l, h, t.pos);
      }
    }
    for (int32_t l = 0; l < sh.num_layers; ++l) {
      for (int32_t h = 0; h < sh.num_kv_heads; ++h) {
        cache_->EvictHead(s.kv, l, h, held, newest);
        ReferenceEvict(s.policy, s.kv.budget, s.recent_fraction, s.ref[l * sh.num_kv_heads + h]);
      }
    }
    cache_->CommitStep(s.kv, n);
    s.next_pos += n;
    ++s.step;
    return absl::OkStatus();
  }

  // Everything that must hold between steps.
  testing::AssertionResult Check(const SimSeq& s) const {
    const KvShape& sh = cache_->shape();
    const int32_t expect_slots = std::min(s.next_pos, s.kv.budget);
    if (s.kv.Slots(0) != expect_slots) {
      return testing::AssertionFailure()
             << "num_slots " << s.kv.Slots(0) << ", expected " << expect_slots;
    }
    if (s.kv.Slots(0) > s.kv.budget) {
      return testing::AssertionFailure() << "over budget " << s.kv.budget;
    }
    if (s.kv.tokens_evicted != s.next_pos - s.kv.Slots(0)) {
      return testing::AssertionFailure() << "tokens_evicted " << s.kv.tokens_evicted;
    }
    if (static_cast<int32_t>(s.kv.tables.size()) != sh.NumTables()) {
      return testing::AssertionFailure() << s.kv.tables.size() << " tables";
    }
    for (const KvTable& table : s.kv.tables) {
      const int32_t pages = static_cast<int32_t>(table.pages.size());
      if (table.num_slots != s.kv.Slots(0)) {
        return testing::AssertionFailure() << "tables hold " << table.num_slots << " and "
                                           << s.kv.Slots(0) << " slots at a uniform budget";
      }
      if (pages != CeilDiv(table.num_slots, sh.block_size)) {
        return testing::AssertionFailure() << pages << " pages for " << table.num_slots << " slots";
      }
      if (s.kv.budget != kUnboundedBudget && pages > CeilDiv(s.kv.budget, sh.block_size)) {
        return testing::AssertionFailure() << pages << " pages over budget " << s.kv.budget;
      }
      for (int32_t p : table.pages) {
        if (!cache_->allocator().IsAllocated(p)) {
          return testing::AssertionFailure() << "page " << p << " in the table is not allocated";
        }
      }
    }
    for (int32_t l = 0; l < sh.num_layers; ++l) {
      for (int32_t h = 0; h < sh.num_kv_heads; ++h) {
        PagedKvHead v = cache_->View(s.kv, l, h, s.kv.Slots(0));
        std::map<int32_t, float> held;  // pos -> score
        for (int32_t slot = 0; slot < s.kv.Slots(0); ++slot) {
          const int32_t pos = v.Pos(slot);
          if (!held.emplace(pos, v.Score(slot)).second) {
            return testing::AssertionFailure()
                   << "layer " << l << " head " << h << " holds position " << pos << " twice";
          }
          // Quantized rows hold what quantizing the written row gives (exactly: the same
          // arithmetic), so a row moved without its scale shows.
          std::vector<float> want_k(sh.head_dim), want_v(sh.head_dim);
          for (int32_t d = 0; d < sh.head_dim; ++d) {
            want_k[d] = KValue(l, h, pos, d);
            want_v[d] = VValue(l, h, pos, d);
          }
          if (sh.quant != KvQuant::kNone) {
            std::vector<uint8_t> data(sh.head_dim), scale(2 * sh.head_dim);
            const bool rotates = KvRotates(sh.quant, sh.head_dim);  // stored as H x
            for (std::vector<float>* row : {&want_k, &want_v}) {
              if (rotates) HadamardRotate(row->data(), sh.head_dim);
              QuantizeKvRow(sh.quant, row->data(), sh.head_dim, data.data(), scale.data());
              DequantizeKvRow(sh.quant, data.data(), scale.data(), sh.head_dim, row->data());
              if (rotates) HadamardRotate(row->data(), sh.head_dim);
            }
          }
          for (int32_t d = 0; d < sh.head_dim; ++d) {
            if (v.KAt(slot, d) != want_k[d] || v.VAt(slot, d) != want_v[d]) {
              return testing::AssertionFailure()
                     << "layer " << l << " head " << h << " slot " << slot << " has pos " << pos
                     << " but K[" << d << "]=" << v.KAt(slot, d) << " V[" << d
                     << "]=" << v.VAt(slot, d);
            }
          }
        }
        std::map<int32_t, float> want;
        for (const Tok& t : s.ref[l * sh.num_kv_heads + h]) want.emplace(t.pos, t.score);
        if (held != want) {
          std::string got_s, want_s;
          for (auto& [p, sc] : held) absl::StrAppend(&got_s, " ", p, ":", sc);
          for (auto& [p, sc] : want) absl::StrAppend(&want_s, " ", p, ":", sc);
          return testing::AssertionFailure()
                 << "layer " << l << " head " << h << " holds {pos:score}" << got_s
                 << "\n  reference keeps " << want_s;
        }
      }
    }
    return testing::AssertionSuccess();
  }

 private:
  KvCache* cache_;
  std::map<std::pair<std::string, double>, std::unique_ptr<EvictionPolicy>> policies_;
};

std::unique_ptr<KvCache> MakeCache(const KvShape& shape, int32_t num_pages) {
  absl::StatusOr<std::unique_ptr<KvCache>> c = KvCache::Create(shape, num_pages);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

std::set<int32_t> KeptPositions(KvCache& cache, const SequenceKv& kv, int32_t layer, int32_t head) {
  PagedKvHead v = cache.View(kv, layer, head, kv.Slots(0));
  std::set<int32_t> s;
  for (int32_t slot = 0; slot < kv.Slots(0); ++slot) s.insert(v.Pos(slot));
  return s;
}

struct SimCase {
  std::string policy;
  int32_t budget;
  double recent_fraction;
  bool chunked;
};

void PrintTo(const SimCase& c, std::ostream* os) {
  *os << c.policy << " budget " << c.budget << " rf " << c.recent_fraction
      << (c.chunked ? " chunked" : " decode");
}

std::string CaseName(const SimCase& c) {
  return absl::StrCat(c.policy, "_b", c.budget, "_rf", static_cast<int>(c.recent_fraction * 100),
                      c.chunked ? "_chunked" : "_decode");
}

// (a) One sequence through a whole generation, checked after every step.
class KvCacheSimulationTest : public testing::TestWithParam<SimCase> {};

TEST_P(KvCacheSimulationTest, MatchesReferenceAfterEveryStep) {
  // fp32 and bf16 K/V (rows move with their tokens), one table for all layers (the CUDA layout)
  // and one per layer (the host layout).
  // Variants 4 and 5: int8 and int4 rows (quantized with their scales; host layout).
  for (int32_t variant = 0; variant < 6; ++variant) {
  const int32_t element_bytes = variant % 2 == 0 ? 4 : 2;
  const KvQuant quant =
      variant == 4 ? KvQuant::kInt8 : variant == 5 ? KvQuant::kInt4 : KvQuant::kNone;
  SCOPED_TRACE(quant == KvQuant::kInt8   ? "int8 K/V"
               : quant == KvQuant::kInt4 ? "int4 K/V"
               : element_bytes == 2      ? "bf16 K/V"
                                         : "fp32 K/V");
  SCOPED_TRACE(variant >= 2 ? "a table per layer" : "one table");
  const SimCase& c = GetParam();
  KvShape shape = TinyShape();
  shape.element_bytes = element_bytes;
  shape.quant = quant;
  shape.table_per_layer = variant >= 2;
  constexpr int32_t kLength = 90;
  constexpr int32_t kMaxChunk = 7;
  // Room for exactly one sequence at its peak (budget + a chunk): any page leak fails Reserve.
  const int32_t num_pages =
      shape.NumTables() * CeilDiv(std::min(c.budget, kLength) + kMaxChunk, shape.block_size);
  std::unique_ptr<KvCache> cache = MakeCache(shape, num_pages);
  ASSERT_NE(cache, nullptr);
  Driver driver(cache.get());
  for (uint32_t salt : {1u, 2u, 3u}) {
    SCOPED_TRACE(testing::Message() << "salt " << salt);
    SimSeq s;
    driver.Init(s, c.policy, c.budget, c.recent_fraction, kLength, salt);
    std::mt19937 rng(salt);
    bool heads_differed = false;
    while (s.next_pos < kLength) {
      int32_t n = 1;
      if (c.chunked) {
        n = 1 + static_cast<int32_t>(rng() % kMaxChunk);
        if (s.step % 5 == 4) n = 1;  // mix in single-token decode steps
      }
      n = std::min(n, kLength - s.next_pos);
      const absl::Status st = driver.Step(s, n);
      ASSERT_TRUE(st.ok()) << st << " at step " << s.step;
      ASSERT_TRUE(driver.Check(s)) << "after step " << s.step << " (" << s.next_pos << " tokens)";
      std::set<int32_t> first = KeptPositions(*cache, s.kv, 0, 0);
      for (int32_t l = 0; l < shape.num_layers; ++l) {
        for (int32_t h = 0; h < shape.num_kv_heads; ++h) {
          if (KeptPositions(*cache, s.kv, l, h) != first) heads_differed = true;
        }
      }
      EXPECT_LE(s.kv.peak_pages, num_pages);
    }
    // Position-based policies (and h2o with recent_fraction 1, a window) keep the same tokens in
    // every head; otherwise h2o's heads follow their own scores.
    if (c.policy != "h2o" || c.recent_fraction == 1.0) {
      EXPECT_FALSE(heads_differed);
    } else if (c.budget >= 4 && c.budget < kLength) {
      EXPECT_TRUE(heads_differed) << "scripted scores never made heads keep different tokens";
    }
    EXPECT_EQ(s.kv.tokens_evicted, kLength - std::min(kLength, c.budget));
    cache->Release(s.kv);
    EXPECT_EQ(cache->allocator().num_pages_used(), 0);
    EXPECT_TRUE(cache->allocator().CheckInvariants());
  }
  }
}

std::vector<SimCase> SimCases() {
  std::vector<SimCase> cases;
  for (bool chunked : {false, true}) {
    for (int32_t b : {1, 3, 4, 5, 8, 13, 16, 89, 90, 200})
      cases.push_back({"window", b, 0.5, chunked});
    for (int32_t b : {2, 5, 6, 8, 11, 16, 33}) cases.push_back({"sink", b, 0.5, chunked});
    for (int32_t b : {1, 2, 3, 5, 8, 13, 16, 30}) cases.push_back({"h2o", b, 0.5, chunked});
    for (int32_t b : {7, 12}) {
      for (double rf : {0.25, 1.0}) cases.push_back({"h2o", b, rf, chunked});
    }
    cases.push_back({"full", kUnboundedBudget, 0.5, chunked});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Policies, KvCacheSimulationTest, testing::ValuesIn(SimCases()),
                         [](const testing::TestParamInfo<SimCase>& info) {
                           return CaseName(info.param);
                         });

// The h2o simulation is only meaningful if h2o actually departs from a window somewhere.
TEST(KvCacheTest, H2oKeepsOldHeavyHittersAWindowWouldDrop) {
  std::unique_ptr<KvCache> cache = MakeCache(TinyShape(), 8);
  ASSERT_NE(cache, nullptr);
  Driver driver(cache.get());
  SimSeq s;
  driver.Init(s, "h2o", 8, 0.5, 40, 1);
  while (s.next_pos < 40) ASSERT_TRUE(driver.Step(s, 1).ok());
  ASSERT_TRUE(driver.Check(s));
  for (int32_t l = 0; l < 2; ++l) {
    for (int32_t h = 0; h < 2; ++h) {
      std::set<int32_t> kept = KeptPositions(*cache, s.kv, l, h);
      EXPECT_EQ(kept.size(), 8u);
      EXPECT_LT(*kept.begin(), 32) << "layer " << l << " head " << h << " kept only a window";
      for (int32_t p = 36; p < 40; ++p) EXPECT_TRUE(kept.count(p)) << p;  // floor(8/2) recent
    }
  }
  cache->Release(s.kv);
}

// (b) Many sequences of random policies, budgets, lengths and chunk sizes on one small pool.
TEST(KvCacheTest, StressManySequencesOnASmallPool) {
  const KvShape shape = TinyShape();
  constexpr int32_t kPages = 40;
  constexpr int32_t kMaxLength = 80;
  constexpr int32_t kMaxChunk = 7;
  constexpr int32_t kMaxActive = 8;
  constexpr int32_t kSequences = 3000;
  // The largest single sequence (whole-sequence budget) fits alone, so the loop always progresses.
  ASSERT_GE(kPages, CeilDiv(kMaxLength + kMaxChunk, shape.block_size));
  std::unique_ptr<KvCache> cache = MakeCache(shape, kPages);
  ASSERT_NE(cache, nullptr);
  Driver driver(cache.get());
  std::mt19937 rng(2024);
  const char* kPolicies[] = {"window", "sink", "h2o", "h2o", "full"};

  std::vector<std::unique_ptr<SimSeq>> active;
  int32_t started = 0, finished = 0, preempted = 0, exhausted = 0, steps = 0;
  auto check_pool = [&]() -> testing::AssertionResult {
    int32_t pages = 0;
    std::set<int32_t> owned;
    for (const auto& s : active) {
      pages += static_cast<int32_t>(s->kv.NumPages());
      for (const KvTable& table : s->kv.tables) {
        for (int32_t p : table.pages) {
          if (!owned.insert(p).second) {
            return testing::AssertionFailure() << "page " << p << " owned by two sequences";
          }
        }
      }
    }
    if (pages != cache->allocator().num_pages_used()) {
      return testing::AssertionFailure() << "sequences hold " << pages << " pages, allocator says "
                                         << cache->allocator().num_pages_used();
    }
    if (!cache->allocator().CheckInvariants()) return testing::AssertionFailure() << "allocator";
    return testing::AssertionSuccess();
  };

  while (finished + preempted < kSequences) {
    if (static_cast<int32_t>(active.size()) < kMaxActive && started < kSequences &&
        (active.empty() || rng() % 3 == 0)) {
      auto s = std::make_unique<SimSeq>();
      const std::string policy = kPolicies[rng() % 5];
      const int32_t length = 1 + static_cast<int32_t>(rng() % kMaxLength);
      std::string budget_text;
      if (rng() % 2 == 0) {
        budget_text = std::to_string(2 + rng() % 40);  // token count ("1" would mean 100%)
      } else {
        budget_text = absl::StrCat(static_cast<double>(1 + rng() % 100) / 100.0);
      }
      absl::StatusOr<KvBudget> kb = KvBudget::Parse(budget_text);
      ASSERT_TRUE(kb.ok()) << budget_text << ": " << kb.status();
      const int32_t budget = policy == "full" ? kUnboundedBudget : kb->Resolve(length);
      ASSERT_GE(budget, 1);
      if (kb->is_fraction && policy != "full") {
        ASSERT_LE(budget, length) << budget_text;
      }
      const double rf = policy == "h2o" ? (rng() % 2 ? 0.5 : 0.25 + (rng() % 4) * 0.25) : 0.5;
      driver.Init(*s, policy, budget, rf, length, static_cast<uint32_t>(rng()));
      active.push_back(std::move(s));
      ++started;
      continue;
    }
    const size_t i = rng() % active.size();
    SimSeq& s = *active[i];
    // The first step is a prompt of up to 3 chunks; then mostly decode, sometimes a chunk.
    int32_t n = s.next_pos == 0
                    ? 1 + static_cast<int32_t>(rng() % (3 * kMaxChunk))
                    : (rng() % 3 == 0 ? 1 + static_cast<int32_t>(rng() % kMaxChunk) : 1);
    n = std::min(n, s.length - s.next_pos);
    absl::Status st = driver.Step(s, n);
    bool self_preempted = false;
    while (!st.ok()) {
      ASSERT_TRUE(absl::IsResourceExhausted(st)) << st;
      ++exhausted;
      // Preempt a random sequence (possibly this one) and retry.
      const size_t victim = rng() % active.size();
      cache->Release(active[victim]->kv);
      EXPECT_EQ(active[victim]->kv.Slots(0), 0);
      EXPECT_TRUE(active[victim]->kv.tables.empty());
      ++preempted;
      if (active[victim].get() == &s) {
        self_preempted = true;
        active.erase(active.begin() + victim);
        break;
      }
      active.erase(active.begin() + victim);
      st = driver.Step(s, n);
    }
    if (self_preempted) continue;
    ++steps;
    ASSERT_TRUE(driver.Check(s)) << "policy " << s.policy << " budget " << s.kv.budget << " rf "
                                 << s.recent_fraction << " after " << s.next_pos << " tokens";
    if (steps % 64 == 0) {
      ASSERT_TRUE(check_pool());
    }
    if (s.next_pos == s.length) {
      const auto it =
          std::find_if(active.begin(), active.end(), [&](const auto& p) { return p.get() == &s; });
      cache->Release(s.kv);
      active.erase(it);
      ++finished;
    }
  }
  ASSERT_TRUE(check_pool());
  for (auto& s : active) cache->Release(s->kv);
  active.clear();
  EXPECT_EQ(cache->allocator().num_pages_used(), 0);
  EXPECT_EQ(cache->allocator().num_pages_free(), kPages);
  EXPECT_TRUE(cache->allocator().CheckInvariants());
  // The run exercised what it is meant to.
  EXPECT_GT(exhausted, 100);
  EXPECT_GT(finished, kSequences / 2);
  EXPECT_GT(steps, 10000);
}

// (c) Reserve allocates all the pages it needs or none.
TEST(KvCacheTest, ReserveIsAllOrNothing) {
  const KvShape shape = TinyShape();  // 4 slots per page
  std::unique_ptr<KvCache> cache = MakeCache(shape, 5);
  ASSERT_NE(cache, nullptr);
  SequenceKv a, b;
  ASSERT_TRUE(cache->Reserve(a, 8).ok());  // 2 pages
  cache->CommitStep(a, 8);
  EXPECT_EQ(a.NumPages(), 2);
  EXPECT_EQ(cache->allocator().num_pages_free(), 3);

  EXPECT_EQ(cache->PagesNeeded(b, 13), 4);
  absl::Status st = cache->Reserve(b, 13);  // needs 4 pages, 3 free
  EXPECT_TRUE(absl::IsResourceExhausted(st)) << st;
  EXPECT_TRUE(b.tables.empty());
  EXPECT_EQ(b.Slots(0), 0);
  EXPECT_EQ(b.peak_pages, 0);
  EXPECT_EQ(cache->allocator().num_pages_free(), 3);
  EXPECT_TRUE(cache->allocator().CheckInvariants());

  // a holds 8 slots on 2 pages; 13 more need 3 pages (ceil(21/4) = 6 > 2 + 3): also refused.
  EXPECT_EQ(cache->PagesNeeded(a, 13), 4);
  st = cache->Reserve(a, 13);
  EXPECT_TRUE(absl::IsResourceExhausted(st)) << st;
  EXPECT_EQ(a.NumPages(), 2);
  EXPECT_EQ(a.Slots(0), 8);
  EXPECT_EQ(cache->allocator().num_pages_free(), 3);

  // Exactly what is free succeeds and takes it all.
  EXPECT_EQ(cache->PagesNeeded(b, 12), 3);
  ASSERT_TRUE(cache->Reserve(b, 12).ok());
  EXPECT_EQ(b.NumPages(), 3);
  EXPECT_EQ(b.peak_pages, 3);
  EXPECT_EQ(cache->allocator().num_pages_free(), 0);

  // With the pool empty, growth within the last page needs no page and succeeds.
  cache->CommitStep(b, 9);  // 9 slots: 3 pages, room for 3 more
  EXPECT_EQ(b.NumPages(), 3);
  EXPECT_EQ(cache->PagesNeeded(b, 3), 0);
  EXPECT_TRUE(cache->Reserve(b, 3).ok());
  EXPECT_EQ(cache->PagesNeeded(b, 4), 1);
  EXPECT_TRUE(absl::IsResourceExhausted(cache->Reserve(b, 4)));
  EXPECT_EQ(b.NumPages(), 3);

  cache->Release(a);
  cache->Release(b);
  EXPECT_EQ(cache->allocator().num_pages_used(), 0);
  EXPECT_TRUE(cache->allocator().CheckInvariants());
}

TEST(KvCacheTest, CommitAndTruncateReturnPagesPastTheLastSlot) {
  std::unique_ptr<KvCache> cache = MakeCache(TinyShape(), 10);
  ASSERT_NE(cache, nullptr);
  SequenceKv s;  // no policy: never evicts
  ASSERT_TRUE(cache->Reserve(s, 14).ok());
  EXPECT_EQ(s.NumPages(), 4);
  cache->CommitStep(s, 14);
  EXPECT_EQ(s.Slots(0), 14);
  EXPECT_EQ(s.tokens_evicted, 0);
  cache->Truncate(s, 5);
  EXPECT_EQ(s.Slots(0), 5);
  EXPECT_EQ(s.NumPages(), 2);
  EXPECT_EQ(cache->allocator().num_pages_used(), 2);
  cache->Truncate(s, 0);
  EXPECT_EQ(s.NumPages(), 0);
  EXPECT_EQ(cache->allocator().num_pages_used(), 0);
  EXPECT_EQ(s.peak_pages, 4);

  // With a policy and budget, Commit keeps min(held, budget) and frees the rest.
  absl::StatusOr<std::unique_ptr<EvictionPolicy>> window = MakePolicy("window");
  ASSERT_TRUE(window.ok());
  SequenceKv w;
  w.policy = window->get();
  w.budget = 5;
  ASSERT_TRUE(cache->Reserve(w, 11).ok());
  for (int32_t l = 0; l < 2; ++l) {
    for (int32_t h = 0; h < 2; ++h) {
      PagedKvHead v = cache->View(w, l, h, 11);
      for (int32_t slot = 0; slot < 11; ++slot) v.Pos(slot) = slot;
      cache->EvictHead(w, l, h, 11, 10);
    }
  }
  cache->CommitStep(w, 11);
  EXPECT_EQ(w.Slots(0), 5);
  EXPECT_EQ(w.tokens_evicted, 6);
  EXPECT_EQ(w.NumPages(), 2);
  EXPECT_EQ(KeptPositions(*cache, w, 1, 1), (std::set<int32_t>{6, 7, 8, 9, 10}));
  cache->Release(w);
  EXPECT_EQ(cache->allocator().num_pages_used(), 0);
}

TEST(KvCacheTest, EvictHeadWithinBudgetLeavesSlotsAlone) {
  std::unique_ptr<KvCache> cache = MakeCache(TinyShape(), 4);
  ASSERT_NE(cache, nullptr);
  absl::StatusOr<std::unique_ptr<EvictionPolicy>> window = MakePolicy("window");
  ASSERT_TRUE(window.ok());
  SequenceKv s;
  s.policy = window->get();
  s.budget = 6;
  ASSERT_TRUE(cache->Reserve(s, 6).ok());
  PagedKvHead v = cache->View(s, 0, 1, 6);
  const int32_t order[] = {5, 0, 3, 1, 4, 2};
  for (int32_t slot = 0; slot < 6; ++slot) v.Pos(slot) = order[slot];
  cache->EvictHead(s, 0, 1, 6, 5);
  for (int32_t slot = 0; slot < 6; ++slot) EXPECT_EQ(v.Pos(slot), order[slot]);
  cache->CommitStep(s, 6);
  EXPECT_EQ(s.Slots(0), 6);
  cache->Release(s);
}

// (d) Create's argument checks.
TEST(KvCacheTest, CreateRejectsBadShapesAndPoolSizes) {
  const KvShape good = TinyShape();
  auto with = [&](auto mutate) {
    KvShape s = good;
    mutate(s);
    return s;
  };
  const KvShape bad[] = {
      with([](KvShape& s) { s.num_layers = 0; }),    with([](KvShape& s) { s.num_layers = -1; }),
      with([](KvShape& s) { s.num_kv_heads = 0; }),  with([](KvShape& s) { s.num_kv_heads = -2; }),
      with([](KvShape& s) { s.head_dim = 0; }),      with([](KvShape& s) { s.head_dim = -4; }),
      with([](KvShape& s) { s.block_size = 0; }),    with([](KvShape& s) { s.block_size = -16; }),
      with([](KvShape& s) { s.block_size = 1025; }),
  };
  for (const KvShape& s : bad) {
    absl::StatusOr<std::unique_ptr<KvCache>> c = KvCache::Create(s, 8);
    EXPECT_TRUE(absl::IsInvalidArgument(c.status()))
        << s.num_layers << "x" << s.num_kv_heads << "x" << s.head_dim << " bs " << s.block_size
        << ": " << c.status();
  }
  for (int32_t pages : {0, -1}) {
    absl::StatusOr<std::unique_ptr<KvCache>> c = KvCache::Create(good, pages);
    EXPECT_TRUE(absl::IsInvalidArgument(c.status())) << pages << ": " << c.status();
  }
  absl::StatusOr<std::unique_ptr<KvCache>> c = KvCache::Create(good, 3);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->allocator().num_pages_total(), 3);
  EXPECT_EQ((*c)->allocator().num_pages_used(), 0);
  EXPECT_EQ((*c)->shape().block_size, 4);
  EXPECT_TRUE(KvCache::Create(with([](KvShape& s) { s.block_size = 1024; }), 1).ok());
  EXPECT_TRUE(KvCache::Create(with([](KvShape& s) { s.block_size = 1; }), 1).ok());
}

TEST(KvCacheTest, PageSizeAccounting) {
  const KvShape s = TinyShape();
  // K+V: 2 layers * 2 heads * 2 * 4 slots * 4 floats; pos+score: 2 * 2 * 4 entries.
  EXPECT_EQ(s.PageFloats(), 128);
  EXPECT_EQ(s.PageMetaEntries(), 16);
  EXPECT_EQ(s.PageBytes(), 128 * 4 + 16 * 8);
  KvShape half = s;
  half.element_bytes = 2;  // bf16 K/V: half the K/V bytes, the same metadata
  EXPECT_EQ(half.PageBytes(), 128 * 2 + 16 * 8);
  // int8: a row of 4 bytes and a 1-byte scale; int4: 2 bytes and one fp16 scale (a group of 4).
  KvShape int8 = s, int4 = s;
  int8.quant = KvQuant::kInt8;
  int4.quant = KvQuant::kInt4;
  EXPECT_EQ(int8.SlotKvBytes(), 2 * (4 + 1));
  EXPECT_EQ(int4.SlotKvBytes(), 2 * (2 + 2));
  EXPECT_EQ(int8.PageBytes(), 16 * 10 + 16 * 8);
  EXPECT_EQ(int4.PageBytes(), 16 * 8 + 16 * 8);
  KvShape odd = int4;
  odd.head_dim = 5;  // int4 packs element pairs
  EXPECT_EQ(KvCache::Create(odd, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvCache::Create(int8, 4, KvStorage::kExternal).status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(KvCache::PagesForBytes(s, 640 * 10), 10);
  EXPECT_EQ(KvCache::PagesForBytes(s, 640 * 10 + 639), 10);
  EXPECT_EQ(KvCache::PagesForBytes(s, 1), 1);
}

}  // namespace
}  // namespace heavykv

namespace heavykv {
namespace {

// EvictHead hands the policy the whole step (budget, newest position, count, new tokens) and the
// channel of every held slot, and moves the channel with its slot on compaction.
TEST(KvCacheTest, EvictHeadPassesTheStepAndMovesTheChannel) {
  struct Recorder final : EvictionPolicy {
    mutable EvictionStep seen;
    mutable std::vector<float> values;
    absl::string_view name() const override { return "recorder"; }
    ChannelSpec channel() const override { return {SlotChannel::kLast}; }
    VictimRule Rule(int32_t) const override { return {VictimRule::kOldest, 0}; }
    void ChooseVictims(const HeadSlots& slots, const EvictionStep& step,
                       std::vector<int32_t>* victims) const override {
      seen = step;
      values.assign(slots.score.begin(), slots.score.end());
      for (int32_t i = 0; i < step.num_evict; ++i) victims->push_back(i);  // the first slots
    }
  } policy;
  KvShape shape{1, 1, 4, 4};
  auto cache = *KvCache::Create(shape, 8);
  SequenceKv seq;
  seq.policy = &policy;
  seq.budget = 3;
  ASSERT_TRUE(cache->Reserve(seq, 6).ok());
  PagedKvHead h = cache->View(seq, 0, 0, 6);
  for (int32_t s = 0; s < 6; ++s) {
    h.Pos(s) = 10 + s;
    h.Score(s) = 0.5f * s;
  }
  cache->EvictHead(seq, 0, 0, 6, 15, /*num_new=*/5);
  EXPECT_EQ(policy.seen.budget, 3);
  EXPECT_EQ(policy.seen.newest_pos, 15);
  EXPECT_EQ(policy.seen.num_evict, 3);
  EXPECT_EQ(policy.seen.num_new, 5);
  EXPECT_EQ(policy.values, (std::vector<float>{0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 2.5f}));
  // Slots 0..2 were dropped; 3..5 moved into them with their positions and channel values.
  for (int32_t s = 0; s < 3; ++s) {
    EXPECT_EQ(h.Pos(s), 13 + s);
    EXPECT_EQ(h.Score(s), 0.5f * (3 + s));
  }
  cache->CommitStep(seq, 6);
  EXPECT_EQ(seq.Slots(0), 3);
  cache->Release(seq);
}

}  // namespace
}  // namespace heavykv
