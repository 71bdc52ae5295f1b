#include "memory/page_allocator.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace heavykv {

PageAllocator::PageAllocator(int32_t num_pages) : in_use_(num_pages, 0) {
  free_.reserve(num_pages);
  // Push in reverse so that page 0 is handed out first (easier to read in tests and dumps).
  for (int32_t p = num_pages - 1; p >= 0; --p) free_.push_back(p);
}

absl::StatusOr<int32_t> PageAllocator::Allocate() {
  if (free_.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV pool exhausted: all ", num_pages_total(), " pages are in use"));
  }
  int32_t page = free_.back();
  free_.pop_back();
  in_use_[page] = 1;
  return page;
}

void PageAllocator::Free(int32_t page) {
  if (page < 0 || page >= num_pages_total() || !in_use_[page]) {
    std::fprintf(stderr, "PageAllocator::Free: page %d is not allocated (double free?)\n", page);
    std::abort();
  }
  in_use_[page] = 0;
  free_.push_back(page);
}

bool PageAllocator::CheckInvariants() const {
  std::vector<uint8_t> seen(in_use_.size(), 0);
  for (int32_t p : free_) {
    if (p < 0 || p >= num_pages_total() || in_use_[p] || seen[p]) return false;
    seen[p] = 1;
  }
  int32_t used = 0;
  for (uint8_t u : in_use_) used += u;
  return used + num_pages_free() == num_pages_total();
}

}  // namespace heavykv
