// Packed pages (memory/kv_cache.h PackedBlockSize): pages of another row type in the same pool.
// MiKV (a policy's demote=int8|int4): the tokens an importance policy evicts move to a demoted
// store of quantized rows; a request's own kv_dtype (SequenceKv::quant): its cache rows are
// int8 or int4 on packed pages. Driven as the model runner drives the cache, one sequence at a
// time, checked after every step against a plain reference of what each (layer, kv head) holds
// in its cache and in its store: positions and scores, and rows exactly the quantization of the
// token's own (the store's requantized from what the cache held); pages must all come back, and
// PeakPages must cover what the sequence held. Also the spec's checks.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/kv_quant.h"
#include "kernels/paged_kv.h"
#include "memory/eviction_policy.h"
#include "memory/kv_cache.h"

namespace heavykv {
namespace {

KvShape Shape(KvQuant pool_quant = KvQuant::kNone, int32_t head_dim = 16) {
  KvShape s;
  s.num_layers = 2;
  s.num_kv_heads = 2;
  s.head_dim = head_dim;
  s.block_size = 8;
  s.quant = pool_quant;
  s.table_per_layer = true;
  return s;
}

float RowValue(bool is_k, int32_t layer, int32_t head, int32_t pos, int32_t d) {
  const float x = std::sin(0.37f * float(pos) + 1.3f * float(d) + 0.7f * float(layer * 3 + head));
  return (is_k ? 2.0f : -1.0f) * x * (1.0f + float(pos % 5));
}

// Scripted attention mass for a token at a step (small integers: exact sums and many ties).
float Received(uint32_t salt, int32_t step, int32_t layer, int32_t head, int32_t pos) {
  uint32_t x = salt * 0x9e3779b9u ^ uint32_t(step) * 73856093u ^ uint32_t(pos) * 19349663u ^
               uint32_t(layer * 8 + head + 1) * 83492791u;
  x ^= x >> 13;
  x *= 0x5bd1e995u;
  x ^= x >> 15;
  return float(x % 4);
}

struct Tok {
  int32_t pos;
  float score;
};

// The reference's order of the importance policies: lowest score first, ties the older token.
bool Below(const Tok& a, const Tok& b) {
  return a.score != b.score ? a.score < b.score : a.pos < b.pos;
}

// One (layer, head) of the reference: h2o over the cache, then the demoted store.
struct RefHead {
  std::vector<Tok> cache, store;
  void Step(int32_t budget, int32_t protect, int32_t newest, int32_t store_budget) {
    if (int32_t(cache.size()) <= budget) return;
    const int32_t evict = int32_t(cache.size()) - budget;
    std::vector<Tok> candidates;
    for (const Tok& t : cache) {
      if (t.pos <= newest - protect) candidates.push_back(t);
    }
    std::sort(candidates.begin(), candidates.end(), Below);
    candidates.resize(evict);
    for (const Tok& v : candidates) {
      cache.erase(std::find_if(cache.begin(), cache.end(),
                               [&](const Tok& t) { return t.pos == v.pos; }));
      store.push_back(v);
    }
    std::sort(store.begin(), store.end(), Below);
    if (int32_t(store.size()) > store_budget) {
      store.erase(store.begin(), store.end() - store_budget);
    }
  }
};

struct Case {
  KvQuant demote;
  KvQuant pool;
  int32_t budget;
  int32_t store_budget;  // 0: the budget
  bool chunked;
  int32_t head_dim = 16;
  KvQuant seq = KvQuant::kNone;  // the sequence's own row type (a request's kv_dtype)
};

// The row a demoted store holds for x: quantized (in the rotated basis where it rotates) and
// read back, as PagedKvHead::LoadRow returns it.
std::vector<float> Requantized(KvQuant q, std::vector<float> x) {
  const int32_t hd = static_cast<int32_t>(x.size());
  if (KvRotates(q, hd)) HadamardRotate(x.data(), hd);
  std::vector<uint8_t> data(KvQuantDataBytes(q, hd)), scale(KvQuantScaleBytes(q, hd));
  QuantizeKvRow(q, x.data(), hd, data.data(), scale.data());
  DequantizeKvRow(q, data.data(), scale.data(), hd, x.data());
  if (KvRotates(q, hd)) HadamardRotate(x.data(), hd);
  return x;
}

// A token's K (is_k) or V row as the cache holds it: the sequence's own type, else the pool's.
std::vector<float> CacheRow(const Case& c, bool is_k, int32_t layer, int32_t head, int32_t pos) {
  std::vector<float> x(c.head_dim);
  for (int32_t d = 0; d < c.head_dim; ++d) x[d] = RowValue(is_k, layer, head, pos, d);
  const KvQuant q = c.seq != KvQuant::kNone ? c.seq : c.pool;
  return q != KvQuant::kNone ? Requantized(q, x) : x;
}

// `view` holds exactly the tokens `want` (positions and scores), each with the rows row(is_k,
// pos) (to float rounding).
void ExpectHolds(const PagedKvHead& view, const std::vector<Tok>& want_toks,
                 const std::function<std::vector<float>(bool, int32_t)>& row) {
  std::vector<std::pair<int32_t, float>> got, want;
  std::vector<float> k(view.head_dim), v(view.head_dim);
  for (int32_t s = 0; s < view.num_slots; ++s) {
    got.push_back({view.Pos(s), view.Score(s)});
    const std::vector<float> kw = row(true, view.Pos(s)), vw = row(false, view.Pos(s));
    view.LoadRow(true, s, k.data());
    view.LoadRow(false, s, v.data());
    for (int32_t d = 0; d < view.head_dim; ++d) {
      ASSERT_NEAR(k[d], kw[d], 1e-5f * (1 + std::abs(kw[d]))) << "slot " << s;
      ASSERT_NEAR(v[d], vw[d], 1e-5f * (1 + std::abs(vw[d]))) << "slot " << s;
    }
  }
  for (const Tok& t : want_toks) want.push_back({t.pos, t.score});
  std::sort(got.begin(), got.end());
  std::sort(want.begin(), want.end());
  ASSERT_EQ(got, want);
}

void RunCase(const Case& c) {
  const KvShape shape = Shape(c.pool, c.head_dim);
  std::string spec = "h2o";
  if (c.demote != KvQuant::kNone) {
    spec += std::string(":demote=") + KvQuantName(c.demote);
    if (c.store_budget > 0) spec += ":demote_budget=" + std::to_string(c.store_budget);
  }
  absl::StatusOr<std::unique_ptr<EvictionPolicy>> policy = MakePolicy(spec, 0.5);
  ASSERT_TRUE(policy.ok()) << policy.status();
  constexpr int32_t kLength = 80, kMaxChunk = 6;
  const int32_t store_budget =
      c.demote == KvQuant::kNone ? 0 : c.store_budget > 0 ? c.store_budget : c.budget;
  const int32_t bd = c.demote != KvQuant::kNone ? PackedBlockSize(shape, c.demote) : 1;
  ASSERT_GT(bd, c.demote != KvQuant::kNone ? shape.block_size : 0);
  const int32_t bs = c.seq != KvQuant::kNone ? PackedBlockSize(shape, c.seq) : shape.block_size;
  ASSERT_GT(bs, 0);
  // PeakPages (what admission counts) plus a chunk's pages per table for prefill's overshoot.
  const int64_t peak = PeakPages(shape, policy->get(), c.budget, kLength, c.seq);
  const int32_t num_pages = static_cast<int32_t>(
      peak + shape.num_layers * ((kMaxChunk + bs - 1) / bs + (kMaxChunk + bd - 1) / bd));
  absl::StatusOr<std::unique_ptr<KvCache>> made = KvCache::Create(shape, num_pages);
  ASSERT_TRUE(made.ok()) << made.status();
  KvCache& cache = **made;
  for (uint32_t salt : {1u, 2u}) {
    SCOPED_TRACE(::testing::Message() << "salt " << salt);
    SequenceKv kv;
    kv.policy = policy->get();
    kv.budget = c.budget;
    kv.quant = c.seq;
    std::vector<RefHead> ref(shape.num_layers * shape.num_kv_heads);
    std::mt19937 rng(salt);
    int32_t next = 0, step = 0, most_demoted = 0;
    std::vector<float> k(shape.head_dim), v(shape.head_dim);
    while (next < kLength) {
      int32_t n = c.chunked ? 1 + int32_t(rng() % kMaxChunk) : 1;
      n = std::min(n, kLength - next);
      ASSERT_TRUE(cache.Reserve(kv, n).ok()) << "step " << step;
      for (int32_t l = 0; l < shape.num_layers; ++l) {
        const int32_t old = kv.Slots(l);
        for (int32_t h = 0; h < shape.num_kv_heads; ++h) {
          RefHead& r = ref[l * shape.num_kv_heads + h];
          PagedKvHead view = cache.View(kv, l, h, old + n);
          for (int32_t i = 0; i < n; ++i) {
            for (int32_t d = 0; d < shape.head_dim; ++d) {
              k[d] = RowValue(true, l, h, next + i, d);
              v[d] = RowValue(false, l, h, next + i, d);
            }
            view.StoreRows(old + i, k.data(), v.data());
            view.Pos(old + i) = next + i;
            view.Score(old + i) = 0.0f;
            r.cache.push_back({next + i, 0.0f});
          }
          // "Attention": every token held, in the cache or the store, receives scripted mass.
          for (int32_t s = 0; s < old + n; ++s) view.Score(s) += Received(salt, step, l, h, view.Pos(s));
          for (Tok& t : r.cache) t.score += Received(salt, step, l, h, t.pos);
          if (kv.DemotedSlots(l) > 0) {
            PagedKvHead d = cache.DemotedView(kv, l, h);
            for (int32_t s = 0; s < d.num_slots; ++s) d.Score(s) += Received(salt, step, l, h, d.Pos(s));
          }
          for (Tok& t : r.store) t.score += Received(salt, step, l, h, t.pos);
          cache.EvictHead(kv, l, h, old + n, next + n - 1, n);
          r.Step(c.budget, c.budget / 2, next + n - 1, store_budget);
        }
      }
      cache.CommitStep(kv, n);
      next += n;
      ++step;
      // The cache and the store of every (layer, head) hold what the reference holds.
      for (int32_t l = 0; l < shape.num_layers; ++l) {
        for (int32_t h = 0; h < shape.num_kv_heads; ++h) {
          const RefHead& r = ref[l * shape.num_kv_heads + h];
          SCOPED_TRACE(::testing::Message() << "step " << step << " layer " << l << " head " << h);
          ASSERT_EQ(kv.Slots(l), int32_t(r.cache.size()));
          ASSERT_EQ(kv.DemotedSlots(l), int32_t(r.store.size()));
          most_demoted = std::max(most_demoted, kv.DemotedSlots(l));
          PagedKvHead view = cache.View(kv, l, h, kv.Slots(l));
          ASSERT_EQ(view.block_size, bs);
          // The cache's rows: the token's own, in the cache's (or the sequence's own) type.
          ExpectHolds(view, r.cache, [&](bool is_k, int32_t pos) {
            return CacheRow(c, is_k, l, h, pos);
          });
          if (kv.DemotedSlots(l) == 0) continue;
          PagedKvHead d = cache.DemotedView(kv, l, h);
          ASSERT_EQ(d.block_size, bd);
          // The store's: the token's own, quantized once from what the cache held.
          ExpectHolds(d, r.store, [&](bool is_k, int32_t pos) {
            return Requantized(c.demote, CacheRow(c, is_k, l, h, pos));
          });
        }
      }
      ASSERT_LE(kv.NumPages(), num_pages);
    }
    // The store filled up to its budget (or took every evicted token).
    EXPECT_EQ(most_demoted, std::min(store_budget, kLength - c.budget));
    if (!c.chunked) {
      EXPECT_LE(kv.peak_pages, peak);
    }
    if (c.demote == KvQuant::kNone) {
      EXPECT_TRUE(kv.demoted.empty());
    }
    cache.Release(kv);
    EXPECT_EQ(cache.allocator().num_pages_used(), 0);
    EXPECT_TRUE(cache.allocator().CheckInvariants());
  }
}

TEST(PackedPagesTest, StoreHoldsTheEvictedTokensQuantizedAndRanked) {
  for (KvQuant demote : {KvQuant::kInt8, KvQuant::kInt4}) {
    for (bool chunked : {false, true}) {
      for (int32_t budget : {10, 24}) {
        for (int32_t store_budget : {0, 7, 40}) {
          SCOPED_TRACE(::testing::Message()
                       << KvQuantName(demote) << " budget " << budget
                       << " store " << store_budget << (chunked ? " chunked" : " decode"));
          RunCase({demote, KvQuant::kNone, budget, store_budget, chunked});
        }
      }
    }
  }
  // A pool of int8 pages demoting to int4 (head_dim 64: 12 int4 slots where a page has 8).
  RunCase({KvQuant::kInt4, KvQuant::kInt8, 12, 0, true, 64});
}

// A request's own row type (SequenceKv::quant): int8 or int4 rows on packed pages of an fp32
// pool (24 and 36 slots where its own pages have 8), alone and with a demoted store of int4.
TEST(PackedPagesTest, ASequencesOwnRowTypeUsesPackedPages) {
  for (KvQuant seq : {KvQuant::kInt8, KvQuant::kInt4}) {
    for (bool chunked : {false, true}) {
      SCOPED_TRACE(::testing::Message() << KvQuantName(seq)
                                        << (chunked ? " chunked" : " decode"));
      RunCase({KvQuant::kNone, KvQuant::kNone, 10, 0, chunked, 16, seq});
      RunCase({KvQuant::kNone, KvQuant::kNone, 30, 0, chunked, 16, seq});
    }
  }
  RunCase({KvQuant::kInt4, KvQuant::kNone, 10, 0, true, 64, KvQuant::kInt8});
  // Capacity: an int4 sequence of 80 tokens holds ceil(80 / 36) pages a layer, not 80 / 8.
  const KvShape shape = Shape();
  EXPECT_EQ(PeakPages(shape, nullptr, kUnboundedBudget, 80, KvQuant::kInt4), 2 * 3);
  EXPECT_EQ(PeakPages(shape, nullptr, kUnboundedBudget, 80), 2 * 10);
  absl::StatusOr<std::unique_ptr<KvCache>> cache = KvCache::Create(Shape(KvQuant::kInt8), 16);
  ASSERT_TRUE(cache.ok());
  EXPECT_EQ((*cache)->CheckFormat(nullptr, KvQuant::kInt8).code(),
            absl::StatusCode::kInvalidArgument);  // as wide as the pool's own rows
}

TEST(PackedPagesTest, DemotedPagesHoldMoreTokensThanThePoolsOwn) {
  KvShape s = Shape();  // fp32, head_dim 16, pages of 8
  // A page of 8 x 2 heads x 128 B of K/V = 2048 B; an int4 slot takes 2 x (8 + 2) + 8 = 28 B.
  EXPECT_EQ(PackedBlockSize(s, KvQuant::kInt4), 36);
  EXPECT_EQ(PackedBlockSize(s, KvQuant::kInt8), 24);  // 2 x (16 + 1) + 8 = 42 B
  s.quant = KvQuant::kInt8;
  EXPECT_EQ(PackedBlockSize(s, KvQuant::kInt8), 0);  // no gain over the pool's own rows
  s.quant = KvQuant::kNone;
  s.table_per_layer = false;  // the CUDA layout
  EXPECT_EQ(PackedBlockSize(s, KvQuant::kInt4), 0);
}

TEST(PackedPagesTest, APoolAsNarrowAsTheStoreIsRefusedWithTheReason) {
  absl::StatusOr<std::unique_ptr<KvCache>> cache = KvCache::Create(Shape(KvQuant::kInt4), 16);
  ASSERT_TRUE(cache.ok());
  absl::StatusOr<std::unique_ptr<EvictionPolicy>> policy = MakePolicy("h2o:demote=int4");
  ASSERT_TRUE(policy.ok());
  SequenceKv kv;
  kv.policy = policy->get();
  kv.budget = 8;
  EXPECT_EQ((*cache)->CheckFormat(kv.policy).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*cache)->CheckFormat(MakePolicy("h2o")->get()).ok());
  const absl::Status s = (*cache)->Reserve(kv, 4);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("int4"), std::string::npos) << s;
  EXPECT_EQ((*cache)->allocator().num_pages_used(), 0);
}

TEST(PackedPagesTest, SpecChecks) {
  for (const char* ok : {"h2o:demote=int4", "h2o:demote=int8:demote_budget=64", "tova:demote=int4",
                         "scissorhands:demote=int8", "knorm:demote=int4", "snapkv:demote=int4"}) {
    absl::StatusOr<std::unique_ptr<EvictionPolicy>> p = MakePolicy(ok);
    ASSERT_TRUE(p.ok()) << ok << ": " << p.status();
    EXPECT_NE((*p)->demote(), KvQuant::kNone) << ok;
    EXPECT_FALSE((*p)->GpuRule(16).has_value()) << ok;  // the CUDA backend refuses it
  }
  EXPECT_EQ((*MakePolicy("h2o:demote=int8:demote_budget=64"))->demote_budget(), 64);
  for (const char* bad : {"h2o:demote=int2", "h2o:demote=fp8", "window:demote=int4",
                          "sink:demote=int8", "full:demote=int4", "h2o:demote_budget=5",
                          "h2o:demote=int4:demote_budget=0", "h2o:demote=int4:demote=int8",
                          "h2o:demote=int4:granularity=page", "h2o:demote=int4:layers=pyramid",
                          "snapkv:decode=window:demote=int4"}) {
    absl::StatusOr<std::unique_ptr<EvictionPolicy>> p = MakePolicy(bad);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_NE(MakePolicy("h2o:demote=int2").status().message().find("int8 or int4"),
            std::string::npos);
}

}  // namespace
}  // namespace heavykv
