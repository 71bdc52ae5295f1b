// PageAllocator: hands out page ids of the shared KV pool in O(1).
//
// Ids are dense integers in [0, num_pages). A LIFO free list makes Allocate and Free O(1) and
// reuses hot pages first. Running out of pages is a recoverable status (the scheduler handles
// it); freeing a page twice or one that was never handed out is a broken invariant and aborts.
//
// Invariants: every id is in exactly one of {free list, in use}; num_pages_free() +
// num_pages_used() == num_pages_total().
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace heavykv {

class PageAllocator {
 public:
  explicit PageAllocator(int32_t num_pages);

  // Returns a free page id, or RESOURCE_EXHAUSTED when every page is in use.
  absl::StatusOr<int32_t> Allocate();
  // Returns `page` to the pool. Aborts on a double free or an id out of range.
  void Free(int32_t page);

  bool IsAllocated(int32_t page) const { return in_use_[page] != 0; }
  int32_t num_pages_total() const { return static_cast<int32_t>(in_use_.size()); }
  int32_t num_pages_free() const { return static_cast<int32_t>(free_.size()); }
  int32_t num_pages_used() const { return num_pages_total() - num_pages_free(); }

  // Verifies the invariants above in O(num_pages); for tests and debug checks.
  bool CheckInvariants() const;

 private:
  std::vector<int32_t> free_;   // stack of free ids
  std::vector<uint8_t> in_use_;  // [num_pages] 1 while handed out
};

}  // namespace heavykv
