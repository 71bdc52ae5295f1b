// ZeroedVector: an AlignedVector (kernels/aligned_vector.h) that starts as zeros without writing
// them, for the KV pool (memory/kv_cache.h): its pages become resident as they are first written.
#pragma once

#include <cstddef>
#include <cstring>
#include <new>
#include <utility>
#include <vector>

#include "kernels/aligned_vector.h"

namespace heavykv {

// AlignedAllocator whose vectors start as zeros without writing them: a large block is a fresh
// anonymous mapping, which the kernel gives as zero pages that become resident only when first
// written; a small one is cleared here. So a KV pool sized for the most a server may hold costs
// memory as its pages fill, not at start. Only for vectors sized once (at construction): an
// element regrown after a shrink keeps its old value instead of being value-initialized.
template <typename T, size_t kAlign = 64>
struct ZeroedAllocator {
  using value_type = T;
  ZeroedAllocator() = default;
  template <typename U>
  ZeroedAllocator(const ZeroedAllocator<U, kAlign>&) {}  // NOLINT: allocator rebinding
  template <typename U>
  struct rebind {
    using other = ZeroedAllocator<U, kAlign>;
  };
  T* allocate(size_t n) {
    void* p = AllocateAligned(n * sizeof(T), kAlign);
    if (n * sizeof(T) < kHugePageBytes) std::memset(p, 0, n * sizeof(T));
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t n) { FreeAligned(p, n * sizeof(T)); }
  // Default-initializes (writes nothing for the arithmetic types the pool holds).
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    if constexpr (sizeof...(Args) == 0) {
      ::new (static_cast<void*>(p)) U;
    } else {
      ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
    }
  }
  bool operator==(const ZeroedAllocator&) const { return true; }
  bool operator!=(const ZeroedAllocator&) const { return false; }
};

template <typename T>
using ZeroedVector = std::vector<T, ZeroedAllocator<T>>;


}  // namespace heavykv
