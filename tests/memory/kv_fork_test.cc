// KvCache::Fork (n choices of one request): the full cache shares whole pages and copies the
// partly filled last one, a policy that evicts copies every page; each holder then writes only
// its own slots, and a shared page goes back to the pool with its last holder.
#include <cstdint>
#include <memory>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/paged_kv.h"
#include "memory/eviction_policy.h"
#include "memory/kv_cache.h"

namespace heavykv {
namespace {

KvShape Shape() {
  KvShape s;
  s.num_layers = 2;
  s.num_kv_heads = 2;
  s.head_dim = 4;
  s.block_size = 4;
  s.table_per_layer = true;  // the CPU layout: a table (and pages) per layer
  return s;
}

float Value(int32_t layer, int32_t head, int32_t pos, int32_t salt) {
  return float(((layer * 4 + head) * 64 + pos) % 251 + salt * 1000);
}

// Appends `n` tokens at positions [from, from + n) to every layer and head, K rows holding
// Value(.., salt), pos and a score of pos + salt, as the runner and a policy-free step would.
void Append(KvCache& cache, SequenceKv& seq, int32_t from, int32_t n, int32_t salt) {
  ASSERT_TRUE(cache.Reserve(seq, n).ok());
  const KvShape& s = cache.shape();
  for (int32_t l = 0; l < s.num_layers; ++l) {
    for (int32_t h = 0; h < s.num_kv_heads; ++h) {
      const PagedKvHead v = cache.View(seq, l, h, seq.Slots(l) + n);
      for (int32_t i = 0; i < n; ++i) {
        std::vector<float> k(size_t(s.head_dim), Value(l, h, from + i, salt)), val = k;
        v.StoreRows(seq.Slots(l) + i, k.data(), val.data());
        v.Pos(seq.Slots(l) + i) = from + i;
        v.Score(seq.Slots(l) + i) = float(from + i + salt);
      }
    }
  }
  cache.CommitStep(seq, n);
}

// Every slot of seq holds what Append wrote at its position with `salt_of(pos)`.
void ExpectRows(KvCache& cache, const SequenceKv& seq, int32_t n, int32_t prompt, int32_t salt) {
  const KvShape& s = cache.shape();
  for (int32_t l = 0; l < s.num_layers; ++l) {
    ASSERT_EQ(seq.Slots(l), n);
    for (int32_t h = 0; h < s.num_kv_heads; ++h) {
      const PagedKvHead v = cache.View(seq, l, h, n);
      for (int32_t i = 0; i < n; ++i) {
        const int32_t want_salt = i < prompt ? 0 : salt;
        EXPECT_EQ(v.Pos(i), i);
        EXPECT_EQ(v.KAt(i, 0), Value(l, h, i, want_salt)) << "layer " << l << " slot " << i;
      }
    }
  }
}

std::set<int32_t> Pages(const SequenceKv& seq) {
  std::set<int32_t> out;
  for (const KvTable& t : seq.tables) out.insert(t.pages.begin(), t.pages.end());
  return out;
}

TEST(KvForkTest, FullCacheSharesWholePagesAndCopiesThePartOne) {
  auto cache = *KvCache::Create(Shape(), 64);
  SequenceKv parent, child;
  Append(*cache, parent, 0, 10, 0);  // 2 whole pages and half of a third per layer
  EXPECT_EQ(cache->ForkPages(parent), 2);  // the part pages of the 2 layers
  const int32_t used = cache->allocator().num_pages_used();
  ASSERT_TRUE(cache->Fork(parent, child).ok());
  EXPECT_EQ(cache->allocator().num_pages_used(), used + 2);
  EXPECT_EQ(cache->ForkSharedPages(), 4);
  EXPECT_EQ(cache->ForkSharedPagesOf(parent), 4);
  EXPECT_EQ(cache->ForkSharedPagesOf(child), 4);
  for (size_t t = 0; t < parent.tables.size(); ++t) {
    EXPECT_EQ(child.tables[t].pages[0], parent.tables[t].pages[0]);
    EXPECT_EQ(child.tables[t].pages[1], parent.tables[t].pages[1]);
    EXPECT_NE(child.tables[t].pages[2], parent.tables[t].pages[2]);
  }
  // Each writes its own continuation into its own last page and the pages after it.
  Append(*cache, parent, 10, 9, 1);
  Append(*cache, child, 10, 9, 2);
  ExpectRows(*cache, parent, 19, 10, 1);
  ExpectRows(*cache, child, 19, 10, 2);
  // The parent goes first: the shared pages stay with the child, now its own.
  cache->Release(parent);
  EXPECT_EQ(cache->ForkSharedPages(), 0);
  EXPECT_EQ(cache->ForkSharedPagesOf(child), 0);
  EXPECT_EQ(cache->allocator().num_pages_used(), int32_t(Pages(child).size()));
  ExpectRows(*cache, child, 19, 10, 2);
  cache->Release(child);
  EXPECT_EQ(cache->allocator().num_pages_used(), 0);
  EXPECT_TRUE(cache->allocator().CheckInvariants());
}

TEST(KvForkTest, ManyChoicesHoldOnePromptOnce) {
  auto cache = *KvCache::Create(Shape(), 128);
  SequenceKv parent;
  Append(*cache, parent, 0, 16, 0);  // whole pages only: a fork copies nothing
  EXPECT_EQ(cache->ForkPages(parent), 0);
  std::vector<SequenceKv> choices(7);
  for (SequenceKv& c : choices) ASSERT_TRUE(cache->Fork(parent, c).ok());
  EXPECT_EQ(cache->allocator().num_pages_used(), 8);
  EXPECT_EQ(cache->ForkSharedPages(), 8);
  int32_t salt = 1;
  for (SequenceKv& c : choices) Append(*cache, c, 16, 3, salt++);
  EXPECT_EQ(cache->allocator().num_pages_used(), 8 + 7 * 2);
  salt = 1;
  for (SequenceKv& c : choices) ExpectRows(*cache, c, 19, 16, salt++);
  for (SequenceKv& c : choices) cache->Release(c);
  EXPECT_EQ(cache->ForkSharedPages(), 0);
  EXPECT_EQ(cache->allocator().num_pages_used(), 8);
  ExpectRows(*cache, parent, 16, 16, 0);
  cache->Release(parent);
  EXPECT_EQ(cache->allocator().num_pages_used(), 0);
}

TEST(KvForkTest, APolicyThatEvictsGetsPrivateCopies) {
  auto cache = *KvCache::Create(Shape(), 64);
  std::unique_ptr<EvictionPolicy> h2o = *MakePolicy("h2o");
  SequenceKv parent, child;
  parent.policy = h2o.get();
  parent.budget = 8;
  Append(*cache, parent, 0, 6, 0);
  EXPECT_EQ(cache->ForkPages(parent), 4);
  ASSERT_TRUE(cache->Fork(parent, child).ok());
  EXPECT_EQ(cache->ForkSharedPages(), 0);
  EXPECT_EQ(child.policy, parent.policy);
  EXPECT_EQ(child.budget, 8);
  std::set<int32_t> a = Pages(parent), b = Pages(child);
  for (int32_t p : b) EXPECT_EQ(a.count(p), 0u) << "page " << p << " is shared";
  ExpectRows(*cache, child, 6, 6, 0);
  for (int32_t l = 0; l < 2; ++l) {
    for (int32_t h = 0; h < 2; ++h) {  // the channel is copied with the rows
      const PagedKvHead v = cache->View(child, l, h, 6);
      for (int32_t s = 0; s < 6; ++s) EXPECT_EQ(v.Score(s), float(s));
    }
  }
  cache->Release(parent);
  cache->Release(child);
  EXPECT_EQ(cache->allocator().num_pages_used(), 0);
}

TEST(KvForkTest, RefusedWithoutPagesOrHostStorage) {
  auto cache = *KvCache::Create(Shape(), 6);
  SequenceKv parent, child;
  std::unique_ptr<EvictionPolicy> h2o = *MakePolicy("h2o");
  parent.policy = h2o.get();
  parent.budget = 16;
  Append(*cache, parent, 0, 10, 0);  // 6 pages: nothing left to copy them to
  EXPECT_EQ(cache->Fork(parent, child).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(child.tables.empty());
  EXPECT_EQ(cache->allocator().num_pages_used(), 6);
  auto device = *KvCache::Create(Shape(), 6, KvStorage::kExternal);
  SequenceKv d, e;
  ASSERT_TRUE(device->Reserve(d, 4).ok());
  device->CommitStep(d, 4);
  EXPECT_EQ(device->Fork(d, e).code(), absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace heavykv
