// The eviction rule of memory/eviction_policy.h as one total order, so that the GPU can choose
// victims with a min / radix select instead of calling the policy: a head's victims are exactly
// its `num_evict` slots with the smallest EvictionKey. Plain C++ (host and device), so tests check
// it against the CPU policies without a GPU (tests/cuda/eviction_rule_test.cc).
//
//   kEvictOldest,      param = first_pos: positions < first_pos are kept (sink tokens; 0 for
//                      window/full), the others go oldest first. Key = position.
//   kEvictLowestScore, param = num_recent: positions > newest_pos - num_recent are kept (h2o's
//                      recent window), the others go lowest score first, ties the older first.
//                      Key = (score as ordered bits) << 32 | position.
// Positions of one head are distinct, so keys are too, and the victim set is unique: the same
// slots the CPU's selection (min scan or nth_element on (key, position)) picks.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define HEAVYKV_HD __host__ __device__
#else
#define HEAVYKV_HD
#endif

namespace heavykv::cuda {

enum EvictKind : int32_t { kEvictNone = 0, kEvictOldest = 1, kEvictLowestScore = 2 };

inline constexpr uint64_t kNotCandidate = ~uint64_t(0);

// Float bits mapped so that unsigned order is float order (-0 taken as +0; scores are sums of
// probabilities, never negative or NaN).
HEAVYKV_HD inline uint32_t OrderedFloatBits(float f) {
  if (f == 0.0f) f = 0.0f;
#if defined(__CUDA_ARCH__)
  uint32_t b = __float_as_uint(f);
#else
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
#endif
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

HEAVYKV_HD inline uint64_t EvictionKey(int32_t kind, int32_t param, int32_t newest_pos,
                                       int32_t pos, float score) {
  if (kind == kEvictOldest) {
    return pos >= param ? uint64_t(uint32_t(pos)) : kNotCandidate;
  }
  if (kind == kEvictLowestScore) {
    if (int64_t(pos) > int64_t(newest_pos) - param) return kNotCandidate;
    return (uint64_t(OrderedFloatBits(score)) << 32) | uint32_t(pos);
  }
  return kNotCandidate;
}

}  // namespace heavykv::cuda
