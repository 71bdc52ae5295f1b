// PageAllocator tests: exhaustion, reuse, invariants under random interleavings (checked against
// a plain std::set model), and aborts on frees of pages that are not handed out.
#include "memory/page_allocator.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace heavykv {
namespace {

TEST(PageAllocatorTest, HandsOutEveryPageExactlyOnceThenIsExhausted) {
  constexpr int32_t kPages = 17;
  PageAllocator alloc(kPages);
  EXPECT_EQ(alloc.num_pages_total(), kPages);
  EXPECT_EQ(alloc.num_pages_free(), kPages);
  EXPECT_EQ(alloc.num_pages_used(), 0);
  EXPECT_TRUE(alloc.CheckInvariants());

  std::set<int32_t> got;
  for (int32_t i = 0; i < kPages; ++i) {
    absl::StatusOr<int32_t> p = alloc.Allocate();
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_GE(*p, 0);
    EXPECT_LT(*p, kPages);
    EXPECT_TRUE(alloc.IsAllocated(*p));
    EXPECT_TRUE(got.insert(*p).second) << "page " << *p << " handed out twice";
    EXPECT_EQ(alloc.num_pages_used(), i + 1);
    EXPECT_EQ(alloc.num_pages_free(), kPages - i - 1);
  }
  EXPECT_EQ(got.size(), static_cast<size_t>(kPages));
  EXPECT_TRUE(alloc.CheckInvariants());

  for (int attempt = 0; attempt < 3; ++attempt) {
    absl::StatusOr<int32_t> p = alloc.Allocate();
    ASSERT_FALSE(p.ok());
    EXPECT_TRUE(absl::IsResourceExhausted(p.status())) << p.status();
  }
  // A failed Allocate changes nothing.
  EXPECT_EQ(alloc.num_pages_used(), kPages);
  EXPECT_EQ(alloc.num_pages_free(), 0);
  EXPECT_TRUE(alloc.CheckInvariants());
}

TEST(PageAllocatorTest, FirstPageHandedOutIsZero) {
  PageAllocator alloc(4);
  absl::StatusOr<int32_t> p = alloc.Allocate();
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p, 0);
}

TEST(PageAllocatorTest, ZeroPagesIsImmediatelyExhausted) {
  PageAllocator alloc(0);
  EXPECT_EQ(alloc.num_pages_total(), 0);
  EXPECT_TRUE(alloc.CheckInvariants());
  EXPECT_TRUE(absl::IsResourceExhausted(alloc.Allocate().status()));
}

TEST(PageAllocatorTest, FreedPagesAreReallocatedMostRecentFirst) {
  constexpr int32_t kPages = 8;
  PageAllocator alloc(kPages);
  std::vector<int32_t> pages;
  for (int32_t i = 0; i < kPages; ++i) pages.push_back(*alloc.Allocate());
  ASSERT_TRUE(absl::IsResourceExhausted(alloc.Allocate().status()));

  alloc.Free(pages[5]);
  EXPECT_FALSE(alloc.IsAllocated(pages[5]));
  alloc.Free(pages[2]);
  EXPECT_FALSE(alloc.IsAllocated(pages[2]));
  EXPECT_EQ(alloc.num_pages_free(), 2);
  EXPECT_EQ(alloc.num_pages_used(), kPages - 2);
  EXPECT_TRUE(alloc.CheckInvariants());

  // LIFO: the page freed last comes back first.
  absl::StatusOr<int32_t> a = alloc.Allocate();
  absl::StatusOr<int32_t> b = alloc.Allocate();
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*a, pages[2]);
  EXPECT_EQ(*b, pages[5]);
  EXPECT_TRUE(alloc.IsAllocated(pages[2]));
  EXPECT_TRUE(alloc.IsAllocated(pages[5]));
  EXPECT_TRUE(absl::IsResourceExhausted(alloc.Allocate().status()));

  // Free everything, then the whole pool can be handed out again.
  for (int32_t p : pages) alloc.Free(p);
  EXPECT_EQ(alloc.num_pages_used(), 0);
  EXPECT_TRUE(alloc.CheckInvariants());
  std::set<int32_t> again;
  for (int32_t i = 0; i < kPages; ++i) {
    absl::StatusOr<int32_t> p = alloc.Allocate();
    ASSERT_TRUE(p.ok());
    again.insert(*p);
  }
  EXPECT_EQ(again.size(), static_cast<size_t>(kPages));
  EXPECT_TRUE(absl::IsResourceExhausted(alloc.Allocate().status()));
}

TEST(PageAllocatorTest, RandomInterleavingsKeepInvariants) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE(seed);
    std::mt19937 rng(seed);
    const int32_t num_pages = 1 + static_cast<int32_t>(rng() % 64);
    PageAllocator alloc(num_pages);
    std::vector<int32_t> held;  // model: pages we hold, in no particular order
    std::set<int32_t> held_set;
    int32_t exhausted = 0;
    for (int op = 0; op < 5000; ++op) {
      // Bias towards allocation in some phases and towards freeing in others so that the pool
      // is regularly both full and empty.
      const bool alloc_phase = (op / 500) % 2 == 0;
      const bool do_alloc = held.empty() || (rng() % 4 != 0) == alloc_phase;
      if (do_alloc) {
        absl::StatusOr<int32_t> p = alloc.Allocate();
        if (static_cast<int32_t>(held.size()) == num_pages) {
          ASSERT_FALSE(p.ok());
          ASSERT_TRUE(absl::IsResourceExhausted(p.status())) << p.status();
          ++exhausted;
        } else {
          ASSERT_TRUE(p.ok()) << p.status() << " with " << held.size() << "/" << num_pages;
          ASSERT_GE(*p, 0);
          ASSERT_LT(*p, num_pages);
          ASSERT_TRUE(held_set.insert(*p).second) << "page " << *p << " handed out twice";
          held.push_back(*p);
        }
      } else {
        const size_t i = rng() % held.size();
        const int32_t p = held[i];
        held[i] = held.back();
        held.pop_back();
        held_set.erase(p);
        alloc.Free(p);
      }
      ASSERT_EQ(alloc.num_pages_used(), static_cast<int32_t>(held.size()));
      ASSERT_EQ(alloc.num_pages_free(), num_pages - static_cast<int32_t>(held.size()));
      ASSERT_TRUE(alloc.CheckInvariants()) << "after op " << op;
      if (op % 97 == 0) {
        for (int32_t p = 0; p < num_pages; ++p) {
          ASSERT_EQ(alloc.IsAllocated(p), held_set.count(p) == 1) << "page " << p;
        }
      }
    }
    EXPECT_GT(exhausted, 0) << "the interleaving never filled the pool";
    for (int32_t p : held) alloc.Free(p);
    EXPECT_EQ(alloc.num_pages_used(), 0);
    EXPECT_TRUE(alloc.CheckInvariants());
  }
}

TEST(PageAllocatorDeathTest, DoubleFreeAborts) {
  PageAllocator alloc(4);
  const int32_t p = *alloc.Allocate();
  alloc.Free(p);
  EXPECT_DEATH(alloc.Free(p), "not allocated");
}

TEST(PageAllocatorDeathTest, FreeOfPageNeverHandedOutAborts) {
  PageAllocator alloc(4);
  (void)*alloc.Allocate();  // page 0
  EXPECT_DEATH(alloc.Free(3), "not allocated");
}

TEST(PageAllocatorDeathTest, FreeOutOfRangeAborts) {
  PageAllocator alloc(4);
  for (int i = 0; i < 4; ++i) (void)*alloc.Allocate();
  EXPECT_DEATH(alloc.Free(-1), "not allocated");
  EXPECT_DEATH(alloc.Free(4), "not allocated");
}

}  // namespace
}  // namespace heavykv
