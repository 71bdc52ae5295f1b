// Prefix caching in memory/: the index (PrefixCache: chains keyed by hash and checked by token
// ids, least recently used leaves reclaimed first) and KvCache's use of it (RegisterPrefix copies
// a sequence's prompt blocks until it first evicts, with a snapshot of its channel on the chunk
// grid; FindPrefix/AttachPrefix give a later sequence private copies and the snapshot; an
// allocation that finds no free page reclaims cached pages). Driven as the model runner drives
// the cache: rows written through View(), a channel added to by every query.
#include "memory/prefix_cache.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/paged_kv.h"
#include "memory/eviction_policy.h"
#include "memory/kv_cache.h"

namespace heavykv {
namespace {

std::vector<int32_t> Block(int32_t first, int32_t n = 4) {
  std::vector<int32_t> b;
  for (int32_t i = 0; i < n; ++i) b.push_back(first + i);
  return b;
}

TEST(PrefixCacheTest, AChainMatchesOnlyItsOwnTokensUnderItsOwnParent) {
  PrefixCache c;
  const uint64_t root = PrefixCache::Root("");
  EXPECT_NE(root, PrefixCache::Root("key:1"));
  const std::vector<int32_t> b0 = Block(10), b1 = Block(20);
  const uint64_t h0 = PrefixCache::Next(root, b0), h1 = PrefixCache::Next(h0, b1);
  const int32_t e0 = *c.Insert(h0, -1, b0, {1, 2});
  const int32_t e1 = *c.Insert(h1, e0, b1, {3, 4});
  EXPECT_EQ(c.Find(h0, -1, b0), e0);
  EXPECT_EQ(c.Find(h1, e0, b1), e1);
  // The same key with other tokens, or under another parent, is a miss, never a wrong block.
  EXPECT_EQ(c.Find(h1, e0, Block(21)), -1);
  EXPECT_EQ(c.Find(h1, -1, b1), -1);
  // A key already taken (a collision) is not overwritten.
  EXPECT_FALSE(c.Insert(h1, e0, Block(99), {5, 6}).has_value());
  EXPECT_EQ(c.num_pages(), 4);
  EXPECT_TRUE(c.CheckInvariants());
}

TEST(PrefixCacheTest, ReclaimTakesTheLeastRecentlyUsedLeafAndNeverAParentOrAPinnedEntry) {
  PrefixCache c;
  const uint64_t root = PrefixCache::Root("");
  const int32_t a0 = *c.Insert(PrefixCache::Next(root, Block(1)), -1, Block(1), {0});
  const int32_t a1 = *c.Insert(PrefixCache::Next(root, Block(2)), a0, Block(2), {1});
  const int32_t b0 = *c.Insert(PrefixCache::Next(root, Block(3)), -1, Block(3), {2});
  // a0 is older than b0 but has a child: the oldest leaf is a1.
  EXPECT_EQ(c.Victim(), a1);
  c.Touch(a1);
  EXPECT_EQ(c.Victim(), b0);
  c.Pin(b0);
  EXPECT_EQ(c.Victim(), a1);
  EXPECT_EQ(c.Remove(a1), std::vector<int32_t>{1});
  // a0 is a leaf now, older than pinned b0.
  EXPECT_EQ(c.Victim(), a0);
  EXPECT_EQ(c.Remove(a0), std::vector<int32_t>{0});
  EXPECT_EQ(c.Victim(), -1);
  c.Unpin(b0);
  EXPECT_EQ(c.Victim(), b0);
  EXPECT_TRUE(c.CheckInvariants());
  EXPECT_EQ(c.num_entries(), 1);
}

// A small fp32 pool: 2 layers, 2 kv heads, blocks of 4, a chunk grid of 8.
class KvPrefixTest : public ::testing::Test {
 protected:
  static constexpr int32_t kBs = 4, kGrid = 8, kLayers = 2, kHeads = 2, kDim = 4;

  void SetUp() override {
    KvShape s;
    s.num_layers = kLayers;
    s.num_kv_heads = kHeads;
    s.head_dim = kDim;
    s.block_size = kBs;
    s.table_per_layer = true;
    cache_ = *KvCache::Create(s, 64);
    PrefixCacheOptions o;
    o.chunk_grid = kGrid;
    ASSERT_TRUE(cache_->EnablePrefixCache(o).ok());
  }

  static float Row(int32_t token, int32_t pos, int32_t layer, int32_t head, int32_t d) {
    return std::sin(0.1f * float(token) + 0.3f * float(pos) + float(layer * 7 + head * 3 + d));
  }

  SequenceKv Seq(const EvictionPolicy* policy, int32_t budget) {
    SequenceKv kv;
    kv.policy = policy;
    kv.budget = budget;
    kv.prefix_enabled = true;
    kv.prefix_root = PrefixCache::Root("");
    return kv;
  }

  // A prefill chunk of tokens [start, start + n) of `prompt`: rows, positions, and a channel
  // every query adds to (query q gives each visible slot q + 1), then the eviction a step does
  // and RegisterPrefix as the engine calls it.
  void Chunk(SequenceKv& kv, const std::vector<int32_t>& prompt, int32_t start, int32_t n) {
    ASSERT_TRUE(cache_->Reserve(kv, n).ok());
    for (int32_t l = 0; l < kLayers; ++l) {
      for (int32_t h = 0; h < kHeads; ++h) {
        const int32_t held = kv.Slots(l) + n;
        PagedKvHead v = cache_->View(kv, l, h, held);
        for (int32_t i = 0; i < n; ++i) {
          const int32_t s = kv.Slots(l) + i, pos = start + i;
          for (int32_t d = 0; d < kDim; ++d) {
            v.KRow(s)[d] = Row(prompt[pos], pos, l, h, d);
            v.VRow(s)[d] = -Row(prompt[pos], pos, l, h, d);
          }
          v.Pos(s) = pos;
          v.Score(s) = 0;
        }
        for (int32_t q = 0; q < n; ++q) {
          for (int32_t s = 0; s <= kv.Slots(l) + q; ++s) v.Score(s) += float(start + q + 1);
        }
        cache_->EvictHead(kv, l, h, held, start + n - 1, n);
      }
    }
    cache_->CommitStep(kv, n);
    cache_->RegisterPrefix(kv, prompt, start + n);
  }

  // Runs a whole prompt from `from` in chunks on the grid.
  void Prefill(SequenceKv& kv, const std::vector<int32_t>& prompt, int32_t from = 0) {
    for (int32_t c = from; c < int32_t(prompt.size());) {
      const int32_t n = std::min<int32_t>(kGrid - c % kGrid, int32_t(prompt.size()) - c);
      Chunk(kv, prompt, c, n);
      c += n;
    }
  }

  void ExpectSameState(SequenceKv& a, SequenceKv& b, int32_t slots, bool scores = true) {
    for (int32_t l = 0; l < kLayers; ++l) {
      ASSERT_EQ(a.Slots(l), slots);
      ASSERT_EQ(b.Slots(l), slots);
      for (int32_t h = 0; h < kHeads; ++h) {
        PagedKvHead va = cache_->View(a, l, h, slots), vb = cache_->View(b, l, h, slots);
        for (int32_t s = 0; s < slots; ++s) {
          ASSERT_EQ(va.Pos(s), vb.Pos(s)) << "layer " << l << " head " << h << " slot " << s;
          if (scores) ASSERT_EQ(va.Score(s), vb.Score(s)) << "layer " << l << " head " << h;
          for (int32_t d = 0; d < kDim; ++d) {
            ASSERT_EQ(va.KRow(s)[d], vb.KRow(s)[d]);
            ASSERT_EQ(va.VRow(s)[d], vb.VRow(s)[d]);
          }
        }
      }
    }
  }

  std::unique_ptr<KvCache> cache_;
};

std::vector<int32_t> Prompt(int32_t n, int32_t salt = 0) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < n; ++i) p.push_back((i * 7 + salt) % 50);
  return p;
}

TEST_F(KvPrefixTest, AHitResumesWithTheRowsAndChannelOfAColdRun) {
  auto h2o = *MakePolicy("h2o");
  const std::vector<int32_t> shared = Prompt(20);
  SequenceKv producer = Seq(h2o.get(), 100);
  Prefill(producer, shared);
  // Blocks 0..4 registered (20 tokens); snapshots at the grid points 8 and 16 only.
  EXPECT_EQ(producer.prefix_blocks, 5);
  EXPECT_EQ(cache_->CachedPages(), 5 * kLayers);
  cache_->Release(producer);
  EXPECT_TRUE(cache_->prefix_cache()->CheckInvariants());

  // A longer prompt with the same first 20 tokens: h2o resumes at 16 (the last snapshot).
  std::vector<int32_t> longer = shared;
  for (int32_t t : Prompt(12, 3)) longer.push_back(t);
  SequenceKv warm = Seq(h2o.get(), 100), cold = Seq(h2o.get(), 100);
  cold.prefix_enabled = false;
  const PrefixHit hit = cache_->FindPrefix(warm, longer);
  EXPECT_EQ(hit.tokens, 16);
  EXPECT_EQ(cache_->AttachPrefix(warm, hit), 4 * kLayers);
  EXPECT_EQ(cache_->prefix_stats().hit_tokens, 16);
  Prefill(cold, longer, 0);
  // Compare at the snapshot point first, then after the rest of the prompt.
  SequenceKv cold16 = Seq(h2o.get(), 100);
  cold16.prefix_enabled = false;
  Prefill(cold16, std::vector<int32_t>(longer.begin(), longer.begin() + 16));
  ExpectSameState(warm, cold16, 16);
  Prefill(warm, longer, 16);
  ExpectSameState(warm, cold, int32_t(longer.size()));

  // The full cache needs no channel: it resumes at the last whole block before its last token.
  SequenceKv full = Seq(nullptr, kUnboundedBudget);
  EXPECT_EQ(cache_->FindPrefix(full, longer).tokens, 28);
  // Not past the budget (below the first eviction), and never the last prompt token.
  EXPECT_EQ(cache_->FindPrefix(Seq(h2o.get(), 12), longer).tokens, 8);
  EXPECT_EQ(cache_->FindPrefix(full, shared).tokens, 16);
  // Another channel has no snapshot; another tenant has no entries.
  auto tova = *MakePolicy("tova");
  EXPECT_EQ(cache_->FindPrefix(Seq(tova.get(), 100), longer).tokens, 0);
  SequenceKv other = Seq(nullptr, kUnboundedBudget);
  other.prefix_root = PrefixCache::Root("key:2");
  EXPECT_EQ(cache_->FindPrefix(other, longer).tokens, 0);
  for (SequenceKv* s : {&warm, &cold, &cold16}) cache_->Release(*s);
}

// The full cache never writes into a slot it did not append: its hits share the cached pages
// (pinned while it holds them, not reclaimable, counted once however many share them) and its
// Release frees only its own pages after them.
TEST_F(KvPrefixTest, FullCacheSequencesShareTheCachedPages) {
  const std::vector<int32_t> prompt = Prompt(20);
  SequenceKv producer = Seq(nullptr, kUnboundedBudget);
  Prefill(producer, prompt);
  cache_->Release(producer);
  const int32_t cached = cache_->CachedPages(), available = cache_->AvailablePages();
  EXPECT_EQ(cached, 5 * kLayers);
  SequenceKv a = Seq(nullptr, kUnboundedBudget), b = Seq(nullptr, kUnboundedBudget);
  const PrefixHit hit = cache_->FindPrefix(a, prompt);
  ASSERT_TRUE(hit.shares);
  EXPECT_EQ(hit.tokens, 16);
  EXPECT_EQ(hit.new_pins, 4 * kLayers);
  EXPECT_EQ(cache_->AttachPrefix(a, hit), 4 * kLayers);  // pinned: no longer reclaimable
  for (int32_t l = 0; l < kLayers; ++l) {
    for (int32_t k = 0; k < 4; ++k) {
      EXPECT_EQ(a.tables[l].pages[k], cache_->prefix_cache()->entry(hit.entries[k]).pages[l]);
    }
  }
  const PrefixHit again = cache_->FindPrefix(b, prompt);
  EXPECT_EQ(again.new_pins, 0);
  EXPECT_EQ(cache_->AttachPrefix(b, again), 0);  // already pinned: costs nothing more
  EXPECT_EQ(cache_->AvailablePages(), available - 4 * kLayers);
  EXPECT_EQ(cache_->SharedCachedPages(), 4 * kLayers);
  EXPECT_EQ(cache_->CachedPages(), cached);
  // Both go on from 16 into pages of their own; the shared rows are a cold run's.
  Prefill(a, prompt, 16);
  Prefill(b, prompt, 16);
  SequenceKv cold = Seq(nullptr, kUnboundedBudget);
  cold.prefix_enabled = false;
  Prefill(cold, prompt);
  ExpectSameState(a, cold, 20, /*scores=*/false);
  EXPECT_EQ(a.tables[0].pages.size(), 5u);
  EXPECT_NE(a.tables[0].pages[4], b.tables[0].pages[4]);
  // Nothing can reclaim the shared pages: a sequence needing all the rest fails instead.
  SequenceKv big = Seq(nullptr, kUnboundedBudget);
  big.prefix_enabled = false;
  const int32_t rest = cache_->AvailablePages();
  EXPECT_EQ(cache_->Reserve(big, kBs * (rest / kLayers + 1)).code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(cache_->Reserve(big, kBs * (rest / kLayers)).ok());
  EXPECT_EQ(cache_->SharedCachedPages(), 4 * kLayers);
  cache_->Release(big);
  cache_->Release(a);
  EXPECT_EQ(cache_->SharedCachedPages(), 4 * kLayers);  // b still holds them
  cache_->Release(b);
  cache_->Release(cold);
  EXPECT_EQ(cache_->SharedCachedPages(), 0);
  EXPECT_EQ(cache_->allocator().num_pages_used(), cache_->CachedPages());
  EXPECT_TRUE(cache_->prefix_cache()->CheckInvariants());
}

TEST_F(KvPrefixTest, RegistrationStopsAtTheFirstEvictionAndAtWhatWasComputed) {
  auto h2o = *MakePolicy("h2o");
  SequenceKv kv = Seq(h2o.get(), 10);
  const std::vector<int32_t> prompt = Prompt(24);
  Chunk(kv, prompt, 0, 6);
  EXPECT_EQ(kv.prefix_blocks, 1);  // tokens 4, 5 are no whole block yet
  Chunk(kv, prompt, 6, 2);
  EXPECT_EQ(kv.prefix_blocks, 2);
  Chunk(kv, prompt, 8, 8);  // held 16 > 10: evicts, so its slots are no longer positions
  EXPECT_TRUE(kv.prefix_closed);
  EXPECT_EQ(kv.prefix_blocks, 2);
  Chunk(kv, prompt, 16, 8);
  EXPECT_EQ(kv.prefix_blocks, 2);
  EXPECT_EQ(cache_->CachedPages(), 2 * kLayers);
  cache_->Release(kv);
}

TEST_F(KvPrefixTest, AllocationsReclaimCachedPagesBeforeFailing) {
  SequenceKv a = Seq(nullptr, kUnboundedBudget);
  Prefill(a, Prompt(64));  // 16 blocks: 32 pages of its own, 32 cached (all 64 pages)
  EXPECT_EQ(cache_->CachedPages(), 32);
  cache_->Release(a);
  EXPECT_EQ(cache_->AvailablePages(), 64);
  // Another prompt needs 48 pages: 16 cached pages (the least recently used) are reclaimed;
  // its own registrations take what is left, reclaiming older entries, and then stop.
  SequenceKv b = Seq(nullptr, kUnboundedBudget);
  Prefill(b, Prompt(96, 1));
  EXPECT_EQ(b.Slots(0), 96);
  EXPECT_GT(cache_->prefix_stats().reclaimed_pages, 0);
  EXPECT_EQ(cache_->allocator().num_pages_used(), b.NumPages() + cache_->CachedPages());
  EXPECT_TRUE(cache_->prefix_cache()->CheckInvariants());
  // Nothing is left to reclaim beyond the cache: the pool is exactly full.
  EXPECT_EQ(cache_->AvailablePages(), 64 - b.NumPages());
  SequenceKv c = Seq(nullptr, kUnboundedBudget);
  EXPECT_EQ(cache_->Reserve(c, 4 * (cache_->AvailablePages() / kLayers + 1)).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(cache_->allocator().num_pages_used(), b.NumPages() + cache_->CachedPages());
  cache_->Release(b);
}

}  // namespace
}  // namespace heavykv
